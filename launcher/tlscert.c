/* launcher/tlscert.c — the metrics endpoint's certificate (tlscert.h).
 *
 * A generated certificate is its own CA (basicConstraints CA:TRUE with
 * keyCertSign): clients load it as their only trust anchor and then accept
 * exactly this one server, whatever host name their URL carries (bmlaunch
 * --rank-exec rewrites 0.0.0.0 to each node's view of the launching node).
 * OpenSSL, GnuTLS and Python's ssl all take a self-signed CA certificate as
 * anchor without extra flags, which a CA:FALSE leaf would need (OpenSSL's
 * partial chains). The SANs serve the clients that do check names (Prometheus
 * scraping by host name with ca_file). Layer: launcher only.
 */
#include "tlscert.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

bool tlscert_wanted(tls_mode_t mode, const char *bind)
{
    if (mode != TLS_AUTO)
        return mode == TLS_ON;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, bind, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) != 127;
    if (inet_pton(AF_INET6, bind, &a6) == 1)
        return !IN6_IS_ADDR_LOOPBACK(&a6) && !(IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return true; /* not an address we know to be local */
}

void tlscert_free(tlscert_t *t)
{
    if (t == NULL)
        return;
    if (t->key_pem)
        explicit_bzero(t->key_pem, strlen(t->key_pem));
    free(t->key_pem);
    free(t->cert_pem);
    t->key_pem = t->cert_pem = NULL;
}

/* A copy of a GnuTLS datum as a C string (the datum is freed). */
static char *datum_str(gnutls_datum_t *d, bool secret)
{
    char *s = malloc(d->size + 1u);
    if (s) {
        memcpy(s, d->data, d->size);
        s[d->size] = '\0';
    }
    if (secret)
        explicit_bzero(d->data, d->size);
    gnutls_free(d->data);
    d->data = NULL;
    return s;
}

int tlscert_generate(tlscert_t *t, const char *host, const char *const *ips, int nips,
                     bmt_error_t *err)
{
    *t = (tlscert_t){ 0 };
    gnutls_x509_privkey_t key = NULL;
    gnutls_x509_crt_t crt = NULL;
    gnutls_datum_t kd = { 0 }, cd = { 0 };
    const char *call = "gnutls_x509_privkey_init";
    int rc = gnutls_x509_privkey_init(&key);
#define STEP(name, expr)                                                                           \
    do {                                                                                           \
        if (rc >= 0) {                                                                             \
            call = (name);                                                                         \
            rc = (expr);                                                                           \
        }                                                                                          \
    } while (0)
    STEP("gnutls_x509_privkey_generate",
         gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA,
                                      GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0));
    STEP("gnutls_x509_crt_init", gnutls_x509_crt_init(&crt));
    STEP("gnutls_x509_crt_set_version", gnutls_x509_crt_set_version(crt, 3));
    unsigned char serial[16];
    if (rc >= 0 && getrandom(serial, sizeof(serial), 0) != (ssize_t)sizeof(serial)) {
        rc = GNUTLS_E_RANDOM_FAILED;
        call = "getrandom";
    }
    serial[0] &= 0x7f; /* a positive INTEGER */
    STEP("gnutls_x509_crt_set_serial", gnutls_x509_crt_set_serial(crt, serial, sizeof(serial)));
    time_t now = time(NULL);
    STEP("gnutls_x509_crt_set_activation_time",
         gnutls_x509_crt_set_activation_time(crt, now - 3600));
    STEP("gnutls_x509_crt_set_expiration_time",
         gnutls_x509_crt_set_expiration_time(crt, now + TLSCERT_DAYS * 86400L));
    STEP("gnutls_x509_crt_set_dn_by_oid",
         gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, host,
                                       (unsigned)strlen(host)));
    STEP("gnutls_x509_crt_set_dn_by_oid",
         gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_ORGANIZATION_NAME, 0,
                                       "bmlaunch metrics (one job)", 26));
    STEP("gnutls_x509_crt_set_key", gnutls_x509_crt_set_key(crt, key));
    STEP("gnutls_x509_crt_set_basic_constraints", gnutls_x509_crt_set_basic_constraints(crt, 1, 0));
    STEP("gnutls_x509_crt_set_key_usage",
         gnutls_x509_crt_set_key_usage(crt,
                                       GNUTLS_KEY_DIGITAL_SIGNATURE | GNUTLS_KEY_KEY_CERT_SIGN));
    STEP("gnutls_x509_crt_set_key_purpose_oid",
         gnutls_x509_crt_set_key_purpose_oid(crt, GNUTLS_KP_TLS_WWW_SERVER, 0));
    STEP("gnutls_x509_crt_set_subject_alt_name",
         gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, host, (unsigned)strlen(host),
                                              GNUTLS_FSAN_APPEND));
    if (strcmp(host, "localhost") != 0)
        STEP("gnutls_x509_crt_set_subject_alt_name",
             gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, "localhost", 9,
                                                  GNUTLS_FSAN_APPEND));
    for (int i = 0; i < nips && rc >= 0; i++) {
        unsigned char raw[16];
        unsigned len = 4;
        if (inet_pton(AF_INET, ips[i], raw) != 1) {
            len = 16;
            if (inet_pton(AF_INET6, ips[i], raw) != 1) {
                gnutls_x509_crt_deinit(crt);
                gnutls_x509_privkey_deinit(key);
                return errprintf(err, "certificate: '%.100s' is not a numeric IP address", ips[i]);
            }
        }
        STEP("gnutls_x509_crt_set_subject_alt_name",
             gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, raw, len,
                                                  GNUTLS_FSAN_APPEND));
    }
    unsigned char kid[64];
    size_t kidlen = sizeof(kid);
    STEP("gnutls_x509_crt_get_key_id", gnutls_x509_crt_get_key_id(crt, 0, kid, &kidlen));
    STEP("gnutls_x509_crt_set_subject_key_id",
         gnutls_x509_crt_set_subject_key_id(crt, kid, kidlen));
    STEP("gnutls_x509_crt_set_authority_key_id",
         gnutls_x509_crt_set_authority_key_id(crt, kid, kidlen));
    STEP("gnutls_x509_crt_sign2", gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0));
    STEP("gnutls_x509_crt_export2", gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &cd));
    STEP("gnutls_x509_privkey_export2_pkcs8",
         gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, NULL, GNUTLS_PKCS_PLAIN, &kd));
#undef STEP
    gnutls_x509_crt_deinit(crt);
    gnutls_x509_privkey_deinit(key);
    if (rc < 0) {
        if (kd.data)
            free(datum_str(&kd, true));
        gnutls_free(cd.data);
        return errprintf(err, "cannot make the metrics certificate: %s: %s", call,
                         gnutls_strerror(rc));
    }
    t->cert_pem = datum_str(&cd, false);
    t->key_pem = datum_str(&kd, true);
    if (t->cert_pem == NULL || t->key_pem == NULL) {
        tlscert_free(t);
        return errprintf(err, "out of memory for the metrics certificate");
    }
    return 0;
}

int tlscert_host_addrs(char (*addrs)[TLSCERT_ADDR_LEN], int max)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0)
        return 0;
    int n = 0;
    for (struct ifaddrs *p = ifa; p && n < max; p = p->ifa_next) {
        if (p->ifa_addr == NULL || !(p->ifa_flags & IFF_UP))
            continue;
        const void *a = NULL;
        int fam = p->ifa_addr->sa_family;
        if (fam == AF_INET)
            a = &((const struct sockaddr_in *)(const void *)p->ifa_addr)->sin_addr;
        else if (fam == AF_INET6) {
            const struct in6_addr *a6 =
                &((const struct sockaddr_in6 *)(const void *)p->ifa_addr)->sin6_addr;
            if (IN6_IS_ADDR_LINKLOCAL(a6)) /* needs a zone: useless in a URL's host */
                continue;
            a = a6;
        } else
            continue;
        if (inet_ntop(fam, a, addrs[n], TLSCERT_ADDR_LEN) == NULL)
            continue;
        bool dup = false;
        for (int i = 0; i < n && !dup; i++)
            dup = strcmp(addrs[i], addrs[n]) == 0;
        if (!dup)
            n++;
    }
    freeifaddrs(ifa);
    return n;
}

int tlscert_generate_for_host(tlscert_t *t, bmt_error_t *err)
{
    char host[256] = "localhost";
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
        snprintf(host, sizeof(host), "localhost");
    char addrs[64][TLSCERT_ADDR_LEN];
    const char *ips[64];
    int n = tlscert_host_addrs(addrs, 64);
    for (int i = 0; i < n; i++)
        ips[i] = addrs[i];
    return tlscert_generate(t, host, ips, n, err);
}

int tlscert_check(const char *cert_pem, const char *key_pem, bmt_error_t *err)
{
    gnutls_certificate_credentials_t cred = NULL;
    int rc = gnutls_certificate_allocate_credentials(&cred);
    if (rc < 0)
        return errprintf(err, "gnutls_certificate_allocate_credentials: %s", gnutls_strerror(rc));
    gnutls_datum_t c = { (unsigned char *)cert_pem, (unsigned)strlen(cert_pem) },
                   k = { (unsigned char *)key_pem, (unsigned)strlen(key_pem) };
    /* What libmicrohttpd does with MHD_OPTION_HTTPS_MEM_CERT/KEY: it fails on a
     * certificate or key that does not parse and on a key of another
     * certificate (GNUTLS_E_CERTIFICATE_KEY_MISMATCH). */
    rc = gnutls_certificate_set_x509_key_mem2(cred, &c, &k, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_certificate_free_credentials(cred);
    if (rc < 0)
        return errprintf(err, "%s",
                         rc == GNUTLS_E_CERTIFICATE_KEY_MISMATCH
                             ? "the private key does not belong to the certificate"
                             : gnutls_strerror(rc));
    gnutls_x509_crt_t crt = NULL;
    if (gnutls_x509_crt_init(&crt) < 0)
        return errprintf(err, "out of memory");
    rc = gnutls_x509_crt_import(crt, &c, GNUTLS_X509_FMT_PEM); /* the first one */
    if (rc < 0) {
        gnutls_x509_crt_deinit(crt);
        return errprintf(err, "the certificate: %s", gnutls_strerror(rc));
    }
    /* What the clients check (libcurl, Python's ssl, Prometheus): a certificate
     * they refuse would leave the job running with every push failing, so it
     * is refused here, before any rank starts. */
    time_t now = time(NULL), until = gnutls_x509_crt_get_expiration_time(crt),
           from = gnutls_x509_crt_get_activation_time(crt);
    const char *why = NULL;
    time_t when_t = 0;
    if (until != (time_t)-1 && until < now)
        why = "expired on", when_t = until;
    else if (from != (time_t)-1 && from > now)
        why = "is not valid before", when_t = from;
    unsigned usage = 0;
    bool rsa = gnutls_x509_crt_get_pk_algorithm(crt, NULL) == GNUTLS_PK_RSA;
    bool ku_bad = gnutls_x509_crt_get_key_usage(crt, &usage, NULL) >= 0 &&
                  !(usage & GNUTLS_KEY_DIGITAL_SIGNATURE) &&
                  !(rsa && (usage & GNUTLS_KEY_KEY_ENCIPHERMENT));
    /* An extended key usage, when present, must allow a TLS server. */
    bool eku = false, server = false;
    for (unsigned i = 0;; i++) {
        char oid[128];
        size_t on = sizeof(oid);
        int r = gnutls_x509_crt_get_key_purpose_oid(crt, i, oid, &on, NULL);
        if (r == GNUTLS_E_SHORT_MEMORY_BUFFER) {
            eku = true;
            continue;
        }
        if (r < 0)
            break;
        eku = true;
        server |= strcmp(oid, GNUTLS_KP_TLS_WWW_SERVER) == 0 || strcmp(oid, GNUTLS_KP_ANY) == 0;
    }
    gnutls_x509_crt_deinit(crt);
    if (why) {
        char when[32], clk[32];
        struct tm tm;
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&when_t, &tm));
        strftime(clk, sizeof(clk), "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&now, &tm));
        return errprintf(err, "the certificate %s %s (this host's clock reads %s)", why, when, clk);
    }
    if (ku_bad)
        return errprintf(err, "the certificate's key usage lacks digitalSignature, which a TLS "
                              "server's key needs: clients would refuse every connection");
    if (eku && !server)
        return errprintf(err, "the certificate's extended key usage lacks serverAuth (TLS web "
                              "server authentication): clients would refuse it as a server's");
    return 0;
}

/* The whole of a small text file, NUL-terminated (malloc'd), or NULL with err.
 * Opened without blocking and read only when it is a regular file: a FIFO
 * would block bmlaunch (its signals are blocked then) until a writer came. */
static char *read_text(const char *what, const char *path, bmt_error_t *err)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        errprintf(err, "%s %.200s: %s", what, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    int e = fstat(fd, &st) != 0 ? errno : 0;
    if (e != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errprintf(err, "%s %.200s: %s", what, path,
                  e                     ? strerror(e)
                  : S_ISDIR(st.st_mode) ? "is a directory; name the PEM file in it"
                                        : "not a regular file (a FIFO, socket or device); "
                                          "name a PEM file");
        return NULL;
    }
    size_t cap = 1u << 20, n = 0; /* a PEM chain is a few KiB */
    char *buf = malloc(cap + 1);
    int bad = buf == NULL ? ENOMEM : 0;
    while (!bad && n <= cap) {
        ssize_t r = read(fd, buf + n, cap + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            bad = errno;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (bad || n > cap) {
        free(buf);
        errprintf(err, "%s %.200s: %s", what, path,
                  bad ? strerror(bad) : "larger than 1 MiB: not a PEM file");
        return NULL;
    }
    buf[n] = '\0';
    if (strlen(buf) != n || strstr(buf, "-----BEGIN ") == NULL) {
        explicit_bzero(buf, n);
        free(buf);
        errprintf(err, "%s %.200s: not a PEM file (no -----BEGIN line)", what, path);
        return NULL;
    }
    return buf;
}

int tlscert_load(tlscert_t *t, const char *cert_path, const char *key_path, bmt_error_t *err)
{
    *t = (tlscert_t){ 0 };
    t->cert_pem = read_text("--metrics-cert", cert_path, err);
    if (t->cert_pem == NULL)
        return -1;
    t->key_pem = read_text("--metrics-key", key_path, err);
    if (t->key_pem == NULL) {
        tlscert_free(t);
        return -1;
    }
    if (strstr(t->cert_pem, "-----BEGIN CERTIFICATE-----") == NULL) {
        tlscert_free(t);
        return errprintf(err,
                         "--metrics-cert %.200s holds no certificate (-----BEGIN CERTIFICATE-----)",
                         cert_path);
    }
    if (strstr(t->key_pem, "ENCRYPTED") != NULL) {
        tlscert_free(t);
        return errprintf(err,
                         "--metrics-key %.200s is encrypted; give bmlaunch the key without "
                         "a passphrase (readable by you alone)",
                         key_path);
    }
    if (tlscert_check(t->cert_pem, t->key_pem, err) < 0) {
        tlscert_free(t);
        return errprefix(err, "--metrics-cert %.200s, --metrics-key %.200s: ", cert_path, key_path);
    }
    return 0;
}
