/* nn/fp8_cuda.h — FP8 on CUDA: the conversions and scales of nn/fp8.h on the
 * device (docs/fp8.md). The products are nn/ops_cuda.h's nn_cuda_fp8_matmul.
 *
 * The CUDA twins of nn/fp8.h, which is checked against the formats'
 * definitions (tests/integration/test_fp8.sh); tests/gpu/fp8_check.c checks
 * these against it bit for bit. Scales live in device memory (f32), so a step
 * never waits for the host: nn_cuda_fp8_amax measures a tensor,
 * nn_cuda_fp8_scale turns its amax into the scale the conversion multiplies
 * by and the descale the product multiplies by. A tensor that cannot be
 * scaled (NaN or infinite amax) gets a NaN scale, so its products are NaN,
 * as nn_fp8_conv1d_* give on the cpu, and sets a device flag.
 *
 * Functions run on the handle's stream (nn_cuda_stream) and return 0, or -1
 * with err (a bad argument, or the launch's CUDA error). Pointers are device
 * memory; x is bf16.
 */
#ifndef NN_FP8_CUDA_H
#define NN_FP8_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/error.h"
#include "nn/fp8.h"
#include "nn/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *amax (f32) = max |x[i]| over n bf16, NaN if any x[i] is NaN (nn_fp8_amax's).
 * Overwrites *amax; order does not matter (max), so every run gives the same. */
int nn_cuda_fp8_amax(nn_cuda_t *h, float *amax, const void *x, size_t n, bmt_error_t *err);

/* From *amax (f32): *scale = nn_fp8_scale(*amax, kind, margin) and *descale =
 * 1 / *scale (f32, IEEE division: the same bits as the host's 1.0f / scale).
 * Where nn_fp8_scale gives 0 (amax NaN, infinite, negative or too small), both
 * are NaN, so the tensor's codes and every product it enters are NaN and the
 * step is handled as any non-finite one, and *bad = 1 (an int the caller
 * zeroes and may read to say which tensor). margin 0..64. */
int nn_cuda_fp8_scale(nn_cuda_t *h, float *scale, float *descale, const float *amax,
                      nn_fp8_kind_t kind, int margin, int *bad, bmt_error_t *err);

/* q (rows,cols) = nn_fp8_from_f32(x * *scale) of x (rows,cols) bf16 with rows
 * ld elements apart, and qt (cols,rows) = its transpose (either may be NULL,
 * not both): the two layouts the FP8 products read (nn_cuda_fp8_matmul wants
 * the reduced dimension contiguous in both operands). amax, if not NULL, gets
 * max |x| (f32) of this x, for delayed scaling. q, qt 16-byte aligned; cols
 * (for q) and rows (for qt) multiples of 16. */
int nn_cuda_fp8_quantize(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int ld, int rows,
                         int cols, const float *scale, nn_fp8_kind_t kind, float *amax,
                         bmt_error_t *err);

/* Current scaling in one call, as nn/fp8.c's conversions do it: from x
 * (rows,cols) bf16, contiguous, s[0] = its descale, s[1] = its scale
 * (nn_cuda_fp8_scale's, margin 0; NaN, and *bad = 1, when x holds NaN or
 * inf), s[2] = its amax (s[3] is not written); then q and/or qt as
 * nn_cuda_fp8_quantize writes them. Three launches: clear s[2], amax, and
 * the conversion, which makes the scale from s[2] itself. s 16-byte aligned:
 * the descale is what the products read, and cuBLASLt wants its scale
 * pointers so; bad not NULL. */
int nn_cuda_fp8_cast(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int rows, int cols,
                     nn_fp8_kind_t kind, float *s, int *bad, bmt_error_t *err);

/* A linear layer with FP8 operands: nn_fp8_conv1d_forward and _backward of
 * nn/fp8.h (their exact f32 emulation, the reference) on the GPU, for HF's
 * Conv1D weight (IC,OC) bf16. Current scaling for every operand; f32 sums.
 *   s: NN_FP8_CONV1D_SCALES device f32, 16-byte aligned, the layer's: four
 *      per operand as nn_cuda_fp8_cast writes them, for the input (s[0..3]),
 *      the weight (s[4..7]) and the output's gradient (s[8..11]). The forward
 *      writes the first two groups; the backward reads them (the same layer's
 *      forward must have run with the same weight) and writes the third.
 *   scratch: nn_cuda_fp8_conv1d_scratch_bytes(N, IC, OC), 256-byte aligned,
 *      free between calls (stream-ordered: one buffer serves every layer).
 *   bad: a device int set to 1 when an operand cannot be scaled (NaN or inf
 *      in it); its products are then NaN (nn_cuda_fp8_scale).
 * N, IC and OC must be multiples of 16 (the products' K and the transposed
 * codes' rows); -1 and a message otherwise. */
#define NN_FP8_CONV1D_SCALES 12
size_t nn_cuda_fp8_conv1d_scratch_bytes(int N, int IC, int OC);

/* out (N,OC) bf16 = E4M3(inp) x E4M3(weight) x descales + bias (OC bf16, or
 * NULL). xqt (IC,N), if not NULL, gets the input's codes transposed: all the
 * backward needs of the input (IC N bytes, half of the bf16 input).
 * fast_accum: cuBLASLt's FAST_ACCUM (nn_cuda_fp8_matmul). */
int nn_cuda_fp8_conv1d_forward(nn_cuda_t *h, void *out, uint8_t *xqt, const void *inp,
                               const void *weight, const void *bias, int N, int IC, int OC,
                               int fast_accum, float *s, int *bad, void *scratch, bmt_error_t *err);

/* From dout (N,OC) bf16, through E5M2: dweight (IC,OC) f32 += from xqt (the
 * forward's); dinp (N,IC) bf16 = (overwritten) from the weight's E4M3 codes at
 * the forward's scale; dbias (OC) f32 += the column sums of dout itself, not
 * of its codes. Any of the three NULL: not wanted (xqt is read only for
 * dweight), so dweight may be taken first and the saved codes freed before
 * dinp's buffer exists. */
int nn_cuda_fp8_conv1d_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                const void *dout, const uint8_t *xqt, const void *weight, int N,
                                int IC, int OC, float *s, int *bad, void *scratch,
                                bmt_error_t *err);

#ifdef __cplusplus
}
#endif

#endif
