/* launcher/torchenv.c — torchrun's environment for every rank (PyTorch jobs).
 *
 * Launcher layer, below main.c and slurm.c, above the pure layout. The names
 * and meanings are torchrun's (torch.distributed.run and its elastic agent), so
 * that init_process_group("env://") works unchanged; see torchenv.h for the
 * list and for why MASTER_PORT is chosen as it is in each mode.
 */
#include "torchenv.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "slurm.h"

/* Set for every rank (job-wide, then per rank), and dropped from what ranks
 * inherit; the last two are only dropped. */
static const char *const job_names[] = {
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    NULL,
};
static const char *const rank_names[] = {
    "RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "ROLE_RANK", NULL,
};
static const char *const dropped_names[] = {
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    NULL,
};

static bool in_list(const char *const *names, const char *entry, size_t len)
{
    for (; *names; names++)
        if (strlen(*names) == len && strncmp(*names, entry, len) == 0)
            return true;
    return false;
}

bool torchenv_is_ours(const char *entry)
{
    const char *eq = strchr(entry, '=');
    size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
    return in_list(job_names, entry, len) || in_list(rank_names, entry, len) ||
           in_list(dropped_names, entry, len);
}

/* The per-rank values, in rank_names' order. */
static void rank_values(const bmt_layout_t *l, int rank, int v[5])
{
    bmt_rank_info_t ri = bmt_layout_rank(l, rank);
    v[0] = rank;
    v[1] = ri.local_rank;
    v[2] = ri.node;
    v[3] = ri.node;
    v[4] = rank;
}

int torchenv_add(char **env, const torchenv_t *t, const bmt_layout_t *l, int rank)
{
    int k = 0;
    char buf[400];
#define TE_ADD(...)                                                                                \
    do {                                                                                           \
        snprintf(buf, sizeof(buf), __VA_ARGS__);                                                   \
        if ((env[k] = strdup(buf)) != NULL)                                                        \
            k++;                                                                                   \
    } while (0)
    TE_ADD("WORLD_SIZE=%d", l->world);
    TE_ADD("LOCAL_WORLD_SIZE=%d", l->gpus_per_node);
    TE_ADD("GROUP_WORLD_SIZE=%d", l->nodes);
    TE_ADD("ROLE_WORLD_SIZE=%d", l->world);
    TE_ADD("ROLE_NAME=default");
    if (t->master_addr[0])
        TE_ADD("MASTER_ADDR=%s", t->master_addr);
    if (t->master_port > 0)
        TE_ADD("MASTER_PORT=%d", t->master_port);
    TE_ADD("TORCHELASTIC_RESTART_COUNT=%d", t->restart);
    TE_ADD("TORCHELASTIC_MAX_RESTARTS=%d", t->max_restarts);
    TE_ADD("TORCHELASTIC_RUN_ID=%s", t->run_id ? t->run_id : "none");
    if (rank >= 0) {
        int v[5];
        rank_values(l, rank, v);
        for (int i = 0; rank_names[i]; i++)
            TE_ADD("%s=%d", rank_names[i], v[i]);
    }
#undef TE_ADD
    return k;
}

void torchenv_setenv_rank(const bmt_layout_t *l, int rank)
{
    int v[5];
    rank_values(l, rank, v);
    for (int i = 0; rank_names[i]; i++) {
        char buf[16];
        snprintf(buf, sizeof(buf), "%d", v[i]);
        setenv(rank_names[i], buf, 1);
    }
}

int torchenv_port_reserve(int *fd_out, bmt_error_t *err)
{
    /* Bound with SO_REUSEADDR on the wildcard address and never listened on:
     * while it is bound, the kernel hands the port to no other bind(0) and no
     * outgoing connection, yet rank 0's TCPStore (SO_REUSEADDR too) may bind
     * and listen on it. So the port cannot be taken between this pick and rank
     * 0's bind, however long torch takes to import. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errprintf(err, "MASTER_PORT: socket: %s", strerror(errno));
    int one = 1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
    socklen_t len = sizeof(a);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        return errprintf(err, "MASTER_PORT: cannot bind a free TCP port: %s", strerror(e));
    }
    *fd_out = fd;
    return ntohs(a.sin_port);
}

int torchenv_port_for(const char *job_id, long pid, int restart)
{
    /* FNV-1a of "job.pid" picks where a bmlaunch starts in the range (another
     * bmlaunch in the same allocation starts elsewhere); each restart steps by
     * a prime that does not divide the span, so TORCHENV_PORT_SPAN runs in a
     * row never reuse a port. */
    char key[200];
    snprintf(key, sizeof(key), "%.150s.%ld", job_id, pid);
    uint32_t h = 2166136261u;
    for (const char *p = key; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 16777619u;
    }
    uint64_t step = (uint64_t)(restart < 0 ? 0 : restart) * 7919u;
    return TORCHENV_PORT_BASE + (int)((h + step) % TORCHENV_PORT_SPAN);
}

int torchenv_check_master(const char *addr, int port, bmt_error_t *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(addr, NULL, &hints, &res);
    if (rc != 0)
        return errprintf(err, "MASTER_ADDR %.200s does not resolve here: %s", addr,
                         gai_strerror(rc));
    bool local = false;
    for (struct addrinfo *ai = res; ai && !local; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        local = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0; /* port 0: any */
        close(fd);
    }
    freeaddrinfo(res);
    if (!local)
        return errprintf(err, "MASTER_ADDR %.200s is not an address of this node (rank 0's)", addr);
    /* As torch's TCPStore listens: every address, SO_REUSEADDR. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errprintf(err, "MASTER_PORT: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_ANY),
                             .sin_port = htons((uint16_t)port) };
    int e = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 1) == 0 ? 0 : errno;
    close(fd);
    if (e != 0)
        return errprintf(err, "MASTER_PORT %d cannot be listened on here: %s", port, strerror(e));
    return 0;
}

int torchenv_parse_nodeaddr(const char *out, char *addr, size_t len)
{
    const char *p = out;
    while ((p = strstr(p, "NodeAddr=")) != NULL) {
        if (p == out || p[-1] == ' ' || p[-1] == '\n' || p[-1] == '\t')
            break;
        p++;
    }
    if (p == NULL)
        return -1;
    p += strlen("NodeAddr=");
    size_t n = strcspn(p, " \t\n");
    if (n == 0 || n >= len)
        return -1;
    memcpy(addr, p, n);
    addr[n] = '\0';
    return 0;
}

int torchenv_slurm_master_addr(const char *nodelist, char *out, size_t len, bmt_error_t *err)
{
    char buf[8192];
    char *hosts[] = { "scontrol", "show", "hostnames", (char *)nodelist, NULL };
    int rc = slurm_command(hosts, 10, buf, sizeof(buf));
    if (rc != 0 || buf[0] == '\0')
        return errprintf(err, "scontrol show hostnames %.200s: %.300s", nodelist,
                         buf[0] ? buf : "failed with no output");
    char node[256];
    snprintf(node, sizeof(node), "%.*s", (int)strcspn(buf, "\n"), buf);
    char *show[] = { "scontrol", "show", "node", "-o", node, NULL };
    rc = slurm_command(show, 10, buf, sizeof(buf));
    if (rc != 0)
        return errprintf(err, "scontrol show node -o %s: %.300s", node,
                         buf[0] ? buf : "failed with no output");
    if (torchenv_parse_nodeaddr(buf, out, len) < 0)
        snprintf(out, len, "%s", node); /* no NodeAddr: the name is the address */
    return 0;
}
