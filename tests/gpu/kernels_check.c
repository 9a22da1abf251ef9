/* tests/gpu/kernels_check.c — every kern_* on cuda against the cpu reference.
 *
 * Runs on a machine with a GPU (tests/gpu/test_kernels.sh). Two contexts are
 * made by hand, one cpu and one cuda (device 0), without bmt_init. Each call
 * gets fresh random inputs (never zeros), its outputs poisoned (all bits set:
 * NaN) first, and runs on a non-blocking stream of its own; the same call on the
 * cpu is the reference. Bounds:
 *   init          f64 within 1e-12 of the cpu, relative to |a| + |b| + |value|
 *                 (CUDA's log/cos/erfc/exp may differ from glibc's in the last
 *                 bits); f32 and bf16 bit for bit, except where the two f64
 *                 values round differently (a rounding boundary between them),
 *                 and always the rounding of the device's own f64 value; pieces
 *                 at arbitrary offsets equal one whole fill, bit for bit;
 *   cast, zero,   bit for bit (NaN by class where the conversion goes through
 *   accumulate    f64, whose NaN payloads the device does not keep);
 *   sumsq         within 1e-12 relative, and the same bits on every run;
 *   adamw         within 1e-6 relative over 10 steps (the element function is
 *                 the same text with every f32 operation rounded on its own, so
 *                 bit for bit is expected; the count of differing elements is
 *                 printed); on a split master (kern_adamw_split) hi, lo, m and
 *                 v bit for bit.
 * Aligned and misaligned (offset by one element) buffers and odd sizes take the
 * vector and the scalar paths. A last part prints throughput (diagnostics only).
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef BMT_HAVE_CUDA
int main(void)
{
    printf("1..0 # SKIP libbmt was built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime.h>

#include "bmt/bmt.h"
#include "bmt/block.h"
#include "ctx.h"
#include "kernels.h"

static bmt_ctx_t *cpu, *gpu;
static cudaStream_t stream;
static int tap_n, tap_failed;
static bool quick; /* --quick: sizes / 64 and no throughput (for compute-sanitizer) */

static size_t size(size_t n) { return quick ? (n >> 6) + (n & 7) : n; }

static int ok(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ok(bool cond, const char *fmt, ...)
{
    va_list ap;
    printf("%sok %d - ", cond ? "" : "not ", ++tap_n);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (!cond)
        tap_failed++;
    return cond;
}

static void die(const char *what, const char *why)
{
    tap_n++;
    printf("not ok %d - %s: %s\n1..%d\n", tap_n, what, why, tap_n);
    exit(1);
}

static void cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        die(what, cudaGetErrorString(e));
}

static void kern_check(int rc, const bmt_error_t *err, const char *what)
{
    if (rc != 0)
        die(what, err->text);
}

/* ------------------------------------------------------------ memory and data */

static uint64_t rng_state = 0x3243f6a8885a308dULL;

static uint64_t rnd64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rnd_unit(void) { return (double)(rnd64() >> 11) * 0x1p-53; }

/* Uniform in +-[2^-lo, 2^hi) magnitudes, never 0. */
static float rnd_float(int lo, int hi)
{
    double u;
    do
        u = rnd_unit() * 2.0 - 1.0;
    while (u == 0.0);
    return (float)ldexp(u, (int)(rnd64() % (uint64_t)(lo + hi + 1)) - lo);
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void *host(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        die("malloc", "out of host memory");
    return p;
}

static void *dev(size_t bytes)
{
    void *p = NULL;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
}

/* poison and up first wait for the stream: its kernels may still read the
 * buffer (the legacy stream's copies do not wait for a non-blocking stream). */
static void poison(void *d, size_t bytes)
{
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cuda_check(cudaMemset(d, 0xff, bytes), "cudaMemset");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static void up(void *d, const void *h, size_t bytes)
{
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cuda_check(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static void down(void *h, const void *d, size_t bytes)
{
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cuda_check(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

/* Random f32 data with the special values a conversion must get right. */
static void fill_f32_special(float *x, size_t n)
{
    static const uint32_t special[] = { 0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff,
                                        0x7f7fffff, 0x7f7f8000, 0x7f800000, 0xff800000,
                                        0x7fc00000, 0x7f800001, 0x7f810000, 0xffffffff,
                                        0x00008000, 0x00018000, 0x807fffff, 0x80000000 };
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd64();
        if (r % 16 == 0)
            x[i] = u2f(special[(r >> 8) % (sizeof(special) / sizeof(special[0]))]);
        else if (r % 16 == 1)
            x[i] = u2f(((uint32_t)(r >> 32) & 0xffff0000u) | 0x8000u); /* a tie */
        else
            x[i] = rnd_float(30, 30);
    }
}

static size_t esize(bmt_dtype_t t) { return bmt_dtype_size(t); }

static double elem(const void *buf, bmt_dtype_t t, size_t i)
{
    switch (t) {
    case BMT_F32: return ((const float *)buf)[i];
    case BMT_BF16: return bmt_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return ((const double *)buf)[i];
    }
}

/* Bits of element i, widened. */
static uint64_t bits(const void *buf, bmt_dtype_t t, size_t i)
{
    uint64_t u = 0;
    memcpy(&u, (const char *)buf + i * esize(t), esize(t));
    return u;
}

static uint64_t round_bits(double v, bmt_dtype_t t)
{
    float f = (float)v;
    switch (t) {
    case BMT_F32: return f2u(f);
    case BMT_BF16: return bmt_f32_to_bf16(f);
    default: {
        uint64_t u;
        memcpy(&u, &v, 8);
        return u;
    }
    }
}

/* ------------------------------------------------------------ init */

static void check_init(void)
{
    const size_t n = size((1u << 20) + 13);
    const bmt_init_t kinds[] = { BMT_INIT_UNIFORM_V(-0.3, 0.7),
                                 BMT_INIT_NORMAL_V(0.1, 0.02),
                                 BMT_INIT_TRUNC_NORMAL_V(-0.5, 1.5),
                                 BMT_INIT_NORMAL_V(0.0, 1.0),
                                 { BMT_INIT_CONSTANT, -0.3, 0, 2 },
                                 BMT_INIT_ONES_V,
                                 BMT_INIT_ZEROS_V };
    const uint64_t firsts[] = { 0, 4294967296ULL - 1000, 987654321987ULL };
    double *c64 = host(n * 8), *g64 = host(n * 8);
    void *c = host(n * 8), *g = host(n * 8), *d = dev(n * 8 + 8);
    bmt_error_t err;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        const bmt_init_t *in = &kinds[k];
        char name[64];
        snprintf(name, sizeof(name), "h.%zu.mlp.c_fc.weight", k);
        uint32_t key[2];
        kern_init_key(rnd64(), name, key);
        uint64_t first = firsts[k % 3];

        /* f64: within rounding of the math libraries */
        poison(d, n * 8);
        kern_check(kern_init(gpu, stream, d, BMT_F64, n, first, key, in, &err), &err, "kern_init");
        kern_check(kern_init(cpu, NULL, c64, BMT_F64, n, first, key, in, &err), &err, "kern_init");
        down(g64, d, n * 8);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double scale = fabs(in->a) + fabs(in->b) + fabs(c64[i]) + 1e-300;
            double e = fabs(g64[i] - c64[i]) / scale;
            worst = isnan(e) ? INFINITY : fmax(worst, e);
        }
        ok(worst <= 1e-12, "init kind %d f64 (first %llu): cuda within %.2g of cpu", (int)in->kind,
           (unsigned long long)first, worst);

        /* f32, bf16: bit for bit but for rounding boundaries between the two */
        for (int t = 0; t < 2; t++) {
            bmt_dtype_t dt = t == 0 ? BMT_F32 : BMT_BF16;
            size_t es = esize(dt);
            for (int off = 0; off < 2; off++) { /* aligned, then one element in */
                poison(d, n * 8);
                char *dd = (char *)d + (size_t)off * es;
                kern_check(kern_init(gpu, stream, dd, dt, n, first, key, in, &err), &err,
                           "kern_init");
                kern_check(kern_init(cpu, NULL, c, dt, n, first, key, in, &err), &err, "kern_init");
                down(g, dd, n * es);
                size_t boundary = 0, wrong = 0;
                for (size_t i = 0; i < n; i++) {
                    uint64_t gb = bits(g, dt, i), cb = bits(c, dt, i);
                    if (gb != round_bits(g64[i], dt))
                        wrong++;
                    else if (gb != cb) {
                        if (round_bits(c64[i], dt) != round_bits(g64[i], dt))
                            boundary++;
                        else
                            wrong++;
                    }
                }
                ok(wrong == 0 && boundary <= n / 10000,
                   "init kind %d %s%s: cuda = cpu bit for bit (%zu at rounding boundaries, %zu "
                   "wrong)",
                   (int)in->kind, bmt_dtype_name(dt), off ? " misaligned" : "", boundary, wrong);
            }
        }

        /* pieces on the device = one whole fill on the device */
        poison(d, n * 8);
        kern_check(kern_init(gpu, stream, d, BMT_F32, n, first, key, in, &err), &err, "kern_init");
        down(g, d, n * 4);
        poison(d, n * 8);
        size_t at = 0;
        while (at < n) {
            size_t len = 1 + (size_t)(rnd64() % (n / 3));
            if (len > n - at)
                len = n - at;
            kern_check(
                kern_init(gpu, stream, (float *)d + at, BMT_F32, len, first + at, key, in, &err),
                &err, "kern_init");
            at += len;
        }
        down(c, d, n * 4);
        ok(memcmp(c, g, n * 4) == 0, "init kind %d f32: pieces at arbitrary offsets = whole",
           (int)in->kind);
    }
    cudaFree(d);
    free(c64);
    free(g64);
    free(c);
    free(g);
}

/* ------------------------------------------------------------ zero, cast, accumulate */

static void check_zero(void)
{
    const size_t n = size((1u << 20) + 5);
    unsigned char *h = host(n + 64), *d = dev(n + 64);
    bmt_error_t err;
    poison(d, n + 64);
    kern_check(kern_zero(gpu, stream, d + 3, n, &err), &err, "kern_zero");
    down(h, d, n + 64);
    bool good = h[0] == 0xff && h[1] == 0xff && h[2] == 0xff && h[n + 3] == 0xff;
    for (size_t i = 3; i < n + 3; i++)
        good &= h[i] == 0;
    ok(good, "zero: exactly its %zu bytes at an odd offset", n);
    cudaFree(d);
    free(h);
}

/* ------------------------------------------------------------ stream-ordered memory */

/* bmt_alloc_async / bmt_free_async (runtime/device.c): counted while held,
 * usable in stream order, reused without growing the pool, kept by the pool
 * through synchronizations, a failure that names itself and changes nothing. */
static void check_pool(void)
{
    const size_t n = (3u << 20) + 5;
    bmt_error_t err;
    bmt_mem_stats_t st0, st;
    bmt_mem_get_stats(gpu, &st0);
    unsigned char *a = bmt_alloc_async(gpu, BMT_MEM_ACTIVATION, n, stream, &err);
    if (a == NULL)
        die("bmt_alloc_async", err.text);
    bmt_mem_get_stats(gpu, &st);
    uint64_t held;
    bmt_mem_pool_stats(gpu, &held, NULL, NULL);
    ok(st.current[BMT_MEM_ACTIVATION] == st0.current[BMT_MEM_ACTIVATION] + n &&
           st.current_total == st0.current_total + n && held == n,
       "pool: %zu bytes counted as activation and as the pool's in use while held", n);
    unsigned char *h = host(n);
    cuda_check(cudaMemsetAsync(a, 0x5a, n, stream), "cudaMemsetAsync");
    cuda_check(cudaMemcpyAsync(h, a, n, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    bool good = true;
    for (size_t i = 0; i < n; i++)
        good &= h[i] == 0x5a;
    ok(good, "pool: the memory is written and read back in stream order");
    bmt_free_async(gpu, a, stream);
    bmt_free_async(gpu, a, stream); /* not ours any more: a no-op */
    bmt_mem_get_stats(gpu, &st);
    ok(st.current_total == st0.current_total && st.peak_total >= st0.current_total + n,
       "pool: freed once (a second free is ignored): %llu bytes now, the peak kept",
       (unsigned long long)(st.current_total - st0.current_total));
    uint64_t in_use, now, high, high1;
    bmt_mem_pool_stats(gpu, &in_use, &now, &high1);
    for (int i = 0; i < 100; i++) {
        void *b = bmt_alloc_async(gpu, BMT_MEM_GRAD, n, stream, &err);
        if (b == NULL)
            die("bmt_alloc_async", err.text);
        cuda_check(cudaMemsetAsync(b, i, n, stream), "cudaMemsetAsync");
        bmt_free_async(gpu, b, stream);
    }
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    bmt_mem_pool_stats(gpu, &in_use, &now, &high);
    ok(high1 >= n && high == high1 && now == high && in_use == 0,
       "pool: 100 more allocations on one stream reuse the first's %llu reserved bytes, and the "
       "pool keeps them through a device synchronization (now %llu, at most %llu)",
       (unsigned long long)high1, (unsigned long long)now, (unsigned long long)high);
    void *c = bmt_alloc(gpu, BMT_MEM_WORKSPACE, 64, &err), *d;
    d = bmt_alloc_async(gpu, BMT_MEM_WORKSPACE, (size_t)1 << 50, stream, &err);
    bmt_mem_get_stats(gpu, &st);
    const bool named =
        d == NULL && strstr(err.text, "cudaMallocFromPoolAsync") && strstr(err.text, "workspace");
    void *e = bmt_alloc_async(gpu, BMT_MEM_WORKSPACE, 64, stream, &err);
    ok(named && st.current_total == st0.current_total + 64 && e != NULL &&
           cudaGetLastError() == cudaSuccess,
       "pool: 1 PiB fails with a message naming the call and the kind (%s), counts nothing, and "
       "the next allocation works",
       d == NULL ? err.text : "it succeeded");
    bmt_free(gpu, e); /* bmt_free of pool memory: a stream-ordered free */
    bmt_free(gpu, c);
    bmt_mem_get_stats(gpu, &st);
    ok(st.current_total == st0.current_total, "pool: bmt_free gives pool memory back too");
    free(h);
}

static void make_input(void *buf, bmt_dtype_t t, size_t n)
{
    float *f = host(n * 4);
    fill_f32_special(f, n);
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case BMT_F32: ((float *)buf)[i] = f[i]; break;
        case BMT_BF16: ((uint16_t *)buf)[i] = (uint16_t)(f2u(f[i]) >> 16); break;
        default: ((double *)buf)[i] = (double)f[i] * (1.0 + rnd_unit() * 0x1p-30); break;
        }
    }
    free(f);
}

static void check_cast(void)
{
    const size_t n = size((1u << 20) + 3);
    const bmt_dtype_t all[] = { BMT_F32, BMT_BF16, BMT_F64 };
    void *src = host(n * 8), *c = host(n * 8), *g = host(n * 8);
    char *ds = dev(n * 8 + 64), *dd = dev(n * 8 + 64);
    bmt_error_t err;
    for (int a = 0; a < 3; a++) {
        for (int b = 0; b < 3; b++) {
            bmt_dtype_t st = all[a], dt = all[b];
            for (int off = 0; off < 2; off++) {
                make_input(src, st, n);
                char *s = ds + (size_t)off * esize(st), *o = dd + (size_t)off * esize(dt);
                up(s, src, n * esize(st));
                poison(dd, n * 8 + 64);
                kern_check(kern_cast(gpu, stream, o, dt, s, st, n, &err), &err, "kern_cast");
                kern_check(kern_cast(cpu, NULL, c, dt, src, st, n, &err), &err, "kern_cast");
                down(g, o, n * esize(dt));
                bool by_class = st == BMT_F64 || dt == BMT_F64;
                size_t wrong = 0;
                for (size_t i = 0; i < n; i++) {
                    if (by_class && isnan(elem(c, dt, i)))
                        wrong += !isnan(elem(g, dt, i));
                    else
                        wrong += bits(g, dt, i) != bits(c, dt, i);
                }
                ok(wrong == 0, "cast %s -> %s%s: cuda = cpu bit for bit%s (%zu wrong)",
                   bmt_dtype_name(st), bmt_dtype_name(dt), off ? " misaligned" : "",
                   by_class ? ", NaN by class" : ", NaN payloads included", wrong);
            }
        }
    }
    cudaFree(ds);
    cudaFree(dd);
    free(src);
    free(c);
    free(g);
}

static void check_accumulate(void)
{
    const size_t n = size((1u << 20) + 7);
    float *dst = host(n * 4), *c = host(n * 4), *g = host(n * 4);
    void *src = host(n * 4);
    float *dd = dev(n * 4 + 64);
    char *ds = dev(n * 4 + 64);
    bmt_error_t err;
    for (int t = 0; t < 2; t++) {
        bmt_dtype_t st = t == 0 ? BMT_F32 : BMT_BF16;
        for (int off = 0; off < 2; off++) {
            for (size_t i = 0; i < n; i++) {
                dst[i] = rnd_float(20, 20);
                float s = rnd_float(24, 16);
                if (st == BMT_F32)
                    ((float *)src)[i] = s;
                else
                    ((uint16_t *)src)[i] = bmt_f32_to_bf16(s);
            }
            up(dd + off, dst, n * 4);
            up(ds + (size_t)off * esize(st), src, n * esize(st));
            kern_check(
                kern_accumulate(gpu, stream, dd + off, ds + (size_t)off * esize(st), st, n, &err),
                &err, "kern_accumulate");
            memcpy(c, dst, n * 4);
            kern_check(kern_accumulate(cpu, NULL, c, src, st, n, &err), &err, "kern_accumulate");
            down(g, dd + off, n * 4);
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++)
                wrong += f2u(g[i]) != f2u(c[i]);
            ok(wrong == 0, "accumulate f32 += %s%s: cuda = cpu bit for bit (%zu wrong)",
               bmt_dtype_name(st), off ? " misaligned" : "", wrong);
        }
    }
    cudaFree(dd);
    cudaFree(ds);
    free(dst);
    free(c);
    free(g);
    free(src);
}

/* ------------------------------------------------------------ sumsq */

static void check_sumsq(void)
{
    const size_t sizes[] = { 0, 1, 1000, size((1u << 20) + 7), size(50000017) };
    const size_t nmax = size(50000017);
    float *x = host(nmax * 4);
    float *dx = dev(nmax * 4 + 64);
    double *dout = dev(4 * sizeof(double));
    double cout[4], gout[4];
    bmt_error_t err;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s];
        int off = (int)(s & 1);
        for (size_t i = 0; i < n; i++)
            x[i] = rnd_float(20, 20);
        up(dx + off, x, n * 4);
        poison(dout, 4 * sizeof(double));
        kern_check(kern_sumsq(gpu, stream, dx + off, n, dout, 2, &err), &err, "kern_sumsq");
        kern_check(kern_sumsq(cpu, NULL, x, n, cout, 2, &err), &err, "kern_sumsq");
        down(gout, dout, sizeof(gout));
        /* Neumaier's compensated sum: about one rounding of the exact total */
        double t = 0, comp = 0;
        for (size_t i = 0; i < n; i++) {
            double q = (double)x[i] * x[i], u = t + q;
            comp += fabs(t) >= fabs(q) ? (t - u) + q : (q - u) + t;
            t = u;
        }
        t += comp;
        double rel = t == 0 ? fabs(gout[2]) : fabs(gout[2] - t) / t;
        double rel_cpu = t == 0 ? fabs(cout[2]) : fabs(cout[2] - t) / t;
        uint64_t p0, p3;
        memcpy(&p0, &gout[0], 8);
        memcpy(&p3, &gout[3], 8);
        ok(rel <= 1e-12 && p0 == ~0ULL && p3 == ~0ULL,
           "sumsq of %zu%s: cuda within %.2g of a compensated sum (the cpu's running sum: "
           "%.2g), only out[slot] written",
           n, off ? " (misaligned)" : "", rel, rel_cpu);
        /* the cpu adds in index order: its error bound grows with n */
        ok(rel_cpu <= 1e-12 + (double)n * 0x1p-53, "sumsq of %zu: the cpu within its bound", n);
        bool same = true;
        for (int r = 0; r < 3; r++) {
            double again;
            kern_check(kern_sumsq(gpu, stream, dx + off, n, dout, 1, &err), &err, "kern_sumsq");
            down(&again, dout + 1, 8);
            same &= memcmp(&again, &gout[2], 8) == 0;
        }
        ok(same, "sumsq of %zu: the same bits on 3 more runs", n);
    }
    size_t n = size((1u << 20) + 7);
    float bad[2] = { NAN, INFINITY };
    const char *what[2] = { "NaN", "inf" };
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n; i++)
            x[i] = rnd_float(20, 20);
        x[n / 3] = bad[k];
        up(dx, x, n * 4);
        kern_check(kern_sumsq(gpu, stream, dx, n, dout, 0, &err), &err, "kern_sumsq");
        down(gout, dout, 8);
        ok(k == 0 ? isnan(gout[0]) : (isinf(gout[0]) && gout[0] > 0),
           "sumsq with one %s element gives %s", what[k], k == 0 ? "NaN" : "+inf");
    }
    cudaFree(dx);
    cudaFree(dout);
    free(x);
}

/* ------------------------------------------------------------ adamw */

static void check_adamw(void)
{
    const size_t n = size((1u << 20) + 5);
    const int steps = 10;
    float *p0 = host(n * 4), *grad = host(n * 4);
    float *cm = host(n * 4), *cmm = host(n * 4), *cv = host(n * 4), *cp = host(n * 4);
    float *gm = host(n * 4), *gmm = host(n * 4), *gv = host(n * 4), *gp = host(n * 4);
    float *dm = dev(n * 4 + 64), *dmm = dev(n * 4 + 64), *dv = dev(n * 4 + 64),
          *dg = dev(n * 4 + 64), *dp = dev(n * 4 + 64);
    bmt_error_t err;
    for (int mode = 0; mode < 3; mode++) { /* f32 param, param == master, bf16 param */
        bmt_dtype_t pt = mode == 2 ? BMT_BF16 : BMT_F32;
        for (int off = 0; off < 2; off++) {
            for (size_t i = 0; i < n; i++)
                p0[i] = (float)(rnd_unit() * 4 - 2);
            memcpy(cm, p0, n * 4);
            memset(cmm, 0, n * 4);
            memset(cv, 0, n * 4);
            up(dm + off, p0, n * 4);
            up(dmm + off, cmm, n * 4);
            up(dv + off, cv, n * 4);
            float wd = off ? 0.0f : 0.1f;
            size_t param_wrong = 0;
            for (int t = 1; t <= steps; t++) {
                for (size_t i = 0; i < n; i++)
                    grad[i] = rnd_float(8, 3);
                up(dg + off, grad, n * 4);
                kern_adamw_args_t a = { 1e-2f,
                                        0.9f,
                                        0.999f,
                                        1e-8f,
                                        wd,
                                        0.5f,
                                        (float)(1 - pow(0.9, t)),
                                        (float)(1 - pow(0.999, t)),
                                        (float)(1.0 - 0.9),
                                        (float)(1.0 - 0.999) };
                void *gparam =
                    mode == 1 ? (void *)(dm + off) : (void *)((char *)dp + (size_t)off * esize(pt));
                void *cparam = mode == 1 ? (void *)cm : (void *)cp;
                if (mode != 1)
                    poison(dp, n * 4 + 64);
                kern_check(kern_adamw(gpu, stream, dm + off, dmm + off, dv + off, dg + off, gparam,
                                      pt, n, &a, &err),
                           &err, "kern_adamw");
                kern_check(kern_adamw(cpu, NULL, cm, cmm, cv, grad, cparam, pt, n, &a, &err), &err,
                           "kern_adamw");
                if (mode != 1) {
                    down(gp, gparam, n * esize(pt));
                    for (size_t i = 0; i < n; i++)
                        param_wrong += bits(gp, pt, i) != bits(cp, pt, i);
                }
            }
            down(gm, dm + off, n * 4);
            down(gmm, dmm + off, n * 4);
            down(gv, dv + off, n * 4);
            double e = 0;
            size_t differ = 0;
            for (size_t i = 0; i < n; i++) {
                double d1 = fabs(gm[i] - cm[i]) / fmax(1.0, fabs(cm[i]));
                double d2 = fabs(gmm[i] - cmm[i]) / fmax(1e-3, fabs(cmm[i]));
                double d3 = fabs(gv[i] - cv[i]) / fmax(1e-6, fabs(cv[i]));
                double w = fmax(d1, fmax(d2, d3));
                e = isnan(w) ? INFINITY : fmax(e, w);
                differ += f2u(gm[i]) != f2u(cm[i]) || f2u(gmm[i]) != f2u(cmm[i]) ||
                          f2u(gv[i]) != f2u(cv[i]);
            }
            const char *mname[3] = { "f32 param", "param == master", "bf16 param" };
            ok(e <= 1e-6,
               "adamw %s%s, wd %g, 10 steps: cuda within %.2g of cpu (%zu of %zu differ)",
               mname[mode], off ? " misaligned" : "", (double)wd, e, differ, n);
            if (mode != 1)
                ok(param_wrong == 0,
                   "adamw %s%s: the param is the cpu's after every step (%zu differ)", mname[mode],
                   off ? " misaligned" : "", param_wrong);
        }
    }
    cudaFree(dm);
    cudaFree(dmm);
    cudaFree(dv);
    cudaFree(dg);
    cudaFree(dp);
    free(p0);
    free(grad);
    free(cm);
    free(cmm);
    free(cv);
    free(cp);
    free(gm);
    free(gmm);
    free(gv);
    free(gp);
}

/* AdamW on a split master (master_only 2): cuda against cpu over 10 steps,
 * bit for bit in hi, lo, m and v, aligned and misaligned; hi starts as a bf16
 * shard and lo at zero, as bmt_adamw_create makes them. */
static void check_adamw_split(void)
{
    const size_t n = size((1u << 20) + 5);
    const int steps = 10;
    uint16_t *ch = host(n * 2), *cl = host(n * 2), *gh = host(n * 2), *gl = host(n * 2);
    float *cm = host(n * 4), *cv = host(n * 4), *gm = host(n * 4), *gv = host(n * 4),
          *grad = host(n * 4);
    uint16_t *dh = dev(n * 2 + 64), *dl = dev(n * 2 + 64);
    float *dm = dev(n * 4 + 64), *dv = dev(n * 4 + 64), *dg = dev(n * 4 + 64);
    bmt_error_t err;
    for (int off = 0; off < 2; off++) {
        for (size_t i = 0; i < n; i++)
            ch[i] = bmt_f32_to_bf16((float)(rnd_unit() * 4 - 2));
        memset(cl, 0, n * 2);
        memset(cm, 0, n * 4);
        memset(cv, 0, n * 4);
        up(dh + off, ch, n * 2);
        up(dl + off, cl, n * 2);
        up(dm + off, cm, n * 4);
        up(dv + off, cv, n * 4);
        for (int t = 1; t <= steps; t++) {
            for (size_t i = 0; i < n; i++)
                grad[i] = rnd_float(8, 3);
            up(dg + off, grad, n * 4);
            kern_adamw_args_t a = { 1e-2f,
                                    0.9f,
                                    0.999f,
                                    1e-8f,
                                    t % 2 ? 0.1f : 0.0f,
                                    0.5f,
                                    (float)(1 - pow(0.9, t)),
                                    (float)(1 - pow(0.999, t)),
                                    (float)(1.0 - 0.9),
                                    (float)(1.0 - 0.999) };
            kern_check(kern_adamw_split(gpu, stream, dh + off, dl + off, dm + off, dv + off,
                                        dg + off, n, &a, &err),
                       &err, "kern_adamw_split");
            kern_check(kern_adamw_split(cpu, NULL, ch, cl, cm, cv, grad, n, &a, &err), &err,
                       "kern_adamw_split");
        }
        down(gh, dh + off, n * 2);
        down(gl, dl + off, n * 2);
        down(gm, dm + off, n * 4);
        down(gv, dv + off, n * 4);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += gh[i] != ch[i] || gl[i] != cl[i] || f2u(gm[i]) != f2u(cm[i]) ||
                      f2u(gv[i]) != f2u(cv[i]);
        ok(differ == 0,
           "adamw split master%s, 10 steps: cuda's hi, lo, m and v are the cpu's bit "
           "for bit (%zu of %zu differ)",
           off ? " misaligned" : "", differ, n);
    }
    cudaFree(dh);
    cudaFree(dl);
    cudaFree(dm);
    cudaFree(dv);
    cudaFree(dg);
    free(ch), free(cl), free(gh), free(gl), free(cm), free(cv), free(gm), free(gv), free(grad);
}

/* ------------------------------------------------------------ throughput */

static void throughput(void)
{
    const size_t n = (size_t)1 << 26;
    float *a = dev(n * 4), *b = dev(n * 4), *m = dev(n * 4), *v = dev(n * 4);
    uint16_t *h = dev(n * 2);
    double *out = dev(8);
    bmt_error_t err;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    uint32_t key[2];
    kern_init_key(1, "bench", key);
    bmt_init_t nr = BMT_INIT_NORMAL_V(0, 1), tn = BMT_INIT_TRUNC_NORMAL_V(0, 1);
    kern_adamw_args_t aa = { 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 0.1f, 0.001f, 0.1f, 0.001f };
    kern_zero(gpu, stream, m, n * 4, &err);
    kern_zero(gpu, stream, v, n * 4, &err);
    kern_init(gpu, stream, b, BMT_F32, n, 0, key, &nr, &err);
    uint16_t *lo = dev(n * 2);
    kern_zero(gpu, stream, lo, n * 2, &err);
    for (int k = 0; k < 7; k++) {
        static const char *names[] = {
            "init normal f32", "init trunc normal bf16", "cast f32 -> bf16",  "accumulate bf16",
            "sumsq",           "adamw bf16 param",       "adamw split master"
        };
        static const double bytes_per[] = { 4, 2, 6, 10, 4, 30, 28 };
        int rc = 0;
        float ms = 0;
        for (int rep = 0; rep < 2; rep++) { /* the first is a warm-up */
            cudaEventRecord(e0, stream);
            switch (k) {
            case 0: rc = kern_init(gpu, stream, a, BMT_F32, n, 0, key, &nr, &err); break;
            case 1: rc = kern_init(gpu, stream, h, BMT_BF16, n, 0, key, &tn, &err); break;
            case 2: rc = kern_cast(gpu, stream, h, BMT_BF16, a, BMT_F32, n, &err); break;
            case 3: rc = kern_accumulate(gpu, stream, a, h, BMT_BF16, n, &err); break;
            case 4: rc = kern_sumsq(gpu, stream, a, n, out, 0, &err); break;
            case 5: rc = kern_adamw(gpu, stream, a, m, v, b, h, BMT_BF16, n, &aa, &err); break;
            default: rc = kern_adamw_split(gpu, stream, h, lo, m, v, b, n, &aa, &err); break;
            }
            cudaEventRecord(e1, stream);
            cuda_check(cudaEventSynchronize(e1), "cudaEventSynchronize");
            cudaEventElapsedTime(&ms, e0, e1);
        }
        kern_check(rc, &err, names[k]);
        printf("# %-24s %2.0fM elements: %7.3f ms, %6.1f GB/s\n", names[k], (double)n / 1e6,
               (double)ms, bytes_per[k] * (double)n / ((double)ms * 1e6));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(m);
    cudaFree(v);
    cudaFree(h);
    cudaFree(lo);
    cudaFree(out);
}

int main(int argc, char **argv)
{
    quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    cpu = calloc(1, sizeof(*cpu));
    gpu = calloc(1, sizeof(*gpu));
    if (cpu == NULL || gpu == NULL)
        die("calloc", "out of memory");
    cpu->device = BMT_DEVICE_CPU;
    cpu->device_index = -1;
    gpu->device = BMT_DEVICE_CUDA;
    gpu->device_index = 0;
    cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("# device 0: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);

    check_init();
    check_zero();
    check_pool();
    check_cast();
    check_accumulate();
    check_sumsq();
    check_adamw();
    check_adamw_split();
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    ok(cudaGetLastError() == cudaSuccess, "no asynchronous cuda error");
    if (!quick)
        throughput();

    cudaStreamDestroy(stream);
    free(cpu);
    free(gpu);
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
#endif
