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

/* How nn_cuda_fp8_conv1d_* scale a layer's three operands (the input and
 * the weight in E4M3, the output's gradient in E5M2), as nn_fp8_scaling_t
 * does on the cpu (docs/fp8.md, "Delayed scaling"):
 *   s:   NN_FP8_CONV1D_SCALES device f32, 16-byte aligned, four per operand:
 *        descale, scale, amax (current scaling), unused; the input's s[0..3],
 *        the weight's s[4..7], the gradient's s[8..11]. The products read the
 *        descales.
 *   rec: NULL, or 3 device f32 (input, weight, gradient): the pass's records,
 *        each conversion's amax max'ed in (atomicMax of the magnitudes' bit
 *        patterns: NaN beats inf beats every finite value); cleared by
 *        nn_cuda_fp8_advance.
 *   delayed: 0, current scaling: each operand's amax measured first, its
 *        scale and descale written into s (one more pass over it); 1: s
 *        holds the pass's scales (nn_cuda_fp8_advance made them), the
 *        conversion measures as it goes, and an infinity in an operand
 *        becomes a NaN code (a finite value beyond the range saturates).
 *   bad: a device int set to 1 when an operand cannot be scaled (NaN or inf
 *        in it under current scaling); its products are then NaN. */
typedef struct nn_cuda_fp8_scales {
    float *s;
    float *rec;
    int delayed;
    int *bad;
} nn_cuda_fp8_scales_t;

/* Operand j's codes (0 input, 1 weight: E4M3; 2 gradient: E5M2, as kind
 * says) of x (rows,cols) bf16 contiguous under sc, as nn_cuda_fp8_conv1d_*
 * make them: q row-major and/or qt transposed (nn_cuda_fp8_quantize's
 * layouts), scales and record as sc says. gelu 1: the codes of GELU(x)
 * instead, as nn_cuda_fp8_conv1d_forward's gelu makes them. For a
 * recomputation that stops between a product's input and the product. */
int nn_cuda_fp8_codes(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int gelu, int rows,
                      int cols, nn_fp8_kind_t kind, const nn_cuda_fp8_scales_t *sc, int j,
                      bmt_error_t *err);

/* A linear layer with FP8 operands: nn_fp8_linear_forward and _backward of
 * nn/fp8.h (their exact f32 emulation, the reference) on the GPU, for HF's
 * Conv1D weight (IC,OC) bf16; f32 sums. sc as above: the forward writes (or,
 * delayed, reads) the first two operands' scales, the backward reads them
 * (the same layer's forward must have run with the same weight and sc) and
 * writes or reads the third.
 *   scratch: nn_cuda_fp8_conv1d_scratch_bytes(N, IC, OC), 256-byte aligned,
 *      free between calls (stream-ordered: one buffer serves every layer).
 * N, IC and OC must be multiples of 16 (the products' K and the transposed
 * codes' rows); -1 and a message otherwise. */
#define NN_FP8_CONV1D_SCALES 12
size_t nn_cuda_fp8_conv1d_scratch_bytes(int N, int IC, int OC);

/* out (N,OC) bf16 = E4M3(inp) x E4M3(weight) x descales + bias (OC bf16, or
 * NULL). xqt (IC,N), if not NULL, gets the input's codes transposed: all the
 * backward needs of the input (IC N bytes, half of the bf16 input). wq
 * (IC,OC), if not NULL, gets the weight's codes row-major, in the same pass
 * as the transposed ones the product reads: what the backward's dinp reads
 * of the weight (IC OC bytes), so the backward need not convert it again.
 * gelu 1: the product's input is GELU(inp) (tanh approximation), each value
 * rounded to bf16 as nn_cuda_gelu_forward writes it and made inside the
 * conversion (amax and record too): the same bits as converting
 * nn_cuda_gelu_forward's output, without writing or reading it.
 * fast_accum: cuBLASLt's FAST_ACCUM (nn_cuda_fp8_matmul). */
int nn_cuda_fp8_conv1d_forward(nn_cuda_t *h, void *out, uint8_t *xqt, uint8_t *wq, const void *inp,
                               int gelu, const void *weight, const void *bias, int N, int IC,
                               int OC, int fast_accum, const nn_cuda_fp8_scales_t *sc,
                               void *scratch, bmt_error_t *err);

/* out (N,OC) bf16 = res (N,OC) bf16 + the same product: the residual read
 * as the product's C input (nn_cuda_fp8_matmul_residual), the sum rounded
 * once, where the plain forward and nn_cuda_residual_forward round twice and
 * pass the output through memory once more. res NULL or out is refused
 * (nn_cuda_fp8_matmul_residual). */
int nn_cuda_fp8_conv1d_residual_forward(nn_cuda_t *h, void *out, const void *res, uint8_t *xqt,
                                        uint8_t *wq, const void *inp, int gelu, const void *weight,
                                        const void *bias, int N, int IC, int OC, int fast_accum,
                                        const nn_cuda_fp8_scales_t *sc, void *scratch,
                                        bmt_error_t *err);

/* From dout (N,OC) bf16, through E5M2: dweight (IC,OC) f32 += (add; = when
 * add is 0: a fresh gradient, bmt_block_call_t.grads_fresh) from xqt (the
 * forward's); dinp (N,IC) bf16 = (overwritten) from the weight's E4M3 codes at
 * the forward's scale: wq_kept, the forward's wq of the same weight at the
 * same scale, or, if NULL, made again from weight (the same bits); dbias (OC) f32 += (or =) the
 * column sums of the gradient itself, not of its codes (f32 sums in a fixed order, taken by the
 * conversion as it reads the gradient). Any of the three NULL: not wanted (xqt is read only for
 * dweight). The gradient is converted once per call: asking for dinp and dweight in one call saves
 * a conversion. dgelu_pre: NULL, or GELU's input (N,OC) bf16 when this layer's input is GELU's
 * output: the layer's output gradient is then GELU'(dgelu_pre) x dout, each value rounded to bf16
 * as nn_cuda_gelu_backward writes it, made inside the conversion (codes, amax, record and dbias):
 * the same bits as nn_cuda_gelu_backward's output passed as dout, without writing or reading it. */
int nn_cuda_fp8_conv1d_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *dgelu_pre, const uint8_t *xqt,
                                const uint8_t *wq_kept, const void *weight, int N, int IC, int OC,
                                const nn_cuda_fp8_scales_t *sc, void *scratch, int add,
                                bmt_error_t *err);

/* The same for nn.Linear's weight (OC,IC) bf16 (Llama's layers): the twins
 * of nn_fp8_linear_forward/_backward with wt 1, the same scales, scratch
 * (nn_cuda_fp8_conv1d_scratch_bytes(N, IC, OC)), records and refusals, the
 * same codes of the weight laid out for this layout's products. The forward
 * writes out (N,OC) = E4M3(inp) x E4M3(weight)^T x descales + bias (OC bf16,
 * or NULL), xqt (IC,N) as above and wqt (IC,OC), if not NULL, the weight's
 * codes transposed (IC OC bytes: what dinp's product reads, so the backward
 * need not convert the weight again). The backward: dweight (OC,IC) f32 +=
 * (add; = when add is 0) dout^T x from xqt; dinp (N,IC) bf16 = dout x W from
 * wqt_kept (the forward's wqt of the same weight at the same scale) or, if
 * NULL, the weight converted again (the same bits); dbias as above; no GELU. */
int nn_cuda_fp8_linear_forward(nn_cuda_t *h, void *out, uint8_t *xqt, uint8_t *wqt, const void *inp,
                               const void *weight, const void *bias, int N, int IC, int OC,
                               int fast_accum, const nn_cuda_fp8_scales_t *sc, void *scratch,
                               bmt_error_t *err);
/* out = res + the product, as nn_cuda_fp8_conv1d_residual_forward. */
int nn_cuda_fp8_linear_residual_forward(nn_cuda_t *h, void *out, const void *res, uint8_t *xqt,
                                        uint8_t *wqt, const void *inp, const void *weight,
                                        const void *bias, int N, int IC, int OC, int fast_accum,
                                        const nn_cuda_fp8_scales_t *sc, void *scratch,
                                        bmt_error_t *err);
int nn_cuda_fp8_linear_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                const void *dout, const uint8_t *xqt, const uint8_t *wqt_kept,
                                const void *weight, int N, int IC, int OC,
                                const nn_cuda_fp8_scales_t *sc, void *scratch, int add,
                                bmt_error_t *err);

/* Delayed scaling's step on the device, the twin of nn_fp8_plan_begin's: for
 * n layers whose scales lie in s (n, NN_FP8_CONV1D_SCALES) and records in rec
 * (n, 3), with hist (len, n, 3) device f32, one launch does for every
 * operand t:
 *   - stats[0] += 1 when its record is finite and record x the scale in s
 *     (f32 product) exceeds nn_fp8_saturation, if was_delayed (the pass
 *     just closed ran at those scales: its largest elements saturated);
 *     stats[1] += 1 when the record is NaN or inf;
 *   - len > 0: hist[slot][t] = the record, then the scale and descale in s
 *     from the largest finite record of hist[0..count)[t] (count after this
 *     one), nn_cuda_fp8_scale's arithmetic (margin 0); none finite: NaN for
 *     both, *bad = 1 and stats[1] += 1;
 *   - the record cleared.
 * stats: 2 device unsigned long long. -1 and err for a bad argument (slot
 * outside 0..len-1, count outside 1..len, s not 16-byte aligned). */
int nn_cuda_fp8_advance(nn_cuda_t *h, float *s, float *rec, float *hist, int n, int len, int slot,
                        int count, int was_delayed, int *bad, unsigned long long *stats,
                        bmt_error_t *err);

/* A model's FP8 scales on the device, the twin of nn/fp8.h's nn_fp8_plan_t
 * (docs/fp8.md, "Delayed scaling"): n products, each with an
 * nn_cuda_fp8_scales_t, in one device buffer of nn_cuda_fp8_plan_bytes(n,
 * history) the model allocates (and frees: it is p->s). The model calls
 * nn_cuda_fp8_plan_begin first thing in every forward (a no-op unless a
 * backward ended since: then the records close through one
 * nn_cuda_fp8_advance and, with a history, every operand gets its delayed
 * scale for the new pass) and nn_cuda_fp8_plan_end last thing in every
 * backward. stats (2 device u64: saturated, unscalable) and passes are what
 * nn_fp8_plan_stats counts; the pass in progress closes at the next begin. */
typedef struct nn_cuda_fp8_plan {
    float *s;                  /* (n, NN_FP8_CONV1D_SCALES) */
    float *rec;                /* (n, 3): the pass's amax records */
    float *hist;               /* (history, n, 3): delayed scaling's closed records, or NULL */
    unsigned long long *stats; /* nn_cuda_fp8_advance's: saturated, unscalable */
    int *bad;                  /* set by a tensor FP8 cannot scale (its products are NaN) */
    int n, history;            /* products; 0: current scaling, else delayed over that many */
    int slot, count;           /* the history ring's next slot, records in it */
    int delayed;               /* this pass runs at the history's scales */
    int ended;                 /* a backward ended since the last forward began */
    long passes;               /* passes closed */
} nn_cuda_fp8_plan_t;

size_t nn_cuda_fp8_plan_bytes(int n, int history);

/* Lays the plan out in buf (16-byte aligned, nn_cuda_fp8_plan_bytes) and
 * zeroes it on the handle's stream: current scaling until a backward ends.
 * -1 and err for a bad argument or a failed memset. */
int nn_cuda_fp8_plan_init(nn_cuda_t *h, nn_cuda_fp8_plan_t *p, void *buf, int n, int history,
                          bmt_error_t *err);

/* Product i's scales for nn_cuda_fp8_conv1d_* / _linear_* (0 <= i < n). */
nn_cuda_fp8_scales_t nn_cuda_fp8_plan_at(const nn_cuda_fp8_plan_t *p, int i);

int nn_cuda_fp8_plan_begin(nn_cuda_t *h, nn_cuda_fp8_plan_t *p, bmt_error_t *err);
void nn_cuda_fp8_plan_end(nn_cuda_fp8_plan_t *p);

#ifdef __cplusplus
}
#endif

#endif
