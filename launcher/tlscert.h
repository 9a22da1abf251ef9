/* launcher/tlscert.h — the metrics endpoint's TLS certificate (GnuTLS).
 *
 * When the endpoint serves other machines (multi-node Slurm mode binds
 * 0.0.0.0), the ranks' bearer token must not cross the network in clear text.
 * bmlaunch then serves HTTPS with either a certificate made for the job alone
 * (tlscert_generate: a fresh ECDSA P-256 key that never leaves bmlaunch, and a
 * self-signed certificate the ranks get in BMT_METRICS_CA_PEM and pin) or the
 * operator's own (--metrics-cert/--metrics-key, tlscert_load). docs/metrics.md
 * states the contract for clients. Layer: launcher only.
 */
#ifndef BMT_LAUNCHER_TLSCERT_H
#define BMT_LAUNCHER_TLSCERT_H

#include <stdbool.h>

#include "bmt/error.h"

/* --metrics-tls: auto (the default) is on when the endpoint binds an address
 * other machines can reach, off on a loopback address. */
typedef enum {
    TLS_AUTO = 0,
    TLS_ON,
    TLS_OFF
} tls_mode_t;

/* Does mode want TLS for an endpoint bound to bind (a numeric address)? Auto:
 * yes unless bind is loopback (127.0.0.0/8, ::1). Pure. */
bool tlscert_wanted(tls_mode_t mode, const char *bind);

/* Validity of a generated certificate: longer than any job, since the clients
 * check it on every push and one that expired mid-job would drop every push
 * from then on (the key lives only as long as bmlaunch, so a long validity
 * costs nothing); at most 398 days, which browsers take. */
#define TLSCERT_DAYS 365

typedef struct tlscert {
    char *cert_pem; /* the certificate (a chain for a loaded one), PEM, NUL-terminated */
    char *key_pem;  /* its private key, PEM (PKCS#8 for a generated one) */
} tlscert_t;

/* Make a new key and a self-signed certificate for it (CA:TRUE, so that it is
 * its own trust anchor; key usage digitalSignature + keyCertSign; extended key
 * usage serverAuth; valid from an hour ago (clocks of nodes differ) for
 * TLSCERT_DAYS days). Subject CN and a DNS name: host; more DNS names:
 * "localhost"; IP address names: the nips numeric addresses of ips (IPv4 or
 * IPv6; one that does not parse is an error). Fills t (free with
 * tlscert_free). Returns 0, or -1 with err (t is then empty). */
int tlscert_generate(tlscert_t *t, const char *host, const char *const *ips, int nips,
                     bmt_error_t *err);

/* The numeric addresses of this host's interfaces (getifaddrs: IPv4 and IPv6,
 * loopback included, link-local IPv6 left out), at most max of them, each into
 * a buffer of 46 bytes. Returns how many. */
#define TLSCERT_ADDR_LEN 46
int tlscert_host_addrs(char (*addrs)[TLSCERT_ADDR_LEN], int max);

/* tlscert_generate for this host: its name (gethostname) and the addresses
 * of its interfaces (tlscert_host_addrs, at most 64). */
int tlscert_generate_for_host(tlscert_t *t, bmt_error_t *err);

/* Read the operator's certificate (PEM, the server's first, then any
 * intermediates) and private key (PEM, not encrypted) and check them as a TLS
 * server would: they parse, the key belongs to the first certificate, and that
 * certificate has not expired. Fills t. Returns 0, or -1 with err naming the
 * file and the cause (t is then empty). */
int tlscert_load(tlscert_t *t, const char *cert_path, const char *key_path, bmt_error_t *err);

/* Do cert_pem (first certificate) and key_pem form a usable pair? 0, or -1
 * with err. */
int tlscert_check(const char *cert_pem, const char *key_pem, bmt_error_t *err);

/* Free what t holds (the key is wiped first) and empty it. NULL: no-op. */
void tlscert_free(tlscert_t *t);

#endif
