/* tests/progs/gpt2_check.c — the GPT-2 example's CPU path, for the PyTorch
 * oracle (tests/tools/gpt2_oracle.py, tests/integration/test_gpt2.sh).
 *
 *     bmlaunch -g G -n P -- gpt2_check --init FILE.safetensors --data SHARD.bin
 *                            --heads H -b B -t T --out DIR [--steps N] [--zero 2|3] [--ckpt 0|1]
 *                            [--keep-attention 0|1] (default: the trainer's)
 *
 * Phase 1, gradients: the model is loaded from FILE (each rank reads its own
 * shards); every rank runs one micro-batch of the first global batch of SHARD
 * (llm.c DataLoader slicing); rank 0 writes its logits to DIR/logits.f32 and
 * prints the world's mean loss ("loss1 X"). One AdamW step with lr = eps = 1e6
 * and no decay or clipping then moves every parameter by -g / (1 + |g| / 1e6),
 * i.e. by minus the gradient of the world's mean loss to a relative 1e-6; rank
 * 0 writes every parameter after it to DIR/after/<name>.f32 (gathered per block,
 * a test's view: checkpoints never gather), and the oracle takes p0 - p1 as our
 * gradient. On cuda (bf16 parameters, f32 masters) the f32 values after the
 * step are the optimizer's masters: the run saves a checkpoint DIR/after
 * instead (bmt_ckpt_save; "<param>.master" in the .optim files), and p0 is the
 * file's value rounded to bf16 (tests/gpu/gpt2_hf.py).
 * Phase 2, training: the model is loaded again and trained N steps (default 10)
 * with AdamW (lr 1e-3, weight decay 0.01 except biases and LayerNorm weights,
 * clip 1.0) on consecutive global batches; rank 0 prints "traj S LOSS" per step.
 * Diagnosis: --pre-steps K --pre-lr LR trains K steps first (AdamW, no decay,
 * clip 1) and writes the parameters to DIR/before, so that phase 1 can be
 * compared from a trained state (bench/NOTES.md, the loss-spike entry).
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
#include "common/data.h"
#include "gpt2/model.h"

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "gpt2_check: " __VA_ARGS__);                                               \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

typedef struct args {
    const char *init, *data, *out;
    int B, T, steps, zero, ckpt, heads, pre_steps, keep_attention;
    double pre_lr;
} args_t;

static void write_file(const char *path, const void *p, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0)
        DIE("cannot write %s: %s", path, strerror(errno));
}

static gpt2_model_t *load(bmt_ctx_t *ctx, const args_t *a, bmt_error_t *err)
{
    gpt2_config_t cfg;
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    lc.zero_level = a->zero;
    lc.checkpointing = a->ckpt;
    if (gpt2_config_from_file(a->init, a->heads, &cfg, err) < 0)
        return NULL;
    gpt2_model_t *m = gpt2_model_create(ctx, &cfg, a->B, a->T, &lc, 1, err);
    if (m && (gpt2_model_keep_attention(m, a->keep_attention, err) < 0 ||
              gpt2_model_load(m, a->init, err) < 0)) {
        gpt2_model_destroy(m);
        return NULL;
    }
    return m;
}

/* Every parameter, gathered per block, to DIR/SUB/<name>.f32 on rank 0 (a
 * test's view: checkpoints never gather). */
static void dump(bmt_ctx_t *ctx, gpt2_model_t *m, const char *dir, const char *sub)
{
    bmt_error_t err;
    char path[4096];
    const int rank = bmt_rank(ctx);
    snprintf(path, sizeof(path), "%s/%s", dir, sub);
    if (rank == 0)
        mkdir(path, 0755);
    bmt_blocklist_t *list = gpt2_model_list(m);
    for (int u = 0; u < bmt_blocklist_size(list) - 1; u++) { /* the last use is the tie */
        bmt_block_t *b = bmt_blocklist_block(list, u);
        if (bmt_block_gather(b, &err) < 0)
            DIE("%s", err.text);
        for (int j = 0; rank == 0 && j < bmt_block_num_params(b); j++) {
            size_t n = (size_t)bmt_block_param_numel(b, j);
            float *h = malloc(n * sizeof(float));
            if (h == NULL ||
                bmt_mem_download(ctx, h, bmt_block_param(b, j), n * sizeof(float), &err) < 0)
                DIE("%s", err.text);
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

static void step(bmt_ctx_t *ctx, gpt2_model_t *m, data_loader_t *ld, int32_t *in, int32_t *tg,
                 double *loss, bmt_error_t *err)
{
    if (data_loader_next(ld, in, tg, err) < 0 || gpt2_model_set_batch(m, in, tg, err) < 0 ||
        bmt_blocklist_forward(gpt2_model_list(m), err) < 0 ||
        bmt_blocklist_backward(gpt2_model_list(m), true, err) < 0)
        DIE("%s", err->text);
    *loss = world_mean(ctx, gpt2_model_loss(m), err);
}

int main(int argc, char **argv)
{
    args_t a = { .steps = 10, .zero = 3, .ckpt = 1, .keep_attention = -1 };
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
        else if (strcmp(k, "--pre-steps") == 0)
            a.pre_steps = atoi(v);
        else if (strcmp(k, "--pre-lr") == 0)
            a.pre_lr = atof(v);
        else if (strcmp(k, "--heads") == 0)
            a.heads = atoi(v);
        else if (strcmp(k, "--ckpt") == 0)
            a.ckpt = atoi(v);
        else if (strcmp(k, "--keep-attention") == 0)
            a.keep_attention = atoi(v);
        else
            DIE("unknown option %s", k);
    }
    if (!a.init || !a.data || !a.out || a.B < 1 || a.T < 1)
        DIE("usage: gpt2_check --init FILE --data SHARD -b B -t T --out DIR [--steps N] "
            "[--zero 2|3] [--ckpt 0|1] [--keep-attention 0|1]");
    bmt_ctx_t *ctx;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        DIE("%s", err.text);
    const int rank = bmt_rank(ctx);
    int32_t *in = malloc(sizeof(int32_t) * (size_t)a.B * a.T);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)a.B * a.T);
    data_loader_t *ld = data_loader_open(a.data, a.B, a.T, rank, bmt_world_size(ctx), &err);
    if (ld == NULL)
        DIE("%s", err.text);

    /* Phase 1: logits, loss, and the gradient as one AdamW move. */
    gpt2_model_t *m = load(ctx, &a, &err);
    if (m == NULL)
        DIE("%s", err.text);
    char path[4096];
    double loss;
    if (a.pre_steps > 0) {
        /* Diagnosis: train first (AdamW, pre_lr, clip 1, no decay), then write the
         * parameters to DIR/before and take phase 1 from there. */
        bmt_adamw_config_t pc = BMT_ADAMW_CONFIG_INITIALIZER;
        pc.lr = a.pre_lr;
        pc.weight_decay = 0;
        pc.clip_norm = 1.0;
        bmt_optim_t *po = bmt_adamw_create(gpt2_model_list(m), &pc, &err);
        bmt_step_info_t pi;
        if (po == NULL)
            DIE("%s", err.text);
        for (int s = 1; s <= a.pre_steps; s++) {
            step(ctx, m, ld, in, tg, &loss, &err);
            if (bmt_optim_step(po, &pi, &err) < 0)
                DIE("%s", err.text);
            if (rank == 0)
                printf("pre %d %.10g %.6g\n", s, loss, pi.grad_norm);
        }
        bmt_optim_destroy(po);
        dump(ctx, m, a.out, "before");
    }
    bmt_adamw_config_t oc = BMT_ADAMW_CONFIG_INITIALIZER;
    oc.lr = 1e6;
    oc.eps = 1e6;
    oc.weight_decay = 0;
    bmt_optim_t *opt = bmt_adamw_create(gpt2_model_list(m), &oc, &err);
    if (opt == NULL)
        DIE("%s", err.text);
    if (gpt2_model_keep_logits(m, &err) < 0)
        DIE("%s", err.text);
    step(ctx, m, ld, in, tg, &loss, &err);
    if (rank == 0) {
        printf("loss1 %.10g\n", loss);
        /* logits of rank 0's micro-batch, (B,T,V); V from wte (V,C) */
        int nd;
        int64_t shape[BMT_MAX_DIMS];
        bmt_block_param_shape(bmt_blocklist_block(gpt2_model_list(m), 0), 0, &nd, shape);
        snprintf(path, sizeof(path), "%s/logits.f32", a.out);
        const float *logits = gpt2_model_logits(m);
        if (logits == NULL)
            DIE("no logits");
        write_file(path, logits, sizeof(float) * (size_t)a.B * a.T * (size_t)shape[0]);
    }
    bmt_step_info_t info;
    if (bmt_optim_step(opt, &info, &err) < 0)
        DIE("%s", err.text);
    if (rank == 0)
        printf("norm1 %.10g\n", info.grad_norm);
    if (bmt_block_param_dtype(bmt_blocklist_block(gpt2_model_list(m), 0), 0) == BMT_F32)
        dump(ctx, m, a.out, "after");
    else if (bmt_ckpt_save(gpt2_model_list(m), opt, a.out, "after", NULL, 0, &err) < 0)
        DIE("%s", err.text);
    bmt_optim_destroy(opt);
    gpt2_model_destroy(m);

    /* Phase 2: a real AdamW trajectory from the same weights. */
    data_loader_reset(ld);
    if ((m = load(ctx, &a, &err)) == NULL)
        DIE("%s", err.text);
    bmt_adamw_config_t tc = BMT_ADAMW_CONFIG_INITIALIZER;
    tc.lr = 1e-3;
    tc.weight_decay = 0.01;
    tc.clip_norm = 1.0;
    if ((opt = bmt_adamw_create(gpt2_model_list(m), &tc, &err)) == NULL)
        DIE("%s", err.text);
    for (int s = 1; s <= a.steps; s++) {
        step(ctx, m, ld, in, tg, &loss, &err);
        if (bmt_optim_step(opt, &info, &err) < 0)
            DIE("%s", err.text);
        if (rank == 0)
            printf("traj %d %.10g\n", s, loss);
    }
    bmt_optim_destroy(opt);
    gpt2_model_destroy(m);
    data_loader_destroy(ld);
    free(in);
    free(tg);
    bmt_finalize(ctx);
    return 0;
}
