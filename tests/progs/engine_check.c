/* tests/progs/engine_check.c — the training engine (bmt/block.h, bmt/optim.h)
 * against an independent reference, under any layout.
 *
 * Run as a rank program: `bmlaunch -g 2 -n 2 -- engine_check [options]`.
 *
 * The model (sizes in engine_model.h; every parameter count is odd):
 *   embed   W_in (C x D_in), y = x W_in^T                       (Linear convention)
 *   h.0     y = x + proj(gelu_tanh(fc(layernorm(x))))           fc.weight (C x H) and
 *   mix     y = 0.5 x + 0.25 tanh(x)       (no parameters)      proj.weight (H x C) are
 *   h.1     residual, as h.0                                    (in x out): y = x W + b
 *   h.2     residual, as h.0
 *   head    out = layernorm_f(x) out.weight (C x D_out); loss = mean over rows and
 *           outputs of (out - target)^2 / 2
 * Inits use every kind (uniform, ones, zeros, normal, scaled truncated normal);
 * biases and norms are BMT_PARAM_NO_DECAY.
 *
 * Data: every rank trains on its own micro-batches (data parallel over the whole
 * world). In step s (1-based) rank r's a-th micro-batch is global micro-batch
 * a * world + r; its rows and targets are hashes of (tag, s, global index, row,
 * column) to uniform [-1, 1), exactly representable in f32.
 *
 * The reference (ref_*) is a plain single-process implementation of the same
 * model and of torch.optim.AdamW over whole-model arrays, with its own loops (it
 * never calls the block callbacks or libbmt, except bmt_init_value for initial
 * values and the bf16 rounding helpers). It runs in fp64: the truth the fp32
 * engine is measured against, and the code the finite-difference check (fp64)
 * validates, so the reference itself is not trusted blindly. For --dtype bf16
 * it rounds exactly where the model does (parameters, every matmul operand) so
 * the bound can stay tight.
 *
 * The block callbacks are written once against ec_ops_t (engine_model.h): plain
 * loops on the cpu (also the reference of the cuda kernels, --kernel-check), cuda
 * kernels and cuBLAS in engine_check_cuda.cu.
 *
 * Checks (one line each: "ok ..." on rank 0, "FAIL ..." on any rank that fails;
 * rank 0 ends with a summary over all ranks; exit 1 on any failure):
 *   init      every parameter equals bmt_init_value rounded to its dtype, bitwise;
 *   fd        the reference's gradients against central differences;
 *   train     after --steps steps of --accum micro-batches every parameter is within
 *             the bound of the reference, and so are each step's loss and grad norm;
 *   protocol  what the callbacks were given (index, block, stream, micro-batch,
 *             keep_activations/recompute, grads_fresh, zeroed gradients on cpu, or
 *             under --overwrite with BMT_CHECK_OVERWRITE=1 NaN-filled ones);
 *   memory    param/grad/optim bytes equal this rank's shards; the peak of gathered
 *             buffers stays within K = 2 blocks under zero level 3; nothing is left
 *             after the list is destroyed;
 *   bad use   each misuse returns an error (add_param after build or with a bad
 *             shape, release of a block not gathered, gather twice, appending an
 *             unbuilt block or one twice, a step without a backward, a backward
 *             without a forward), and changes nothing;
 *   variants  (--variants) zero level 2/3 and checkpointing on/off agree (1e-6), and
 *             the optimizer's update in the step or deferred (overlap) bitwise, and
 *             so do fresh gradients overwritten by the callbacks (--overwrite 1 or 0);
 *   kernel    (--kernel-check, cuda) every cuda op against its cpu function.
 * Bounds: see bound(). Options: see usage(); --init-dump FILE writes one hash per
 * initial parameter (rank 0) for comparing layouts, --nan-step S poisons one
 * target of step S (the optimizer must skip that step), --verbose prints the
 * loss and grad norm of every step next to the reference's.
 */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bmt/bmt.h"
#include "bmt/block.h"
#include "bmt/ckpt.h"
#include "bmt/device.h"
#include "bmt/monitor.h"
#include "bmt/optim.h"
#include "engine_model.h"

/* ------------------------------------------------------------ options */

typedef struct opts {
    int steps, accum, zero, ckpt, prefetch, warmup, nan_step;
    int overlap;   /* bmt_adamw_config_t.overlap: the step's update deferred to the next forward */
    int overwrite; /* bmt_blocklist_set_grad_overwrite: 0 off; 1 on, the callbacks write fresh
                    * gradients (beta 0, or zeros before an adding op); 2 on, but the callbacks
                    * add anyway (a careless model: BMT_CHECK_OVERWRITE=1 must expose it) */
    double clip, lr, weight_decay;
    uint64_t seed;
    bmt_dtype_t dtype;
    bmt_dtype_t reduce; /* the block list's gradient reduce dtype */
    const char *init_dump;
    bool variants, kernel_check, verbose;
    int master_only;      /* the optimizer's master_only: 1, no bf16 shards while it lives;
                           * 2, each bf16 master split into the shard and its low halves */
    bool mismatch;        /* odd ranks take another prefetch setting, then another checkpointing of
                           * one use: each list's first forward must fail */
    double bound;         /* relative bound on parameters, loss and grad norm; 0: by dtype */
    double pace_ms;       /* sleep this long in every step (monitoring tests want a steady run) */
    int event_every;      /* report a checkpoint_saved event every N steps (0: none) */
    int val_every;        /* report the step's loss as the scalar val_loss every N steps (a
                           * stand-in for a validation loss: the metrics path is what is tested) */
    int abort_at;         /* rank 0 calls bmt_abort(3, ...) after this step (0: never) */
    const char *ckpt_dir; /* checkpoint after step ckpt_at, then rewind to it (see ckpt check) */
    const char *resave_from; /* with ckpt_dir: before the rewind, load this checkpoint (another
                              * run's) and save it as ckpt_dir-resaved/ec */
    int ckpt_at;
} opts_t;

static opts_t O = { .steps = 20,
                    .accum = 2,
                    .zero = 3,
                    .ckpt = 1,
                    .prefetch = 1,
                    .overlap = 1,
                    .lr = 1e-2,
                    .weight_decay = 0.1,
                    .seed = 1234,
                    .dtype = BMT_F32,
                    .reduce = BMT_F32 };

/* ------------------------------------------------------------ the model's definition */

enum {
    NBLOCKS = 6,
    MAXP = 6
};
enum block_kind {
    K_EMBED,
    K_RESID,
    K_MIX,
    K_HEAD
};
static const int block_kind[NBLOCKS] = { K_EMBED, K_RESID, K_MIX, K_RESID, K_RESID, K_HEAD };
static const char *const block_name[NBLOCKS] = { "embed", "h.0", "mix", "h.1", "h.2", "head" };

typedef struct pspec {
    const char *name; /* within the block */
    int rows, cols;   /* cols 0: a vector of rows elements */
    bmt_init_t init;
    unsigned flags;
} pspec_t;

#define NODECAY BMT_PARAM_NO_DECAY
static const pspec_t embed_params[] = {
    { "W_in", EC_C, EC_DIN, { BMT_INIT_UNIFORM, -0.5, 0.5, 1 }, 0 },
};
/* Residual blocks; order fixed (the callbacks index params by it). proj.weight is
 * scaled by 1 / sqrt(2 L) = 1 / sqrt(6), GPT-2's residual scaling. */
enum {
    R_LNW,
    R_LNB,
    R_FCW,
    R_FCB,
    R_PRW,
    R_PRB
};
static const pspec_t resid_params[] = {
    { "ln.weight", EC_C, 0, { BMT_INIT_ONES, 0, 0, 1 }, NODECAY },
    { "ln.bias", EC_C, 0, { BMT_INIT_ZEROS, 0, 0, 1 }, NODECAY },
    { "fc.weight", EC_C, EC_H, { BMT_INIT_NORMAL, 0, 0.02, 1 }, 0 },
    { "fc.bias", EC_H, 0, { BMT_INIT_UNIFORM, -0.1, 0.1, 1 }, NODECAY },
    { "proj.weight", EC_H, EC_C, { BMT_INIT_TRUNC_NORMAL, 0, 0.02, 0.40824829046386302 }, 0 },
    { "proj.bias", EC_C, 0, { BMT_INIT_ZEROS, 0, 0, 1 }, NODECAY },
};
enum {
    H_LNW,
    H_LNB,
    H_OUTW
};
static const pspec_t head_params[] = {
    { "ln_f.weight", EC_C, 0, { BMT_INIT_ONES, 0, 0, 1 }, NODECAY },
    { "ln_f.bias", EC_C, 0, { BMT_INIT_ZEROS, 0, 0, 1 }, NODECAY },
    { "out.weight", EC_C, EC_DOUT, { BMT_INIT_TRUNC_NORMAL, 0, 0.2, 1 }, 0 },
};

static const pspec_t *block_specs(int b, int *n)
{
    switch (block_kind[b]) {
    case K_EMBED: *n = 1; return embed_params;
    case K_RESID: *n = 6; return resid_params;
    case K_HEAD: *n = 3; return head_params;
    default: *n = 0; return NULL;
    }
}

/* Every parameter of the model, in block order: the reference's flat arrays
 * hold them back to back at `off`. */
typedef struct gparam {
    int block, k;
    const pspec_t *spec;
    char name[64]; /* full name, "h.1.fc.weight" */
    int numel;
    size_t off;
} gparam_t;

static gparam_t gp[NBLOCKS * MAXP];
static int ngp, gp_first[NBLOCKS], gp_count[NBLOCKS];
static size_t ntot;

static void model_table(void)
{
    for (int b = 0; b < NBLOCKS; b++) {
        int n;
        const pspec_t *s = block_specs(b, &n);
        gp_first[b] = ngp;
        gp_count[b] = n;
        for (int k = 0; k < n; k++) {
            gparam_t *g = &gp[ngp++];
            g->block = b;
            g->k = k;
            g->spec = &s[k];
            snprintf(g->name, sizeof(g->name), "%s.%s", block_name[b], s[k].name);
            g->numel = s[k].rows * (s[k].cols ? s[k].cols : 1);
            g->off = ntot;
            ntot += (size_t)g->numel;
        }
    }
}

/* ------------------------------------------------------------ data */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}

enum {
    TAG_INPUT = 1,
    TAG_TARGET = 2
};

/* Uniform in [-1, 1) with 24 bits: exact in f32. --nan-step makes one target of
 * global micro-batch 0 NaN in that step, so the step's gradients are NaN. */
static float data_value(int tag, int step, int gidx, int row, int col)
{
    if (tag == TAG_TARGET && O.nan_step > 0 && step == O.nan_step && gidx == 0 && row == 0 &&
        col == 0)
        return NAN;
    uint64_t h = mix64(0x9e3779b97f4a7c15ULL ^ ((uint64_t)tag << 56) ^ ((uint64_t)step << 36) ^
                       ((uint64_t)gidx << 20) ^ ((uint64_t)row << 10) ^ (uint64_t)col);
    return (float)((double)(h >> 40) / 8388608.0 - 1.0);
}

static void make_batch(int step, int gidx, float *in /* (ROWS, DIN) */,
                       float *tgt /* (ROWS, DOUT) */)
{
    for (int r = 0; r < EC_ROWS; r++) {
        for (int c = 0; c < EC_DIN; c++)
            in[r * EC_DIN + c] = data_value(TAG_INPUT, step, gidx, r, c);
        for (int c = 0; c < EC_DOUT; c++)
            tgt[r * EC_DOUT + c] = data_value(TAG_TARGET, step, gidx, r, c);
    }
}

static double lr_at(int64_t step, double base)
{
    return O.warmup > 0 && step < O.warmup ? base * (double)step / O.warmup : base;
}

static double warmup_schedule(void *user, int64_t step, double base_lr)
{
    return lr_at(step, base_lr);
}

/* ------------------------------------------------------------ the reference (fp64) */

static double rq(bool bf, double x)
{
    return bf ? (double)bmt_bf16_to_f32(bmt_f32_to_bf16((float)x)) : x;
}

/* Y (M x N) = beta Y + op(A) op(B), as ec_ops_t.gemm but in f64; operands are
 * rounded to bf16 first when bf. */
static void ref_mm(bool bf, int ta, int tb, int M, int N, int K, const double *A, const double *B,
                   double beta, double *Y)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += rq(bf, ta ? A[k * M + i] : A[i * K + k]) *
                       rq(bf, tb ? B[j * K + k] : B[k * N + j]);
            Y[i * N + j] = beta != 0 ? beta * Y[i * N + j] + acc : acc;
        }
}

static void ref_ln(const double *x, const double *w, const double *b, double *y, double *mean,
                   double *rstd)
{
    for (int r = 0; r < EC_ROWS; r++) {
        const double *xr = x + r * EC_C;
        double mu = 0, var = 0;
        for (int j = 0; j < EC_C; j++)
            mu += xr[j];
        mu /= EC_C;
        for (int j = 0; j < EC_C; j++)
            var += (xr[j] - mu) * (xr[j] - mu);
        var /= EC_C;
        mean[r] = mu;
        rstd[r] = 1.0 / sqrt(var + (double)EC_LN_EPS);
        for (int j = 0; j < EC_C; j++)
            y[r * EC_C + j] = (xr[j] - mu) * rstd[r] * w[j] + b[j];
    }
}

/* dx = d layernorm / dx (dy) (written, not added); dw, db += */
static void ref_ln_back(const double *x, const double *mean, const double *rstd, const double *w,
                        const double *dy, double *dx, double *dw, double *db)
{
    for (int r = 0; r < EC_ROWS; r++) {
        double xhat[EC_C], g[EC_C], s1 = 0, s2 = 0;
        for (int j = 0; j < EC_C; j++) {
            xhat[j] = (x[r * EC_C + j] - mean[r]) * rstd[r];
            g[j] = dy[r * EC_C + j] * w[j];
            s1 += g[j];
            s2 += g[j] * xhat[j];
            dw[j] += dy[r * EC_C + j] * xhat[j];
            db[j] += dy[r * EC_C + j];
        }
        for (int j = 0; j < EC_C; j++)
            dx[r * EC_C + j] = rstd[r] * (g[j] - s1 / EC_C - xhat[j] * s2 / EC_C);
    }
}

#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */

static double ref_gelu(double x)
{
    return 0.5 * x * (1 + tanh(GELU_K * (x + 0.044715 * x * x * x)));
}

static double ref_gelu_d(double x)
{
    double t = tanh(GELU_K * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * 0.044715 * x * x);
}

/* Forward and (grad != NULL) backward of one micro-batch through parameters w
 * (ntot, as the model uses them); grad (ntot) += the gradient of its loss.
 * Returns the loss. */
static double ref_microbatch(bool bf, const double *w, const float *xin, const float *tgt,
                             double *grad)
{
    enum {
        RC = EC_ROWS * EC_C,
        RH = EC_ROWS * EC_H,
        RO = EC_ROWS * EC_DOUT
    };
    static double in[EC_ROWS * EC_DIN], x[NBLOCKS + 1][RC], ln[NBLOCKS][RC];
    static double mean[NBLOCKS][EC_ROWS], rstd[NBLOCKS][EC_ROWS];
    static double pre[NBLOCKS][RH], act[NBLOCKS][RH], out[RO];
    for (int i = 0; i < EC_ROWS * EC_DIN; i++)
        in[i] = xin[i];
    double loss = 0;
    for (int b = 0; b < NBLOCKS; b++) {
        const double *P[MAXP];
        for (int k = 0; k < gp_count[b]; k++)
            P[k] = w + gp[gp_first[b] + k].off;
        switch (block_kind[b]) {
        case K_EMBED: ref_mm(bf, 0, 1, EC_ROWS, EC_C, EC_DIN, in, P[0], 0, x[1]); break;
        case K_RESID:
            ref_ln(x[b], P[R_LNW], P[R_LNB], ln[b], mean[b], rstd[b]);
            ref_mm(bf, 0, 0, EC_ROWS, EC_H, EC_C, ln[b], P[R_FCW], 0, pre[b]);
            for (int i = 0; i < RH; i++) {
                pre[b][i] += P[R_FCB][i % EC_H];
                act[b][i] = ref_gelu(pre[b][i]);
            }
            memcpy(x[b + 1], x[b], sizeof(x[b]));
            ref_mm(bf, 0, 0, EC_ROWS, EC_C, EC_H, act[b], P[R_PRW], 1, x[b + 1]);
            for (int i = 0; i < RC; i++)
                x[b + 1][i] += P[R_PRB][i % EC_C];
            break;
        case K_MIX:
            for (int i = 0; i < RC; i++)
                x[b + 1][i] = 0.5 * x[b][i] + 0.25 * tanh(x[b][i]);
            break;
        case K_HEAD:
            ref_ln(x[b], P[H_LNW], P[H_LNB], ln[b], mean[b], rstd[b]);
            ref_mm(bf, 0, 0, EC_ROWS, EC_DOUT, EC_C, ln[b], P[H_OUTW], 0, out);
            for (int i = 0; i < RO; i++)
                loss += (out[i] - tgt[i]) * (out[i] - tgt[i]);
            loss /= 2.0 * RO;
            break;
        }
    }
    if (grad == NULL)
        return loss;
    double d[RC], dprev[RC], dout[RO], dln[RC], dact[RH];
    for (int b = NBLOCKS - 1; b >= 0; b--) {
        const double *P[MAXP];
        double *G[MAXP];
        for (int k = 0; k < gp_count[b]; k++) {
            P[k] = w + gp[gp_first[b] + k].off;
            G[k] = grad + gp[gp_first[b] + k].off;
        }
        switch (block_kind[b]) {
        case K_HEAD:
            for (int i = 0; i < RO; i++)
                dout[i] = (out[i] - tgt[i]) / RO;
            ref_mm(bf, 1, 0, EC_C, EC_DOUT, EC_ROWS, ln[b], dout, 1, G[H_OUTW]);
            ref_mm(bf, 0, 1, EC_ROWS, EC_C, EC_DOUT, dout, P[H_OUTW], 0, dln);
            ref_ln_back(x[b], mean[b], rstd[b], P[H_LNW], dln, d, G[H_LNW], G[H_LNB]);
            break;
        case K_RESID:
            for (int i = 0; i < RC; i++)
                G[R_PRB][i % EC_C] += d[i];
            ref_mm(bf, 1, 0, EC_H, EC_C, EC_ROWS, act[b], d, 1, G[R_PRW]);
            ref_mm(bf, 0, 1, EC_ROWS, EC_H, EC_C, d, P[R_PRW], 0, dact);
            for (int i = 0; i < RH; i++) {
                dact[i] *= ref_gelu_d(pre[b][i]); /* now d pre */
                G[R_FCB][i % EC_H] += dact[i];
            }
            ref_mm(bf, 1, 0, EC_C, EC_H, EC_ROWS, ln[b], dact, 1, G[R_FCW]);
            ref_mm(bf, 0, 1, EC_ROWS, EC_C, EC_H, dact, P[R_FCW], 0, dln);
            ref_ln_back(x[b], mean[b], rstd[b], P[R_LNW], dln, dprev, G[R_LNW], G[R_LNB]);
            for (int i = 0; i < RC; i++)
                d[i] += dprev[i]; /* the residual path */
            break;
        case K_MIX:
            for (int i = 0; i < RC; i++) {
                double t = tanh(x[b][i]);
                d[i] *= 0.5 + 0.25 * (1 - t * t);
            }
            break;
        case K_EMBED: ref_mm(bf, 1, 0, EC_C, EC_DIN, EC_ROWS, d, in, 1, G[0]); break;
        }
    }
    return loss;
}

typedef struct ref {
    bool bf;
    double *p, *w, *m, *v, *g; /* (ntot) master, as used (bf16-rounded when bf), moments, grad */
    int64_t t;                 /* optimizer steps taken */
    /* per step (index step - 1) */
    double *loss, *norm, *lr;
    bool *skipped, *clipped;
} ref_t;

/* torch.optim.AdamW (and torch.nn.utils.clip_grad_norm_) on the averaged gradient. */
static void ref_step(ref_t *R, int step, int nmb)
{
    double ss = 0;
    for (size_t i = 0; i < ntot; i++) {
        R->g[i] /= nmb;
        ss += R->g[i] * R->g[i];
    }
    double norm = sqrt(ss);
    R->norm[step - 1] = norm;
    R->skipped[step - 1] = !isfinite(norm);
    R->clipped[step - 1] = false;
    R->lr[step - 1] = lr_at(R->t + 1, O.lr);
    if (isfinite(norm)) {
        if (O.clip > 0 && O.clip / (norm + 1e-6) < 1) {
            double coef = O.clip / (norm + 1e-6);
            R->clipped[step - 1] = true;
            for (size_t i = 0; i < ntot; i++)
                R->g[i] *= coef;
        }
        int64_t t = ++R->t;
        double lr = lr_at(t, O.lr), b1 = 0.9, b2 = 0.999, eps = 1e-8;
        double bc1 = 1 - pow(b1, (double)t), bc2 = 1 - pow(b2, (double)t);
        for (int q = 0; q < ngp; q++) {
            double wd = gp[q].spec->flags & BMT_PARAM_NO_DECAY ? 0 : O.weight_decay;
            for (size_t i = gp[q].off; i < gp[q].off + (size_t)gp[q].numel; i++) {
                double g = R->g[i];
                R->p[i] *= 1 - lr * wd;
                R->m[i] = b1 * R->m[i] + (1 - b1) * g;
                R->v[i] = b2 * R->v[i] + (1 - b2) * g * g;
                R->p[i] -= lr / bc1 * R->m[i] / (sqrt(R->v[i]) / sqrt(bc2) + eps);
                R->w[i] = rq(R->bf, R->p[i]);
            }
        }
    }
    memset(R->g, 0, ntot * sizeof(double));
}

/* Train the reference for O.steps steps of world x accum micro-batches. Initial
 * values: bmt_init_value rounded to the parameter dtype (the bf16 master starts
 * from the bf16 parameter, as a master made from the shard does). */
static int ref_train(ref_t *R, int world)
{
    R->bf = O.dtype == BMT_BF16;
    double *arr[5];
    for (int i = 0; i < 5; i++)
        if ((arr[i] = calloc(ntot, sizeof(double))) == NULL)
            return -1;
    R->p = arr[0], R->w = arr[1], R->m = arr[2], R->v = arr[3], R->g = arr[4];
    R->loss = calloc((size_t)O.steps, sizeof(double));
    R->norm = calloc((size_t)O.steps, sizeof(double));
    R->lr = calloc((size_t)O.steps, sizeof(double));
    R->skipped = calloc((size_t)O.steps, sizeof(bool));
    R->clipped = calloc((size_t)O.steps, sizeof(bool));
    if (!R->loss || !R->norm || !R->lr || !R->skipped || !R->clipped)
        return -1;
    for (int q = 0; q < ngp; q++)
        for (int i = 0; i < gp[q].numel; i++) {
            float v = (float)bmt_init_value(O.seed, gp[q].name, (uint64_t)i, &gp[q].spec->init);
            R->p[gp[q].off + i] = rq(R->bf, v);
            R->w[gp[q].off + i] = R->p[gp[q].off + i];
        }
    float in[EC_ROWS * EC_DIN], tgt[EC_ROWS * EC_DOUT];
    int nmb = world * O.accum;
    for (int s = 1; s <= O.steps; s++) {
        double loss = 0;
        for (int gi = 0; gi < nmb; gi++) {
            make_batch(s, gi, in, tgt);
            loss += ref_microbatch(R->bf, R->w, in, tgt, R->g);
        }
        R->loss[s - 1] = loss / nmb;
        ref_step(R, s, nmb);
    }
    return 0;
}

static void ref_free(ref_t *R)
{
    free(R->p), free(R->w), free(R->m), free(R->v), free(R->g);
    free(R->loss), free(R->norm), free(R->lr), free(R->skipped), free(R->clipped);
}

/* ------------------------------------------------------------ reporting */

static bmt_ctx_t *ctx;
static int my_rank;
static long n_passed, n_failed;

static void check(bool ok, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (ok)
        n_passed++;
    else
        n_failed++;
    if (!ok)
        printf("FAIL (rank %d) %s\n", my_rank, line);
    else if (my_rank == 0)
        printf("ok %s\n", line);
    fflush(stdout);
}

/* ||a - b|| / ||b|| over n elements (0 when both are 0). */
static double rel_err(const double *a, const double *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    if (isnan(d) || isnan(r))
        return NAN;
    return r > 0 ? sqrt(d / r) : (d > 0 ? INFINITY : 0);
}

/* The finite-difference check of the reference's gradients: random parameters of
 * order one (not the init: gradients large everywhere), one micro-batch, every
 * element of every parameter, central differences in fp64. */
static void fd_check(void)
{
    double *w = malloc(ntot * sizeof(double)), *g = calloc(ntot, sizeof(double));
    float in[EC_ROWS * EC_DIN], tgt[EC_ROWS * EC_DOUT];
    if (w == NULL || g == NULL) {
        check(false, "fd: out of memory");
        return;
    }
    for (size_t i = 0; i < ntot; i++)
        w[i] = (double)(mix64(i * 77 + 5) >> 11) / 9007199254740992.0 - 0.5;
    for (int q = 0; q < ngp; q++)
        if (strstr(gp[q].name, "ln") != NULL && strstr(gp[q].name, "weight") != NULL)
            for (int i = 0; i < gp[q].numel; i++)
                w[gp[q].off + i] += 1.0; /* norm gains near one */
    make_batch(0, 0, in, tgt);
    ref_microbatch(false, w, in, tgt, g);
    const double h = 1e-5;
    double worst = 0;
    const char *worst_name = "";
    for (int q = 0; q < ngp; q++) {
        double *fd = malloc((size_t)gp[q].numel * sizeof(double));
        for (int i = 0; i < gp[q].numel; i++) {
            double *x = &w[gp[q].off + i], keep = *x;
            *x = keep + h;
            double fp = ref_microbatch(false, w, in, tgt, NULL);
            *x = keep - h;
            double fm = ref_microbatch(false, w, in, tgt, NULL);
            *x = keep;
            fd[i] = (fp - fm) / (2 * h);
        }
        double e = rel_err(g + gp[q].off, fd, (size_t)gp[q].numel);
        if (!(e <= worst)) {
            worst = e;
            worst_name = gp[q].name;
        }
        free(fd);
    }
    check(worst < 1e-6,
          "fd: the reference's gradients of all %d parameters match central differences "
          "(fp64, h 1e-5): worst relative error %.2e (%s), bound 1e-6",
          ngp, worst, worst_name);
    free(w);
    free(g);
}

/* ------------------------------------------------------------ cpu ops (reference of the kernels)
 */

static float ld(const void *p, bmt_dtype_t t, size_t i)
{
    return t == BMT_BF16 ? bmt_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static float to_bf16(float x) { return bmt_bf16_to_f32(bmt_f32_to_bf16(x)); }

static int cpu_gemm(void *dev, void *stream, int ta, int tb, int M, int N, int K, const void *A,
                    bmt_dtype_t at, const void *B, bmt_dtype_t bt, float beta, float *Cm,
                    bmt_dtype_t cd, bmt_error_t *err)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++) {
                float a = ld(A, at, ta ? (size_t)k * M + i : (size_t)i * K + k);
                float b = ld(B, bt, tb ? (size_t)j * K + k : (size_t)k * N + j);
                if (cd == BMT_BF16)
                    a = to_bf16(a), b = to_bf16(b);
                acc += a * b;
            }
            Cm[i * N + j] = beta != 0 ? beta * Cm[i * N + j] + acc : acc;
        }
    return 0;
}

static int cpu_ln_fwd(void *dev, void *stream, int M, int N, const float *x, const void *w,
                      const void *b, bmt_dtype_t pt, float *y, float *mean, float *rstd,
                      bmt_error_t *err)
{
    for (int r = 0; r < M; r++) {
        const float *xr = x + (size_t)r * N;
        float mu = 0, var = 0;
        for (int j = 0; j < N; j++)
            mu += xr[j];
        mu /= N;
        for (int j = 0; j < N; j++)
            var += (xr[j] - mu) * (xr[j] - mu);
        var /= N;
        float rs = 1.0f / sqrtf(var + EC_LN_EPS);
        mean[r] = mu;
        rstd[r] = rs;
        for (int j = 0; j < N; j++)
            y[(size_t)r * N + j] = (xr[j] - mu) * rs * ld(w, pt, j) + ld(b, pt, j);
    }
    return 0;
}

static int cpu_ln_bwd(void *dev, void *stream, int M, int N, const float *x, const float *mean,
                      const float *rstd, const void *w, bmt_dtype_t pt, const float *dy, float *dx,
                      float *dw, float *db, bmt_error_t *err)
{
    for (int r = 0; r < M; r++) {
        const float *xr = x + (size_t)r * N, *dyr = dy + (size_t)r * N;
        float s1 = 0, s2 = 0;
        for (int j = 0; j < N; j++) {
            float xhat = (xr[j] - mean[r]) * rstd[r], g = dyr[j] * ld(w, pt, j);
            s1 += g;
            s2 += g * xhat;
        }
        for (int j = 0; j < N; j++) {
            float xhat = (xr[j] - mean[r]) * rstd[r], g = dyr[j] * ld(w, pt, j);
            dx[(size_t)r * N + j] += rstd[r] * (g - s1 / N - xhat * (s2 / N));
        }
    }
    for (int j = 0; j < N; j++)
        for (int r = 0; r < M; r++) {
            float xhat = (x[(size_t)r * N + j] - mean[r]) * rstd[r];
            dw[j] += dy[(size_t)r * N + j] * xhat;
            db[j] += dy[(size_t)r * N + j];
        }
    return 0;
}

static int cpu_bias_add(void *dev, void *stream, int M, int N, float *y, const void *b,
                        bmt_dtype_t pt, bmt_error_t *err)
{
    for (int r = 0; r < M; r++)
        for (int j = 0; j < N; j++)
            y[(size_t)r * N + j] += ld(b, pt, j);
    return 0;
}

static int cpu_bias_grad(void *dev, void *stream, int M, int N, const float *dy, float *db,
                         bmt_error_t *err)
{
    for (int j = 0; j < N; j++)
        for (int r = 0; r < M; r++)
            db[j] += dy[(size_t)r * N + j];
    return 0;
}

static int cpu_gelu_fwd(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err)
{
    for (int i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf((float)GELU_K * (v + 0.044715f * v * v * v)));
    }
    return 0;
}

static int cpu_gelu_bwd(void *dev, void *stream, int n, const float *x, const float *dy, float *dx,
                        bmt_error_t *err)
{
    for (int i = 0; i < n; i++) {
        float v = x[i], t = tanhf((float)GELU_K * (v + 0.044715f * v * v * v));
        float d = 0.5f * (1.0f + t) +
                  0.5f * v * (1.0f - t * t) * (float)GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dy[i] * d;
    }
    return 0;
}

static int cpu_mix_fwd(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err)
{
    for (int i = 0; i < n; i++)
        y[i] = 0.5f * x[i] + 0.25f * tanhf(x[i]);
    return 0;
}

static int cpu_mix_bwd(void *dev, void *stream, int n, const float *x, const float *dy, float *dx,
                       bmt_error_t *err)
{
    for (int i = 0; i < n; i++) {
        float t = tanhf(x[i]);
        dx[i] = dy[i] * (0.5f + 0.25f * (1.0f - t * t));
    }
    return 0;
}

static int cpu_copy(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err)
{
    for (int i = 0; i < n; i++)
        y[i] = x ? x[i] : 0.0f;
    return 0;
}

static int cpu_mse(void *dev, void *stream, int M, int N, const float *out, const float *target,
                   float *loss, float *dout, bmt_error_t *err)
{
    float s = 0;
    for (int i = 0; i < M * N; i++) {
        float d = out[i] - target[i];
        s += d * d;
        if (dout)
            dout[i] = d / (float)(M * N);
    }
    if (loss)
        *loss = s / (float)(2 * M * N);
    return 0;
}

static const ec_ops_t cpu_ops = { cpu_gemm,      cpu_ln_fwd,   cpu_ln_bwd,   cpu_bias_add,
                                  cpu_bias_grad, cpu_gelu_fwd, cpu_gelu_bwd, cpu_mix_fwd,
                                  cpu_mix_bwd,   cpu_copy,     cpu_mse };

/* ------------------------------------------------------------ the model (block callbacks) */

typedef struct saved {
    float *ln, *mean, *rstd; /* (ROWS, C), (ROWS), (ROWS) */
    float *pre, *act;        /* (ROWS, H): resid */
    float *out;              /* (ROWS, DOUT): head */
    bool valid;              /* kept by a forward, not yet used by a backward */
} saved_t;

typedef struct model {
    bmt_ctx_t *ctx;
    const ec_ops_t *ops;
    void *dev;          /* ec_cuda_t on cuda, NULL on cpu */
    bmt_dtype_t pt;     /* parameter dtype */
    bmt_dtype_t cd;     /* matmul operands: f32, or bf16 for bf16 parameters */
    bool ckpt[NBLOCKS]; /* each use's checkpointing: what keep_activations must say */
    bool host;          /* buffers are host memory (cpu) */
    bmt_block_t *blocks[NBLOCKS];
    int mb;                       /* micro-batch of the step now running */
    bool overlap;                 /* the optimizer's overlap */
    int overwrite;                /* opts_t.overwrite of this run */
    bool poison;                  /* BMT_CHECK_OVERWRITE=1: fresh gradients are NaN */
    bool pending;                 /* the last step's update is deferred (overlap): each block's
                                   * gradient shards live until just before its gather */
    uint64_t grad_after[NBLOCKS]; /* this rank's gradient shard bytes of blocks > b */
    float *mem;                   /* one ACTIVATION allocation carved below */
    float *data;                  /* (accum, ROWS, DIN) this rank's inputs of this step */
    float *target;                /* (accum, ROWS, DOUT) */
    float *loss;                  /* (accum) loss of each micro-batch */
    float *x[NBLOCKS + 1];        /* x[b]: input of block b (ROWS, C), b >= 1 */
    float *dx[NBLOCKS + 1];       /* dL/dx[b] */
    saved_t saved[NBLOCKS], scratch;
    float *dact, *dpre, *dln, *dout; /* backward scratch (ROWS,H) x2, (ROWS,C), (ROWS,DOUT) */
    /* protocol: calls per block in this micro-batch, first complaint, count */
    int nfwd[NBLOCKS], nrec[NBLOCKS], nbwd[NBLOCKS];
    char complaint[200];
    long ncomplaints, ncalls;
} model_t;

static void complain(model_t *m, const char *fmt, ...)
{
    if (m->ncomplaints++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->complaint, sizeof(m->complaint), fmt, ap);
        va_end(ap);
    }
}

/* Checks every call against what the header promises; returns the block index. */
static int verify_call(model_t *m, const bmt_block_call_t *call, int kind, bool backward)
{
    int b = call->index;
    m->ncalls++;
    if (b < 0 || b >= NBLOCKS || call->block != m->blocks[b] || block_kind[b] != kind) {
        complain(m, "call index %d does not match the block passed (%s)", b,
                 call->block ? bmt_block_name(call->block) : "NULL");
        return -1;
    }
    if (call->stream != bmt_compute_stream(m->ctx))
        complain(m, "block %d: call->stream is not the compute stream", b);
    if (call->microbatch != m->mb)
        complain(m, "block %d: call->microbatch %d, this is micro-batch %d", b, call->microbatch,
                 m->mb);
    if (gp_count[b] > 0 && call->params == NULL)
        complain(m, "block %d: params NULL", b);
    if (backward) {
        if (gp_count[b] > 0 && call->grads == NULL)
            complain(m, "block %d: backward without grads", b);
        if (m->nbwd[b]++ != 0)
            complain(m, "block %d: second backward in one micro-batch", b);
        /* No tied uses here: fresh when nothing of the step is in them yet. */
        const bool fresh =
            gp_count[b] > 0 && (bmt_layout(m->ctx)->gpus_per_group > 1 || m->mb == 0);
        if (call->grads_fresh != fresh)
            complain(m, "block %d: grads_fresh %d in micro-batch %d, want %d", b,
                     (int)call->grads_fresh, m->mb, (int)fresh);
        if (m->nfwd[b] != 1 || m->nrec[b] != (m->ckpt[b] ? 1 : 0))
            complain(m, "block %d: backward after %d forwards and %d recomputations", b, m->nfwd[b],
                     m->nrec[b]);
        /* The runtime zeroes full gradients before the call; a group of one
         * adds into the shards, zero at a step's first micro-batch. Left to
         * the callbacks (overwrite), they are NaN under BMT_CHECK_OVERWRITE. */
        if (m->host && fresh && (m->overwrite == 0 || m->poison))
            for (int k = 0; k < gp_count[b]; k++)
                for (int i = 0; i < gp[gp_first[b] + k].numel; i++) {
                    const float g = ((const float *)call->grads[k])[i];
                    if (m->overwrite == 0 ? g != 0.0f : g == g) {
                        complain(m, "block %d: gradient %d not %s before backward", b, k,
                                 m->overwrite == 0 ? "zeroed" : "NaN-filled");
                        break;
                    }
                }
    } else {
        if (call->grads != NULL || call->grads_fresh)
            complain(m, "block %d: forward with grads", b);
        if (call->recompute) {
            if (!m->ckpt[b])
                complain(m, "block %d: recompute without checkpointing", b);
            if (m->nrec[b]++ != 0 || m->nfwd[b] != 1 || m->nbwd[b] != 0)
                complain(m, "block %d: recompute out of order", b);
        } else {
            if (m->nfwd[b]++ != 0)
                complain(m, "block %d: second forward in one micro-batch", b);
            /* A step's first forward holds no gradient shards, or with a
             * deferred update only those of the blocks after b (each block's
             * go back just before its forward, once its update is done). */
            bmt_mem_stats_t st;
            bmt_mem_get_stats(m->ctx, &st);
            const uint64_t want = m->pending ? m->grad_after[b] : 0;
            if (m->mb == 0 && st.current[BMT_MEM_GRAD] != want)
                complain(m,
                         "block %d: %llu bytes of gradient shards held in a step's first "
                         "forward, want %llu (they live from the backward to the optimizer's "
                         "step, or with a deferred update to the block's gather)",
                         b, (unsigned long long)st.current[BMT_MEM_GRAD], (unsigned long long)want);
            if (call->keep_activations != !m->ckpt[b])
                complain(m, "block %d: keep_activations %d with checkpointing %d", b,
                         (int)call->keep_activations, (int)m->ckpt[b]);
        }
    }
    return b;
}

/* Where a forward writes what backward needs: the block's own buffers when it is
 * to keep them (or recomputes them), else the shared scratch. */
static saved_t *save_area(model_t *m, const bmt_block_call_t *call, int b)
{
    bool keep = call->keep_activations || call->recompute;
    m->saved[b].valid = keep;
    return keep ? &m->saved[b] : &m->scratch;
}

static int need_saved(model_t *m, int b, bmt_error_t *err)
{
    if (m->saved[b].valid)
        return 0;
    snprintf(err->text, sizeof(err->text),
             "engine_check: block %d (%s): backward without its activations (neither kept nor "
             "recomputed)",
             b, block_name[b]);
    return -1;
}

#define OPS (m->ops)

/* The beta of a product into gradient g: 0 where the callbacks overwrite a
 * fresh gradient (--overwrite 1), else 1 (add). */
static float gbeta(const model_t *m, const bmt_block_call_t *call)
{
    return m->overwrite == 1 && call->grads_fresh ? 0.0f : 1.0f;
}

/* Before an op that adds into gradient k: zeros (bmt_block_call_zero_grad),
 * where the callbacks must write a fresh one (--overwrite 1). */
static int fresh_zero(const model_t *m, const bmt_block_call_t *call, int k, bmt_error_t *err)
{
    return m->overwrite == 1 && call->grads_fresh ? bmt_block_call_zero_grad(call, k, err) : 0;
}

static int embed_forward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_EMBED, false);
    if (b < 0)
        return 0;
    save_area(m, call, b);
    if (call->recompute) /* nothing to rebuild: the input is the data */
        return 0;
    const float *in = m->data + (size_t)m->mb * EC_ROWS * EC_DIN;
    return OPS->gemm(m->dev, call->stream, 0, 1, EC_ROWS, EC_C, EC_DIN, in, BMT_F32,
                     call->params[0], m->pt, 0, m->x[b + 1], m->cd, err);
}

static int embed_backward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_EMBED, true);
    if (b < 0)
        return 0;
    const float *in = m->data + (size_t)m->mb * EC_ROWS * EC_DIN;
    return OPS->gemm(m->dev, call->stream, 1, 0, EC_C, EC_DIN, EC_ROWS, m->dx[b + 1], BMT_F32, in,
                     BMT_F32, gbeta(m, call), call->grads[0], m->cd, err);
}

static int resid_forward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_RESID, false);
    if (b < 0)
        return 0;
    saved_t *s = save_area(m, call, b);
    void *st = call->stream, *dev = m->dev;
    void *const *P = call->params;
    if (OPS->ln_fwd(dev, st, EC_ROWS, EC_C, m->x[b], P[R_LNW], P[R_LNB], m->pt, s->ln, s->mean,
                    s->rstd, err) < 0 ||
        OPS->gemm(dev, st, 0, 0, EC_ROWS, EC_H, EC_C, s->ln, BMT_F32, P[R_FCW], m->pt, 0, s->pre,
                  m->cd, err) < 0 ||
        OPS->bias_add(dev, st, EC_ROWS, EC_H, s->pre, P[R_FCB], m->pt, err) < 0 ||
        OPS->gelu_fwd(dev, st, EC_ROWS * EC_H, s->pre, s->act, err) < 0)
        return -1;
    if (call->recompute) /* the output was consumed already */
        return 0;
    float *y = m->x[b + 1];
    if (OPS->copy(dev, st, EC_ROWS * EC_C, m->x[b], y, err) < 0 ||
        OPS->gemm(dev, st, 0, 0, EC_ROWS, EC_C, EC_H, s->act, BMT_F32, P[R_PRW], m->pt, 1, y, m->cd,
                  err) < 0 ||
        OPS->bias_add(dev, st, EC_ROWS, EC_C, y, P[R_PRB], m->pt, err) < 0)
        return -1;
    return 0;
}

static int resid_backward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_RESID, true);
    if (b < 0)
        return 0;
    if (need_saved(m, b, err) < 0)
        return -1;
    saved_t *s = &m->saved[b];
    void *st = call->stream, *dev = m->dev;
    void *const *P = call->params;
    float *const *G = (float *const *)call->grads;
    const float *dy = m->dx[b + 1];
    s->valid = false;
    const float beta = gbeta(m, call);
    if (fresh_zero(m, call, R_PRB, err) < 0 || fresh_zero(m, call, R_FCB, err) < 0 ||
        fresh_zero(m, call, R_LNW, err) < 0 || fresh_zero(m, call, R_LNB, err) < 0)
        return -1;
    if (OPS->bias_grad(dev, st, EC_ROWS, EC_C, dy, G[R_PRB], err) < 0 ||
        OPS->gemm(dev, st, 1, 0, EC_H, EC_C, EC_ROWS, s->act, BMT_F32, dy, BMT_F32, beta, G[R_PRW],
                  m->cd, err) < 0 ||
        OPS->gemm(dev, st, 0, 1, EC_ROWS, EC_H, EC_C, dy, BMT_F32, P[R_PRW], m->pt, 0, m->dact,
                  m->cd, err) < 0 ||
        OPS->gelu_bwd(dev, st, EC_ROWS * EC_H, s->pre, m->dact, m->dpre, err) < 0 ||
        OPS->bias_grad(dev, st, EC_ROWS, EC_H, m->dpre, G[R_FCB], err) < 0 ||
        OPS->gemm(dev, st, 1, 0, EC_C, EC_H, EC_ROWS, s->ln, BMT_F32, m->dpre, BMT_F32, beta,
                  G[R_FCW], m->cd, err) < 0 ||
        OPS->gemm(dev, st, 0, 1, EC_ROWS, EC_C, EC_H, m->dpre, BMT_F32, P[R_FCW], m->pt, 0, m->dln,
                  m->cd, err) < 0 ||
        OPS->copy(dev, st, EC_ROWS * EC_C, dy, m->dx[b], err) < 0 ||
        OPS->ln_bwd(dev, st, EC_ROWS, EC_C, m->x[b], s->mean, s->rstd, P[R_LNW], m->pt, m->dln,
                    m->dx[b], G[R_LNW], G[R_LNB], err) < 0)
        return -1;
    return 0;
}

static int mix_forward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_MIX, false);
    if (b < 0)
        return 0;
    save_area(m, call, b);
    if (call->recompute)
        return 0;
    return OPS->mix_fwd(m->dev, call->stream, EC_ROWS * EC_C, m->x[b], m->x[b + 1], err);
}

static int mix_backward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_MIX, true);
    if (b < 0)
        return 0;
    return OPS->mix_bwd(m->dev, call->stream, EC_ROWS * EC_C, m->x[b], m->dx[b + 1], m->dx[b], err);
}

static int head_forward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_HEAD, false);
    if (b < 0)
        return 0;
    saved_t *s = save_area(m, call, b);
    void *st = call->stream, *dev = m->dev;
    void *const *P = call->params;
    const float *tgt = m->target + (size_t)m->mb * EC_ROWS * EC_DOUT;
    if (OPS->ln_fwd(dev, st, EC_ROWS, EC_C, m->x[b], P[H_LNW], P[H_LNB], m->pt, s->ln, s->mean,
                    s->rstd, err) < 0 ||
        OPS->gemm(dev, st, 0, 0, EC_ROWS, EC_DOUT, EC_C, s->ln, BMT_F32, P[H_OUTW], m->pt, 0,
                  s->out, m->cd, err) < 0)
        return -1;
    if (call->recompute)
        return 0;
    return OPS->mse(dev, st, EC_ROWS, EC_DOUT, s->out, tgt, m->loss + m->mb, NULL, err);
}

static int head_backward(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    model_t *m = model;
    int b = verify_call(m, call, K_HEAD, true);
    if (b < 0)
        return 0;
    if (need_saved(m, b, err) < 0)
        return -1;
    saved_t *s = &m->saved[b];
    void *st = call->stream, *dev = m->dev;
    void *const *P = call->params;
    float *const *G = (float *const *)call->grads;
    const float *tgt = m->target + (size_t)m->mb * EC_ROWS * EC_DOUT;
    s->valid = false;
    if (fresh_zero(m, call, H_LNW, err) < 0 || fresh_zero(m, call, H_LNB, err) < 0)
        return -1;
    if (OPS->mse(dev, st, EC_ROWS, EC_DOUT, s->out, tgt, NULL, m->dout, err) < 0 ||
        OPS->gemm(dev, st, 1, 0, EC_C, EC_DOUT, EC_ROWS, s->ln, BMT_F32, m->dout, BMT_F32,
                  gbeta(m, call), G[H_OUTW], m->cd, err) < 0 ||
        OPS->gemm(dev, st, 0, 1, EC_ROWS, EC_C, EC_DOUT, m->dout, BMT_F32, P[H_OUTW], m->pt, 0,
                  m->dln, m->cd, err) < 0 ||
        OPS->copy(dev, st, EC_ROWS * EC_C, NULL, m->dx[b], err) < 0 ||
        OPS->ln_bwd(dev, st, EC_ROWS, EC_C, m->x[b], s->mean, s->rstd, P[H_LNW], m->pt, m->dln,
                    m->dx[b], G[H_LNW], G[H_LNB], err) < 0)
        return -1;
    return 0;
}

static const bmt_block_ops_t kind_ops[4] = {
    { embed_forward, embed_backward },
    { resid_forward, resid_backward },
    { mix_forward, mix_backward },
    { head_forward, head_backward },
};

/* Whether block b is recomputed under --ckpt c: 0 none, 1 every block, 2
 * selective (bmt_blocklist_set_checkpointing on a list made with 0): the
 * odd-numbered blocks, so that a kept block's backward follows a recomputed
 * one's and the other way round. */
static bool ckpt_of(int c, int b) { return c == 1 || (c == 2 && b % 2 == 1); }

/* Activations: one allocation (BMT_MEM_ACTIVATION), carved in 256-byte pieces. */
static model_t *model_create(bmt_ctx_t *c, const ec_ops_t *ops, void *dev, int ckpt,
                             bmt_error_t *err)
{
    model_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        snprintf(err->text, sizeof(err->text), "engine_check: out of memory");
        return NULL;
    }
    m->ctx = c;
    m->ops = ops;
    m->dev = dev;
    m->pt = O.dtype;
    m->cd = O.dtype == BMT_BF16 ? BMT_BF16 : BMT_F32;
    for (int b = 0; b < NBLOCKS; b++)
        m->ckpt[b] = ckpt_of(ckpt, b);
    m->host = bmt_device(c) == BMT_DEVICE_CPU;
    enum {
        RC = EC_ROWS * EC_C,
        RH = EC_ROWS * EC_H,
        RO = EC_ROWS * EC_DOUT
    };
    /* Two passes: count, then carve. */
    size_t used = 0;
    for (int pass = 0; pass < 2; pass++) {
        used = 0;
#define CARVE(ptr, n)                                                                              \
    do {                                                                                           \
        (ptr) = pass ? m->mem + used : NULL;                                                       \
        used += ((size_t)(n) + 63) & ~(size_t)63;                                                  \
    } while (0)
        CARVE(m->data, (size_t)O.accum * EC_ROWS * EC_DIN);
        CARVE(m->target, (size_t)O.accum * RO);
        CARVE(m->loss, O.accum);
        for (int b = 1; b <= NBLOCKS; b++) {
            CARVE(m->x[b], RC);
            CARVE(m->dx[b], RC);
        }
        for (int b = 0; b <= NBLOCKS; b++) {
            saved_t *s = b < NBLOCKS ? &m->saved[b] : &m->scratch;
            CARVE(s->ln, RC);
            CARVE(s->mean, EC_ROWS);
            CARVE(s->rstd, EC_ROWS);
            CARVE(s->pre, RH);
            CARVE(s->act, RH);
            CARVE(s->out, RO);
        }
        CARVE(m->dact, RH);
        CARVE(m->dpre, RH);
        CARVE(m->dln, RC);
        CARVE(m->dout, RO);
#undef CARVE
        if (pass == 0 && (m->mem = bmt_alloc(c, BMT_MEM_ACTIVATION, used * 4, err)) == NULL) {
            free(m);
            return NULL;
        }
    }
    return m;
}

static void model_destroy(model_t *m)
{
    if (m == NULL)
        return;
    bmt_free(m->ctx, m->mem);
    free(m);
}

/* ------------------------------------------------------------ engine runs */

typedef struct run_cfg {
    int zero, ckpt, overlap, overwrite;
    bool first; /* the run that also checks init, dumps it and tries misuse */
} run_cfg_t;

typedef struct shard_bytes {
    uint64_t param, grad, optim; /* this rank's shards */
    uint64_t largest_full;       /* the largest block's full (gathered) buffers */
    uint64_t largest_grad_full;  /* ... and its full f32 gradients */
    uint64_t largest_grad_pair;  /* the most two successive blocks' full gradients take */
    uint64_t largest_padded;     /* elements of the largest padded flat buffer */
    int with_params;             /* blocks that have parameters */
    uint64_t grad_of[NBLOCKS];   /* each block's f32 gradient shards */
} shard_bytes_t;

/* The documented layout (bmt/block.h): per block and dtype, each parameter starts
 * at a multiple of BMT_BLOCK_ALIGN elements, the buffer is padded to a multiple of
 * BMT_BLOCK_ALIGN x group size, and a rank's shard is padded / group size. All
 * parameters of this model share one dtype. A full (gathered) buffer holds the
 * padded dtype groups back to back, each rounded up to FULL_ALIGN bytes (what
 * runtime/block.c does; bmt/block.h does not say it). */
#define FULL_ALIGN 256
static shard_bytes_t expected_bytes(int gsize)
{
    shard_bytes_t e;
    memset(&e, 0, sizeof(e));
    size_t ps = bmt_dtype_size(O.dtype);
    uint64_t prev = 0; /* the full gradients of the last block with parameters */
    for (int b = 0; b < NBLOCKS; b++) {
        uint64_t end = 0;
        for (int k = 0; k < gp_count[b]; k++) {
            end = (end + BMT_BLOCK_ALIGN - 1) / BMT_BLOCK_ALIGN * BMT_BLOCK_ALIGN;
            end += (uint64_t)gp[gp_first[b] + k].numel;
        }
        uint64_t unit = (uint64_t)BMT_BLOCK_ALIGN * (uint64_t)gsize;
        uint64_t padded = (end + unit - 1) / unit * unit, shard = padded / (uint64_t)gsize;
        e.param += shard * ps;
        e.grad += shard * 4;
        e.grad_of[b] = gp_count[b] > 0 ? shard * 4 : 0;
        /* moments, and the master: f32, or split (its low halves beside the shard) */
        e.optim += shard * (O.dtype == BMT_F32 ? 8 : O.master_only == 2 ? 10 : 12);
        uint64_t full = (padded * ps + FULL_ALIGN - 1) / FULL_ALIGN * FULL_ALIGN;
        uint64_t gfull = (padded * 4 + FULL_ALIGN - 1) / FULL_ALIGN * FULL_ALIGN;
        if (full > e.largest_full)
            e.largest_full = full;
        if (gfull > e.largest_grad_full)
            e.largest_grad_full = gfull;
        if (gp_count[b] > 0) {
            if (prev + gfull > e.largest_grad_pair)
                e.largest_grad_pair = prev + gfull;
            prev = gfull;
        }
        if (padded > e.largest_padded)
            e.largest_padded = padded;
        e.with_params += gp_count[b] > 0;
    }
    return e;
}

static uint64_t fnv1a(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

/* Gather block b, download every parameter (host copies in out[k]), release. */
static int download_block(bmt_block_t *blk, int b, void **out, bmt_error_t *err)
{
    if (bmt_block_gather(blk, err) < 0)
        return -1;
    int rc = 0;
    size_t es = bmt_dtype_size(O.dtype);
    for (int k = 0; k < gp_count[b] && rc == 0; k++) {
        const void *p = bmt_block_param(blk, k);
        out[k] = malloc((size_t)gp[gp_first[b] + k].numel * es);
        if (p == NULL || out[k] == NULL) {
            snprintf(err->text, sizeof(err->text), "bmt_block_param(%s, %d) is NULL", block_name[b],
                     k);
            rc = -1;
        } else
            rc = bmt_mem_download(ctx, out[k], p, (size_t)gp[gp_first[b] + k].numel * es, err);
    }
    if (bmt_block_release(blk, rc == 0 ? err : NULL) < 0 && rc == 0)
        rc = -1;
    return rc;
}

/* Check 1: every parameter is bmt_init_value rounded to the dtype, bitwise; the
 * block reports the names, sizes and dtypes it was given. */
static int check_init(bmt_block_t **blocks, bmt_error_t *err)
{
    FILE *dump = NULL;
    if (O.init_dump && my_rank == 0 && (dump = fopen(O.init_dump, "w")) == NULL) {
        snprintf(err->text, sizeof(err->text), "cannot write %s", O.init_dump);
        return -1;
    }
    uint64_t all = 0xcbf29ce484222325ULL;
    for (int b = 0; b < NBLOCKS; b++) {
        void *host[MAXP] = { NULL };
        if (download_block(blocks[b], b, host, err) < 0)
            return -1;
        long bad = 0, total = 0;
        char first[200] = "";
        bool meta = bmt_block_num_params(blocks[b]) == gp_count[b];
        for (int k = 0; k < gp_count[b]; k++) {
            const gparam_t *g = &gp[gp_first[b] + k];
            const char *nm = bmt_block_param_name(blocks[b], k);
            meta = meta && nm && strcmp(nm, g->name) == 0 &&
                   bmt_block_param_numel(blocks[b], k) == g->numel &&
                   bmt_block_param_dtype(blocks[b], k) == (int)O.dtype;
            for (int i = 0; i < g->numel; i++, total++) {
                float v = (float)bmt_init_value(O.seed, g->name, (uint64_t)i, &g->spec->init);
                bool same;
                if (O.dtype == BMT_BF16)
                    same = ((uint16_t *)host[k])[i] == bmt_f32_to_bf16(v);
                else
                    same = memcmp((float *)host[k] + i, &v, 4) == 0;
                if (!same && bad++ == 0)
                    snprintf(first, sizeof(first), "; first: %s[%d] is %.9g, expected %.9g",
                             g->name, i, ld(host[k], O.dtype, (size_t)i), (double)v);
            }
            size_t bytes = (size_t)g->numel * bmt_dtype_size(O.dtype);
            uint64_t h = fnv1a(host[k], bytes, 0xcbf29ce484222325ULL);
            all = fnv1a(host[k], bytes, all);
            if (dump)
                fprintf(dump, "%s %s %d %016llx\n", g->name, bmt_dtype_name(O.dtype), g->numel,
                        (unsigned long long)h);
        }
        check(meta, "init: block %s reports the %d parameters it was given (names, numel, dtype)",
              block_name[b], gp_count[b]);
        check(bad == 0, "init: block %s: %ld of %ld elements equal bmt_init_value as %s bitwise%s",
              block_name[b], total - bad, total, bmt_dtype_name(O.dtype), first);
        for (int k = 0; k < gp_count[b]; k++)
            free(host[k]);
    }
    if (dump) {
        fprintf(dump, "all %016llx\n", (unsigned long long)all);
        fclose(dump);
    }
    return 0;
}

/* Check 4, on the trained list: misuse returns an error and changes nothing
 * (the parameters are compared with the reference afterwards). */
static void misuse_list(bmt_blocklist_t *list, bmt_optim_t *opt, const char *when)
{
    bmt_error_t e;
    bmt_step_info_t info;
    memset(&e, 0, sizeof(e));
    int rc = bmt_optim_step(opt, &info, &e);
    check(rc == -1 && e.text[0],
          "bad use (%s): bmt_optim_step without a backward since the last "
          "step fails: \"%s\"",
          when, rc == -1 ? e.text : "it returned 0");
    memset(&e, 0, sizeof(e));
    rc = bmt_blocklist_backward(list, true, &e);
    check(rc == -1 && e.text[0],
          "bad use (%s): bmt_blocklist_backward without a forward fails: "
          "\"%s\"",
          when, rc == -1 ? e.text : "it returned 0");
    /* Checkpointing is chosen before the first forward (so after training
     * it is refused); a use out of range never. Neither changes what the
     * list does (its runs are checked after). */
    const bool was = bmt_blocklist_checkpointing(list, 1), trained = strstr(when, "after") != NULL;
    memset(&e, 0, sizeof(e));
    rc = bmt_blocklist_set_checkpointing(list, 1, trained ? !was : was, &e);
    check(trained ? rc == -1 && e.text[0] && bmt_blocklist_checkpointing(list, 1) == was
                  : rc == 0 && bmt_blocklist_checkpointing(list, 1) == was,
          "bad use (%s): bmt_blocklist_set_checkpointing %s: \"%s\"", when,
          trained ? "after the first forward fails and changes nothing"
                  : "before the first forward succeeds (the same value again)",
          rc == -1 ? e.text : "it returned 0");
    memset(&e, 0, sizeof(e));
    rc = bmt_blocklist_set_checkpointing(list, NBLOCKS, true, &e);
    check(rc == -1 && e.text[0] && !bmt_blocklist_checkpointing(list, NBLOCKS) &&
              !bmt_blocklist_checkpointing(list, -1),
          "bad use (%s): bmt_blocklist_set_checkpointing of use %d (out of range) fails: \"%s\"",
          when, NBLOCKS, rc == -1 ? e.text : "it returned 0");
}

/* Check 4, on blocks of their own. */
/* Check 4 (continued), on the trained list after its parameters were compared:
 * calls in an order the engine must refuse, each refused without breaking the
 * list, and the sequences it must accept. Every rank makes the same calls. */
static void misuse_order(bmt_blocklist_t *list, bmt_optim_t *opt, bmt_block_t *b0)
{
    bmt_error_t e;
    bmt_step_info_t info;
    const int64_t shape[1] = { 5 };
    int rc;

    memset(&e, 0, sizeof(e));
    bmt_block_t *late = bmt_block_create(ctx, "misuse.late", &e);
    if (late &&
        bmt_block_add_param(late, "w", 1, shape, O.dtype, (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 }, 0,
                            &e) >= 0 &&
        bmt_block_build(late, O.seed, &e) == 0) {
        int n = bmt_blocklist_size(list);
        memset(&e, 0, sizeof(e));
        rc = bmt_blocklist_append(list, late, &kind_ops[K_MIX], NULL, &e);
        check(rc == -1 && strstr(e.text, "before the first forward") &&
                  bmt_blocklist_size(list) == n,
              "bad use: appending a block after training started fails: \"%s\"",
              rc == -1 ? e.text : "it returned 0");
        if (rc == 0)
            late = NULL;
    } else
        check(false, "bad use: making a block to append late: %s", e.text);
    bmt_block_destroy(late);

    bmt_error_t e1, e2, e3;
    memset(&e1, 0, sizeof(e1));
    memset(&e2, 0, sizeof(e2));
    memset(&e3, 0, sizeof(e3));
    rc = bmt_blocklist_forward(list, &e1) || bmt_blocklist_backward(list, true, &e1) ||
         bmt_blocklist_forward(list, &e1);
    int again = rc ? 0 : bmt_blocklist_backward(list, true, &e2);
    check(rc == 0 && again == -1 && strstr(e2.text, "call bmt_optim_step first"),
          "bad use: a second backward with last_microbatch before the step fails: \"%s\"",
          rc            ? e1.text
          : again == -1 ? e2.text
                        : "it returned 0");
    rc = bmt_optim_step(opt, &info, &e1);
    int after = rc ? 0 : bmt_blocklist_backward(list, true, &e3);
    check(rc == 0 && after == -1 && strstr(e3.text, "without a forward"),
          "bad use: the step cancels a pending forward: a backward right after it fails: \"%s\"",
          rc            ? e1.text
          : after == -1 ? e3.text
                        : "it returned 0");

    memset(&e1, 0, sizeof(e1));
    memset(&e2, 0, sizeof(e2));
    rc = bmt_block_gather(b0, &e1);
    int fw = rc ? 0 : bmt_blocklist_forward(list, &e2);
    int rel = rc ? -1 : bmt_block_release(b0, &e1);
    int ok = rel == 0 && bmt_blocklist_forward(list, &e1) == 0 &&
             bmt_blocklist_backward(list, true, &e1) == 0 && bmt_optim_step(opt, &info, &e1) == 0;
    check(rc == 0 && fw == -1 && strstr(e2.text, "release it") && ok,
          "bad use: the list refuses to run while bmt_block_gather holds a block, and runs after "
          "the release: \"%s\"",
          fw == -1     ? e2.text
          : e1.text[0] ? e1.text
                       : "the forward returned 0");

    /* Overwriting fresh gradients is the backward's business: not changed
     * between a forward and its backward, which then runs as it would have. */
    memset(&e1, 0, sizeof(e1));
    memset(&e2, 0, sizeof(e2));
    const bool ow = bmt_blocklist_grad_overwrite(list);
    rc = bmt_blocklist_forward(list, &e1);
    int set = rc ? 0 : bmt_blocklist_set_grad_overwrite(list, !ow, &e2);
    const bool kept = bmt_blocklist_grad_overwrite(list) == ow;
    ok = rc == 0 && bmt_blocklist_backward(list, true, &e1) == 0 &&
         bmt_optim_step(opt, &info, &e1) == 0;
    check(rc == 0 && set == -1 && strstr(e2.text, "before the forward") && kept && ok,
          "bad use: bmt_blocklist_set_grad_overwrite between a forward and its backward fails and "
          "changes nothing: \"%s\"",
          set == -1    ? e2.text
          : e1.text[0] ? e1.text
                       : "it returned 0");
    memset(&e1, 0, sizeof(e1));
    rc = bmt_blocklist_set_grad_overwrite(NULL, true, &e1);
    check(rc == -1 && e1.text[0] && !bmt_blocklist_grad_overwrite(NULL),
          "bad use: bmt_blocklist_set_grad_overwrite of no list fails: \"%s\"",
          rc == -1 ? e1.text : "it returned 0");
    /* bmt_block_call_zero_grad: a forward's call (no gradients) and a
     * parameter out of range are refused before anything is written. */
    void *none[1] = { NULL };
    const bmt_block_call_t fwd = { .index = 0, .block = b0 },
                           bwd = { .index = 0, .block = b0, .grads = none };
    memset(&e1, 0, sizeof(e1));
    memset(&e2, 0, sizeof(e2));
    rc = bmt_block_call_zero_grad(&fwd, 0, &e1);
    int oor = bmt_block_call_zero_grad(&bwd, gp_count[0], &e2);
    check(rc == -1 && strstr(e1.text, "not a backward call") && oor == -1 &&
              strstr(e2.text, "has parameters 0..0"),
          "bad use: bmt_block_call_zero_grad of a forward's call or of a parameter out of range "
          "fails: \"%s\", \"%s\"",
          e1.text, e2.text);
}

static int misuse_blocks(bmt_error_t *err)
{
    const int64_t shape[1] = { 5 }, bad_shape[1] = { -3 };
    bmt_block_t *a = bmt_block_create(ctx, "misuse.a", err);
    bmt_block_t *u = bmt_block_create(ctx, "misuse.unbuilt", err);
    bmt_blocklist_t *l = bmt_blocklist_create(ctx, NULL, err);
    if (!a || !u || !l)
        return -1;
    if (bmt_block_add_param(a, "w", 1, shape, O.dtype, (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 }, 0,
                            err) < 0 ||
        bmt_block_add_param(u, "w", 1, shape, O.dtype, (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 }, 0,
                            err) < 0)
        return -1;
    bmt_error_t e;
    memset(&e, 0, sizeof(e));
    int rc = bmt_block_add_param(a, "v", 1, bad_shape, O.dtype,
                                 (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 }, 0, &e);
    check(rc == -1 && e.text[0], "bad use: bmt_block_add_param with shape {-3} fails: \"%s\"",
          rc == -1 ? e.text : "it returned an index");
    if (bmt_block_build(a, O.seed, err) < 0)
        return -1;
    memset(&e, 0, sizeof(e));
    rc = bmt_block_add_param(a, "late", 1, shape, O.dtype, (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 },
                             0, &e);
    check(rc == -1 && e.text[0] && bmt_block_num_params(a) == 1,
          "bad use: bmt_block_add_param after bmt_block_build fails and adds nothing: \"%s\"",
          rc == -1 ? e.text : "it returned an index");
    memset(&e, 0, sizeof(e));
    rc = bmt_block_release(a, &e);
    check(rc == -1 && e.text[0], "bad use: bmt_block_release of a block not gathered fails: \"%s\"",
          rc == -1 ? e.text : "it returned 0");
    if (bmt_block_gather(a, err) < 0)
        return -1;
    memset(&e, 0, sizeof(e));
    rc = bmt_block_gather(a, &e);
    check(rc == -1 && e.text[0], "bad use: bmt_block_gather of a gathered block fails: \"%s\"",
          rc == -1 ? e.text : "it returned 0");
    if (bmt_block_release(a, err) < 0)
        return -1;
    memset(&e, 0, sizeof(e));
    rc = bmt_block_release(a, &e);
    check(rc == -1 && e.text[0], "bad use: bmt_block_release twice fails: \"%s\"",
          rc == -1 ? e.text : "it returned 0");
    memset(&e, 0, sizeof(e));
    rc = bmt_blocklist_append(l, u, &kind_ops[K_MIX], NULL, &e);
    check(rc == -1 && e.text[0], "bad use: appending a block that was not built fails: \"%s\"",
          rc == -1 ? e.text : "it returned 0");
    if (rc == 0)
        u = NULL; /* the list owns it now */
    if (bmt_blocklist_append(l, a, &kind_ops[K_MIX], NULL, err) < 0)
        return -1;
    memset(&e, 0, sizeof(e));
    rc = bmt_blocklist_append(l, a, &kind_ops[K_MIX], NULL, &e);
    check(rc == -1 && e.text[0] && bmt_blocklist_size(l) == 1,
          "bad use: appending a block twice fails and leaves the list as it was: \"%s\"",
          rc == -1 ? e.text : "it returned 0");
    /* A block of another context (and so possibly of another layout) is refused.
     * A second context of the same job needs no communication with backend none. */
    bmt_ctx_t *other = NULL;
    bmt_config_t cfg2 = BMT_CONFIG_INITIALIZER;
    cfg2.backend = "none";
    if (bmt_init(&other, &cfg2, err) < 0)
        return -1;
    bmt_block_t *x = bmt_block_create(other, "misuse.other", err);
    if (x == NULL ||
        bmt_block_add_param(x, "w", 1, shape, O.dtype, (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 }, 0,
                            err) < 0 ||
        bmt_block_build(x, O.seed, err) < 0)
        return -1;
    memset(&e, 0, sizeof(e));
    rc = bmt_blocklist_append(l, x, &kind_ops[K_MIX], NULL, &e);
    check(rc == -1 && strstr(e.text, "another context") && bmt_blocklist_size(l) == 1,
          "bad use: appending a block of another context fails: \"%s\"",
          rc == -1 ? e.text : "it returned 0");
    if (rc == 0)
        x = NULL;
    bmt_block_destroy(x);
    bmt_finalize(other);
    bmt_block_destroy(u);
    bmt_blocklist_destroy(l); /* and a */
    return 0;
}

static void mem_line(char *buf, size_t n, const bmt_mem_stats_t *st)
{
    size_t len = 0;
    for (int k = 0; k < BMT_MEM_KIND_COUNT && len < n; k++)
        len +=
            (size_t)snprintf(buf + len, n - len, "%s%s %llu/%llu", k ? ", " : "",
                             bmt_mem_kind_name((bmt_mem_kind_t)k),
                             (unsigned long long)st->current[k], (unsigned long long)st->peak[k]);
}

/* The relative bound on parameters, loss and grad norm against the reference.
 * f32: 1e-5. The fp32 engine's own rounding moves 20 steps by <= 3e-6 (measured
 * in every layout and several seeds, with the optimizer's 1 - beta taken as
 * torch takes it); fewer steps are more fragile (a zero-initialized bias after
 * two steps: 1.6e-5), so the tests train 8 steps or more. bf16: 2e-2 (measured
 * <= 5e-3: with the reference rounding exactly where the model does, a different
 * order of f32 summation still flips bf16 roundings, and the trajectories part;
 * against an unrounded reference the gap is ~1e-1). */
static double bound(void) { return O.bound > 0 ? O.bound : (O.dtype == BMT_BF16 ? 2e-2 : 1e-5); }

/* The model's blocks, built: shards only, initialized from O.seed. */
static int build_blocks(bmt_block_t **blocks, bmt_error_t *err)
{
    for (int b = 0; b < NBLOCKS; b++) {
        if ((blocks[b] = bmt_block_create(ctx, block_name[b], err)) == NULL)
            return -1;
        for (int k = 0; k < gp_count[b]; k++) {
            const pspec_t *s = gp[gp_first[b] + k].spec;
            int64_t shape[2] = { s->rows, s->cols };
            int idx = bmt_block_add_param(blocks[b], s->name, s->cols ? 2 : 1, shape, O.dtype,
                                          s->init, s->flags, err);
            if (idx < 0)
                return -1;
            if (idx != k) {
                snprintf(err->text, sizeof(err->text), "bmt_block_add_param returned %d for %s",
                         idx, gp[gp_first[b] + k].name);
                return -1;
            }
        }
        if (bmt_block_build(blocks[b], O.seed, err) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ monitoring */

/* bmt_report_step after each step, and its figures checked against what the
 * step did: the optimizer's result, the counts reported, the allocator's
 * counters, and the time (rates times step time give back the counts). */
typedef struct monitor {
    int64_t tokens_base; /* tokens_total before this run (bmt_init counts them all) */
    int bad;
    char first[300];
    double comm_wait, time;
} monitor_t;

static void mon_bad(monitor_t *m, const char *fmt, ...)
{
    if (m->bad++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->first, sizeof(m->first), fmt, ap);
        va_end(ap);
    }
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b) + 1e-12; }

static int monitor_step(monitor_t *mon, int s, double loss, const bmt_step_info_t *info,
                        bmt_error_t *err)
{
    const int64_t rows = (int64_t)O.accum * EC_ROWS;
    bmt_step_report_t r = BMT_STEP_REPORT_INITIALIZER;
    r.tokens = rows; /* a row of this model stands for a token */
    r.samples = rows;
    r.loss = loss;
    r.params = (int64_t)ntot;
    r.flops = 6.0 * (double)ntot * (double)rows;
    r.optim = info;
    bmt_step_metrics_t x;
    if (bmt_report_step(ctx, &r, &x, err) < 0)
        return -1;
    if (s == 1)
        mon->tokens_base = x.tokens_total - rows;
    bmt_mem_stats_t st;
    bmt_mem_get_stats(ctx, &st);
    double peak = bmt_peak_flops(ctx);
    bool multi = bmt_world_size(ctx) > 1;
    mon->comm_wait += x.comm_wait_s;
    mon->time += x.step_time_s;
    if (x.size != sizeof(x) || x.version != BMT_PLUGIN_ABI_VERSION)
        mon_bad(mon, "step %d: size %u version %u", s, x.size, x.version);
    if (x.step != info->step || x.skipped != (info->skipped ? 1 : 0) ||
        x.skipped_total != info->skipped_total || x.microbatches != O.accum)
        mon_bad(mon, "step %d: step %lld skipped %d/%lld micro %d, optimizer said %lld %d/%lld", s,
                (long long)x.step, x.skipped, (long long)x.skipped_total, x.microbatches,
                (long long)info->step, info->skipped, (long long)info->skipped_total);
    if (!(x.grad_norm == info->grad_norm || (isnan(x.grad_norm) && isnan(info->grad_norm))) ||
        !(x.lr == info->lr) || !(x.loss == loss || (isnan(x.loss) && isnan(loss))))
        mon_bad(mon, "step %d: grad norm %g lr %g loss %g, want %g %g %g", s, x.grad_norm, x.lr,
                x.loss, info->grad_norm, info->lr, loss);
    if (x.tokens != rows || x.samples != rows || x.tokens_total - mon->tokens_base != s * rows ||
        x.params != (int64_t)ntot)
        mon_bad(mon, "step %d: tokens %lld samples %lld total %lld params %lld", s,
                (long long)x.tokens, (long long)x.samples,
                (long long)(x.tokens_total - mon->tokens_base), (long long)x.params);
    if (!(x.step_time_s > 0) || !near(x.tokens_per_s * x.step_time_s, (double)rows) ||
        !near(x.samples_per_s * x.step_time_s, (double)rows) ||
        !near(x.flops_per_s * x.step_time_s, r.flops))
        mon_bad(mon, "step %d: step time %g s, tokens/s %g, FLOP/s %g", s, x.step_time_s,
                x.tokens_per_s, x.flops_per_s);
    if (O.pace_ms > 0 && x.step_time_s < O.pace_ms * 1e-3)
        mon_bad(mon, "step %d: step time %g s is shorter than the %g ms paced", s, x.step_time_s,
                O.pace_ms);
    if (peak > 0 ? !near(x.mfu, x.flops_per_s / peak) : !isnan(x.mfu))
        mon_bad(mon, "step %d: mfu %g with peak %g FLOP/s", s, x.mfu, peak);
    if (!(x.comm_wait_s >= 0 && x.comm_wait_s <= x.step_time_s) ||
        (multi && bmt_device(ctx) == BMT_DEVICE_CPU && !(x.comm_wait_s > 0)))
        mon_bad(mon, "step %d: comm wait %g s of a %g s step", s, x.comm_wait_s, x.step_time_s);
    if (x.mem_kinds != BMT_MEM_KIND_COUNT)
        mon_bad(mon, "step %d: %d memory kinds", s, x.mem_kinds);
    for (int k = 0; k < BMT_MEM_KIND_COUNT; k++)
        if (x.mem_current[k] != st.current[k] || x.mem_peak[k] < x.mem_current[k] ||
            x.mem_peak[k] > st.peak[k])
            mon_bad(mon, "step %d: memory %s now %llu peak %llu, allocator says %llu (peak %llu)",
                    s, bmt_mem_kind_name(k), (unsigned long long)x.mem_current[k],
                    (unsigned long long)x.mem_peak[k], (unsigned long long)st.current[k],
                    (unsigned long long)st.peak[k]);
    uint64_t sum_peaks = 0;
    for (int k = 0; k < BMT_MEM_KIND_COUNT; k++)
        sum_peaks += x.mem_peak[k];
    if (x.size != sizeof(x) || x.mem_peak_all < st.current_total || x.mem_peak_all > sum_peaks ||
        x.mem_peak_all > st.peak_total)
        mon_bad(mon,
                "step %d: peak of all kinds at once %llu: want >= now (%llu), <= the sum of the "
                "kinds' peaks (%llu) and <= the allocator's peak (%llu) (size %u)",
                s, (unsigned long long)x.mem_peak_all, (unsigned long long)st.current_total,
                (unsigned long long)sum_peaks, (unsigned long long)st.peak_total, x.size);
    /* A group of one computes on its shards in place: no gathered buffers,
     * except under master_only (bf16), whose masters are rounded into one. */
    const bool one = bmt_layout(ctx)->gpus_per_group == 1;
    const bool gathers = !one || (O.master_only == 1 && O.dtype != BMT_F32);
    if ((x.mem_peak[BMT_MEM_GRAD_FULL] == 0) != one ||
        (x.mem_peak[BMT_MEM_GATHERED] == 0) == gathers)
        mon_bad(mon,
                "step %d: the step's peaks of gathered (%llu) and full gradient (%llu) buffers: "
                "want %s and %s",
                s, (unsigned long long)x.mem_peak[BMT_MEM_GATHERED],
                (unsigned long long)x.mem_peak[BMT_MEM_GRAD_FULL],
                gathers ? "some gathered" : "no gathered (a group of one: shards in place)",
                one ? "no full gradients" : "some full gradients");
    if (O.event_every && s % O.event_every == 0) {
        char path[64];
        snprintf(path, sizeof(path), "ckpt/step-%d", s);
        if (bmt_report_event(ctx, BMT_EVENT_CHECKPOINT_SAVED, path, err) < 0)
            return -1;
    }
    if (O.val_every && s % O.val_every == 0 && bmt_report_scalar(ctx, "val_loss", loss, err) < 0)
        return -1;
    return 0;
}

typedef struct trained {
    double *loss;          /* (steps) mean loss of each step over the world */
    bmt_step_info_t *info; /* (steps) what bmt_optim_step said */
    bmt_mem_stats_t mem;   /* after the last step; peaks since the first */
    bool pending;          /* the last step's update was still deferred then */
    uint64_t ws_before;    /* workspace held before the first step: the model's own
                              (ec_cuda's staging) and the optimizer's sums */
} trained_t;

/* O.steps steps of O.accum micro-batches; rank r's a-th micro-batch of a step is
 * global micro-batch a * world + r. */
static int train(bmt_blocklist_t *list, bmt_optim_t *opt, model_t *m, trained_t *t, int from,
                 bmt_error_t *err)
{
    const bool first_run = from == 1;
    const int world = bmt_world_size(ctx), me = bmt_rank(ctx);
    const size_t nin = (size_t)O.accum * EC_ROWS * EC_DIN,
                 ntg = (size_t)O.accum * EC_ROWS * EC_DOUT;
    float *hin = malloc(sizeof(float) * nin), *htg = malloc(sizeof(float) * ntg);
    float *hloss = malloc(sizeof(float) * (size_t)O.accum);
    t->loss = calloc((size_t)O.steps, sizeof(double));
    t->info = calloc((size_t)O.steps, sizeof(bmt_step_info_t));
    if (!hin || !htg || !hloss || !t->loss || !t->info) {
        snprintf(err->text, sizeof(err->text), "out of host memory");
        return -1;
    }
    bmt_mem_reset_peaks(ctx);
    bmt_mem_stats_t before;
    bmt_mem_get_stats(ctx, &before);
    t->ws_before = before.current[BMT_MEM_WORKSPACE];
    monitor_t mon = { 0 };
    bmt_step_begin(ctx); /* set-up is not the first step's time */
    if (first_run && O.event_every &&
        bmt_report_event(ctx, BMT_EVENT_NOTE, "engine_check starts", err) < 0)
        return -1;
    for (int s = from; s <= O.steps; s++) {
        for (int a = 0; a < O.accum; a++)
            make_batch(s, a * world + me, hin + (size_t)a * EC_ROWS * EC_DIN,
                       htg + (size_t)a * EC_ROWS * EC_DOUT);
        if (bmt_mem_upload(ctx, m->data, hin, sizeof(float) * nin, err) < 0 ||
            bmt_mem_upload(ctx, m->target, htg, sizeof(float) * ntg, err) < 0)
            return -1;
        for (int a = 0; a < O.accum; a++) {
            m->mb = a;
            memset(m->nfwd, 0, sizeof(m->nfwd));
            memset(m->nrec, 0, sizeof(m->nrec));
            memset(m->nbwd, 0, sizeof(m->nbwd));
            if (bmt_blocklist_forward(list, err) < 0 ||
                bmt_blocklist_backward(list, a == O.accum - 1, err) < 0)
                return -1;
            for (int b = 0; b < NBLOCKS; b++)
                if (m->nbwd[b] != 1)
                    complain(m, "step %d micro-batch %d: block %d had %d backwards", s, a, b,
                             m->nbwd[b]);
        }
        if (bmt_optim_step(opt, &t->info[s - 1], err) < 0 ||
            bmt_mem_download(ctx, hloss, m->loss, sizeof(float) * O.accum, err) < 0)
            return -1;
        for (int a = 0; a < O.accum; a++)
            t->loss[s - 1] += hloss[a];
        m->pending = m->overlap && !t->info[s - 1].skipped;
        if (O.pace_ms > 0) {
            struct timespec nap = { (time_t)(O.pace_ms / 1e3), (long)(fmod(O.pace_ms, 1e3) * 1e6) };
            nanosleep(&nap, NULL);
        }
        if (first_run && monitor_step(&mon, s, t->loss[s - 1] / O.accum, &t->info[s - 1], err) < 0)
            return -1;
        if (first_run && O.ckpt_dir && s == O.ckpt_at &&
            bmt_ckpt_save(list, opt, O.ckpt_dir, "ec", NULL, 1, err) < 0)
            return -1;
        if (first_run && O.ckpt_dir && s == O.ckpt_at)
            m->pending = false; /* the save applied it */
        if (O.abort_at == s && my_rank == 0) {
            char why[64];
            snprintf(why, sizeof(why), "engine_check --abort-at %d", s);
            bmt_abort(ctx, 3, why);
        }
    }
    check(!first_run || mon.bad == 0,
          "monitor: %d steps reported; step, grad norm, loss, token totals and rates, FLOP/s, "
          "MFU, memory and comm wait as measured (comm wait %.3g s of %.3g s)%s%s",
          O.steps, mon.comm_wait, mon.time, mon.bad ? "; first problem: " : "", mon.first);
    bmt_mem_get_stats(ctx, &t->mem);
    t->pending = m->pending;
    free(hin);
    free(htg);
    free(hloss);
    /* Sum the losses over the world (one collective for all steps). */
    double *dl = bmt_mem_alloc(ctx, sizeof(double) * (size_t)O.steps, err);
    if (dl == NULL || bmt_mem_upload(ctx, dl, t->loss, sizeof(double) * O.steps, err) < 0 ||
        bmt_all_reduce(bmt_comm_world(ctx), dl, dl, (size_t)O.steps, BMT_F64, BMT_SUM, err) < 0 ||
        bmt_mem_download(ctx, t->loss, dl, sizeof(double) * O.steps, err) < 0)
        return -1;
    bmt_mem_free(ctx, dl);
    for (int s = 0; s < O.steps; s++)
        t->loss[s] /= (double)world * O.accum;
    return 0;
}

/* Check 2, per step: what bmt_optim_step reported, the loss and the grad norm. */
static void check_steps(const char *tag, const ref_t *R, const trained_t *t)
{
    double worst_loss = 0, worst_norm = 0;
    int bad = 0, nclipped = 0;
    char first_bad[300] = "";
    int64_t taken = 0, skipped = 0;
    for (int s = 1; s <= O.steps; s++) {
        const bmt_step_info_t *in = &t->info[s - 1];
        bool sk = R->skipped[s - 1];
        taken += !sk;
        skipped += sk;
        nclipped += R->clipped[s - 1];
        bool ok = in->step == taken && in->skipped == sk && in->skipped_total == skipped &&
                  in->microbatches == O.accum && (sk || fabs(in->lr - R->lr[s - 1]) <= 1e-12);
        if (sk) {
            ok = ok && !isfinite(in->grad_norm);
        } else {
            double el = fabs(t->loss[s - 1] - R->loss[s - 1]) / fabs(R->loss[s - 1]);
            double en = fabs(in->grad_norm - R->norm[s - 1]) / R->norm[s - 1];
            if (!(el <= worst_loss))
                worst_loss = el;
            if (!(en <= worst_norm))
                worst_norm = en;
            if (O.verbose && my_rank == 0)
                printf("# step %2d: loss %.9g (reference %.9g, %.2e), grad norm %.9g (%.9g, "
                       "%.2e)%s\n",
                       s, t->loss[s - 1], R->loss[s - 1], el, in->grad_norm, R->norm[s - 1], en,
                       R->clipped[s - 1] ? " clipped" : "");
        }
        if (!ok && bad++ == 0)
            snprintf(first_bad, sizeof(first_bad),
                     "; step %d: step %lld skipped %d total %lld microbatches %d lr %.9g norm %g, "
                     "expected %lld %d %lld %d %.9g %s",
                     s, (long long)in->step, (int)in->skipped, (long long)in->skipped_total,
                     in->microbatches, in->lr, in->grad_norm, (long long)taken, (int)sk,
                     (long long)skipped, O.accum, R->lr[s - 1], sk ? "non-finite" : "finite");
    }
    check(bad == 0,
          "train (%s): bmt_step_info_t of all %d steps as expected (step, skipped, lr, "
          "microbatches %d)%s",
          tag, O.steps, O.accum, first_bad);
    check(worst_loss <= bound(),
          "train (%s): mean loss of every step within %.0e of the reference: worst relative "
          "error %.2e (last step: %.9g vs %.9g)",
          tag, bound(), worst_loss, t->loss[O.steps - 1], R->loss[O.steps - 1]);
    check(worst_norm <= bound(),
          "train (%s): grad norm of every step within %.0e of the reference: worst relative "
          "error %.2e",
          tag, bound(), worst_norm);
    if (O.clip > 0)
        check(nclipped > 0, "train (%s): clip_norm %g binds in %d of %d steps", tag, O.clip,
              nclipped, O.steps);
    if (O.nan_step > 0)
        check(skipped == 1 && t->info[O.nan_step - 1].skipped,
              "train (%s): the step with NaN gradients (%d) was skipped, the others were not", tag,
              O.nan_step);
}

/* Check 2: every parameter against the reference; final (ntot) gets their values. */
static int check_params(const char *tag, bmt_block_t **blocks, const ref_t *R, double *final,
                        bmt_error_t *err)
{
    for (int b = 0; b < NBLOCKS; b++) {
        void *host[MAXP] = { NULL };
        if (download_block(blocks[b], b, host, err) < 0)
            return -1;
        for (int k = 0; k < gp_count[b]; k++) {
            const gparam_t *g = &gp[gp_first[b] + k];
            for (int i = 0; i < g->numel; i++)
                final[g->off + i] = ld(host[k], O.dtype, (size_t)i);
            double e = rel_err(final + g->off, R->w + g->off, (size_t)g->numel);
            check(e <= bound(),
                  "train (%s): %-16s (%3d) within %.0e of the reference after %d steps: "
                  "relative error %.2e",
                  tag, g->name, g->numel, bound(), O.steps, e);
            free(host[k]);
        }
    }
    return 0;
}

/* Check 3 after training: shard-sized param, grad and optim bytes (now and at
 * peak); gathered buffers within K = 2 blocks (zero level 3) or one per block. */
static void check_memory(const char *tag, int zero, const trained_t *t, const shard_bytes_t *want,
                         int gsize)
{
    const bmt_mem_stats_t *st = &t->mem;
    const bool pending = t->pending;
    const uint64_t *cur = st->current, *peak = st->peak;
    /* master_only: the optimizer's f32 masters are the only copy of bf16 values */
    const bool none = O.master_only == 1 && O.dtype != BMT_F32;
    const uint64_t wp = none ? 0 : want->param;
    check(cur[BMT_MEM_PARAM] == wp && peak[BMT_MEM_PARAM] == wp,
          "memory (%s): param bytes %llu (peak %llu) = %s %llu", tag,
          (unsigned long long)cur[BMT_MEM_PARAM], (unsigned long long)peak[BMT_MEM_PARAM],
          none ? "none (master_only): the masters are the values," : "this rank's shards",
          (unsigned long long)wp);
    const uint64_t held = pending ? want->grad : 0;
    check(cur[BMT_MEM_GRAD] == held && peak[BMT_MEM_GRAD] == want->grad,
          "memory (%s): grad bytes %llu after the step (%s), peak %llu = this rank's f32 "
          "shards %llu",
          tag, (unsigned long long)cur[BMT_MEM_GRAD],
          pending ? "all: the update is deferred to the next gather" : "none: given back",
          (unsigned long long)peak[BMT_MEM_GRAD], (unsigned long long)want->grad);
    check(cur[BMT_MEM_OPTIM] == want->optim && peak[BMT_MEM_OPTIM] == want->optim,
          "memory (%s): optim bytes %llu (peak %llu) = %s x f32 shards %llu", tag,
          (unsigned long long)cur[BMT_MEM_OPTIM], (unsigned long long)peak[BMT_MEM_OPTIM],
          O.dtype == BMT_F32   ? "2 (moments)"
          : O.master_only == 2 ? "2.5 (moments, the masters' low halves)"
                               : "3 (moments, master)",
          (unsigned long long)want->optim);
    uint64_t cap =
        zero == 3 ? 2 * want->largest_full : (uint64_t)want->with_params * want->largest_full;
    const bool in_place =
        bmt_layout(ctx)->gpus_per_group == 1 && !(O.master_only == 1 && O.dtype != BMT_F32);
    if (in_place)
        check(peak[BMT_MEM_GATHERED] == 0,
              "memory (%s): a group of one computes on its shards in place: no gathered buffer "
              "(peak %llu)",
              tag, (unsigned long long)peak[BMT_MEM_GATHERED]);
    else
        check(peak[BMT_MEM_GATHERED] <= cap && peak[BMT_MEM_GATHERED] > 0,
              "memory (%s): peak of gathered buffers in training %llu <= %s = %llu (largest "
              "block %llu)",
              tag, (unsigned long long)peak[BMT_MEM_GATHERED],
              zero == 3 ? "K = 2 blocks" : "every block", (unsigned long long)cap,
              (unsigned long long)want->largest_full);
    /* A bf16 reduce adds one bf16 staging buffer of the largest flat buffer;
     * a group of one adds into its shards and has no full gradient buffers. */
    if (bmt_layout(ctx)->gpus_per_group == 1)
        check(peak[BMT_MEM_GRAD_FULL] == 0,
              "memory (%s): no full gradient buffers in a group of one (peak %llu): the "
              "gradients go straight into the shards",
              tag, (unsigned long long)peak[BMT_MEM_GRAD_FULL]);
    /* Two buffers sized per block: at most two successive blocks' gradients
     * (and a bf16 copy of one block's for a bf16 reduce), none left after the
     * backward. */
    const uint64_t stage = O.reduce == BMT_BF16 ? 2 * want->largest_padded : 0;
    const uint64_t gcap = want->largest_grad_pair + stage;
    if (bmt_layout(ctx)->gpus_per_group > 1)
        check(peak[BMT_MEM_GRAD_FULL] <= gcap && peak[BMT_MEM_GRAD_FULL] > stage &&
                  cur[BMT_MEM_GRAD_FULL] == 0,
              "memory (%s): peak of full gradient buffers %llu <= two successive blocks%s = "
              "%llu (two of the largest: %llu); %llu after training",
              tag, (unsigned long long)peak[BMT_MEM_GRAD_FULL],
              O.reduce == BMT_BF16 ? " + a bf16 copy of the largest" : "", (unsigned long long)gcap,
              (unsigned long long)(2 * want->largest_grad_full + stage),
              (unsigned long long)cur[BMT_MEM_GRAD_FULL]);
    /* The reduce-scatter's output, when it adds into a shard (the second
     * micro-batch), exists only around that reduce: no shard-sized workspace
     * is left after training. Counted above what was held before the first
     * step (the CUDA model's own staging buffers, the optimizer's sums). */
    const uint64_t shard = want->largest_padded / (uint64_t)gsize * (O.reduce == BMT_BF16 ? 2 : 4);
    const uint64_t ws_now = cur[BMT_MEM_WORKSPACE] - t->ws_before,
                   ws_peak = peak[BMT_MEM_WORKSPACE] - t->ws_before;
    if (gsize > 1)
        check(cur[BMT_MEM_WORKSPACE] >= t->ws_before && ws_now < shard && ws_peak >= shard,
              "memory (%s): workspace %llu after training < the largest shard %llu (reduce dtype) "
              "<= its peak %llu (the reduce-scatter's output only while it is used; both above "
              "the %llu held before the first step)",
              tag, (unsigned long long)ws_now, (unsigned long long)shard,
              (unsigned long long)ws_peak, (unsigned long long)t->ws_before);
    if (my_rank == 0) {
        char ml[400];
        mem_line(ml, sizeof(ml), st);
        printf("# memory (%s) after training, current/peak bytes: %s\n", tag, ml);
    }
}

/* One engine run: build, (init), train, compare with R, memory, teardown.
 * final (ntot) receives the trained parameters as doubles. */
/* Hash of every parameter (bitwise), block by block. */
static int params_hash(bmt_block_t **blocks, uint64_t *h, bmt_error_t *err)
{
    *h = 1469598103934665603ULL;
    for (int b = 0; b < NBLOCKS; b++) {
        void *v[16] = { 0 };
        int rc = download_block(blocks[b], b, v, err);
        for (int k = 0; k < gp_count[b]; k++) {
            if (rc == 0)
                *h = fnv1a(v[k], (size_t)gp[gp_first[b] + k].numel * bmt_dtype_size(O.dtype), *h);
            free(v[k]);
        }
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* Check ckpt: the training saved a checkpoint after step ckpt_at (bmt/ckpt.h);
 * load it back into the trained list and optimizer (a rewind: parameters,
 * moments, master weights and step counters) and train the remaining steps
 * again. The same layout reduces in the same order, so the losses and the
 * final parameters must be bitwise those of the first run; a load that missed
 * anything (parameters, a moment, bf16 master weights, the step counter behind
 * the bias correction) would show. */
/* dir/ec copied to dir/ec-bad with one byte of the last block's optimizer
 * file flipped 8 bytes before its end (inside its last tensor's data): a load
 * of it reads every other block first, then fails on that file's checksum. */
static int corrupt_copy(const char *dir, char *bad, size_t len)
{
    char src[4096], path[8300];
    snprintf(src, sizeof(src), "%s/ec", dir);
    snprintf(bad, len, "%s/ec-bad", dir);
    char cmd[9000];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", bad, bad);
    if (system(cmd) != 0)
        return -1;
    DIR *d = opendir(src);
    if (d == NULL)
        return -1;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", src, e->d_name);
        FILE *f = fopen(path, "rb");
        char *buf = NULL;
        long n = -1;
        if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)n + 1)) != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            if (strcmp(e->d_name, "head.optim.safetensors") == 0 && n > 8)
                buf[n - 8] ^= 0x40;
            snprintf(path, sizeof(path), "%s/%s", bad, e->d_name);
            FILE *o = fopen(path, "wb");
            rc = o && fwrite(buf, 1, (size_t)n, o) == (size_t)n ? 0 : -1;
            if (o && fclose(o) != 0)
                rc = -1;
        } else {
            rc = -1;
        }
        free(buf);
        if (f)
            fclose(f);
    }
    closedir(d);
    return rc;
}

static int ckpt_rewind(bmt_blocklist_t *list, bmt_optim_t *opt, model_t *m, bmt_block_t **blocks,
                       const trained_t *t, const char *tag, bmt_error_t *err)
{
    uint64_t h1, h2, trained;
    trained_t t2;
    if (params_hash(blocks, &trained, err) < 0)
        return -1;
    if (O.resave_from) {
        /* Another run's checkpoint (another master_only mode) through this
         * optimizer and out again: the test compares the files. */
        char to[4200];
        snprintf(to, sizeof(to), "%s-resaved", O.ckpt_dir);
        if (bmt_ckpt_load(list, opt, O.resave_from, NULL, err) < 0 ||
            bmt_ckpt_save(list, opt, to, "ec", NULL, 1, err) < 0)
            return -1;
    }
    if (O.master_only == 1 && O.dtype != BMT_F32) {
        bmt_error_t e;
        memset(&e, 0, sizeof(e));
        int rc = bmt_ckpt_load(list, NULL, O.ckpt_dir, NULL, &e);
        check(rc == -1 && strstr(e.text, "pass that optimizer"),
              "master_only (%s): a checkpoint load without the optimizer that holds the values "
              "is refused: \"%s\"",
              tag, rc ? e.text : "it returned 0");
    }
    if (O.master_only == 2 && O.dtype == BMT_BF16) {
        bmt_error_t e;
        memset(&e, 0, sizeof(e));
        if (params_hash(blocks, &h1, err) < 0)
            return -1;
        int rc = bmt_ckpt_load(list, NULL, O.ckpt_dir, NULL, &e);
        if (params_hash(blocks, &h2, err) < 0)
            return -1;
        check(rc == -1 && strstr(e.text, "pass that optimizer") && h1 == h2,
              "split master (%s): a checkpoint load without the optimizer that holds the "
              "masters' low halves is refused and changes nothing: \"%s\"",
              tag, rc ? e.text : "it returned 0");
    }
    h1 = trained;
    if (bmt_world_size(ctx) == 1) {
        /* A load that fails half-way (a checksum in the last block's file):
         * the optimizer refuses to step until a load succeeds (the good one
         * below, whose steps then run). One rank only: a step that fails on
         * some ranks would leave the others in its collectives. */
        char bad[4200];
        bmt_error_t e, e2;
        memset(&e, 0, sizeof(e));
        memset(&e2, 0, sizeof(e2));
        if (corrupt_copy(O.ckpt_dir, bad, sizeof(bad)) < 0) {
            snprintf(err->text, sizeof(err->text), "could not copy the checkpoint in %s",
                     O.ckpt_dir);
            return -1;
        }
        int rc = bmt_ckpt_load(list, opt, bad, NULL, &e);
        int rc2 = rc == 0 ? 0 : bmt_optim_step(opt, NULL, &e2);
        check(rc == -1 && strstr(e.text, "head.optim.safetensors") && rc2 == -1 &&
                  strstr(e2.text, "a checkpoint load failed half-way"),
              "ckpt (%s): a load that fails half-way (\"%.400s\") leaves the optimizer refusing "
              "to step: \"%s\"",
              tag, e.text, rc2 ? e2.text : "it stepped");
    }
    if (bmt_ckpt_load(list, opt, O.ckpt_dir, NULL, err) < 0)
        return -1;
    uint64_t h0;
    m->pending = false; /* the load applied what was deferred */
    if (params_hash(blocks, &h0, err) < 0 || train(list, opt, m, &t2, O.ckpt_at + 1, err) < 0 ||
        params_hash(blocks, &h2, err) < 0)
        return -1;
    int same_losses = 1;
    for (int s = O.ckpt_at; s < O.steps; s++)
        same_losses &= t2.loss[s] == t->loss[s];
    check(h0 != h1, "ckpt (%s): loading the step-%d checkpoint changed the trained parameters", tag,
          O.ckpt_at);
    check(h2 == h1 && same_losses,
          "ckpt (%s): from the step-%d checkpoint, steps %d..%d again: losses and parameters "
          "bitwise the first run's (hash %016llx)",
          tag, O.ckpt_at, O.ckpt_at + 1, O.steps, (unsigned long long)h2);
    free(t2.loss);
    free(t2.info);
    return 0;
}

static int engine_run(const run_cfg_t *rc, const ref_t *R, const ec_ops_t *ops, void *dev,
                      double *final, bmt_error_t *err)
{
    const shard_bytes_t want = expected_bytes(bmt_comm_size(bmt_comm_group(ctx)));
    char tag[64], ml[400];
    snprintf(tag, sizeof(tag), "zero %d, ckpt %d%s", rc->zero, rc->ckpt,
             rc->overlap ? "" : ", overlap 0");
    bmt_mem_stats_t st;
    bmt_mem_get_stats(ctx, &st);
    if (st.current[BMT_MEM_PARAM] || st.current[BMT_MEM_GRAD] || st.current[BMT_MEM_OPTIM] ||
        st.current[BMT_MEM_GATHERED]) {
        snprintf(err->text, sizeof(err->text), "engine memory in use before the run");
        return -1;
    }
    bmt_mem_reset_peaks(ctx);

    /* Check 3 at construction: shards only, nothing gathered. */
    bmt_block_t *blocks[NBLOCKS] = { NULL };
    if (build_blocks(blocks, err) < 0)
        return -1;
    bmt_mem_get_stats(ctx, &st);
    mem_line(ml, sizeof(ml), &st);
    check(st.current[BMT_MEM_PARAM] == want.param && st.peak[BMT_MEM_PARAM] == want.param &&
              st.peak[BMT_MEM_GATHERED] == 0 && st.peak[BMT_MEM_GRAD_FULL] == 0,
          "memory (%s, built): param bytes now and at peak = %llu, this rank's shards; "
          "nothing gathered [%s]",
          tag, (unsigned long long)want.param, ml);
    if (rc->first && check_init(blocks, err) < 0)
        return -1;

    /* The list and the optimizer. */
    model_t *m = model_create(ctx, ops, dev, rc->ckpt, err);
    if (m == NULL)
        return -1;
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    lc.zero_level = rc->zero;
    lc.checkpointing = rc->ckpt == 1;
    lc.prefetch = O.prefetch;
    lc.grad_dtype = O.reduce;
    bmt_blocklist_t *list = bmt_blocklist_create(ctx, &lc, err);
    if (list == NULL)
        return -1;
    for (int b = 0; b < NBLOCKS; b++) {
        if (bmt_blocklist_append(list, blocks[b], &kind_ops[block_kind[b]], m, err) < 0)
            return -1;
        m->blocks[b] = blocks[b];
    }
    m->overwrite = rc->overwrite;
    m->poison = getenv("BMT_CHECK_OVERWRITE") && strcmp(getenv("BMT_CHECK_OVERWRITE"), "1") == 0;
    if (rc->overwrite && bmt_blocklist_set_grad_overwrite(list, true, err) < 0)
        return -1;
    check(bmt_blocklist_grad_overwrite(list) == (rc->overwrite != 0),
          "overwrite %d: the list's setting reads back", rc->overwrite);
    /* --ckpt 2: selective, each use as ckpt_of says, set on top of lc's 0. */
    for (int b = 0; rc->ckpt == 2 && b < NBLOCKS; b++)
        if (m->ckpt[b] && bmt_blocklist_set_checkpointing(list, b, true, err) < 0)
            return -1;
    for (int b = 0; b < NBLOCKS; b++)
        check(bmt_blocklist_checkpointing(list, b) == m->ckpt[b],
              "ckpt %d: use %d's checkpointing reads back %d", rc->ckpt, b, (int)m->ckpt[b]);
    bmt_adamw_config_t ac = BMT_ADAMW_CONFIG_INITIALIZER;
    ac.lr = O.lr;
    ac.beta1 = 0.9;
    ac.beta2 = 0.999;
    ac.eps = 1e-8;
    ac.weight_decay = O.weight_decay;
    ac.clip_norm = O.clip;
    ac.schedule = O.warmup > 0 ? warmup_schedule : NULL;
    ac.master_only = O.master_only;
    ac.overlap = rc->overlap;
    m->overlap = rc->overlap != 0;
    m->pending = false;
    for (int b = NBLOCKS - 1; b >= 0; b--)
        m->grad_after[b] = b + 1 < NBLOCKS ? m->grad_after[b + 1] + want.grad_of[b + 1] : 0;
    bmt_mem_reset_peaks(ctx);
    bmt_optim_t *opt = bmt_adamw_create(list, &ac, err);
    if (opt == NULL)
        return -1;
    if (O.master_only == 1 && O.dtype != BMT_F32) {
        /* Each bf16 shard goes as soon as its master exists: never all of
         * them next to all the masters and moments. */
        bmt_mem_stats_t cs;
        bmt_mem_get_stats(ctx, &cs);
        const uint64_t one = want.largest_padded / (uint64_t)bmt_comm_size(bmt_comm_group(ctx)) *
                             bmt_dtype_size(O.dtype);
        check(cs.peak_total <= cs.current_total + one,
              "master_only (%s): creating the optimizer peaks at %llu bytes <= %llu after it + "
              "the largest shard %llu (each shard freed once its master exists)",
              tag, (unsigned long long)cs.peak_total, (unsigned long long)cs.current_total,
              (unsigned long long)one);
    }
    if (O.master_only != 0 && O.dtype != BMT_F32) {
        bmt_optim_t *second = bmt_adamw_create(list, &ac, err);
        check(second == NULL && strstr(err->text, "already has an optimizer") != NULL,
              "master_only %d (%s): a second optimizer on the list is refused (%s)", O.master_only,
              tag, err->text);
        bmt_optim_destroy(second);
    }
    if (rc->first) {
        misuse_list(list, opt, "before training");
        bmt_adamw_config_t bad = ac;
        bad.master_only = 3;
        bmt_optim_t *third = bmt_adamw_create(list, &bad, err);
        check(third == NULL && strstr(err->text, "master_only is 3") != NULL,
              "bmt_adamw_create refuses master_only 3 with a message: %s", err->text);
        bmt_optim_destroy(third);
    }

    trained_t t;
    if (train(list, opt, m, &t, 1, err) < 0)
        return -1;
    check_steps(tag, R, &t);
    check(m->ncomplaints == 0, "protocol (%s): %ld callback calls as the header describes%s%s", tag,
          m->ncalls, m->ncomplaints ? "; first problem: " : "", m->complaint);
    if (rc->first) /* before the parameters are compared: a failed call changes nothing */
        misuse_list(list, opt, "after training");
    if (check_params(tag, blocks, R, final, err) < 0)
        return -1;
    check_memory(tag, rc->zero, &t, &want, bmt_comm_size(bmt_comm_group(ctx)));
    if (rc->first && O.ckpt_dir && ckpt_rewind(list, opt, m, blocks, &t, tag, err) < 0)
        return -1;
    if (rc->first)
        misuse_order(list, opt, blocks[0]);

    uint64_t held = 0, back = 0;
    if (params_hash(blocks, &held, err) < 0)
        return -1;
    bmt_optim_destroy(opt);
    if (O.master_only == 1 && O.dtype != BMT_F32) {
        /* The shards are back, holding the values the optimizer held. */
        if (params_hash(blocks, &back, err) < 0)
            return -1;
        check(back == held,
              "master_only (%s): after bmt_optim_destroy the blocks hold the optimizer's values, "
              "bitwise (hash %016llx)",
              tag, (unsigned long long)back);
        bmt_mem_get_stats(ctx, &st);
        check(st.current[BMT_MEM_PARAM] == want.param,
              "master_only (%s): bmt_optim_destroy gives the blocks %llu bytes of shards back "
              "(now %llu)",
              tag, (unsigned long long)want.param, (unsigned long long)st.current[BMT_MEM_PARAM]);
    }
    if (O.master_only == 2 && O.dtype == BMT_BF16) {
        /* The shards were the masters' high halves all along: they stay. */
        if (params_hash(blocks, &back, err) < 0)
            return -1;
        bmt_mem_get_stats(ctx, &st);
        check(back == held && st.current[BMT_MEM_PARAM] == want.param &&
                  st.current[BMT_MEM_OPTIM] == 0,
              "split master (%s): after bmt_optim_destroy the blocks keep their values, bitwise "
              "(hash %016llx), in %llu bytes of shards, and no optimizer bytes are left (%llu)",
              tag, (unsigned long long)back, (unsigned long long)st.current[BMT_MEM_PARAM],
              (unsigned long long)st.current[BMT_MEM_OPTIM]);
    }
    bmt_blocklist_destroy(list);
    model_destroy(m);
    bmt_mem_get_stats(ctx, &st);
    mem_line(ml, sizeof(ml), &st);
    check(st.current[BMT_MEM_PARAM] == 0 && st.current[BMT_MEM_GRAD] == 0 &&
              st.current[BMT_MEM_OPTIM] == 0 && st.current[BMT_MEM_GATHERED] == 0 &&
              st.current[BMT_MEM_GRAD_FULL] == 0 && st.current[BMT_MEM_ACTIVATION] == 0,
          "memory (%s): nothing left after bmt_optim_destroy and bmt_blocklist_destroy [%s]", tag,
          ml);
    free(t.loss);
    free(t.info);
    return 0;
}

/* ------------------------------------------------------------ kernels: cuda vs cpu */

#ifdef BMT_HAVE_CUDA
enum {
    KMAX = 64 * 64
}; /* elements of each test buffer */

typedef struct kbufs {
    float *h[8];  /* (KMAX) host inputs and the cpu results */
    float *got;   /* (KMAX) a cuda result, downloaded */
    void *d[8];   /* (KMAX) f32 on the device: the same inputs, the cuda results */
    uint16_t *hb; /* (KMAX) bf16 copy of h[1] */
    void *db;     /* (KMAX) ... on the device */
    uint64_t seed;
} kbufs_t;

/* h[i] and d[i] = lo + uniform [-1, 1). */
static int kfill(kbufs_t *k, int i, float lo, bmt_error_t *err)
{
    for (int q = 0; q < KMAX; q++) {
        k->seed = mix64(k->seed + 0x9e3779b97f4a7c15ULL);
        k->h[i][q] = lo + (float)((double)(k->seed >> 40) / 8388608.0 - 1.0);
    }
    return bmt_mem_upload(ctx, k->d[i], k->h[i], KMAX * 4, err);
}

/* The cuda result d[i] against the cpu result h[i], n elements, bound 1e-5. */
static int kcmp(kbufs_t *k, int i, int n, const char *what, bmt_error_t *err)
{
    if (bmt_mem_download(ctx, k->got, k->d[i], (size_t)n * 4, err) < 0)
        return -1;
    double e = 0, r = 0;
    for (int q = 0; q < n; q++) {
        double diff = (double)k->got[q] - k->h[i][q];
        e += diff * diff;
        r += (double)k->h[i][q] * k->h[i][q];
    }
    e = r > 0 ? sqrt(e / r) : sqrt(e);
    check(e <= 1e-5, "kernel: %s: cuda vs cpu relative error %.2e (bound 1e-5)", what, e);
    return 0;
}

/* Each kernel against its cpu function on random data, at this model's sizes and
 * at larger ones, relative bound 1e-5: the same formulas in f32 on both sides
 * (bf16 products: the same rounded operands, summed in f32). */
static int kernel_check(const ec_ops_t *cu, void *dev, bmt_error_t *err)
{
    enum {
        M = 37,
        N = 53,
        K = 41
    };
    kbufs_t kb, *k = &kb;
    memset(k, 0, sizeof(*k));
    k->seed = 99;
    for (int i = 0; i < 8; i++)
        if ((k->h[i] = malloc(KMAX * 4)) == NULL ||
            (k->d[i] = bmt_mem_alloc(ctx, KMAX * 4, err)) == NULL)
            return -1;
    if ((k->got = malloc(KMAX * 4)) == NULL || (k->hb = malloc(KMAX * 2)) == NULL ||
        (k->db = bmt_mem_alloc(ctx, KMAX * 2, err)) == NULL)
        return -1;
    float *const *h = k->h;
    void *const *d = k->d;
    void *st = bmt_compute_stream(ctx);
    char what[96];
    for (int big = 0; big < 2; big++) {
        int rows = big ? M : EC_ROWS, cols = big ? N : EC_C, kk = big ? K : EC_H;
        /* gemm: every transpose and beta 0 or 1, in three modes: f32; a bf16 B (a
         * parameter) with an f32 A rounded on the way; both f32, rounded to bf16. */
        for (int v = 0; v < 24; v++) {
            int ta = v & 1, tb = (v >> 1) & 1, beta = (v >> 2) & 1, mode = v >> 3;
            if (kfill(k, 0, 0, err) < 0 || kfill(k, 1, 0, err) < 0 || kfill(k, 2, 0, err) < 0)
                return -1;
            for (int q = 0; q < KMAX; q++)
                k->hb[q] = bmt_f32_to_bf16(h[1][q]);
            if (bmt_mem_upload(ctx, k->db, k->hb, KMAX * 2, err) < 0)
                return -1;
            const void *Bd = mode == 1 ? k->db : d[1];
            const void *Bh = mode == 1 ? (const void *)k->hb : (const void *)h[1];
            bmt_dtype_t bt = mode == 1 ? BMT_BF16 : BMT_F32;
            bmt_dtype_t cd = mode == 0 ? BMT_F32 : BMT_BF16;
            if (cpu_gemm(NULL, NULL, ta, tb, rows, cols, kk, h[0], BMT_F32, Bh, bt, (float)beta,
                         h[2], cd, err) < 0 ||
                cu->gemm(dev, st, ta, tb, rows, cols, kk, d[0], BMT_F32, Bd, bt, (float)beta, d[2],
                         cd, err) < 0)
                return -1;
            static const char *const modes[3] = { "f32", "bf16 B", "f32 rounded to bf16" };
            snprintf(what, sizeof(what), "gemm %dx%dx%d ta %d tb %d beta %d %s", rows, cols, kk, ta,
                     tb, beta, modes[mode]);
            if (kcmp(k, 2, rows * cols, what, err) < 0)
                return -1;
        }
        /* layernorm forward (x, w near 1, b) and backward (dy, dx, dw, db accumulate) */
        if (kfill(k, 0, 0.3f, err) < 0 || kfill(k, 1, 1.0f, err) < 0 || kfill(k, 2, 0, err) < 0 ||
            cpu_ln_fwd(NULL, NULL, rows, cols, h[0], h[1], h[2], BMT_F32, h[3], h[4], h[5], err) <
                0 ||
            cu->ln_fwd(dev, st, rows, cols, d[0], d[1], d[2], BMT_F32, d[3], d[4], d[5], err) < 0)
            return -1;
        snprintf(what, sizeof(what), "layernorm forward %dx%d", rows, cols);
        if (kcmp(k, 3, rows * cols, what, err) < 0 || kcmp(k, 5, rows, "layernorm rstd", err) < 0)
            return -1;
        if (kfill(k, 6, 0, err) < 0 || kfill(k, 7, 0, err) < 0 || kfill(k, 2, 0, err) < 0 ||
            kfill(k, 3, 0, err) < 0 ||
            cpu_ln_bwd(NULL, NULL, rows, cols, h[0], h[4], h[5], h[1], BMT_F32, h[6], h[7], h[2],
                       h[3], err) < 0 ||
            cu->ln_bwd(dev, st, rows, cols, d[0], d[4], d[5], d[1], BMT_F32, d[6], d[7], d[2], d[3],
                       err) < 0)
            return -1;
        snprintf(what, sizeof(what), "layernorm backward %dx%d (dx)", rows, cols);
        if (kcmp(k, 7, rows * cols, what, err) < 0 ||
            kcmp(k, 2, cols, "layernorm backward (dw)", err) < 0 ||
            kcmp(k, 3, cols, "layernorm backward (db)", err) < 0)
            return -1;
        /* bias add and gradient */
        if (kfill(k, 0, 0, err) < 0 || kfill(k, 1, 0, err) < 0 || kfill(k, 2, 0, err) < 0 ||
            cpu_bias_add(NULL, NULL, rows, cols, h[0], h[1], BMT_F32, err) < 0 ||
            cu->bias_add(dev, st, rows, cols, d[0], d[1], BMT_F32, err) < 0 ||
            cpu_bias_grad(NULL, NULL, rows, cols, h[1], h[2], err) < 0 ||
            cu->bias_grad(dev, st, rows, cols, d[1], d[2], err) < 0)
            return -1;
        if (kcmp(k, 0, rows * cols, "bias add", err) < 0 || kcmp(k, 2, cols, "bias grad", err) < 0)
            return -1;
        /* element-wise: x in [-4, 4) */
        if (kfill(k, 0, 0, err) < 0 || kfill(k, 1, 0, err) < 0)
            return -1;
        for (int q = 0; q < KMAX; q++)
            h[0][q] *= 4;
        int n = rows * cols;
        if (bmt_mem_upload(ctx, d[0], h[0], KMAX * 4, err) < 0 ||
            cpu_gelu_fwd(NULL, NULL, n, h[0], h[2], err) < 0 ||
            cu->gelu_fwd(dev, st, n, d[0], d[2], err) < 0 ||
            cpu_gelu_bwd(NULL, NULL, n, h[0], h[1], h[3], err) < 0 ||
            cu->gelu_bwd(dev, st, n, d[0], d[1], d[3], err) < 0 ||
            cpu_mix_fwd(NULL, NULL, n, h[0], h[4], err) < 0 ||
            cu->mix_fwd(dev, st, n, d[0], d[4], err) < 0 ||
            cpu_mix_bwd(NULL, NULL, n, h[0], h[1], h[5], err) < 0 ||
            cu->mix_bwd(dev, st, n, d[0], d[1], d[5], err) < 0 ||
            cpu_copy(NULL, NULL, n, h[0], h[6], err) < 0 ||
            cu->copy(dev, st, n, d[0], d[6], err) < 0 ||
            cpu_mse(NULL, NULL, rows, cols, h[0], h[1], h[7], h[7] + 1, err) < 0 ||
            cu->mse(dev, st, rows, cols, d[0], d[1], d[7], (float *)d[7] + 1, err) < 0)
            return -1;
        if (kcmp(k, 2, n, "gelu forward", err) < 0 || kcmp(k, 3, n, "gelu backward", err) < 0 ||
            kcmp(k, 4, n, "mix forward", err) < 0 || kcmp(k, 5, n, "mix backward", err) < 0 ||
            kcmp(k, 6, n, "copy", err) < 0 || kcmp(k, 7, 1 + n, "mse (loss and dout)", err) < 0)
            return -1;
    }
    for (int i = 0; i < 8; i++) {
        free(k->h[i]);
        bmt_mem_free(ctx, k->d[i]);
    }
    free(k->got);
    free(k->hb);
    bmt_mem_free(ctx, k->db);
    return 0;
}
#endif

/* ------------------------------------------------------------ main */

static int usage(void)
{
    fprintf(stderr,
            "usage: engine_check [--steps N] [--accum A] [--zero 3|2] [--ckpt 1|0|2] [--prefetch "
            "1|0]\n"
            "                    [--clip X] [--lr X] [--warmup N] [--nan-step S] [--seed N]\n"
            "                    [--dtype f32|bf16] [--reduce-dtype f32|bf16] [--bound X]\n"
            "                    [--init-dump FILE] [--variants] [--master-only | --master-split]\n"
            "                    [--overlap 1|0]\n"
            "                    [--kernel-check] [--verbose] [--overwrite 0|1|2]\n"
            "                    [--pace MS] [--event-every N] [--val-every N] [--abort-at S]\n"
            "                    [--ckpt-dir DIR --ckpt-at S [--resave-from CKPT]]\n");
    return 2;
}

static int parse(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--variants") == 0) {
            O.variants = true;
            continue;
        }
        if (strcmp(a, "--kernel-check") == 0) {
            O.kernel_check = true;
            continue;
        }
        if (strcmp(a, "--verbose") == 0) {
            O.verbose = true;
            continue;
        }
        if (strcmp(a, "--mismatch") == 0) {
            O.mismatch = true;
            continue;
        }
        if (strcmp(a, "--master-only") == 0) {
            O.master_only = 1;
            continue;
        }
        if (strcmp(a, "--master-split") == 0) {
            O.master_only = 2;
            continue;
        }
        if (v == NULL)
            return usage();
        i++;
        char *end = NULL;
        if (strcmp(a, "--steps") == 0)
            O.steps = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--accum") == 0)
            O.accum = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--zero") == 0)
            O.zero = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--ckpt") == 0)
            O.ckpt = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--prefetch") == 0)
            O.prefetch = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--overlap") == 0)
            O.overlap = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--overwrite") == 0)
            O.overwrite = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--warmup") == 0)
            O.warmup = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--nan-step") == 0)
            O.nan_step = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--seed") == 0)
            O.seed = strtoull(v, &end, 10);
        else if (strcmp(a, "--clip") == 0)
            O.clip = strtod(v, &end);
        else if (strcmp(a, "--lr") == 0)
            O.lr = strtod(v, &end);
        else if (strcmp(a, "--bound") == 0)
            O.bound = strtod(v, &end);
        else if (strcmp(a, "--pace") == 0)
            O.pace_ms = strtod(v, &end);
        else if (strcmp(a, "--event-every") == 0)
            O.event_every = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--val-every") == 0)
            O.val_every = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--abort-at") == 0)
            O.abort_at = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--ckpt-dir") == 0)
            O.ckpt_dir = v, end = (char *)"";
        else if (strcmp(a, "--ckpt-at") == 0)
            O.ckpt_at = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--resave-from") == 0)
            O.resave_from = v, end = (char *)"";
        else if (strcmp(a, "--init-dump") == 0)
            O.init_dump = v, end = (char *)"";
        else if (strcmp(a, "--reduce-dtype") == 0) {
            end = (char *)"";
            if (strcmp(v, "f32") == 0)
                O.reduce = BMT_F32;
            else if (strcmp(v, "bf16") == 0)
                O.reduce = BMT_BF16;
            else
                return usage();
        } else if (strcmp(a, "--dtype") == 0) {
            end = (char *)"";
            if (strcmp(v, "f32") == 0)
                O.dtype = BMT_F32;
            else if (strcmp(v, "bf16") == 0)
                O.dtype = BMT_BF16;
            else
                return usage();
        } else
            return usage();
        if (end == NULL || *end != '\0')
            return usage();
    }
    if (O.steps < 1 || O.accum < 1 || (O.zero != 2 && O.zero != 3) || O.ckpt < 0 || O.ckpt > 2 ||
        (O.prefetch != 0 && O.prefetch != 1) || O.nan_step < 0 ||
        (O.overlap != 0 && O.overlap != 1) || O.overwrite < 0 || O.overwrite > 2 ||
        O.nan_step > O.steps || O.clip < 0 || O.warmup < 0 || !(O.pace_ms >= 0) ||
        O.event_every < 0 || O.val_every < 0 || O.abort_at < 0 ||
        (O.ckpt_dir && (O.ckpt_at < 1 || O.ckpt_at >= O.steps)) || (O.resave_from && !O.ckpt_dir))
        return usage();
    return 0;
}

/* The end of a run that got this far: free what main made, finalize, rc. */
static int ec_end(bmt_ctx_t *c, ref_t *R, double *final, double *other, void *dev, int rc)
{
    ref_free(R);
    free(final);
    free(other);
#ifdef BMT_HAVE_CUDA
    ec_cuda_destroy(dev);
#else
    (void)dev;
#endif
    bmt_finalize(c);
    return rc;
}

int main(int argc, char **argv)
{
    if (parse(argc, argv) != 0)
        return 2;
    model_table();
    bmt_error_t err;
    memset(&err, 0, sizeof(err));
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "engine_check: %s\n", err.text);
        return 1;
    }
    my_rank = bmt_rank(ctx);
    const int world = bmt_world_size(ctx);
    const bmt_layout_t *lay = bmt_layout(ctx);
    bool cuda = bmt_device(ctx) == BMT_DEVICE_CUDA;
    const ec_ops_t *ops = &cpu_ops;
    void *dev = NULL;
    int rc = 0;
    if (cuda) {
#ifdef BMT_HAVE_CUDA
        ops = ec_cuda_ops();
        if ((dev = ec_cuda_create(ctx, 64 * 64, &err)) == NULL)
            goto fatal;
        if (O.kernel_check && kernel_check(ops, dev, &err) < 0)
            goto fatal;
#else
        snprintf(err.text, sizeof(err.text), "built without CUDA: no model kernels for cuda");
        goto fatal;
#endif
    }
    if (my_rank == 0) {
        printf("# engine_check: layout %dx%d on %s (%s), %s, %d steps x %d micro-batches of %d "
               "rows per rank, lr %g, clip %g, seed %llu\n",
               lay->groups, lay->gpus_per_group, cuda ? "cuda" : "cpu", bmt_backend(ctx),
               bmt_dtype_name(O.dtype), O.steps, O.accum, (int)EC_ROWS, O.lr, O.clip,
               (unsigned long long)O.seed);
        fd_check();
    }

    ref_t R;
    memset(&R, 0, sizeof(R));
    double *final = malloc(ntot * sizeof(double)), *other = malloc(ntot * sizeof(double));
    if (final == NULL || other == NULL || ref_train(&R, world) < 0) {
        snprintf(err.text, sizeof(err.text), "out of host memory");
        goto fatal;
    }
    if (O.mismatch) {
        /* Ranks that disagree on the schedule would pair different collectives.
         * The engine must refuse at the first forward, on every rank, before
         * any collective of the schedule runs. */
        for (int kind = 0; kind < 2; kind++) { /* 0: prefetch, 1: one use's checkpointing */
            bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
            lc.prefetch = kind == 0 && my_rank % 2 ? 0 : 1;
            bmt_blocklist_t *l = bmt_blocklist_create(ctx, &lc, &err);
            const int64_t shape[1] = { 40 };
            for (int b = 0; l && b < 2; b++) {
                char name[16];
                snprintf(name, sizeof(name), "mm.%d", b);
                bmt_block_t *blk = bmt_block_create(ctx, name, &err);
                if (blk == NULL ||
                    bmt_block_add_param(blk, "w", 1, shape, O.dtype,
                                        (bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 }, 0, &err) < 0 ||
                    bmt_block_build(blk, O.seed, &err) < 0 ||
                    bmt_blocklist_append(l, blk, &kind_ops[K_MIX], NULL, &err) < 0)
                    goto fatal;
            }
            if (l == NULL || (kind == 1 && my_rank % 2 &&
                              bmt_blocklist_set_checkpointing(l, 1, false, &err) < 0))
                goto fatal;
            bmt_error_t e;
            memset(&e, 0, sizeof(e));
            int frc = bmt_blocklist_forward(l, &e);
            check(frc == -1 && strstr(e.text, "block lists differ"),
                  "mismatch: ranks with different %s are refused at the first forward: \"%s\"",
                  kind == 0 ? "prefetch settings" : "checkpointing of one use",
                  frc == -1 ? e.text : "it returned 0");
            bmt_blocklist_destroy(l);
        }
        printf("engine_check: mismatch: %ld passed, %ld failed on rank %d\n", (long)n_passed,
               (long)n_failed, my_rank);
        return ec_end(ctx, &R, final, other, dev, n_failed ? 1 : 0);
    }
    run_cfg_t main_cfg = { O.zero, O.ckpt, O.overlap, O.overwrite, true };
    if (engine_run(&main_cfg, &R, ops, dev, final, &err) < 0)
        goto fatal;
    if (misuse_blocks(&err) < 0)
        goto fatal;
    if (O.variants) {
        static const int cfgs[5][2] = { { 3, 1 }, { 2, 1 }, { 3, 0 }, { 2, 0 }, { 3, 2 } };
        for (int v = 0; v < 5; v++) {
            if (cfgs[v][0] == O.zero && cfgs[v][1] == O.ckpt)
                continue;
            run_cfg_t vc = { cfgs[v][0], cfgs[v][1], O.overlap, O.overwrite, false };
            if (engine_run(&vc, &R, ops, dev, other, &err) < 0)
                goto fatal;
            double worst = 0;
            const char *wn = "";
            for (int q = 0; q < ngp; q++) {
                double e = rel_err(other + gp[q].off, final + gp[q].off, (size_t)gp[q].numel);
                if (!(e <= worst))
                    worst = e, wn = gp[q].name;
            }
            check(worst <= 1e-6,
                  "variants: zero %d ckpt %d agrees with zero %d ckpt %d: worst relative "
                  "difference %.2e (%s), bound 1e-6%s",
                  vc.zero, vc.ckpt, O.zero, O.ckpt, worst, wn,
                  memcmp(other, final, ntot * sizeof(double)) == 0 ? " (bitwise equal)" : "");
        }
        /* The update deferred to the next forward or done in the step: the
         * same arguments on the same values, so the same bits. */
        run_cfg_t oc = { O.zero, O.ckpt, !O.overlap, O.overwrite, false };
        if (engine_run(&oc, &R, ops, dev, other, &err) < 0)
            goto fatal;
        check(memcmp(other, final, ntot * sizeof(double)) == 0,
              "variants: overlap %d gives the same parameters as overlap %d, bitwise", oc.overlap,
              O.overlap);
        /* Fresh gradients written (beta 0) or added into zeros: x + 0 = x. */
        if (O.overwrite != 2) {
            run_cfg_t wc = { O.zero, O.ckpt, O.overlap, !O.overwrite, false };
            if (engine_run(&wc, &R, ops, dev, other, &err) < 0)
                goto fatal;
            check(memcmp(other, final, ntot * sizeof(double)) == 0,
                  "variants: overwrite %d gives the same parameters as overwrite %d, bitwise",
                  wc.overwrite, O.overwrite);
        }
    }

    /* The summary over every rank. */
    double counts[2] = { (double)n_passed, (double)n_failed };
    double *dc = bmt_mem_alloc(ctx, sizeof(counts), &err);
    if (dc == NULL || bmt_mem_upload(ctx, dc, counts, sizeof(counts), &err) < 0 ||
        bmt_all_reduce(bmt_comm_world(ctx), dc, dc, 2, BMT_F64, BMT_SUM, &err) < 0 ||
        bmt_mem_download(ctx, counts, dc, sizeof(counts), &err) < 0)
        goto fatal;
    bmt_mem_free(ctx, dc);
    if (my_rank == 0)
        printf("engine_check: %.0f checks passed, %.0f failed on %d ranks (layout %dx%d, %s, %s, "
               "zero %d, ckpt %d, %d steps x %d)\n",
               counts[0], counts[1], world, lay->groups, lay->gpus_per_group, cuda ? "cuda" : "cpu",
               bmt_dtype_name(O.dtype), O.zero, O.ckpt, O.steps, O.accum);
    /* No rank exits (and has bmlaunch SIGTERM the others) before rank 0's
     * lines are out of its stdio buffer: a failing run's summary was lost. */
    fflush(stdout);
    if (bmt_barrier(bmt_comm_world(ctx), &err) < 0)
        goto fatal;
    rc = counts[1] > 0 ? 1 : 0;
    return ec_end(ctx, &R, final, other, dev, rc);

fatal:
    printf("FAIL (rank %d) engine_check stopped: %s\n", my_rank, err.text);
    fprintf(stderr, "engine_check: rank %d: %s\n", my_rank, err.text);
    fflush(stdout);
    bmt_finalize(ctx);
    return 1;
}
