/* runtime/device.h — the device layer's internal side (public side: bmt/device.h).
 *
 * Streams and events are void * (cudaStream_t, cudaEvent_t) so that modules
 * compiled without CUDA headers can carry them; on cpu they are NULL and every
 * function here is a no-op that succeeds.
 */
#ifndef BMT_RUNTIME_DEVICE_H
#define BMT_RUNTIME_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bmt/device.h"

enum device_stream_id {
    DEVICE_COMPUTE = 0, /* the model's kernels */
    DEVICE_COMM = 1,    /* gathers and reduce-scatters in the group */
    DEVICE_REPLICA = 2, /* all-reduce of gradient shards across groups */
    DEVICE_STREAMS = 3
};

/* Make the three CUDA streams (cuda only). */
int device_setup_streams(bmt_ctx_t *ctx, bmt_error_t *err);

/* Free the allocation table and the streams (bmt_finalize). */
void device_release(bmt_ctx_t *ctx);

void *device_stream(bmt_ctx_t *ctx, int which);

/* Wait (the host) for what is enqueued on one of the context's streams, within
 * BMT_TIMEOUT, watching the communicators as bmt_device_synchronize does. */
int device_stream_synchronize(bmt_ctx_t *ctx, int which, bmt_error_t *err);

/* Wait for work enqueued on the legacy stream (stream NULL: block building,
 * gradient shard allocation), which the context's non-blocking streams do not
 * order after. */
int device_sync_legacy(bmt_ctx_t *ctx, bmt_error_t *err);

int device_event_create(bmt_ctx_t *ctx, void **ev, bmt_error_t *err);
void device_event_destroy(bmt_ctx_t *ctx, void *ev);
/* Record ev on stream / make stream wait for ev. ev NULL: no-op. */
int device_event_record(bmt_ctx_t *ctx, void *ev, void *stream, bmt_error_t *err);
int device_stream_wait(bmt_ctx_t *ctx, void *stream, void *ev, bmt_error_t *err);

/* Make the compute stream wait for ev (NULL: no-op), timing the wait on cuda
 * (exposed communication, see device.c). */
int device_wait_timed(bmt_ctx_t *ctx, void *ev, bmt_error_t *err);
/* Before the optimizer's synchronization: mark the end of compute on all
 * three streams, so the reductions' tail counts as exposed communication. */
int device_wait_tail(bmt_ctx_t *ctx, bmt_error_t *err);
/* After a synchronization: seconds of exposed communication since the last
 * call (*partial: some waits could not be timed). 0 on cpu. */
double device_wait_collect(bmt_ctx_t *ctx, bool *partial);

/* Memory now and the peak per kind since the last call (which starts a new
 * period); arrays of BMT_MEM_KIND_COUNT. *peak_all: the peak of all kinds at
 * once in the period (at most the sum of the kinds' peaks: with stream-ordered
 * memory the kinds peak at different times). The public peaks are not touched. */
void device_mem_step_peaks(bmt_ctx_t *ctx, uint64_t *current, uint64_t *peak, uint64_t *peak_all);

/* The device's name ("NVIDIA H200", or the CPU model from /proc/cpuinfo). */
void device_name(bmt_ctx_t *ctx, char *out, size_t len);

#endif
