/* bench/comm.c — bus bandwidth of bmt's collectives next to a peer, in one run.
 *
 *   bmlaunch -n 2 -- build/bench/comm [--comm world|group|replica] [--min BYTES]
 *                                     [--max BYTES] [--dtype f32|bf16] [--csv FILE]
 *
 * For all_gather, reduce_scatter and all_reduce from --min to --max (x4 steps)
 * it times bmt's call and a peer on the same buffers and prints both with their
 * ratio:
 *   shm (CPU):  the peer is memcpy of the same number of bytes, run by every
 *               rank at once (the memory system is what shm is bounded by);
 *   nccl (GPU): the peer is a direct NCCL call on a communicator of the same
 *               ranks made by this program, with the same completion semantics
 *               (the host waits for each call, as bmt's call does).
 * Definitions are nccl-tests': algbw = bytes / time, with bytes the whole array
 * (count * size elements for all_gather and reduce_scatter); busbw = algbw *
 * (n-1)/n for all_gather and reduce_scatter, * 2(n-1)/n for all_reduce. Times
 * are the slowest rank's mean over the iterations. Not a test: it asserts
 * nothing and belongs on a quiet machine.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bmt/bmt.h"

#ifdef BMT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

static bmt_ctx_t *ctx;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench/comm: rank %d: %s: %s\n", ctx ? bmt_rank(ctx) : -1, what, why);
    exit(1);
}

static size_t parse_bytes(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'K')
        v <<= 10;
    else if (*end == 'M')
        v <<= 20;
    else if (*end == 'G')
        v <<= 30;
    else if (*end != '\0')
        die("size", s);
    return (size_t)v;
}

/* The slowest rank's value (all ranks get it). */
static double max_over(bmt_comm_t *world, double v)
{
    bmt_error_t err;
    double *d = bmt_mem_alloc(ctx, sizeof(double), &err);
    if (d == NULL || bmt_mem_upload(ctx, d, &v, sizeof(v), &err) < 0 ||
        bmt_all_reduce(world, d, d, 1, BMT_F64, BMT_MAX, &err) < 0 ||
        bmt_mem_download(ctx, &v, d, sizeof(v), &err) < 0)
        die("all_reduce(max)", err.text);
    bmt_mem_free(ctx, d);
    return v;
}

enum {
    OP_AG,
    OP_RS,
    OP_AR,
    OP_COUNT
};
static const char *op_names[] = { "all_gather", "reduce_scatter", "all_reduce" };

static int run_bmt(int op, bmt_comm_t *c, void *send, void *recv, size_t count, bmt_dtype_t t,
                   bmt_error_t *err)
{
    switch (op) {
    case OP_AG: return bmt_all_gather(c, send, recv, count, t, err);
    case OP_RS: return bmt_reduce_scatter(c, send, recv, count, t, BMT_SUM, err);
    default: return bmt_all_reduce(c, send, recv, count, t, BMT_SUM, err);
    }
}

#ifdef BMT_HAVE_NCCL
static ncclComm_t peer_comm;
static bool peer_nonblocking, peer_poll;
static cudaStream_t peer_stream;

static void peer_nccl_init(bmt_comm_t *c)
{
    /* The peer's own communicator over the same ranks: rank 0 of c makes the id;
     * it travels over PMIx to every rank of the job. */
    int n = bmt_world_size(ctx);
    ncclUniqueId *ids = calloc((size_t)n, sizeof(ncclUniqueId));
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (bmt_comm_rank(c) == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        die("ncclGetUniqueId", "failed");
    bmt_error_t err;
    if (bmt_oob_allgather(ctx, &id, sizeof(id), ids, &err) < 0)
        die("oob", err.text);
    id = ids[bmt_comm_member(c, 0)];
    free(ids);
    /* BENCH_PEER=nonblocking makes the peer's communicator non-blocking like
     * bmt's (and BENCH_PEER=nonblocking-poll also waits the way bmt does), to
     * tell the cost of the mode from the cost of bmt's layer. */
    const char *mode = getenv("BENCH_PEER");
    peer_nonblocking = mode && strncmp(mode, "nonblocking", 11) == 0;
    peer_poll = mode && strcmp(mode, "nonblocking-poll") == 0;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = peer_nonblocking ? 0 : 1;
    ncclResult_t r =
        ncclCommInitRankConfig(&peer_comm, bmt_comm_size(c), id, bmt_comm_rank(c), &cfg);
    ncclResult_t st = r;
    while (st == ncclInProgress)
        ncclCommGetAsyncError(peer_comm, &st);
    if (r != ncclSuccess && r != ncclInProgress)
        die("ncclCommInitRankConfig", ncclGetErrorString(r));
    if (cudaStreamCreateWithFlags(&peer_stream, cudaStreamNonBlocking) != cudaSuccess)
        die("cudaStreamCreate", "failed");
}

static void run_peer_nccl(int op, void *send, void *recv, size_t count, bmt_dtype_t t)
{
    ncclDataType_t nt = t == BMT_BF16 ? ncclBfloat16 : ncclFloat32;
    ncclResult_t r;
    if (op == OP_AG)
        r = ncclAllGather(send, recv, count, nt, peer_comm, peer_stream);
    else if (op == OP_RS)
        r = ncclReduceScatter(send, recv, count, nt, ncclSum, peer_comm, peer_stream);
    else
        r = ncclAllReduce(send, recv, count, nt, ncclSum, peer_comm, peer_stream);
    if (r != ncclSuccess && !(peer_nonblocking && r == ncclInProgress))
        die("nccl", ncclGetErrorString(r));
    ncclResult_t st = r;
    while (st == ncclInProgress)
        ncclCommGetAsyncError(peer_comm, &st);
    if (peer_poll) {
        while (cudaStreamQuery(peer_stream) == cudaErrorNotReady)
            ncclCommGetAsyncError(peer_comm, &st);
    } else if (cudaStreamSynchronize(peer_stream) != cudaSuccess)
        die("cudaStreamSynchronize", "failed");
}
#endif

int main(int argc, char **argv)
{
    const char *comm_name = "world", *csv = NULL;
    size_t min = 1 << 10, max = (size_t)256 << 20;
    const char *dtype_name = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--comm") == 0)
            comm_name = argv[i + 1];
        else if (strcmp(argv[i], "--min") == 0)
            min = parse_bytes(argv[i + 1]);
        else if (strcmp(argv[i], "--max") == 0)
            max = parse_bytes(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0)
            dtype_name = argv[i + 1];
        else if (strcmp(argv[i], "--csv") == 0)
            csv = argv[i + 1];
        else
            die("unknown option", argv[i]);
    }
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        die("bmt_init", err.text);
    bool gpu = bmt_device(ctx) == BMT_DEVICE_CUDA;
    bmt_dtype_t t = gpu ? BMT_BF16 : BMT_F32;
    if (dtype_name)
        t = strcmp(dtype_name, "bf16") == 0 ? BMT_BF16 : BMT_F32;
    bmt_comm_t *c = strcmp(comm_name, "group") == 0     ? bmt_comm_group(ctx)
                    : strcmp(comm_name, "replica") == 0 ? bmt_comm_replica(ctx)
                                                        : bmt_comm_world(ctx);
    int n = bmt_comm_size(c), me = bmt_rank(ctx);
    size_t es = bmt_dtype_size(t);
    size_t cap = max + (size_t)n * es * 4;
    void *send = bmt_mem_alloc(ctx, cap, &err), *recv = bmt_mem_alloc(ctx, cap, &err);
    if (send == NULL || recv == NULL)
        die("alloc", err.text);
    char *host = malloc(cap), *host2 = malloc(cap);
    if (host == NULL || host2 == NULL)
        die("alloc", "host memory");
    for (size_t i = 0; i < cap; i++)
        host[i] = (char)(i * 131 + (size_t)me); /* random-looking; never zeros */
    if (bmt_mem_upload(ctx, send, host, cap, &err) < 0 ||
        bmt_mem_upload(ctx, recv, host, cap, &err) < 0)
        die("upload", err.text);
#ifdef BMT_HAVE_NCCL
    if (gpu)
        peer_nccl_init(c);
#endif
    FILE *csvf = NULL;
    if (me == 0) {
        printf("bench/comm: backend %s, %s communicator of %d ranks, dtype %s, peer: %s%s\n",
               bmt_backend(ctx), comm_name, n, bmt_dtype_name(t),
               gpu ? "direct NCCL on the same buffers" : "memcpy of the same bytes",
               gpu && getenv("BENCH_PEER") ? getenv("BENCH_PEER") : "");
        printf("%-15s %10s %11s %11s %11s %7s\n", "op", "bytes", "bmt us", "bmt busbw",
               "peer busbw", "ratio");
        if (csv && (csvf = fopen(csv, "w")) != NULL)
            fprintf(csvf, "op,bytes,ranks,bmt_us,bmt_busbw_gbs,peer_us,peer_busbw_gbs,ratio\n");
    }
    size_t step = getenv("BENCH_STEP") ? (size_t)atoi(getenv("BENCH_STEP")) : 4;
    for (int op = 0; op < OP_COUNT; op++)
        for (size_t bytes = min; bytes <= max; bytes *= step) {
            /* bytes = the whole array; count = per-rank elements for AG/RS. */
            size_t total = bytes / es / (size_t)n * (size_t)n;
            size_t count = op == OP_AR ? total : total / (size_t)n;
            size_t real = total * es;
            double factor = op == OP_AR ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
            /* warm up, then pick iterations for about 0.2 s */
            for (int w = 0; w < 2; w++)
                if (run_bmt(op, c, send, recv, count, t, &err) < 0)
                    die(op_names[op], err.text);
            double t0 = now();
            if (run_bmt(op, c, send, recv, count, t, &err) < 0)
                die(op_names[op], err.text);
            int iters = (int)(0.2 / max_over(bmt_comm_world(ctx), now() - t0 + 1e-9));
            iters = iters < 3 ? 3 : iters > 1000 ? 1000 : iters;
            bmt_barrier(bmt_comm_world(ctx), &err);
            t0 = now();
            for (int i = 0; i < iters; i++)
                if (run_bmt(op, c, send, recv, count, t, &err) < 0)
                    die(op_names[op], err.text);
            double ours = max_over(bmt_comm_world(ctx), (now() - t0) / iters);

            double peer;
            bmt_barrier(bmt_comm_world(ctx), &err);
#ifdef BMT_HAVE_NCCL
            if (gpu) {
                for (int w = 0; w < 2; w++)
                    run_peer_nccl(op, send, recv, count, t);
                t0 = now();
                for (int i = 0; i < iters; i++)
                    run_peer_nccl(op, send, recv, count, t);
                peer = max_over(bmt_comm_world(ctx), (now() - t0) / iters);
            } else
#endif
            {
                /* memcpy of the bytes that define busbw (bytes * factor), every
                 * rank at once: what the memory system allows. */
                size_t mb = (size_t)((double)real * factor);
                if (mb == 0)
                    mb = real;
                memcpy(host2, host, mb);
                t0 = now();
                for (int i = 0; i < iters; i++) {
                    memcpy(host2, host + (i & 1), mb);
                    __asm__ volatile("" ::: "memory");
                }
                peer = max_over(bmt_comm_world(ctx), (now() - t0) / iters);
                peer = peer * factor * (double)real / (double)mb; /* same busbw scale */
            }
            double busbw = (double)real / ours * factor / 1e9;
            double peer_busbw = (double)real / peer * factor / 1e9;
            if (me == 0) {
                char b[32];
                if (real >= (1 << 20))
                    snprintf(b, sizeof(b), "%zu MiB", real >> 20);
                else
                    snprintf(b, sizeof(b), "%zu KiB", real >> 10);
                printf("%-15s %10s %11.1f %9.2f GB/s %7.2f GB/s %7.3f\n", op_names[op], b,
                       ours * 1e6, busbw, peer_busbw, busbw / peer_busbw);
                fflush(stdout);
                if (csvf)
                    fprintf(csvf, "%s,%zu,%d,%.3f,%.4f,%.3f,%.4f,%.4f\n", op_names[op], real, n,
                            ours * 1e6, busbw, peer * 1e6, peer_busbw, busbw / peer_busbw);
            }
        }
    if (csvf)
        fclose(csvf);
#ifdef BMT_HAVE_NCCL
    if (gpu) {
        ncclCommDestroy(peer_comm);
        cudaStreamDestroy(peer_stream);
    }
#endif
    bmt_mem_free(ctx, send);
    bmt_mem_free(ctx, recv);
    free(host);
    free(host2);
    bmt_finalize(ctx);
    return 0;
}
