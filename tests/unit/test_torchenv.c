/* tests/unit/test_torchenv.c — torchrun's environment for the ranks (launcher/torchenv.c).
 *
 * The variables of a rank against torchrun's definitions for a 2-node layout,
 * the names bmlaunch drops from what ranks inherit (and those it must not), the
 * Slurm port's range and spread, the NodeAddr parser with its expected
 * failures, and the port reservation rank 0's TCPStore must still be able to
 * listen on. tests/integration/test_torch_launch.sh runs torch itself.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tap.h"
#include "torchenv.h"

static const char *find(char **env, int n, const char *name)
{
    size_t len = strlen(name);
    for (int i = 0; i < n; i++)
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return env[i] + len + 1;
    return NULL;
}

static void check_add(void)
{
    bmt_layout_t l;
    bmt_error_t err;
    ok(bmt_layout_make(&l, 2, 4, 4, 0, &err) == 0, "layout 2 x 4 on nodes of 4");
    torchenv_t t = { .master_addr = "10.0.0.1",
                     .master_port = 29512,
                     .restart = 2,
                     .max_restarts = 3,
                     .run_id = "slurm.42" };
    char *env[TORCHENV_MAX + 1] = { 0 };
    int n = torchenv_add(env, &t, &l, 5);
    ok(n > 0 && n <= TORCHENV_MAX, "rank 5: %d variables, at most TORCHENV_MAX", n);
    static const char *const want[][2] = {
        { "RANK", "5" },
        { "WORLD_SIZE", "8" },
        { "LOCAL_RANK", "1" },
        { "LOCAL_WORLD_SIZE", "4" },
        { "GROUP_RANK", "1" },
        { "NODE_RANK", "1" },
        { "GROUP_WORLD_SIZE", "2" },
        { "ROLE_RANK", "5" },
        { "ROLE_WORLD_SIZE", "8" },
        { "ROLE_NAME", "default" },
        { "MASTER_ADDR", "10.0.0.1" },
        { "MASTER_PORT", "29512" },
        { "TORCHELASTIC_RESTART_COUNT", "2" },
        { "TORCHELASTIC_MAX_RESTARTS", "3" },
        { "TORCHELASTIC_RUN_ID", "slurm.42" },
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *v = find(env, n, want[i][0]);
        is_str(v ? v : "(unset)", want[i][1], want[i][0]);
    }
    for (int i = 0; i < n; i++)
        free(env[i]);

    /* srun's environment: the job's only; the wrapper adds the rank's. */
    torchenv_t none = { .run_id = NULL };
    n = torchenv_add(env, &none, &l, -1);
    ok(find(env, n, "RANK") == NULL && find(env, n, "LOCAL_RANK") == NULL &&
           find(env, n, "GROUP_RANK") == NULL,
       "rank -1 (srun): no per-rank variable");
    ok(find(env, n, "MASTER_ADDR") == NULL && find(env, n, "MASTER_PORT") == NULL,
       "unknown master: MASTER_ADDR and MASTER_PORT unset, not empty");
    is_str(find(env, n, "TORCHELASTIC_RUN_ID"), "none", "no run id: torchrun's default none");
    for (int i = 0; i < n; i++)
        ok(torchenv_is_ours(env[i]), "%s is one bmlaunch drops from inherited values", env[i]);
    for (int i = 0; i < n; i++)
        free(env[i]);

    setenv("RANK", "77", 1);
    torchenv_setenv_rank(&l, 6);
    is_str(getenv("RANK"), "6", "--rank-exec: RANK of rank 6");
    is_str(getenv("LOCAL_RANK"), "2", "--rank-exec: LOCAL_RANK of rank 6");
    is_str(getenv("GROUP_RANK"), "1", "--rank-exec: GROUP_RANK (the node) of rank 6");
}

static void check_is_ours(void)
{
    static const struct {
        const char *entry;
        bool ours;
    } cases[] = {
        { "RANK=3", true },
        { "TORCHELASTIC_USE_AGENT_STORE=True", true },
        { "TORCHELASTIC_ERROR_FILE=/tmp/x", true },
        { "MASTER_PORT=", true },
        /* expected failures: look-alikes and the user's knobs stay */
        { "RANKS=3", false },
        { "BMT_RANK=3", false },
        { "OMP_NUM_THREADS=1", false },
        { "NCCL_SOCKET_IFNAME=eth0", false },
        { "GLOO_SOCKET_IFNAME=eth0", false },
        { "MASTER=1", false },
        { "", false },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ok(torchenv_is_ours(cases[i].entry) == cases[i].ours, "'%s' %s", cases[i].entry,
           cases[i].ours ? "is dropped" : "passes through");
}

static void check_port_for(void)
{
    static char seen[TORCHENV_PORT_SPAN];
    bool in_range = true;
    int reused = 0, p0 = torchenv_port_for("1234", 99, 0);
    for (int r = 0; r < TORCHENV_PORT_SPAN; r++) {
        int p = torchenv_port_for("1234", 99, r);
        if (p < TORCHENV_PORT_BASE || p >= TORCHENV_PORT_BASE + TORCHENV_PORT_SPAN) {
            in_range = false;
            continue;
        }
        reused += seen[p - TORCHENV_PORT_BASE]++ > 0;
    }
    ok(in_range, "%d runs: every port in [%d, %d)", TORCHENV_PORT_SPAN, TORCHENV_PORT_BASE,
       TORCHENV_PORT_BASE + TORCHENV_PORT_SPAN);
    is_int(reused, 0, "no port reused within TORCHENV_PORT_SPAN runs of one bmlaunch");
    is_int(torchenv_port_for("1234", 99, 0), p0, "deterministic");
    ok(torchenv_port_for("1234", 100, 0) != p0 || torchenv_port_for("1235", 99, 0) != p0,
       "another bmlaunch or job: another port");
}

static void check_nodeaddr(void)
{
    char a[64];
    static const struct {
        const char *out, *want; /* want NULL: -1 expected */
    } cases[] = {
        { "NodeName=node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.200.0.11 NodeHostName=node1",
          "10.200.0.11" },
        { "NodeName=vm NodeAddr=127.0.0.1\n", "127.0.0.1" },
        { "NodeName=gpu01 NodeAddr=gpu01-ib NodeHostName=gpu01", "gpu01-ib" },
        /* expected failures */
        { "NodeName=node1 NodeHostName=node1", NULL },
        { "NodeName=node1 NodeAddr= NodeHostName=node1", NULL },
        { "XNodeAddr=1.2.3.4", NULL },
        { "", NULL },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = torchenv_parse_nodeaddr(cases[i].out, a, sizeof(a));
        if (cases[i].want)
            ok(rc == 0 && strcmp(a, cases[i].want) == 0, "NodeAddr %s", cases[i].want);
        else
            ok(rc == -1, "no NodeAddr in '%.40s'", cases[i].out);
    }
    char tiny[4];
    ok(torchenv_parse_nodeaddr("NodeAddr=10.0.0.1", tiny, sizeof(tiny)) == -1,
       "an address longer than the buffer is refused, not cut");
}

static void check_reserve(void)
{
    bmt_error_t err = { { 0 } };
    int fd = -1;
    int port = torchenv_port_reserve(&fd, &err);
    ok(port > 0 && fd >= 0, "a port reserved (%d)", port);
    /* What rank 0's TCPStore does while bmlaunch holds the port. */
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_ANY),
                             .sin_port = htons((uint16_t)port) };
    ok(bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(s, 1) == 0,
       "a SO_REUSEADDR listener binds the reserved port");
    /* ...and rank 0's check then sees it taken (a second store would fail). */
    ok(torchenv_check_master("127.0.0.1", port, &err) == -1 && strstr(err.text, "MASTER_PORT"),
       "the check refuses a port with a listener: %s", err.text);
    close(s);
    close(fd);
    ok(torchenv_check_master("127.0.0.1", port, &err) == 0, "a free port on 127.0.0.1 passes");
    ok(torchenv_check_master("192.0.2.1", port, &err) == -1 && strstr(err.text, "not an address"),
       "an address of another machine is refused: %s", err.text);
}

int main(void)
{
    check_add();
    check_is_ours();
    check_port_for();
    check_nodeaddr();
    check_reserve();
    return done_testing();
}
