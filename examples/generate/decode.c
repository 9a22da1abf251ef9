/* examples/generate/decode.c — the CPU decoders of GPT-2 and the Llama family
 * (see decode.h).
 *
 * Layer: an example above libbmt (the safetensors reader), nn/ (the layers)
 * and the models' configuration parsers (examples/gpt2/model.h,
 * examples/llama/config.h); it uses none of the engine: one process holds the
 * whole model in f32.
 *
 * A forward over n tokens runs in chunks of at most CHUNK rows, each through
 * every layer: a row's arithmetic does not depend on the other rows of its
 * chunk (the nn products and norms work row by row, the attention below
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

enum {
    CHUNK = 64 /* rows of a forward computed together */
};

/* ------------------------------------------------------------ config.json */

/* eos_token_id: an id, a list of ids, null or absent (then dflt, when >= 0). */
static int eos_ids(const char *text, const char *file, int V, int dflt, gen_model_info_t *info,
                   bmt_error_t *err)
{
    json_t *root = json_loads(text, 0, NULL); /* parsed and checked by the model's parser */
    const json_t *v = root ? json_object_get(root, "eos_token_id") : NULL;
    int rc = 0;
    info->n_eos = 0;
    if (v == NULL) {
        if (dflt >= 0 && dflt < V)
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
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    const json_t *mt = root ? json_object_get(root, "model_type") : NULL;
    int rc = 0;
    if (root == NULL)
        rc = nn_fail(err, "%s: not valid JSON: %.60s (line %d)", file, je.text, je.line);
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
            rc = eos_ids(text, file, c.vocab_size, 50256, &in, err);
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
            in.n_eos = c.n_eos < GEN_MAX_EOS ? c.n_eos : GEN_MAX_EOS;
            memcpy(in.eos, c.eos_token_ids, (size_t)in.n_eos * sizeof(int));
        }
    }
    free(text);
    if (rc == 0)
        *info = in;
    return rc;
}

/* ------------------------------------------------------------ weights */

/* A tensor the model needs: its name(s), shape and where it goes. */
typedef struct wanted {
    char name[128]; /* as the trainer writes it */
    char alt[128];  /* another accepted name ("" none): GPT-2 without "transformer." */
    int ndim;
    int64_t shape[2];
    float **dst; /* malloc'd f32 copy of the whole tensor */
} wanted_t;

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape)
{
    out[0] = '\0';
    for (int d = 0; d < ndim; d++)
        snprintf(out + strlen(out), len - strlen(out), "%s%lld", d ? ", " : "",
                 (long long)shape[d]);
}

/* Every wanted tensor of st found and checked (name, shape, a float dtype)
 * before any is read; then each read whole as f32. -1 and err at the first
 * that is missing or differs; the buffers made so far are the caller's to free
 * (every *dst starts NULL). */
static int load_tensors(bmt_st_t *st, const char *dir, wanted_t *w, int n, bmt_error_t *err)
{
    int *idx = calloc((size_t)n, sizeof(int));
    if (idx == NULL)
        return nn_fail(err, "out of memory");
    int rc = 0;
    for (int j = 0; j < n && rc == 0; j++) {
        idx[j] = bmt_st_find(st, w[j].name);
        if (idx[j] < 0 && w[j].alt[0])
            idx[j] = bmt_st_find(st, w[j].alt);
        const bmt_st_tensor_t *t = bmt_st_tensor(st, idx[j]);
        if (t == NULL) {
            rc = w[j].alt[0]
                     ? nn_fail(err, "%s has no tensor '%s' (nor '%s')", dir, w[j].name, w[j].alt)
                     : nn_fail(err, "%s has no tensor '%s'", dir, w[j].name);
            break;
        }
        bool same = t->ndim == w[j].ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == w[j].shape[d];
        if (!same) {
            char want[64], got[200];
            shape_text(want, sizeof(want), w[j].ndim, w[j].shape);
            shape_text(got, sizeof(got), t->ndim, t->shape);
            rc = nn_fail(err, "%s: tensor '%s' is (%s); the model needs (%s)", t->file, t->name,
                         got, want);
        } else if (t->dtype != BMT_ST_F32 && t->dtype != BMT_ST_BF16 && t->dtype != BMT_ST_F16 &&
                   t->dtype != BMT_ST_F64)
            rc = nn_fail(err, "%s: tensor '%s' is %s; a float type is needed", t->file, t->name,
                         bmt_st_dtype_name(t->dtype));
    }
    for (int j = 0; j < n && rc == 0; j++) {
        const bmt_st_tensor_t *t = bmt_st_tensor(st, idx[j]);
        if ((*w[j].dst = malloc((size_t)t->numel * sizeof(float))) == NULL)
            rc = nn_fail(err, "out of memory for tensor '%s' (%lld floats)", t->name,
                         (long long)t->numel);
        else
            rc = bmt_st_read(st, idx[j], 0, t->numel, *w[j].dst, BMT_F32, err);
    }
    free(idx);
    return rc;
}

static void set_wanted(wanted_t *w, const char *name, const char *alt, int64_t d0, int64_t d1,
                       float **dst)
{
    snprintf(w->name, sizeof(w->name), "%s", name);
    snprintf(w->alt, sizeof(w->alt), "%s", alt ? alt : "");
    w->ndim = d1 ? 2 : 1;
    w->shape[0] = d0;
    w->shape[1] = d1;
    w->dst = dst;
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

/* Parameter order of a GPT-2 layer (HF names, Conv1D weights (in, out)). */
enum {
    G_LN1_W,
    G_LN1_B,
    G_ATTN_W, /* (C, 3C) */
    G_ATTN_B, /* (3C) */
    G_APROJ_W,
    G_APROJ_B,
    G_LN2_W,
    G_LN2_B,
    G_FC_W, /* (C, 4C) */
    G_FC_B,
    G_MPROJ_W, /* (4C, C) */
    G_MPROJ_B,
    G_LAYER_COUNT
};

typedef struct gpt2_dec {
    gpt2_config_t cfg;
    float *wte, *wpe, *lnf_w, *lnf_b; /* (V,C), (maxT,C), (C), (C) */
    float *(*p)[G_LAYER_COUNT];       /* (L) layers */
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
            nn_layernorm_forward(g->ln, g->mean, g->rstd, g->x, p[G_LN1_W], p[G_LN1_B], m, C);
            nn_conv1d_forward(g->qkv, g->ln, p[G_ATTN_W], p[G_ATTN_B], m, C, 3 * C, 0);
            for (int i = 0; i < m; i++) { /* [q | k | v]: k and v into the cache */
                const float *row = g->qkv + (size_t)i * 3 * C;
                memcpy(kc + (size_t)(p0 + i) * C, row + C, (size_t)C * sizeof(float));
                memcpy(vc + (size_t)(p0 + i) * C, row + 2 * C, (size_t)C * sizeof(float));
            }
            nn_attention_cached(g->att, g->qkv, 3 * C, kc, vc, p0, m, NH, NH, hs, g->cache.scratch);
            nn_conv1d_forward(g->proj, g->att, p[G_APROJ_W], p[G_APROJ_B], m, C, C, 0);
            nn_residual_forward(g->x, g->x, g->proj, m * C);
            nn_layernorm_forward(g->ln, g->mean, g->rstd, g->x, p[G_LN2_W], p[G_LN2_B], m, C);
            nn_conv1d_forward(g->fc, g->ln, p[G_FC_W], p[G_FC_B], m, C, 4 * C, 0);
            nn_gelu_forward(g->fc, g->fc, m * 4 * C);
            nn_conv1d_forward(g->proj, g->fc, p[G_MPROJ_W], p[G_MPROJ_B], m, 4 * C, C, 0);
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
        for (int j = 0; j < G_LAYER_COUNT; j++)
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
    const int64_t V = g->cfg.vocab_size, T = g->cfg.max_seq_len;
    const int nw = 4 + L * G_LAYER_COUNT;
    wanted_t *w = calloc((size_t)nw, sizeof(*w));
    if (w == NULL || (g->p = calloc((size_t)L, sizeof(*g->p))) == NULL) {
        free(w);
        return nn_fail(err, "out of memory");
    }
    set_wanted(&w[0], "transformer.wte.weight", "wte.weight", V, C, &g->wte);
    set_wanted(&w[1], "transformer.wpe.weight", "wpe.weight", T, C, &g->wpe);
    set_wanted(&w[2], "transformer.ln_f.weight", "ln_f.weight", C, 0, &g->lnf_w);
    set_wanted(&w[3], "transformer.ln_f.bias", "ln_f.bias", C, 0, &g->lnf_b);
    static const struct {
        const char *name;
        int d0, d1; /* multiples of C; 0: none */
    } ps[G_LAYER_COUNT] = {
        [G_LN1_W] = { "ln_1.weight", 1, 0 },          [G_LN1_B] = { "ln_1.bias", 1, 0 },
        [G_ATTN_W] = { "attn.c_attn.weight", 1, 3 },  [G_ATTN_B] = { "attn.c_attn.bias", 3, 0 },
        [G_APROJ_W] = { "attn.c_proj.weight", 1, 1 }, [G_APROJ_B] = { "attn.c_proj.bias", 1, 0 },
        [G_LN2_W] = { "ln_2.weight", 1, 0 },          [G_LN2_B] = { "ln_2.bias", 1, 0 },
        [G_FC_W] = { "mlp.c_fc.weight", 1, 4 },       [G_FC_B] = { "mlp.c_fc.bias", 4, 0 },
        [G_MPROJ_W] = { "mlp.c_proj.weight", 4, 1 },  [G_MPROJ_B] = { "mlp.c_proj.bias", 1, 0 },
    };
    for (int l = 0; l < L; l++)
        for (int j = 0; j < G_LAYER_COUNT; j++) {
            char name[128], alt[100];
            snprintf(alt, sizeof(alt), "h.%d.%s", l, ps[j].name);
            snprintf(name, sizeof(name), "transformer.%s", alt);
            set_wanted(&w[4 + l * G_LAYER_COUNT + j], name, alt, (int64_t)ps[j].d0 * C,
                       (int64_t)ps[j].d1 * C, &g->p[l][j]);
        }
    int rc = load_tensors(st, dir, w, nw, err);
    free(w);
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

/* Parameter order of a Llama layer (HF names; nn.Linear weights (out, in)). */
enum {
    L_IN_NORM,
    L_Q, /* (NH hd, C) */
    L_K, /* (NKV hd, C) */
    L_V,
    L_O, /* (C, NH hd) */
    L_POST_NORM,
    L_GATE, /* (F, C) */
    L_UP,
    L_DOWN, /* (C, F) */
    L_LAYER_COUNT
};

typedef struct llama_dec {
    llama_config_t cfg;
    int Q, KV;                   /* NH hd, NKV hd */
    float *embed, *norm, *head;  /* (V,C), (C), (V,C): head is embed when tied */
    float *(*p)[L_LAYER_COUNT];  /* (L) layers */
    float *inv_freq;             /* (hd/2) */
    kv_cache_t cache;            /* keys after RoPE */
    float *x, *ln, *q, *att, *o; /* scratch (R,C) (R,C) (R,Q) (R,Q) (R,C) */
    float *gate, *up, *rstd;     /* (R,F) (R,F) (R) */
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
            nn_rmsnorm_forward(m->ln, m->rstd, m->x, p[L_IN_NORM], r, C, eps);
            nn_matmul_forward(m->q, m->ln, p[L_Q], r, C, Q);
            nn_matmul_forward(k, m->ln, p[L_K], r, C, KV);
            nn_matmul_forward(v, m->ln, p[L_V], r, C, KV);
            nn_rope_forward_at(m->q, m->q, m->inv_freq, p0, 1, r, NH, hd);
            nn_rope_forward_at(k, k, m->inv_freq, p0, 1, r, NKV, hd);
            nn_attention_cached(m->att, m->q, Q, m->cache.k[l], m->cache.v[l], p0, r, NH, NKV, hd,
                                m->cache.scratch);
            nn_matmul_forward(m->o, m->att, p[L_O], r, Q, C);
            nn_residual_forward(m->x, m->x, m->o, r * C);
            nn_rmsnorm_forward(m->ln, m->rstd, m->x, p[L_POST_NORM], r, C, eps);
            nn_matmul_forward(m->gate, m->ln, p[L_GATE], r, C, F);
            nn_matmul_forward(m->up, m->ln, p[L_UP], r, C, F);
            nn_swiglu_forward(m->gate, m->gate, m->up, r * F);
            nn_matmul_forward(m->o, m->gate, p[L_DOWN], r, F, C);
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
        for (int j = 0; j < L_LAYER_COUNT; j++)
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
    const int64_t C = c->n_embd, F = c->ffn, V = c->vocab_size;
    m->Q = c->n_head * c->head_dim;
    m->KV = c->n_kv_head * c->head_dim;

    /* The file's layers must be the config's: more would be another model. */
    bmt_st_plan_t *plan = NULL;
    if (bmt_st_discover(st, &plan, err) < 0)
        return -1;
    const int nl = plan->nlayers;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s", plan->layer_prefix);
    bmt_st_plan_free(plan);
    if (nl != L)
        return nn_fail(err, "%s holds %d layers (%s<N>); config.json has %d (num_hidden_layers)",
                       dir, nl, prefix, L);

    const int nw = 2 + (c->tied ? 0 : 1) + L * L_LAYER_COUNT;
    wanted_t *w = calloc((size_t)nw, sizeof(*w));
    if (w == NULL || (m->p = calloc((size_t)L, sizeof(*m->p))) == NULL) {
        free(w);
        return nn_fail(err, "out of memory");
    }
    set_wanted(&w[0], "model.embed_tokens.weight", NULL, V, C, &m->embed);
    set_wanted(&w[1], "model.norm.weight", NULL, C, 0, &m->norm);
    if (!c->tied)
        set_wanted(&w[2], "lm_head.weight", NULL, V, C, &m->head);
    const struct {
        const char *name;
        int64_t d0, d1;
    } ps[L_LAYER_COUNT] = {
        [L_IN_NORM] = { "input_layernorm.weight", C, 0 },
        [L_Q] = { "self_attn.q_proj.weight", m->Q, C },
        [L_K] = { "self_attn.k_proj.weight", m->KV, C },
        [L_V] = { "self_attn.v_proj.weight", m->KV, C },
        [L_O] = { "self_attn.o_proj.weight", C, m->Q },
        [L_POST_NORM] = { "post_attention_layernorm.weight", C, 0 },
        [L_GATE] = { "mlp.gate_proj.weight", F, C },
        [L_UP] = { "mlp.up_proj.weight", F, C },
        [L_DOWN] = { "mlp.down_proj.weight", C, F },
    };
    const int base = c->tied ? 2 : 3;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < L_LAYER_COUNT; j++) {
            char name[128];
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, ps[j].name);
            set_wanted(&w[base + l * L_LAYER_COUNT + j], name, NULL, ps[j].d0, ps[j].d1,
                       &m->p[l][j]);
        }
    int rc = load_tensors(st, dir, w, nw, err);
    free(w);
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

gen_decoder_t *gen_decoder_open_cpu(const char *dir, int capacity, bmt_error_t *err)
{
    gen_model_info_t info;
    if (gen_model_info(dir, &info, err) < 0)
        return NULL;
    if (capacity < 1 || capacity > info.max_positions) {
        nn_fail(err, "%s: a cache of %d positions; the model has 1 to %d", dir, capacity,
                info.max_positions);
        return NULL;
    }
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
