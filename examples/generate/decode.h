/* examples/generate/decode.h — a model that extends a sequence token by token,
 * keeping the keys and values of every position it has seen (the KV cache).
 *
 * A gen_decoder_t is a small struct of function pointers over a model's own
 * state, so that generate.c's loop (prefill, then one token per step, then the
 * sampler) is written once for every model and device. What exists: the CPU
 * decoders of GPT-2 and of the Llama family, which hold the whole model in
 * host memory in f32 and compute with the layers of nn/ (one process, no
 * engine), and their CUDA twins, which hold it on one GPU in bf16
 * (docs/generate.md, "Adding a decoder").
 *
 * Errors: functions return 0 (or a pointer) or -1 (or NULL) with err, one
 * line naming the file, the tensor or the value that is wrong; nothing is
 * changed on failure.
 */
#ifndef GEN_DECODE_H
#define GEN_DECODE_H

#include <stdint.h>

#include "bmt/error.h"
#include "gencfg.h"

typedef struct gen_decoder gen_decoder_t;

/* What a model's decoder computes. Called through gen_decoder_forward and
 * gen_decoder_destroy, which check the arguments first. */
typedef struct gen_decoder_ops {
    /* Run tokens (n >= 1, each in [0, vocab)) at positions d->pos ..
     * d->pos + n - 1 against the cached positions 0 .. d->pos - 1, append their
     * keys and values to the cache, and write the logits (vocab, f32) of the
     * last one. d->pos + n <= d->capacity. */
    int (*forward)(gen_decoder_t *d, const int32_t *tokens, int n, float *logits, bmt_error_t *err);
    /* Free the model and its cache. */
    void (*destroy)(gen_decoder_t *d);
} gen_decoder_ops_t;

/* What config.json says about a model, read without its weights. */
typedef struct gen_model_info {
    char model_type[16]; /* "gpt2", "llama" or "mistral" (the Llama model) */
    char summary[160];   /* its sizes, for -v: "L 4, H 4, C 64, V 256, maxT 256" */
    int vocab_size;      /* V */
    int max_positions;   /* n_positions (GPT-2), max_position_embeddings (Llama) */
    int n_eos;           /* end-of-sequence ids (eos_token_id: an id, a list or null;
                            absent: the config class's default, 50256 or 2, if a token) */
    int eos[GEN_MAX_EOS];
    char eos_from[96];      /* where they come from, for -v: "generation_config.json's
                               eos_token_id", "config.json's eos_token_id", ... */
    char sampling[160];     /* "" or the sampling settings of generation_config.json
                               (config.json's when there is none), which generate does
                               not apply (gen_gencfg_t), for -v */
    char sampling_from[32]; /* the file they are in: "generation_config.json" or
                               "config.json" */
} gen_model_info_t;

struct gen_decoder {
    const gen_decoder_ops_t *ops;
    gen_model_info_t info;
    int capacity; /* positions the cache holds (<= info.max_positions) */
    int pos;      /* positions in the cache now */
    void *impl;   /* the model's state */
};

/* The model in dir (as gen_decoder_open_cpu below takes it) as its
 * config.json describes it, through the trainers' parsers; GPT-2's also reads the safetensors
 * headers (its sizes must be the weights'). The end-of-sequence ids are
 * generation_config.json's when dir has one (gencfg.h: as transformers'
 * generate() takes them), else config.json's, or, when it has no
 * eos_token_id, its config class's default (GPT2Config's 50256,
 * LlamaConfig's and MistralConfig's 2) if that is a token of the
 * vocabulary, as from_pretrained builds it. Nothing is loaded. -1 and err
 * when config.json is missing or unreadable, its model_type is not one of
 * those above, it describes a model the decoders do not compute, or
 * generation_config.json is refused (gen_gencfg_read), or, without one,
 * config.json's generation settings are (gen_gencfg_parse_model). */
int gen_model_info(const char *dir, gen_model_info_t *info, bmt_error_t *err);

/* gen_model_info, and a cache of capacity positions checked against the
 * model's (1 to max_positions): what both decoders ask first. */
int gen_model_info_cache(const char *dir, int capacity, gen_model_info_t *info, bmt_error_t *err);

/* The CPU decoder of the model in dir, an HF model directory as the trainers
 * write it and transformers saves it: config.json (model_type "gpt2", "llama"
 * or "mistral") and model.safetensors or, when there is none,
 * model.safetensors.index.json with its files (bmt_st_open's rule, which is
 * from_pretrained's), F32, BF16, F16 or F64 (read as f32). The config is read
 * with the trainers' parsers (gpt2_config_from_file, llama_config_from_file), which
 * refuse any value the model does not compute; every tensor is checked for
 * name and shape before anything is read, and the whole model is loaded.
 * capacity: positions to reserve in the cache, 1 .. the model's positions (a
 * larger one is refused, naming both). NULL and err otherwise. */
gen_decoder_t *gen_decoder_open_cpu(const char *dir, int capacity, bmt_error_t *err);

/* The CUDA decoder of the same directories (examples/generate/decode_cuda.c):
 * the whole model on the current device (device 0 of CUDA_VISIBLE_DEVICES) in
 * bf16, with Llama's q, k, v and gate, up stacked into one product each, a
 * bf16 KV cache on the device, and nn/'s CUDA layers; the logits come back to
 * host memory as f32 at every forward. The files are checked as by
 * gen_decoder_open_cpu, with the same messages. NULL and err also when the
 * build has no CUDA, there is no device, the device memory does not hold the
 * model and its cache (naming the sizes), or a head size is above 256. */
gen_decoder_t *gen_decoder_open_cuda(const char *dir, int capacity, bmt_error_t *err);

/* d->ops->forward after checking n >= 1, capacity and every token id (-1 and
 * err naming the first outside [0, vocab)). The logits are checked to be
 * finite (a non-finite one is an error naming its position). */
int gen_decoder_forward(gen_decoder_t *d, const int32_t *tokens, int n, float *logits,
                        bmt_error_t *err);

/* Empty the cache: the next forward starts at position 0. */
void gen_decoder_reset(gen_decoder_t *d);

/* NULL: no-op. */
void gen_decoder_destroy(gen_decoder_t *d);

#endif
