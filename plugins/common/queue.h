/* plugins/common/queue.h — the bounded queue between a plugin's callbacks and its thread.
 *
 * on_step runs on the training thread and must never wait for I/O: it copies
 * the item in under a mutex that the plugin's thread holds only to copy items
 * out. When the queue is full the oldest item is dropped and counted, so a
 * collector that is down costs memory bounded by the capacity and no time.
 */
#ifndef BMT_PLUGINS_QUEUE_H
#define BMT_PLUGINS_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pq pq_t;

/* A queue of cap items of item_size bytes. NULL when out of memory. */
pq_t *pq_create(size_t cap, size_t item_size);
void pq_destroy(pq_t *q);

/* Copy item in; never blocks on I/O. When full, drops the oldest item. */
void pq_push(pq_t *q, const void *item);

/* Copy out up to max of the oldest items into out (max * item_size bytes),
 * waiting up to wait_s for the first one. Returns how many (0: timed out, or
 * closed and empty). */
size_t pq_pop(pq_t *q, void *out, size_t max, double wait_s);

/* Put n items taken by pq_pop back at the front, oldest first (a failed send
 * retried later). Items that no longer fit are dropped, oldest first. */
void pq_unpop(pq_t *q, const void *items, size_t n);

/* Count n items as dropped (a send that was refused for good). */
void pq_count_dropped(pq_t *q, uint64_t n);

/* Items dropped so far. */
uint64_t pq_dropped(pq_t *q);

/* Wake waiters; pq_pop then returns what is left without waiting. */
void pq_close(pq_t *q);
bool pq_closed(pq_t *q);

/* Sleep up to wait_s, returning early when the queue is closed. */
void pq_nap(pq_t *q, double wait_s);

#endif
