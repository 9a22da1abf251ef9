/* tests/gpu/gpu_check.h — what the GPU checkers share (gpt2_ops_check.c,
 * llama_ops_check.c, fp8_check.c): TAP output, the handle and stream they
 * run on, dying with a TAP line, a seeded generator of bf16-exact values,
 * and copies to and from the device that go through that stream.
 *
 * A header of static functions and state for the one .c file of a checker
 * (every .c file of tests/gpu is a program of its own), included after
 * <cuda_runtime.h>, "bmt/bmt.h" and "nn/ops_cuda.h". The checker creates
 * `stream` and `h` in main; every check prints "ok N - ..." or "not ok N -
 * ...", and main ends with "1..tap_n" and exit status tap_failed != 0.
 */
#ifndef TESTS_GPU_CHECK_H
#define TESTS_GPU_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_n, tap_failed;
static nn_cuda_t *h;
static cudaStream_t stream;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static inline void die(const char *what, const char *why)
{
    tap_n++;
    printf("not ok %d - %s: %s\n1..%d\n", tap_n, what, why, tap_n);
    exit(1);
}

static inline void ck(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        die(what, cudaGetErrorString(e));
}

static inline void run(int rc, const char *what, const bmt_error_t *err)
{
    if (rc < 0)
        die(what, err->text);
    ck(cudaStreamSynchronize(stream), what);
}

/* ||a - b|| / ||b|| in double; NaN when a has a NaN (an unwritten element). */
static inline double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return NAN;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const char *check_tag = ""; /* appended to check()'s names, e.g. " (tuned products)" */

static inline void check(const char *what, const float *got, const float *want, size_t n,
                         double bound)
{
    double e = rel(got, want, n);
    bool good = e <= bound; /* NaN fails */
    printf("%sok %d - %s%s: rel err %.3g (bound %.3g)\n", good ? "" : "not ", ++tap_n, what,
           check_tag, e, bound);
    fflush(stdout);
    tap_failed += !good;
}

static inline void check_true(bool good, const char *what)
{
    printf("%sok %d - %s\n", good ? "" : "not ", ++tap_n, what);
    fflush(stdout);
    tap_failed += !good;
}

/* Two downloads of the same n floats, bit for bit. */
static inline void check_same(const char *what, const float *a, const float *b, size_t n)
{
    char name[160];
    snprintf(name, sizeof(name), "%s: the same bits on a second run", what);
    check_true(memcmp(a, b, n * sizeof(float)) == 0, name);
}

static inline double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static inline float bf16r(float x) { return bmt_bf16_to_f32(bmt_f32_to_bf16(x)); }

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        die("malloc", "out of memory");
    return p;
}

/* n values, normal(0, scale), rounded to bf16, never exactly 0. */
static inline float *rnd(size_t n, float scale)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double u1 = uniform() + 1e-12, u2 = uniform();
        float v = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2)) * scale;
        x[i] = bf16r(v == 0 ? scale * 1e-3f : v);
    }
    return x;
}

static inline float *zeros(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    if (x == NULL)
        die("calloc", "out of memory");
    return x;
}

static inline float *copy(const float *x, size_t n)
{
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* Every copy and fill goes to the ops' stream and waits for it: plain
 * cudaMemcpy and cudaMemset run on the legacy default stream, which does not
 * order itself with a cudaStreamNonBlocking stream (an upload from pageable
 * memory may still be landing when cudaMemcpy returns, and a cudaMemset may
 * land after the kernel that follows it). */
static inline void h2d(void *d, const void *x, size_t bytes)
{
    ck(cudaMemcpyAsync(d, x, bytes, cudaMemcpyHostToDevice, stream), "upload");
    ck(cudaStreamSynchronize(stream), "upload");
}

static inline void d2h(void *x, const void *d, size_t bytes)
{
    ck(cudaMemcpyAsync(x, d, bytes, cudaMemcpyDeviceToHost, stream), "download");
    ck(cudaStreamSynchronize(stream), "download");
}

static inline void poison(void *d, size_t bytes)
{
    ck(cudaMemsetAsync(d, 0xff, bytes, stream), "poison");
    ck(cudaStreamSynchronize(stream), "poison");
}

static inline void *dmalloc(size_t bytes)
{
    void *p;
    ck(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    poison(p, bytes);
    return p;
}

static inline void put_bf16(void *d, const float *x, size_t n)
{
    uint16_t *t = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        t[i] = bmt_f32_to_bf16(x[i]);
    h2d(d, t, n * 2);
    free(t);
}

static inline void *up_bf16(const float *x, size_t n)
{
    void *d = dmalloc(n * 2);
    put_bf16(d, x, n);
    return d;
}

static inline void *up_i32(const int32_t *x, size_t n)
{
    void *d = dmalloc(n * 4);
    h2d(d, x, n * 4);
    return d;
}

static inline float *up_f32(const float *x, size_t n)
{
    float *d = dmalloc(n * 4);
    h2d(d, x, n * 4);
    return d;
}

static inline float *down_bf16(const void *d, size_t n)
{
    uint16_t *t = xmalloc(n * 2);
    float *x = xmalloc(n * sizeof(float));
    d2h(t, d, n * 2);
    for (size_t i = 0; i < n; i++)
        x[i] = bmt_bf16_to_f32(t[i]);
    free(t);
    return x;
}

static inline float *down_f32(const void *d, size_t n)
{
    float *x = xmalloc(n * sizeof(float));
    d2h(x, d, n * 4);
    return x;
}

#endif
