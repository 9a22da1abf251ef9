/* runtime/hash.h — the two small hashes the runtime uses to derive names.
 *
 * Communicator ids and shared-memory names are derived, not exchanged: every
 * member computes the same value from what it already knows (the job's PMIx
 * namespace, a parent id, a split count, a color).
 */
#ifndef BMT_RUNTIME_HASH_H
#define BMT_RUNTIME_HASH_H

#include <stdint.h>

/* MurmurHash3's 64-bit finalizer: a bijective mix of x. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* FNV-1a of a string, continuing from h (start with 0xcbf29ce484222325). */
static inline uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* A job's hash (ctx->job_hash): its PMIx namespace and the uid. Shared-memory
 * segments are named /bmt-<job hash as 16 hex digits>-<comm id> (comm_shm.c),
 * which is how bmlaunch finds those a job left behind (launcher/local.c). */
static inline uint64_t job_hash_of(const char *nspace, uint64_t uid)
{
    return fnv1a(nspace, 0xcbf29ce484222325ULL) ^ (uid << 32);
}

/* The id of a job's world communicator. */
static inline uint64_t comm_world_id(uint64_t job_hash)
{
    return mix64(job_hash ^ 0x776f726c64ULL /* "world" */);
}

#endif
