/* tests/unit/test_tlscert.c — launcher/tlscert.c: the metrics endpoint's
 * certificate. A generated one is parsed back with GnuTLS: its key is the one
 * generated with it, it signs itself and verifies as its own trust anchor, it
 * names the host and the addresses given (SANs), it is a CA for itself and a
 * TLS server, and it is valid now for TLSCERT_DAYS days. Two generations
 * differ (a new key per job). The operator's files: a good pair loads; the
 * expected failures (missing file, not PEM, a key of another certificate, an
 * encrypted key, an expired certificate, one not valid yet, key usages a TLS
 * client refuses, a directory, a FIFO) are refused with the cause. When to
 * serve TLS (tlscert_wanted) is a table. The HTTPS server itself is driven in
 * tests/integration/test_monitor.sh.
 */
#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "tlscert.h"

static void check_wanted(void)
{
    static const struct {
        tls_mode_t mode;
        const char *bind;
        bool want;
    } t[] = {
        { TLS_AUTO, "127.0.0.1", false }, { TLS_AUTO, "127.1.2.3", false },
        { TLS_AUTO, "::1", false },       { TLS_AUTO, "0.0.0.0", true },
        { TLS_AUTO, "::", true },         { TLS_AUTO, "10.0.0.5", true },
        { TLS_AUTO, "fd00::2", true },    { TLS_ON, "127.0.0.1", true },
        { TLS_OFF, "0.0.0.0", false },    { TLS_AUTO, "::ffff:127.0.0.1", false },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        ok(tlscert_wanted(t[i].mode, t[i].bind) == t[i].want, "mode %d on %s: TLS %s", t[i].mode,
           t[i].bind, t[i].want ? "on" : "off");
}

static gnutls_x509_crt_t parse_crt(const char *pem)
{
    gnutls_x509_crt_t crt = NULL;
    gnutls_datum_t d = { (unsigned char *)pem, (unsigned)strlen(pem) };
    if (gnutls_x509_crt_init(&crt) < 0 || gnutls_x509_crt_import(crt, &d, GNUTLS_X509_FMT_PEM) < 0)
        return NULL;
    return crt;
}

static bool has_san(gnutls_x509_crt_t crt, int type, const void *want, size_t len)
{
    for (unsigned seq = 0;; seq++) {
        unsigned char buf[256];
        size_t n = sizeof(buf);
        int t = gnutls_x509_crt_get_subject_alt_name(crt, seq, buf, &n, NULL);
        if (t < 0)
            return false;
        if (t == type && n == len && memcmp(buf, want, len) == 0)
            return true;
    }
}

/* Write to path a self-signed certificate for key_pem, valid from..until, with
 * key usage ku (0: none) and extended key usage eku (NULL: none). */
static void write_crt(const char *path, const char *key_pem, time_t from, time_t until, unsigned ku,
                      const char *eku)
{
    gnutls_x509_crt_t c = NULL;
    gnutls_x509_privkey_t k = NULL;
    gnutls_datum_t d = { (unsigned char *)key_pem, (unsigned)strlen(key_pem) }, out = { 0 };
    unsigned char serial[1] = { 7 };
    gnutls_x509_privkey_init(&k);
    gnutls_x509_privkey_import2(k, &d, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_x509_crt_init(&c);
    gnutls_x509_crt_set_version(c, 3);
    gnutls_x509_crt_set_serial(c, serial, 1);
    gnutls_x509_crt_set_dn_by_oid(c, GNUTLS_OID_X520_COMMON_NAME, 0, "op", 2);
    gnutls_x509_crt_set_key(c, k);
    gnutls_x509_crt_set_activation_time(c, from);
    gnutls_x509_crt_set_expiration_time(c, until);
    if (ku)
        gnutls_x509_crt_set_key_usage(c, ku);
    if (eku)
        gnutls_x509_crt_set_key_purpose_oid(c, eku, 0);
    gnutls_x509_crt_sign2(c, c, k, GNUTLS_DIG_SHA256, 0);
    gnutls_x509_crt_export2(c, GNUTLS_X509_FMT_PEM, &out);
    FILE *f = fopen(path, "w");
    if (f)
        fwrite(out.data, 1, out.size, f), fclose(f);
    gnutls_free(out.data);
    gnutls_x509_crt_deinit(c);
    gnutls_x509_privkey_deinit(k);
}

static void check_generate(void)
{
    const char *ips[] = { "127.0.0.1", "192.0.2.7", "fd00::2" };
    tlscert_t t;
    bmt_error_t err = { { 0 } };
    ok(tlscert_generate(&t, "node1.example", ips, 3, &err) == 0, "generated (%s)", err.text);
    ok(t.cert_pem && strncmp(t.cert_pem, "-----BEGIN CERTIFICATE-----", 27) == 0,
       "the certificate is PEM");
    ok(t.key_pem && strstr(t.key_pem, "-----BEGIN PRIVATE KEY-----"), "the key is PKCS#8 PEM");
    ok(tlscert_check(t.cert_pem, t.key_pem, &err) == 0, "key and certificate match (%s)", err.text);

    gnutls_x509_crt_t crt = parse_crt(t.cert_pem);
    ok(crt != NULL, "parses back");
    if (crt == NULL) {
        tlscert_free(&t);
        return;
    }
    /* The key: the private key's id is the certificate's. */
    gnutls_x509_privkey_t key = NULL;
    gnutls_datum_t kd = { (unsigned char *)t.key_pem, (unsigned)strlen(t.key_pem) };
    unsigned char id1[64], id2[64];
    size_t n1 = sizeof(id1), n2 = sizeof(id2);
    ok(gnutls_x509_privkey_init(&key) == 0 &&
           gnutls_x509_privkey_import2(key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0) == 0 &&
           gnutls_x509_privkey_get_pk_algorithm(key) == GNUTLS_PK_ECDSA &&
           gnutls_x509_privkey_get_key_id(key, 0, id1, &n1) == 0 &&
           gnutls_x509_crt_get_key_id(crt, 0, id2, &n2) == 0 && n1 == n2 &&
           memcmp(id1, id2, n1) == 0,
       "the key is ECDSA and its id is the certificate's");
    gnutls_x509_privkey_deinit(key);
    /* Its own trust anchor: verifies against itself alone. */
    unsigned status = 1;
    ok(gnutls_x509_crt_verify(crt, &crt, 1, 0, &status) == 0 && status == 0,
       "verifies with itself as the only CA (status %#x)", status);
    ok(gnutls_x509_crt_check_issuer(crt, crt) == 1, "self-signed");
    unsigned ca = 0;
    ok(gnutls_x509_crt_get_basic_constraints(crt, NULL, &ca, NULL) >= 0 && ca == 1, "CA:TRUE");
    unsigned usage = 0;
    ok(gnutls_x509_crt_get_key_usage(crt, &usage, NULL) >= 0 &&
           (usage & GNUTLS_KEY_DIGITAL_SIGNATURE) && (usage & GNUTLS_KEY_KEY_CERT_SIGN),
       "key usage: digital signature, certificate sign");
    char oid[64];
    size_t on = sizeof(oid);
    ok(gnutls_x509_crt_get_key_purpose_oid(crt, 0, oid, &on, NULL) == 0 &&
           strcmp(oid, GNUTLS_KP_TLS_WWW_SERVER) == 0,
       "extended key usage: TLS server");
    /* SANs: the host, localhost, each address (raw bytes). */
    ok(has_san(crt, GNUTLS_SAN_DNSNAME, "node1.example", 13), "SAN DNS node1.example");
    ok(has_san(crt, GNUTLS_SAN_DNSNAME, "localhost", 9), "SAN DNS localhost");
    unsigned char a4[4], b4[4], a6[16];
    inet_pton(AF_INET, "127.0.0.1", a4);
    inet_pton(AF_INET, "192.0.2.7", b4);
    inet_pton(AF_INET6, "fd00::2", a6);
    ok(has_san(crt, GNUTLS_SAN_IPADDRESS, a4, 4), "SAN IP 127.0.0.1");
    ok(has_san(crt, GNUTLS_SAN_IPADDRESS, b4, 4), "SAN IP 192.0.2.7");
    ok(has_san(crt, GNUTLS_SAN_IPADDRESS, a6, 16), "SAN IP fd00::2");
    unsigned char c4[4] = { 10, 0, 0, 1 };
    ok(!has_san(crt, GNUTLS_SAN_IPADDRESS, c4, 4), "no SAN for an address not given");
    ok(gnutls_x509_crt_check_hostname(crt, "node1.example") != 0,
       "GnuTLS: valid for node1.example");
    ok(gnutls_x509_crt_check_hostname(crt, "other.example") == 0, "... and not for another name");
    time_t now = time(NULL), from = gnutls_x509_crt_get_activation_time(crt),
           until = gnutls_x509_crt_get_expiration_time(crt);
    ok(from <= now && now - from <= 3700, "valid since about an hour ago");
    ok(until - now > (TLSCERT_DAYS - 1) * 86400L && until - now <= TLSCERT_DAYS * 86400L,
       "valid for %d days", TLSCERT_DAYS);
    /* The ranks check it on every push: one that expired a month into a job
     * dropped every push from then on while the job went on. */
    ok(until - now >= 364 * 86400L && until - now <= 398 * 86400L,
       "valid a year: longer than any job, no longer than browsers take");
    char cn[256];
    size_t cnl = sizeof(cn);
    ok(gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, cn, &cnl) == 0 &&
           strcmp(cn, "node1.example") == 0,
       "CN is the host");
    gnutls_x509_crt_deinit(crt);

    /* A new key and certificate each time. */
    tlscert_t u;
    ok(tlscert_generate(&u, "node1.example", NULL, 0, &err) == 0 &&
           strcmp(u.cert_pem, t.cert_pem) != 0 && strcmp(u.key_pem, t.key_pem) != 0,
       "a second generation differs");
    ok(tlscert_check(t.cert_pem, u.key_pem, &err) == -1 && strstr(err.text, "does not belong"),
       "refused: the key of another certificate (%s)", err.text);
    tlscert_free(&u);

    /* For this host: its name and its addresses. */
    ok(tlscert_generate_for_host(&u, &err) == 0, "for this host (%s)", err.text);
    crt = parse_crt(u.cert_pem);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    ok(crt && has_san(crt, GNUTLS_SAN_DNSNAME, host, strlen(host)) &&
           has_san(crt, GNUTLS_SAN_IPADDRESS, a4, 4),
       "this host's certificate names %s and 127.0.0.1", host);
    gnutls_x509_crt_deinit(crt);
    tlscert_free(&u);

    const char *bad[] = { "node1" };
    ok(tlscert_generate(&u, "h", bad, 1, &err) == -1 && strstr(err.text, "'node1'") &&
           u.cert_pem == NULL,
       "refused: an address that is not numeric (%s)", err.text);

    /* The operator's files. */
    char dir[] = "/tmp/test_tlscert.XXXXXX";
    ok(mkdtemp(dir) != NULL, "temporary directory");
    char cpath[64], kpath[64], k2path[64], junk[64];
    snprintf(cpath, sizeof(cpath), "%s/c.pem", dir);
    snprintf(kpath, sizeof(kpath), "%s/k.pem", dir);
    snprintf(k2path, sizeof(k2path), "%s/k2.pem", dir);
    snprintf(junk, sizeof(junk), "%s/junk", dir);
    tlscert_generate(&u, "x", NULL, 0, &err);
    FILE *f;
    if ((f = fopen(cpath, "w")))
        fputs(t.cert_pem, f), fclose(f);
    if ((f = fopen(kpath, "w")))
        fputs(t.key_pem, f), fclose(f);
    if ((f = fopen(k2path, "w")))
        fputs(u.key_pem, f), fclose(f);
    if ((f = fopen(junk, "w")))
        fputs("hello\n", f), fclose(f);
    tlscert_t l;
    ok(tlscert_load(&l, cpath, kpath, &err) == 0 && strcmp(l.cert_pem, t.cert_pem) == 0,
       "a good pair loads (%s)", err.text);
    tlscert_free(&l);
    static const struct {
        int c, k; /* 0 cert, 1 key, 2 other key, 3 junk, 4 missing */
        const char *want;
    } fails[] = {
        { 4, 1, "No such file" },         { 0, 4, "No such file" },
        { 3, 1, "not a PEM file" },       { 0, 3, "not a PEM file" },
        { 1, 1, "holds no certificate" }, { 0, 2, "does not belong to the certificate" },
    };
    for (size_t i = 0; i < sizeof(fails) / sizeof(fails[0]); i++) {
        const char *paths[] = { cpath, kpath, k2path, junk, "/nonexistent/x.pem" };
        memset(&err, 0, sizeof(err));
        ok(tlscert_load(&l, paths[fails[i].c], paths[fails[i].k], &err) == -1 &&
               strstr(err.text, fails[i].want) && l.cert_pem == NULL && l.key_pem == NULL,
           "refused: %s (%s)", fails[i].want, err.text);
    }
    /* An encrypted key; an expired certificate (made with GnuTLS here). */
    if ((f = fopen(k2path, "w")))
        fputs("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
              f),
            fclose(f);
    ok(tlscert_load(&l, cpath, k2path, &err) == -1 && strstr(err.text, "is encrypted"),
       "refused: an encrypted key (%s)", err.text);
    {
        gnutls_x509_crt_t c = parse_crt(t.cert_pem);
        gnutls_x509_privkey_t k = NULL;
        gnutls_datum_t d = { (unsigned char *)t.key_pem, (unsigned)strlen(t.key_pem) }, out = { 0 };
        gnutls_x509_privkey_init(&k);
        gnutls_x509_privkey_import2(k, &d, GNUTLS_X509_FMT_PEM, NULL, 0);
        gnutls_x509_crt_set_activation_time(c, now - 10 * 86400);
        gnutls_x509_crt_set_expiration_time(c, now - 86400);
        gnutls_x509_crt_sign2(c, c, k, GNUTLS_DIG_SHA256, 0);
        gnutls_x509_crt_export2(c, GNUTLS_X509_FMT_PEM, &out);
        if ((f = fopen(cpath, "w")))
            fwrite(out.data, 1, out.size, f), fclose(f);
        gnutls_free(out.data);
        gnutls_x509_crt_deinit(c);
        gnutls_x509_privkey_deinit(k);
    }
    ok(tlscert_load(&l, cpath, kpath, &err) == -1 && strstr(err.text, "expired on"),
       "refused: an expired certificate (%s)", err.text);
    /* What the ranks' TLS clients would refuse, so that every push failed while
     * the job went on (exit 0): a certificate valid only from tomorrow, a key
     * usage without digitalSignature (an ECDSA key), an extended key usage
     * without serverAuth. A good one with both usages loads. */
    static const struct {
        long from, until;
        unsigned ku;
        const char *eku, *want;
    } unusable[] = {
        { 86400, 2 * 86400, 0, NULL, "is not valid before" },
        { -3600, 86400, GNUTLS_KEY_KEY_ENCIPHERMENT | GNUTLS_KEY_KEY_CERT_SIGN, NULL,
          "key usage lacks digitalSignature" },
        { -3600, 86400, 0, GNUTLS_KP_TLS_WWW_CLIENT, "extended key usage lacks serverAuth" },
        { -3600, 86400, GNUTLS_KEY_DIGITAL_SIGNATURE, GNUTLS_KP_TLS_WWW_SERVER, NULL },
        { -3600, 86400, 0, GNUTLS_KP_ANY, NULL },
    };
    for (size_t i = 0; i < sizeof(unusable) / sizeof(unusable[0]); i++) {
        write_crt(cpath, t.key_pem, now + unusable[i].from, now + unusable[i].until, unusable[i].ku,
                  unusable[i].eku);
        memset(&err, 0, sizeof(err));
        int rc = tlscert_load(&l, cpath, kpath, &err);
        if (unusable[i].want)
            ok(rc == -1 && strstr(err.text, unusable[i].want) && l.cert_pem == NULL,
               "refused: %s (%s)", unusable[i].want, err.text);
        else
            ok(rc == 0, "a certificate valid now for a TLS server loads (%s)", err.text);
        tlscert_free(&l);
    }
    /* Not a regular file: a directory is named as one; a FIFO (no writer) is
     * refused at once instead of blocking bmlaunch (alarm: a hang fails). */
    memset(&err, 0, sizeof(err));
    ok(tlscert_load(&l, dir, kpath, &err) == -1 && strstr(err.text, "is a directory"),
       "refused: a directory (%s)", err.text);
    unlink(junk);
    alarm(20);
    memset(&err, 0, sizeof(err));
    ok(mkfifo(junk, 0600) == 0 && tlscert_load(&l, junk, kpath, &err) == -1 &&
           strstr(err.text, "not a regular file"),
       "refused: a FIFO as the certificate (%s)", err.text);
    memset(&err, 0, sizeof(err));
    ok(tlscert_load(&l, cpath, junk, &err) == -1 && strstr(err.text, "not a regular file"),
       "refused: a FIFO as the key (%s)", err.text);
    alarm(0);
    unlink(cpath), unlink(kpath), unlink(k2path), unlink(junk), rmdir(dir);
    tlscert_free(&u);
    tlscert_free(&t);
    tlscert_free(NULL);
    ok(t.cert_pem == NULL && t.key_pem == NULL, "tlscert_free empties; NULL is a no-op");
}

int main(void)
{
    check_wanted();
    check_generate();
    return done_testing();
}
