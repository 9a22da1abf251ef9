/* examples/generate/gencfg.h — what generate takes from a model directory's
 * generation_config.json, and what it refuses there.
 *
 * transformers' from_pretrained loads DIR/generation_config.json when the
 * directory has one (GenerationConfig.from_pretrained), and generate() takes
 * its end-of-sequence ids from it alone: config.json's eos_token_id counts
 * only when there is no such file (an instruct model's end-of-turn id, Llama
 * 3.x's 128009, is often in generation_config.json only). So generate reads
 * the file the same way: its eos_token_id (an id, a list or null; absent or
 * null: no end-of-sequence id, as HF) replaces config.json's.
 *
 * The settings that change the tokens of HF's greedy generate(do_sample=False)
 * and that generate does not compute (a repetition penalty, beam search, a
 * minimum length, suppressed or forced tokens, ...: the table in gencfg.c) are
 * refused unless they hold their neutral value, naming the file, the key and
 * what is supported: generate's output would silently differ from HF's.
 * The sampling settings (do_sample, temperature, top_k, top_p, ...) are
 * checked for their types and not applied: generate's own flags decide
 * (docs/generate.md says why); gen_gencfg_t says what they asked for, for -v.
 * Everything else (max_length, pad_token_id, bos_token_id, ...) does not
 * change the tokens of one sequence whose length -n gives, and is not read.
 * HF falls back to config.json silently when the file is not valid JSON;
 * generate refuses it instead. Without the file, HF makes the generation
 * config from config.json, settings included (a legacy config.json's
 * repetition_penalty applies), so the same settings are refused and
 * reported there (gen_gencfg_parse_model).
 *
 * Layer: pure parsing (gen_gencfg_parse) and one read of the file, under
 * decode.c's gen_model_info; nothing of libbmt but its error type.
 */
#ifndef GEN_GENCFG_H
#define GEN_GENCFG_H

#include <stdbool.h>

#include "bmt/error.h"

#define GEN_MAX_EOS 8 /* end-of-sequence ids a model may list */
#define GEN_GENCFG_NAME "generation_config.json"

typedef struct gen_gencfg {
    bool present;   /* DIR/generation_config.json exists; the rest is from it */
    bool eos_given; /* its eos_token_id is there and not null */
    int n_eos;      /* its end-of-sequence ids (0: none) */
    int eos[GEN_MAX_EOS];
    char sampling[160]; /* "" or the sampling settings it holds that generate
                           does not apply: "do_sample true, temperature 0.6" */
} gen_gencfg_t;

/* Parse the text of a generation_config.json (NUL-terminated; file: its path,
 * for messages) for a model of vocab tokens into *g (present set). Pure.
 * -1 and err, *g untouched, when it is not a JSON object (duplicate keys
 * refused), a key generate reads has another type ("FILE: malformed:
 * "eos_token_id" must be an integer, a list or null, not a string"), an
 * end-of-sequence id is outside [0, vocab) or there are more than GEN_MAX_EOS,
 * or a setting that changes HF's greedy tokens is not neutral ("FILE:
 * repetition_penalty is 1.1; supported: 1.0 or null (...)"). */
int gen_gencfg_parse(const char *text, const char *file, int vocab, gen_gencfg_t *g,
                     bmt_error_t *err);

/* The generation settings of a config.json (text, NUL-terminated; file: its
 * path), which transformers makes the generation config from when the
 * directory has no generation_config.json (GenerationConfig.from_model_config
 * reads every key of the model config): the same settings refused and the
 * same sampling settings reported as by gen_gencfg_parse; n_eos: how many
 * end-of-sequence ids apply (config.json's, or its class's default), for the
 * settings HF applies only with some. Pure. 0 and *g with present false and
 * only sampling set, or -1 and err, *g untouched. */
int gen_gencfg_parse_model(const char *text, const char *file, int n_eos, gen_gencfg_t *g,
                           bmt_error_t *err);

/* DIR/generation_config.json read (at most 1 MiB, a regular file: a FIFO or a
 * folder of that name is refused at once, never waited on) and parsed. No
 * such file: 0 and g->present false. -1 and err as gen_gencfg_parse, or when
 * the file cannot be read. */
int gen_gencfg_read(const char *dir, int vocab, gen_gencfg_t *g, bmt_error_t *err);

#endif
