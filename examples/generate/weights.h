/* examples/generate/weights.h — the tensors a decoder reads from an HF model
 * directory: their names, shapes and order, all found and checked before any
 * is read.
 *
 * Shared by the CPU decoders (decode.c, which read each tensor into f32) and
 * the CUDA ones (decode_cuda.c, which read each into bf16 and upload it), so
 * both accept the same files and refuse them with the same words. A list
 * holds a model's globals first, then each layer's parameters in the order of
 * the enums below: list[GLOBALS + l * LAYER_COUNT + j] (gen_layer_tensor).
 *
 * Layer: an example above libbmt (the safetensors reader) and the models'
 * configuration parsers; nothing is read here but the headers.
 */
#ifndef GEN_WEIGHTS_H
#define GEN_WEIGHTS_H

#include <stdint.h>

#include "bmt/error.h"
#include "bmt/safetensors.h"
#include "gpt2/model.h"
#include "llama/config.h"

/* GPT-2's globals, then its layers' parameters (HF names, Conv1D weights
 * (in, out), the head tied to wte). */
enum {
    GEN_G_WTE,   /* (V, C) */
    GEN_G_WPE,   /* (maxT, C) */
    GEN_G_LNF_W, /* (C) */
    GEN_G_LNF_B, /* (C) */
    GEN_G_GLOBALS
};
enum {
    GEN_G_LN1_W,
    GEN_G_LN1_B,
    GEN_G_ATTN_W, /* (C, 3C) */
    GEN_G_ATTN_B, /* (3C) */
    GEN_G_APROJ_W,
    GEN_G_APROJ_B,
    GEN_G_LN2_W,
    GEN_G_LN2_B,
    GEN_G_FC_W, /* (C, 4C) */
    GEN_G_FC_B,
    GEN_G_MPROJ_W, /* (4C, C) */
    GEN_G_MPROJ_B,
    GEN_G_LAYER_COUNT
};

/* The Llama family's globals, then its layers' parameters (HF names,
 * nn.Linear weights (out, in)). */
enum {
    GEN_L_EMBED, /* (V, C) */
    GEN_L_NORM,  /* (C) */
    GEN_L_HEAD,  /* (V, C); not wanted (name "") when tie_word_embeddings */
    GEN_L_GLOBALS
};
enum {
    GEN_L_IN_NORM, /* (C) */
    GEN_L_Q,       /* (NH hd, C) */
    GEN_L_K,       /* (NKV hd, C) */
    GEN_L_V,       /* (NKV hd, C) */
    GEN_L_O,       /* (C, NH hd) */
    GEN_L_POST_NORM,
    GEN_L_GATE, /* (F, C) */
    GEN_L_UP,   /* (F, C) */
    GEN_L_DOWN, /* (C, F) */
    GEN_L_LAYER_COUNT
};

/* A tensor a decoder reads. */
typedef struct gen_tensor {
    char name[128]; /* as the trainers write it; "" when not wanted */
    char alt[128];  /* another accepted name ("" none): GPT-2's without "transformer." */
    int ndim;       /* 1 or 2 */
    int64_t shape[2];
    int64_t numel;
    int index; /* in the checkpoint (bmt_st_tensor), once gen_tensors_find found it */
} gen_tensor_t;

/* GPT-2's list (GEN_G_GLOBALS + L GEN_G_LAYER_COUNT tensors, *n of them),
 * malloc'd; NULL and err when out of memory. */
gen_tensor_t *gen_gpt2_tensors(const gpt2_config_t *c, int *n, bmt_error_t *err);

/* The Llama family's list (GEN_L_GLOBALS + L GEN_L_LAYER_COUNT), malloc'd.
 * NULL and err also when st holds another number of layers than c (more
 * would be another model). dir: for the message. */
gen_tensor_t *gen_llama_tensors(bmt_st_t *st, const char *dir, const llama_config_t *c, int *n,
                                bmt_error_t *err);

/* Tensor j of layer l in a list of `globals` globals and `count` per layer. */
static inline gen_tensor_t *gen_layer_tensor(gen_tensor_t *list, int globals, int count, int l,
                                             int j)
{
    return &list[globals + l * count + j];
}

/* Find every wanted tensor of the list in st (its name, else its alt) and set
 * its index, checking its shape and that it is F32, BF16, F16 or F64 (what
 * bmt_st_read converts); nothing is read. -1 and err at the first missing or
 * different one ("DIR has no tensor 'NAME'", "FILE: tensor 'NAME' is (A, B);
 * the model needs (C, D)"). */
int gen_tensors_find(bmt_st_t *st, const char *dir, gen_tensor_t *list, int n, bmt_error_t *err);

#endif
