/* nn/fp8.h — Hopper's 8-bit floats (OCP FP8: E4M3 and E5M2) in plain C: the
 * conversions, the per-tensor scales and the scaled products, as the reference
 * of the FP8 kernels and of an FP8 training step (docs/fp8.md).
 *
 * The formats (OCP 8-bit floating point, v1.0; CUDA's __nv_fp8_e4m3/_e5m2):
 *   E4M3  1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; S.1111.111
 *         is NaN. Largest 448, smallest normal 2^-6, smallest subnormal 2^-9.
 *   E5M2  1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is
 *         infinity, S.11111.{01,10,11} NaN. Largest finite 57344, smallest normal
 *         2^-14, smallest subnormal 2^-16.
 * Conversion from f32 rounds to nearest, ties to even, and saturates: a finite
 * value beyond the largest finite one, and an infinity, become the largest finite
 * value of its sign (CUDA's __NV_SATFINITE, which cuBLASLt's FP8 outputs use too);
 * NaN becomes the format's NaN (0x7f, or 0xff with the sign: E4M3; 0x7f/0xff for
 * E5M2 as well, a quiet NaN of either format). -0.0 keeps its sign (0x80).
 *
 * Per-tensor scaling: a tensor x is stored as q = fp8(x * scale) with one f32
 * scale, and read back as q / scale; a product of two scaled tensors is
 * (qa . qb) / (scale_a scale_b), the f32 "descale" cuBLASLt takes (its A/B
 * scale pointers hold 1/scale). nn_fp8_scale picks the scale that maps the
 * tensor's largest magnitude (amax) to the format's largest value, so nothing
 * saturates and the small values keep as much of the range as they can:
 *   current scaling: the amax of the tensor being converted (one more pass
 *     over it);
 *   delayed scaling: the largest amax of the last passes (nn_fp8_history_t,
 *     nn_fp8_plan_t), recorded by the conversions themselves, so no extra
 *     pass, but a tensor that grew since saturates (counted).
 *
 * Nothing here allocates or fails except where said (the emulated layer
 * products); sizes are the caller's.
 */
#ifndef NN_FP8_H
#define NN_FP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nn_fp8_kind {
    NN_FP8_E4M3 = 0, /* forward: weights and activations */
    NN_FP8_E5M2 = 1, /* backward: gradients (range over precision) */
} nn_fp8_kind_t;

/* The largest finite value of kind: 448 or 57344. */
float nn_fp8_max(nn_fp8_kind_t kind);

/* Where a scaled value loses more than rounding to saturation: the largest
 * finite value plus half the step below it, 464 (E4M3) or 61440 (E5M2). A
 * value below it ends at the largest value as rounding would put it there (at
 * exactly 61440 E5M2's tie rounds to the even 65536, which saturates);
 * delayed scaling's statistics count a tensor as saturated when its amax
 * times its scale exceeds it. */
float nn_fp8_saturation(nn_fp8_kind_t kind);

/* The f32 value of code q of kind (NaN codes give NaN, E5M2's infinities
 * infinity). Exact: every FP8 value is an f32. */
float nn_fp8_to_f32(uint8_t q, nn_fp8_kind_t kind);

/* The code of kind nearest to x (ties to even), saturating at the largest
 * finite value; NaN gives a NaN code. */
uint8_t nn_fp8_from_f32(float x, nn_fp8_kind_t kind);

/* The scale for a tensor whose largest magnitude is amax: nn_fp8_max(kind) /
 * amax rounded to f32 (one IEEE division, as the kernels compute it), divided
 * by 2^margin (margin >= 0 keeps headroom for delayed scaling). amax 0 (an all
 * zero tensor) gives 1. Returns 0 when amax is NaN, infinite or negative, or
 * when the scale would not be a finite positive f32 (amax below max / FLT_MAX:
 * about 1.3e-36 for E4M3, 1.7e-34 for E5M2): a caller must treat 0 as "this
 * tensor cannot be scaled" and fail loudly (a finite tensor that small gives
 * NaN products too; no trained tensor is). */
float nn_fp8_scale(float amax, nn_fp8_kind_t kind, int margin);

/* q[i] = nn_fp8_from_f32(x[i] * scale) for i < n (the product rounded to f32
 * first, as a kernel computes it). Returns the amax of x (max |x[i]|; NaN if
 * any x[i] is NaN, as the kernels report it), so that one pass both converts
 * and measures for delayed scaling. *saturated, if not NULL, gets the number of
 * finite x[i] whose x[i] * scale rounds beyond the largest finite value (E4M3:
 * above 464; E5M2: from 61440) or overflows to infinity: the values that lost
 * more than rounding (a value between the largest and the threshold rounds to
 * the largest, as it would anyway). */
float nn_fp8_quantize(uint8_t *q, const float *x, size_t n, float scale, nn_fp8_kind_t kind,
                      size_t *saturated);

/* The amax of x (NaN if any element is NaN). */
float nn_fp8_amax(const float *x, size_t n);

/* x[i] = dequantize(quantize(x[i])) in place with the tensor's current-scaling
 * scale (margin 0): what a tensor keeps of itself on its way through FP8.
 * Returns the scale used, 0 if x could not be scaled (NaN or infinite amax; x
 * is then left unchanged). */
float nn_fp8_roundtrip(float *x, size_t n, nn_fp8_kind_t kind);

/* The scaled FP8 product, as cuBLASLt computes it from FP8 operands:
 *   out (N,OC) = descale * sum_k fa(a[n,k]) fb(b[o,k])
 * with a (N,K) and b (OC,K) codes of kinds ka, kb, products and sums in double
 * (every product of two FP8 values is exact in f32), rounded to f32 once;
 * descale = 1 / (scale_a scale_b). Overwrites out. */
void nn_fp8_matmul(float *out, const uint8_t *a, nn_fp8_kind_t ka, const uint8_t *b,
                   nn_fp8_kind_t kb, float descale, int N, int K, int OC);

/* A linear layer's products as the FP8 mode computes them on the GPU, emulated
 * in f32 (the reference of that mode, and the CPU trainers' --fp8): the
 * operands each pass through FP8 at their current scale (nn_fp8_roundtrip),
 * then nn_conv1d_forward/backward (nn/ops_cpu.h, same arguments: wt 0 for
 * HF's Conv1D weight (IC,OC), 1 for nn.Linear's (OC,IC)) computes with them.
 *   forward:  inp and weight in E4M3; the bias added in f32;
 *   backward: dout in E5M2, inp and weight in E4M3 as in the forward, for
 *             dinp and dweight; dbias from dout itself (the GPU sums the bf16
 *             gradient for it, not its FP8 copy).
 * The copies are allocated per call. Returns 0; 1 when an operand cannot be
 * scaled (it holds NaN or infinite values): then every output element is NaN
 * (forward: out = NaN; backward: NaN added into dinp and dweight, dbias as
 * usual), as on the GPU, whose scale for such a tensor is NaN, so that the
 * step's non-finite loss or gradients are seen and handled as any other's
 * (skipped, and counted against --max-skipped); -1 when out of memory
 * (nothing written). */
int nn_fp8_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int IC, int OC, int wt);
int nn_fp8_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int IC, int OC, int wt);

/* Delayed scaling: the amax records of the last `len` passes
 * (len <= NN_FP8_HISTORY_MAX), a ring; the scale for the next pass comes from
 * the largest finite one. A non-finite record (the pass held NaN or inf: its
 * products were NaN and its step skipped) takes its place in the ring but no
 * part in the scale. */
#define NN_FP8_HISTORY_MAX 1024
typedef struct nn_fp8_history {
    float amax[NN_FP8_HISTORY_MAX];
    int len;   /* window length (1..NN_FP8_HISTORY_MAX) */
    int count; /* passes recorded, up to len */
    int next;  /* ring position of the next record */
} nn_fp8_history_t;

/* Empty history with window len; returns -1 if len is out of range. */
int nn_fp8_history_init(nn_fp8_history_t *h, int len);

/* Records one pass's amax (the oldest falls out), non-finite ones too.
 * Returns 0, or -1 when amax is NaN, infinite or negative (recorded anyway,
 * as the GPU records it; nn_fp8_history_scale passes over it). */
int nn_fp8_history_push(nn_fp8_history_t *h, float amax);

/* The scale for the next pass: nn_fp8_scale(largest finite record of the
 * window, kind, margin). 0 when there is none: nothing recorded yet (the
 * first pass takes its tensors' own amax: current scaling), or every record
 * non-finite (the tensor cannot be scaled: its products are NaN). */
float nn_fp8_history_scale(const nn_fp8_history_t *h, nn_fp8_kind_t kind, int margin);

/* One linear product's FP8 scales for a pass, its three operands j: 0 the
 * input and 1 the weight (E4M3), 2 the output's gradient (E5M2). */
typedef struct nn_fp8_scaling {
    int delayed;    /* 1: scale[] holds the pass's scales; 0: current scaling */
    float scale[3]; /* delayed: each operand's scale; 0: it cannot be scaled (NaN products) */
    float amax[3];  /* the pass's records: the largest amax of the operand's conversions in
                     * it (NaN once one held NaN, inf once one held inf; max otherwise) */
} nn_fp8_scaling_t;

/* nn_fp8_conv1d_forward/_backward with sc's scales, and its records kept:
 * current scaling (sc->delayed 0) as those two; delayed, each operand passes
 * through FP8 at sc->scale[j], an infinity in it becoming NaN (not the
 * largest value: a tensor that overflowed fails its step, as under current
 * scaling), and a finite value beyond the range saturating. Either way each
 * conversion's amax goes into sc->amax[j] (the backward converts the input
 * and the weight again: the same records). The backward's input and weight
 * are the forward's, so under either scaling their codes are the forward's.
 * Returns as those two. */
int nn_fp8_linear_forward(nn_fp8_scaling_t *sc, float *out, const float *inp, const float *weight,
                          const float *bias, int N, int IC, int OC, int wt);
int nn_fp8_linear_backward(nn_fp8_scaling_t *sc, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int N, int IC,
                           int OC, int wt);

/* What a cpu model's --fp8 switches: sc NULL, nn_conv1d_forward/backward
 * (f32, returns 0); otherwise nn_fp8_linear_forward/backward with sc (a
 * product of an nn_fp8_plan_t). -1 only when out of memory. */
int nn_linear_forward(nn_fp8_scaling_t *sc, float *out, const float *inp, const float *weight,
                      const float *bias, int N, int IC, int OC, int wt);
int nn_linear_backward(nn_fp8_scaling_t *sc, float *dinp, float *dweight, float *dbias,
                       const float *dout, const float *inp, const float *weight, int N, int IC,
                       int OC, int wt);

/* A model's FP8 scales (docs/fp8.md, "Delayed scaling"): n products, each an
 * nn_fp8_scaling_t, and with delayed scaling a history per operand. A pass
 * is one micro-batch's forward and backward (a recomputation under
 * checkpointing is part of its pass; a forward without a backward, as a
 * validation's, records into the pass that follows). The GPU trainer keeps
 * the same bookkeeping on the device (nn_cuda_fp8_advance), so the cpu one
 * is its reference. */
typedef struct nn_fp8_plan nn_fp8_plan_t;

/* history 0: current scaling in every pass; 1..NN_FP8_HISTORY_MAX: delayed
 * scaling over that many passes, the first pass (until a backward has ended)
 * with current scaling. NULL when n < 1, history out of range, or out of
 * memory. */
nn_fp8_plan_t *nn_fp8_plan_create(int n, int history);
void nn_fp8_plan_destroy(nn_fp8_plan_t *p);

/* Product i's scales (0 <= i < n). */
nn_fp8_scaling_t *nn_fp8_plan_at(nn_fp8_plan_t *p, int i);

/* A forward begins (the model calls it first thing in every forward). When a
 * backward ended since the last begin, the records close: each goes into its
 * operand's history and is cleared, and with delayed scaling every operand
 * gets its scale for this pass from its history (delayed becomes 1). */
void nn_fp8_plan_begin(nn_fp8_plan_t *p);

/* A backward ended (the model calls it last thing in every backward). */
void nn_fp8_plan_end(nn_fp8_plan_t *p);

/* What the closed records said, counted over operands and passes:
 * saturated, a finite record times the delayed scale it was converted at
 * above nn_fp8_saturation (its largest elements lost more than rounding: the
 * tensor grew past its history's largest by more than half a step of the
 * format's top binade, 3.6% E4M3, 7.1% E5M2); unscalable, two counts added:
 * each non-finite record as its pass closes, and each delayed scale of 0
 * (no finite record in the window) as a pass begins with it, the pass that
 * the stats call's own begin opens included. So an operand whose window holds
 * only non-finite records counts twice a pass: U is a count of events, not
 * of operand-passes, and any U > 0 says a tensor could not be scaled. */
typedef struct nn_fp8_stats {
    long passes;     /* passes closed */
    long saturated;  /* operand-passes */
    long unscalable; /* operand-passes */
} nn_fp8_stats_t;
nn_fp8_stats_t nn_fp8_plan_stats(const nn_fp8_plan_t *p);

#ifdef __cplusplus
}
#endif

#endif
