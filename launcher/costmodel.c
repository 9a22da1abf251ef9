/* launcher/costmodel.c — bytes, ring steps and time per training step, flat vs two-level.
 *
 * Design note. A ring collective over n ranks makes every rank send (n-1)/n of the
 * array (all-gather of the whole, reduce-scatter of the whole) or 2(n-1)/n of it
 * (all-reduce), in n-1 or 2(n-1) steps; nccl-tests defines busbw so that exactly
 * this per-rank volume divided by busbw is the time. So the model needs no notion
 * of topology beyond the busbw figures, and the hand-computed numbers
 * (70B, 1000 = 20 x 50: 419.58 GB flat vs 411.6 + 5.32 GB) fall out directly.
 * Volumes are computed as P * bytes * (n-1) / n, multiplying before dividing, so
 * that whole inputs stay exact in doubles until the one final division.
 * With one dtype throughout, two-level sends exactly (R-1)/W * P * bytes less than
 * flat at ZeRO-3 and as much at ZeRO-2: what it saves is ring steps (latency) and
 * how far each ring reaches, which is why the busbw figures and the latency decide.
 *
 * The default busbw figures are a first-order topology model kept separate
 * (costmodel_default_busbw): a ring on one node runs at NVLink speed; a ring that
 * crosses nodes leaves each node through the NICs of the ranks it has there, so
 * the node where it has the fewest ranks bounds it. That is what makes a group of
 * 50 on 8-GPU nodes (2 ranks on its last node) slower than a group of 48.
 */
#include "costmodel.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

#define GB 1e9

/* GPT-2 (HF): vocabulary 50257, context 1024, tied embeddings. The counts are the
 * formula's; tests/unit/test_costmodel.c recomputes them independently. */
#define GPT2_PARAMS(L, C)                                                                          \
    (12.0 * (L) * (C) * (C) + 13.0 * (L) * (C) + 50257.0 * (C) + 1024.0 * (C) + 2.0 * (C))

static const costmodel_preset_t presets[] = {
    { "d12", "gpt2", 12, 768, 50257, 1024, GPT2_PARAMS(12, 768) },
    { "d24", "gpt2-medium", 24, 1024, 50257, 1024, GPT2_PARAMS(24, 1024) },
    { "d36", "gpt2-large", 36, 1280, 50257, 1024, GPT2_PARAMS(36, 1280) },
    { "d48", "gpt2-xl", 48, 1600, 50257, 1024, GPT2_PARAMS(48, 1600) },
    { NULL, NULL, 0, 0, 0, 0, 0 },
};

const costmodel_preset_t *costmodel_presets(void) { return presets; }

const costmodel_preset_t *costmodel_preset(const char *text)
{
    if (text == NULL)
        return NULL;
    for (const costmodel_preset_t *p = presets; p->name; p++)
        if (strcasecmp(text, p->name) == 0 || strcasecmp(text, p->alias) == 0)
            return p;
    return NULL;
}

const char *costmodel_comm_name(costmodel_comm_t which)
{
    switch (which) {
    case COSTMODEL_GROUP: return "group";
    case COSTMODEL_REPLICA: return "replica";
    case COSTMODEL_WORLD: return "world";
    }
    return "?";
}

/* ---------------------------------------------------------------- evaluation */

static bool positive_finite(double x) { return isfinite(x) && x > 0; }

static void row_set(costmodel_row_t *r, const char *op, costmodel_comm_t where, int ranks,
                    int ring_steps, double bytes, double busbw, const costmodel_in_t *in)
{
    r->op = op;
    r->where = where;
    r->ranks = ranks;
    r->ring_steps = ring_steps;
    r->bytes = bytes;
    r->busbw = busbw;
    r->seconds = bytes / (busbw * GB) + (double)in->blocks * ring_steps * in->latency_us * 1e-6;
}

static int shard_bytes(const costmodel_in_t *in)
{
    return in->shard_bytes ? in->shard_bytes : in->reduce_bytes;
}

/* The gathers (one or two) and the reduce-scatter of ZeRO over n ranks. */
static void zero_rows(costmodel_scheme_t *s, costmodel_comm_t where, int n, double busbw,
                      const costmodel_in_t *in)
{
    const double P = in->params;
    double gather = P * in->gather_bytes * (n - 1) / n;
    double reduce = P * in->reduce_bytes * (n - 1) / n;
    if (in->zero_level == 3) {
        row_set(&s->rows[s->nrows++], "all-gather params (fwd)", where, n, n - 1, gather, busbw,
                in);
        row_set(&s->rows[s->nrows++], "all-gather params (bwd)", where, n, n - 1, gather, busbw,
                in);
    } else {
        row_set(&s->rows[s->nrows++], "all-gather params", where, n, n - 1, gather, busbw, in);
    }
    row_set(&s->rows[s->nrows++], "reduce-scatter grads", where, n, n - 1, reduce, busbw, in);
}

static void scheme_total(costmodel_scheme_t *s)
{
    s->bytes = 0;
    s->seconds = 0;
    s->ring_steps = 0;
    for (int i = 0; i < s->nrows; i++) {
        s->bytes += s->rows[i].bytes;
        s->seconds += s->rows[i].seconds;
        s->ring_steps += s->rows[i].ring_steps;
    }
}

/* b is 0 only for a world of one rank, where a is 0 as well. */
static double ratio(double a, double b) { return b > 0 ? a / b : 1.0; }

int costmodel_eval(const bmt_layout_t *l, const costmodel_in_t *in, costmodel_out_t *out,
                   bmt_error_t *err)
{
    if (l->groups < 1 || l->gpus_per_group < 1 ||
        (long long)l->groups * l->gpus_per_group != l->world || l->world > BMT_LAYOUT_MAX_WORLD)
        return errprintf(err, "cost model: inconsistent layout %d x %d = %d", l->groups,
                         l->gpus_per_group, l->world);
    if (!isfinite(in->params) || in->params < 1 || in->params > COSTMODEL_MAX_PARAMS)
        return errprintf(err, "cost model: parameter count %g is not in [1, 1e15]", in->params);
    if (in->gather_bytes < 1 || in->gather_bytes > 8)
        return errprintf(err, "cost model: %d bytes per gathered parameter (want 1 to 8)",
                         in->gather_bytes);
    if (in->reduce_bytes < 1 || in->reduce_bytes > 8)
        return errprintf(err, "cost model: %d bytes per reduced gradient (want 1 to 8)",
                         in->reduce_bytes);
    if (in->shard_bytes < 0 || in->shard_bytes > 8)
        return errprintf(err, "cost model: %d bytes per gradient-shard element (want 0 to 8)",
                         in->shard_bytes);
    if (in->zero_level != 2 && in->zero_level != 3)
        return errprintf(err, "cost model: ZeRO level must be 2 or 3, got %d", in->zero_level);
    const struct {
        const char *name;
        double v;
    } bw[] = {
        { "group", in->busbw_group },
        { "replica", in->busbw_replica },
        { "world", in->busbw_world },
    };
    for (size_t i = 0; i < sizeof(bw) / sizeof(bw[0]); i++)
        if (!positive_finite(bw[i].v))
            return errprintf(err, "cost model: busbw of the %s must be a positive GB/s, got %g",
                             bw[i].name, bw[i].v);
    if (!isfinite(in->latency_us) || in->latency_us < 0)
        return errprintf(err, "cost model: latency must be >= 0 us, got %g", in->latency_us);
    if (in->blocks < 1)
        return errprintf(err, "cost model: blocks must be at least 1, got %d", in->blocks);

    costmodel_out_t o = { 0 };
    const int W = l->world, G = l->gpus_per_group, R = l->groups;

    zero_rows(&o.flat, COSTMODEL_WORLD, W, in->busbw_world, in);
    scheme_total(&o.flat);

    zero_rows(&o.two_level, COSTMODEL_GROUP, G, in->busbw_group, in);
    /* Each rank all-reduces its gradient shard, P/G elements, with the ranks holding
     * the same shard in the other groups: 2(R-1)/R of it leaves every GPU. */
    double shard_reduce = 2.0 * in->params * shard_bytes(in) * (R - 1) / ((double)R * G);
    row_set(&o.two_level.rows[o.two_level.nrows++], "all-reduce grad shard", COSTMODEL_REPLICA, R,
            2 * (R - 1), shard_reduce, in->busbw_replica, in);
    scheme_total(&o.two_level);

    o.ratio_bytes = ratio(o.flat.bytes, o.two_level.bytes);
    o.ratio_ring_steps = ratio((double)o.flat.ring_steps, (double)o.two_level.ring_steps);
    o.ratio_seconds = ratio(o.flat.seconds, o.two_level.seconds);
    *out = o;
    return 0;
}

/* ---------------------------------------------------------------- default busbw */

static int min_nonzero(int k, int m) { return k == 0 || m < k ? m : k; }

int costmodel_ranks_per_node(const bmt_layout_t *l, costmodel_comm_t which)
{
    const int gpn = l->gpus_per_node, gpg = l->gpus_per_group;
    int k = 0;
    if (gpn < 1 || gpg < 1)
        return 0;
    switch (which) {
    case COSTMODEL_WORLD: return l->nodes > 1 ? gpn : 0;
    case COSTMODEL_GROUP:
        for (int g = 0; g < l->groups; g++) {
            int first, last;
            bmt_layout_group_nodes(l, g, &first, &last);
            if (first == last)
                continue;
            /* Nodes in between are the group's whole; only the ends can be partial (and
             * by symmetry the heads are the tails of the groups before them). */
            int r0 = g * gpg, r1 = r0 + gpg - 1;
            int head = gpn - r0 % gpn, tail = r1 % gpn + 1;
            k = min_nonzero(k, head < tail ? head : tail);
        }
        return k;
    case COSTMODEL_REPLICA:
        if (l->groups == 1 || l->nodes == 1)
            return 0;
        if (gpg >= gpn)
            return 1; /* members are gpg >= gpn ranks apart: one per node */
        /* Several members may share a node: count them, O(world) in all. */
        for (int i = 0; i < gpg; i++) {
            int node = -1, run = 0, least = 0;
            bool multi = false;
            for (int g = 0; g < l->groups; g++) {
                int n = bmt_layout_replica_member(l, i, g) / gpn;
                if (n != node) {
                    if (node >= 0) {
                        multi = true;
                        least = min_nonzero(least, run);
                    }
                    node = n;
                    run = 0;
                }
                run++;
            }
            if (multi)
                k = min_nonzero(k, min_nonzero(least, run));
        }
        return k;
    }
    return 0;
}

static double default_busbw(const bmt_layout_t *l, costmodel_comm_t which, double nvlink,
                            double nic)
{
    int k = costmodel_ranks_per_node(l, which);
    if (k == 0)
        return nvlink;
    return k * nic < nvlink ? k * nic : nvlink;
}

void costmodel_default_busbw(const bmt_layout_t *l, double nvlink_gbps, double nic_gbps,
                             costmodel_in_t *in)
{
    double *field[] = { [COSTMODEL_GROUP] = &in->busbw_group,
                        [COSTMODEL_REPLICA] = &in->busbw_replica,
                        [COSTMODEL_WORLD] = &in->busbw_world };
    for (int c = COSTMODEL_GROUP; c <= COSTMODEL_WORLD; c++)
        if (*field[c] == 0) {
            *field[c] = default_busbw(l, (costmodel_comm_t)c, nvlink_gbps, nic_gbps);
            in->defaulted |= 1u << c;
        }
}

/* ---------------------------------------------------------------- parsing */

/* End of a decimal number at p (digits, optional fraction, optional exponent), or
 * NULL. Written out rather than left to strtod, which also takes signs, spaces,
 * hexadecimal, "inf" and "nan". */
static const char *scan_decimal(const char *p)
{
    int digits = 0;
    while (isdigit((unsigned char)*p)) {
        p++;
        digits++;
    }
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) {
            p++;
            digits++;
        }
    }
    if (digits == 0)
        return NULL;
    if (*p == 'e' || *p == 'E') {
        const char *q = p + 1;
        if (*q == '+' || *q == '-')
            q++;
        if (!isdigit((unsigned char)*q))
            return NULL;
        while (isdigit((unsigned char)*q))
            q++;
        p = q;
    }
    return p;
}

/* strtod of text[0, len), known to be a valid decimal. */
static double decimal_value(const char *text, size_t len)
{
    char buf[80];
    if (len >= sizeof(buf))
        return NAN;
    memcpy(buf, text, len);
    buf[len] = '\0';
    return strtod(buf, NULL); /* overflow gives HUGE_VAL, caught as too large */
}

int costmodel_parse_params(const char *text, const char *what, double *out, bmt_error_t *err)
{
    if (text == NULL || *text == '\0')
        return errprintf(err,
                         "%s needs a parameter count (1.5e9, 350M, 70B) or a preset "
                         "(d12, d24, d36, d48), got nothing",
                         what);
    const costmodel_preset_t *p = costmodel_preset(text);
    if (p) {
        *out = p->params;
        return 0;
    }
    if (*text == '-')
        return errprintf(err, "%s needs a positive parameter count, got '%.200s'", what, text);
    const char *end = scan_decimal(text);
    double scale = 1;
    if (end) {
        switch (tolower((unsigned char)*end)) {
        case 'k': scale = 1e3; break;
        case 'm': scale = 1e6; break;
        case 'b':
        case 'g': scale = 1e9; break;
        case 't': scale = 1e12; break;
        default: break;
        }
    }
    if (end == NULL || end[scale == 1 ? 0 : 1] != '\0')
        return errprintf(err,
                         "%s: '%.200s' is neither a parameter count (1.5e9, 350M, 70B) nor a "
                         "preset (d12, d24, d36, d48)",
                         what, text);
    double v = decimal_value(text, (size_t)(end - text));
    if (isnan(v))
        return errprintf(err, "%s: '%.200s' is too long a number", what, text);
    v = round(v * scale);
    if (v > COSTMODEL_MAX_PARAMS)
        return errprintf(err, "%s: '%.200s' is too many parameters (at most 1e15)", what, text);
    if (v < 1)
        return errprintf(err, "%s needs at least 1 parameter, got '%.200s'", what, text);
    *out = v;
    return 0;
}

static int parse_real(const char *text, const char *what, const char *unit, bool allow_zero,
                      double max, double *out, bmt_error_t *err)
{
    const char *end = text ? scan_decimal(text) : NULL;
    if (end == NULL || *end != '\0')
        return errprintf(err, "%s needs a %s number of %s, got '%.200s'", what,
                         allow_zero ? "non-negative" : "positive", unit, text ? text : "");
    double v = decimal_value(text, (size_t)(end - text));
    if (isnan(v) || v > max)
        return errprintf(err, "%s: '%.200s' is too large (at most %g %s)", what, text, max, unit);
    if (v == 0 && !allow_zero)
        return errprintf(err, "%s needs a positive number of %s, got '%.200s'", what, unit, text);
    *out = v;
    return 0;
}

int costmodel_parse_gbps(const char *text, const char *what, double *out, bmt_error_t *err)
{
    return parse_real(text, what, "GB/s", false, 1e5, out, err);
}

int costmodel_parse_us(const char *text, const char *what, double *out, bmt_error_t *err)
{
    return parse_real(text, what, "microseconds", true, 1e6, out, err);
}

int costmodel_parse_zero(const char *text, const char *what, int *out, bmt_error_t *err)
{
    if (text && strcmp(text, "2") == 0)
        *out = 2;
    else if (text && strcmp(text, "3") == 0)
        *out = 3;
    else
        return errprintf(err, "%s must be 2 or 3, got '%.200s'", what, text ? text : "");
    return 0;
}

int costmodel_parse_dtype(const char *text, const char *what, int *bytes, bmt_error_t *err)
{
    static const struct {
        const char *name;
        int bytes;
    } dtypes[] = { { "bf16", 2 }, { "fp16", 2 }, { "f16", 2 }, { "f32", 4 }, { "fp32", 4 } };
    for (size_t i = 0; text && i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcasecmp(text, dtypes[i].name) == 0) {
            *bytes = dtypes[i].bytes;
            return 0;
        }
    return errprintf(err, "%s must be bf16, fp16 or f32, got '%.200s'", what, text ? text : "");
}

/* ---------------------------------------------------------------- output */

/* 1557611200 -> "1,557,611,200" (params are whole numbers up to 1e15). */
static void thousands(char *buf, size_t len, double v)
{
    char digits[32];
    snprintf(digits, sizeof(digits), "%.0f", v);
    size_t n = strlen(digits), o = 0;
    for (size_t i = 0; i < n && o + 2 < len; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
}

static const char *dtype_name(int bytes)
{
    switch (bytes) {
    case 1: return "8-bit";
    case 2: return "bf16";
    case 4: return "f32";
    case 8: return "f64";
    }
    return "?";
}

/* One line of assumptions per busbw figure, saying where it came from. */
static void print_busbw(FILE *out, const bmt_layout_t *l, const costmodel_in_t *in,
                        costmodel_comm_t which, double v)
{
    fprintf(out, "    busbw %-8s %7.1f GB/s  ", costmodel_comm_name(which), v);
    if (!(in->defaulted & (1u << which))) {
        fprintf(out, "given\n");
        return;
    }
    int k = costmodel_ranks_per_node(l, which);
    if (k == 0)
        fprintf(out, "default: on one node (NVLink)\n");
    else
        fprintf(out, "default: crosses nodes with as few as %d rank%s on one (%d NIC%s)\n", k,
                k == 1 ? "" : "s", k, k == 1 ? "" : "s");
}

static void print_rows(FILE *out, const char *scheme, const costmodel_scheme_t *s)
{
    for (int i = 0; i < s->nrows; i++) {
        const costmodel_row_t *r = &s->rows[i];
        fprintf(out, "  %-10s %-24s %-8s %7d %10d %10.3f %11.3f\n", scheme, r->op,
                costmodel_comm_name(r->where), r->ranks, r->ring_steps, r->bytes / GB,
                r->seconds * 1e3);
    }
}

int costmodel_print_text(FILE *out, const bmt_layout_t *l, const costmodel_in_t *in,
                         const costmodel_out_t *res)
{
    char count[32];
    thousands(count, sizeof(count), in->params);
    fprintf(out,
            "\n  communication per training step and GPU: model %s%s%s parameters; "
            "GB = 1e9 bytes\n",
            in->model ? in->model : "", in->model ? " = " : "", count);
    fprintf(out, "  %-10s %-24s %-8s %7s %10s %10s %11s\n", "scheme", "collective", "where",
            "ranks", "ring steps", "GB sent", "est. ms");
    print_rows(out, "flat", &res->flat);
    print_rows(out, "two-level", &res->two_level);
    fprintf(out, "  %-10s %-24s %-8s %7s %10lld %10.3f %11.3f\n", "flat", "total", "", "",
            res->flat.ring_steps, res->flat.bytes / GB, res->flat.seconds * 1e3);
    fprintf(out, "  %-10s %-24s %-8s %7s %10lld %10.3f %11.3f\n", "two-level", "total", "", "",
            res->two_level.ring_steps, res->two_level.bytes / GB, res->two_level.seconds * 1e3);
    fprintf(out, "  flat / two-level: %.3fx the bytes, %.1fx the ring steps, %.3fx the time\n",
            res->ratio_bytes, res->ratio_ring_steps, res->ratio_seconds);
    fprintf(out, "  assumptions: ZeRO-%d, %s\n", in->zero_level,
            in->zero_level == 3 ? "params gathered in forward and again in backward"
                                : "params gathered once a step, kept through backward");
    fprintf(out, "    dtypes: %s gathers, %s gradients", dtype_name(in->gather_bytes),
            dtype_name(in->reduce_bytes));
    if (shard_bytes(in) != in->reduce_bytes)
        fprintf(out, ", %s gradient shards across groups", dtype_name(shard_bytes(in)));
    fputc('\n', out);
    print_busbw(out, l, in, COSTMODEL_GROUP, in->busbw_group);
    print_busbw(out, l, in, COSTMODEL_REPLICA, in->busbw_replica);
    print_busbw(out, l, in, COSTMODEL_WORLD, in->busbw_world);
    if (in->latency_us > 0)
        fprintf(out,
                "    time = GB sent / busbw + ring steps x %g us x %d call%s a pass; no overlap\n",
                in->latency_us, in->blocks, in->blocks == 1 ? "" : "s");
    else
        fprintf(out, "    time = GB sent / busbw (ring-step latency not counted); no overlap\n");
    return ferror(out) ? -1 : 0;
}

static json_t *scheme_json(const costmodel_scheme_t *s)
{
    json_t *rows = json_array();
    for (int i = 0; i < s->nrows; i++) {
        const costmodel_row_t *r = &s->rows[i];
        json_array_append_new(rows,
                              json_pack("{s:s, s:s, s:i, s:i, s:f, s:f, s:f}", "op", r->op, "where",
                                        costmodel_comm_name(r->where), "ranks", r->ranks,
                                        "ring_steps", r->ring_steps, "bytes_per_gpu", r->bytes,
                                        "busbw_gbps", r->busbw, "seconds", r->seconds));
    }
    return json_pack("{s:o, s:f, s:I, s:f}", "collectives", rows, "bytes_per_gpu", s->bytes,
                     "ring_steps", (json_int_t)s->ring_steps, "seconds", s->seconds);
}

json_t *costmodel_json(const bmt_layout_t *l, const costmodel_in_t *in, const costmodel_out_t *res)
{
    json_t *busbw = json_pack("{s:f, s:f, s:f}", "group", in->busbw_group, "replica",
                              in->busbw_replica, "world", in->busbw_world);
    json_t *defaulted =
        json_pack("{s:b, s:b, s:b}", "group", !!(in->defaulted & COSTMODEL_DEFAULT_GROUP),
                  "replica", !!(in->defaulted & COSTMODEL_DEFAULT_REPLICA), "world",
                  !!(in->defaulted & COSTMODEL_DEFAULT_WORLD));
    json_t *ratios = json_pack("{s:f, s:f, s:f}", "bytes", res->ratio_bytes, "ring_steps",
                               res->ratio_ring_steps, "seconds", res->ratio_seconds);
    return json_pack("{s:s?, s:I, s:i, s:i, s:i, s:i, s:f, s:i, s:o, s:o, s:o, s:o, s:o}", "model",
                     in->model, "params", (json_int_t)in->params, "zero_level", in->zero_level,
                     "gather_bytes", in->gather_bytes, "reduce_bytes", in->reduce_bytes,
                     "shard_bytes", shard_bytes(in), "latency_us", in->latency_us, "blocks",
                     in->blocks, "busbw_gbps", busbw, "busbw_default", defaulted, "flat",
                     scheme_json(&res->flat), "two_level", scheme_json(&res->two_level),
                     "flat_over_two_level", ratios);
}
