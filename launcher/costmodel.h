/* launcher/costmodel.h — communication per training step: flat ZeRO-3 vs two-level.
 *
 * `bmlaunch --plan --model d48` (or a parameter count) prints, for the layout,
 * the bytes every GPU sends per training step and the ring steps of each
 * collective, for two schemes:
 *   flat:      ZeRO-3 over the whole world W (gathers and reduce-scatter over W ranks);
 *   two-level: ZeRO-3 inside groups of G ranks, plus an all-reduce of each gradient
 *              shard (P/G elements) over the R = groups ranks of a replica communicator.
 * Estimated times come from busbw figures (nccl-tests definition: the bytes one GPU
 * sends through a ring divided by the time), plus an optional latency per ring step.
 *
 * Everything here is pure arithmetic on its arguments, except the two print
 * functions (text to a FILE*, a Jansson object). GB means 1e9 bytes throughout.
 */
#ifndef BMT_LAUNCHER_COSTMODEL_H
#define BMT_LAUNCHER_COSTMODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "bmt/error.h"
#include "bmt/layout.h"

/* Largest parameter count accepted anywhere (a petaparameter; doubles stay exact). */
#define COSTMODEL_MAX_PARAMS 1e15

/* Default busbw figures (GB/s) for costmodel_default_busbw:
 *   NVLINK: a ring whose ranks all sit on one node. bench/comm measured 235 GB/s
 *           all-gather and 220 GB/s reduce-scatter at 256 MiB on 2x H200
 *           (bench/NOTES.md, 2026-11-30); 230 is between them.
 *   NIC:    what one GPU's own network adapter carries: one 400 Gb/s NIC per GPU
 *           (H200 nodes) is 50 GB/s on the wire, ~45 reachable. Not measured here. */
#define COSTMODEL_NVLINK_GBPS 230.0
#define COSTMODEL_NIC_GBPS 45.0

/* The three kinds of communicator the model uses. */
typedef enum costmodel_comm {
    COSTMODEL_GROUP,   /* the G ranks of one group (two-level ZeRO-3) */
    COSTMODEL_REPLICA, /* the R = groups ranks of one replica communicator */
    COSTMODEL_WORLD,   /* all W ranks (flat ZeRO-3) */
} costmodel_comm_t;

/* Bits of costmodel_in_t.defaulted: which busbw figure costmodel_default_busbw chose. */
#define COSTMODEL_DEFAULT_GROUP (1u << COSTMODEL_GROUP)
#define COSTMODEL_DEFAULT_REPLICA (1u << COSTMODEL_REPLICA)
#define COSTMODEL_DEFAULT_WORLD (1u << COSTMODEL_WORLD)

typedef struct costmodel_in {
    double params;        /* P: parameters of the model (whole number, 1 .. 1e15) */
    const char *model;    /* name to print ("d48", "70B"); borrowed; NULL: the count */
    int gather_bytes;     /* bytes per parameter in the all-gathers (bf16: 2) */
    int reduce_bytes;     /* bytes per gradient element reduced (bf16: 2, f32: 4) */
    int shard_bytes;      /* bytes per gradient-shard element in the cross-group
                             all-reduce; 0: reduce_bytes. bmt's engine keeps shards in
                             f32 whatever its grad_dtype (runtime/schedule.c): 4 */
    int zero_level;       /* 3: gathered in forward and again in backward; 2: once */
    double busbw_group;   /* GB/s of the group's all-gather and reduce-scatter */
    double busbw_replica; /* GB/s of the replica all-reduce */
    double busbw_world;   /* GB/s of a flat world-wide ring */
    unsigned defaulted;   /* COSTMODEL_DEFAULT_* bits; set by costmodel_default_busbw */
    double latency_us;    /* per ring step (>= 0) */
    int blocks;           /* collective calls per pass over the model (bmt gathers one
                             block at a time); multiplies only the latency term */
} costmodel_in_t;

/* bf16 gathers and reduction, ZeRO-3, no latency, one call per pass; the caller sets
 * params and the busbw figures (or leaves them 0 for costmodel_default_busbw). */
#define COSTMODEL_IN_INITIALIZER                                                                   \
    {                                                                                              \
        .gather_bytes = 2, .reduce_bytes = 2, .zero_level = 3, .blocks = 1                         \
    }

/* One collective of one scheme, per training step and per GPU. */
typedef struct costmodel_row {
    const char *op; /* static text: "all-gather params (fwd)", ... */
    costmodel_comm_t where;
    int ranks;      /* communicator size */
    int ring_steps; /* per call: n-1 (all-gather, reduce-scatter), 2(n-1) (all-reduce) */
    double bytes;   /* sent per GPU per step */
    double busbw;   /* GB/s used for the time */
    double seconds; /* bytes / busbw + blocks * ring_steps * latency */
} costmodel_row_t;

typedef struct costmodel_scheme {
    costmodel_row_t rows[4];
    int nrows;            /* flat: 3 (zero 3) or 2; two-level: one more */
    double bytes;         /* sum of rows */
    long long ring_steps; /* sum of rows' ring steps (one call each) */
    double seconds;       /* sum of rows: the collectives do not overlap one another */
} costmodel_scheme_t;

typedef struct costmodel_out {
    costmodel_scheme_t flat;
    costmodel_scheme_t two_level;
    /* flat / two-level; 1 where both are 0 (a world of one rank) */
    double ratio_bytes, ratio_ring_steps, ratio_seconds;
} costmodel_out_t;

/* Evaluate the model for layout l (groups and gpus_per_group are used).
 * Returns 0 and fills *out, or -1 with err set and *out untouched when: the layout
 * is inconsistent, params is not a finite number in [1, 1e15], gather_bytes or
 * reduce_bytes is not 1..8, shard_bytes is not 0..8, zero_level is not 2 or 3, a
 * busbw is not a finite positive number, latency_us is negative or not finite, or
 * blocks < 1. A step is one micro-batch: with gradient accumulation the gathers and
 * reduce-scatters repeat per micro-batch and the all-reduce does not (not modelled). */
int costmodel_eval(const bmt_layout_t *l, const costmodel_in_t *in, costmodel_out_t *out,
                   bmt_error_t *err);

/* The fewest ranks of one communicator that share a node, over every communicator
 * of that kind and every node it touches; 0 when every such communicator lies on
 * one node. A ring crossing nodes leaves a node through as many NICs as the
 * communicator has ranks there, so this bounds its bandwidth. Pure, O(world) at most. */
int costmodel_ranks_per_node(const bmt_layout_t *l, costmodel_comm_t which);

/* Fill each busbw of *in that is 0 (and only those), setting its defaulted bit:
 * nvlink_gbps for a communicator on one node, else min(nvlink_gbps,
 * costmodel_ranks_per_node * nic_gbps). Pure. */
void costmodel_default_busbw(const bmt_layout_t *l, double nvlink_gbps, double nic_gbps,
                             costmodel_in_t *in);

/* A named model. GPT-2 presets: vocabulary 50257, context 1024, tied embeddings;
 * params = 12 L C^2 + 13 L C + V C + T C + 2 C. */
typedef struct costmodel_preset {
    const char *name;  /* "d12" */
    const char *alias; /* "gpt2" */
    int layers, channels, vocab, context;
    double params;
} costmodel_preset_t;

/* The preset named text (case-insensitive name or alias), or NULL. Static storage. */
const costmodel_preset_t *costmodel_preset(const char *text);

/* The presets, ending with an entry whose name is NULL. */
const costmodel_preset_t *costmodel_presets(void);

/* Parse a parameter count for the option named what ("--model"): a preset ("d48",
 * "gpt2-xl") or a decimal number with an optional exponent and an optional
 * case-insensitive suffix K, M, B or G, T ("1558000000", "1.5e9", "70B", "350m").
 * The result is rounded to a whole number. Refuses empty text, signs, spaces,
 * hexadecimal, inf/nan, trailing characters, a count under 1 or over 1e15, with a
 * message naming what. Returns 0 or -1; *out is untouched on failure. */
int costmodel_parse_params(const char *text, const char *what, double *out, bmt_error_t *err);

/* Parse a bandwidth in GB/s for what ("--busbw-group"): a finite decimal number
 * > 0 and <= 1e5. Returns 0 or -1 (message names what), *out untouched on failure. */
int costmodel_parse_gbps(const char *text, const char *what, double *out, bmt_error_t *err);

/* Parse a latency in microseconds: a finite decimal number >= 0 and <= 1e6. */
int costmodel_parse_us(const char *text, const char *what, double *out, bmt_error_t *err);

/* Parse a ZeRO level: "2" or "3". */
int costmodel_parse_zero(const char *text, const char *what, int *out, bmt_error_t *err);

/* Parse a dtype for gathers or gradients into bytes per element: "bf16", "fp16"/"f16"
 * (2), "f32"/"fp32" (4); case-insensitive. */
int costmodel_parse_dtype(const char *text, const char *what, int *bytes, bmt_error_t *err);

/* The communicator's name as printed: "group", "replica", "world". */
const char *costmodel_comm_name(costmodel_comm_t which);

/* Append the model to a --plan text: a blank line, a title, a table of the
 * collectives of both schemes and their totals, the comparison on one line and the
 * assumptions (19 lines at most). in and res are what costmodel_eval was given and
 * filled. Returns 0, or -1 when out reports a write error. */
int costmodel_print_text(FILE *out, const bmt_layout_t *l, const costmodel_in_t *in,
                         const costmodel_out_t *res);

/* The same numbers as a new JSON object (the caller owns the reference), or NULL
 * when out of memory. Bytes and seconds per step and per GPU, busbw in GB/s. */
json_t *costmodel_json(const bmt_layout_t *l, const costmodel_in_t *in, const costmodel_out_t *res);

#endif
