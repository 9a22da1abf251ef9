/* launcher/costmodel.c — the planner's cost model (see costmodel.h and docs/planner.md).
 *
 * Design note. Three layers, each testable alone:
 *   1. costmodel_collective: one NCCL call. NCCL picks, for every call, the
 *      algorithm and protocol its tuning model (src/graph/tuning.cc) says is
 *      fastest, time = latency + nBytes / algbw; this file reproduces that model
 *      (2.24-2.28: the tables and formulas quoted below) with the busbw figures
 *      of the links the communicator crosses, plus a fixed cost per call that
 *      NCCL's model leaves out and bench/comm measures (launch, synchronization).
 *   2. simulate: the engine's step as three FIFO streams, in the order
 *      runtime/schedule.c enqueues work, with the dependencies it records as
 *      events (two parameter slots, two gradient buffers, the replica stream
 *      after each reduce-scatter). Exposed communication is what the step takes
 *      beyond the compute stream's busy time; the replica all-reduces' share is
 *      the difference a second simulation without them makes.
 *   3. memory: the engine's allocations by kind (docs/engine.md), with the one
 *      overlap that matters: gradient shards are made at each block's first
 *      backward while that block's saved activations are freed, so with one
 *      micro-batch the two never coexist in full.
 * The per-block view is what makes latency visible: a flat ring of 1000 ranks
 * pays ~1000 steps per call, three calls per block, every block.
 */
#include "costmodel.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

#define GB 1e9
#define GIB 1073741824.0

/* ---------------------------------------------------------------- presets */

static const costmodel_model_t presets[] = {
    /* GPT-2 (HF): vocabulary 50257, context 1024, tied embeddings. */
    { "d12", "gpt2", COSTMODEL_GPT2, 12, 768, 3072, 768, 12, 50257, 1024, true, 0 },
    { "d24", "gpt2-medium", COSTMODEL_GPT2, 24, 1024, 4096, 1024, 16, 50257, 1024, true, 0 },
    { "d36", "gpt2-large", COSTMODEL_GPT2, 36, 1280, 5120, 1280, 20, 50257, 1024, true, 0 },
    { "d48", "gpt2-xl", COSTMODEL_GPT2, 48, 1600, 6400, 1600, 25, 50257, 1024, true, 0 },
    /* Llama 3 (config.json of meta-llama): kv_dim = num_key_value_heads x head_dim. */
    { "llama3.2-1b", NULL, COSTMODEL_LLAMA, 16, 2048, 8192, 512, 32, 128256, 4096, true, 0 },
    { "llama3.2-3b", NULL, COSTMODEL_LLAMA, 28, 3072, 8192, 1024, 24, 128256, 4096, true, 0 },
    { "llama3-8b", "llama3.1-8b", COSTMODEL_LLAMA, 32, 4096, 14336, 1024, 32, 128256, 4096, false,
      0 },
    { "llama3-70b", "llama3.1-70b", COSTMODEL_LLAMA, 80, 8192, 28672, 1024, 64, 128256, 4096, false,
      0 },
    { "llama3-405b", "llama3.1-405b", COSTMODEL_LLAMA, 126, 16384, 53248, 1024, 128, 128256, 4096,
      false, 0 },
    { NULL, NULL, COSTMODEL_GENERIC, 0, 0, 0, 0, 0, 0, 0, false, 0 },
};

double costmodel_layer_params(const costmodel_model_t *m)
{
    const double C = m->hidden, F = m->ffn;
    switch (m->arch) {
    case COSTMODEL_GPT2: /* 2 LayerNorms, qkv + proj, fc + proj, with biases */
        return 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C);
    case COSTMODEL_LLAMA: /* 2 RMSNorms, q and o (C x C), k and v (C x kv), gate, up, down */
        return 2 * C + 2 * C * C + 2 * C * m->kv_dim + 3 * C * F;
    case COSTMODEL_GENERIC: break;
    }
    return m->params / m->layers;
}

/* The weights of one layer's linear products: what --fp8 runs in FP8 and keeps
 * as 1-byte codes (no norms, no biases). */
static double layer_product_params(const costmodel_model_t *m)
{
    const double C = m->hidden, F = m->ffn;
    switch (m->arch) {
    case COSTMODEL_GPT2: return 4 * C * C + 2 * C * F;
    case COSTMODEL_LLAMA: return 2 * C * C + 2 * C * m->kv_dim + 3 * C * F;
    case COSTMODEL_GENERIC: break;
    }
    return m->params / m->layers;
}

/* The embedding (with GPT-2's learned positions) and the head's own parameters
 * (final norm, and the projection when untied). */
static double embed_params(const costmodel_model_t *m)
{
    if (m->arch == COSTMODEL_GENERIC)
        return 0;
    return m->vocab * m->hidden + (m->arch == COSTMODEL_GPT2 ? m->context * m->hidden : 0);
}

static double head_own_params(const costmodel_model_t *m)
{
    if (m->arch == COSTMODEL_GENERIC)
        return 0;
    double norm = m->arch == COSTMODEL_GPT2 ? 2 * m->hidden : m->hidden;
    return norm + (m->tied ? 0 : m->vocab * m->hidden);
}

static double model_params(const costmodel_model_t *m)
{
    if (m->arch == COSTMODEL_GENERIC)
        return m->params;
    return embed_params(m) + m->layers * costmodel_layer_params(m) + head_own_params(m);
}

const costmodel_model_t *costmodel_presets(void)
{
    static costmodel_model_t filled[sizeof(presets) / sizeof(presets[0])];
    if (filled[0].name == NULL) /* idempotent: the same values on every call */
        for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
            filled[i] = presets[i];
            if (presets[i].name)
                filled[i].params = model_params(&presets[i]);
        }
    return filled;
}

const costmodel_model_t *costmodel_preset(const char *text)
{
    if (text == NULL)
        return NULL;
    for (const costmodel_model_t *p = costmodel_presets(); p->name; p++)
        if (strcasecmp(text, p->name) == 0 || (p->alias && strcasecmp(text, p->alias) == 0))
            return p;
    return NULL;
}

int costmodel_model_from_count(double params, int layers, costmodel_model_t *out, bmt_error_t *err)
{
    if (!isfinite(params) || params < 1 || params > COSTMODEL_MAX_PARAMS)
        return errprintf(err, "cost model: parameter count %g is not in [1, 1e15]", params);
    if (layers < 0 || layers > COSTMODEL_MAX_LAYERS)
        return errprintf(err, "--layers must be 1 to %d, got %d", COSTMODEL_MAX_LAYERS, layers);
    if (layers == 0) {
        layers = (int)lround(cbrt(params / (12.0 * 128 * 128)));
        if (layers < 1)
            layers = 1;
        if (layers > COSTMODEL_MAX_LAYERS)
            layers = COSTMODEL_MAX_LAYERS;
    }
    double C = sqrt(params / (12.0 * layers));
    const int heads = C >= 192 ? (int)lround(C / 128) : 1; /* heads of about 128 */
    *out =
        (costmodel_model_t){ NULL,  NULL,  COSTMODEL_GENERIC, layers, C, 4 * C, C, heads, 0, 4096,
                             false, params };
    return 0;
}

static const costmodel_gpu_t gpus[] = {
    /* Dense bf16 peaks of the data sheets (as runtime/monitor.c); memory as
     * cudaMemGetInfo's total; NVLink 4 (H100, H200) 900 GB/s, NVLink 3 600, NVLink 5 1800. */
    { "h200", 989, 140.4, 1.0 },
    { "h100", 989, 79.6, 1.0 },
    { "a100", 312, 79.2, 600.0 / 900 },
    { "b200", 2250, 178.4, 2.0 },
};

const costmodel_gpu_t *costmodel_gpu(const char *text)
{
    for (size_t i = 0; text && i < sizeof(gpus) / sizeof(gpus[0]); i++)
        if (strcasecmp(text, gpus[i].name) == 0)
            return &gpus[i];
    return NULL;
}

const char *costmodel_comm_name(costmodel_comm_t which)
{
    switch (which) {
    case COSTMODEL_GROUP: return "group";
    case COSTMODEL_REPLICA: return "replica";
    case COSTMODEL_WORLD: return "world";
    }
    return "?";
}

const char *costmodel_coll_name(costmodel_coll_t c)
{
    switch (c) {
    case COSTMODEL_ALL_GATHER: return "all-gather";
    case COSTMODEL_REDUCE_SCATTER: return "reduce-scatter";
    case COSTMODEL_ALL_REDUCE: return "all-reduce";
    }
    return "?";
}

const char *costmodel_algo_name(costmodel_algo_t a)
{
    switch (a) {
    case COSTMODEL_RING: return "ring";
    case COSTMODEL_TREE: return "tree";
    case COSTMODEL_PAT: return "pat";
    }
    return "?";
}

const char *costmodel_proto_name(costmodel_proto_t p)
{
    switch (p) {
    case COSTMODEL_LL: return "LL";
    case COSTMODEL_LL128: return "LL128";
    case COSTMODEL_SIMPLE: return "Simple";
    }
    return "?";
}

/* ---------------------------------------------------------------- one collective */

/* NCCL 2.24-2.28, src/graph/tuning.cc, in us, {LL, LL128, Simple}:
 *   baseLat  Tree {6.8, 14.0, 8.4}  Ring {6.6, 14.0, 8.4}  PAT 8 (Simple)
 *   hwLat    NVLink Tree {.6, 1.25, 4}  Ring {.6, 1.9, 3.4}
 *            NET    Tree {5.0, 8.5, 14} Ring {2.7, 4.0, 14.0}  */
static const double base_lat[2][3] = { { 6.6, 14.0, 8.4 }, { 6.8, 14.0, 8.4 } };
static const double nvlink_lat[2][3] = { { 0.6, 1.9, 3.4 }, { 0.6, 1.25, 4.0 } };
static const double net_lat[2][3] = { { 2.7, 4.0, 14.0 }, { 5.0, 8.5, 14.0 } };
/* Tree all-reduce's bandwidth correction by size (Simple), buckets log2(nBytes/64). */
static const double tree_correction[23] = { .9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
                                            .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9 };

static int log2i(double x)
{
    int k = 0;
    while (x >= 2) {
        x /= 2;
        k++;
    }
    return k;
}

/* llMaxBw for Hopper by nodes (1, 2, more). */
static double ll_max_bw(int nodes) { return nodes == 1 ? 141.0 : nodes == 2 ? 45.0 : 35.0; }

static double step_lat(const costmodel_links_t *lk, const double table[2][3], int tree, int p)
{
    return lk->step_us >= 0 ? lk->step_us : table[tree][p];
}

/* Ring busbw of the span: NVLink on one node; across nodes, the NICs of its
 * thinnest node bound it. */
static double ring_busbw(costmodel_coll_t c, const costmodel_span_t *s, const costmodel_links_t *lk)
{
    if (s->busbw > 0)
        return s->busbw;
    double nv = lk->nvlink_gbps[c];
    if (s->nodes == 1)
        return nv;
    double net = s->thinnest * lk->nic_gbps;
    return net < nv ? net : nv;
}

static double call_us(const costmodel_links_t *lk, int p)
{
    return lk->call_us[p == COSTMODEL_LL128 ? COSTMODEL_LL : p];
}

double costmodel_collective(costmodel_coll_t c, const costmodel_span_t *s, double bytes,
                            const costmodel_links_t *lk, costmodel_choice_t *out)
{
    costmodel_choice_t best = { COSTMODEL_RING, COSTMODEL_SIMPLE, 0, 0, 0 };
    const int n = s->ranks, N = s->nodes;
    if (n <= 1 || bytes <= 0) {
        if (out)
            *out = best;
        return 0;
    }
    const double B = ring_busbw(c, s, lk);
    const int ppn = n / N;
    const bool ar = c == COSTMODEL_ALL_REDUCE;
    const int nsteps = ar ? 2 * (n - 1) : n - 1;
    const int inter_steps = N == 1 ? 0 : ar ? 2 * (N - 1) : N - 1;
    best.seconds = INFINITY;
    for (int a = COSTMODEL_RING; a <= COSTMODEL_PAT; a++) {
        if (a == COSTMODEL_TREE && !ar)
            continue;
        if (a == COSTMODEL_PAT && (ar || N != n || N == 1))
            continue; /* PAT: all-gather and reduce-scatter, one rank per node */
        for (int p = COSTMODEL_LL; p <= COSTMODEL_SIMPLE; p++) {
            if (a == COSTMODEL_PAT && p != COSTMODEL_SIMPLE)
                continue;
            const int tree = a == COSTMODEL_TREE;
            double intra = step_lat(lk, nvlink_lat, tree, p);
            /* With one rank per node the latencies are fully exposed: NCCL takes the tree's. */
            double inter = step_lat(lk, net_lat, ppn == 1 ? 1 : tree, p);
            double lat, bw = B, algbw;
            if (a == COSTMODEL_RING) {
                if (N > 1) {
                    double overhead = COSTMODEL_NET_OVERHEAD_US * (p == COSTMODEL_SIMPLE ? 3 : 1);
                    if (intra < overhead)
                        intra = overhead;
                }
                lat = base_lat[0][p] + (nsteps - inter_steps) * intra + inter_steps * inter;
                if (p == COSTMODEL_SIMPLE && N > 1 && ar)
                    lat *= 1.4; /* the ring's plateau effect (compute capability >= 8.0) */
                if (p == COSTMODEL_LL)
                    bw = fmin(ll_max_bw(N), B * 0.5);
                else if (p == COSTMODEL_LL128)
                    bw = B * 0.92;
                algbw = bw * n / nsteps;
            } else if (a == COSTMODEL_TREE) {
                lat = base_lat[1][p] + 2 * ((ppn - 1) * intra + log2i(N) * inter);
                bw = B * 0.92;
                if (p == COSTMODEL_LL)
                    bw = fmin(bw / 3.8, ll_max_bw(N));
                else if (p == COSTMODEL_LL128)
                    bw = bw * (N == 1 ? 7.0 / 9.0 : 120.0 / 128.0);
                else {
                    int k = log2i(bytes / 64);
                    if (bytes >= 64 && k < 23)
                        bw *= tree_correction[k];
                }
                algbw = bw * 0.5;
            } else {
                lat = 8 + log2i(N) * (inter / 3.5) + n * 2.8;
                algbw = B * 0.75;
            }
            lat += call_us(lk, p);
            double t = lat * 1e-6 + bytes / (algbw * GB);
            if (t < best.seconds) {
                best = (costmodel_choice_t){ (costmodel_algo_t)a, (costmodel_proto_t)p, lat, B, t };
            }
        }
    }
    if (out)
        *out = best;
    return best.seconds;
}

/* ---------------------------------------------------------------- spans */

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

costmodel_span_t costmodel_span(const bmt_layout_t *l, costmodel_comm_t which)
{
    const int gpn = l->gpus_per_node, G = l->gpus_per_group, R = l->groups;
    costmodel_span_t s = { 0, 1, 0, 0 };
    switch (which) {
    case COSTMODEL_WORLD:
        s.ranks = l->world;
        s.nodes = l->nodes;
        s.thinnest = l->nodes > 1 ? gpn : l->world;
        return s;
    case COSTMODEL_GROUP:
        s.ranks = G;
        s.thinnest = G;
        for (int g = 0; g < R; g++) {
            int r0 = g * G, r1 = r0 + G - 1, first = r0 / gpn, last = r1 / gpn;
            s.nodes = imax(s.nodes, last - first + 1);
            if (first != last) {
                /* Nodes in between hold gpn of its ranks; only the ends can hold fewer. */
                int head = gpn - r0 % gpn, tail = r1 % gpn + 1;
                s.thinnest = imin(s.thinnest, imin(head, tail));
            }
        }
        return s;
    case COSTMODEL_REPLICA:
        s.ranks = R;
        s.thinnest = R;
        /* Member g of replica i is rank g G + i: O(world) over every i and g. */
        for (int i = 0; i < G; i++) {
            int node = -1, run = 0, nodes = 0;
            for (int g = 0; g < R; g++) {
                int n = (g * G + i) / gpn;
                if (n != node) {
                    if (node >= 0)
                        s.thinnest = imin(s.thinnest, run);
                    node = n;
                    run = 0;
                    nodes++;
                }
                run++;
            }
            s.thinnest = imin(s.thinnest, run);
            s.nodes = imax(s.nodes, nodes);
        }
        if (s.nodes == 1)
            s.thinnest = R;
        return s;
    }
    return s;
}

/* ---------------------------------------------------------------- inputs */

static double dmax(double a, double b) { return a > b ? a : b; }
static double dmin(double a, double b) { return a < b ? a : b; }

/* What the trainers' CUDA models hold for one layer's backward, for `tokens`
 * tokens (examples/gpt2/model_cuda.c and examples/llama/model_cuda.c,
 * *_cu_act_bytes; tests/progs/keep_check.c checks those against the
 * allocations a forward makes), bf16 unless said:
 * - *input: the layer's input (C), which the engine keeps in either mode;
 * - *attn: the attention's output (C) and its log-sum-exps (f32, one a head):
 *   under checkpointing kept for every layer (the trainers' --keep-attention,
 *   on by default), so a recomputation skips the attention;
 * - *set: everything else the layer keeps, what --ckpt-budget divides the
 *   budget by. GPT-2 (and a bare count): the two LayerNorms' outputs and the
 *   residual after attention (3 C), q k v (C + 2 kv), the MLP's product and
 *   its GELU (2 F), four f32 statistics. Llama: the two RMSNorms' outputs and
 *   the residual (3 C), q k v, the gate and up products and their SwiGLU
 *   (3 F), two f32 statistics.
 *   With fp8 the set holds 1-byte codes of the products' inputs instead of
 *   the two norms' bf16 outputs and the MLP's activation (GELU's or
 *   SwiGLU's), plus codes of the attention's output (C + C + C + F bytes for
 *   4 C + 2 F: C + F less a token), and the codes of the layer's weights. */
static void layer_act(const costmodel_model_t *m, bool keep_attention, bool fp8, double tokens,
                      double *input, double *attn, double *set)
{
    const double C = m->hidden, kv = m->kv_dim, F = m->ffn;
    const bool llama = m->arch == COSTMODEL_LLAMA;
    *input = tokens * 2 * C;
    *attn = tokens * (2 * C + 4.0 * m->heads);
    *set = tokens * (2 * (4 * C + 2 * kv + (llama ? 3 : 2) * F) + 4 * (llama ? 2 : 4));
    if (fp8)
        *set += layer_product_params(m) - tokens * (C + F);
    if (!keep_attention) { /* the attention belongs to the set, recomputed with it */
        *set += *attn;
        *attn = 0;
    }
}

/* the set of layer_act: what one kept layer costs under --ckpt-budget */
static double layer_act_bytes(const costmodel_in_t *in)
{
    double input, attn, set;
    layer_act(&in->model, in->keep_attention, in->fp8, (double)in->micro_batch * in->seq, &input,
              &attn, &set);
    return set;
}

/* The logits, bf16: all of them (*whole), and what the head holds at once
 * under checkpointing, a chunk at a time: at most 256 MiB and at most a
 * quarter (*chunk). */
static void logits_bytes(const costmodel_model_t *m, double tokens, double *whole, double *chunk)
{
    *whole = tokens * m->vocab * 2;
    *chunk = *whole > 0 ? *whole / dmax(4, ceil(*whole / (256.0 * 1048576))) : 0;
}

/* --ckpt-budget: the trainers' choice (examples/common/trainer.c): the last
 * layers keep their activations while their sets fit in the budget, then,
 * every layer kept, the head its whole logits if the rest holds them. */
static void budget_layers(costmodel_in_t *in)
{
    in->kept = 0;
    in->head_whole = false;
    if (!in->ckpt || in->ckpt_budget < 0)
        return;
    const double tokens = (double)in->micro_batch * in->seq;
    const double layer = layer_act_bytes(in);
    const double fit = layer > 0 ? floor(in->ckpt_budget / layer) : in->model.layers;
    in->kept = fit < in->model.layers ? (int)fit : in->model.layers;
    double whole, chunk;
    logits_bytes(&in->model, tokens, &whole, &chunk);
    in->head_whole =
        in->kept == in->model.layers && in->ckpt_budget - in->kept * layer >= whole - chunk;
}

int costmodel_setup(const costmodel_opts_t *o, costmodel_in_t *in, bmt_error_t *err)
{
    costmodel_in_t r = { 0 };
    if (o->model == NULL)
        return errprintf(err, "the cost model needs --model NAME|COUNT");
    const costmodel_model_t *preset = costmodel_preset(o->model);
    if (preset) {
        if (o->layers)
            return errprintf(err,
                             "--layers goes with a parameter count; %.200s is a preset of %d "
                             "layers",
                             o->model, preset->layers);
        r.model = *preset;
    } else {
        double params;
        if (costmodel_parse_params(o->model, "--model", &params, err) < 0 ||
            costmodel_model_from_count(params, o->layers, &r.model, err) < 0)
            return -1;
    }
    r.seq = o->seq ? o->seq : r.model.context;
    if (r.model.arch == COSTMODEL_GPT2 && r.seq > r.model.context) {
        /* GPT-2's positions are learned: a longer sequence needs a longer
         * table, which the trainer makes with --max-seq (up to 65536). */
        if (r.seq > COSTMODEL_GPT2_MAX_POSITIONS)
            return errprintf(err,
                             "--seq-len %d: %.200s learns its positions, and the trainer's "
                             "--max-seq makes at most %d of them",
                             r.seq, o->model, COSTMODEL_GPT2_MAX_POSITIONS);
        r.model.context = r.seq;
        r.model.params = model_params(&r.model);
    }
    r.micro_batch = o->micro_batch ? o->micro_batch : 1;
    r.accum = o->accum ? o->accum : 1;
    if (r.seq < 1 || r.seq > 10000000 || r.micro_batch < 1 || r.micro_batch > 1000000 ||
        r.accum < 1 || r.accum > 100000)
        return errprintf(err, "--seq-len, --micro-batch and --accum must be positive and sane "
                              "(at most 1e7, 1e6, 1e5)");
    r.ckpt = o->ckpt != 0;
    r.keep_attention = o->keep_attention != 0;
    if (o->keep_attention >= 0 && !r.ckpt)
        return errprintf(err, "--keep-attention chooses what checkpointing's recomputation skips: "
                              "it needs --ckpt 1");
    if (o->ckpt_budget_mib >= 0 && !r.ckpt)
        return errprintf(err, "--ckpt-budget chooses which layers checkpointing spares: it needs "
                              "--ckpt 1");
    r.ckpt_budget = o->ckpt_budget_mib >= 0 ? o->ckpt_budget_mib * 1048576.0 : -1;
    r.fp8 = o->fp8 == 1;
    if (o->fp8_speedup > 0 && !r.fp8)
        return errprintf(err, "--fp8-speedup is how much faster the products run in FP8: it "
                              "needs --fp8 1");
    r.fp8_speedup = o->fp8_speedup > 0 ? o->fp8_speedup : COSTMODEL_FP8_SPEEDUP;
    r.zero_level = o->zero_level ? o->zero_level : 3;
    r.gather_bytes = 2;
    r.reduce_bytes = o->grad_bytes ? o->grad_bytes : 4;
    r.shard_bytes = 4; /* the engine all-reduces f32 gradient shards */
    const costmodel_gpu_t *gpu = costmodel_gpu(o->gpu ? o->gpu : "h200");
    if (gpu == NULL)
        return errprintf(err, "--gpu must be h200, h100, a100 or b200, got '%.200s'", o->gpu);
    r.mfu = o->mfu > 0 ? o->mfu : COSTMODEL_DEFAULT_MFU;
    r.peak_tflops = gpu->peak_tflops;
    r.gpu_mem_gib = o->gpu_mem_gib > 0 ? o->gpu_mem_gib : gpu->mem_gib;
    if (r.gpu_mem_gib <= COSTMODEL_RESERVE_GIB)
        return errprintf(err,
                         "--gpu-mem %g leaves nothing usable: %g GiB of every GPU are held back "
                         "(the CUDA context, NCCL's buffers); give more than %g",
                         r.gpu_mem_gib, COSTMODEL_RESERVE_GIB, COSTMODEL_RESERVE_GIB);
    const double nv[3] = { COSTMODEL_NVLINK_AG_GBPS, COSTMODEL_NVLINK_RS_GBPS,
                           COSTMODEL_NVLINK_AR_GBPS };
    for (int c = 0; c < 3; c++)
        r.links.nvlink_gbps[c] = o->nvlink_gbps > 0 ? o->nvlink_gbps : nv[c] * gpu->nvlink_scale;
    r.links.nic_gbps = o->nic_gbps > 0 ? o->nic_gbps : COSTMODEL_NIC_GBPS;
    r.links.call_us[COSTMODEL_LL] = r.links.call_us[COSTMODEL_LL128] =
        o->call_us >= 0 ? o->call_us : COSTMODEL_CALL_LL_US;
    r.links.call_us[COSTMODEL_SIMPLE] = o->call_us >= 0 ? o->call_us : COSTMODEL_CALL_SIMPLE_US;
    r.links.step_us = o->latency_us;
    r.busbw_group = o->busbw_group;
    r.busbw_replica = o->busbw_replica;
    r.busbw_world = o->busbw_world;
    budget_layers(&r);
    *in = r;
    return 0;
}

static int check_in(const costmodel_in_t *in, bmt_error_t *err)
{
    const costmodel_model_t *m = &in->model;
    if (!isfinite(m->params) || m->params < 1 || m->params > COSTMODEL_MAX_PARAMS ||
        m->layers < 1 || m->layers > COSTMODEL_MAX_LAYERS || !(m->hidden > 0) || !(m->ffn > 0))
        return errprintf(err, "cost model: the model's shape is out of range");
    if (in->seq < 1 || in->micro_batch < 1 || in->accum < 1)
        return errprintf(err, "cost model: sequence length, micro-batch and accumulation must "
                              "be at least 1");
    if (in->zero_level != 2 && in->zero_level != 3)
        return errprintf(err, "cost model: ZeRO level must be 2 or 3, got %d", in->zero_level);
    if (in->kept < 0 || in->kept > m->layers || (in->kept > 0 && !in->ckpt))
        return errprintf(err, "cost model: %d kept layers of %d (checkpointing %s)", in->kept,
                         m->layers, in->ckpt ? "on" : "off");
    if (in->gather_bytes < 1 || in->gather_bytes > 8 || in->reduce_bytes < 1 ||
        in->reduce_bytes > 8 || in->shard_bytes < 1 || in->shard_bytes > 8)
        return errprintf(err, "cost model: bytes per element must be 1 to 8");
    if (!(in->mfu > 0 && in->mfu <= 1) || !(in->peak_tflops > 0) || !(in->gpu_mem_gib > 0))
        return errprintf(err, "cost model: MFU must be in (0, 1], peak and memory positive");
    if (in->fp8 && !(in->fp8_speedup > 0 && in->fp8_speedup <= 4))
        return errprintf(err, "cost model: the FP8 speed-up must be in (0, 4]");
    for (int c = 0; c < 3; c++)
        if (!(in->links.nvlink_gbps[c] > 0 && isfinite(in->links.nvlink_gbps[c])))
            return errprintf(err, "cost model: NVLink busbw must be a positive GB/s");
    if (!(in->links.nic_gbps > 0 && isfinite(in->links.nic_gbps)))
        return errprintf(err, "cost model: NIC busbw must be a positive GB/s");
    for (int p = 0; p < 3; p++)
        if (!(in->links.call_us[p] >= 0 && isfinite(in->links.call_us[p])))
            return errprintf(err, "cost model: call cost must be >= 0 us");
    if (!isfinite(in->links.step_us))
        return errprintf(err, "cost model: step latency must be finite");
    const double bw[] = { in->busbw_group, in->busbw_replica, in->busbw_world };
    for (int i = 0; i < 3; i++)
        if (!(bw[i] >= 0 && isfinite(bw[i])))
            return errprintf(err, "cost model: a given busbw must be a positive GB/s");
    return 0;
}

/* ---------------------------------------------------------------- the engine's blocks */

/* One entry of the engine's block list, in forward order. */
struct entry {
    double gather;  /* parameters gathered for it (a tied head gathers the embedding) */
    double own;     /* parameters whose gradients it reduces */
    double fwd;     /* forward FLOPs per token */
    double refwd;   /* FLOPs per token its recomputation repeats under checkpointing (0: none) */
    double product; /* of fwd, the layer's linear products' (what --fp8 runs in FP8) */
};

/* The block list: [embedding,] L layers[, head]. Returns the count (<= L + 2).
 * Under checkpointing the last `kept` layers keep their activations (not
 * recomputed); the others repeat their forward, without the attention where
 * in->keep_attention keeps its output. */
static int entries(const costmodel_in_t *in, struct entry *e)
{
    int n = 0;
    const costmodel_model_t *m = &in->model;
    const double C = m->hidden, lp = costmodel_layer_params(m), T = in->seq;
    const double emb = embed_params(m), head = head_own_params(m);
    const double product = 2 * layer_product_params(m);
    if (m->arch != COSTMODEL_GENERIC)
        e[n++] = (struct entry){ emb, emb, 0, 0, 0 };
    for (int i = 0; i < m->layers; i++) {
        /* 2 FLOPs per parameter and token, and attention's 2 C T (6 L C T a step). */
        const double fwd = 2 * lp + 2 * C * T;
        const bool re = in->ckpt && i < m->layers - in->kept;
        e[n++] =
            (struct entry){ lp, lp, fwd, re ? (in->keep_attention ? 2 * lp : fwd) : 0, product };
    }
    if (m->arch != COSTMODEL_GENERIC)
        e[n++] = (struct entry){ head + (m->tied ? emb : 0), head, 2 * m->vocab * C, 0, 0 };
    return n;
}

/* The model's FLOPs per token, as the trainers count them for MFU: 6 N + 6 L C T. */
static double model_flops_per_token(const costmodel_model_t *m, int T)
{
    return 6 * m->params + 6.0 * m->layers * m->hidden * T;
}

/* ---------------------------------------------------------------- the step */

struct times {
    const double *f;      /* forward seconds per entry */
    const double *re;     /* its recomputation's seconds (checkpointing; 0: none) */
    const double *gather; /* all-gather seconds per entry (0 in a group of one) */
    const double *rs;     /* reduce-scatter seconds per entry */
    const double *ar;     /* replica all-reduce seconds per entry (0: none) */
    double agree;         /* the world's agreement all-reduce, per micro-batch */
    double norm;          /* the group's gradient-norm all-reduce, host-synchronized */
};

struct sim {
    double step, busy_x, busy_c, busy_r;
};

/* Per-entry scratch of simulate. */
struct scratch {
    double *gdone;   /* its gather is done (this pass) */
    double *rs_done; /* its reduce-scatter is done */
    int *idx;        /* its gather's number, in issue order */
};

/* The engine's order (runtime/schedule.c). Forward: gather(0); for i: gather(i+1)
 * | forward(i). Backward: [agreement] gather(n-1); for i = n-1..0: gather(i-1) |
 * [recompute] backward(i) | reduce-scatter(i) | replica all-reduce(i). At zero 3 a
 * gather waits for the slot of the gather two before it to be released (two
 * slots); backward(i) waits for the reduce-scatter of i+2 (two gradient buffers).
 * A gather is issued at most two ahead of its release, so eight releases kept
 * in a ring are enough. */
static struct sim simulate(const struct entry *e, int n, const costmodel_in_t *in, bool grouped,
                           const struct times *t, const struct scratch *w)
{
    const bool zero3 = in->zero_level == 3;
    double X = 0, C = 0, R = 0, rel[8];
    long ng = 0;
    struct sim s = { 0, 0, 0, 0 };
#define GATHER(i)                                                                                  \
    do {                                                                                           \
        double start = dmax(C, zero3 && ng >= 2 ? rel[(ng - 2) % 8] : 0);                          \
        C = start + t->gather[i];                                                                  \
        s.busy_c += t->gather[i];                                                                  \
        w->gdone[i] = C;                                                                           \
        rel[ng % 8] = INFINITY;                                                                    \
        w->idx[i] = (int)(ng++ % 8);                                                               \
    } while (0)
    for (int m = 0; m < in->accum; m++) {
        const bool last = m == in->accum - 1;
        if (grouped)
            GATHER(0);
        for (int i = 0; i < n; i++) {
            if (grouped && i + 1 < n)
                GATHER(i + 1);
            X = dmax(X, grouped ? w->gdone[i] : 0) + t->f[i];
            s.busy_x += t->f[i];
            if (grouped)
                rel[w->idx[i]] = X;
        }
        if (t->agree > 0) {
            C += t->agree;
            s.busy_c += t->agree;
        }
        if (grouped && zero3)
            GATHER(n - 1);
        for (int i = n - 1; i >= 0; i--) {
            if (grouped && zero3 && i > 0)
                GATHER(i - 1);
            double start = dmax(X, grouped ? w->gdone[i] : 0);
            if (grouped && i + 2 < n)
                start = dmax(start, w->rs_done[i + 2]);
            double d = 2 * t->f[i] + t->re[i];
            X = start + d;
            s.busy_x += d;
            if (grouped) {
                if (zero3)
                    rel[w->idx[i]] = X;
                C = dmax(C, X) + t->rs[i];
                s.busy_c += t->rs[i];
                w->rs_done[i] = C;
            }
            if (last && t->ar[i] > 0) {
                R = dmax(R, grouped ? w->rs_done[i] : X) + t->ar[i];
                s.busy_r += t->ar[i];
            }
        }
    }
#undef GATHER
    s.step = dmax(X, dmax(C, R)) + t->norm;
    return s;
}

/* ---------------------------------------------------------------- memory */

static costmodel_mem_t memory(const struct entry *e, int n, const costmodel_in_t *in, int G)
{
    const costmodel_model_t *m = &in->model;
    costmodel_mem_t r = { 0 };
    const double shard = m->params / G, tokens = (double)in->micro_batch * in->seq;
    r.states = 12 * shard;
    r.grads = 4 * shard;
    double big = 0, big2 = 0, gmax = 0;
    for (int i = 0; i < n; i++) {
        gmax = dmax(gmax, e[i].gather);
        if (e[i].own > big) {
            big2 = big;
            big = e[i].own;
        } else if (e[i].own > big2) {
            big2 = e[i].own;
        }
    }
    /* ZeRO-2 keeps every block gathered, each parameter once (a tied head shares
     * the embedding's slot). */
    r.gathered = (in->zero_level == 3 ? 2 * gmax : m->params) * in->gather_bytes;
    if (G > 1)
        r.grad_full = (big + big2) * 4 + (in->reduce_bytes == 2 ? big * 2 : 0);
    double input, attn, set;
    layer_act(m, in->keep_attention, in->fp8, tokens, &input, &attn, &set);
    if (in->ckpt) {
        /* each layer's input and attention, and the kept layers' sets (--ckpt-budget) */
        r.activations = m->layers * (input + attn) + in->kept * set;
        r.transient = in->kept < m->layers ? set : 0; /* one layer recomputed */
    } else {
        r.activations = m->layers * (input + attn + set);
    }
    /* The logits: all of them, or under checkpointing a chunk at a time
     * unless the budget keeps them whole. The head's backward is done (its
     * logits freed) before the first layer is recomputed: the larger of the
     * two, not both. */
    double whole, chunk;
    logits_bytes(m, tokens, &whole, &chunk);
    const double logits = in->ckpt && !in->head_whole ? chunk : whole;
    r.transient = in->ckpt ? dmax(r.transient, logits) : logits;
    r.workspace = COSTMODEL_WORKSPACE_GIB * GIB;
    double live = in->accum > 1 ? r.grads + r.activations : dmax(r.grads, r.activations);
    r.peak = r.states + live + r.transient + r.gathered + r.grad_full + r.workspace;
    r.usable = (in->gpu_mem_gib - COSTMODEL_RESERVE_GIB) * GIB;
    r.fits = r.peak <= r.usable;
    return r;
}

/* ---------------------------------------------------------------- one layout */

static void row_add(costmodel_result_t *r, const char *op, costmodel_coll_t coll,
                    costmodel_comm_t where, const costmodel_span_t *sp, int calls, double bytes,
                    double per_call_max, double seconds, const costmodel_links_t *lk)
{
    if (calls == 0 || sp->ranks <= 1 || r->nrows == COSTMODEL_ROWS)
        return;
    costmodel_row_t *w = &r->rows[r->nrows++];
    const int n = sp->ranks;
    w->op = op;
    w->coll = coll;
    w->where = where;
    w->span = *sp;
    w->calls = calls;
    w->bytes = bytes;
    w->sent = bytes * (coll == COSTMODEL_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n;
    w->seconds = seconds;
    costmodel_collective(coll, sp, per_call_max, lk, &w->big);
}

int costmodel_eval(const bmt_layout_t *l, const costmodel_in_t *in, costmodel_result_t *out,
                   bmt_error_t *err)
{
    if (l->groups < 1 || l->gpus_per_group < 1 || l->gpus_per_node < 1 ||
        (long long)l->groups * l->gpus_per_group != l->world || l->world > BMT_LAYOUT_MAX_WORLD)
        return errprintf(err, "cost model: inconsistent layout %d x %d = %d", l->groups,
                         l->gpus_per_group, l->world);
    if (check_in(in, err) < 0)
        return -1;
    const costmodel_model_t *m = &in->model;
    const int G = l->gpus_per_group, R = l->groups, W = l->world;
    const int cap = m->layers + 2;
    struct entry *e = malloc(sizeof(*e) * (size_t)cap);
    double *buf = malloc(sizeof(double) * (size_t)(8 * cap));
    int *idx = malloc(sizeof(int) * (size_t)cap);
    if (e == NULL || buf == NULL || idx == NULL) {
        free(e);
        free(buf);
        free(idx);
        return errprintf(err, "cost model: out of memory");
    }
    const int n = entries(in, e);
    double *f = buf, *g = buf + cap, *rs = buf + 2 * cap, *ar = buf + 3 * cap;
    double *noar = buf + 4 * cap, *re = buf + 7 * cap;
    memset(noar, 0, sizeof(double) * (size_t)cap);
    const struct scratch w = { buf + 5 * cap, buf + 6 * cap, idx };

    costmodel_span_t sg = costmodel_span(l, COSTMODEL_GROUP);
    costmodel_span_t sr = costmodel_span(l, COSTMODEL_REPLICA);
    costmodel_span_t sw = costmodel_span(l, COSTMODEL_WORLD);
    sg.busbw = in->busbw_group;
    sr.busbw = in->busbw_replica;
    sw.busbw = in->busbw_world;
    /* --busbw-flat names the ring over the whole world: flat ZeRO-3's group. */
    if (R == 1 && in->busbw_world > 0)
        sg.busbw = in->busbw_world;

    const double tokens = (double)in->micro_batch * in->seq;
    const double flops_s = in->peak_tflops * 1e12 * in->mfu;
    /* FP8 takes this fraction off the products' time; a recomputation repeats
     * the products first (with the attention too when it is not kept). */
    const double cut = in->fp8 ? 1 - 1 / in->fp8_speedup : 0;
    double gmax = 0, rsmax = 0, armax = 0, gbytes = 0, rsbytes = 0, arbytes = 0;
    double gsec = 0, rssec = 0, arsec = 0;
    for (int i = 0; i < n; i++) {
        f[i] = (e[i].fwd - cut * e[i].product) * tokens / flops_s;
        re[i] = (e[i].refwd - cut * dmin(e[i].refwd, e[i].product)) * tokens / flops_s;
        double gb = e[i].gather * in->gather_bytes, rb = e[i].own * in->reduce_bytes;
        double ab = ceil(e[i].own / G) * in->shard_bytes;
        g[i] = G > 1 ? costmodel_collective(COSTMODEL_ALL_GATHER, &sg, gb, &in->links, NULL) : 0;
        rs[i] =
            G > 1 ? costmodel_collective(COSTMODEL_REDUCE_SCATTER, &sg, rb, &in->links, NULL) : 0;
        ar[i] = R > 1 ? costmodel_collective(COSTMODEL_ALL_REDUCE, &sr, ab, &in->links, NULL) : 0;
        gmax = dmax(gmax, gb);
        rsmax = dmax(rsmax, rb);
        armax = dmax(armax, ab);
        gbytes += gb;
        rsbytes += rb;
        arbytes += ab;
        gsec += g[i];
        rssec += rs[i];
        arsec += ar[i];
    }
    struct times t = { f, re, g, rs, ar, 0, 0 };
    t.agree = W > 1 ? costmodel_collective(COSTMODEL_ALL_REDUCE, &sw, 32, &in->links, NULL) : 0;
    t.norm = G > 1 ? costmodel_collective(COSTMODEL_ALL_REDUCE, &sg, 8, &in->links, NULL) : 0;
    const bool zero3 = in->zero_level == 3;
    struct sim s = simulate(e, n, in, G > 1, &t, &w);
    struct times t0 = t;
    t0.ar = noar; /* the same step without the replica's all-reduces */
    struct sim s0 = simulate(e, n, in, G > 1, &t0, &w);

    costmodel_result_t r;
    memset(&r, 0, sizeof(r));
    r.layout = *l;
    const int M = in->accum;
    if (G > 1) {
        row_add(&r, zero3 ? "gather params (forward)" : "gather params", COSTMODEL_ALL_GATHER,
                COSTMODEL_GROUP, &sg, n * M, gbytes * M, gmax, gsec * M, &in->links);
        if (zero3)
            row_add(&r, "gather params (backward)", COSTMODEL_ALL_GATHER, COSTMODEL_GROUP, &sg,
                    n * M, gbytes * M, gmax, gsec * M, &in->links);
        row_add(&r, "reduce-scatter grads", COSTMODEL_REDUCE_SCATTER, COSTMODEL_GROUP, &sg, n * M,
                rsbytes * M, rsmax, rssec * M, &in->links);
    }
    if (R > 1)
        row_add(&r, "all-reduce grad shards", COSTMODEL_ALL_REDUCE, COSTMODEL_REPLICA, &sr, n,
                arbytes, armax, arsec, &in->links);
    row_add(&r, "micro-batch agreement", COSTMODEL_ALL_REDUCE, COSTMODEL_WORLD, &sw, M, 32.0 * M,
            32, t.agree * M, &in->links);
    if (G > 1)
        row_add(&r, "gradient norm", COSTMODEL_ALL_REDUCE, COSTMODEL_GROUP, &sg, 1, 8, 8, t.norm,
                &in->links);
    r.compute = s.busy_x;
    r.comm_busy = s.busy_c;
    r.replica_busy = s.busy_r;
    r.step = s.step;
    r.exposed = s.step - s.busy_x;
    r.exposed_replica = dmax(0, s.step - s0.step);
    r.exposed_group = dmax(0, r.exposed - r.exposed_replica);
    r.tokens_per_s = tokens * M * W / s.step;
    r.mfu = model_flops_per_token(m, in->seq) * tokens * M / s.step / (in->peak_tflops * 1e12);
    r.mem = memory(e, n, in, G);
    free(e);
    free(buf);
    free(idx);
    *out = r;
    return 0;
}

/* ---------------------------------------------------------------- the ranking */

static bool same_shape(const bmt_layout_t *a, int groups, int gpg)
{
    return a->groups == groups && a->gpus_per_group == gpg;
}

/* Better first: fitting before not, then faster (fitting) or smaller (not). */
static int cand_cmp(const void *pa, const void *pb)
{
    const costmodel_candidate_t *a = pa, *b = pb;
    if (a->r.mem.fits != b->r.mem.fits)
        return a->r.mem.fits ? -1 : 1;
    double x = a->r.mem.fits ? a->r.step : a->r.mem.peak;
    double y = b->r.mem.fits ? b->r.step : b->r.mem.peak;
    if (x != y)
        return x < y ? -1 : 1;
    /* Ties: fewer groups' worth of cross-group traffic first, then by size. */
    return a->r.layout.gpus_per_group > b->r.layout.gpus_per_group ? -1 : 1;
}

/* Every figure printed is finite (JSON has no inf or nan; the text would show
 * them): the ranges of costmodel_setup keep them so, this says if not. */
static bool result_finite(const costmodel_result_t *r)
{
    const double v[] = { r->compute, r->comm_busy,       r->replica_busy,  r->step,
                         r->exposed, r->exposed_replica, r->exposed_group, r->tokens_per_s,
                         r->mfu,     r->mem.peak,        r->mem.usable };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        if (!isfinite(v[i]))
            return false;
    for (int i = 0; i < r->nrows; i++)
        if (!isfinite(r->rows[i].seconds) || !isfinite(r->rows[i].bytes))
            return false;
    return true;
}

int costmodel_rank(const bmt_layout_t *user, const costmodel_in_t *in, costmodel_candidate_t *out,
                   size_t max, bmt_error_t *err)
{
    if (max < 2)
        return errprintf(err, "cost model: room for at least 2 layouts is needed");
    size_t cap = 16 + 64, n = 0;
    costmodel_candidate_t *c = calloc(cap, sizeof(*c));
    if (c == NULL)
        return errprintf(err, "cost model: out of memory");
    const int W = user->world, gpn = user->gpus_per_node;
    struct want {
        int groups, gpg;
        const char *why;
    } want[16 + 64];
    size_t nw = 0;
    want[nw++] = (struct want){ user->groups, user->gpus_per_group, "yours" };
    want[nw++] = (struct want){ 1, W, "flat" };
    bmt_layout_alt_t alts[6];
    size_t na = bmt_layout_alternatives(user, alts, 6);
    for (size_t i = 0; i < na; i++)
        want[nw++] =
            (struct want){ alts[i].groups, alts[i].gpus_per_group, "rail-aligned alternative" };
    /* Group sizes dividing the world (at most 64 of them, smallest groups last). */
    int divs[64], nd = 0;
    for (int d = W; d >= 1 && nd < 64; d--)
        if (W % d == 0)
            divs[nd++] = d;
    for (int i = 0; i < nd && nw < sizeof(want) / sizeof(want[0]); i++)
        want[nw++] = (struct want){ W / divs[i], divs[i], "divides the world" };
    for (size_t i = 0; i < nw; i++) {
        bool dup = false;
        for (size_t k = 0; k < n && !dup; k++)
            dup = same_shape(&c[k].r.layout, want[i].groups, want[i].gpg);
        if (dup)
            continue;
        bmt_layout_t l;
        bmt_error_t e2 = { { 0 } };
        if (i == 0)
            l = *user;
        else if (bmt_layout_make(&l, want[i].groups, want[i].gpg, gpn, 0, &e2) < 0)
            continue; /* e.g. a world that does not fill whole nodes */
        if (costmodel_eval(&l, in, &c[n].r, err) < 0) {
            free(c);
            return -1;
        }
        if (!result_finite(&c[n].r)) {
            errprintf(err,
                      "cost model: layout %d x %d gives a figure that is not finite (step "
                      "%g s, peak %g bytes): an option is out of the range the model "
                      "can compute",
                      l.groups, l.gpus_per_group, c[n].r.step, c[n].r.mem.peak);
            free(c);
            return -1;
        }
        c[n].why = want[i].why;
        c[n].yours = i == 0;
        n++;
    }
    qsort(c, n, sizeof(*c), cand_cmp);
    /* Keep the best max, and the user's and flat whatever their place. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool keep = c[i].yours || (c[i].r.layout.groups == 1 && c[i].r.layout.world == W);
        size_t reserved = 0;
        for (size_t j = i + 1; j < n; j++)
            reserved += c[j].yours || c[j].r.layout.groups == 1;
        if (keep || k + reserved < max)
            out[k++] = c[i];
        if (k == max)
            break;
    }
    free(c);
    return (int)k;
}
int costmodel_recommended(const costmodel_candidate_t *cand, size_t n)
{
    int world = -1;
    for (size_t i = 0; i < n; i++)
        if (cand[i].yours)
            world = cand[i].r.layout.world;
    for (size_t i = 0; i < n; i++)
        if (cand[i].r.mem.fits && cand[i].r.layout.world == world)
            return (int)i;
    return -1;
}

/* ---------------------------------------------------------------- parsing */

/* End of a decimal number at p (digits, optional fraction, optional exponent), or
 * NULL. Written out rather than left to strtod, which also takes signs, spaces,
 * hexadecimal, "inf" and "nan". */
static const char *scan_decimal(const char *p)
{
    int digits = 0;
    while (isdigit((unsigned char)*p)) {
        p++;
        digits++;
    }
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) {
            p++;
            digits++;
        }
    }
    if (digits == 0)
        return NULL;
    if (*p == 'e' || *p == 'E') {
        const char *q = p + 1;
        if (*q == '+' || *q == '-')
            q++;
        if (!isdigit((unsigned char)*q))
            return NULL;
        while (isdigit((unsigned char)*q))
            q++;
        p = q;
    }
    return p;
}

/* strtod of text[0, len), known to be a valid decimal. */
static double decimal_value(const char *text, size_t len)
{
    char buf[80];
    if (len >= sizeof(buf))
        return NAN;
    memcpy(buf, text, len);
    buf[len] = '\0';
    return strtod(buf, NULL); /* overflow gives HUGE_VAL, caught as too large */
}

int costmodel_parse_params(const char *text, const char *what, double *out, bmt_error_t *err)
{
    if (text == NULL || *text == '\0')
        return errprintf(err,
                         "%s needs a parameter count (1.5e9, 350M, 70B) or a preset "
                         "(d48, llama3-70b; bmlaunch --help lists them), got nothing",
                         what);
    const costmodel_model_t *p = costmodel_preset(text);
    if (p) {
        *out = p->params;
        return 0;
    }
    if (*text == '-')
        return errprintf(err, "%s needs a positive parameter count, got '%.200s'", what, text);
    const char *end = scan_decimal(text);
    double scale = 1;
    if (end) {
        switch (tolower((unsigned char)*end)) {
        case 'k': scale = 1e3; break;
        case 'm': scale = 1e6; break;
        case 'b':
        case 'g': scale = 1e9; break;
        case 't': scale = 1e12; break;
        default: break;
        }
    }
    if (end == NULL || end[scale == 1 ? 0 : 1] != '\0')
        return errprintf(err,
                         "%s: '%.200s' is neither a parameter count (1.5e9, 350M, 70B) nor a "
                         "preset (d12, d24, d36, d48, llama3.2-1b, llama3.2-3b, llama3-8b, "
                         "llama3-70b, llama3-405b)",
                         what, text);
    double v = decimal_value(text, (size_t)(end - text));
    if (isnan(v))
        return errprintf(err, "%s: '%.200s' is too long a number", what, text);
    v = round(v * scale);
    if (v > COSTMODEL_MAX_PARAMS)
        return errprintf(err, "%s: '%.200s' is too many parameters (at most 1e15)", what, text);
    if (v < 1)
        return errprintf(err, "%s needs at least 1 parameter, got '%.200s'", what, text);
    *out = v;
    return 0;
}

/* A decimal in [min, max] (0 too when allow_zero): a positive value below min
 * (1e-320) is refused, not left to make an infinite time. */
static int parse_real(const char *text, const char *what, const char *unit, bool allow_zero,
                      double min, double max, double *out, bmt_error_t *err)
{
    const char *end = text ? scan_decimal(text) : NULL;
    if (end == NULL || *end != '\0')
        return errprintf(err, "%s needs a %s number of %s, got '%.200s'", what,
                         allow_zero ? "non-negative" : "positive", unit, text ? text : "");
    double v = decimal_value(text, (size_t)(end - text));
    if (isnan(v) || v > max)
        return errprintf(err, "%s: '%.200s' is too large (at most %g %s)", what, text, max, unit);
    if (v == 0 && !allow_zero)
        return errprintf(err, "%s needs a positive number of %s, got '%.200s'", what, unit, text);
    if (v != 0 && v < min)
        return errprintf(err, "%s: '%.200s' is too small (at least %g %s)", what, text, min, unit);
    *out = v;
    return 0;
}

int costmodel_parse_gbps(const char *text, const char *what, double *out, bmt_error_t *err)
{
    return parse_real(text, what, "GB/s", false, COSTMODEL_MIN_GBPS, 1e5, out, err);
}

int costmodel_parse_us(const char *text, const char *what, double *out, bmt_error_t *err)
{
    return parse_real(text, what, "microseconds", true, 0, 1e6, out, err);
}

int costmodel_parse_mib(const char *text, const char *what, double *out, bmt_error_t *err)
{
    return parse_real(text, what, "MiB", true, 0, 1073741824.0, out, err);
}

int costmodel_parse_zero(const char *text, const char *what, int *out, bmt_error_t *err)
{
    if (text && strcmp(text, "2") == 0)
        *out = 2;
    else if (text && strcmp(text, "3") == 0)
        *out = 3;
    else
        return errprintf(err, "%s must be 2 or 3, got '%.200s'", what, text ? text : "");
    return 0;
}

int costmodel_parse_dtype(const char *text, const char *what, int *bytes, bmt_error_t *err)
{
    static const struct {
        const char *name;
        int bytes;
    } dtypes[] = { { "bf16", 2 }, { "fp16", 2 }, { "f16", 2 }, { "f32", 4 }, { "fp32", 4 } };
    for (size_t i = 0; text && i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcasecmp(text, dtypes[i].name) == 0) {
            *bytes = dtypes[i].bytes;
            return 0;
        }
    return errprintf(err, "%s must be bf16, fp16 or f32, got '%.200s'", what, text ? text : "");
}

int costmodel_parse_fraction(const char *text, const char *what, double *out, bmt_error_t *err)
{
    const char *end = text ? scan_decimal(text) : NULL;
    double v = end && *end == '\0' ? decimal_value(text, (size_t)(end - text)) : NAN;
    if (!(v >= COSTMODEL_MIN_MFU && v <= 1))
        return errprintf(err,
                         "%s needs a fraction of the peak in [%g, 1] such as 0.45, got '%.200s'",
                         what, COSTMODEL_MIN_MFU, text ? text : "");
    *out = v;
    return 0;
}

int costmodel_parse_speedup(const char *text, const char *what, double *out, bmt_error_t *err)
{
    const char *end = text ? scan_decimal(text) : NULL;
    double v = end && *end == '\0' ? decimal_value(text, (size_t)(end - text)) : NAN;
    if (!(v >= COSTMODEL_MIN_FP8_SPEEDUP && v <= 4))
        return errprintf(err, "%s needs a speed-up factor in [%g, 4] such as 1.3, got '%.200s'",
                         what, COSTMODEL_MIN_FP8_SPEEDUP, text ? text : "");
    *out = v;
    return 0;
}

int costmodel_parse_gib(const char *text, const char *what, double *out, bmt_error_t *err)
{
    return parse_real(text, what, "GiB", false, 0, 1e6, out, err);
}

/* ---------------------------------------------------------------- output */

/* 1557611200 -> "1,557,611,200" (whole numbers up to 1e15). */
static void thousands(char *buf, size_t len, double v)
{
    char digits[32];
    snprintf(digits, sizeof(digits), "%.0f", v);
    size_t n = strlen(digits), o = 0;
    for (size_t i = 0; i < n && o + 2 < len; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
}

static const char *dtype_name(int bytes)
{
    switch (bytes) {
    case 1: return "8-bit";
    case 2: return "bf16";
    case 4: return "f32";
    case 8: return "f64";
    }
    return "?";
}

static const char *arch_name(costmodel_arch_t a)
{
    switch (a) {
    case COSTMODEL_GPT2: return "gpt2";
    case COSTMODEL_LLAMA: return "llama";
    case COSTMODEL_GENERIC: return "generic";
    }
    return "?";
}

/* One term that can decide between two layouts. */
struct term {
    const char *what;
    double yours, best; /* seconds, or bytes for memory */
    bool memory;
    costmodel_comm_t where; /* for the communication terms */
    bool comm;
};

/* The terms in which best and yours differ, largest difference first; at most 3:
 * memory first when only one fits, then the time terms over 0.2% of a step, then
 * memory when the peaks differ by more than 10%. */
static int deciding(const costmodel_result_t *best, const costmodel_result_t *yours, struct term *t)
{
    struct term all[4] = {
        { "exposed group communication", yours->exposed_group, best->exposed_group, false,
          COSTMODEL_GROUP, true },
        { "exposed replica communication", yours->exposed_replica, best->exposed_replica, false,
          COSTMODEL_REPLICA, true },
        { "compute", yours->compute, best->compute, false, COSTMODEL_GROUP, false },
        { "peak memory", yours->mem.peak, best->mem.peak, true, COSTMODEL_GROUP, false },
    };
    int n = 0;
    /* Memory decides first when one fits and the other does not. */
    if (yours->mem.fits != best->mem.fits)
        t[n++] = all[3];
    double scale = yours->step > 0 ? yours->step : 1;
    for (int pass = 0; pass < 3 && n < 3; pass++) {
        int pick = -1;
        double most = 0.002 * scale; /* differences under 0.2% of a step do not decide */
        for (int i = 0; i < 3; i++) {
            bool taken = false;
            for (int k = 0; k < n; k++)
                taken |= t[k].what == all[i].what;
            double d = fabs(all[i].yours - all[i].best);
            if (!taken && d > most) {
                most = d;
                pick = i;
            }
        }
        if (pick < 0)
            break;
        t[n++] = all[pick];
    }
    /* Memory, when it differs by more than a tenth: what the faster one costs. */
    if (n < 3 && yours->mem.fits == best->mem.fits &&
        fabs(yours->mem.peak - best->mem.peak) > 0.1 * yours->mem.peak)
        t[n++] = all[3];
    return n;
}

static void span_words(char *buf, size_t len, const costmodel_result_t *r, costmodel_comm_t where)
{
    const costmodel_row_t *row = NULL;
    for (int i = 0; i < r->nrows && row == NULL; i++)
        if (r->rows[i].where == where && r->rows[i].calls > 1)
            row = &r->rows[i];
    if (row == NULL) {
        snprintf(buf, len, "%s of %d: none", costmodel_comm_name(where),
                 where == COSTMODEL_GROUP ? r->layout.gpus_per_group : r->layout.groups);
        return;
    }
    if (row->span.nodes == 1)
        snprintf(buf, len, "%s of %d on one node, %s/%s at %.1f GB/s", costmodel_comm_name(where),
                 row->span.ranks, costmodel_algo_name(row->big.algo),
                 costmodel_proto_name(row->big.proto), row->big.busbw_gbps);
    else
        snprintf(buf, len, "%s of %d on %d nodes, %d on its thinnest, %s/%s at %.1f GB/s",
                 costmodel_comm_name(where), row->span.ranks, row->span.nodes, row->span.thinnest,
                 costmodel_algo_name(row->big.algo), costmodel_proto_name(row->big.proto),
                 row->big.busbw_gbps);
}

static void print_terms(FILE *out, const costmodel_result_t *best, const costmodel_result_t *yours)
{
    struct term t[3];
    int n = deciding(best, yours, t);
    if (n == 0) {
        fprintf(out, "    no term differs by more than 0.2%% of a step\n");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (t[i].memory) {
            fprintf(out, "    %s %.1f against %.1f GiB (%.1f usable)\n", t[i].what, t[i].best / GIB,
                    t[i].yours / GIB, best->mem.usable / GIB);
            continue;
        }
        fprintf(out, "    %s %.1f against %.1f ms", t[i].what, t[i].best * 1e3, t[i].yours * 1e3);
        if (t[i].comm) {
            char a[160], b[160];
            span_words(a, sizeof(a), best, t[i].where);
            span_words(b, sizeof(b), yours, t[i].where);
            fprintf(out, ":\n      %s\n      against %s", a, b);
        }
        fputc('\n', out);
    }
}

static void print_layout(FILE *out, const costmodel_in_t *in, const costmodel_result_t *r)
{
    const bmt_layout_t *l = &r->layout;
    fprintf(out,
            "\n  this layout, %d x %d: collectives per step and GPU (NCCL's choice for the "
            "largest call)\n",
            l->groups, l->gpus_per_group);
    fprintf(out, "    %-26s %-8s %5s %5s %4s %6s %10s %-13s %7s %10s\n", "collective", "where",
            "ranks", "nodes", "thin", "calls", "GB sent", "algorithm", "busbw", "ms");
    for (int i = 0; i < r->nrows; i++) {
        const costmodel_row_t *w = &r->rows[i];
        char algo[24];
        snprintf(algo, sizeof(algo), "%s/%s", costmodel_algo_name(w->big.algo),
                 costmodel_proto_name(w->big.proto));
        fprintf(out, "    %-26s %-8s %5d %5d %4d %6d %10.3f %-13s %7.1f %10.3f\n", w->op,
                costmodel_comm_name(w->where), w->span.ranks, w->span.nodes, w->span.thinnest,
                w->calls, w->sent / GB, algo, w->big.busbw_gbps, w->seconds * 1e3);
    }
    if (r->nrows == 0)
        fprintf(out, "    (none: a world of one rank)\n");
    fprintf(out,
            "  step %.3f ms: compute %.3f + exposed communication %.3f (group %.3f, replica "
            "%.3f)\n",
            r->step * 1e3, r->compute * 1e3, r->exposed * 1e3, r->exposed_group * 1e3,
            r->exposed_replica * 1e3);
    fprintf(out,
            "    comm stream busy %.3f ms, replica stream %.3f ms; %.0f tokens/s for the world, "
            "MFU %.1f%%\n",
            r->comm_busy * 1e3, r->replica_busy * 1e3, r->tokens_per_s, 100 * r->mfu);
    const costmodel_mem_t *m = &r->mem;
    char acts[64];
    if (in->ckpt && in->kept > 0)
        snprintf(acts, sizeof(acts), "checkpointed, %d layers kept", in->kept);
    else
        snprintf(acts, sizeof(acts), "%s", in->ckpt ? "checkpointed" : "all kept");
    fprintf(out,
            "  memory per GPU (GiB): states %.2f, gradient shards %.2f, activations %.2f "
            "(%s), transient %.2f,\n    gathered %.2f, full gradients %.2f, workspace %.2f: "
            "peak %.2f of %.2f usable: %s\n",
            m->states / GIB, m->grads / GIB, m->activations / GIB, acts, m->transient / GIB,
            m->gathered / GIB, m->grad_full / GIB, m->workspace / GIB, m->peak / GIB,
            m->usable / GIB, m->fits ? "fits" : "DOES NOT FIT");
}

int costmodel_print_text(FILE *out, const costmodel_in_t *in, const costmodel_candidate_t *cand,
                         size_t n)
{
    const costmodel_model_t *m = &in->model;
    const costmodel_candidate_t *yours = NULL;
    for (size_t i = 0; i < n; i++)
        if (cand[i].yours)
            yours = &cand[i];
    if (yours == NULL)
        return -1;
    char count[32];
    thousands(count, sizeof(count), m->params);
    fprintf(out, "\n  cost model: %s%s%s parameters: %d layers, hidden %.0f",
            m->name ? m->name : "", m->name ? " = " : "", count, m->layers, m->hidden);
    if (m->arch == COSTMODEL_GENERIC)
        fprintf(out, " (a count: shape assumed, --layers to set)\n");
    else {
        const costmodel_model_t *pre = costmodel_preset(m->name);
        char pos[80] = "";
        if (m->arch == COSTMODEL_GPT2 && pre && m->context != pre->context)
            snprintf(pos, sizeof(pos), ", %d positions (the trainer's --max-seq %d)", m->context,
                     m->context);
        fprintf(out, ", FFN %.0f, KV width %.0f, vocabulary %.0f%s%s\n", m->ffn, m->kv_dim,
                m->vocab, m->tied ? ", tied" : "", pos);
    }
    const bool budget = in->ckpt && in->ckpt_budget >= 0;
    char ck[64];
    if (budget)
        snprintf(ck, sizeof(ck), "on within %.1f MiB", in->ckpt_budget / 1048576.0);
    else
        snprintf(ck, sizeof(ck), "%s", in->ckpt ? "on" : "off");
    fprintf(out,
            "    per GPU: micro-batch %d x %d tokens, %d micro-batch%s a step; checkpointing "
            "%s; ZeRO-%d;\n    %s gathers, %s gradients, %s shards across groups\n",
            in->micro_batch, in->seq, in->accum, in->accum == 1 ? "" : "es", ck, in->zero_level,
            dtype_name(in->gather_bytes), dtype_name(in->reduce_bytes),
            dtype_name(in->shard_bytes));
    if (in->fp8)
        fprintf(out,
                "    --fp8 1: the layers' linear products in FP8 at %.2fx their bf16 speed, "
                "1-byte codes\n    of their inputs and weights in each layer's activations\n",
                in->fp8_speedup);
    if (budget)
        fprintf(out,
                "    --ckpt-budget: the last %d of %d layers keep their activations (%.1f MiB "
                "each), the head %s\n",
                in->kept, m->layers, layer_act_bytes(in) / 1048576.0,
                in->head_whole ? "keeps its logits whole"
                               : "recomputes its logits a chunk at a time");
    fprintf(out,
            "    GPU: %.0f TFLOP/s bf16 at MFU %.2f, %.1f GiB; NVLink busbw %.1f / %.1f / %.1f "
            "GB/s\n    (all-gather / reduce-scatter / all-reduce), NIC %.1f GB/s per GPU; a call "
            "costs NCCL's latency",
            in->peak_tflops, in->mfu, in->gpu_mem_gib, in->links.nvlink_gbps[0],
            in->links.nvlink_gbps[1], in->links.nvlink_gbps[2], in->links.nic_gbps);
    if (in->links.step_us >= 0)
        fprintf(out, " (%.2f us a step)", in->links.step_us);
    fprintf(out, " + %.1f us (LL) or %.1f us (Simple)\n", in->links.call_us[COSTMODEL_LL],
            in->links.call_us[COSTMODEL_SIMPLE]);
    print_layout(out, in, &yours->r);

    fprintf(out,
            "\n  layouts ranked by step time, those that fit first (the same GPUs per node and "
            "work per GPU):\n");
    fprintf(out, "    %2s  %-12s %6s %10s %11s %9s %9s %9s %5s  %s\n", "#", "layout", "GPUs",
            "step ms", "exposed ms", "group", "replica", "peak GiB", "fits", "why");
    for (size_t i = 0; i < n; i++) {
        const costmodel_result_t *r = &cand[i].r;
        char shape[32];
        snprintf(shape, sizeof(shape), "%d x %d", r->layout.groups, r->layout.gpus_per_group);
        fprintf(out, "  %s %2zu  %-12s %6d %10.3f %11.3f %9.3f %9.3f %9.2f %5s  %s\n",
                cand[i].yours ? "*" : " ", i + 1, shape, r->layout.world, r->step * 1e3,
                r->exposed * 1e3, r->exposed_group * 1e3, r->exposed_replica * 1e3,
                r->mem.peak / GIB, r->mem.fits ? "yes" : "no", cand[i].why);
    }
    const int rec = costmodel_recommended(cand, n);
    if (rec < 0) {
        double least = yours->r.mem.peak;
        const costmodel_candidate_t *small = yours;
        for (size_t i = 0; i < n; i++)
            if (cand[i].r.layout.world == yours->r.layout.world && cand[i].r.mem.peak < least) {
                least = cand[i].r.mem.peak;
                small = &cand[i];
            }
        /* what is left to try: only the levers this plan has not pulled */
        char more[160] = "more GPUs per group";
        if (!in->ckpt)
            strcat(more, ", checkpointing (--ckpt 1)");
        else if (in->ckpt_budget > 0)
            strcat(more, ", a smaller --ckpt-budget");
        if (in->micro_batch > 1)
            strcat(more, ", a smaller micro-batch");
        char *last = strrchr(more, ',');
        fprintf(out,
                "  recommendation: no layout of %d GPUs fits in %.1f GiB; the smallest peak is "
                "%d x %d's %.1f GiB:\n    %.*s%s%s\n",
                yours->r.layout.world, yours->r.mem.usable / GIB, small->r.layout.groups,
                small->r.layout.gpus_per_group, least / GIB,
                last ? (int)(last - more) : (int)strlen(more), more, last ? " or" : "",
                last ? last + 1 : "");
        return ferror(out) ? -1 : 0;
    }
    const costmodel_candidate_t *best = &cand[rec];
    if (best == yours) {
        const costmodel_candidate_t *next = NULL;
        for (size_t i = (size_t)rec + 1; i < n && next == NULL; i++)
            if (cand[i].r.layout.world == yours->r.layout.world)
                next = &cand[i];
        fprintf(out, "  recommendation: yours, %d x %d, is the fastest that fits",
                yours->r.layout.groups, yours->r.layout.gpus_per_group);
        if (next && next->r.mem.fits) {
            fprintf(out, "; the next, %d x %d, is %.3f ms (%.1f%%) slower; what decides:\n",
                    next->r.layout.groups, next->r.layout.gpus_per_group,
                    (next->r.step - yours->r.step) * 1e3,
                    100 * (next->r.step - yours->r.step) / yours->r.step);
            print_terms(out, &yours->r, &next->r);
        } else {
            fputc('\n', out);
        }
        return ferror(out) ? -1 : 0;
    }
    const double margin = (yours->r.step - best->r.step) / yours->r.step;
    if (yours->r.mem.fits && margin < COSTMODEL_MARGIN) {
        fprintf(out,
                "  recommendation: keep yours, %d x %d: the fastest, %d x %d, is %.3f ms (%.2f%%) "
                "faster,\n    less than the %.0f%% this model can tell apart; what differs:\n",
                yours->r.layout.groups, yours->r.layout.gpus_per_group, best->r.layout.groups,
                best->r.layout.gpus_per_group, (yours->r.step - best->r.step) * 1e3, 100 * margin,
                100 * COSTMODEL_MARGIN);
        print_terms(out, &best->r, &yours->r);
        return ferror(out) ? -1 : 0;
    }
    fprintf(out, "  recommendation: --groups %d --gpus-per-group %d", best->r.layout.groups,
            best->r.layout.gpus_per_group);
    if (yours->r.mem.fits)
        fprintf(out, ", %.3f ms (%.1f%%) a step faster than yours; what decides:\n",
                (yours->r.step - best->r.step) * 1e3,
                100 * (yours->r.step - best->r.step) / yours->r.step);
    else
        fprintf(out, ": yours does not fit; what decides:\n");
    print_terms(out, &best->r, &yours->r);
    return ferror(out) ? -1 : 0;
}

static json_t *row_json(const costmodel_row_t *w)
{
    return json_pack(
        "{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:s, s:s, s:f, s:f}", "op", w->op,
        "collective", costmodel_coll_name(w->coll), "where", costmodel_comm_name(w->where), "ranks",
        w->span.ranks, "nodes", w->span.nodes, "thinnest", w->span.thinnest, "calls", w->calls,
        "bytes", w->bytes, "bytes_sent_per_gpu", w->sent, "seconds", w->seconds, "algorithm",
        costmodel_algo_name(w->big.algo), "protocol", costmodel_proto_name(w->big.proto),
        "busbw_gbps", w->big.busbw_gbps, "latency_us", w->big.latency_us);
}

static json_t *result_json(const costmodel_candidate_t *c, size_t rank)
{
    const costmodel_result_t *r = &c->r;
    json_t *rows = json_array();
    for (int i = 0; i < r->nrows; i++)
        json_array_append_new(rows, row_json(&r->rows[i]));
    const costmodel_mem_t *m = &r->mem;
    json_t *mem =
        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b}", "states", m->states,
                  "grad_shards", m->grads, "activations", m->activations, "transient", m->transient,
                  "gathered", m->gathered, "grad_full", m->grad_full, "workspace", m->workspace,
                  "peak", m->peak, "usable", m->usable, "fits", m->fits);
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
                     "s:f, s:f, s:o, s:o}",
                     "rank", (int)rank, "groups", r->layout.groups, "gpus_per_group",
                     r->layout.gpus_per_group, "gpus_per_node", r->layout.gpus_per_node, "nodes",
                     r->layout.nodes, "world", r->layout.world, "why", c->why, "yours", c->yours,
                     "step_s", r->step, "compute_s", r->compute, "exposed_s", r->exposed,
                     "exposed_group_s", r->exposed_group, "exposed_replica_s", r->exposed_replica,
                     "comm_busy_s", r->comm_busy, "replica_busy_s", r->replica_busy, "tokens_per_s",
                     r->tokens_per_s, "mfu", r->mfu, "memory_bytes", mem, "collectives", rows);
}

json_t *costmodel_json(const costmodel_in_t *in, const costmodel_candidate_t *cand, size_t n)
{
    const costmodel_model_t *m = &in->model;
    json_t *model = json_pack("{s:s?, s:s, s:f, s:i, s:f, s:f, s:f, s:i, s:f, s:b}", "name",
                              m->name, "arch", arch_name(m->arch), "params", m->params, "layers",
                              m->layers, "hidden", m->hidden, "ffn", m->ffn, "kv_dim", m->kv_dim,
                              "heads", m->heads, "vocab", m->vocab, "tied", m->tied);
    json_t *train = json_pack(
        "{s:i, s:i, s:i, s:b, s:o, s:i, s:b, s:b, s:b, s:o, s:i, s:i, s:i, s:i}", "seq", in->seq,
        "micro_batch", in->micro_batch, "accum", in->accum, "ckpt", in->ckpt, "ckpt_budget_mib",
        in->ckpt_budget >= 0 ? json_real(in->ckpt_budget / 1048576.0) : json_null(), "kept_layers",
        in->kept, "head_whole", in->head_whole, "keep_attention", in->keep_attention, "fp8",
        in->fp8, "fp8_speedup", in->fp8 ? json_real(in->fp8_speedup) : json_null(), "zero_level",
        in->zero_level, "gather_bytes", in->gather_bytes, "reduce_bytes", in->reduce_bytes,
        "shard_bytes", in->shard_bytes);
    json_t *links = json_pack(
        "{s:{s:f, s:f, s:f}, s:f, s:{s:f, s:f, s:f}, s:o}", "nvlink_busbw_gbps", "all_gather",
        in->links.nvlink_gbps[0], "reduce_scatter", in->links.nvlink_gbps[1], "all_reduce",
        in->links.nvlink_gbps[2], "nic_busbw_gbps", in->links.nic_gbps, "call_us", "LL",
        in->links.call_us[0], "LL128", in->links.call_us[1], "Simple", in->links.call_us[2],
        "step_us", in->links.step_us >= 0 ? json_real(in->links.step_us) : json_null());
    json_t *gpu = json_pack("{s:f, s:f, s:f}", "peak_tflops", in->peak_tflops, "mfu", in->mfu,
                            "mem_gib", in->gpu_mem_gib);
    json_t *layouts = json_array();
    const costmodel_candidate_t *yours = NULL;
    bool hole = false; /* a value json_pack refused (inf, nan): no JSON, not one with a gap */
    for (size_t i = 0; i < n; i++) {
        hole |= json_array_append_new(layouts, result_json(&cand[i], i + 1)) < 0;
        if (cand[i].yours)
            yours = &cand[i];
    }
    json_t *rec = json_null();
    const int best = costmodel_recommended(cand, n);
    if (best >= 0 && yours) {
        const costmodel_candidate_t *b = &cand[best];
        json_t *terms = json_array();
        if (b != yours) {
            struct term t[3];
            int k = deciding(&b->r, &yours->r, t);
            for (int i = 0; i < k; i++)
                hole |= json_array_append_new(
                            terms, json_pack("{s:s, s:f, s:f, s:s}", "term", t[i].what,
                                             "recommended", t[i].best, "yours", t[i].yours, "unit",
                                             t[i].memory ? "bytes" : "seconds")) < 0;
        }
        double margin = yours->r.mem.fits ? (yours->r.step - b->r.step) / yours->r.step : 1.0;
        rec = json_pack("{s:i, s:i, s:b, s:f, s:b, s:o}", "groups", b->r.layout.groups,
                        "gpus_per_group", b->r.layout.gpus_per_group, "is_yours", b->yours,
                        "faster_than_yours", margin, "keep_yours",
                        yours->r.mem.fits && margin < COSTMODEL_MARGIN, "deciding", terms);
    }
    json_t *root = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "model", model, "train", train,
                             "gpu", gpu, "links", links, "layouts", layouts, "recommended", rec);
    if (hole) {
        json_decref(root);
        return NULL;
    }
    return root;
}
