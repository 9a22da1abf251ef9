/* tests/progs/llama_check.c — the Llama example's model, for its oracles: on
 * cpu ranks PyTorch's float64 Llama (tests/tools/llama_oracle.py,
 * tests/integration/test_llama.sh), on cuda ranks transformers'
 * LlamaForCausalLM (tests/gpu/llama_cuda_hf.py, tests/gpu/test_llama.sh).
 *
 *     bmlaunch -g G -n P -- llama_check --init DIR --data SHARD -b B -t T --out OUT
 *                             [--steps N] [--zero 2|3] [--ckpt 0|1] [--mask K]
 *                             [--dump-init 0|1] [--fp8 0|1] [--fp8-history H]
 *
 * DIR is an HF model directory: config.json (llama_config_from_file) and
 * model.safetensors or a sharded index (llama_model_load: each rank reads its
 * own shards). --mask K leaves every K-th target of each micro-batch (flat
 * positions K-1, 2K-1, ...) out of the loss (target -1).
 * --fp8 1: the layers' products with their operands through FP8 at current
 *   scaling (llama_model_fp8 with history 0), every step standing alone, so
 *   that the oracle can do the same (llama_oracle.py check --fp8); with
 *   --fp8-history H > 0, delayed scaling over H passes (the gradient step is
 *   the model's first pass, at current scaling either way; the 10 steps
 *   carry their records from step to step, as the oracle's Plan does).
 * Phase 0 (--dump-init 1): the model built from seed 1 without loading, every
 *   parameter written to OUT/init/<name>.f32 (HF's _init_weights, checked by
 *   the oracle's `init` command).
 * Phase 1, gradients: the model is loaded from DIR; every rank runs one
 *   micro-batch of the first global batch of SHARD (llm.c DataLoader slicing);
 *   rank 0 writes its logits to OUT/logits.f32 and prints the world's mean
 *   loss ("loss1 X"). One AdamW step with lr = eps = 1e6 and no decay or
 *   clipping then moves every parameter by -g / (1 + |g| / 1e6), i.e. by
 *   minus the gradient of the world's mean loss to a relative 1e-6; rank 0
 *   writes every parameter after it to OUT/after/<name>.f32 (gathered per
 *   block, a test's view: checkpoints never gather), and the oracle takes
 *   p0 - p1 as our gradient ("norm1 X": the engine's gradient norm). On cuda
 *   (bf16 parameters, f32 masters) the f32 values after the step are the
 *   optimizer's masters: the run saves a checkpoint OUT/after instead
 *   (bmt_ckpt_save; "<param>.master" in its .optim files), and p0 is the
 *   loaded value rounded to bf16. The logits are the model's kept copy
 *   (llama_model_keep_logits).
 * Phase 2, training: the model is loaded again and trained N steps (default
 *   10) with AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01
 *   except the RMSNorm weights, clip 1.0) on consecutive global batches; rank 0
 *   prints "traj S LOSS NORM" per step (NORM before clipping).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/ckpt.h"
#include "bmt/optim.h"
#include "common/data.h" /* the llm.c token-shard loader (the test's data, not the model's) */
#include "llama/config.h"
#include "llama/model.h"

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "llama_check: " __VA_ARGS__);                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

typedef struct args {
    const char *init, *data, *out;
    int B, T, steps, zero, ckpt, mask, dump_init, fp8, fp8_history;
} args_t;

static void write_file(const char *path, const void *p, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0)
        DIE("cannot write %s: %s", path, strerror(errno));
}

static llama_model_t *build(bmt_ctx_t *ctx, const args_t *a, bool load, bmt_error_t *err)
{
    llama_config_t cfg;
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    lc.zero_level = a->zero;
    lc.checkpointing = a->ckpt;
    if (llama_config_from_file(a->init, &cfg, err) < 0)
        return NULL;
    llama_model_t *m = llama_model_create(ctx, &cfg, a->B, a->T, &lc, 1, err);
    if (m && ((load && llama_model_load(m, a->init, err) < 0) ||
              llama_model_fp8(m, a->fp8, a->fp8_history, err) < 0)) {
        llama_model_destroy(m);
        return NULL;
    }
    return m;
}

/* Every parameter, gathered per block, to OUT/SUB/<name>.f32 on rank 0 (a
 * test's view: checkpoints never gather), bf16 ones widened to f32. A tied
 * block is written once. */
static void dump(bmt_ctx_t *ctx, llama_model_t *m, const char *dir, const char *sub)
{
    bmt_error_t err;
    char path[4096];
    const int rank = bmt_rank(ctx);
    snprintf(path, sizeof(path), "%s/%s", dir, sub);
    if (rank == 0)
        mkdir(path, 0755);
    bmt_blocklist_t *list = llama_model_list(m);
    for (int u = 0; u < bmt_blocklist_size(list); u++) {
        bmt_block_t *b = bmt_blocklist_block(list, u);
        bool seen = false;
        for (int v = 0; v < u; v++)
            seen |= bmt_blocklist_block(list, v) == b;
        if (seen)
            continue;
        if (bmt_block_gather(b, &err) < 0)
            DIE("%s", err.text);
        for (int j = 0; rank == 0 && j < bmt_block_num_params(b); j++) {
            const size_t n = (size_t)bmt_block_param_numel(b, j);
            const bmt_dtype_t dt = (bmt_dtype_t)bmt_block_param_dtype(b, j);
            if (dt != BMT_F32 && dt != BMT_BF16)
                DIE("%s is %s: only f32 and bf16 are written", bmt_block_param_name(b, j),
                    bmt_dtype_name(dt));
            float *h = malloc(n * sizeof(float));
            uint16_t *raw = dt == BMT_BF16 ? malloc(n * sizeof(uint16_t)) : NULL;
            void *dst = dt == BMT_BF16 ? (void *)raw : (void *)h;
            if (h == NULL || (dt == BMT_BF16 && raw == NULL))
                DIE("out of memory");
            if (bmt_mem_download(ctx, dst, bmt_block_param(b, j), n * bmt_dtype_size(dt), &err) < 0)
                DIE("%s", err.text);
            for (size_t i = 0; raw && i < n; i++)
                h[i] = bmt_bf16_to_f32(raw[i]);
            free(raw);
            snprintf(path, sizeof(path), "%s/%s/%s.f32", dir, sub, bmt_block_param_name(b, j));
            write_file(path, h, n * sizeof(float));
            free(h);
        }
        if (bmt_block_release(b, &err) < 0)
            DIE("%s", err.text);
    }
}

static double world_mean(bmt_ctx_t *ctx, double v, bmt_error_t *err)
{
    if (bmt_all_reduce_host_f64(bmt_comm_world(ctx), &v, 1, BMT_SUM, err) < 0)
        DIE("%s", err->text);
    return v / bmt_world_size(ctx);
}

static void step(bmt_ctx_t *ctx, const args_t *a, llama_model_t *m, data_loader_t *ld, int32_t *in,
                 int32_t *tg, double *loss, bmt_error_t *err)
{
    if (data_loader_next(ld, in, tg, err) < 0)
        DIE("%s", err->text);
    for (int i = 0; a->mask > 0 && i < a->B * a->T; i++)
        if (i % a->mask == a->mask - 1)
            tg[i] = -1;
    if (llama_model_set_batch(m, in, tg, err) < 0 ||
        bmt_blocklist_forward(llama_model_list(m), err) < 0 ||
        bmt_blocklist_backward(llama_model_list(m), true, err) < 0)
        DIE("%s", err->text);
    *loss = world_mean(ctx, llama_model_loss(m), err);
}

int main(int argc, char **argv)
{
    args_t a = { .steps = 10, .zero = 3, .ckpt = 1 };
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--init") == 0)
            a.init = v;
        else if (strcmp(k, "--data") == 0)
            a.data = v;
        else if (strcmp(k, "--out") == 0)
            a.out = v;
        else if (strcmp(k, "-b") == 0)
            a.B = atoi(v);
        else if (strcmp(k, "-t") == 0)
            a.T = atoi(v);
        else if (strcmp(k, "--steps") == 0)
            a.steps = atoi(v);
        else if (strcmp(k, "--zero") == 0)
            a.zero = atoi(v);
        else if (strcmp(k, "--ckpt") == 0)
            a.ckpt = atoi(v);
        else if (strcmp(k, "--mask") == 0)
            a.mask = atoi(v);
        else if (strcmp(k, "--dump-init") == 0)
            a.dump_init = atoi(v);
        else if (strcmp(k, "--fp8") == 0)
            a.fp8 = atoi(v);
        else if (strcmp(k, "--fp8-history") == 0)
            a.fp8_history = atoi(v);
        else
            DIE("unknown option %s", k);
    }
    if (!a.init || !a.data || !a.out || a.B < 1 || a.T < 1)
        DIE("usage: llama_check --init DIR --data SHARD -b B -t T --out OUT [--steps N] "
            "[--zero 2|3] [--ckpt 0|1] [--mask K] [--dump-init 0|1] [--fp8 0|1] "
            "[--fp8-history H]");
    bmt_ctx_t *ctx;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        DIE("%s", err.text);
    const int rank = bmt_rank(ctx);
    int32_t *in = malloc(sizeof(int32_t) * (size_t)a.B * a.T);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)a.B * a.T);
    data_loader_t *ld = data_loader_open(a.data, a.B, a.T, rank, bmt_world_size(ctx), &err);
    if (ld == NULL || in == NULL || tg == NULL)
        DIE("%s", ld ? "out of memory" : err.text);
    llama_model_t *m;

    /* Phase 0: the initialization from seed, as built. */
    if (a.dump_init) {
        if ((m = build(ctx, &a, false, &err)) == NULL)
            DIE("%s", err.text);
        dump(ctx, m, a.out, "init");
        llama_model_destroy(m);
    }

    /* Phase 1: logits, loss, and the gradient as one AdamW move. */
    if ((m = build(ctx, &a, true, &err)) == NULL)
        DIE("%s", err.text);
    bmt_adamw_config_t oc = BMT_ADAMW_CONFIG_INITIALIZER;
    oc.lr = 1e6;
    oc.eps = 1e6;
    oc.weight_decay = 0;
    bmt_optim_t *opt = bmt_adamw_create(llama_model_list(m), &oc, &err);
    if (opt == NULL || llama_model_keep_logits(m, &err) < 0)
        DIE("%s", err.text);
    double loss;
    step(ctx, &a, m, ld, in, tg, &loss, &err);
    if (rank == 0) {
        char path[4096];
        printf("loss1 %.10g\n", loss);
        snprintf(path, sizeof(path), "%s/logits.f32", a.out);
        const float *logits = llama_model_logits(m);
        if (logits == NULL)
            DIE("no logits (printed above)");
        write_file(path, logits,
                   sizeof(float) * (size_t)a.B * a.T * (size_t)llama_model_config(m)->vocab_size);
    }
    bmt_step_info_t info;
    if (bmt_optim_step(opt, &info, &err) < 0)
        DIE("%s", err.text);
    if (rank == 0)
        printf("norm1 %.10g\n", info.grad_norm);
    if (llama_model_param_dtype(m) == BMT_F32)
        dump(ctx, m, a.out, "after");
    else if (bmt_ckpt_save(llama_model_list(m), opt, a.out, "after", NULL, 0, &err) < 0)
        DIE("%s", err.text);
    bmt_optim_destroy(opt);
    llama_model_destroy(m);

    /* Phase 2: a real AdamW trajectory from the same weights. */
    data_loader_reset(ld);
    if ((m = build(ctx, &a, true, &err)) == NULL)
        DIE("%s", err.text);
    bmt_adamw_config_t tc = BMT_ADAMW_CONFIG_INITIALIZER;
    tc.lr = 1e-3;
    tc.weight_decay = 0.01;
    tc.clip_norm = 1.0;
    if ((opt = bmt_adamw_create(llama_model_list(m), &tc, &err)) == NULL)
        DIE("%s", err.text);
    for (int s = 1; s <= a.steps; s++) {
        step(ctx, &a, m, ld, in, tg, &loss, &err);
        if (bmt_optim_step(opt, &info, &err) < 0)
            DIE("%s", err.text);
        if (rank == 0)
            printf("traj %d %.10g %.10g\n", s, loss, info.grad_norm);
    }
    bmt_optim_destroy(opt);
    llama_model_destroy(m);
    data_loader_destroy(ld);
    free(in);
    free(tg);
    bmt_finalize(ctx);
    return 0;
}
