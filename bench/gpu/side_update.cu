/* bench/gpu/side_update.cu — can the optimizer's update run on a few SMs of
 * its own while the forward's products run on the rest?
 *
 * A bf16 step leaves the update (AdamW on f32 masters and states, the bf16
 * copy written: 30 bytes a parameter, memory-bound) in the compute stream's
 * gaps: ~11 ms of a d48 step and ~10 ms of a Llama 1B step with nothing else
 * running (bench/NOTES.md, sessions 19 and 20). The products take every SM's
 * registers and shared memory, so the update cannot share an SM with them;
 * the question here is whether it can have k SMs to itself (k blocks that
 * each fill an SM's shared memory, so one an SM, at the stream's highest
 * priority) while the products are planned for the other SMs
 * (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), and how much of it then hides.
 *
 * The model: L layers of d48's forward products (tokens 8192, C 1600: qkv,
 * attention projection, fc, projection) or Llama 1B's (T 4096 x B 2, C 2048,
 * 8 KV heads of 64, FFN 8192: qkv, o, gate+up, down), and the update of each
 * layer's parameters (AdamW, f32 master, m, v and gradient, bf16 copy: the
 * engine's kernel's traffic). Printed, in ms:
 *   products alone on every SM; products planned for S - k SMs;
 *   the update alone on the full grid (main's); on k SMs;
 *   both at once, the update on k SMs (k per row), each layer's products
 *   waiting for that layer's update (the forward's order), and without the wait.
 * Build and run (on the GPU machine; sm_90a for the bulk copies):
 *   make build/bench/side_update && build/bench/side_update [d48|1b] [LAYERS] [ldg|tma|tma2]
 * ldg: the update's k blocks of 1024 threads with plain loads and stores;
 * tma: its loads on the TMA unit (cp.async.bulk into six shared-memory stages);
 * tma2: its loads and stores on the TMA unit. Before timing, each checks that
 * its bf16 copies are bit for bit those of main's grid. The thirtieth
 * session's figures and what they mean are in bench/NOTES.md.
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels_cuda.h" /* the engine's AdamW: element function and launcher */

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define LK(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cublas %d\n", __FILE__, __LINE__, (int)s_);                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef kern_adamw_scalars_t scal;

/* One float4 of each through the engine's element function
 * (runtime/cuda/kernels_cuda.h): the update in place, the bf16 copy returned. */
__device__ __forceinline__ uint2 upd4(float4 &pp, float4 &mm, float4 &vv, float4 gg, const scal &s)
{
    kern_adamw_elem(&pp.x, &mm.x, &vv.x, gg.x, &s);
    kern_adamw_elem(&pp.y, &mm.y, &vv.y, gg.y, &s);
    kern_adamw_elem(&pp.z, &mm.z, &vv.z, gg.z, &s);
    kern_adamw_elem(&pp.w, &mm.w, &vv.w, gg.w, &s);
    __nv_bfloat162 a = __floats2bfloat162_rn(pp.x, pp.y), b = __floats2bfloat162_rn(pp.z, pp.w);
    return make_uint2(*(unsigned *)&a, *(unsigned *)&b);
}

/* The engine's AdamW (kern_cuda_adamw, runtime/cuda/kernels.cu) on its own
 * grid is "main's grid" below; this is the same update with more loads in
 * flight a thread (two rows of four), for a grid of few blocks. */
__global__ void adamw2(float4 *p, float4 *m, float4 *v, const float4 *g, uint2 *out, size_t n4,
                       scal s)
{
    extern __shared__ char pin[]; /* only to hold one block an SM */
    (void)pin;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {
        float4 pp[2], mm[2], vv[2], gg[2];
#pragma unroll
        for (int u = 0; u < 2; u++)
            pp[u] = p[i + u * stride], mm[u] = m[i + u * stride], vv[u] = v[i + u * stride],
            gg[u] = g[i + u * stride];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const size_t j = i + u * stride;
            out[j] = upd4(pp[u], mm[u], vv[u], gg[u], s);
            p[j] = pp[u], m[j] = mm[u], v[j] = vv[u];
        }
    }
    for (; i < n4; i += stride) {
        float4 pp = p[i], mm = m[i], vv = v[i];
        out[i] = upd4(pp, mm, vv, g[i], s);
        p[i] = pp, m[i] = mm, v[i] = vv;
    }
}

/* The same on the TMA unit: each block (one an SM) streams chunks of CH
 * elements of the four f32 inputs into NS shared-memory stages with 1-D bulk
 * copies (cp.async.bulk, completion on an mbarrier), so that an SM's loads in
 * flight are bounded by its shared memory, not by its threads' registers.
 * STORES: the writes on the TMA unit too; the results go back into the stage
 * (the bf16 copy into a staging row of its own) and leave by bulk stores, and
 * a stage is refilled one iteration later, once its stores have read it. */
constexpr int CH = 2048, NS = 6, TT = 512;
__device__ __forceinline__ unsigned saddr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

template <bool STORES>
__global__ void __launch_bounds__(TT)
    adamw_tma(float *P, float *M, float *V, const float *G, uint16_t *O, size_t n, scal s)
{
    extern __shared__ __align__(128) float sm[]; /* NS stages of 4 x CH f32 [, NS x CH bf16] */
    __shared__ __align__(8) unsigned long long bar[NS];
    uint16_t *so = (uint16_t *)(sm + NS * 4 * CH);
    const size_t nch = (n + CH - 1) / CH;
    if (threadIdx.x == 0) {
        for (int i = 0; i < NS; i++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar[i])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](size_t c, int st) {
        const size_t first = c * CH;
        const unsigned bytes = 4u * (unsigned)(n - first < (size_t)CH ? n - first : CH);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile(
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&bar[st])),
            "r"(4 * bytes)
            : "memory");
        const float *src[4] = { P + first, M + first, V + first, G + first };
        for (int a = 0; a < 4; a++)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], "
                         "[%1], %2, [%3];" ::"r"(saddr(sm + (st * 4 + a) * CH)),
                         "l"(src[a]), "r"(bytes), "r"(saddr(&bar[st]))
                         : "memory");
    };
    if (threadIdx.x == 0)
        for (int i = 0; i < NS && blockIdx.x + (size_t)i * gridDim.x < nch; i++)
            issue(blockIdx.x + (size_t)i * gridDim.x, i);
    unsigned phase = 0;
    int it = 0;
    for (size_t c = blockIdx.x; c < nch; c += gridDim.x, it++) {
        const int st = it % NS;
        if (it > 0 && st == 0)
            phase ^= 1;
        unsigned done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                         "selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(saddr(&bar[st])), "r"(phase)
                         : "memory");
        const size_t first = c * CH;
        const int cnt = (int)(n - first < (size_t)CH ? n - first : CH);
        float *sp = sm + (st * 4) * CH, *smm = sp + CH, *sv = smm + CH, *sg = sv + CH;
        uint16_t *sob = so + st * CH;
        for (int j = threadIdx.x * 4; j < cnt; j += TT * 4) {
            float4 pp = *(float4 *)(sp + j), mm = *(float4 *)(smm + j), vv = *(float4 *)(sv + j);
            const uint2 h = upd4(pp, mm, vv, *(float4 *)(sg + j), s);
            float *dp = STORES ? sp : P + first, *dm = STORES ? smm : M + first,
                  *dv = STORES ? sv : V + first;
            *(float4 *)(dp + j) = pp;
            *(float4 *)(dm + j) = mm;
            *(float4 *)(dv + j) = vv;
            *(uint2 *)((STORES ? sob : O + first) + j) = h;
        }
        if (!STORES) {
            __syncthreads(); /* the stage is read: it may be refilled */
            const size_t next = c + (size_t)NS * gridDim.x;
            if (threadIdx.x == 0 && next < nch)
                issue(next, st);
            continue;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            float *dst[3] = { P + first, M + first, V + first };
            for (int a = 0; a < 3; a++)
                asm volatile(
                    "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst[a]),
                    "r"(saddr(sm + (st * 4 + a) * CH)), "r"(cnt * 4)
                    : "memory");
            asm volatile(
                "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(O + first),
                "r"(saddr(sob)), "r"(cnt * 2)
                : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            if (it > 0) { /* the previous stage's stores have read it: refill */
                const size_t next = c - gridDim.x + (size_t)NS * gridDim.x;
                if (next < nch)
                    issue(next, (it - 1) % NS);
            }
        }
    }
    if (STORES && threadIdx.x == 0)
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct prod {
    int m, n, k;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = 32u << 20;
static __nv_bfloat16 *bufA, *bufB, *bufD;

static float time_prod(prod *p, cublasLtMatmulAlgo_t *a, cudaStream_t st)
{
    const float one = 1, zero = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 2; i++)
        if (cublasLtMatmul(lt, p->d, &one, bufA, p->la, bufB, p->lb, &zero, bufD, p->lc, bufD,
                           p->lc, a, ws, WS, st) != CUBLAS_STATUS_SUCCESS)
            return 1e30f;
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 5; i++)
        LK(cublasLtMatmul(lt, p->d, &one, bufA, p->la, bufB, p->lb, &zero, bufD, p->lc, bufD, p->lc,
                          a, ws, WS, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms / 5;
}

/* D (m, n) = A^T (k, m)^T B (k, n): the trainers' forward layout (weights
 * transposed, activations column-major). sms > 0: planned for that many SMs.
 * The fastest of the heuristic's first 8 algorithms, as the trainers tune. */
static void prod_make(prod *p, int m, int n, int k, int sms, cudaStream_t st)
{
    p->m = m, p->n = n, p->k = k;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LK(cublasLtMatmulDescCreate(&p->d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LK(cublasLtMatmulDescSetAttribute(p->d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LK(cublasLtMatmulDescSetAttribute(p->d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (sms > 0) {
        int32_t t = sms;
        LK(cublasLtMatmulDescSetAttribute(p->d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &t,
                                          sizeof(t)));
    }
    LK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, k, m, k));
    LK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, k, n, k));
    LK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, m, n, m));
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
                                            sizeof(WS)));
    cublasLtMatmulHeuristicResult_t h[8];
    int found = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, p->d, p->la, p->lb, p->lc, p->lc, pref, 8, h, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1) {
        fprintf(stderr, "no algorithm for %d %d %d\n", m, n, k);
        exit(1);
    }
    float best = 1e30f;
    for (int i = 0; i < found; i++) {
        float t = time_prod(p, &h[i].algo, st);
        if (t < best)
            best = t, p->algo = h[i].algo;
    }
}

struct model {
    const char *name;
    int tokens, c;
    int nprod;
    int pm[4], pk[4]; /* each product: out features, in features */
    size_t layer_params;
};

int main(int argc, char **argv)
{
    static const char usage[] =
        "usage: side_update [d48|1b] [LAYERS 1-256, default 16] [ldg|tma|tma2, default ldg]\n";
    if (argc > 4) {
        fprintf(stderr, "side_update: at most three arguments\n%s", usage);
        return 2;
    }
    const char *which = argc > 1 ? argv[1] : "d48";
    model md;
    if (!strcmp(which, "d48")) {
        md = { "d48",
               8192,
               1600,
               4,
               { 4800, 1600, 6400, 1600 },
               { 1600, 1600, 1600, 6400 },
               12ull * 1600 * 1600 + 13 * 1600 };
    } else if (!strcmp(which, "1b")) {
        md = { "llama 1B",
               8192,
               2048,
               4,
               { 3072, 2048, 16384, 2048 },
               { 2048, 2048, 2048, 8192 },
               (size_t)2048 * 3072 + 2048ull * 2048 + 3ull * 2048 * 8192 + 2 * 2048 };
    } else {
        fprintf(stderr, "side_update: the model is d48 or 1b, not '%s'\n%s", which, usage);
        return 2;
    }
    int L = 16;
    if (argc > 2) {
        char *end = NULL;
        long l = strtol(argv[2], &end, 10);
        if (end == argv[2] || *end != '\0' || l < 1 || l > 256) {
            fprintf(stderr, "side_update: LAYERS is a whole number from 1 to 256, not '%s'\n%s",
                    argv[2], usage);
            return 2;
        }
        L = (int)l;
    }
    int use_tma = 0;
    if (argc > 3) {
        if (!strcmp(argv[3], "tma"))
            use_tma = 1;
        else if (!strcmp(argv[3], "tma2"))
            use_tma = 2;
        else if (strcmp(argv[3], "ldg") != 0) {
            fprintf(stderr, "side_update: the update's kernel is ldg, tma or tma2, not '%s'\n%s",
                    argv[3], usage);
            return 2;
        }
    }
    int dev = 0, S = 0, plo = 0, phi = 0;
    int ndev = 0;
    cudaError_t de = cudaGetDeviceCount(&ndev);
    if (de != cudaSuccess || ndev < 1) {
        fprintf(stderr, "side_update: no CUDA device here (%s): run it on the GPU machine\n",
                de != cudaSuccess ? cudaGetErrorString(de) : "none found");
        return 3;
    }
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&S, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetStreamPriorityRange(&plo, &phi));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf(
        "device %s, %d SMs; model %s, %d layers, %zu parameters a layer; the update on k SMs: %s\n",
        prop.name, S, md.name, L, md.layer_params,
        use_tma == 2 ? "TMA bulk loads and stores"
        : use_tma    ? "TMA bulk loads"
                     : "plain loads");

    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, WS));
    size_t maxA = 0, maxB = 0, maxD = 0;
    for (int i = 0; i < md.nprod; i++) {
        size_t a = (size_t)md.pm[i] * md.pk[i], b = (size_t)md.pk[i] * md.tokens,
               d = (size_t)md.pm[i] * md.tokens;
        maxA = a > maxA ? a : maxA, maxB = b > maxB ? b : maxB, maxD = d > maxD ? d : maxD;
    }
    CK(cudaMalloc(&bufA, maxA * 2));
    CK(cudaMalloc(&bufB, maxB * 2));
    CK(cudaMalloc(&bufD, maxD * 2));
    CK(cudaMemset(bufA, 0x3c, maxA * 2)); /* bf16 ~0.01 */
    CK(cudaMemset(bufB, 0x3c, maxB * 2));

    const size_t n4 = (md.layer_params + 3) / 4, np = n4 * 4;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const size_t need = (size_t)L * np * 18; /* f32 master, m, v, gradient; bf16 copy */
    if (need + (1ull << 30) > free_b) {
        fprintf(stderr,
                "side_update: %d layers' states take %.1f GiB, %.1f "
                "GiB of the device's memory is free: ask for fewer layers\n",
                L, need / 1073741824.0, free_b / 1073741824.0);
        return 2;
    }
    float *P, *M, *V, *G;
    uint16_t *O;
    CK(cudaMalloc(&P, (size_t)L * np * 4));
    CK(cudaMalloc(&M, (size_t)L * np * 4));
    CK(cudaMalloc(&V, (size_t)L * np * 4));
    CK(cudaMalloc(&G, (size_t)L * np * 4));
    CK(cudaMalloc(&O, (size_t)L * np * 2));
    CK(cudaMemset(P, 0, (size_t)L * np * 4));
    CK(cudaMemset(M, 0, (size_t)L * np * 4));
    CK(cudaMemset(V, 0, (size_t)L * np * 4));
    CK(cudaMemset(G, 0, (size_t)L * np * 4));
    /* lr 3e-4, betas 0.9 and 0.95, eps 1e-8, weight decay 0.1, both bias
     * corrections 0.5, as runtime/kernels.c derives them */
    const scal sc = { 1.0f,         0.9f,       0.1f, 0.95f, 0.05f, 1e-8f, 1.0f - 3e-4f * 0.1f,
                      3e-4f / 0.5f, sqrtf(0.5f) };

    cudaStream_t cs, us;
    CK(cudaStreamCreateWithPriority(&cs, cudaStreamNonBlocking, plo));
    CK(cudaStreamCreateWithPriority(&us, cudaStreamNonBlocking, phi));
    const int pin_smem = 120 * 1024; /* > half an SM's: one block an SM */
    CK(cudaFuncSetAttribute(adamw2, cudaFuncAttributeMaxDynamicSharedMemorySize, pin_smem));
    const int tma_smem = NS * 4 * CH * 4;
    CK(cudaFuncSetAttribute(adamw_tma<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            tma_smem));
    const int tma2_smem = NS * 4 * CH * 4 + NS * CH * 2;
    CK(cudaFuncSetAttribute(adamw_tma<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            tma2_smem));
    cudaEvent_t ev[256], t0, t1, t2;
    for (int i = 0; i < L && i < 256; i++)
        CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaEventCreate(&t2));

    /* k = 0: main's grid (the engine's launcher, kern_cuda_adamw). */
    auto upd = [&](int layer, int k) {
        size_t o = (size_t)layer * np;
        if (k == 0) {
            CK(kern_cuda_adamw(us, P + o, M + o, V + o, G + o, O + o, BMT_BF16, np, &sc));
        } else if (use_tma == 2) {
            adamw_tma<true><<<k, TT, tma2_smem, us>>>(P + o, M + o, V + o, G + o, O + o, np, sc);
        } else if (use_tma) {
            adamw_tma<false><<<k, TT, tma_smem, us>>>(P + o, M + o, V + o, G + o, O + o, np, sc);
        } else {
            adamw2<<<k, 1024, pin_smem, us>>>((float4 *)(P + o), (float4 *)(M + o),
                                              (float4 *)(V + o), (const float4 *)(G + o),
                                              (uint2 *)(O + o), n4, sc);
        }
        CK(cudaGetLastError());
    };
    auto prods = [&](prod *pl, int layer) {
        const float one = 1, zero = 0;
        (void)layer;
        for (int i = 0; i < md.nprod; i++)
            LK(cublasLtMatmul(lt, pl[i].d, &one, bufA, pl[i].la, bufB, pl[i].lb, &zero, bufD,
                              pl[i].lc, bufD, pl[i].lc, &pl[i].algo, ws, WS, cs));
    };
    /* mode 0: products alone; 1: update alone; 2: both, layer i's products
     * after layer i's update; 3: both, no waits. Returns ms (median of 3). */
    auto run = [&](prod *pl, int k, int mode) {
        float best[3];
        for (int rep = 0; rep < 3; rep++) {
            CK(cudaDeviceSynchronize());
            CK(cudaEventRecord(t0, cs));
            CK(cudaStreamWaitEvent(us, t0, 0));
            for (int l = 0; l < L; l++) {
                if (mode != 0) {
                    upd(l, k);
                    CK(cudaEventRecord(ev[l], us));
                }
                if (mode == 2)
                    CK(cudaStreamWaitEvent(cs, ev[l], 0));
                if (mode != 1)
                    prods(pl, l);
            }
            CK(cudaEventRecord(t2, us));
            CK(cudaStreamWaitEvent(cs, t2, 0));
            CK(cudaEventRecord(t1, cs));
            CK(cudaEventSynchronize(t1));
            CK(cudaEventElapsedTime(&best[rep], t0, t1));
        }
        float a = best[0], b = best[1], c = best[2], t;
        if (a > b)
            t = a, a = b, b = t;
        if (b > c)
            t = b, b = c, c = t;
        if (a > b)
            t = a, a = b, b = t;
        return b;
    };

    { /* the k-SM kernel writes what main's grid writes (the same element function) */
        const size_t bytes = (size_t)L * np * 2;
        uint16_t *h0 = (uint16_t *)malloc(bytes), *h1 = (uint16_t *)malloc(bytes);
        for (int pass = 0; pass < 2; pass++) {
            CK(cudaMemset(P, 0x3f, (size_t)L * np * 4));
            CK(cudaMemset(M, 0, (size_t)L * np * 4));
            CK(cudaMemset(V, 0, (size_t)L * np * 4));
            CK(cudaMemset(G, 0x3c, (size_t)L * np * 4));
            CK(cudaMemset(O, 0, bytes));
            CK(cudaDeviceSynchronize());
            for (int l = 0; l < L; l++)
                upd(l, pass == 0 ? 0 : 12);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(pass == 0 ? h0 : h1, O, bytes, cudaMemcpyDeviceToHost));
        }
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)L * np; i++)
            bad += h0[i] != h1[i] || h0[i] == 0;
        printf("check: the k-SM update's bf16 copy against main's grid: %zu of %zu differ or "
               "unwritten\n",
               bad, (size_t)L * np);
        free(h0), free(h1);
        if (bad)
            return 1;
    }
    prod full[4];
    for (int i = 0; i < md.nprod; i++)
        prod_make(&full[i], md.pm[i], md.tokens, md.pk[i], 0, cs);
    double flops = 0;
    for (int i = 0; i < md.nprod; i++)
        flops += 2.0 * md.pm[i] * md.tokens * md.pk[i];
    flops *= L;
    const double ubytes = 30.0 * md.layer_params * L;
    const float p_all = run(full, 0, 0), u_all = run(full, 0, 1), both_all = run(full, 0, 2);
    printf("products alone, every SM:        %8.3f ms (%.0f TFLOP/s)\n", p_all,
           flops / p_all / 1e9);
    printf("update alone, main's grid:       %8.3f ms (%.2f TB/s)\n", u_all, ubytes / u_all / 1e9);
    printf("both, main's grid, in order:     %8.3f ms (sum of the two %.3f)\n", both_all,
           p_all + u_all);
    printf("\n%4s | %9s %7s | %9s %7s | %9s %9s | %s\n", "k", "prod S-k", "TFLOP/s", "upd k SMs",
           "TB/s", "both ord", "both free", "gain of 'both ord' against products + update alone");
    const int ks[] = { 4, 8, 12, 16, 20, 24, 32 };
    for (int ki = 0; ki < (int)(sizeof(ks) / sizeof(ks[0])); ki++) {
        const int k = ks[ki];
        prod part[4];
        for (int i = 0; i < md.nprod; i++)
            prod_make(&part[i], md.pm[i], md.tokens, md.pk[i], S - k, cs);
        const float pk = run(part, k, 0), uk = run(part, k, 1), bo = run(part, k, 2),
                    bf = run(part, k, 3);
        printf("%4d | %9.3f %7.0f | %9.3f %7.2f | %9.3f %9.3f | %+.3f ms\n", k, pk,
               flops / pk / 1e9, uk, ubytes / uk / 1e9, bo, bf, bo - (p_all + u_all));
        fflush(stdout);
        for (int i = 0; i < md.nprod; i++) {
            cublasLtMatmulDescDestroy(part[i].d);
            cublasLtMatrixLayoutDestroy(part[i].la);
            cublasLtMatrixLayoutDestroy(part[i].lb);
            cublasLtMatrixLayoutDestroy(part[i].lc);
        }
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
