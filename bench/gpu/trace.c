/* bench/gpu/trace.c — a kernel timeline of any CUDA program, through CUPTI's
 * activity API: every kernel, memset and memcpy with its start, end, the time
 * the host enqueued a kernel's launch (queued; 0 for memsets and copies), its
 * stream and its name, written as
 * tab-separated lines to $BMT_TRACE_OUT (default trace.tsv) when the program
 * ends. Unlike Nsight Compute (bench/gpu/profile.sh), kernels run as they do
 * in a real step: concurrently across streams, at their real gaps; so the
 * timeline shows what the compute stream waits for and what runs beside it
 * (bench/gpu/timeline.py reads it).
 *
 * Loaded by the CUDA driver into the program (no rebuild of the program):
 *   CUDA_INJECTION64_PATH=$PWD/build/bench/libbmt_trace.so BMT_TRACE_OUT=t.tsv build/bin/gpt2 ...
 * Build: make build/bench/libbmt_trace.so (needs libcupti; the GPU machine's
 * CUDA has it). Diagnostics only, never linked into libbmt.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

#define TRACE_BUF (8u << 20)

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUF);
    *size = *buffer ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) { /* the kind enabled below */
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "K\t%llu\t%llu\t%llu\t%u\t%d,%d,%d\t%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, (unsigned long long)k->queued, k->streamId,
                    k->gridX, k->gridY, k->gridZ, k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            fprintf(out, "S\t%llu\t%llu\t0\t%u\t%llu\tmemset\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "C\t%llu\t%llu\t0\t%u\t%llu\tmemcpy%d\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes,
                    (int)m->copyKind);
        }
    }
    free(buffer);
}

static void trace_end(void)
{
    cuptiActivityFlushAll(1);
    if (out)
        fclose(out);
    out = NULL;
}

int InitializeInjection(void); /* the CUDA driver calls it */

int InitializeInjection(void)
{
    const char *path = getenv("BMT_TRACE_OUT");
    out = fopen(path && *path ? path : "trace.tsv", "w");
    if (out == NULL) {
        fprintf(stderr, "bmt_trace: cannot write %s\n", path && *path ? path : "trace.tsv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnableLatencyTimestamps(1) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
        fprintf(stderr, "bmt_trace: CUPTI refused the activity setup\n");
        fclose(out);
        out = NULL;
        return 0;
    }
    atexit(trace_end);
    return 1;
}
