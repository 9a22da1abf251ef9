/* examples/generate/decode_cuda.c — the CUDA decoders of the Llama family and
 * GPT-2 (see decode.h, gen_decoder_open_cuda).
 *
 * Layer: an example above libbmt (the safetensors reader), nn/ (the CUDA
 * layers of nn/ops_cuda.h and nn/llama_ops_cuda.h) and the models'
 * configuration parsers; no engine, no bmlaunch: one process, the current
 * device (device 0 of those CUDA_VISIBLE_DEVICES shows), one stream it makes.
 *
 * The whole model lives on the device in bf16, in one allocation: each tensor
 * is read from the files as bf16 (bmt_st_read rounds once to nearest even)
 * in pieces through a host buffer and copied up. Llama's q_proj, k_proj and
 * v_proj are stacked into one ((NH + 2 NKV) hd, C) matrix and gate_proj and
 * up_proj into one (2F, C), so each is one product (nn_cuda_matmul_forward
 * with wt = 1), as the trainer's CUDA model computes them
 * (examples/llama/model_cuda.c). GPT-2's Conv1D weights are used as they lie
 * (wt = 0, biases fused), its head is wte (wt = 1).
 *
 * The KV cache is bf16, per layer (capacity, NKV, hd) for keys (after RoPE)
 * and for values (GPT-2: NKV = NH), in a second allocation. A forward over n
 * tokens runs in chunks of at most CHUNK rows through every layer, as the CPU
 * decoder does; per layer and chunk:
 *   ln = norm(x)                      rmsnorm (Llama) or layernorm (GPT-2)
 *   qkv = ln W_qkv                    (m, (NH + 2 NKV) hd): one product
 *   rope(qkv) at positions p0..       Llama only, q and k heads in place
 *   cache[p0..p0+m) = k, v            cudaMemcpy2DAsync out of the qkv rows
 *   att = attention_cached(q, cache)  the m queries over positions 0..p0+i
 *   x += att W_o
 *   x += mlp(norm(x))                 SwiGLU on the stacked gate | up, or GELU
 * and, on the last row of the last chunk only, the final norm and the head,
 * whose bf16 logits are widened to f32 (nn_cuda_to_f32) and copied to the
 * caller after the stream is synchronized, so that a kernel's failure is
 * this call's error.
 *
 * What differs from the CPU decoder, which computes in f32 with sums in
 * double: every weight and activation is bf16 (sums are f32), so logits
 * differ from the CPU's by about 1e-2 of their largest and greedy paths part
 * where two logits are that close; and cuBLAS may choose another algorithm for
 * another number of rows, so a prefill, a step at a time and --no-cache agree
 * to bf16 rounding, not bit for bit. The same inputs give the same bits run
 * after run (nn's kernels have no atomics; the products' algorithms are the
 * heuristic's first, nn_cuda_gemm_tune 0).
 */
#include "decode.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/bmt.h"
#include "bmt/safetensors.h"
#include "gpt2/model.h"
#include "llama/config.h"
#include "nn/hfjson.h"
#include "nn/llama_ops_cpu.h"

#ifndef BMT_HAVE_CUDA

gen_decoder_t *gen_decoder_open_cuda(const char *dir, int capacity, bmt_error_t *err)
{
    (void)dir, (void)capacity;
    nn_fail(err, "--device cuda: this bmt was built without CUDA (no nvcc or cuda_runtime.h "
                 "under CUDA_HOME, or NO_CUDA=1; docs/building.md)");
    return NULL;
}

#else

#include <cuda_runtime.h>

#include "nn/llama_ops_cuda.h"
#include "nn/ops_cuda.h"
#include "weights.h"

enum {
    CHUNK = 64,      /* rows of a forward computed together, as the CPU decoder */
    STAGE = 8 << 20, /* bf16 elements read from the files per copy to the device */
    MAX_HD = 256,    /* the head sizes nn_cuda_attention_cached takes */
    ALIGN = 256      /* bytes between the tensors of one allocation */
};

/* A layer's parameters (bf16, device) and its part of the cache. */
typedef struct cu_layer {
    void *n1, *n1b; /* (C): input_layernorm / ln_1 weight; ln_1 bias (GPT-2) */
    void *wqkv;     /* Llama ((NH + 2 NKV) hd, C): q_proj | k_proj | v_proj; GPT-2 (C, 3C) */
    void *bqkv;     /* (3C) GPT-2 */
    void *wo, *bo;  /* Llama (C, NH hd); GPT-2 (C, C), bias (C) */
    void *n2, *n2b; /* (C): post_attention_layernorm / ln_2 weight; ln_2 bias */
    void *wup;      /* Llama (2F, C): gate_proj | up_proj; GPT-2 c_fc (C, 4C) */
    void *bup;      /* (4C) GPT-2 */
    void *wdown;    /* Llama (C, F); GPT-2 mlp.c_proj (4C, C) */
    void *bdown;    /* (C) GPT-2 */
    void *k, *v;    /* the cache: (capacity, NKV hd) bf16 each */
} cu_layer_t;

typedef struct cu_dec {
    bool gpt2;
    gpt2_config_t gc;
    llama_config_t lc;
    int L, C, NH, NKV, hd, Q, KV, QKV; /* Q = NH hd, KV = NKV hd, QKV = Q + 2 KV */
    int F;                             /* the MLP's width: Llama's F, GPT-2's 4C */
    int V, Vp;                         /* vocabulary; Vp: V rounded up to 64, the logits' row */
    int R;                             /* rows of the activations: min(capacity, CHUNK) */
    float eps;                         /* rms_norm_eps (Llama) */
    cudaStream_t stream;
    nn_cuda_t *h;
    void *ws;                  /* nn_cuda_workspace_bytes(max_cols) */
    void *wmem, *kvmem, *amem; /* the allocations: weights, cache, activations */
    void *embed;               /* (V, C): embed_tokens / wte */
    void *wpe;                 /* (maxT, C) GPT-2 */
    void *head;                /* (V, C): lm_head, or embed when tied (GPT-2: wte) */
    void *nf, *nfb;            /* (C): model.norm / ln_f weight; ln_f bias */
    cu_layer_t *layers;        /* (L) */
    float *inv_freq;           /* (hd/2) f32, Llama's RoPE */
    /* activations, R rows (bf16 unless said) */
    void *x, *ln, *qkv, *att, *o; /* (R,C) (R,C) (R,QKV) (R,Q) (R,C) */
    void *mlp, *hid;              /* Llama gu (R,2F), h (R,F); GPT-2 fc (R,4C), pre (R,4C) */
    float *s1, *s2;               /* (R) f32: rstd (Llama); mean, rstd (GPT-2) */
    int32_t *tok;                 /* (R) int32 */
    void *logits;                 /* (Vp) bf16 */
    float *logits32;              /* (V) f32 */
} cu_dec_t;

static int cu_ok(cudaError_t e, const char *what, bmt_error_t *err)
{
    return e == cudaSuccess ? 0 : nn_fail(err, "cuda: %s: %s", what, cudaGetErrorString(e));
}

/* The next `bytes` of an allocation laid out in ALIGN steps: base + *at, or
 * NULL while sizing it (base NULL). */
static void *take(char *base, size_t *at, size_t bytes)
{
    void *p = base ? base + *at : NULL;
    *at += (bytes + ALIGN - 1) / ALIGN * ALIGN;
    return p;
}

/* The weights' places in one allocation at base (NULL: only their size). */
static size_t lay_weights(cu_dec_t *m, char *base)
{
    const size_t C = (size_t)m->C, V = (size_t)m->V, F = (size_t)m->F, e = 2; /* bf16 */
    size_t at = 0;
    m->embed = take(base, &at, V * C * e);
    m->head = m->embed;
    if (m->gpt2)
        m->wpe = take(base, &at, (size_t)m->gc.max_seq_len * C * e);
    else if (!m->lc.tied)
        m->head = take(base, &at, V * C * e);
    m->nf = take(base, &at, C * e);
    if (m->gpt2)
        m->nfb = take(base, &at, C * e);
    for (int l = 0; l < m->L; l++) {
        cu_layer_t *y = &m->layers[l];
        y->n1 = take(base, &at, C * e);
        y->wqkv = take(base, &at, (size_t)m->QKV * C * e);
        y->wo = take(base, &at, C * m->Q * e);
        y->n2 = take(base, &at, C * e);
        y->wup = take(base, &at, (m->gpt2 ? F : 2 * F) * C * e); /* (C, 4C) or (2F, C) */
        y->wdown = take(base, &at, C * F * e);
        if (m->gpt2) {
            y->n1b = take(base, &at, C * e);
            y->bqkv = take(base, &at, 3 * C * e);
            y->bo = take(base, &at, C * e);
            y->n2b = take(base, &at, C * e);
            y->bup = take(base, &at, F * e);
            y->bdown = take(base, &at, C * e);
        }
    }
    return at;
}

/* The cache's places: per layer k then v, (capacity, KV) each. */
static size_t lay_cache(cu_dec_t *m, char *base, int capacity)
{
    size_t at = 0;
    for (int l = 0; l < m->L; l++) {
        m->layers[l].k = take(base, &at, (size_t)capacity * m->KV * 2);
        m->layers[l].v = take(base, &at, (size_t)capacity * m->KV * 2);
    }
    return at;
}

/* The activations' places (R rows), RoPE's frequencies and the logits. */
static size_t lay_acts(cu_dec_t *m, char *base)
{
    const size_t R = (size_t)m->R, C = (size_t)m->C, e = 2;
    size_t at = 0;
    m->x = take(base, &at, R * C * e);
    m->ln = take(base, &at, R * C * e);
    m->qkv = take(base, &at, R * m->QKV * e);
    m->att = take(base, &at, R * m->Q * e);
    m->o = take(base, &at, R * C * e);
    m->mlp = take(base, &at, R * (m->gpt2 ? m->F : 2 * m->F) * e);
    m->hid = take(base, &at, R * m->F * e);
    m->s1 = take(base, &at, R * 4);
    m->s2 = take(base, &at, R * 4);
    m->tok = take(base, &at, R * 4);
    m->logits = take(base, &at, (size_t)m->Vp * e);
    m->logits32 = take(base, &at, (size_t)m->V * 4);
    m->inv_freq = m->gpt2 ? NULL : take(base, &at, (size_t)m->hd / 2 * 4);
    return at;
}

static int alloc(void **p, size_t bytes, const char *what, bmt_error_t *err)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess)
        return 0;
    *p = NULL;
    return nn_fail(err, "cuda: %.2f GiB for the %s: %s", bytes / 1073741824.0, what,
                   cudaGetErrorString(e));
}

/* Tensor t of st read as bf16 into dst (device), in pieces of at most STAGE
 * elements through stage (host). */
static int upload(cu_dec_t *m, bmt_st_t *st, const gen_tensor_t *t, void *dst, uint16_t *stage,
                  bmt_error_t *err)
{
    for (int64_t first = 0; first < t->numel; first += STAGE) {
        const int64_t count = t->numel - first < STAGE ? t->numel - first : STAGE;
        if (bmt_st_read(st, t->index, first, count, stage, BMT_BF16, err) < 0 ||
            cu_ok(cudaMemcpyAsync((char *)dst + first * 2, stage, (size_t)count * 2,
                                  cudaMemcpyHostToDevice, m->stream),
                  "copying the weights to the device", err) < 0 ||
            cu_ok(cudaStreamSynchronize(m->stream), "copying the weights to the device", err) < 0)
            return -1;
    }
    return 0;
}

/* Every tensor of the model found and checked (weights.h), then read into its
 * place: list entry j goes to dst[j] (NULL: not wanted). */
static int load(cu_dec_t *m, bmt_st_t *st, const char *dir, bmt_error_t *err)
{
    int n = 0;
    gen_tensor_t *w =
        m->gpt2 ? gen_gpt2_tensors(&m->gc, &n, err) : gen_llama_tensors(st, dir, &m->lc, &n, err);
    void **dst = w ? calloc((size_t)n, sizeof(void *)) : NULL;
    uint16_t *stage = w ? malloc((size_t)STAGE * 2) : NULL;
    int rc = w == NULL ? -1 : dst && stage ? 0 : nn_fail(err, "out of memory");
    if (rc == 0)
        rc = gen_tensors_find(st, dir, w, n, err);
    const size_t C = (size_t)m->C, e = 2;
    if (rc == 0 && m->gpt2) {
        dst[GEN_G_WTE] = m->embed, dst[GEN_G_WPE] = m->wpe;
        dst[GEN_G_LNF_W] = m->nf, dst[GEN_G_LNF_B] = m->nfb;
        for (int l = 0; l < m->L; l++) {
            const cu_layer_t *y = &m->layers[l];
            void **p = &dst[GEN_G_GLOBALS + l * GEN_G_LAYER_COUNT];
            p[GEN_G_LN1_W] = y->n1, p[GEN_G_LN1_B] = y->n1b;
            p[GEN_G_ATTN_W] = y->wqkv, p[GEN_G_ATTN_B] = y->bqkv;
            p[GEN_G_APROJ_W] = y->wo, p[GEN_G_APROJ_B] = y->bo;
            p[GEN_G_LN2_W] = y->n2, p[GEN_G_LN2_B] = y->n2b;
            p[GEN_G_FC_W] = y->wup, p[GEN_G_FC_B] = y->bup;
            p[GEN_G_MPROJ_W] = y->wdown, p[GEN_G_MPROJ_B] = y->bdown;
        }
    } else if (rc == 0) {
        dst[GEN_L_EMBED] = m->embed, dst[GEN_L_NORM] = m->nf;
        dst[GEN_L_HEAD] = m->lc.tied ? NULL : m->head;
        for (int l = 0; l < m->L; l++) {
            const cu_layer_t *y = &m->layers[l];
            void **p = &dst[GEN_L_GLOBALS + l * GEN_L_LAYER_COUNT];
            p[GEN_L_IN_NORM] = y->n1;
            p[GEN_L_Q] = y->wqkv; /* stacked: the rows of q, then k's, then v's */
            p[GEN_L_K] = (char *)y->wqkv + (size_t)m->Q * C * e;
            p[GEN_L_V] = (char *)y->wqkv + (size_t)(m->Q + m->KV) * C * e;
            p[GEN_L_O] = y->wo;
            p[GEN_L_POST_NORM] = y->n2;
            p[GEN_L_GATE] = y->wup; /* stacked: gate's rows, then up's */
            p[GEN_L_UP] = (char *)y->wup + (size_t)m->F * C * e;
            p[GEN_L_DOWN] = y->wdown;
        }
    }
    for (int j = 0; rc == 0 && j < n; j++)
        if (w[j].name[0] != '\0' && dst[j] != NULL)
            rc = upload(m, st, &w[j], dst[j], stage, err);
    free(w);
    free(dst);
    free(stage);
    return rc;
}

/* ------------------------------------------------------------ the forward */

/* The chunk's rows of qkv (rows of them): their keys and values into the
 * cache at positions p0.. (k at column koff of each row, v after it). */
static int to_cache(cu_dec_t *m, const cu_layer_t *y, int p0, int rows, size_t koff,
                    bmt_error_t *err)
{
    const size_t w = (size_t)m->KV * 2, pitch = (size_t)m->QKV * 2;
    const char *k = (const char *)m->qkv + koff * 2, *v = k + w;
    if (cu_ok(cudaMemcpy2DAsync((char *)y->k + (size_t)p0 * w, w, k, pitch, w, (size_t)rows,
                                cudaMemcpyDeviceToDevice, m->stream),
              "keys into the cache", err) < 0)
        return -1;
    return cu_ok(cudaMemcpy2DAsync((char *)y->v + (size_t)p0 * w, w, v, pitch, w, (size_t)rows,
                                   cudaMemcpyDeviceToDevice, m->stream),
                 "values into the cache", err);
}

/* x (r rows at positions p0..) through a Llama layer. */
static int llama_layer(cu_dec_t *m, const cu_layer_t *y, int p0, int r, bmt_error_t *err)
{
    nn_cuda_t *h = m->h;
    const int C = m->C, F = m->F, QKV = m->QKV;
    const size_t NC = (size_t)r * C;
    if (nn_cuda_rmsnorm_forward(h, m->ln, m->s1, m->x, y->n1, r, C, m->eps, err) < 0 ||
        nn_cuda_matmul_forward(h, m->qkv, QKV, m->ln, y->wqkv, NULL, r, C, QKV, 1, err) < 0 ||
        nn_cuda_rope_forward(h, m->qkv, m->inv_freq, 1, r, m->NH, m->NKV, m->hd, p0, err) < 0 ||
        to_cache(m, y, p0, r, (size_t)m->Q, err) < 0 ||
        nn_cuda_attention_cached(h, m->att, m->qkv, QKV, y->k, y->v, p0, r, m->NH, m->NKV, m->hd,
                                 err) < 0)
        return -1;
    if (nn_cuda_matmul_forward(h, m->o, C, m->att, y->wo, NULL, r, m->Q, C, 1, err) < 0 ||
        nn_cuda_residual_forward(h, m->x, m->x, m->o, NC, err) < 0)
        return -1;
    if (nn_cuda_rmsnorm_forward(h, m->ln, m->s1, m->x, y->n2, r, C, m->eps, err) < 0 ||
        nn_cuda_matmul_forward(h, m->mlp, 2 * F, m->ln, y->wup, NULL, r, C, 2 * F, 1, err) < 0 ||
        nn_cuda_swiglu_forward(h, m->hid, m->mlp, r, F, err) < 0 ||
        nn_cuda_matmul_forward(h, m->o, C, m->hid, y->wdown, NULL, r, F, C, 1, err) < 0)
        return -1;
    return nn_cuda_residual_forward(h, m->x, m->x, m->o, NC, err);
}

/* x (r rows at positions p0..) through a GPT-2 layer. */
static int gpt2_layer(cu_dec_t *m, const cu_layer_t *y, int p0, int r, bmt_error_t *err)
{
    nn_cuda_t *h = m->h;
    const int C = m->C, F = m->F;
    const size_t NC = (size_t)r * C;
    if (nn_cuda_layernorm_forward(h, m->ln, m->s1, m->s2, m->x, y->n1, y->n1b, r, C, err) < 0 ||
        nn_cuda_matmul_forward(h, m->qkv, 3 * C, m->ln, y->wqkv, y->bqkv, r, C, 3 * C, 0, err) <
            0 ||
        to_cache(m, y, p0, r, (size_t)C, err) < 0 ||
        nn_cuda_attention_cached(h, m->att, m->qkv, 3 * C, y->k, y->v, p0, r, m->NH, m->NH, m->hd,
                                 err) < 0)
        return -1;
    if (nn_cuda_matmul_forward(h, m->o, C, m->att, y->wo, y->bo, r, C, C, 0, err) < 0 ||
        nn_cuda_residual_forward(h, m->x, m->x, m->o, NC, err) < 0)
        return -1;
    if (nn_cuda_layernorm_forward(h, m->ln, m->s1, m->s2, m->x, y->n2, y->n2b, r, C, err) < 0 ||
        nn_cuda_matmul_gelu_forward(h, m->mlp, m->hid, m->ln, y->wup, y->bup, r, C, F, err) < 0 ||
        nn_cuda_matmul_forward(h, m->o, C, m->mlp, y->wdown, y->bdown, r, F, C, 0, err) < 0)
        return -1;
    return nn_cuda_residual_forward(h, m->x, m->x, m->o, NC, err);
}

static int cu_forward(gen_decoder_t *d, const int32_t *tokens, int n, float *logits,
                      bmt_error_t *err)
{
    cu_dec_t *m = d->impl;
    nn_cuda_t *h = m->h;
    const int C = m->C;
    for (int c0 = 0; c0 < n; c0 += CHUNK) {
        const int r = n - c0 < CHUNK ? n - c0 : CHUNK, p0 = d->pos + c0;
        if (cu_ok(cudaMemcpyAsync(m->tok, tokens + c0, (size_t)r * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, m->stream),
                  "copying the tokens to the device", err) < 0)
            return -1;
        const void *wpe = m->gpt2 ? (const char *)m->wpe + (size_t)p0 * C * 2 : NULL;
        if (nn_cuda_encoder_forward(h, m->x, m->tok, m->embed, wpe, 1, r, C, err) < 0)
            return -1;
        for (int l = 0; l < m->L; l++)
            if ((m->gpt2 ? gpt2_layer(m, &m->layers[l], p0, r, err)
                         : llama_layer(m, &m->layers[l], p0, r, err)) < 0)
                return -1;
    }
    /* The head, on the last row: logits = norm(x) head^T. */
    const int last = (n - 1) % CHUNK;
    const void *xl = (const char *)m->x + (size_t)last * C * 2;
    if ((m->gpt2 ? nn_cuda_layernorm_forward(h, m->ln, m->s1, m->s2, xl, m->nf, m->nfb, 1, C, err)
                 : nn_cuda_rmsnorm_forward(h, m->ln, m->s1, xl, m->nf, 1, C, m->eps, err)) < 0 ||
        nn_cuda_matmul_forward(h, m->logits, m->Vp, m->ln, m->head, NULL, 1, C, m->V, 1, err) < 0 ||
        nn_cuda_to_f32(h, m->logits32, m->logits, 1, m->V, m->Vp, err) < 0 ||
        cu_ok(cudaMemcpyAsync(logits, m->logits32, (size_t)m->V * sizeof(float),
                              cudaMemcpyDeviceToHost, m->stream),
              "copying the logits to the host", err) < 0)
        return -1;
    /* Errors inside the kernels of this call show here. */
    return cu_ok(cudaStreamSynchronize(m->stream), "the forward", err);
}

static void cu_destroy(gen_decoder_t *d)
{
    cu_dec_t *m = d->impl;
    if (m == NULL)
        return;
    if (m->stream)
        cudaStreamSynchronize(m->stream); /* nothing may still run on what is freed */
    nn_cuda_destroy(m->h);
    cudaFree(m->ws);
    cudaFree(m->wmem);
    cudaFree(m->kvmem);
    cudaFree(m->amem);
    if (m->stream)
        cudaStreamDestroy(m->stream);
    free(m->layers);
    free(m);
}

static const gen_decoder_ops_t CUDA_OPS = { cu_forward, cu_destroy };

/* The model's sizes from its config (the trainers' parsers, as the CPU
 * decoder reads it), checked against what the kernels take. */
static int sizes(cu_dec_t *m, const char *dir, const gen_model_info_t *info, int capacity,
                 bmt_error_t *err)
{
    m->gpt2 = strcmp(info->model_type, "gpt2") == 0;
    if (m->gpt2) {
        if (gpt2_config_from_file(dir, 0, &m->gc, err) < 0)
            return -1;
        m->L = m->gc.n_layer, m->C = m->gc.n_embd, m->NH = m->NKV = m->gc.n_head;
        m->hd = m->C / m->NH, m->F = 4 * m->C, m->V = m->gc.vocab_size;
    } else {
        if (llama_config_from_file(dir, &m->lc, err) < 0)
            return -1;
        m->L = m->lc.n_layer, m->C = m->lc.n_embd, m->NH = m->lc.n_head;
        m->NKV = m->lc.n_kv_head, m->hd = m->lc.head_dim, m->F = m->lc.ffn;
        m->V = m->lc.vocab_size, m->eps = (float)m->lc.rms_eps; /* as examples/llama/model.c */
    }
    m->Q = m->NH * m->hd, m->KV = m->NKV * m->hd, m->QKV = m->Q + 2 * m->KV;
    m->Vp = (m->V + 63) / 64 * 64;
    m->R = capacity < CHUNK ? capacity : CHUNK;
    if (m->hd > MAX_HD)
        return nn_fail(err,
                       "%s: head size %d: the CUDA decoder's attention takes head sizes up to %d "
                       "(use --device cpu)",
                       dir, m->hd, MAX_HD);
    return 0;
}

/* The device, the stream and the handle, the allocations, the weights. */
static int cu_open(gen_decoder_t *d, const char *dir, bmt_st_t *st, bmt_error_t *err)
{
    cu_dec_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return nn_fail(err, "out of memory");
    d->impl = m;
    if (sizes(m, dir, &d->info, d->capacity, err) < 0)
        return -1;
    if ((m->layers = calloc((size_t)m->L, sizeof(*m->layers))) == NULL)
        return nn_fail(err, "out of memory");
    int max_cols = m->C > m->QKV ? m->C : m->QKV; /* as the trainer sizes its workspace */
    max_cols = 2 * m->F > max_cols ? 2 * m->F : max_cols;
    if (cu_ok(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreate",
              err) < 0 ||
        alloc(&m->ws, nn_cuda_workspace_bytes(max_cols), "workspace", err) < 0 ||
        (m->h = nn_cuda_create(m->stream, m->ws, max_cols, err)) == NULL ||
        alloc(&m->wmem, lay_weights(m, NULL), "weights (bf16)", err) < 0 ||
        alloc(&m->kvmem, lay_cache(m, NULL, d->capacity), "KV cache (bf16)", err) < 0 ||
        alloc(&m->amem, lay_acts(m, NULL), "activations", err) < 0)
        return -1;
    lay_weights(m, m->wmem);
    lay_cache(m, m->kvmem, d->capacity);
    lay_acts(m, m->amem);
    if (load(m, st, dir, err) < 0)
        return -1;
    if (!m->gpt2) { /* RoPE's frequencies, as the CPU decoder takes them */
        const llama_config_t *c = &m->lc;
        float *f = malloc((size_t)m->hd / 2 * sizeof(float));
        if (f == NULL)
            return nn_fail(err, "out of memory");
        const nn_rope_scaling_t s = { c->rope_factor, c->rope_low_freq_factor,
                                      c->rope_high_freq_factor, c->rope_original_max };
        nn_rope_freqs(f, m->hd, c->rope_theta, c->rope_llama3 ? &s : NULL);
        int rc = cu_ok(cudaMemcpyAsync(m->inv_freq, f, (size_t)m->hd / 2 * sizeof(float),
                                       cudaMemcpyHostToDevice, m->stream),
                       "copying RoPE's frequencies", err);
        if (rc == 0)
            rc = cu_ok(cudaStreamSynchronize(m->stream), "copying RoPE's frequencies", err);
        free(f);
        if (rc < 0)
            return -1;
    }
    return 0;
}

gen_decoder_t *gen_decoder_open_cuda(const char *dir, int capacity, bmt_error_t *err)
{
    gen_model_info_t info;
    if (gen_model_info_cache(dir, capacity, &info, err) < 0)
        return NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        nn_fail(err, "--device cuda: no CUDA device (%s)",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
        return NULL;
    }
    struct cudaDeviceProp prop;
    if (cu_ok(cudaSetDevice(0), "cudaSetDevice(0)", err) < 0 ||
        cu_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", err) < 0)
        return NULL;
    gen_decoder_t *d = calloc(1, sizeof(*d));
    bmt_st_t *st = d ? bmt_st_open(dir, err) : NULL;
    if (d == NULL)
        nn_fail(err, "out of memory");
    int rc = st ? 0 : -1;
    if (rc == 0) {
        d->info = info;
        d->capacity = capacity;
        d->ops = &CUDA_OPS;
        const size_t len = strlen(d->info.summary);
        snprintf(d->info.summary + len, sizeof(d->info.summary) - len, "; cuda: %s, bf16",
                 prop.name);
        rc = cu_open(d, dir, st, err);
    }
    bmt_st_close(st);
    if (rc < 0) {
        gen_decoder_destroy(d);
        return NULL;
    }
    return d;
}

#endif
