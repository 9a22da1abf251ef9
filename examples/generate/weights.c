/* examples/generate/weights.c — the tensors a decoder reads (see weights.h).
 *
 * Layer: an example above libbmt's safetensors reader and the models'
 * configurations; it reads headers only.
 */
#include "weights.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/hfjson.h"

static void set(gen_tensor_t *t, const char *name, const char *alt, int64_t d0, int64_t d1)
{
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->alt, sizeof(t->alt), "%s", alt ? alt : "");
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = d1 ? d0 * d1 : d0;
    t->index = -1;
}

gen_tensor_t *gen_gpt2_tensors(const gpt2_config_t *c, int *n, bmt_error_t *err)
{
    const int L = c->n_layer;
    const int64_t C = c->n_embd, V = c->vocab_size, T = c->max_seq_len;
    *n = GEN_G_GLOBALS + L * GEN_G_LAYER_COUNT;
    gen_tensor_t *w = calloc((size_t)*n, sizeof(*w));
    if (w == NULL) {
        nn_fail(err, "out of memory");
        return NULL;
    }
    set(&w[GEN_G_WTE], "transformer.wte.weight", "wte.weight", V, C);
    set(&w[GEN_G_WPE], "transformer.wpe.weight", "wpe.weight", T, C);
    set(&w[GEN_G_LNF_W], "transformer.ln_f.weight", "ln_f.weight", C, 0);
    set(&w[GEN_G_LNF_B], "transformer.ln_f.bias", "ln_f.bias", C, 0);
    static const struct {
        const char *name;
        int d0, d1; /* multiples of C; 0: none */
    } ps[GEN_G_LAYER_COUNT] = {
        [GEN_G_LN1_W] = { "ln_1.weight", 1, 0 },
        [GEN_G_LN1_B] = { "ln_1.bias", 1, 0 },
        [GEN_G_ATTN_W] = { "attn.c_attn.weight", 1, 3 },
        [GEN_G_ATTN_B] = { "attn.c_attn.bias", 3, 0 },
        [GEN_G_APROJ_W] = { "attn.c_proj.weight", 1, 1 },
        [GEN_G_APROJ_B] = { "attn.c_proj.bias", 1, 0 },
        [GEN_G_LN2_W] = { "ln_2.weight", 1, 0 },
        [GEN_G_LN2_B] = { "ln_2.bias", 1, 0 },
        [GEN_G_FC_W] = { "mlp.c_fc.weight", 1, 4 },
        [GEN_G_FC_B] = { "mlp.c_fc.bias", 4, 0 },
        [GEN_G_MPROJ_W] = { "mlp.c_proj.weight", 4, 1 },
        [GEN_G_MPROJ_B] = { "mlp.c_proj.bias", 1, 0 },
    };
    for (int l = 0; l < L; l++)
        for (int j = 0; j < GEN_G_LAYER_COUNT; j++) {
            char name[128], alt[100];
            snprintf(alt, sizeof(alt), "h.%d.%s", l, ps[j].name);
            snprintf(name, sizeof(name), "transformer.%s", alt);
            set(gen_layer_tensor(w, GEN_G_GLOBALS, GEN_G_LAYER_COUNT, l, j), name, alt,
                (int64_t)ps[j].d0 * C, (int64_t)ps[j].d1 * C);
        }
    return w;
}

gen_tensor_t *gen_llama_tensors(bmt_st_t *st, const char *dir, const llama_config_t *c, int *n,
                                bmt_error_t *err)
{
    const int L = c->n_layer;
    const int64_t C = c->n_embd, V = c->vocab_size;

    bmt_st_plan_t *plan = NULL;
    if (bmt_st_discover(st, &plan, err) < 0)
        return NULL;
    const int nl = plan->nlayers;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s", plan->layer_prefix);
    bmt_st_plan_free(plan);
    if (nl != L) {
        nn_fail(err, "%s holds %d layers (%s<N>); config.json has %d (num_hidden_layers)", dir, nl,
                prefix, L);
        return NULL;
    }

    *n = GEN_L_GLOBALS + L * GEN_L_LAYER_COUNT;
    gen_tensor_t *w = calloc((size_t)*n, sizeof(*w));
    if (w == NULL) {
        nn_fail(err, "out of memory");
        return NULL;
    }
    set(&w[GEN_L_EMBED], "model.embed_tokens.weight", NULL, V, C);
    set(&w[GEN_L_NORM], "model.norm.weight", NULL, C, 0);
    if (!c->tied)
        set(&w[GEN_L_HEAD], "lm_head.weight", NULL, V, C);
    _Static_assert(GEN_L_LAYER_COUNT == LLAMA_LAYER_TENSORS && GEN_L_Q == 1 && GEN_L_DOWN == 8,
                   "GEN_L_* follow llama_layer_tensors' order");
    llama_tensor_spec_t ps[LLAMA_LAYER_TENSORS];
    llama_layer_tensors(c, ps);
    for (int l = 0; l < L; l++)
        for (int j = 0; j < GEN_L_LAYER_COUNT; j++) {
            char name[128];
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, ps[j].name);
            set(gen_layer_tensor(w, GEN_L_GLOBALS, GEN_L_LAYER_COUNT, l, j), name, NULL, ps[j].d0,
                ps[j].d1);
        }
    return w;
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape)
{
    out[0] = '\0';
    for (int d = 0; d < ndim; d++)
        snprintf(out + strlen(out), len - strlen(out), "%s%lld", d ? ", " : "",
                 (long long)shape[d]);
}

int gen_tensors_find(bmt_st_t *st, const char *dir, gen_tensor_t *list, int n, bmt_error_t *err)
{
    for (int j = 0; j < n; j++) {
        gen_tensor_t *w = &list[j];
        if (w->name[0] == '\0') /* not wanted */
            continue;
        w->index = bmt_st_find(st, w->name);
        if (w->index < 0 && w->alt[0])
            w->index = bmt_st_find(st, w->alt);
        const bmt_st_tensor_t *t = bmt_st_tensor(st, w->index);
        if (t == NULL)
            return w->alt[0]
                       ? nn_fail(err, "%s has no tensor '%s' (nor '%s')", dir, w->name, w->alt)
                       : nn_fail(err, "%s has no tensor '%s'", dir, w->name);
        bool same = t->ndim == w->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == w->shape[d];
        if (!same) {
            char want[64], got[200];
            shape_text(want, sizeof(want), w->ndim, w->shape);
            shape_text(got, sizeof(got), t->ndim, t->shape);
            return nn_fail(err, "%s: tensor '%s' is (%s); the model needs (%s)", t->file, t->name,
                           got, want);
        }
        if (t->dtype != BMT_ST_F32 && t->dtype != BMT_ST_BF16 && t->dtype != BMT_ST_F16 &&
            t->dtype != BMT_ST_F64)
            return nn_fail(err, "%s: tensor '%s' is %s; a float type is needed", t->file, t->name,
                           bmt_st_dtype_name(t->dtype));
    }
    return 0;
}
