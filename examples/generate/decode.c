/* examples/generate/decode.c — the CPU decoders of GPT-2 and the Llama family
 * (see decode.h).
 *
 * Layer: an example above libbmt (the safetensors reader), nn/ (the layers)
 * and the models' configuration parsers (examples/gpt2/model.h,
 * examples/llama/config.h); it uses none of the engine: one process holds the
 * whole model in f32. The tensors and their checks are weights.h's.
 *
 * A forward over n tokens runs in chunks of at most CHUNK rows, each through
 * every layer: a row's arithmetic does not depend on the other rows of its
 * chunk (the nn products and norms work row by row, nn_attention_cached
 * reads the cache), so the prompt in one prefill, in chunks, or token by
 * token, and a recompute without the cache (generate --no-cache), give the
 * same bits. Keys and values go into the cache as they are made (Llama's
 * keys after RoPE), and attention reads positions 0..p for the query at p.
 * Only the last row reaches the final norm and the head: a decoder needs the
 * next token's logits only.
 */
#include "decode.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bmt/safetensors.h"
#include "gpt2/model.h"
#include "llama/config.h"
#include "nn/hfjson.h"
#include "nn/llama_ops_cpu.h"
#include "nn/ops_cpu.h"
#include "weights.h"

enum {
    CHUNK = 64 /* rows of a forward computed together */
};

/* ------------------------------------------------------------ config.json */

/* eos_token_id: an id, a list of ids, null or absent: then dflt, the default
 * of the config class cls that from_pretrained builds (GPT2Config's 50256,
 * LlamaConfig's and MistralConfig's 2), when it is a token of the vocabulary. */
static int eos_ids(const char *text, const char *file, int V, int dflt, const char *cls,
                   gen_model_info_t *info, bmt_error_t *err)
{
    json_t *root = json_loads(text, 0, NULL); /* parsed and checked by the model's parser */
    const json_t *v = root ? json_object_get(root, "eos_token_id") : NULL;
    int rc = 0;
    info->n_eos = 0;
    snprintf(info->eos_from, sizeof(info->eos_from), "config.json's eos_token_id");
    if (v == NULL) {
        char why[48] = "";
        if (dflt >= V)
            snprintf(why, sizeof(why), "; %d is outside the vocabulary", dflt);
        snprintf(info->eos_from, sizeof(info->eos_from),
                 "%s's default (config.json has no eos_token_id%s)", cls, why);
        if (dflt < V)
            info->eos[info->n_eos++] = dflt;
    } else if (json_is_integer(v) || json_is_array(v)) {
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        if (n > GEN_MAX_EOS)
            rc =
                nn_fail(err, "%s: eos_token_id lists %zu tokens; at most %d", file, n, GEN_MAX_EOS);
        for (size_t i = 0; rc == 0 && i < n; i++) {
            const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= V)
                rc = nn_fail(err, "%s: eos_token_id %s is not a token of the vocabulary [0, %d)",
                             file, nn_json_show(e).s, V);
            else
                info->eos[info->n_eos++] = (int)json_integer_value(e);
        }
    } else if (!json_is_null(v))
        rc = nn_hf_wrong_type(err, file, "eos_token_id", "an integer, a list or null", v);
    json_decref(root);
    return rc;
}

int gen_model_info(const char *dir, gen_model_info_t *info, bmt_error_t *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return nn_fail(err, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return nn_fail(err, "%s: not a directory: give the model's directory", dir);
    char file[4096], *text = NULL;
    if (nn_hf_config_path(dir, file, sizeof(file), err) < 0 ||
        nn_hf_config_read(file, &text, err) < 0)
        return -1;
    if (text == NULL)
        return nn_fail(err, "%s: no such file: a model directory needs its config.json", file);

    gen_model_info_t in;
    memset(&in, 0, sizeof(in));
    json_t *root = nn_hf_json_load(text, file, err);
    const json_t *mt = root ? json_object_get(root, "model_type") : NULL;
    int rc = 0;
    if (root == NULL)
        rc = -1;
    else if (mt == NULL || !json_is_string(mt))
        rc = nn_fail(err, "%s: no model_type: generate runs \"gpt2\", \"llama\" and \"mistral\"",
                     file);
    else if (strcmp(json_string_value(mt), "gpt2") != 0 &&
             strcmp(json_string_value(mt), "llama") != 0 &&
             strcmp(json_string_value(mt), "mistral") != 0)
        rc = nn_hf_unsupported(err, file, "model_type", mt,
                               "\"gpt2\", \"llama\", \"mistral\" (the models generate runs)");
    else
        snprintf(in.model_type, sizeof(in.model_type), "%s", json_string_value(mt));
    json_decref(root);

    if (rc == 0 && strcmp(in.model_type, "gpt2") == 0) {
        gpt2_config_t c;
        rc = gpt2_config_from_file(dir, 0, &c, err);
        if (rc == 0) {
            in.vocab_size = c.vocab_size;
            in.max_positions = c.max_seq_len;
            snprintf(in.summary, sizeof(in.summary), "L %d, H %d, C %d, V %d, maxT %d", c.n_layer,
                     c.n_head, c.n_embd, c.vocab_size, c.max_seq_len);
            /* GPT2Config's default is 50256 (<|endoftext|>), as from_pretrained
             * takes it; in a smaller vocabulary it is no token. */
            rc = eos_ids(text, file, c.vocab_size, 50256, "GPT2Config", &in, err);
        }
    } else if (rc == 0) {
        llama_config_t c;
        rc = llama_config_from_file(dir, &c, err);
        if (rc == 0) {
            in.vocab_size = c.vocab_size;
            in.max_positions = c.max_seq_len;
            snprintf(in.summary, sizeof(in.summary),
                     "L %d, H %d, KV %d, hd %d, C %d, F %d, V %d, maxT %d, %s", c.n_layer, c.n_head,
                     c.n_kv_head, c.head_dim, c.n_embd, c.ffn, c.vocab_size, c.max_seq_len,
                     c.tied ? "tied" : "untied");
            /* LlamaConfig and MistralConfig default to 2 as well: an absent
             * eos_token_id is that, not none, in HF's generate() */
            rc = eos_ids(text, file, c.vocab_size, 2,
                         strcmp(in.model_type, "mistral") == 0 ? "MistralConfig" : "LlamaConfig",
                         &in, err);
        }
    }
    /* generation_config.json, when there is one, decides the end of a
     * sequence, as transformers' generate() has it (gencfg.h) */
    gen_gencfg_t g;
    if (rc == 0 && (rc = gen_gencfg_read(dir, in.vocab_size, &g, err)) == 0 && g.present) {
        in.n_eos = g.n_eos;
        memcpy(in.eos, g.eos, sizeof(in.eos));
        snprintf(in.eos_from, sizeof(in.eos_from), "%s%s", GEN_GENCFG_NAME,
                 g.eos_given ? "'s eos_token_id"
                             : ", which has no eos_token_id (config.json's is not used)");
        snprintf(in.sampling, sizeof(in.sampling), "%s", g.sampling);
        snprintf(in.sampling_from, sizeof(in.sampling_from), "%s", GEN_GENCFG_NAME);
    } else if (rc == 0 && (rc = gen_gencfg_parse_model(text, file, in.n_eos, &g, err)) == 0) {
        /* without the file, HF's generation config is made from config.json,
         * its generation settings (a legacy repetition_penalty, ...) included */
        snprintf(in.sampling, sizeof(in.sampling), "%s", g.sampling);
        snprintf(in.sampling_from, sizeof(in.sampling_from), "config.json");
    }
    free(text);
    if (rc == 0)
        *info = in;
    return rc;
}

/* ------------------------------------------------------------ weights */

/* Each wanted tensor of list (found by gen_tensors_find) read whole as f32
 * into *dst[i], malloc'd; -1 and err at the first that fails. The buffers
 * made so far are the caller's to free (every *dst starts NULL). */
static int read_f32(bmt_st_t *st, const gen_tensor_t *list, int n, float **const *dst,
                    bmt_error_t *err)
{
    for (int j = 0; j < n; j++) {
        if (list[j].name[0] == '\0') /* not wanted */
            continue;
        const bmt_st_tensor_t *t = bmt_st_tensor(st, list[j].index);
        if ((*dst[j] = malloc((size_t)t->numel * sizeof(float))) == NULL)
            return nn_fail(err, "out of memory for tensor '%s' (%lld floats)", t->name,
                           (long long)t->numel);
        if (bmt_st_read(st, list[j].index, 0, t->numel, *dst[j], BMT_F32, err) < 0)
            return -1;
    }
    return 0;
}

/* What every CPU decoder has: its cache and attention scratch. */
typedef struct kv_cache {
    int L, width;    /* layers; floats per position of k (and of v): NKV hd */
    float **k, **v;  /* (L) x (capacity, width) */
    double *scratch; /* (capacity + hd): nn_attention_cached's */
} kv_cache_t;

static int cache_alloc(kv_cache_t *c, int L, int capacity, int width, int hd, bmt_error_t *err)
{
    c->L = L;
    c->width = width;
    c->k = calloc((size_t)L, sizeof(float *));
    c->v = calloc((size_t)L, sizeof(float *));
    c->scratch = malloc(((size_t)capacity + hd) * sizeof(double));
    bool ok = c->k && c->v && c->scratch;
    for (int l = 0; ok && l < L; l++)
        ok = (c->k[l] = malloc((size_t)capacity * width * sizeof(float))) != NULL &&
             (c->v[l] = malloc((size_t)capacity * width * sizeof(float))) != NULL;
    return ok ? 0
              : nn_fail(err, "out of memory for the KV cache (%d layers x %d positions x 2 x %d)",
                        L, capacity, width);
}

static void cache_free(kv_cache_t *c)
{
    for (int l = 0; c->k && l < c->L; l++)
        free(c->k[l]);
    for (int l = 0; c->v && l < c->L; l++)
        free(c->v[l]);
    free(c->k);
    free(c->v);
    free(c->scratch);
}

/* ------------------------------------------------------------ GPT-2 */

typedef struct gpt2_dec {
    gpt2_config_t cfg;
    float *wte, *wpe, *lnf_w, *lnf_b; /* (V,C), (maxT,C), (C), (C) */
    float *(*p)[GEN_G_LAYER_COUNT];   /* (L) layers */
    kv_cache_t cache;
    /* scratch, CHUNK rows */
    float *x, *ln, *qkv, *att, *proj, *fc; /* (R,C) (R,C) (R,3C) (R,C) (R,C) (R,4C) */
    float *mean, *rstd;                    /* (R) */
} gpt2_dec_t;

static int gpt2_forward(gen_decoder_t *d, const int32_t *tokens, int n, float *logits,
                        bmt_error_t *err)
{
    (void)err;
    gpt2_dec_t *g = d->impl;
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, hs = C / NH, V = g->cfg.vocab_size;
    for (int c0 = 0; c0 < n; c0 += CHUNK) {
        const int m = n - c0 < CHUNK ? n - c0 : CHUNK, p0 = d->pos + c0;
        nn_encoder_forward(g->x, tokens + c0, g->wte, g->wpe + (size_t)p0 * C, 1, m, C);
        for (int l = 0; l < g->cfg.n_layer; l++) {
            float *const *p = g->p[l];
            float *kc = g->cache.k[l], *vc = g->cache.v[l];
            nn_layernorm_forward(g->ln, g->mean, g->rstd, g->x, p[GEN_G_LN1_W], p[GEN_G_LN1_B], m,
                                 C);
            nn_conv1d_forward(g->qkv, g->ln, p[GEN_G_ATTN_W], p[GEN_G_ATTN_B], m, C, 3 * C, 0);
            for (int i = 0; i < m; i++) { /* [q | k | v]: k and v into the cache */
                const float *row = g->qkv + (size_t)i * 3 * C;
                memcpy(kc + (size_t)(p0 + i) * C, row + C, (size_t)C * sizeof(float));
                memcpy(vc + (size_t)(p0 + i) * C, row + 2 * C, (size_t)C * sizeof(float));
            }
            nn_attention_cached(g->att, g->qkv, 3 * C, kc, vc, p0, m, NH, NH, hs, g->cache.scratch);
            nn_conv1d_forward(g->proj, g->att, p[GEN_G_APROJ_W], p[GEN_G_APROJ_B], m, C, C, 0);
            nn_residual_forward(g->x, g->x, g->proj, m * C);
            nn_layernorm_forward(g->ln, g->mean, g->rstd, g->x, p[GEN_G_LN2_W], p[GEN_G_LN2_B], m,
                                 C);
            nn_conv1d_forward(g->fc, g->ln, p[GEN_G_FC_W], p[GEN_G_FC_B], m, C, 4 * C, 0);
            nn_gelu_forward(g->fc, g->fc, m * 4 * C);
            nn_conv1d_forward(g->proj, g->fc, p[GEN_G_MPROJ_W], p[GEN_G_MPROJ_B], m, 4 * C, C, 0);
            nn_residual_forward(g->x, g->x, g->proj, m * C);
        }
        if (c0 + m == n) { /* the head, on the last row: logits = ln_f(x) wte^T */
            const float *last = g->x + (size_t)(m - 1) * C;
            nn_layernorm_forward(g->ln, g->mean, g->rstd, last, g->lnf_w, g->lnf_b, 1, C);
            nn_conv1d_forward(logits, g->ln, g->wte, NULL, 1, C, V, 1);
        }
    }
    return 0;
}

static void gpt2_destroy(gen_decoder_t *d)
{
    gpt2_dec_t *g = d->impl;
    if (g == NULL)
        return;
    free(g->wte);
    free(g->wpe);
    free(g->lnf_w);
    free(g->lnf_b);
    for (int l = 0; g->p && l < g->cfg.n_layer; l++)
        for (int j = 0; j < GEN_G_LAYER_COUNT; j++)
            free(g->p[l][j]);
    free(g->p);
    cache_free(&g->cache);
    float *scratch[] = { g->x, g->ln, g->qkv, g->att, g->proj, g->fc, g->mean, g->rstd };
    for (size_t i = 0; i < sizeof(scratch) / sizeof(scratch[0]); i++)
        free(scratch[i]);
    free(g);
}

static const gen_decoder_ops_t GPT2_CPU = { gpt2_forward, gpt2_destroy };

static int gpt2_open(gen_decoder_t *d, const char *dir, bmt_st_t *st, bmt_error_t *err)
{
    gpt2_dec_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return nn_fail(err, "out of memory");
    d->impl = g;
    if (gpt2_config_from_file(dir, 0, &g->cfg, err) < 0)
        return -1;
    const int L = g->cfg.n_layer, C = g->cfg.n_embd, R = d->capacity < CHUNK ? d->capacity : CHUNK;
    int nw = 0;
    gen_tensor_t *w = gen_gpt2_tensors(&g->cfg, &nw, err);
    float ***dst = calloc((size_t)nw, sizeof(*dst));
    if (w == NULL || dst == NULL || (g->p = calloc((size_t)L, sizeof(*g->p))) == NULL) {
        free(w);
        free(dst);
        return w ? nn_fail(err, "out of memory") : -1;
    }
    dst[GEN_G_WTE] = &g->wte, dst[GEN_G_WPE] = &g->wpe;
    dst[GEN_G_LNF_W] = &g->lnf_w, dst[GEN_G_LNF_B] = &g->lnf_b;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < GEN_G_LAYER_COUNT; j++)
            dst[GEN_G_GLOBALS + l * GEN_G_LAYER_COUNT + j] = &g->p[l][j];
    int rc = gen_tensors_find(st, dir, w, nw, err) < 0 ? -1 : read_f32(st, w, nw, dst, err);
    free(w);
    free(dst);
    if (rc < 0)
        return -1;
    if (cache_alloc(&g->cache, L, d->capacity, C, C / g->cfg.n_head, err) < 0)
        return -1;
    const size_t rc_ = (size_t)R * C;
    float **bufs[] = { &g->x, &g->ln, &g->qkv, &g->att, &g->proj, &g->fc, &g->mean, &g->rstd };
    const size_t n[] = { rc_, rc_, 3 * rc_, rc_, rc_, 4 * rc_, (size_t)R, (size_t)R };
    _Static_assert(sizeof(n) / sizeof(n[0]) == sizeof(bufs) / sizeof(bufs[0]), "a size per buffer");
    for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++)
        if ((*bufs[i] = malloc(n[i] * sizeof(float))) == NULL)
            return nn_fail(err, "out of memory");
    return 0;
}

/* ------------------------------------------------------------ Llama */

typedef struct llama_dec {
    llama_config_t cfg;
    int Q, KV;                      /* NH hd, NKV hd */
    float *embed, *norm, *head;     /* (V,C), (C), (V,C): head is embed when tied */
    float *(*p)[GEN_L_LAYER_COUNT]; /* (L) layers */
    float *inv_freq;                /* (hd/2) */
    kv_cache_t cache;               /* keys after RoPE */
    float *x, *ln, *q, *att, *o;    /* scratch (R,C) (R,C) (R,Q) (R,Q) (R,C) */
    float *gate, *up, *rstd;        /* (R,F) (R,F) (R) */
} llama_dec_t;

static int llama_forward(gen_decoder_t *d, const int32_t *tokens, int n, float *logits,
                         bmt_error_t *err)
{
    (void)err;
    llama_dec_t *m = d->impl;
    const int C = m->cfg.n_embd, F = m->cfg.ffn, NH = m->cfg.n_head, NKV = m->cfg.n_kv_head;
    const int hd = m->cfg.head_dim, Q = m->Q, KV = m->KV, V = m->cfg.vocab_size;
    const float eps = (float)m->cfg.rms_eps; /* as examples/llama/model.c */
    for (int c0 = 0; c0 < n; c0 += CHUNK) {
        const int r = n - c0 < CHUNK ? n - c0 : CHUNK, p0 = d->pos + c0;
        for (int i = 0; i < r; i++)
            memcpy(m->x + (size_t)i * C, m->embed + (size_t)tokens[c0 + i] * C,
                   (size_t)C * sizeof(float));
        for (int l = 0; l < m->cfg.n_layer; l++) {
            float *const *p = m->p[l];
            float *k = m->cache.k[l] + (size_t)p0 * KV, *v = m->cache.v[l] + (size_t)p0 * KV;
            nn_rmsnorm_forward(m->ln, m->rstd, m->x, p[GEN_L_IN_NORM], r, C, eps);
            nn_matmul_forward(m->q, m->ln, p[GEN_L_Q], r, C, Q);
            nn_matmul_forward(k, m->ln, p[GEN_L_K], r, C, KV);
            nn_matmul_forward(v, m->ln, p[GEN_L_V], r, C, KV);
            nn_rope_forward_at(m->q, m->q, m->inv_freq, p0, 1, r, NH, hd);
            nn_rope_forward_at(k, k, m->inv_freq, p0, 1, r, NKV, hd);
            nn_attention_cached(m->att, m->q, Q, m->cache.k[l], m->cache.v[l], p0, r, NH, NKV, hd,
                                m->cache.scratch);
            nn_matmul_forward(m->o, m->att, p[GEN_L_O], r, Q, C);
            nn_residual_forward(m->x, m->x, m->o, r * C);
            nn_rmsnorm_forward(m->ln, m->rstd, m->x, p[GEN_L_POST_NORM], r, C, eps);
            nn_matmul_forward(m->gate, m->ln, p[GEN_L_GATE], r, C, F);
            nn_matmul_forward(m->up, m->ln, p[GEN_L_UP], r, C, F);
            nn_swiglu_forward(m->gate, m->gate, m->up, r * F);
            nn_matmul_forward(m->o, m->gate, p[GEN_L_DOWN], r, F, C);
            nn_residual_forward(m->x, m->x, m->o, r * C);
        }
        if (c0 + r == n) { /* the head, on the last row: logits = norm(x) head^T */
            nn_rmsnorm_forward(m->ln, m->rstd, m->x + (size_t)(r - 1) * C, m->norm, 1, C, eps);
            nn_matmul_forward(logits, m->ln, m->head, 1, C, V);
        }
    }
    return 0;
}

static void llama_destroy(gen_decoder_t *d)
{
    llama_dec_t *m = d->impl;
    if (m == NULL)
        return;
    if (m->head != m->embed)
        free(m->head);
    free(m->embed);
    free(m->norm);
    for (int l = 0; m->p && l < m->cfg.n_layer; l++)
        for (int j = 0; j < GEN_L_LAYER_COUNT; j++)
            free(m->p[l][j]);
    free(m->p);
    cache_free(&m->cache);
    float *scratch[] = { m->inv_freq, m->x, m->ln, m->q, m->att, m->o, m->gate, m->up, m->rstd };
    for (size_t i = 0; i < sizeof(scratch) / sizeof(scratch[0]); i++)
        free(scratch[i]);
    free(m);
}

static const gen_decoder_ops_t LLAMA_CPU = { llama_forward, llama_destroy };

static int llama_open(gen_decoder_t *d, const char *dir, bmt_st_t *st, bmt_error_t *err)
{
    llama_dec_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return nn_fail(err, "out of memory");
    d->impl = m;
    if (llama_config_from_file(dir, &m->cfg, err) < 0)
        return -1;
    const llama_config_t *c = &m->cfg;
    const int L = c->n_layer, R = d->capacity < CHUNK ? d->capacity : CHUNK;
    const int64_t C = c->n_embd, F = c->ffn;
    m->Q = c->n_head * c->head_dim;
    m->KV = c->n_kv_head * c->head_dim;
    int nw = 0;
    gen_tensor_t *w = gen_llama_tensors(st, dir, c, &nw, err);
    float ***dst = calloc((size_t)nw, sizeof(*dst));
    if (w == NULL || dst == NULL || (m->p = calloc((size_t)L, sizeof(*m->p))) == NULL) {
        free(w);
        free(dst);
        return w ? nn_fail(err, "out of memory") : -1;
    }
    dst[GEN_L_EMBED] = &m->embed, dst[GEN_L_NORM] = &m->norm, dst[GEN_L_HEAD] = &m->head;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < GEN_L_LAYER_COUNT; j++)
            dst[GEN_L_GLOBALS + l * GEN_L_LAYER_COUNT + j] = &m->p[l][j];
    int rc = gen_tensors_find(st, dir, w, nw, err) < 0 ? -1 : read_f32(st, w, nw, dst, err);
    free(w);
    free(dst);
    if (rc < 0)
        return -1;
    if (c->tied)
        m->head = m->embed;
    if (cache_alloc(&m->cache, L, d->capacity, m->KV, c->head_dim, err) < 0)
        return -1;
    float **bufs[] = { &m->inv_freq, &m->x,    &m->ln, &m->q,   &m->att,
                       &m->o,        &m->gate, &m->up, &m->rstd };
    const size_t n[] = { (size_t)c->head_dim / 2, (size_t)R * C,    (size_t)R * C,
                         (size_t)R * m->Q,        (size_t)R * m->Q, (size_t)R * C,
                         (size_t)R * F,           (size_t)R * F,    (size_t)R };
    for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++)
        if ((*bufs[i] = malloc(n[i] * sizeof(float))) == NULL)
            return nn_fail(err, "out of memory");
    const nn_rope_scaling_t s = { c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                                  c->rope_original_max };
    nn_rope_freqs(m->inv_freq, c->head_dim, c->rope_theta, c->rope_llama3 ? &s : NULL);
    return 0;
}

/* ------------------------------------------------------------ the interface */

int gen_model_info_cache(const char *dir, int capacity, gen_model_info_t *info, bmt_error_t *err)
{
    if (gen_model_info(dir, info, err) < 0)
        return -1;
    if (capacity < 1 || capacity > info->max_positions)
        return nn_fail(err, "%s: a cache of %d positions; the model has 1 to %d", dir, capacity,
                       info->max_positions);
    return 0;
}

gen_decoder_t *gen_decoder_open_cpu(const char *dir, int capacity, bmt_error_t *err)
{
    gen_model_info_t info;
    if (gen_model_info_cache(dir, capacity, &info, err) < 0)
        return NULL;
    gen_decoder_t *d = calloc(1, sizeof(*d));
    bmt_st_t *st = d ? bmt_st_open(dir, err) : NULL;
    if (d == NULL)
        nn_fail(err, "out of memory");
    int rc = st ? 0 : -1;
    if (rc == 0) {
        d->info = info;
        d->capacity = capacity;
        const bool gpt2 = strcmp(info.model_type, "gpt2") == 0;
        d->ops = gpt2 ? &GPT2_CPU : &LLAMA_CPU;
        rc = gpt2 ? gpt2_open(d, dir, st, err) : llama_open(d, dir, st, err);
    }
    bmt_st_close(st);
    if (rc < 0) {
        gen_decoder_destroy(d);
        return NULL;
    }
    return d;
}

int gen_decoder_forward(gen_decoder_t *d, const int32_t *tokens, int n, float *logits,
                        bmt_error_t *err)
{
    if (n < 1 || d->pos + n > d->capacity)
        return nn_fail(err, "%d tokens at position %d: the cache holds %d positions", n, d->pos,
                       d->capacity);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->info.vocab_size)
            return nn_fail(err, "token %d at position %d is outside the vocabulary [0, %d)",
                           tokens[i], d->pos + i, d->info.vocab_size);
    if (d->ops->forward(d, tokens, n, logits, err) < 0)
        return -1;
    for (int i = 0; i < d->info.vocab_size; i++)
        if (!isfinite(logits[i]))
            return nn_fail(err,
                           "the logit of token %d after position %d is %g: the model's "
                           "weights or activations are not finite",
                           i, d->pos + n - 1, logits[i]);
    d->pos += n; /* the rows past pos that a failure wrote are not the cache's */
    return 0;
}

void gen_decoder_reset(gen_decoder_t *d) { d->pos = 0; }

void gen_decoder_destroy(gen_decoder_t *d)
{
    if (d == NULL)
        return;
    if (d->ops)
        d->ops->destroy(d);
    free(d);
}
