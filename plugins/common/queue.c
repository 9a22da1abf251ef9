/* plugins/common/queue.c — a ring of fixed-size items, drop-oldest when full. */
#include "queue.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct pq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *ring; /* (cap, item_size) */
    size_t cap, item, head, len;
    uint64_t dropped;
    bool closed;
};

pq_t *pq_create(size_t cap, size_t item_size)
{
    pq_t *q = calloc(1, sizeof(*q));
    if (q == NULL || cap == 0)
        return free(q), NULL;
    q->ring = calloc(cap, item_size);
    if (q->ring == NULL)
        return free(q), NULL;
    q->cap = cap;
    q->item = item_size;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    return q;
}

void pq_destroy(pq_t *q)
{
    if (q == NULL)
        return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->ring);
    free(q);
}

static unsigned char *slot(pq_t *q, size_t i)
{
    return q->ring + ((q->head + i) % q->cap) * q->item;
}

void pq_push(pq_t *q, const void *item)
{
    pthread_mutex_lock(&q->mu);
    if (q->len == q->cap) { /* drop the oldest */
        q->head = (q->head + 1) % q->cap;
        q->len--;
        q->dropped++;
    }
    memcpy(slot(q, q->len), item, q->item);
    q->len++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static struct timespec deadline_after(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

size_t pq_pop(pq_t *q, void *out, size_t max, double wait_s)
{
    pthread_mutex_lock(&q->mu);
    if (q->len == 0 && !q->closed && wait_s > 0) {
        struct timespec dl = deadline_after(wait_s);
        while (q->len == 0 && !q->closed)
            if (pthread_cond_timedwait(&q->cv, &q->mu, &dl) != 0)
                break;
    }
    size_t n = q->len < max ? q->len : max;
    for (size_t i = 0; i < n; i++)
        memcpy((unsigned char *)out + i * q->item, slot(q, i), q->item);
    q->head = (q->head + n) % q->cap;
    q->len -= n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void pq_unpop(pq_t *q, const void *items, size_t n)
{
    pthread_mutex_lock(&q->mu);
    /* Room for the newest of them: the queue's own items are newer still. */
    size_t room = q->cap - q->len;
    size_t keep = n < room ? n : room;
    q->dropped += n - keep;
    const unsigned char *src = (const unsigned char *)items + (n - keep) * q->item;
    q->head = (q->head + q->cap - keep) % q->cap;
    q->len += keep;
    for (size_t i = 0; i < keep; i++)
        memcpy(slot(q, i), src + i * q->item, q->item);
    pthread_mutex_unlock(&q->mu);
}

void pq_count_dropped(pq_t *q, uint64_t n)
{
    pthread_mutex_lock(&q->mu);
    q->dropped += n;
    pthread_mutex_unlock(&q->mu);
}

uint64_t pq_dropped(pq_t *q)
{
    pthread_mutex_lock(&q->mu);
    uint64_t d = q->dropped;
    pthread_mutex_unlock(&q->mu);
    return d;
}

void pq_close(pq_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

bool pq_closed(pq_t *q)
{
    pthread_mutex_lock(&q->mu);
    bool c = q->closed;
    pthread_mutex_unlock(&q->mu);
    return c;
}

void pq_nap(pq_t *q, double wait_s)
{
    pthread_mutex_lock(&q->mu);
    struct timespec dl = deadline_after(wait_s);
    while (!q->closed)
        if (pthread_cond_timedwait(&q->cv, &q->mu, &dl) != 0)
            break;
    pthread_mutex_unlock(&q->mu);
}
