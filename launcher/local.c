/* launcher/local.c — the PMIx server host of local mode.
 *
 * Sequence (openpmix examples/server.c shows the same): private tmpdir ->
 * PMIx_server_init -> PMIx_server_register_nspace with the job info -> per rank
 * PMIx_server_setup_fork + PMIx_server_register_client -> (the supervisor forks)
 * -> ... -> PMIx_server_deregister_nspace -> PMIx_server_finalize. A restart
 * (host_renew) deregisters the namespace and registers the job again under a
 * new one, keeping the server (its socket, thread and directory start once):
 * so no state of the last run (clients, their data, the shm names libbmt
 * derives from the namespace) reaches the next one.
 *
 * All ranks live on this machine, so PMIx is told the truth: one node holding the
 * whole job. The bmt layout (which may describe several logical nodes, for
 * planning runs on CPU) travels as extra job keys and as BMT_ variables.
 *
 * Callbacks run on PMIx's progress thread. fence_nb is only called once every
 * local participant has arrived, and with one server all participants are local,
 * so it hands the collected data straight back. Everything else that changes
 * the job is posted to the supervisor through notify_fd.
 */
#include "local.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <pmix.h>
#include <pmix_server.h>

#include "error.h"
#include "hash.h"

struct pmix_host {
    char nspace[PMIX_MAX_NSLEN + 1];
    char tmpdir[256];
    int world;
    bmt_layout_t l; /* registered again by host_renew */
    bool registered;
};

/* The notification pipe, set once before PMIx_server_init starts its thread. */
static int host_notify_fd = -1;

static void post(host_event_t *ev)
{
    /* A pointer is far below PIPE_BUF, so the write is atomic; the pipe is
     * blocking on purpose: the supervisor always drains it. */
    ssize_t n;
    do
        n = write(host_notify_fd, &ev, sizeof(ev));
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof(ev))
        free(ev);
}

static host_event_t *event_new(host_event_kind_t kind, const pmix_proc_t *proc)
{
    host_event_t *ev = calloc(1, sizeof(*ev));
    if (ev) {
        ev->kind = kind;
        ev->rank = proc ? (int)proc->rank : -1;
    }
    return ev;
}

static pmix_status_t cb_connected(const pmix_proc_t *proc, void *server_object,
                                  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    host_event_t *ev = event_new(HOST_CONNECTED, proc);
    if (ev)
        post(ev);
    if (cbfunc)
        cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
}

static pmix_status_t cb_finalized(const pmix_proc_t *proc, void *server_object,
                                  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    host_event_t *ev = event_new(HOST_FINALIZED, proc);
    if (ev)
        post(ev);
    if (cbfunc)
        cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
}

static pmix_status_t cb_abort(const pmix_proc_t *proc, void *server_object, int status,
                              const char msg[], pmix_proc_t procs[], size_t nprocs,
                              pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    /* Whatever the list of procs, ending the job is what bmlaunch does: a rank
     * that asks to abort anything has declared the job broken. The supervisor
     * releases the caller (ev->done) after it has signalled every rank. */
    host_event_t *ev = event_new(HOST_ABORT, proc);
    if (ev == NULL)
        return PMIX_ERR_NOMEM;
    ev->status = status;
    snprintf(ev->msg, sizeof(ev->msg), "%s", msg ? msg : "");
    ev->done = cbfunc;
    ev->done_data = cbdata;
    post(ev);
    return PMIX_SUCCESS;
}

static pmix_status_t cb_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                              size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cbfunc,
                              void *cbdata)
{
    if (cbfunc)
        cbfunc(PMIX_SUCCESS, data, ndata, cbdata, NULL, NULL);
    return PMIX_SUCCESS;
}

static pmix_server_module_t host_module = {
    .client_connected = cb_connected,
    .client_finalized = cb_finalized,
    .abort = cb_abort,
    .fence_nb = cb_fence,
};

/* Wait for a PMIx operation callback. */
typedef struct op_wait {
    atomic_int done;
    pmix_status_t status;
} op_wait_t;

static void op_done(pmix_status_t status, void *cbdata)
{
    op_wait_t *w = cbdata;
    w->status = status;
    atomic_store_explicit(&w->done, 1, memory_order_release);
}

/* Bounded: a PMIx library that never calls back must not hang the launcher. */
#define HOST_OP_TIMEOUT_S 60

/* Wait for w's callback (rc is what the PMIx call returned), then free w. After
 * a timeout w stays allocated on purpose: a late callback would otherwise write
 * into freed memory. */
static pmix_status_t op_wait(op_wait_t *w, pmix_status_t rc)
{
    if (rc == PMIX_OPERATION_SUCCEEDED || rc != PMIX_SUCCESS) {
        free(w); /* no callback will come */
        return rc == PMIX_OPERATION_SUCCEEDED ? PMIX_SUCCESS : rc;
    }
    /* By the clock: a count of 20 us naps overran the bound more than fourfold
     * (each nap lasts 80-90 us with the kernel's timer slack). */
    struct timespec ts = { 0, 20000 }, now, end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += HOST_OP_TIMEOUT_S;
    while (!atomic_load_explicit(&w->done, memory_order_acquire)) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
            return PMIX_ERR_TIMEOUT;
        nanosleep(&ts, NULL);
    }
    pmix_status_t st = w->status;
    free(w);
    return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    remove(path);
    return 0;
}

static char *join_ranks(int n)
{
    size_t cap = (size_t)n * 8 + 16, len = 0;
    char *s = malloc(cap);
    if (s == NULL)
        return NULL;
    s[0] = '\0';
    for (int r = 0; r < n; r++)
        len += (size_t)snprintf(s + len, cap - len, r ? ",%d" : "%d", r);
    return s;
}

/* Info array builder: grows as keys are added; values are copied. */
typedef struct info_list {
    pmix_info_t *v;
    size_t n, cap;
} info_list_t;

static int info_add(info_list_t *l, const char *key, const void *val, pmix_data_type_t type)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 32;
        pmix_info_t *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    PMIX_INFO_CONSTRUCT(&l->v[l->n]);
    if (PMIx_Info_load(&l->v[l->n], key, val, type) != PMIX_SUCCESS)
        return -1;
    l->n++;
    return 0;
}

static void info_free(info_list_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        PMIX_INFO_DESTRUCT(&l->v[i]);
    free(l->v);
    *l = (info_list_t){ 0 };
}

/* One pmix_data_array_t of infos, added to parent under key (copied). */
static int info_add_array(info_list_t *parent, const char *key, info_list_t *items)
{
    pmix_data_array_t da = { .type = PMIX_INFO, .size = items->n, .array = items->v };
    int rc = info_add(parent, key, &da, PMIX_DATA_ARRAY);
    info_free(items);
    return rc;
}

static int register_job(pmix_host_t *h, const bmt_layout_t *l, bmt_error_t *err)
{
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    uint32_t world = (uint32_t)l->world, one = 1, zero = 0;
    char *peers = join_ranks(l->world);
    char *node_map = NULL, *proc_map = NULL;
    /* PMIx_generate_ppn takes the ranks of each node as a comma list ("0,1,2"),
     * nodes separated by ';'. A range ("0-2") is read as one rank, and every
     * client then sees PMIX_LOCAL_SIZE = 1. */
    pmix_status_t rc = PMIx_generate_regex(host, &node_map);
    if (rc == PMIX_SUCCESS && peers)
        rc = PMIx_generate_ppn(peers, &proc_map);
    if (rc != PMIX_SUCCESS || peers == NULL) {
        free(peers);
        free(node_map);
        free(proc_map);
        return errprintf(err, "PMIx_generate_regex/ppn: %s", PMIx_Error_string(rc));
    }
    uint32_t groups = (uint32_t)l->groups, gpg = (uint32_t)l->gpus_per_group,
             gpn = (uint32_t)l->gpus_per_node;
    info_list_t job = { 0 }, node = { 0 };
    int bad = 0;
    bad |= info_add(&job, PMIX_UNIV_SIZE, &world, PMIX_UINT32);
    bad |= info_add(&job, PMIX_JOB_SIZE, &world, PMIX_UINT32);
    bad |= info_add(&job, PMIX_MAX_PROCS, &world, PMIX_UINT32);
    bad |= info_add(&job, PMIX_LOCAL_SIZE, &world, PMIX_UINT32);
    bad |= info_add(&job, PMIX_NODE_SIZE, &world, PMIX_UINT32);
    bad |= info_add(&job, PMIX_NUM_NODES, &one, PMIX_UINT32);
    bad |= info_add(&job, PMIX_JOB_NUM_APPS, &one, PMIX_UINT32);
    bad |= info_add(&job, PMIX_LOCAL_PEERS, peers, PMIX_STRING);
    bad |= info_add(&job, PMIX_NODE_MAP, node_map, PMIX_STRING);
    bad |= info_add(&job, PMIX_PROC_MAP, proc_map, PMIX_STRING);
    bad |= info_add(&job, PMIX_JOBID, h->nspace, PMIX_STRING);
    bad |= info_add(&job, HOST_KEY_GROUPS, &groups, PMIX_UINT32);
    bad |= info_add(&job, HOST_KEY_GPUS_PER_GROUP, &gpg, PMIX_UINT32);
    bad |= info_add(&job, HOST_KEY_GPUS_PER_NODE, &gpn, PMIX_UINT32);
    /* The one node. */
    bad |= info_add(&node, PMIX_NODEID, &zero, PMIX_UINT32);
    bad |= info_add(&node, PMIX_HOSTNAME, host, PMIX_STRING);
    bad |= info_add(&node, PMIX_LOCAL_SIZE, &world, PMIX_UINT32);
    bad |= info_add(&node, PMIX_LOCAL_PEERS, peers, PMIX_STRING);
    bad |= info_add_array(&job, PMIX_NODE_INFO_ARRAY, &node);
    /* Every proc: rank, local and node rank, node id, host. */
    for (int r = 0; r < l->world && !bad; r++) {
        info_list_t proc = { 0 };
        pmix_rank_t pr = (pmix_rank_t)r;
        uint16_t lr = (uint16_t)r;
        bad |= info_add(&proc, PMIX_RANK, &pr, PMIX_PROC_RANK);
        bad |= info_add(&proc, PMIX_LOCAL_RANK, &lr, PMIX_UINT16);
        bad |= info_add(&proc, PMIX_NODE_RANK, &lr, PMIX_UINT16);
        bad |= info_add(&proc, PMIX_NODEID, &zero, PMIX_UINT32);
        bad |= info_add(&proc, PMIX_HOSTNAME, host, PMIX_STRING);
        bad |= info_add_array(&job, PMIX_PROC_INFO_ARRAY, &proc);
    }
    free(peers);
    free(node_map);
    free(proc_map);
    if (bad) {
        info_free(&job);
        return errprintf(err, "building the PMIx job description failed (out of memory?)");
    }
    op_wait_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        info_free(&job);
        return errprintf(err, "out of memory");
    }
    rc = op_wait(w, PMIx_server_register_nspace(h->nspace, l->world, job.v, job.n, op_done, w));
    if (rc != PMIX_ERR_TIMEOUT) /* after a timeout PMIx may still read it */
        info_free(&job);
    if (rc != PMIX_SUCCESS)
        return errprintf(err, "PMIx_server_register_nspace(%s): %s", h->nspace,
                         PMIx_Error_string(rc));
    h->registered = true;
    return 0;
}

int host_start(pmix_host_t **out, const char *nspace, const bmt_layout_t *l, int notify_fd,
               bmt_error_t *err)
{
    if (l->world > UINT16_MAX)
        return errprintf(err, "local mode hosts at most %d ranks on one machine, not %d",
                         UINT16_MAX, l->world);
    pmix_host_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return errprintf(err, "out of memory");
    h->world = l->world;
    h->l = *l;
    snprintf(h->nspace, sizeof(h->nspace), "%s", nspace);
    const char *base = getenv("TMPDIR");
    snprintf(h->tmpdir, sizeof(h->tmpdir), "%s/bmlaunch.XXXXXX", base && *base ? base : "/tmp");
    if (mkdtemp(h->tmpdir) == NULL) {
        int e = errno;
        free(h);
        return errprintf(err, "cannot make a private directory for the PMIx server under %s: %s",
                         base && *base ? base : "/tmp", strerror(e));
    }
    host_notify_fd = notify_fd;
    pmix_info_t info[3];
    pmix_rank_t server_rank = 0;
    char server_ns[PMIX_MAX_NSLEN + 1];
    snprintf(server_ns, sizeof(server_ns), "%s.server", nspace);
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_CONSTRUCT(&info[2]);
    PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, h->tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[1], PMIX_SERVER_NSPACE, server_ns, PMIX_STRING);
    PMIX_INFO_LOAD(&info[2], PMIX_SERVER_RANK, &server_rank, PMIX_PROC_RANK);
    pmix_status_t rc = PMIx_server_init(&host_module, info, 3);
    for (int i = 0; i < 3; i++)
        PMIX_INFO_DESTRUCT(&info[i]);
    if (rc != PMIX_SUCCESS) {
        nftw(h->tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        free(h);
        return errprintf(err, "PMIx_server_init: %s", PMIx_Error_string(rc));
    }
    if (register_job(h, l, err) < 0) {
        host_stop(h);
        return -1;
    }
    *out = h;
    return 0;
}

int host_setup_rank(pmix_host_t *h, int rank, char ***envp, bmt_error_t *err)
{
    pmix_proc_t proc;
    PMIX_PROC_CONSTRUCT(&proc);
    PMIX_LOAD_PROCID(&proc, h->nspace, (pmix_rank_t)rank);
    op_wait_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return errprintf(err, "out of memory");
    pmix_status_t rc =
        op_wait(w, PMIx_server_register_client(&proc, geteuid(), getegid(), NULL, op_done, w));
    if (rc != PMIX_SUCCESS)
        return errprintf(err, "PMIx_server_register_client(rank %d): %s", rank,
                         PMIx_Error_string(rc));
    rc = PMIx_server_setup_fork(&proc, envp);
    if (rc != PMIX_SUCCESS)
        return errprintf(err, "PMIx_server_setup_fork(rank %d): %s", rank, PMIx_Error_string(rc));
    return 0;
}

/* The shared-memory segments the job's ranks left in /dev/shm. libbmt names
 * them /bmt-<job hash>-<comm id> (runtime/hash.h, comm_shm.c) and unlinks each
 * once all its ranks have attached; a rank that died before attaching, while
 * its creator waited (and was then ended), left it there for good (8 MiB and
 * more a communicator). Called when the run's ranks are gone. */
static void remove_job_segments(const char *nspace)
{
    char prefix[40];
    const int n = snprintf(prefix, sizeof(prefix), "bmt-%016llx-",
                           (unsigned long long)job_hash_of(nspace, (uint64_t)getuid()));
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, (size_t)n) == 0) {
            char name[300];
            snprintf(name, sizeof(name), "/%.250s", e->d_name);
            shm_unlink(name);
        }
    closedir(d);
}

static void deregister_job(pmix_host_t *h)
{
    if (!h->registered)
        return;
    /* Deregistering the namespace also releases its clients. */
    op_wait_t *w = calloc(1, sizeof(*w));
    if (w) {
        PMIx_server_deregister_nspace(h->nspace, op_done, w);
        op_wait(w, PMIX_SUCCESS);
    }
    remove_job_segments(h->nspace);
    h->registered = false;
}

int host_renew(pmix_host_t *h, const char *nspace, bmt_error_t *err)
{
    deregister_job(h);
    snprintf(h->nspace, sizeof(h->nspace), "%s", nspace);
    return register_job(h, &h->l, err);
}

/* PMIx_server_finalize, bounded. libpmix 4.2 (Debian 12's) can deadlock in
 * it: `make check` once (2026-12-05) left bmlaunch for 15 minutes in
 * PMIx_server_finalize -> pthread_mutex_lock on a lock whose memory held
 * heap pointers (an object its progress thread had freed), after ranks that
 * failed right after PMIx_Init; openpmix has fixed finalize hangs of this
 * kind before (#1244, #1246). By then the job is over and its status known:
 * so finalize runs on a thread of its own, and if it has not returned
 * within FINALIZE_WAIT_S the launcher says so and goes on without it
 * (host_finalize_stuck: main then ends with _exit, so that no exit-time code
 * meets the stuck lock). BMLAUNCH_FAULT=finalize-hang (tests only) makes the
 * thread block instead of finalizing. */
#define FINALIZE_WAIT_S 10
static atomic_bool finalize_stuck;
static pthread_mutex_t fin_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fin_cv = PTHREAD_COND_INITIALIZER;
static bool fin_done;

static void *finalize_main(void *arg)
{
    (void)arg;
    const char *f = getenv("BMLAUNCH_FAULT");
    if (f && strcmp(f, "finalize-hang") == 0)
        for (;;)
            pause();
    PMIx_server_finalize();
    pthread_mutex_lock(&fin_mu);
    fin_done = true;
    pthread_cond_signal(&fin_cv);
    pthread_mutex_unlock(&fin_mu);
    return NULL;
}

static void finalize_bounded(void)
{
    pthread_t t;
    fin_done = false;
    if (pthread_create(&t, NULL, finalize_main, NULL) != 0) {
        PMIx_server_finalize(); /* no thread to spare: unbounded, as before */
        return;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FINALIZE_WAIT_S;
    pthread_mutex_lock(&fin_mu);
    int rc = 0;
    while (!fin_done && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&fin_cv, &fin_mu, &until);
    const bool done = fin_done;
    pthread_mutex_unlock(&fin_mu);
    if (done) {
        pthread_join(t, NULL);
        return;
    }
    pthread_detach(t);
    atomic_store(&finalize_stuck, true);
    fprintf(stderr,
            "bmlaunch: PMIx_server_finalize did not return within %d s (a libpmix hang); "
            "the job is over, so bmlaunch exits without it\n",
            FINALIZE_WAIT_S);
}

bool host_finalize_stuck(void) { return atomic_load(&finalize_stuck); }

int host_check_env(bmt_error_t *err)
{
    const char *f = getenv("BMLAUNCH_FAULT");
    if (f && *f && strcmp(f, "finalize-hang") != 0)
        return errprintf(err,
                         "BMLAUNCH_FAULT is '%.100s': its one value is finalize-hang (a test hook, "
                         "docs/env.md); unset it",
                         f);
    return 0;
}

void host_stop(pmix_host_t *h)
{
    if (h == NULL)
        return;
    deregister_job(h);
    finalize_bounded();
    nftw(h->tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(h);
}
