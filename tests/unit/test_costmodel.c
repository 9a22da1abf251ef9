/* tests/unit/test_costmodel.c — the planner's cost model (`bmlaunch --plan --model`).
 *
 * Expected figures are written out by hand from the formulas docs/planner.md
 * states (NCCL's tuning model, the engine's schedule, its allocations), with
 * NCCL's constants as literal numbers, not recomputed through the module:
 *   - single collectives: the algorithm and protocol NCCL would pick and the time,
 *     for one node, one rank per node (tree, PAT) and several per node (the
 *     ring's plateau), with the user's overrides; and the model against every
 *     size bench/comm measured on 2x H200 (within 15%);
 *   - spans against a scan of every communicator's members;
 *   - the step's simulation in four schedules derived by hand (comm-bound,
 *     compute-bound with and without checkpointing, ZeRO-2, a group of one);
 *   - memory per GPU of d48 against the hand sum (and the measured peaks they
 *     are within 5% of);
 *   - presets against HF's published parameter counts;
 *   - the ranking's order and what it keeps; set-up's defaults and refusals;
 *   - the JSON against the structs, the text's key lines; the parsers.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel.h"
#include "plan.h"
#include "tap.h"

static bool close_rel(double got, double want, double rel)
{
    if (want == 0)
        return got == 0;
    return fabs(got - want) <= rel * fabs(want);
}

static int is_real(double got, double want, const char *what)
{
    int cond = close_rel(got, want, 1e-9);
    ok(cond, "%s", what);
    if (!cond)
        diag("got %.17g, want %.17g", got, want);
    return cond;
}

static bmt_layout_t layout(int groups, int gpg, int gpn)
{
    bmt_layout_t l;
    bmt_error_t err = { { 0 } };
    if (bmt_layout_make(&l, groups, gpg, gpn, 0, &err) < 0) {
        diag("layout %dx%d/%d: %s", groups, gpg, gpn, err.text);
        abort();
    }
    return l;
}

/* The defaults of an H200 machine, through costmodel_setup. */
static costmodel_in_t defaults(const char *model)
{
    costmodel_opts_t o = COSTMODEL_OPTS_INITIALIZER;
    o.model = model;
    costmodel_in_t in;
    bmt_error_t err = { { 0 } };
    if (costmodel_setup(&o, &in, &err) < 0) {
        diag("setup %s: %s", model, err.text);
        abort();
    }
    return in;
}

/* ---------------------------------------------------------------- one collective */

static void check_choice(const char *what, costmodel_coll_t c, costmodel_span_t s, double bytes,
                         const costmodel_links_t *lk, costmodel_algo_t algo,
                         costmodel_proto_t proto, double want)
{
    costmodel_choice_t ch;
    double t = costmodel_collective(c, &s, bytes, lk, &ch);
    int good = ch.algo == algo && ch.proto == proto && close_rel(t, want, 1e-9) && t == ch.seconds;
    ok(good, "%s: %s/%s, %.3f us", what, costmodel_algo_name(algo), costmodel_proto_name(proto),
       want * 1e6);
    if (!good)
        diag("got %s/%s %.6f us", costmodel_algo_name(ch.algo), costmodel_proto_name(ch.proto),
             t * 1e6);
}

static void check_collectives(void)
{
    const costmodel_links_t lk = defaults("d12").links;
    const double MiB256 = 268435456.0, GiB1 = 1073741824.0;
    /* 2 ranks on one node, all-gather of 256 MiB: Simple ring, latency 8.4 + 1 x 3.4
     * + 18.4 (call) us, algbw 242.6 x 2 / 1. */
    check_choice("all-gather 256 MiB, 2 ranks, one node", COSTMODEL_ALL_GATHER,
                 (costmodel_span_t){ 2, 1, 2, 0 }, MiB256, &lk, COSTMODEL_RING, COSTMODEL_SIMPLE,
                 30.2e-6 + MiB256 / 485.2e9);
    /* 1 KiB: LL ring, 6.6 + 0.6 + 11.7 us, algbw min(141, 242.6 / 2) x 2. */
    check_choice("all-gather 1 KiB, 2 ranks, one node", COSTMODEL_ALL_GATHER,
                 (costmodel_span_t){ 2, 1, 2, 0 }, 1024, &lk, COSTMODEL_RING, COSTMODEL_LL,
                 18.9e-6 + 1024 / 242.6e9);
    /* 8 ranks on 8 nodes, all-reduce of 8 bytes: tree LL, 6.8 + 2 (0 x 0.6 + log2 8 x
     * 5.0) + 11.7 us; busbw min(297.9, 1 x 46) = 46, x 0.92 / 3.8, algbw half. */
    check_choice("all-reduce 8 B, 8 nodes x 1", COSTMODEL_ALL_REDUCE,
                 (costmodel_span_t){ 8, 8, 1, 0 }, 8, &lk, COSTMODEL_TREE, COSTMODEL_LL,
                 48.5e-6 + 8 / (46 * 0.92 / 3.8 * 0.5 * 1e9));
    /* 16 ranks on 16 nodes, all-gather of 1 KiB: PAT, 8 + log2 16 x 14 / 3.5 + 16 x
     * 2.8 + 18.4 us, algbw 0.75 x 46 (the ring: 6.6 + 15 x 5.0 + 11.7 = 93.3 us). */
    check_choice("all-gather 1 KiB, 16 nodes x 1", COSTMODEL_ALL_GATHER,
                 (costmodel_span_t){ 16, 16, 1, 0 }, 1024, &lk, COSTMODEL_PAT, COSTMODEL_SIMPLE,
                 87.2e-6 + 1024 / 34.5e9);
    /* 1 GiB there: the Simple ring, 8.4 + 15 x 14 (NET tree Simple, one rank a node)
     * + 18.4 us, algbw 46 x 16 / 15, beats PAT's 0.75 x 46. */
    check_choice("all-gather 1 GiB, 16 nodes x 1", COSTMODEL_ALL_GATHER,
                 (costmodel_span_t){ 16, 16, 1, 0 }, GiB1, &lk, COSTMODEL_RING, COSTMODEL_SIMPLE,
                 236.8e-6 + GiB1 / (46 * 16.0 / 15 * 1e9));
    /* 16 ranks on 2 nodes of 8, all-gather 1 GiB: 14 NVLink steps at max(3.4, 3 x 1.0)
     * and 1 network step of 14: 8.4 + 47.6 + 14 + 18.4 us; busbw min(242.6, 8 x 46). */
    check_choice("all-gather 1 GiB, 2 nodes x 8", COSTMODEL_ALL_GATHER,
                 (costmodel_span_t){ 16, 2, 8, 0 }, GiB1, &lk, COSTMODEL_RING, COSTMODEL_SIMPLE,
                 88.4e-6 + GiB1 / (242.6 * 16 / 15 * 1e9));
    /* All-reduce 1 GiB there: ring Simple, (8.4 + 28 x 3.4 + 2 x 14) x 1.4 (plateau)
     * + 18.4 us, algbw 297.9 x 16 / 30; the tree (8.4 + 2 (7 x 4 + 14) + 18.4 us,
     * algbw 0.92 x 297.9 / 2) is slower. */
    check_choice("all-reduce 1 GiB, 2 nodes x 8", COSTMODEL_ALL_REDUCE,
                 (costmodel_span_t){ 16, 2, 8, 0 }, GiB1, &lk, COSTMODEL_RING, COSTMODEL_SIMPLE,
                 202.64e-6 + GiB1 / (297.9 * 16 / 30 * 1e9));
    /* --latency-us 0 --call-us 0: only NCCL's base latency is left. */
    costmodel_links_t zero = lk;
    zero.step_us = 0;
    zero.call_us[0] = zero.call_us[1] = zero.call_us[2] = 0;
    check_choice("all-gather 256 MiB with no step latency or call cost", COSTMODEL_ALL_GATHER,
                 (costmodel_span_t){ 2, 1, 2, 0 }, MiB256, &zero, COSTMODEL_RING, COSTMODEL_SIMPLE,
                 8.4e-6 + MiB256 / 485.2e9);
    /* A given busbw for the communicator replaces the links'. */
    check_choice("reduce-scatter 256 MiB at a given 100 GB/s", COSTMODEL_REDUCE_SCATTER,
                 (costmodel_span_t){ 2, 1, 2, 100 }, MiB256, &lk, COSTMODEL_RING, COSTMODEL_SIMPLE,
                 30.2e-6 + MiB256 / 200e9);
    costmodel_choice_t ch;
    ok(costmodel_collective(COSTMODEL_ALL_REDUCE, &(costmodel_span_t){ 1, 1, 1, 0 }, 1e9, &lk,
                            &ch) == 0 &&
           ch.seconds == 0,
       "a communicator of one rank costs nothing");

    /* bench/comm on 2x H200 (bench/results/2026-11-30-comm-nccl-2xH200.txt, bmt us):
     * the model is within 15% at every size, LL to Simple. */
    static const double sizes[10] = { 1024,    4096,    16384,    65536,    262144,
                                      1048576, 4194304, 16777216, 67108864, 268435456 };
    static const double measured[3][10] = {
        { 18.8, 18.1, 19.1, 19.9, 21.6, 25.2, 40.6, 68.9, 174.3, 571.7 },
        { 18.1, 18.2, 18.8, 19.4, 21.0, 24.1, 37.1, 64.4, 182.9, 610.5 },
        { 18.8, 19.6, 20.1, 20.7, 23.1, 28.1, 47.1, 92.3, 263.1, 912.2 },
    };
    double worst = 0;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 10; i++) {
            double t = costmodel_collective((costmodel_coll_t)c, &(costmodel_span_t){ 2, 1, 2, 0 },
                                            sizes[i], &lk, NULL) *
                       1e6;
            double e = fabs(t - measured[c][i]) / measured[c][i];
            if (e > worst)
                worst = e;
            if (e > 0.15)
                diag("%s %.0f B: model %.1f us, measured %.1f", costmodel_coll_name(c), sizes[i], t,
                     measured[c][i]);
        }
    ok(worst <= 0.15, "the model is within 15%% of bench/comm at all 30 sizes (worst %.1f%%)",
       100 * worst);
}

/* ---------------------------------------------------------------- spans */

/* Nodes touched (the most over the kind's communicators) and the fewest ranks on
 * one node among communicators that cross nodes (the size when none does), by
 * enumerating every communicator's members (DESIGN §2). */
static costmodel_span_t scan_span(const bmt_layout_t *l, costmodel_comm_t which)
{
    int ncomms = which == COSTMODEL_GROUP     ? l->groups
                 : which == COSTMODEL_REPLICA ? l->gpus_per_group
                                              : 1;
    int size = which == COSTMODEL_GROUP     ? l->gpus_per_group
               : which == COSTMODEL_REPLICA ? l->groups
                                            : l->world;
    int *count = calloc((size_t)l->nodes, sizeof(int));
    costmodel_span_t s = { size, 1, size, 0 };
    for (int c = 0; c < ncomms; c++) {
        memset(count, 0, (size_t)l->nodes * sizeof(int));
        for (int m = 0; m < size; m++) {
            int rank = which == COSTMODEL_GROUP     ? c * l->gpus_per_group + m
                       : which == COSTMODEL_REPLICA ? m * l->gpus_per_group + c
                                                    : m;
            count[rank / l->gpus_per_node]++;
        }
        int used = 0, fewest = size;
        for (int n = 0; n < l->nodes; n++)
            if (count[n] > 0) {
                used++;
                if (count[n] < fewest)
                    fewest = count[n];
            }
        if (used > s.nodes)
            s.nodes = used;
        if (used > 1 && fewest < s.thinnest)
            s.thinnest = fewest;
    }
    free(count);
    return s;
}

static void check_spans(void)
{
    static const struct {
        int groups, gpg, gpn;
        int g_nodes, g_thin, r_nodes, r_thin;
    } cases[] = {
        { 20, 50, 8, 7, 2, 20, 1 }, /* a group of 50 ends with 2 ranks on a node */
        { 20, 48, 8, 6, 8, 20, 1 }, /* aligned: whole nodes */
        { 4, 2, 8, 1, 2, 1, 4 },    /* one node */
        { 8, 2, 4, 1, 2, 4, 2 },    /* replicas: 2 members a node on 4 nodes */
        { 1, 16, 8, 2, 8, 1, 1 },   /* one group on two nodes; replicas of one rank */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bmt_layout_t l = layout(cases[i].groups, cases[i].gpg, cases[i].gpn);
        costmodel_span_t g = costmodel_span(&l, COSTMODEL_GROUP);
        costmodel_span_t r = costmodel_span(&l, COSTMODEL_REPLICA);
        ok(g.ranks == cases[i].gpg && g.nodes == cases[i].g_nodes &&
               g.thinnest == cases[i].g_thin && r.ranks == cases[i].groups &&
               r.nodes == cases[i].r_nodes && r.thinnest == cases[i].r_thin,
           "%dx%d on %d-GPU nodes: groups on %d nodes (%d thinnest), replicas on %d (%d)",
           cases[i].groups, cases[i].gpg, cases[i].gpn, cases[i].g_nodes, cases[i].g_thin,
           cases[i].r_nodes, cases[i].r_thin);
    }
    bool all = true;
    for (int gpn = 1; gpn <= 8 && all; gpn++)
        for (int g = 1; g <= 12; g++)
            for (int s = 1; s <= 12; s++) {
                bmt_layout_t l;
                if (g * s % gpn != 0 || bmt_layout_make(&l, g, s, gpn, 0, NULL) < 0)
                    continue;
                for (int c = COSTMODEL_GROUP; c <= COSTMODEL_WORLD; c++) {
                    costmodel_span_t a = costmodel_span(&l, (costmodel_comm_t)c);
                    costmodel_span_t b = scan_span(&l, (costmodel_comm_t)c);
                    if (a.ranks != b.ranks || a.nodes != b.nodes || a.thinnest != b.thinnest) {
                        diag("%dx%d/%d %s: %d %d %d against the scan's %d %d %d", g, s, gpn,
                             costmodel_comm_name(c), a.ranks, a.nodes, a.thinnest, b.ranks, b.nodes,
                             b.thinnest);
                        all = false;
                    }
                }
            }
    ok(all, "spans match the scan on every layout up to 12 x 12 on 1..8-GPU nodes");
}

/* ---------------------------------------------------------------- the step */

/* A model of two layers of P/2 parameters, as a count (no embedding, no head). */
static costmodel_in_t two_layers(double P, int seq, int batch, bool ckpt, int zero)
{
    costmodel_opts_t o = COSTMODEL_OPTS_INITIALIZER;
    char text[32];
    snprintf(text, sizeof(text), "%.0f", P);
    o.model = text;
    o.layers = 2;
    o.seq = seq;
    o.micro_batch = batch;
    o.ckpt = ckpt;
    o.zero_level = zero;
    costmodel_in_t in;
    if (costmodel_setup(&o, &in, NULL) < 0)
        abort();
    in.model.name = NULL;
    return in;
}

/* Forward seconds of one of its layers: (2 P/2 + 2 C T) FLOPs a token, C =
 * sqrt(P / 24), at 989 TFLOP/s x 0.45. */
static double layer_f(double P, int seq, int batch)
{
    return (P + 2 * sqrt(P / 24) * seq) * seq * batch / (989e12 * 0.45);
}

static void check_step(void)
{
    costmodel_result_t r;
    const costmodel_links_t lk = defaults("d12").links;
    const costmodel_span_t two = { 2, 1, 2, 0 };

    /* Comm-bound, 1 x 2, ZeRO-3: P = 2e9, one token. Forward: gather 0 and 1
     * back to back (2g), compute hides under them. Then the agreement (a), the
     * backward's gathers of 1 and 0 (slots free long since: 4g + a), backward(1)
     * after its gather, backward(0) after its own at 4g + a, each reduce-scatter
     * (r) after its backward: the comm stream ends at 4g + a + 2r, then the
     * gradient norm (host-synchronized). */
    double P = 2e9, f = layer_f(P, 1, 1);
    double g = 30.2e-6 + 2e9 / 485.2e9;  /* all-gather of 1e9 bf16 */
    double rs = 30.2e-6 + 4e9 / 450.2e9; /* reduce-scatter of 1e9 f32 */
    double a = costmodel_collective(COSTMODEL_ALL_REDUCE, &two, 32, &lk, NULL);
    double nrm = costmodel_collective(COSTMODEL_ALL_REDUCE, &two, 8, &lk, NULL);
    is_real(a, 19.5e-6 + 32 / 141e9, "the agreement: 32 B all-reduce, LL ring, 19.5 us");
    costmodel_in_t in = two_layers(P, 1, 1, false, 3);
    bmt_layout_t l = layout(1, 2, 2);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "1x2, two layers of 1e9, one token: evaluates");
    is_real(r.step, 4 * g + a + 2 * rs + nrm, "comm-bound step = 4g + a + 2r + norm");
    is_real(r.compute, 6 * f, "compute = 6 f (forward f, backward 2 f, per layer)");
    is_real(r.comm_busy, 4 * g + a + 2 * rs, "comm stream busy 4g + a + 2r");
    is_real(r.exposed, r.step - 6 * f, "exposed = step - compute");
    ok(r.exposed_replica == 0 && r.replica_busy == 0, "no replica in one group");

    /* The same at ZeRO-2: gathered once, kept; backward(1) waits only for forward. */
    in = two_layers(P, 1, 1, false, 2);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "ZeRO-2 evaluates");
    is_real(r.step, 2 * g + a + 2 * rs + nrm, "ZeRO-2 comm-bound step = 2g + a + 2r + norm");

    /* Compute-bound: P = 2e8, 64 x 4096 tokens. The first gather is exposed, every
     * other one hides; the last reduce-scatter follows the last backward:
     * step = g + 6f + r + norm (8f with checkpointing: each layer recomputed). */
    P = 2e8;
    f = layer_f(P, 4096, 64);
    g = 30.2e-6 + 2e8 / 485.2e9;
    rs = 30.2e-6 + 4e8 / 450.2e9;
    in = two_layers(P, 4096, 64, false, 3);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "1x2, two layers of 1e8, 64 x 4096 tokens");
    is_real(r.step, g + 6 * f + rs + nrm, "compute-bound step = g + 6f + r + norm");
    is_real(r.exposed, g + rs + nrm, "exposed: the first gather, the last reduce, the norm");
    is_real(r.exposed_group, r.exposed, "all of it the group's");
    double tokens = 64.0 * 4096 * 2;
    is_real(r.tokens_per_s, tokens / r.step, "tokens/s for the world = 2 x 64 x 4096 / step");
    in = two_layers(P, 4096, 64, true, 3);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "with checkpointing");
    /* each layer's recomputation repeats its products, not its attention
     * (kept, as the trainers keep it): f less the attention's 2 C T a token */
    const double att = 2 * sqrt(P / 24) * 4096 * 4096 * 64 / (989e12 * 0.45);
    is_real(r.step, g + 8 * f - 2 * att + rs + nrm,
            "checkpointing: step = g + 8f - 2 x attention + r + norm");
    in.keep_attention = false;
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "with checkpointing, --keep-attention 0");
    is_real(r.step, g + 8 * f + rs + nrm, "--keep-attention 0: step = g + 8f + r + norm");

    /* A group of one (2x1): no gathers or reduces; each block's shard (1e8 f32)
     * all-reduced across the two groups on the replica stream after its backward:
     * the second hides under backward(0), the last one is exposed. */
    in = two_layers(P, 4096, 64, false, 3);
    l = layout(2, 1, 2);
    double ar = 33.6e-6 + 4e8 / 297.9e9;
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "2x1 evaluates");
    is_real(r.step, 6 * f + ar, "2x1 step = 6f + ar");
    is_real(r.exposed_replica, ar, "exposed: the last all-reduce, the replica's");
    ok(r.exposed_group == 0 && r.comm_busy == a, "nothing of the group's; comm: the agreement");
    is_real(r.replica_busy, 2 * ar, "replica stream busy 2 ar");

    /* Accumulation: gathers and reduce-scatters per micro-batch, the all-reduce once. */
    in = two_layers(P, 4096, 64, false, 3);
    in.accum = 3;
    l = layout(2, 2, 4);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "2x2 with 3 micro-batches evaluates");
    ok(r.nrows == 6 && r.rows[0].calls == 6 && r.rows[1].calls == 6 && r.rows[2].calls == 6 &&
           r.rows[3].calls == 2 && strcmp(r.rows[3].op, "all-reduce grad shards") == 0 &&
           r.rows[4].calls == 3 && strcmp(r.rows[5].op, "gradient norm") == 0,
       "rows: gathers and reduce-scatters 3 x 2 calls, shard all-reduce 2, agreement 3, norm 1");
    is_real(r.compute, 3 * 6 * f, "compute: 3 micro-batches of 6 f");
    ok(r.step >= r.compute && r.exposed >= 0 && r.exposed_group >= 0 && r.exposed_replica >= 0,
       "step >= compute, exposed parts non-negative");
}

/* ---------------------------------------------------------------- memory */

static void check_memory(void)
{
    costmodel_result_t r;
    const double P = 1557611200, GIB = 1073741824.0;
    /* d48, 8 x 1024 tokens, 1x1, no checkpointing: 12 P of states; the saved
     * activations exceed
     * the gradient shards (4 P), so they count; all logits (8192 x 50257 bf16);
     * two slots of the largest gathered block (the tied head: the embedding
     * (50257 + 1024) x 1600 and ln_f 3200, bf16); no full gradient buffers in a
     * group of one; 0.1875 GiB of workspace. A layer's activations are the
     * GPT-2 trainer's (gpt2_cu_act_bytes): the input (2 C bytes a token), the
     * attention's output and log-sum-exps (2 C + 4 x 25 heads), and the set:
     * LayerNorms' outputs and the residual (3 C), q k v (3 C), the MLP's
     * product and GELU (2 x 4 C), bf16, and four f32 statistics:
     * 2 x 14 C + 16 = 44,816 bytes (350.1 MiB at 8192 tokens, as the
     * trainer's --ckpt-budget divides by). */
    costmodel_in_t in = defaults("d48");
    in.micro_batch = 8;
    in.ckpt = false;
    bmt_layout_t l = layout(1, 1, 0);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "d48 1x1 evaluates");
    const double input = 2 * 1600, attn = 2 * 1600 + 4 * 25, set = 2 * 14 * 1600 + 16;
    double acts = 48.0 * 8192 * (input + attn + set);
    double logits = 8192.0 * 50257 * 2, slots = 2.0 * (82049600 + 3200) * 2;
    is_real(r.mem.states, 12 * P, "states 12 P");
    is_real(r.mem.grads, 4 * P, "gradient shards 4 P");
    is_real(r.mem.activations, acts, "activations, all kept: 48 x 8192 x 51,316 bytes");
    is_real(r.mem.peak, 12 * P + acts + logits + slots + 0.1875 * GIB,
            "peak 12 P + activations + logits + 2 slots + workspace = 37.42 GiB (measured "
            "37.62)");
    ok(r.mem.fits && close_rel(r.mem.usable, 138.4 * GIB, 1e-12), "fits in 140.4 - 2 GiB");

    /* 1x2 with checkpointing: the shards (4 P / 2) outweigh what every layer
     * keeps (its input and its attention: 48 x 8192 x 6500 bytes); one layer's
     * set recomputed, which outweighs a quarter of the logits (the head's
     * backward frees them before the first recomputation); the full gradient
     * buffers of the two largest blocks (embedding and a layer, f32). */
    in.ckpt = true;
    l = layout(1, 2, 2);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "d48 1x2 with checkpointing evaluates");
    double layer = 12.0 * 1600 * 1600 + 13 * 1600;
    double want =
        12 * P / 2 + 4 * P / 2 + 8192.0 * set + slots + (82049600 + layer) * 4 + 0.1875 * GIB;
    is_real(r.mem.activations, 48.0 * 8192 * (input + attn),
            "checkpointed: 48 x 8192 x (the input, the attention's output and log-sum-exps)");
    is_real(r.mem.transient, 8192.0 * set,
            "transient: one layer's set (350.1 MiB), more than a quarter of the logits");
    is_real(r.mem.peak, want, "peak = 12.86 GiB by hand (measured 12.49)");

    /* ZeRO-2 keeps every block gathered: each parameter once in bf16 (the tied
     * head shares the embedding's slot). */
    in.zero_level = 2;
    ok(costmodel_eval(&l, &in, &r, NULL) == 0, "d48 1x2 at ZeRO-2 evaluates");
    is_real(r.mem.gathered, 2 * P, "ZeRO-2: gathered = 2 P bytes");
    is_real(r.mem.peak, want - slots + 2 * P, "ZeRO-2 peak: the slots replaced by the model");

    /* A model that does not fit: 405B on 8 GPUs. */
    in = defaults("llama3-405b");
    l = layout(1, 8, 8);
    ok(costmodel_eval(&l, &in, &r, NULL) == 0 && !r.mem.fits && r.mem.peak > 600 * GIB,
       "llama3-405b on one node of 8 does not fit (%.0f GiB)", r.mem.peak / GIB);
}

/* ---------------------------------------------------------------- presets */

/* GPT-2 parameters summed tensor by tensor (HF names), tied embeddings. */
static double gpt2_tensors(double L, double C, double V, double T)
{
    double wte = V * C, wpe = T * C, lnf = 2 * C;
    double ln1 = 2 * C, attn = C * 3 * C + 3 * C, proj = C * C + C, ln2 = 2 * C;
    double fc = C * 4 * C + 4 * C, fcproj = 4 * C * C + C;
    return wte + wpe + L * (ln1 + attn + proj + ln2 + fc + fcproj) + lnf;
}

static void check_presets(void)
{
    static const struct {
        const char *name, *alias;
        int L;
        double params; /* HF's published counts */
    } want[] = {
        { "d12", "gpt2", 12, 124439808.0 },
        { "d24", "gpt2-medium", 24, 354823168.0 },
        { "d36", "gpt2-large", 36, 774030080.0 },
        { "d48", "gpt2-xl", 48, 1557611200.0 },
        { "llama3.2-1b", NULL, 16, 1235814400.0 },
        { "llama3.2-3b", NULL, 28, 3212749824.0 },
        { "llama3-8b", "llama3.1-8b", 32, 8030261248.0 },
        { "llama3-70b", "llama3.1-70b", 80, 70553706496.0 },
        { "llama3-405b", "llama3.1-405b", 126, 405853388800.0 },
    };
    int n = 0;
    for (const costmodel_model_t *p = costmodel_presets(); p->name; p++)
        n++;
    is_int(n, 9, "nine presets");
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const costmodel_model_t *p = costmodel_preset(want[i].name);
        if (!ok(p != NULL, "preset %s exists", want[i].name))
            continue;
        ok(p->layers == want[i].L && p->params == want[i].params, "%s: %d layers, %.0f parameters",
           want[i].name, want[i].L, want[i].params);
        if (p->arch == COSTMODEL_GPT2)
            ok(gpt2_tensors(p->layers, p->hidden, 50257, 1024) == p->params,
               "%s: the count tensor by tensor", want[i].name);
        if (want[i].alias)
            ok(costmodel_preset(want[i].alias) == p, "%s is %s", want[i].alias, want[i].name);
    }
    ok(costmodel_preset("D48") == costmodel_preset("d48") && costmodel_preset("LLAMA3-70B"),
       "preset names are case-insensitive");
    ok(costmodel_preset("d60") == NULL && costmodel_preset("") == NULL &&
           costmodel_preset(NULL) == NULL,
       "unknown presets are NULL");
    costmodel_model_t m;
    ok(costmodel_model_from_count(70e9, 0, &m, NULL) == 0 && m.layers == 71 &&
           close_rel(m.hidden, sqrt(70e9 / (12 * 71)), 1e-12) && m.params == 70e9 &&
           m.arch == COSTMODEL_GENERIC,
       "70B as a count: round(cbrt(70e9 / (12 x 128^2))) = 71 layers, C = sqrt(P / 12 L)");
    ok(costmodel_model_from_count(70e9, 80, &m, NULL) == 0 && m.layers == 80 &&
           costmodel_layer_params(&m) == 70e9 / 80,
       "--layers 80: 80 layers of P / 80");
    bmt_error_t err = { { 0 } };
    ok(costmodel_model_from_count(70e9, 5000, &m, &err) == -1 && strstr(err.text, "--layers"),
       "--layers 5000 refused");
}

/* ---------------------------------------------------------------- set-up */

static void check_setup(void)
{
    costmodel_in_t in = defaults("d48");
    ok(in.seq == 1024 && in.micro_batch == 1 && in.accum == 1 && in.ckpt && in.zero_level == 3 &&
           in.gather_bytes == 2 && in.reduce_bytes == 4 && in.shard_bytes == 4 && in.mfu == 0.45 &&
           in.peak_tflops == 989 && in.gpu_mem_gib == 140.4,
       "defaults: the model's context, micro-batch 1, checkpointing, ZeRO-3, f32 reduce, "
       "MFU 0.45, H200");
    ok(in.links.nvlink_gbps[0] == 242.6 && in.links.nvlink_gbps[1] == 225.1 &&
           in.links.nvlink_gbps[2] == 297.9 && in.links.nic_gbps == 46 &&
           in.links.call_us[0] == 11.7 && in.links.call_us[1] == 11.7 &&
           in.links.call_us[2] == 18.4 && in.links.step_us < 0,
       "links: the fitted NVLink busbw and call costs, a 46 GB/s NIC, NCCL's step latencies");
    costmodel_opts_t o = COSTMODEL_OPTS_INITIALIZER;
    o.model = "70B";
    o.gpu = "a100";
    o.seq = 2048;
    o.micro_batch = 2;
    o.accum = 4;
    o.ckpt = 0;
    o.mfu = 0.3;
    o.gpu_mem_gib = 40;
    o.nic_gbps = 23;
    o.latency_us = 2;
    o.call_us = 0;
    o.grad_bytes = 2;
    o.zero_level = 2;
    bmt_error_t err = { { 0 } };
    ok(costmodel_setup(&o, &in, &err) == 0 && in.seq == 2048 && in.micro_batch == 2 &&
           in.accum == 4 && !in.ckpt && in.mfu == 0.3 && in.peak_tflops == 312 &&
           in.gpu_mem_gib == 40 && close_rel(in.links.nvlink_gbps[0], 242.6 * 2 / 3, 1e-12) &&
           in.links.nic_gbps == 23 && in.links.step_us == 2 && in.links.call_us[2] == 0 &&
           in.reduce_bytes == 2 && in.zero_level == 2,
       "given values replace the defaults; a100 scales NVLink by 600/900");
    o = (costmodel_opts_t)COSTMODEL_OPTS_INITIALIZER;
    o.model = "d48";
    o.layers = 10;
    in.seq = -7;
    ok(costmodel_setup(&o, &in, &err) == -1 &&
           strstr(err.text, "--layers goes with a parameter "
                            "count; d48 is a preset of 48") &&
           in.seq == -7,
       "--layers with a preset refused, nothing changed");
    o.layers = 0;
    o.gpu = "v100";
    ok(costmodel_setup(&o, &in, &err) == -1 && strstr(err.text, "--gpu must be h200, h100"),
       "an unknown GPU kind refused");
    o.gpu = NULL;
    /* --gpu-mem must leave something over the 2 GiB held back */
    o.gpu_mem_gib = 2;
    in.seq = -7;
    ok(costmodel_setup(&o, &in, &err) == -1 &&
           strstr(err.text, "--gpu-mem 2 leaves nothing usable: 2 GiB") && in.seq == -7,
       "--gpu-mem 2 refused: nothing usable");
    o.gpu_mem_gib = 1;
    ok(costmodel_setup(&o, &in, &err) == -1 && strstr(err.text, "--gpu-mem 1 leaves nothing"),
       "--gpu-mem 1 refused");
    o.gpu_mem_gib = 2.5;
    ok(costmodel_setup(&o, &in, &err) == 0 && in.gpu_mem_gib == 2.5, "--gpu-mem 2.5 taken");
    o.gpu_mem_gib = 0;
    /* --keep-attention is about checkpointing's recomputation, as --ckpt-budget */
    for (int keep = 0; keep <= 1; keep++) {
        o.ckpt = 0;
        o.keep_attention = keep;
        ok(costmodel_setup(&o, &in, &err) == -1 &&
               strstr(err.text, "--keep-attention chooses what checkpointing's recomputation "
                                "skips: it needs --ckpt 1"),
           "--keep-attention %d with --ckpt 0 refused", keep);
        o.ckpt = 1;
        ok(costmodel_setup(&o, &in, &err) == 0 && in.keep_attention == (keep == 1),
           "--keep-attention %d with --ckpt 1 taken", keep);
    }
    o.ckpt = -1;
    o.keep_attention = -1;
    ok(costmodel_setup(&o, &in, &err) == 0 && in.ckpt && in.keep_attention,
       "neither given: checkpointing keeps the attention");
    /* GPT-2's positions: a longer sequence is a longer table (the trainer's --max-seq) */
    o.model = "d12";
    o.seq = 4096;
    ok(costmodel_setup(&o, &in, &err) == 0 && in.model.context == 4096 &&
           in.model.params == 124439808.0 + 3072.0 * 768,
       "d12 at T 4096: 4096 positions counted (%.0f parameters)", in.model.params);
    o.seq = 512;
    ok(costmodel_setup(&o, &in, &err) == 0 && in.model.context == 1024 &&
           in.model.params == 124439808.0,
       "d12 at T 512: the preset's 1024 positions");
    o.seq = 65537;
    ok(costmodel_setup(&o, &in, &err) == -1 &&
           strstr(err.text, "--seq-len 65537: d12 learns its positions, and the trainer's "
                            "--max-seq makes at most 65536"),
       "d12 at T 65537 refused: %s", err.text);
    o.model = "llama3.2-1b";
    o.seq = 131072;
    ok(costmodel_setup(&o, &in, &err) == 0 &&
           in.model.params == costmodel_preset("llama3.2-1b")->params,
       "Llama (rotary positions): a long sequence adds no parameters");
    o.seq = 0;
    o.model = NULL;
    ok(costmodel_setup(&o, &in, &err) == -1 && strstr(err.text, "needs --model"),
       "no model refused");
    costmodel_result_t r;
    in = defaults("d12");
    in.mfu = 1.5;
    bmt_layout_t l = layout(1, 2, 2);
    ok(costmodel_eval(&l, &in, &r, &err) == -1 && strstr(err.text, "MFU"),
       "eval refuses an MFU over 1");
    in = defaults("d12");
    l.world = 3;
    ok(costmodel_eval(&l, &in, &r, &err) == -1 && strstr(err.text, "inconsistent layout"),
       "eval refuses an inconsistent layout");
}

/* ---------------------------------------------------------------- ranking */

static void check_rank(void)
{
    costmodel_in_t in = defaults("70B");
    bmt_layout_t l = layout(20, 50, 8);
    costmodel_candidate_t c[COSTMODEL_CANDIDATES];
    bmt_error_t err = { { 0 } };
    int n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, &err);
    ok(n >= 10, "70B on 20x50/8: %d layouts ranked", n);
    int yours = -1, flat = -1;
    bool order = true, shapes = true;
    for (int i = 0; i < n; i++) {
        if (c[i].yours)
            yours = yours < 0 ? i : -2;
        if (c[i].r.layout.groups == 1 && c[i].r.layout.world == 1000)
            flat = i;
        shapes &=
            c[i].r.layout.gpus_per_node == 8 &&
            c[i].r.layout.groups * c[i].r.layout.gpus_per_group == c[i].r.layout.world &&
            (c[i].r.layout.world == 1000 || strcmp(c[i].why, "rail-aligned alternative") == 0);
        if (i > 0) {
            const costmodel_result_t *a = &c[i - 1].r, *b = &c[i].r;
            if (a->mem.fits < b->mem.fits || (a->mem.fits && b->mem.fits && a->step > b->step) ||
                (!a->mem.fits && !b->mem.fits && a->mem.peak > b->mem.peak))
                order = false;
        }
    }
    ok(yours >= 0 && c[yours].r.layout.groups == 20 && strcmp(c[yours].why, "yours") == 0,
       "the user's layout is there once, marked");
    ok(flat >= 0 && strcmp(c[flat].why, "flat") == 0, "flat ZeRO-3 over 1000 ranks is there");
    ok(order, "those that fit first, by step time; then the rest by peak memory");
    ok(shapes, "every layout keeps 8 GPUs a node; the world, unless a rail-aligned alternative");
    ok(yours > 0 && c[0].r.mem.fits && c[0].r.exposed_group < c[yours].r.exposed_group,
       "20x50 is not the best: its groups cross nodes with 2 ranks on one (NIC-bound)");
    bool aligned = false;
    for (int i = 0; i < n; i++)
        aligned |= c[i].r.layout.groups == 20 && c[i].r.layout.gpus_per_group == 48 &&
                   c[i].r.step < c[yours].r.step;
    ok(aligned, "the rail-aligned 20x48 is faster than 20x50");

    /* Room for three: the best, and the user's and flat whatever their places. */
    costmodel_candidate_t few[3];
    n = costmodel_rank(&l, &in, few, 3, &err);
    bool has_yours = false, has_flat = false;
    for (int i = 0; i < n; i++) {
        has_yours |= few[i].yours;
        has_flat |= few[i].r.layout.groups == 1;
    }
    ok(n == 3 && has_yours && has_flat && few[0].r.step == c[0].r.step,
       "with room for 3: the best, the user's and flat");
    ok(costmodel_rank(&l, &in, few, 1, &err) == -1 && strstr(err.text, "at least 2"),
       "room for one layout refused");

    /* A figure that is not finite is an error, never a printed inf or nan (nor a
     * JSON that cannot be encoded): eval takes any positive busbw, the options'
     * parsers keep it above 0.001 GB/s. */
    costmodel_in_t tiny = in;
    tiny.links.nic_gbps = 1e-320;
    ok(costmodel_rank(&l, &tiny, c, COSTMODEL_CANDIDATES, &err) == -1 &&
           strstr(err.text, "gives a figure that is not finite"),
       "a NIC of 1e-320 GB/s: refused, not ranked (%s)", err.text);

    /* One rank: one layout, yours and flat at once. */
    l = layout(1, 1, 0);
    n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, &err);
    ok(n == 1 && c[0].yours && c[0].r.nrows == 0, "a world of one: one layout, no collectives");
}

/* ---------------------------------------------------------------- JSON and text */

static bool num_is(json_t *obj, const char *key, double want)
{
    json_t *v = json_object_get(obj, key);
    return v && json_is_number(v) && json_number_value(v) == want;
}

static void check_json(void)
{
    costmodel_in_t in = defaults("llama3-70b");
    bmt_layout_t l = layout(20, 50, 8);
    costmodel_candidate_t c[COSTMODEL_CANDIDATES];
    int n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
    json_t *j = costmodel_json(&in, c, (size_t)n);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    json_error_t jerr;
    j = text ? json_loads(text, 0, &jerr) : NULL;
    free(text);
    if (!ok(j != NULL, "JSON dumps and loads back"))
        return;
    json_t *m = json_object_get(j, "model"), *t = json_object_get(j, "train");
    ok(strcmp(json_string_value(json_object_get(m, "name")), "llama3-70b") == 0 &&
           strcmp(json_string_value(json_object_get(m, "arch")), "llama") == 0 &&
           num_is(m, "params", 70553706496.0) && num_is(m, "layers", 80) &&
           num_is(m, "kv_dim", 1024) && num_is(m, "heads", 64) &&
           json_is_false(json_object_get(m, "tied")),
       "JSON model: name, arch, params, layers, kv_dim, heads, tied");
    ok(num_is(t, "seq", 4096) && num_is(t, "micro_batch", 1) && num_is(t, "accum", 1) &&
           json_is_true(json_object_get(t, "ckpt")) && num_is(t, "zero_level", 3) &&
           num_is(t, "reduce_bytes", 4),
       "JSON train: seq, micro_batch, accum, ckpt, zero_level, bytes");
    json_t *lk = json_object_get(j, "links");
    ok(num_is(json_object_get(lk, "nvlink_busbw_gbps"), "all_gather", 242.6) &&
           num_is(lk, "nic_busbw_gbps", 46) &&
           num_is(json_object_get(lk, "call_us"), "Simple", 18.4) &&
           json_is_null(json_object_get(lk, "step_us")) &&
           num_is(json_object_get(j, "gpu"), "peak_tflops", 989),
       "JSON links and GPU");
    json_t *ls = json_object_get(j, "layouts");
    bool same = json_array_size(ls) == (size_t)n;
    for (int i = 0; same && i < n; i++) {
        json_t *o = json_array_get(ls, (size_t)i);
        const costmodel_result_t *r = &c[i].r;
        json_t *rows = json_object_get(o, "collectives"), *mem = json_object_get(o, "memory_bytes");
        same = num_is(o, "rank", i + 1) && num_is(o, "groups", r->layout.groups) &&
               num_is(o, "gpus_per_group", r->layout.gpus_per_group) &&
               num_is(o, "step_s", r->step) && num_is(o, "compute_s", r->compute) &&
               num_is(o, "exposed_s", r->exposed) &&
               num_is(o, "exposed_group_s", r->exposed_group) &&
               num_is(o, "exposed_replica_s", r->exposed_replica) &&
               num_is(o, "tokens_per_s", r->tokens_per_s) && num_is(o, "mfu", r->mfu) &&
               num_is(mem, "peak", r->mem.peak) && json_is_boolean(json_object_get(mem, "fits")) &&
               json_is_true(json_object_get(mem, "fits")) == r->mem.fits &&
               json_is_true(json_object_get(o, "yours")) == c[i].yours &&
               json_array_size(rows) == (size_t)r->nrows;
        for (int k = 0; same && k < r->nrows; k++) {
            json_t *w = json_array_get(rows, (size_t)k);
            same = strcmp(json_string_value(json_object_get(w, "op")), r->rows[k].op) == 0 &&
                   num_is(w, "calls", r->rows[k].calls) &&
                   num_is(w, "seconds", r->rows[k].seconds) &&
                   num_is(w, "bytes", r->rows[k].bytes) &&
                   strcmp(json_string_value(json_object_get(w, "algorithm")),
                          costmodel_algo_name(r->rows[k].big.algo)) == 0;
        }
        if (!same)
            diag("layout %d differs", i + 1);
    }
    ok(same, "JSON layouts = the structs, in rank order, with their collectives");
    json_t *rec = json_object_get(j, "recommended");
    int b = costmodel_recommended(c, (size_t)n);
    ok(b >= 0 && c[b].r.layout.world == 1000 && num_is(rec, "groups", c[b].r.layout.groups) &&
           num_is(rec, "gpus_per_group", c[b].r.layout.gpus_per_group) &&
           json_is_false(json_object_get(rec, "keep_yours")) &&
           json_array_size(json_object_get(rec, "deciding")) >= 1 &&
           strcmp(json_string_value(
                      json_object_get(json_array_get(json_object_get(rec, "deciding"), 0), "term")),
                  "exposed group communication") == 0,
       "JSON recommendation: the best, decided first by exposed group communication");
    json_decref(j);

    /* plan_print (--plan) says why it fails: a figure JSON cannot hold (no inf
     * or nan), a write error. */
    bmt_error_t err = { { 0 } };
    FILE *null = fopen("/dev/null", "w"), *full = fopen("/dev/full", "w");
    ok(null && plan_print(null, &l, true, &in, c, (size_t)n, &err) == 0, "plan_print: JSON");
    costmodel_candidate_t bad[COSTMODEL_CANDIDATES];
    memcpy(bad, c, sizeof(bad));
    bad[0].r.step = INFINITY;
    ok(null && plan_print(null, &l, true, &in, bad, (size_t)n, &err) == -1 &&
           strstr(err.text, "cannot encode the plan as JSON"),
       "an infinite step: the JSON is refused with a message (%s)", err.text);
    ok(full && plan_print(full, &l, false, &in, c, (size_t)n, &err) == -1 &&
           strstr(err.text, "cannot write the plan: No space left on device"),
       "/dev/full: the write error is said (%s)", err.text);
    if (null)
        fclose(null);
    if (full)
        fclose(full);
}

static char *print(const costmodel_in_t *in, const costmodel_candidate_t *c, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = costmodel_print_text(f, in, c, (size_t)n);
    fclose(f);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void check_text(void)
{
    costmodel_in_t in = defaults("llama3-70b");
    bmt_layout_t l = layout(20, 50, 8);
    costmodel_candidate_t c[COSTMODEL_CANDIDATES];
    int n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
    char *buf = print(&in, c, n);
    static const char *want[] = {
        "cost model: llama3-70b = 70,553,706,496 parameters: 80 layers, hidden 8192, FFN 28672, "
        "KV width 1024, vocabulary 128256\n",
        "per GPU: micro-batch 1 x 4096 tokens, 1 micro-batch a step; checkpointing on; ZeRO-3;",
        "bf16 gathers, f32 gradients, f32 shards across groups",
        "NVLink busbw 242.6 / 225.1 / 297.9 GB/s",
        "this layout, 20 x 50: collectives per step and GPU",
        "gather params (forward)    group       50     7    2    ",
        "all-reduce grad shards     replica     20    20    1     ",
        "layouts ranked by step time, those that fit first",
        "  * ",
        "  recommendation: --groups ",
        "    exposed group communication ",
        "group of 50 on 7 nodes, 2 on its thinnest, ring/Simple at 92.0 GB/s",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ok(buf && strstr(buf, want[i]), "text has '%.*s'", (int)strcspn(want[i], "\n"), want[i]);
    for (char *line = buf; tap_failed && line && *line;) {
        size_t k = strcspn(line, "\n");
        diag("%.*s", (int)k, line);
        line += k + (line[k] != '\0');
    }
    free(buf);

    /* Ranking again from the best layout: it is the user's now, and said to be the
     * fastest, with the next one's terms. */
    int rec = costmodel_recommended(c, (size_t)n);
    ok(rec >= 0 && c[rec].r.layout.world == 1000, "the recommendation keeps the 1000 GPUs");
    l = c[rec].r.layout;
    n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
    buf = print(&in, c, n);
    char want_best[96];
    snprintf(want_best, sizeof(want_best),
             "recommendation: yours, %d x %d, is the fastest that fits", l.groups,
             l.gpus_per_group);
    ok(buf && c[costmodel_recommended(c, (size_t)n)].yours && strstr(buf, want_best) &&
           strstr(buf, "slower; what decides:"),
       "text: ranked from the best, yours is the fastest");
    free(buf);

    /* Within 1%: keep yours. d12 on one node of 8: every layout within 0.2%. */
    in = defaults("d12");
    in.micro_batch = 16;
    l = layout(1, 8, 8);
    n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
    buf = print(&in, c, n);
    ok(buf && !c[0].yours && strstr(buf, "recommendation: keep yours, 1 x 8: the fastest, ") &&
           strstr(buf, "less than the 1% this model can tell apart"),
       "text: a best within 1%% of yours is not worth a change");
    free(buf);

    /* Nothing fits: 405B on 8 GPUs. */
    in = defaults("llama3-405b");
    l = layout(1, 8, 8);
    n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
    buf = print(&in, c, n);
    ok(buf && strstr(buf, "recommendation: no layout of 8 GPUs fits in 138.4 GiB") &&
           strstr(buf, "DOES NOT FIT"),
       "text: nothing fits, said so");
    free(buf);
    /* ...and what to try names only the levers not yet pulled */
    const struct {
        int ckpt, micro;
        double budget;
        const char *want;
    } tries[] = {
        { 0, 2, -1,
          "\n    more GPUs per group, checkpointing (--ckpt 1) or a smaller micro-batch\n" },
        { 1, 2, -1, "\n    more GPUs per group or a smaller micro-batch\n" },
        { 1, 1, -1, "\n    more GPUs per group\n" },
        { 1, 1, 1e9, "\n    more GPUs per group or a smaller --ckpt-budget\n" },
        { 0, 1, -1, "\n    more GPUs per group or checkpointing (--ckpt 1)\n" },
    };
    for (size_t k = 0; k < sizeof(tries) / sizeof(tries[0]); k++) {
        in = defaults("llama3-405b");
        in.ckpt = tries[k].ckpt;
        in.micro_batch = tries[k].micro;
        in.ckpt_budget = tries[k].budget;
        l = layout(1, 8, 8);
        n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
        buf = print(&in, c, n);
        ok(buf && strstr(buf, tries[k].want),
           "text: nothing fits at ckpt %d, micro-batch %d, budget %.0f: the advice is '%.*s'",
           tries[k].ckpt, tries[k].micro, tries[k].budget, (int)strlen(tries[k].want) - 6,
           tries[k].want + 5);
        if (buf && !strstr(buf, tries[k].want))
            printf("# %s", strstr(buf, "recommendation:") ? strstr(buf, "recommendation:") : buf);
        free(buf);
    }

    /* A count says its shape is assumed. */
    in = defaults("70B");
    l = layout(2, 4, 4);
    n = costmodel_rank(&l, &in, c, COSTMODEL_CANDIDATES, NULL);
    buf = print(&in, c, n);
    ok(buf && strstr(buf, "cost model: 70,000,000,000 parameters: 71 layers") &&
           strstr(buf, "(a count: shape assumed, --layers to set)"),
       "text: a count's shape is called assumed");
    free(buf);
}
/* ---------------------------------------------------------------- parsers */

static void check_parse_params(void)
{
    static const struct {
        const char *text;
        double value; /* 0: refused with want */
        const char *want;
    } cases[] = {
        { "d48", 1557611200.0, NULL },
        { "D12", 124439808.0, NULL },
        { "gpt2-medium", 354823168.0, NULL },
        { "1558000000", 1558000000.0, NULL },
        { "1.5e9", 1.5e9, NULL },
        { "1.5E+9", 1.5e9, NULL },
        { "70B", 70e9, NULL },
        { "70b", 70e9, NULL },
        { "7b", 7e9, NULL },
        { "1.5G", 1.5e9, NULL },
        { "350M", 350e6, NULL },
        { "350m", 350e6, NULL },
        { "125k", 125e3, NULL },
        { "1T", 1e12, NULL },
        { "1000T", 1e15, NULL },
        { "1", 1, NULL },
        { ".5k", 500, NULL },
        { "1.4", 1, NULL },
        { "2.5", 3, NULL },
        { "", 0, "--model needs a parameter count (1.5e9, 350M, 70B) or a preset" },
        { "-5", 0, "--model needs a positive parameter count, got '-5'" },
        { "-70B", 0, "--model needs a positive parameter count, got '-70B'" },
        { "0", 0, "--model needs at least 1 parameter, got '0'" },
        { "0B", 0, "--model needs at least 1 parameter, got '0B'" },
        { "0.4", 0, "--model needs at least 1 parameter, got '0.4'" },
        { "1e-999", 0, "--model needs at least 1 parameter" },
        { "1001T", 0, "--model: '1001T' is too many parameters (at most 1e15)" },
        { "2e15", 0, "too many parameters" },
        { "1e999", 0, "too many parameters" },
        { "nan", 0, "--model: 'nan' is neither a parameter count" },
        { "NaN", 0, "is neither a parameter count" },
        { "inf", 0, "is neither a parameter count" },
        { "70BB", 0, "--model: '70BB' is neither a parameter count" },
        { "70B ", 0, "is neither a parameter count" },
        { " 70B", 0, "is neither a parameter count" },
        { "+7", 0, "is neither a parameter count" },
        { "0x10", 0, "is neither a parameter count" },
        { "7x", 0, "is neither a parameter count" },
        { "1e", 0, "is neither a parameter count" },
        { "1e9M", 1e15, NULL }, /* exponent and suffix together: 1e9 x 1e6 */
        { "1.2.3", 0, "is neither a parameter count" },
        { "B", 0, "is neither a parameter count" },
        { ".", 0, "is neither a parameter count" },
        { "d48x", 0, "is neither a parameter count" },
        { "gpt3", 0, "nor a preset (d12, d24, d36, d48, llama3.2-1b" },
        { "llama3-70b", 70553706496.0, NULL },
        { "1000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
          0, "too long a number" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double v = -7;
        bmt_error_t err = { { 0 } };
        int rc = costmodel_parse_params(cases[i].text, "--model", &v, &err);
        if (cases[i].want == NULL) {
            ok(rc == 0 && v == cases[i].value, "--model '%s' = %.17g", cases[i].text,
               cases[i].value);
            if (rc != 0 || v != cases[i].value)
                diag("rc %d, value %.17g, '%s'", rc, v, err.text);
        } else {
            ok(rc == -1 && v == -7 && strstr(err.text, cases[i].want),
               "--model '%.20s' refused: '%s'", cases[i].text, cases[i].want);
            if (rc != -1 || !strstr(err.text, cases[i].want))
                diag("rc %d, value %.17g, '%s'", rc, v, err.text);
        }
    }
    double v = 0;
    bmt_error_t err;
    ok(costmodel_parse_params(NULL, "--model", &v, &err) == -1 && strstr(err.text, "got nothing"),
       "--model NULL refused");
}

static void check_parse_other(void)
{
    static const struct {
        int kind; /* 0 gbps, 1 us, 2 zero, 3 dtype, 4 speedup */
        const char *text;
        double value;
        const char *want; /* NULL: accepted */
    } cases[] = {
        { 0, "230", 230, NULL },
        { 0, "45.5", 45.5, NULL },
        { 0, "1e3", 1000, NULL },
        { 0, "0.001", 0.001, NULL },
        { 0, "100000", 1e5, NULL },
        { 0, "0", 0, "--x needs a positive number of GB/s, got '0'" },
        { 0, "", 0, "--x needs a positive number of GB/s, got ''" },
        { 0, "-5", 0, "--x needs a positive number of GB/s, got '-5'" },
        { 0, "45GB", 0, "needs a positive number of GB/s" },
        { 0, "nan", 0, "needs a positive number of GB/s" },
        { 0, "inf", 0, "needs a positive number of GB/s" },
        { 0, "1e6", 0, "--x: '1e6' is too large (at most 100000 GB/s)" },
        { 1, "0", 0, NULL },
        { 1, "5", 5, NULL },
        { 1, "2.5", 2.5, NULL },
        { 1, "1000000", 1e6, NULL },
        { 1, "-1", 0, "--x needs a non-negative number of microseconds, got '-1'" },
        { 1, "1e7", 0, "too large (at most 1e+06 microseconds)" },
        { 1, "5us", 0, "needs a non-negative number of microseconds" },
        { 2, "2", 2, NULL },
        { 2, "3", 3, NULL },
        { 2, "1", 0, "--x must be 2 or 3, got '1'" },
        { 2, "03", 0, "must be 2 or 3, got '03'" },
        { 2, "", 0, "must be 2 or 3, got ''" },
        { 3, "bf16", 2, NULL },
        { 3, "BF16", 2, NULL },
        { 3, "fp16", 2, NULL },
        { 3, "f32", 4, NULL },
        { 3, "fp32", 4, NULL },
        { 3, "f64", 0, "--x must be bf16, fp16 or f32, got 'f64'" },
        { 3, "", 0, "must be bf16, fp16 or f32, got ''" },
        { 4, "1.3", 1.3, NULL },
        { 4, "4", 4, NULL },
        { 4, "0.5", 0.5, NULL },
        { 4, "0.1", 0.1, NULL },
        { 4, "0", 0, "--x needs a speed-up factor in [0.1, 4] such as 1.3, got '0'" },
        { 4, "4.01", 0, "needs a speed-up factor in [0.1, 4]" },
        { 4, "-1", 0, "needs a speed-up factor in [0.1, 4]" },
        { 4, "1.3x", 0, "needs a speed-up factor in [0.1, 4]" },
        { 4, "nan", 0, "needs a speed-up factor in [0.1, 4]" },
        { 4, "", 0, "needs a speed-up factor in [0.1, 4] such as 1.3, got ''" },
        /* expected failures: positive but so small a time divided by it is infinite */
        { 0, "1e-320", 0, "--x: '1e-320' is too small (at least 0.001 GB/s)" },
        { 0, "0.0009", 0, "--x: '0.0009' is too small (at least 0.001 GB/s)" },
        { 4, "1e-320", 0, "needs a speed-up factor in [0.1, 4] such as 1.3, got '1e-320'" },
        { 4, "0.09", 0, "needs a speed-up factor in [0.1, 4]" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double d = -7;
        int n = -7;
        bmt_error_t err = { { 0 } };
        int rc;
        switch (cases[i].kind) {
        case 0: rc = costmodel_parse_gbps(cases[i].text, "--x", &d, &err); break;
        case 1: rc = costmodel_parse_us(cases[i].text, "--x", &d, &err); break;
        case 2: rc = costmodel_parse_zero(cases[i].text, "--x", &n, &err); break;
        case 3: rc = costmodel_parse_dtype(cases[i].text, "--x", &n, &err); break;
        default: rc = costmodel_parse_speedup(cases[i].text, "--x", &d, &err); break;
        }
        double got = cases[i].kind < 2 || cases[i].kind == 4 ? d : n;
        static const char *kinds[] = { "GB/s", "us", "zero", "dtype", "speed-up" };
        if (cases[i].want == NULL)
            ok(rc == 0 && got == cases[i].value, "%s '%s' = %g", kinds[cases[i].kind],
               cases[i].text, cases[i].value);
        else
            ok(rc == -1 && got == -7 && strstr(err.text, cases[i].want), "%s '%s' refused: '%s'",
               kinds[cases[i].kind], cases[i].text, cases[i].want);
        if ((rc == 0) != (cases[i].want == NULL) ||
            (cases[i].want && !strstr(err.text, cases[i].want)))
            diag("rc %d, '%s'", rc, err.text);
    }
    {
        static const struct {
            const char *text;
            double want; /* 0: refused */
        } mfu[] = { { "0.45", 0.45 }, { "1", 1 }, { "0.01", 0.01 }, { "1e-320", 0 },
                    { "0.009", 0 },   { "0", 0 }, { "1.01", 0 },    { "45", 0 } };
        for (size_t i = 0; i < sizeof(mfu) / sizeof(mfu[0]); i++) {
            double v = -7;
            bmt_error_t err = { { 0 } };
            int rc = costmodel_parse_fraction(mfu[i].text, "--mfu", &v, &err);
            if (mfu[i].want > 0)
                ok(rc == 0 && v == mfu[i].want, "--mfu '%s' taken", mfu[i].text);
            else
                ok(rc == -1 && v == -7 &&
                       strstr(err.text, "--mfu needs a fraction of the peak in [0.01, 1]"),
                   "--mfu '%s' refused: %s", mfu[i].text, err.text);
        }
    }
    double d = -7;
    int n = -7;
    ok(costmodel_parse_gbps(NULL, "--x", &d, NULL) == -1 &&
           costmodel_parse_us(NULL, "--x", &d, NULL) == -1 &&
           costmodel_parse_zero(NULL, "--x", &n, NULL) == -1 &&
           costmodel_parse_dtype(NULL, "--x", &n, NULL) == -1 &&
           costmodel_parse_speedup(NULL, "--x", &d, NULL) == -1 && d == -7 && n == -7,
       "NULL text refused by every parser");
}

int main(void)
{
    check_collectives();
    check_spans();
    check_step();
    check_memory();
    check_presets();
    check_setup();
    check_rank();
    check_json();
    check_text();
    check_parse_params();
    check_parse_other();
    return done_testing();
}
