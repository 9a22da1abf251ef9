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
 *   delayed scaling: the largest amax of the last steps (nn_fp8_history_t), no
 *     extra pass, but a tensor that grew since saturates (counted).
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
 * when the scale would not be a finite positive f32 (amax below about 1e-36):
 * a caller must treat 0 as "this tensor cannot be scaled" and fail loudly. */
float nn_fp8_scale(float amax, nn_fp8_kind_t kind, int margin);

/* q[i] = nn_fp8_from_f32(x[i] * scale) for i < n (the product rounded to f32
 * first, as a kernel computes it). Returns the amax of x (max |x[i]|; NaN if
 * any x[i] is NaN, as the kernels report it), so that one pass both converts
 * and measures for delayed scaling. *saturated, if not NULL, gets the number of
 * finite x[i] whose x[i] * scale exceeded the largest finite value. */
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

/* What a cpu model's --fp8 switches: with fp8 0, nn_conv1d_forward/backward
 * (f32, returns 0); otherwise the two above. -1 only when out of memory. */
int nn_linear_forward(int fp8, float *out, const float *inp, const float *weight, const float *bias,
                      int N, int IC, int OC, int wt);
int nn_linear_backward(int fp8, float *dinp, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, int N, int IC, int OC, int wt);

/* Delayed scaling: the amax of the last `len` steps (len <= NN_FP8_HISTORY_MAX),
 * a ring; the scale for the next step comes from their maximum. */
#define NN_FP8_HISTORY_MAX 1024
typedef struct nn_fp8_history {
    float amax[NN_FP8_HISTORY_MAX];
    int len;   /* window length (1..NN_FP8_HISTORY_MAX) */
    int count; /* steps recorded, up to len */
    int next;  /* ring position of the next record */
} nn_fp8_history_t;

/* Empty history with window len; returns -1 if len is out of range. */
int nn_fp8_history_init(nn_fp8_history_t *h, int len);

/* Records one step's amax (the oldest falls out). Returns -1, recording
 * nothing, when amax is NaN or infinite: the step overflowed and must fail. */
int nn_fp8_history_push(nn_fp8_history_t *h, float amax);

/* The scale for the next step: nn_fp8_scale(max of the window, kind, margin).
 * 0 while nothing is recorded: the first step takes its tensor's own amax
 * (current scaling). */
float nn_fp8_history_scale(const nn_fp8_history_t *h, nn_fp8_kind_t kind, int margin);

#ifdef __cplusplus
}
#endif

#endif
