/* runtime/boot.c — PMIx client: join the job, read its keys, exchange setup data.
 *
 * The same code runs under bmlaunch (which hosts a PMIx server) and under
 * `srun --mpi=pmix` (slurmstepd hosts it). Every exchange is Put + Commit +
 * Fence(collect, timeout) + Get, with a fresh key per exchange so that a late
 * Get can never read an earlier round's value. PMIx status codes become text
 * (PMIx_Error_string) here, where they enter our code.
 */
#include "boot.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pmix.h>

#include "bmt/layout.h"
#include "error.h"

struct boot {
    boot_info_t info;
    pmix_proc_t me;
    int timeout_s;        /* PMIX_TIMEOUT is whole seconds */
    unsigned seq;         /* exchanges so far (all ranks agree) */
    char pub_key[64];     /* key of the latest boot_publish */
    size_t published_len; /* its length */
    void *published;      /* singleton: the bytes themselves */
};

static int pmix_fail(bmt_error_t *err, const boot_t *b, const char *call, pmix_status_t rc)
{
    return errprintf(err, "rank %d: %s: %s", b ? b->info.rank : -1, call, PMIx_Error_string(rc));
}

/* Any PMIx integer value as an unsigned (launchers differ in the types they use). */
static int value_uint(const pmix_value_t *v, uint64_t *out)
{
    switch (v->type) {
    case PMIX_UINT8: *out = v->data.uint8; return 0;
    case PMIX_UINT16: *out = v->data.uint16; return 0;
    case PMIX_UINT32: *out = v->data.uint32; return 0;
    case PMIX_UINT64: *out = v->data.uint64; return 0;
    case PMIX_SIZE: *out = v->data.size; return 0;
    case PMIX_INT:
        if (v->data.integer < 0)
            return -1;
        *out = (uint64_t)v->data.integer;
        return 0;
    case PMIX_INT8:
        if (v->data.int8 < 0)
            return -1;
        *out = (uint64_t)v->data.int8;
        return 0;
    case PMIX_INT16:
        if (v->data.int16 < 0)
            return -1;
        *out = (uint64_t)v->data.int16;
        return 0;
    case PMIX_INT32:
        if (v->data.int32 < 0)
            return -1;
        *out = (uint64_t)v->data.int32;
        return 0;
    case PMIX_INT64:
        if (v->data.int64 < 0)
            return -1;
        *out = (uint64_t)v->data.int64;
        return 0;
    case PMIX_UINT: *out = v->data.uint; return 0;
    default: return -1;
    }
}

/* Get key of proc (rank or PMIX_RANK_WILDCARD) as an unsigned.
 * Returns 1 found, 0 not found, -1 error. */
static int get_uint(boot_t *b, pmix_rank_t rank, const char *key, uint64_t *out, bmt_error_t *err)
{
    pmix_proc_t p;
    PMIX_PROC_CONSTRUCT(&p);
    PMIX_LOAD_NSPACE(p.nspace, b->me.nspace);
    p.rank = rank;
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &v);
    if (rc == PMIX_ERR_NOT_FOUND || rc == PMIX_ERR_NOT_SUPPORTED)
        return 0;
    if (rc != PMIX_SUCCESS) {
        char call[96];
        snprintf(call, sizeof(call), "PMIx_Get(%s)", key);
        return pmix_fail(err, b, call, rc);
    }
    int bad = value_uint(v, out);
    int type = v->type;
    PMIX_VALUE_RELEASE(v);
    if (bad)
        return errprintf(err, "rank %d: PMIx key %s has type %d, not an unsigned integer",
                         b->info.rank, key, type);
    return 1;
}

static int need_uint(boot_t *b, pmix_rank_t rank, const char *key, int *out, bmt_error_t *err)
{
    uint64_t v = 0;
    int found = get_uint(b, rank, key, &v, err);
    if (found < 0)
        return -1;
    if (found == 0)
        return errprintf(err, "rank %d: the PMIx server did not provide %s", b->info.rank, key);
    if (v > (uint64_t)BMT_LAYOUT_MAX_WORLD)
        return errprintf(err, "rank %d: PMIx key %s = %llu is out of range", b->info.rank, key,
                         (unsigned long long)v);
    *out = (int)v;
    return 0;
}

int boot_init(boot_t **out, double timeout_s, bmt_error_t *err)
{
    boot_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return errprintf(err, "boot: out of memory");
    /* PMIX_TIMEOUT is an int: a longer deadline (BMT_TIMEOUT=1e10, "wait for
     * ever") is the longest one, not a conversion that overflows into 1 s. */
    b->timeout_s = timeout_s >= (double)INT_MAX ? INT_MAX : (int)ceil(timeout_s);
    if (b->timeout_s < 1)
        b->timeout_s = 1;
    b->info.rank = 0;
    if (gethostname(b->info.hostname, sizeof(b->info.hostname) - 1) != 0)
        snprintf(b->info.hostname, sizeof(b->info.hostname), "localhost");

    if (getenv("PMIX_NAMESPACE") == NULL) {
        /* Not started by a PMIx server: a job of one. */
        b->info.singleton = true;
        b->info.size = 1;
        b->info.local_size = 1;
        snprintf(b->info.nspace, sizeof(b->info.nspace), "singleton.%ld", (long)getpid());
        *out = b;
        return 0;
    }

    pmix_status_t rc = PMIx_Init(&b->me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        pmix_fail(err, NULL, "PMIx_Init", rc);
        free(b);
        return -1;
    }
    b->info.rank = (int)b->me.rank;
    snprintf(b->info.nspace, sizeof(b->info.nspace), "%s", b->me.nspace);
    if (need_uint(b, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, &b->info.size, err) < 0 ||
        need_uint(b, b->me.rank, PMIX_LOCAL_RANK, &b->info.local_rank, err) < 0 ||
        need_uint(b, PMIX_RANK_WILDCARD, PMIX_LOCAL_SIZE, &b->info.local_size, err) < 0)
        goto fail;
    uint64_t node = 0;
    int found = get_uint(b, b->me.rank, PMIX_NODEID, &node, err);
    if (found < 0)
        goto fail;
    b->info.node_id = found ? (int)node : 0;

    pmix_proc_t p = b->me;
    pmix_value_t *v = NULL;
    if (PMIx_Get(&p, PMIX_HOSTNAME, NULL, 0, &v) == PMIX_SUCCESS && v) {
        if (v->type == PMIX_STRING && v->data.string)
            snprintf(b->info.hostname, sizeof(b->info.hostname), "%s", v->data.string);
        PMIX_VALUE_RELEASE(v);
    }
    *out = b;
    return 0;
fail:
    PMIx_Finalize(NULL, 0);
    free(b);
    return -1;
}

void boot_finalize(boot_t *b)
{
    if (b == NULL)
        return;
    if (!b->info.singleton)
        PMIx_Finalize(NULL, 0);
    free(b->published);
    free(b);
}

const boot_info_t *boot_info(const boot_t *b) { return &b->info; }

int boot_job_uint(boot_t *b, const char *key, uint32_t *out, bmt_error_t *err)
{
    if (b->info.singleton)
        return 0;
    uint64_t v = 0;
    int found = get_uint(b, PMIX_RANK_WILDCARD, key, &v, err);
    if (found <= 0)
        return found;
    if (v > UINT32_MAX)
        return errprintf(err, "rank %d: PMIx key %s = %llu is out of range", b->info.rank, key,
                         (unsigned long long)v);
    *out = (uint32_t)v;
    return 1;
}

static int fence(boot_t *b, bool collect, bmt_error_t *err)
{
    pmix_proc_t all;
    PMIX_PROC_CONSTRUCT(&all);
    PMIX_LOAD_NSPACE(all.nspace, b->me.nspace);
    all.rank = PMIX_RANK_WILDCARD;
    pmix_info_t info[2];
    bool yes = collect;
    int tmo = b->timeout_s;
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &tmo, PMIX_INT);
    pmix_status_t rc = PMIx_Fence(&all, 1, info, 2);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc == PMIX_ERR_TIMEOUT)
        return errprintf(err,
                         "rank %d: PMIx_Fence: not every rank arrived within %d s (BMT_TIMEOUT)",
                         b->info.rank, b->timeout_s);
    if (rc != PMIX_SUCCESS)
        return pmix_fail(err, b, "PMIx_Fence", rc);
    return 0;
}

static int put_bytes(boot_t *b, const char *key, const void *data, size_t len, bmt_error_t *err)
{
    pmix_value_t val;
    pmix_byte_object_t bo;
    PMIX_VALUE_CONSTRUCT(&val);
    bo.bytes = (char *)data;
    bo.size = len;
    /* PMIX_VALUE_LOAD copies the bytes, so the caller's buffer stays the caller's. */
    PMIX_VALUE_LOAD(&val, &bo, PMIX_BYTE_OBJECT);
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &val);
    PMIX_VALUE_DESTRUCT(&val);
    if (rc != PMIX_SUCCESS)
        return pmix_fail(err, b, "PMIx_Put", rc);
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS)
        return pmix_fail(err, b, "PMIx_Commit", rc);
    return 0;
}

static int get_bytes(boot_t *b, int rank, const char *key, void *dst, size_t len, bmt_error_t *err)
{
    pmix_proc_t p;
    PMIX_PROC_CONSTRUCT(&p);
    PMIX_LOAD_NSPACE(p.nspace, b->me.nspace);
    p.rank = (pmix_rank_t)rank;
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &v);
    if (rc != PMIX_SUCCESS) {
        char call[96];
        snprintf(call, sizeof(call), "PMIx_Get(%s of rank %d)", key, rank);
        return pmix_fail(err, b, call, rc);
    }
    int ok = v->type == PMIX_BYTE_OBJECT && v->data.bo.size == len;
    if (ok)
        memcpy(dst, v->data.bo.bytes, len);
    PMIX_VALUE_RELEASE(v);
    if (!ok)
        return errprintf(err, "rank %d: PMIx key %s of rank %d is not %zu bytes", b->info.rank, key,
                         rank, len);
    return 0;
}

int boot_allgather(boot_t *b, const void *mine, size_t len, void *all, bmt_error_t *err)
{
    if (b->info.singleton) {
        memcpy(all, mine, len);
        return 0;
    }
    char key[64];
    snprintf(key, sizeof(key), "bmt.ag.%u", b->seq++);
    if (put_bytes(b, key, mine, len, err) < 0 || fence(b, true, err) < 0)
        return -1;
    for (int r = 0; r < b->info.size; r++) {
        if (r == b->info.rank)
            memcpy((char *)all + (size_t)r * len, mine, len);
        else if (get_bytes(b, r, key, (char *)all + (size_t)r * len, len, err) < 0)
            return -1;
    }
    return 0;
}

int boot_publish(boot_t *b, const void *mine, size_t len, bmt_error_t *err)
{
    if (b->info.singleton) {
        free(b->published);
        b->published = malloc(len ? len : 1);
        if (b->published == NULL)
            return errprintf(err, "rank 0: out of memory");
        memcpy(b->published, mine, len);
        b->published_len = len;
        return 0;
    }
    snprintf(b->pub_key, sizeof(b->pub_key), "bmt.pub.%u", b->seq++);
    if (put_bytes(b, b->pub_key, mine, len, err) < 0 || fence(b, true, err) < 0)
        return -1;
    b->published_len = len;
    return 0;
}

int boot_fetch(boot_t *b, int peer, void *buf, size_t len, bmt_error_t *err)
{
    if (peer < 0 || peer >= b->info.size)
        return errprintf(err, "rank %d: bmt_oob_fetch: peer %d is not in [0, %d)", b->info.rank,
                         peer, b->info.size);
    if (b->published_len == 0 && !b->pub_key[0] && !b->published)
        return errprintf(err, "rank %d: bmt_oob_fetch before bmt_oob_publish", b->info.rank);
    if (len != b->published_len)
        return errprintf(err, "rank %d: bmt_oob_fetch of %zu bytes, but %zu were published",
                         b->info.rank, len, b->published_len);
    if (b->info.singleton) {
        memcpy(buf, b->published, len);
        return 0;
    }
    return get_bytes(b, peer, b->pub_key, buf, len, err);
}

int boot_bcast(boot_t *b, int root, void *buf, size_t len, bmt_error_t *err)
{
    if (b->info.singleton)
        return 0;
    char key[64];
    snprintf(key, sizeof(key), "bmt.bc.%u", b->seq++);
    if (b->info.rank == root && put_bytes(b, key, buf, len, err) < 0)
        return -1;
    if (fence(b, true, err) < 0)
        return -1;
    if (b->info.rank != root)
        return get_bytes(b, root, key, buf, len, err);
    return 0;
}

int boot_agree(boot_t *b, const void *mine, size_t len, int *first, void *zero, void *theirs,
               bmt_error_t *err)
{
    *first = -1;
    memcpy(zero, mine, len);
    memcpy(theirs, mine, len);
    if (b->info.singleton)
        return 0;
    /* The verdict: the first differing rank, then rank 0's bytes and its. */
    size_t vlen = sizeof(int32_t) + 2 * len;
    char *verdict = malloc(vlen);
    if (verdict == NULL)
        return errprintf(err, "rank %d: out of memory", b->info.rank);
    int32_t bad = -1;
    char key[64];
    snprintf(key, sizeof(key), "bmt.agree.%u", b->seq++);
    if (put_bytes(b, key, mine, len, err) < 0 || fence(b, true, err) < 0) {
        free(verdict); /* a fence fails everywhere: no verdict to wait for */
        return -1;
    }
    int rc = 0;
    memcpy(verdict + sizeof(bad), mine, len);
    memcpy(verdict + sizeof(bad) + len, mine, len);
    for (int r = 1; rc == 0 && b->info.rank == 0 && r < b->info.size && bad < 0; r++) {
        rc = get_bytes(b, r, key, verdict + sizeof(bad) + len, len, err);
        if (rc == 0 && memcmp(verdict + sizeof(bad) + len, mine, len) != 0)
            bad = r;
    }
    memcpy(verdict, &bad, sizeof(bad));
    /* Rank 0 broadcasts even after a failed get, so that no rank waits for it;
     * the others' verdict is then "agreed" and rank 0 alone fails. */
    if (boot_bcast(b, 0, verdict, vlen, rc < 0 ? NULL : err) < 0 && rc == 0)
        rc = -1;
    if (rc == 0) {
        memcpy(&bad, verdict, sizeof(bad));
        *first = bad;
        memcpy(zero, verdict + sizeof(bad), len);
        memcpy(theirs, verdict + sizeof(bad) + len, len);
    }
    free(verdict);
    return rc;
}

int boot_barrier(boot_t *b, bmt_error_t *err)
{
    if (b->info.singleton)
        return 0;
    return fence(b, false, err);
}

void boot_abort(boot_t *b, int status, const char *msg)
{
    if (b == NULL || b->info.singleton)
        return;
    PMIx_Abort(status, msg ? msg : "", NULL, 0);
}
