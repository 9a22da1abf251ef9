/* examples/llama/model_cuda.c — the Llama family's callbacks on CUDA (see model_cuda.h).
 *
 * Layer: an example, above libbmt and nn/ (the kernels of nn/ops_cuda.h and
 * nn/llama_ops_cuda.h).
 *
 * The same dataflow as model.c's CPU layers, with bf16 activations, f32
 * RMSNorm statistics (rstd), log-sum-exps and losses, and f32 parameter
 * gradients added into the list's buffers (written where they are fresh:
 * bmt_block_call_t.grads_fresh). Per layer, N = B T rows:
 *   ln1 = rms(x)                     rstd1 (N) f32
 *   qkv = ln1 [Wq; Wk; Wv]^T         (N, (NH + 2 NKV) hd): ONE product
 *   rope(qkv) in place               q and k heads, positions 0..T-1
 *   att = flash(qkv)                 (N, NH hd); lse (B, NH, T) f32
 *   res2 = x + att Wo^T
 *   ln2 = rms(res2)                  rstd2 (N) f32
 *   gu = ln2 [Wg; Wu]^T              (N, 2F): ONE product, gate | up per row
 *   h = silu(gate) up                (N, F)
 *   x' = res2 + h Wd^T
 * The stacked products use the block's layout (bmt/block.h): parameters lie in
 * one buffer in the order added, so q_proj, k_proj, v_proj are one
 * ((NH + 2 NKV) hd, C) matrix when each size is a multiple of BMT_BLOCK_ALIGN
 * (checked at create from the sizes, and at every call from the pointers: a
 * layout that differs is an error, not a wrong product). Their f32 gradients
 * lie the same way, so one dweight product fills all three.
 *
 * Activations are stream-ordered (bmt_alloc_async on the compute stream): each
 * buffer exists from its first writer to its last reader in a micro-batch.
 * The residual stream x_0..x_L and the final norm's output xf (the blocks'
 * inputs) are kept from the forward to the backward; a layer's internals live
 * in one scratch set under activation checkpointing, else one set per layer.
 * The backward gives back each buffer as it passes its last reader: the
 * down_proj weight's gradient is taken before its input gradient so that h is
 * gone before dh exists, and the residual stream's gradient dres is
 * accumulated in place through both norms' backwards (no second (N,C)
 * buffer), so at a layer's backward the activations are x_0..x_l, one
 * layer's set and a few gradients of it.
 *
 * A recomputation (checkpointing) stops once the activations that the
 * backward reads exist: x_{l+1} is kept, so down_proj and the last residual
 * are not taken again, and o_proj's output is written straight into res2 (the
 * residual is added in place), so no buffer beyond the set is needed. The
 * forward of the embedding, the final norm and the head are not recomputed
 * (their outputs are kept), and neither is the last layer when the scratch
 * set still holds its activations. Selective checkpointing
 * (llama_cu_keep_layers): layers keep_from.. keep a set of their own, as
 * without checkpointing, and the engine does not recompute them; the others
 * share the scratch set.
 *
 * FP8 (llama_cu_fp8, docs/fp8.md#llama): the four products (q|k|v, o,
 * gate|up, down) take FP8 operands through nn_cuda_fp8_linear_*, with GPT-2's
 * bookkeeping of scales and records. Each product's input is kept as its
 * transposed codes (ln1_q, att_q, ln2_q, h_q: what the weight gradient
 * reads), so ln1, ln2 and h are given back as soon as their product has
 * converted them, and the weights' codes (wq) go from the forward to the
 * backward; a recomputation that stops before down_proj makes h's codes and
 * gives h back, and down_proj's weight is converted again in the backward.
 * The o and down products write their output, then the residual is added in
 * place (bf16: in cuBLASLt's epilogue). down_proj's backward takes dh and the
 * weight gradient in one call (the gradient converted once), h being gone.
 *
 * The head overwrites its logits with their gradient (fused cross-entropy,
 * rows Vp = V rounded up to 64 apart). Without checkpointing the forward does
 * that for all N rows and the backward reads them from there. Under
 * checkpointing the (N, V) logits are not kept: the forward runs the head in
 * chunks of head_rows rows for the loss alone, and the backward recomputes
 * each chunk's logits and gradient and takes its products at once, so only one
 * chunk's logits ever exist (1/4 or less of them; Llama 3's V is 128256).
 */
#include "llama/model_cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/device.h"

#ifdef BMT_HAVE_CUDA
#include <cuda_runtime.h>

#include "nn/fp8_cuda.h"
#include "nn/hfjson.h" /* nn_fail */
#include "nn/llama_ops_cuda.h"
#include "nn/ops_cuda.h"

/* A layer's saved activations. */
typedef struct cu_layer {
    void *ln1;   /* (N,C) bf16: input_layernorm's output */
    void *rstd1; /* (N) f32 */
    void *qkv;   /* (N, QKV) bf16: q, k after RoPE, v */
    void *att;   /* (N, Q) bf16: attention output, o_proj's input */
    void *lse;   /* (B, NH, T) f32 */
    void *res2;  /* (N,C) bf16: x + the attention branch */
    void *ln2;   /* (N,C) bf16: post_attention_layernorm's output */
    void *rstd2; /* (N) f32 */
    void *gu;    /* (N, 2F) bf16: gate | up */
    void *h;     /* (N, F) bf16: silu(gate) up, down_proj's input */
    /* fp8: the products' inputs' transposed codes, ln1_q (C,N), att_q (Q,N),
     * ln2_q (C,N), h_q (F,N): what the weight gradients read (ln1, ln2 and h
     * are dropped once converted) */
    void *ln1_q, *att_q, *ln2_q, *h_q;
    /* fp8: the four weights' transposed codes (wq_at), forward to backward */
    void *wq;
} cu_layer_t;

struct llama_cu {
    bmt_ctx_t *ctx;
    llama_config_t cfg;
    int B, T, N;
    int Q, KV, QKV; /* NH hd, NKV hd, Q + 2 KV: widths of q, of k and v, of qkv */
    int Vp;         /* V rounded up to 64: the logits' row stride */
    int head_rows;  /* rows of logits that exist at once: N, or a chunk under checkpointing */
    int chunk_rows; /* a chunk's rows under checkpointing (head_rows unless the head keeps all) */
    int acts_of;    /* the layer whose activations the scratch set holds, or -1 */
    int keep_from;  /* layers >= keep_from have their own set: 0, or L under checkpointing */
    nn_cuda_t *h;
    void *workspace;
    float *inv_freq; /* (hd/2) f32: RoPE's frequencies, uploaded once */
    int32_t *tokens; /* device: inputs (N), targets (N), buckets (3N + 1), one upload */
    int32_t *inputs, *targets, *buckets; /* into tokens */
    int32_t *tokens_host;                /* the same on the host */
    int nbuckets, counted;
    void **x;         /* L + 1 residual stream buffers (N,C) bf16, the layers' inputs */
    cu_layer_t *acts; /* L + 1: a set per layer, the last the scratch (keep_from) */
    /* final norm and head */
    void *xf;                        /* (N,C) bf16: model.norm's output, the head's input */
    float *rstdf;                    /* (N) f32 */
    void *logits;                    /* (head_rows, Vp) bf16: logits, then their gradient */
    float *losses;                   /* (N) f32 */
    float *loss_sum;                 /* (1) f32 */
    float *logits_f32, *logits_host; /* keep_logits: (N,V) device, host */
    bool logits_ready, loss_ready;   /* a forward has filled them since they exist */
    /* backward */
    void *dres; /* (N,C) bf16: d loss / d the input of the block whose backward runs next */
    void *dxf;  /* (N,C) bf16: d loss / d xf */
    void *dln;  /* (N,C) bf16: d loss / d a norm's output */
    void *dh;   /* (N,F) bf16 */
    void *dgu;  /* (N,2F) bf16 */
    void *datt; /* (N,Q) bf16 */
    void *dqkv; /* (N,QKV) bf16 */
    void *Dd;   /* (B,NH,T) f32: the flash backward's scratch */
    void *stream;
    size_t U;            /* bytes of one (N,C) bf16 buffer */
    bool ckpt;           /* made with checkpointing */
    bool keep_attn;      /* checkpointing keeps each layer's att and lse (katt, klse) */
    void **katt, **klse; /* (L) when keep_attn: a layer's att and lse, forward to backward */
    /* FP8 (llama_cu_fp8): the four products of each layer, k 0 q|k|v, 1 o,
     * 2 gate|up, 3 down, as GPT-2's (examples/gpt2/model_cuda.c) */
    bool fp8;
    nn_cuda_fp8_plan_t fp8p; /* the scales, records and history: product 4 l + k */
    void *fp8_scratch;       /* nn_cuda_fp8_conv1d_scratch_bytes of the largest product */
};

static size_t wq_bytes(const llama_cu_t *cu);

static void *cu_alloc(llama_cu_t *cu, size_t bytes, bmt_error_t *err)
{
    return bmt_alloc(cu->ctx, BMT_MEM_ACTIVATION, bytes, err);
}

/* *p, stream-ordered, unless it exists already (a set reused from layer to
 * layer, or kept by a forward without backward). */
static int need(llama_cu_t *cu, void **p, size_t bytes, bmt_error_t *err)
{
    if (*p == NULL)
        *p = bmt_alloc_async(cu->ctx, BMT_MEM_ACTIVATION, bytes, cu->stream, err);
    return *p ? 0 : -1;
}

/* Give back the buffers named, once the work enqueued so far is done. */
#define drop(cu, ...) drop_all(cu, (void **[]){ __VA_ARGS__, NULL })
static void drop_all(llama_cu_t *cu, void **const *bufs)
{
    for (; *bufs; bufs++) {
        bmt_free_async(cu->ctx, **bufs, cu->stream);
        **bufs = NULL;
    }
}

/* The model's sizes the kernels and the stacked products take, checked before
 * anything is allocated. */
static int check_sizes(const llama_config_t *c, bmt_error_t *err)
{
    if (!nn_cuda_flash_ok(c->head_dim))
        return nn_fail(err,
                       "model: the cuda model runs flash attention, which takes head sizes 16, 32, "
                       "64 and 128; this model's head_dim is %d (use the cpu model: --device cpu)",
                       c->head_dim);
    const int64_t C = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_kv_head * c->head_dim, F = c->ffn;
    const struct {
        const char *what;
        int64_t numel;
    } parts[] = {
        { "q_proj (NH hd x C)", Q * C },
        { "k_proj (NKV hd x C)", KV * C },
        { "gate_proj (F x C)", F * C },
    };
    /* q_proj, k_proj end where k_proj, v_proj start when their sizes are
     * multiples of the alignment (v_proj and up_proj end their stacks). */
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        if (parts[i].numel % BMT_BLOCK_ALIGN != 0)
            return nn_fail(err,
                           "model: the cuda model takes q, k, v (and gate, up) in one product over "
                           "the block's parameters as they lie back to back, which needs each to "
                           "end where the next starts; %s = %lld elements is not a multiple of "
                           "the block's alignment %d, so the next one is padded away from it "
                           "(hidden_size %lld: a multiple of 16 avoids this; or use the cpu model: "
                           "--device cpu)",
                           parts[i].what, (long long)parts[i].numel, BMT_BLOCK_ALIGN, (long long)C);
    return 0;
}

/* The stacked products need q, k, v (and gate, up) back to back, parameters
 * (bf16) and gradients (f32) alike: the layout the sizes promised at create,
 * checked again on the pointers the list hands this call. */
static int check_stacked(const llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    const size_t C = (size_t)cu->cfg.n_embd, qc = (size_t)cu->Q * C, kc = (size_t)cu->KV * C,
                 fc = (size_t)cu->cfg.ffn * C;
    const struct {
        void *const *p;
        size_t es; /* element size */
        const char *what;
    } sets[] = { { c->params, 2, "parameters" }, { c->grads, 4, "gradients" } };
    for (size_t s = 0; s < 2; s++) {
        if (sets[s].p == NULL) /* a forward has no gradients */
            continue;
        const char *const *p = (const char *const *)sets[s].p;
        const size_t es = sets[s].es;
        if (p[P_K] != p[P_Q] + qc * es || p[P_V] != p[P_K] + kc * es ||
            p[P_UP] != p[P_GATE] + fc * es)
            return nn_fail(err,
                           "model: block %d's %s are not laid out back to back (q_proj, k_proj, "
                           "v_proj at +%td, +%td bytes; gate_proj, up_proj at +%td; want +%zu, "
                           "+%zu; +%zu): the stacked products would read the wrong numbers",
                           c->index, sets[s].what, p[P_K] - p[P_Q], p[P_V] - p[P_Q],
                           p[P_UP] - p[P_GATE], qc * es, (qc + kc) * es, fc * es);
    }
    return 0;
}

/* What lives as long as the model: the host arrays, the tokens, RoPE's
 * frequencies, the norm's statistics and the losses. */
static int alloc_all(llama_cu_t *cu, const float *inv_freq, bmt_error_t *err)
{
    const size_t N = (size_t)cu->N;
    const int L = cu->cfg.n_layer;
    const size_t nf = (size_t)cu->cfg.head_dim / 2 * sizeof(float);
    if ((cu->x = calloc((size_t)L + 1, sizeof(void *))) == NULL ||
        (cu->acts = calloc((size_t)L + 1, sizeof(cu_layer_t))) == NULL ||
        (cu->tokens_host = malloc((5 * N + 1) * sizeof(int32_t))) == NULL)
        return nn_fail(err, "model: rank %d: out of host memory", bmt_rank(cu->ctx));
    if (!(cu->tokens = cu_alloc(cu, (5 * N + 1) * 4, err)) ||
        !(cu->inv_freq = cu_alloc(cu, nf, err)) || !(cu->rstdf = cu_alloc(cu, N * 4, err)) ||
        !(cu->losses = cu_alloc(cu, N * 4, err)) || !(cu->loss_sum = cu_alloc(cu, 4, err)) ||
        bmt_mem_upload(cu->ctx, cu->inv_freq, inv_freq, nf, err) < 0)
        return -1;
    cu->inputs = cu->tokens, cu->targets = cu->tokens + N, cu->buckets = cu->tokens + 2 * N;
    return 0;
}

llama_cu_t *llama_cu_create(bmt_ctx_t *ctx, const llama_config_t *cfg, int B, int T, bool ckpt,
                            const float *inv_freq, bmt_error_t *err)
{
    if (check_sizes(cfg, err) < 0)
        return NULL;
    llama_cu_t *cu = calloc(1, sizeof(*cu));
    if (cu == NULL) {
        nn_fail(err, "model: out of host memory");
        return NULL;
    }
    cu->ctx = ctx;
    cu->cfg = *cfg;
    cu->ckpt = ckpt;
    cu->B = B, cu->T = T, cu->N = B * T;
    cu->Q = cfg->n_head * cfg->head_dim;
    cu->KV = cfg->n_kv_head * cfg->head_dim;
    cu->QKV = cu->Q + 2 * cu->KV;
    cu->Vp = (cfg->vocab_size + 63) / 64 * 64;
    cu->head_rows = cu->N;
    if (ckpt) { /* chunks of at most 256 MiB of logits, at least 4, rows a multiple of 64 */
        const size_t all = (size_t)cu->N * cu->Vp * 2;
        size_t chunks = (all + (256u << 20) - 1) / (256u << 20);
        chunks = chunks < 4 ? 4 : chunks;
        const int rows = (int)(((size_t)cu->N + chunks - 1) / chunks + 63) / 64 * 64;
        cu->head_rows = rows < cu->N ? rows : cu->N;
    }
    cu->chunk_rows = cu->head_rows;
    cu->acts_of = -1;
    cu->keep_from = ckpt ? cfg->n_layer : 0;
    cu->stream = bmt_compute_stream(ctx);
    cu->U = (size_t)cu->N * cfg->n_embd * 2;
    /* The widest layer: the column sums (RMSNorm weights) take C, the
     * products up to 2F or QKV columns. */
    int max_cols = cfg->n_embd;
    max_cols = cu->QKV > max_cols ? cu->QKV : max_cols;
    max_cols = 2 * cfg->ffn > max_cols ? 2 * cfg->ffn : max_cols;
    if ((cu->workspace =
             bmt_alloc(ctx, BMT_MEM_WORKSPACE, nn_cuda_workspace_bytes(max_cols), err)) == NULL ||
        (cu->h = nn_cuda_create(cu->stream, cu->workspace, max_cols, err)) == NULL ||
        alloc_all(cu, inv_freq, err) < 0) {
        llama_cu_destroy(cu);
        return NULL;
    }
    return cu;
}

void llama_cu_destroy(llama_cu_t *cu)
{
    if (cu == NULL)
        return;
    bmt_ctx_t *ctx = cu->ctx;
    bmt_error_t e;
    bmt_device_synchronize(ctx, &e); /* nothing may still run on what is freed */
    nn_cuda_destroy(cu->h);
    const int L = cu->cfg.n_layer;
    if (cu->x)
        for (int l = 0; l <= L; l++)
            bmt_free(ctx, cu->x[l]);
    if (cu->acts)
        for (int s = 0; s <= L; s++) {
            cu_layer_t *a = &cu->acts[s];
            void *all[] = { a->ln1,   a->rstd1, a->qkv,   a->att, a->lse,
                            a->res2,  a->ln2,   a->rstd2, a->gu,  a->h,
                            a->ln1_q, a->att_q, a->ln2_q, a->h_q, a->wq };
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                bmt_free(ctx, all[i]);
        }
    void *rest[] = { cu->tokens, cu->inv_freq,  cu->xf,         cu->rstdf,      cu->logits,
                     cu->losses, cu->loss_sum,  cu->logits_f32, cu->dres,       cu->dxf,
                     cu->dln,    cu->dh,        cu->dgu,        cu->datt,       cu->dqkv,
                     cu->Dd,     cu->workspace, cu->fp8p.s,     cu->fp8_scratch };
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++)
        bmt_free(ctx, rest[i]);
    for (int l = 0; cu->katt && l < L; l++) {
        bmt_free(ctx, cu->katt[l]);
        bmt_free(ctx, cu->klse[l]);
    }
    free(cu->katt);
    free(cu->klse);
    free(cu->x);
    free(cu->acts);
    free(cu->tokens_host);
    free(cu->logits_host);
    free(cu);
}

int llama_cu_keep_layers(llama_cu_t *cu, int keep_from, bool head, bmt_error_t *err)
{
    (void)err; /* llama_model_keep_layers has made sure that no forward ran */
    cu->keep_from = keep_from;
    cu->head_rows = head ? cu->N : cu->chunk_rows;
    return 0;
}

void llama_cu_act_bytes(const llama_cu_t *cu, int64_t *layer, int64_t *head)
{
    const int64_t N = cu->N, C = cu->cfg.n_embd, F = cu->cfg.ffn;
    const int64_t lse = (int64_t)cu->B * cu->cfg.n_head * cu->T;
    /* layer_forward's set: ln1, res2, ln2 (N,C), qkv, att, gu, h bf16; or with
     * FP8 res2, qkv, att, gu bf16, the codes of ln1, att, ln2 and h (a byte
     * each) and the weights' (wq_bytes) instead of ln1, ln2 and h; the
     * statistics and lse f32. keep_attn's att and lse live outside the set,
     * kept for every layer anyway. */
    *layer = cu->fp8 ? 2 * (N * C + N * cu->QKV + N * 2 * F) + 2 * N * C + N * F + N * cu->Q +
                           (int64_t)wq_bytes(cu) + 4 * 2 * N
                     : 2 * (3 * N * C + N * cu->QKV + N * 2 * F + N * F) + 4 * 2 * N;
    if (!cu->keep_attn)
        *layer += 2 * N * cu->Q + 4 * lse;
    *head = 2 * (int64_t)cu->Vp * (N - cu->chunk_rows);
}

int llama_cu_keep_attention(llama_cu_t *cu, int mode, bmt_error_t *err)
{
    const bool on = mode != 0 && cu->ckpt; /* without checkpointing every layer keeps its set */
    const int L = cu->cfg.n_layer;
    if (on && cu->katt == NULL &&
        ((cu->katt = calloc((size_t)L, sizeof(void *))) == NULL ||
         (cu->klse = calloc((size_t)L, sizeof(void *))) == NULL))
        return nn_fail(err, "model: out of host memory");
    if (!on && cu->katt) /* what a forward kept goes back; the sets take over */
        for (int l = 0; l < L; l++)
            drop(cu, &cu->katt[l], &cu->klse[l]);
    cu->keep_attn = on;
    return 0;
}

int llama_cu_set_batch(llama_cu_t *cu, const int32_t *inputs, const int32_t *targets, int counted,
                       bmt_error_t *err)
{
    const size_t N = (size_t)cu->N;
    int32_t *h = cu->tokens_host;
    memcpy(h, inputs, N * 4);
    memcpy(h + N, targets, N * 4);
    int U = nn_token_buckets(inputs, cu->N, cu->cfg.vocab_size, h + 2 * N);
    if (U < 0)
        return nn_fail(err, "model: rank %d: out of host memory", bmt_rank(cu->ctx));
    /* One upload (it waits for the context's streams first: the previous
     * micro-batch's backward may still read these buffers). */
    if (bmt_mem_upload(cu->ctx, cu->tokens, h, (2 * N + 2 * (size_t)U + 1 + N) * 4, err) < 0)
        return -1;
    cu->nbuckets = U;
    cu->counted = counted;
    cu->acts_of = -1;
    return 0;
}

static cu_layer_t *layer_of(llama_cu_t *cu, int l)
{
    return &cu->acts[l >= cu->keep_from ? l : cu->cfg.n_layer];
}

/* ------------------------------------------------------------------ FP8 */

/* Product k of layer l (0 q|k|v, 1 o, 2 gate|up, 3 down): its scales. */
static nn_cuda_fp8_scales_t fp8_scales(llama_cu_t *cu, int l, int k)
{
    return nn_cuda_fp8_plan_at(&cu->fp8p, 4 * l + k);
}

/* A forward begins: with FP8, when a backward ended since, the pass's
 * records close (nn_fp8_plan_begin's bookkeeping, on the device). */
static int fp8_begin(llama_cu_t *cu, bmt_error_t *err)
{
    return cu->fp8 ? nn_cuda_fp8_plan_begin(cu->h, &cu->fp8p, err) : 0;
}

/* Product k's (IC, OC): q|k|v (C, QKV), o (Q, C), gate|up (C, 2F), down (F, C). */
static void shape_of(const llama_cu_t *cu, int k, int *IC, int *OC)
{
    const int C = cu->cfg.n_embd, F = cu->cfg.ffn;
    const int ic[4] = { C, cu->Q, C, F }, oc[4] = { cu->QKV, C, 2 * F, C };
    *IC = ic[k], *OC = oc[k];
}

/* The bytes of the four weights' codes a set keeps, and product k's offset. */
static size_t wq_off(const llama_cu_t *cu, int k)
{
    size_t at = 0;
    for (int j = 0; j < k; j++) {
        int IC, OC;
        shape_of(cu, j, &IC, &OC);
        at += (size_t)IC * OC;
    }
    return at;
}
static size_t wq_bytes(const llama_cu_t *cu) { return wq_off(cu, 4); }

/* FP8: product k's weight codes kept in layer l's set, or NULL where the
 * set does not keep them: in a recomputed layer the recomputation stops
 * before down_proj, so its backward converts the weight again. */
static uint8_t *wq_at(llama_cu_t *cu, int l, int k)
{
    const cu_layer_t *a = layer_of(cu, l);
    return a->wq == NULL || (l < cu->keep_from && k == 3) ? NULL : (uint8_t *)a->wq + wq_off(cu, k);
}

/* out (N,OC) = [res +] inp W^T for product k, rows OC apart: bf16, or with
 * FP8 operands, the input's codes saved in *xq for the backward (made here if
 * need be), the weight's in wq_at. res (the residual stream, or NULL; o and
 * down): read as the product's C input, the sum rounded once. w is the first
 * weight of a stack (the stack's weights lie back to back: check_stacked). */
static int linear_forward(llama_cu_t *cu, int l, int k, void *out, const void *res, void **xq,
                          const void *inp, const void *w, bmt_error_t *err)
{
    int IC, OC;
    shape_of(cu, k, &IC, &OC);
    if (!cu->fp8)
        return res ? nn_cuda_matmul_residual_forward(cu->h, out, res, inp, w, NULL, cu->N, IC, OC,
                                                     1, err)
                   : nn_cuda_matmul_forward(cu->h, out, OC, inp, w, NULL, cu->N, IC, OC, 1, err);
    const nn_cuda_fp8_scales_t sc = fp8_scales(cu, l, k);
    if (need(cu, xq, (size_t)cu->N * IC, err) < 0)
        return -1;
    return res ? nn_cuda_fp8_linear_residual_forward(cu->h, out, res, *xq, wq_at(cu, l, k), inp, w,
                                                     NULL, cu->N, IC, OC, 1, &sc, cu->fp8_scratch,
                                                     err)
               : nn_cuda_fp8_linear_forward(cu->h, out, *xq, wq_at(cu, l, k), inp, w, NULL, cu->N,
                                            IC, OC, 1, &sc, cu->fp8_scratch, err);
}

/* Its backward: dinp (N,IC) and/or dw (OC,IC) f32 (added into: add) from dout
 * (N,OC), from the bf16 input or the FP8 codes linear_forward saved. In one
 * call with FP8 (the gradient converted once); bf16 takes dw first, since the
 * caller may free the input before dinp's product. */
static int linear_backward(llama_cu_t *cu, int l, int k, void *dinp, float *dw, const void *dout,
                           const void *xq, const void *inp, const void *w, int add,
                           bmt_error_t *err)
{
    int IC, OC;
    shape_of(cu, k, &IC, &OC);
    if (!cu->fp8)
        return nn_cuda_matmul_backward(cu->h, dinp, dw, NULL, dout, OC, inp, w, cu->N, IC, OC, 1,
                                       add, err);
    const nn_cuda_fp8_scales_t sc = fp8_scales(cu, l, k);
    return nn_cuda_fp8_linear_backward(cu->h, dinp, dw, NULL, dout, xq, wq_at(cu, l, k), w, cu->N,
                                       IC, OC, &sc, cu->fp8_scratch, add, err);
}

/* x[l+1] = layer(x[l]); under recompute only the set is made again (see the
 * note at the top). Each buffer is made just before its first writer. */
static int layer_forward(llama_cu_t *cu, int l, void *const *p, bool recompute, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const llama_config_t *g = &cu->cfg;
    const int B = cu->B, T = cu->T, N = cu->N, C = g->n_embd, F = g->ffn;
    const int NH = g->n_head, NKV = g->n_kv_head, hd = g->head_dim;
    const size_t U = cu->U, S = (size_t)N * 4;
    const float eps = (float)g->rms_eps;
    cu_layer_t *a = layer_of(cu, l);
    const void *x = cu->x[l];
    void **att = cu->keep_attn ? &cu->katt[l] : &a->att,
         **lse = cu->keep_attn ? &cu->klse[l] : &a->lse;
    const bool attend = !(recompute && cu->keep_attn); /* else kept from the forward */
    /* Attention: res2 = x + o_proj(attn(rope(qkv))). With FP8 the norms'
     * outputs (and h) go once their product has their codes, which are all
     * the backward reads of them. */
    if ((!recompute && need(cu, &cu->x[l + 1], U, err) < 0) || need(cu, &a->ln1, U, err) < 0 ||
        need(cu, &a->rstd1, S, err) < 0 || need(cu, &a->qkv, (size_t)N * cu->QKV * 2, err) < 0 ||
        need(cu, att, (size_t)N * cu->Q * 2, err) < 0 ||
        need(cu, lse, (size_t)B * NH * T * 4, err) < 0 || need(cu, &a->res2, U, err) < 0 ||
        (cu->fp8 && need(cu, &a->wq, wq_bytes(cu), err) < 0))
        return -1;
    if (nn_cuda_rmsnorm_forward(h, a->ln1, a->rstd1, x, p[P_IN_NORM], N, C, eps, err) < 0 ||
        linear_forward(cu, l, 0, a->qkv, NULL, &a->ln1_q, a->ln1, p[P_Q], err) < 0)
        return -1;
    if (cu->fp8)
        drop(cu, &a->ln1);
    if (nn_cuda_rope_forward(h, a->qkv, cu->inv_freq, B, T, NH, NKV, hd, 0, err) < 0 ||
        (attend && nn_cuda_flash_forward(h, *att, *lse, a->qkv, B, T, NH, NKV, hd, err) < 0) ||
        linear_forward(cu, l, 1, a->res2, x, &a->att_q, *att, p[P_O], err) < 0)
        return -1;
    /* MLP: x' = res2 + down_proj(silu(gate) up) */
    if (need(cu, &a->ln2, U, err) < 0 || need(cu, &a->rstd2, S, err) < 0 ||
        need(cu, &a->gu, (size_t)N * 2 * F * 2, err) < 0 ||
        nn_cuda_rmsnorm_forward(h, a->ln2, a->rstd2, a->res2, p[P_POST_NORM], N, C, eps, err) < 0 ||
        linear_forward(cu, l, 2, a->gu, NULL, &a->ln2_q, a->ln2, p[P_GATE], err) < 0)
        return -1;
    if (cu->fp8)
        drop(cu, &a->ln2);
    if (need(cu, &a->h, (size_t)N * F * 2, err) < 0 ||
        nn_cuda_swiglu_forward(h, a->h, a->gu, N, F, err) < 0)
        return -1;
    if (l < cu->keep_from)
        cu->acts_of = l; /* the scratch set holds layer l's */
    if (recompute) {     /* x[l+1] is kept: the backward has all it reads (FP8: h's codes) */
        if (!cu->fp8)
            return 0;
        const nn_cuda_fp8_scales_t sc = fp8_scales(cu, l, 3);
        if (need(cu, &a->h_q, (size_t)N * F, err) < 0 ||
            nn_cuda_fp8_codes(h, NULL, a->h_q, a->h, 0, N, F, NN_FP8_E4M3, &sc, 0, err) < 0)
            return -1;
        drop(cu, &a->h);
        return 0;
    }
    if (linear_forward(cu, l, 3, cu->x[l + 1], a->res2, &a->h_q, a->h, p[P_DOWN], err) < 0)
        return -1;
    if (cu->fp8)
        drop(cu, &a->h);
    return 0;
}

/* cu->dres: in, the gradient w.r.t. x[l+1]; out, w.r.t. x[l] (accumulated in
 * place through both norms: d res2 = d x' + rms2's input gradient, d x = d
 * res2 + rms1's). Every buffer goes back as soon as its last reader is
 * enqueued: the layer's saved set (a recomputation or the next forward makes
 * it again) and x[l]. Each gradient is written by one call: added into
 * (add), or written (add 0: fresh gradients, bmt_block_call_t.grads_fresh;
 * q, k and v's as one, gate and up's as one: check_stacked). */
static int layer_backward(llama_cu_t *cu, int l, void *const *p, float *const *g, int add,
                          bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const llama_config_t *cf = &cu->cfg;
    const int B = cu->B, T = cu->T, N = cu->N, C = cf->n_embd, F = cf->ffn;
    const int NH = cf->n_head, NKV = cf->n_kv_head, hd = cf->head_dim;
    const size_t U = cu->U;
    cu_layer_t *a = layer_of(cu, l);
    void **att = cu->keep_attn ? &cu->katt[l] : &a->att,
         **lse = cu->keep_attn ? &cu->klse[l] : &a->lse;
    if (l < cu->keep_from)
        cu->acts_of = -1; /* the scratch set is consumed here */

    /* down_proj. bf16: the weight's gradient first, then h is dead and dh can
     * take its place. FP8: h is gone already (its codes are half its size), so
     * one call takes both and converts the gradient once. */
    if (cu->fp8) {
        if (need(cu, &cu->dh, (size_t)N * F * 2, err) < 0 ||
            linear_backward(cu, l, 3, cu->dh, g[P_DOWN], cu->dres, a->h_q, NULL, p[P_DOWN], add,
                            err) < 0)
            return -1;
        drop(cu, &a->h_q);
    } else {
        if (linear_backward(cu, l, 3, NULL, g[P_DOWN], cu->dres, NULL, a->h, p[P_DOWN], add, err) <
            0)
            return -1;
        drop(cu, &a->h);
        if (need(cu, &cu->dh, (size_t)N * F * 2, err) < 0 ||
            linear_backward(cu, l, 3, cu->dh, NULL, cu->dres, NULL, NULL, p[P_DOWN], add, err) < 0)
            return -1;
    }
    /* SwiGLU, then gate_proj and up_proj as one (2F, C) product */
    if (need(cu, &cu->dgu, (size_t)N * 2 * F * 2, err) < 0 ||
        nn_cuda_swiglu_backward(h, cu->dgu, cu->dh, a->gu, N, F, err) < 0)
        return -1;
    drop(cu, &cu->dh, &a->gu);
    if (need(cu, &cu->dln, U, err) < 0 ||
        linear_backward(cu, l, 2, cu->dln, g[P_GATE], cu->dgu, a->ln2_q, a->ln2, p[P_GATE], add,
                        err) < 0)
        return -1;
    drop(cu, &cu->dgu, &a->ln2, &a->ln2_q);
    if (nn_cuda_rmsnorm_backward(h, cu->dres, cu->dres, g[P_POST_NORM], cu->dln, a->res2,
                                 p[P_POST_NORM], a->rstd2, N, C, add, err) < 0)
        return -1;
    drop(cu, &cu->dln, &a->res2, &a->rstd2);

    /* o_proj, attention, RoPE (in place), then q, k, v as one (QKV, C) product */
    if (need(cu, &cu->datt, (size_t)N * cu->Q * 2, err) < 0 ||
        linear_backward(cu, l, 1, cu->datt, g[P_O], cu->dres, a->att_q, *att, p[P_O], add, err) <
            0 ||
        need(cu, &cu->dqkv, (size_t)N * cu->QKV * 2, err) < 0 ||
        need(cu, &cu->Dd, (size_t)B * NH * T * 4, err) < 0 ||
        nn_cuda_flash_backward(h, cu->dqkv, cu->Dd, cu->datt, *att, a->qkv, *lse, B, T, NH, NKV, hd,
                               err) < 0 ||
        nn_cuda_rope_backward(h, cu->dqkv, cu->inv_freq, B, T, NH, NKV, hd, 0, err) < 0)
        return -1;
    drop(cu, &cu->datt, &cu->Dd, att, lse, &a->qkv, &a->att_q);
    if (need(cu, &cu->dln, U, err) < 0 || linear_backward(cu, l, 0, cu->dln, g[P_Q], cu->dqkv,
                                                          a->ln1_q, a->ln1, p[P_Q], add, err) < 0)
        return -1;
    drop(cu, &cu->dqkv, &a->ln1, &a->ln1_q, &a->wq);
    if (nn_cuda_rmsnorm_backward(h, cu->dres, cu->dres, g[P_IN_NORM], cu->dln, cu->x[l],
                                 p[P_IN_NORM], a->rstd1, N, C, add, err) < 0)
        return -1;
    drop(cu, &cu->dln, &a->rstd1, &cu->x[l]);
    return 0;
}

/* Logits of rows [r0, r0 + n) into the logits buffer, then their losses, and
 * d loss / d logits in their place. */
static int head_chunk(llama_cu_t *cu, void *const *p, int r0, int n, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const int C = cu->cfg.n_embd, V = cu->cfg.vocab_size;
    const float dloss = cu->counted ? 1.0f / (float)cu->counted : 0.0f;
    const void *xf = (const char *)cu->xf + (size_t)r0 * C * 2;
    if (nn_cuda_matmul_forward(h, cu->logits, cu->Vp, xf, p[0], NULL, n, C, V, 1, err) < 0 ||
        (cu->logits_f32 &&
         nn_cuda_to_f32(h, cu->logits_f32 + (size_t)r0 * V, cu->logits, n, V, cu->Vp, err) < 0) ||
        nn_cuda_crossentropy(h, cu->losses + r0, cu->logits, cu->Vp, cu->targets + r0, dloss, n, V,
                             err) < 0)
        return -1;
    return 0;
}

static int head_forward(llama_cu_t *cu, void *const *p, bmt_error_t *err)
{
    const int N = cu->N;
    if (need(cu, &cu->logits, (size_t)cu->head_rows * cu->Vp * 2, err) < 0)
        return -1;
    for (int r0 = 0; r0 < N; r0 += cu->head_rows)
        if (head_chunk(cu, p, r0, N - r0 < cu->head_rows ? N - r0 : cu->head_rows, err) < 0)
            return -1;
    if (cu->head_rows < N) /* the backward makes each chunk's logits again */
        drop(cu, &cu->logits);
    if (nn_cuda_sum(cu->h, cu->loss_sum, cu->losses, N, err) < 0)
        return -1;
    cu->logits_ready = cu->logits_f32 != NULL;
    cu->loss_ready = true;
    return 0;
}

/* Fresh gradients (the head's own block, or the tied embedding's first use
 * in backward order) are written by the first chunk's product, or zeroed
 * when no position counts. */
static int head_backward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    void *const *p = c->params;
    float *const *g = (float *const *)c->grads;
    const int N = cu->N, C = cu->cfg.n_embd, V = cu->cfg.vocab_size, add = !c->grads_fresh;
    if (need(cu, &cu->dxf, cu->U, err) < 0)
        return -1;
    if (cu->counted == 0 && c->grads_fresh && bmt_block_call_zero_grad(c, -1, err) < 0)
        return -1;
    if (cu->counted == 0) { /* no position counts: the loss does not depend on anything */
        drop(cu, &cu->logits, &cu->xf);
        return cudaMemsetAsync(cu->dxf, 0, cu->U, (cudaStream_t)cu->stream) == cudaSuccess
                   ? 0
                   : nn_fail(err, "model: cudaMemsetAsync failed");
    }
    if (need(cu, &cu->logits, (size_t)cu->head_rows * cu->Vp * 2, err) < 0)
        return -1;
    /* All rows at once: the forward left d loss / d logits in the logits
     * buffer. In chunks: each chunk's again, then its products. */
    for (int r0 = 0; r0 < N; r0 += cu->head_rows) {
        const int n = N - r0 < cu->head_rows ? N - r0 : cu->head_rows;
        const size_t off = (size_t)r0 * C * 2;
        if ((cu->head_rows < N && head_chunk(cu, p, r0, n, err) < 0) ||
            nn_cuda_matmul_backward(h, (char *)cu->dxf + off, g[0], NULL, cu->logits, cu->Vp,
                                    (const char *)cu->xf + off, p[0], n, C, V, 1, add || r0 > 0,
                                    err) < 0)
            return -1;
    }
    drop(cu, &cu->logits, &cu->xf);
    return 0;
}

int llama_cu_forward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    void *const *p = c->params;
    const int L = cu->cfg.n_layer, N = cu->N, C = cu->cfg.n_embd;
    /* Recomputations with nothing to do: x_0 and xf are kept, the head's
     * backward does its own, and the scratch set may still hold this layer's
     * activations. */
    if (c->recompute && (c->index == 0 || c->index > L || cu->acts_of == c->index - 1))
        return 0;
    if (c->index == 0)
        return fp8_begin(cu, err) < 0 || need(cu, &cu->x[0], cu->U, err) < 0
                   ? -1
                   : nn_cuda_encoder_forward(cu->h, cu->x[0], cu->inputs, p[0], NULL, cu->B, cu->T,
                                             C, err);
    if (c->index == L + 1)
        return need(cu, &cu->xf, cu->U, err) < 0
                   ? -1
                   : nn_cuda_rmsnorm_forward(cu->h, cu->xf, cu->rstdf, cu->x[L], p[0], N, C,
                                             (float)cu->cfg.rms_eps, err);
    if (c->index == L + 2)
        return head_forward(cu, p, err);
    if (check_stacked(cu, c, err) < 0)
        return -1;
    return layer_forward(cu, c->index - 1, p, c->recompute, err);
}

int llama_cu_backward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    void *const *p = c->params;
    float *const *g = (float *const *)c->grads;
    const int L = cu->cfg.n_layer, N = cu->N, C = cu->cfg.n_embd;
    if (c->index == 0) { /* fresh (untied, or a group of two or more): zeros to add into */
        if ((c->grads_fresh && bmt_block_call_zero_grad(c, -1, err) < 0) ||
            nn_cuda_encoder_backward(cu->h, g[0], NULL, cu->dres, cu->buckets, cu->nbuckets, cu->B,
                                     cu->T, C, err) < 0)
            return -1;
        drop(cu, &cu->dres);
        if (cu->fp8) /* the pass's records close when the next forward begins */
            nn_cuda_fp8_plan_end(&cu->fp8p);
        return 0;
    }
    if (c->index == L + 1) { /* xf = rms(x_L): d x_L from d xf */
        if (need(cu, &cu->dres, cu->U, err) < 0 ||
            nn_cuda_rmsnorm_backward(cu->h, cu->dres, NULL, g[0], cu->dxf, cu->x[L], p[0],
                                     cu->rstdf, N, C, !c->grads_fresh, err) < 0)
            return -1;
        drop(cu, &cu->dxf, &cu->x[L]);
        return 0;
    }
    if (c->index == L + 2)
        return head_backward(cu, c, err);
    if (check_stacked(cu, c, err) < 0)
        return -1;
    return layer_backward(cu, c->index - 1, p, g, !c->grads_fresh, err);
}

int llama_cu_loss(llama_cu_t *cu, float *loss, bmt_error_t *err)
{
    float sum;
    if (!cu->loss_ready)
        return nn_fail(err, "model: no forward has computed a loss yet");
    if (bmt_mem_download(cu->ctx, &sum, cu->loss_sum, sizeof(sum), err) < 0)
        return -1;
    *loss = cu->counted ? sum / (float)cu->counted : 0.0f;
    return 0;
}

int llama_cu_keep_logits(llama_cu_t *cu, bmt_error_t *err)
{
    const size_t n = (size_t)cu->N * cu->cfg.vocab_size;
    if (cu->logits_f32)
        return 0;
    if (cu->logits_host == NULL && (cu->logits_host = malloc(n * sizeof(float))) == NULL)
        return nn_fail(err, "model: rank %d: out of host memory for the logits", bmt_rank(cu->ctx));
    cu->logits_ready = false; /* until the next forward fills them */
    return (cu->logits_f32 = cu_alloc(cu, n * sizeof(float), err)) ? 0 : -1;
}

const float *llama_cu_logits(llama_cu_t *cu, bmt_error_t *err)
{
    if (cu->logits_f32 == NULL) {
        nn_fail(err, "model: logits are not kept on cuda (llama_model_keep_logits)");
        return NULL;
    }
    if (!cu->logits_ready) {
        nn_fail(err, "model: no forward has run since the logits were kept");
        return NULL;
    }
    const size_t n = (size_t)cu->N * cu->cfg.vocab_size;
    return bmt_mem_download(cu->ctx, cu->logits_host, cu->logits_f32, n * sizeof(float), err) < 0
               ? NULL
               : cu->logits_host;
}

int llama_cu_fp8(llama_cu_t *cu, int on, int history, bmt_error_t *err)
{
    const int C = cu->cfg.n_embd, F = cu->cfg.ffn, L = cu->cfg.n_layer;
    if (history < 0 || history > NN_FP8_HISTORY_MAX)
        return nn_fail(err, "llama: an FP8 history of %d passes: give 0 (current scaling) to %d",
                       history, NN_FP8_HISTORY_MAX);
    if (cu->fp8 && on && history != cu->fp8p.history)
        return nn_fail(err, "llama: FP8's scaling cannot change once on (history %d, asked %d)",
                       cu->fp8p.history, history);
    if (cu->fp8 == (on != 0))
        return 0;
    if (!on)
        return nn_fail(err, "llama: FP8 cannot be turned off once on");
    if (cu->acts_of >= 0 || cu->loss_ready)
        return nn_fail(err, "llama: FP8 must be turned on before the first forward");
    /* Q and KV are multiples of 16 already (head sizes 16..128) */
    if (cu->N % 16 || C % 16 || F % 16)
        return nn_fail(err,
                       "llama: --fp8 1 on cuda wants batch x sequence (%d x %d = %d), hidden_size "
                       "(%d) and intermediate_size (%d) to be multiples of 16 (the FP8 products' "
                       "reduced dimensions): change -b or -t, or use --fp8 0",
                       cu->B, cu->T, cu->N, C, F);
    size_t scratch = 0;
    for (int k = 0; k < 4; k++) {
        int IC, OC;
        shape_of(cu, k, &IC, &OC);
        const size_t b = nn_cuda_fp8_conv1d_scratch_bytes(cu->N, IC, OC);
        scratch = b > scratch ? b : scratch;
    }
    const size_t bytes = nn_cuda_fp8_plan_bytes(L * 4, history);
    void *buf = cu_alloc(cu, bytes, err);
    if (buf == NULL || nn_cuda_fp8_plan_init(cu->h, &cu->fp8p, buf, L * 4, history, err) < 0 ||
        (cu->fp8_scratch = bmt_alloc(cu->ctx, BMT_MEM_WORKSPACE, scratch, err)) == NULL) {
        bmt_free(cu->ctx, buf);
        cu->fp8p.s = NULL;
        return -1;
    }
    cu->fp8 = true;
    return 0;
}

int llama_cu_gemm_tune(llama_cu_t *cu, int candidates, bmt_error_t *err)
{
    return nn_cuda_gemm_tune(cu->h, candidates) == 0
               ? 0
               : nn_fail(err, "llama: %d product candidates to time: give 0 to %d", candidates,
                         NN_GEMM_TUNE_MAX);
}

int llama_cu_fp8_stats(llama_cu_t *cu, nn_fp8_stats_t *st, bmt_error_t *err)
{
    unsigned long long d[2] = { 0, 0 };
    if (cu->fp8 && (fp8_begin(cu, err) < 0 || /* closes the last pass, as a forward would */
                    bmt_mem_download(cu->ctx, d, cu->fp8p.stats, sizeof(d), err) < 0))
        return -1;
    st->passes = cu->fp8p.passes, st->saturated = (long)d[0], st->unscalable = (long)d[1];
    return 0;
}

#else /* no CUDA */

static int no_cuda(bmt_error_t *err)
{
    snprintf(err->text, sizeof(err->text),
             "model: this build has no CUDA: rebuild where nvcc is found, or use --device cpu");
    return -1;
}

llama_cu_t *llama_cu_create(bmt_ctx_t *ctx, const llama_config_t *cfg, int B, int T, bool ckpt,
                            const float *inv_freq, bmt_error_t *err)
{
    (void)ctx, (void)cfg, (void)B, (void)T, (void)ckpt, (void)inv_freq;
    no_cuda(err);
    return NULL;
}
void llama_cu_destroy(llama_cu_t *cu) { (void)cu; }
int llama_cu_keep_layers(llama_cu_t *cu, int keep_from, bool head, bmt_error_t *err)
{
    (void)cu, (void)keep_from, (void)head;
    return no_cuda(err);
}
void llama_cu_act_bytes(const llama_cu_t *cu, int64_t *layer, int64_t *head)
{
    (void)cu;
    *layer = *head = 0;
}
int llama_cu_keep_attention(llama_cu_t *cu, int mode, bmt_error_t *err)
{
    (void)cu, (void)mode;
    return no_cuda(err);
}
int llama_cu_set_batch(llama_cu_t *cu, const int32_t *i, const int32_t *t, int n, bmt_error_t *err)
{
    (void)cu, (void)i, (void)t, (void)n;
    return no_cuda(err);
}
int llama_cu_forward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)cu, (void)c;
    return no_cuda(err);
}
int llama_cu_backward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)cu, (void)c;
    return no_cuda(err);
}
int llama_cu_loss(llama_cu_t *cu, float *loss, bmt_error_t *err)
{
    (void)cu, (void)loss;
    return no_cuda(err);
}
int llama_cu_keep_logits(llama_cu_t *cu, bmt_error_t *err)
{
    (void)cu;
    return no_cuda(err);
}
int llama_cu_fp8(llama_cu_t *cu, int on, int history, bmt_error_t *err)
{
    (void)cu, (void)on, (void)history;
    return no_cuda(err);
}
int llama_cu_fp8_stats(llama_cu_t *cu, nn_fp8_stats_t *st, bmt_error_t *err)
{
    (void)cu, (void)st;
    return no_cuda(err);
}
int llama_cu_gemm_tune(llama_cu_t *cu, int candidates, bmt_error_t *err)
{
    (void)cu, (void)candidates;
    return no_cuda(err);
}
const float *llama_cu_logits(llama_cu_t *cu, bmt_error_t *err)
{
    (void)cu;
    no_cuda(err);
    return NULL;
}
#endif
