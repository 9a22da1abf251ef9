/* launcher/costmodel.h — the planner's cost model: step time, exposed communication
 * and memory per GPU of a layout, and a ranking of the layouts worth considering.
 *
 * `bmlaunch --plan --model 70B -g 20 -n 50 --gpus-per-node 8` evaluates the layout
 * the way bmt's engine runs it (runtime/schedule.c), block by block:
 *
 *   collectives  every call the engine issues in one step: per block the gather of
 *                its parameters in forward and (ZeRO-3) again in backward, the
 *                reduce-scatter of its gradients, on the last micro-batch the
 *                all-reduce of its f32 gradient shard across groups; per micro-batch
 *                the world's 32-byte agreement, per step the gradient norm's. Each
 *                call's time follows NCCL's own tuning model (src/graph/tuning.cc,
 *                2.24-2.28): ring, tree (all-reduce) and PAT (all-gather and
 *                reduce-scatter with one rank per node), each in the LL, LL128 and
 *                Simple protocols, latency + bytes / bandwidth, the fastest chosen
 *                as NCCL chooses; plus a fixed cost per call fitted from bench/comm.
 *   overlap      a simulation of the engine's three streams (compute; comm: gathers
 *                and reduce-scatters in the engine's order, two parameter slots and
 *                two gradient buffers; replica: the cross-group all-reduces), with
 *                compute per block from its FLOPs at an MFU: the step's time and the
 *                communication left exposed.
 *   memory       per GPU: the optimizer's states and gradient shards, the gathered
 *                parameter slots, the full gradient buffers, the activations with or
 *                without checkpointing, checked against the GPU's memory.
 *   ranking      the user's layout, flat ZeRO-3, the rail-aligned alternatives and
 *                the group sizes that divide the world, ordered by step time among
 *                those that fit, with the terms that decide.
 *
 * Pure arithmetic except the print functions. GB means 1e9 bytes, GiB 2^30.
 * docs/planner.md derives every formula and works one example in full.
 */
#ifndef BMT_LAUNCHER_COSTMODEL_H
#define BMT_LAUNCHER_COSTMODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "bmt/error.h"
#include "bmt/layout.h"

/* Largest parameter count accepted anywhere (a petaparameter; doubles stay exact). */
#define COSTMODEL_MAX_PARAMS 1e15
#define COSTMODEL_MAX_LAYERS 4096

/* ---------------------------------------------------------------- defaults */

/* NVLink busbw of each collective (GB/s) and the fixed cost of a call beyond
 * NCCL's own latency (us), fitted by bench/comm_fit.py to bench/comm on 2x H200
 * (bench/results/2026-11-30-comm-nccl-2xH200.txt): busbw from the slope of
 * time = a + bytes per rank / busbw over 4 MiB - 256 MiB (Simple protocol);
 * the Simple call cost is the intercept less NCCL's 2-rank Simple ring latency,
 * the LL one the time of sizes up to 64 KiB less NCCL's LL ring latency.
 * tests/integration/test_planner.sh refits the file and checks these numbers. */
#define COSTMODEL_NVLINK_AG_GBPS 242.6
#define COSTMODEL_NVLINK_RS_GBPS 225.1
#define COSTMODEL_NVLINK_AR_GBPS 297.9
#define COSTMODEL_CALL_SIMPLE_US 18.4
#define COSTMODEL_CALL_LL_US 11.7
/* One GPU's 400 Gb/s InfiniBand NIC (NDR): "46-48GB/s per NIC" (NCCL's developers,
 * nccl-tests issue 290); not measured here. */
#define COSTMODEL_NIC_GBPS 46.0
/* NCCL's overhead per network step (getNetOverhead: 1 us on x86, 3x for Simple). */
#define COSTMODEL_NET_OVERHEAD_US 1.0
/* What the planner reserves of a GPU's memory for the CUDA context, NCCL's
 * buffers and the allocator's slack, and the engine's own workspace (measured
 * 191.6 MiB at d48 in bench/NOTES.md). */
#define COSTMODEL_RESERVE_GIB 2.0
#define COSTMODEL_WORKSPACE_GIB 0.1875

/* The smallest inputs taken (docs/planner.md): below them a time divided by
 * them is no figure worth printing, and at 1e-320 it is infinite. */
#define COSTMODEL_MIN_GBPS 0.001      /* --nvlink-busbw, --nic-busbw, --busbw-*: 1 MB/s */
#define COSTMODEL_MIN_MFU 0.01        /* --mfu */
#define COSTMODEL_MIN_FP8_SPEEDUP 0.1 /* --fp8-speedup */
/* GPT-2's learned positions: the example trainer's --max-seq takes up to this. */
#define COSTMODEL_GPT2_MAX_POSITIONS 65536

/* ---------------------------------------------------------------- collectives */

typedef enum costmodel_coll {
    COSTMODEL_ALL_GATHER,
    COSTMODEL_REDUCE_SCATTER,
    COSTMODEL_ALL_REDUCE,
} costmodel_coll_t;

typedef enum costmodel_algo {
    COSTMODEL_RING,
    COSTMODEL_TREE,
    COSTMODEL_PAT
} costmodel_algo_t;
typedef enum costmodel_proto {
    COSTMODEL_LL,
    COSTMODEL_LL128,
    COSTMODEL_SIMPLE
} costmodel_proto_t;

/* The links of the machine, for costmodel_collective. */
typedef struct costmodel_links {
    double nvlink_gbps[3]; /* busbw of a ring on one node, per costmodel_coll_t */
    double nic_gbps;       /* busbw one GPU's NIC carries across nodes */
    double call_us[3];     /* fixed cost of a call beyond NCCL's latency, per
                              costmodel_proto_t (LL128 takes LL's) */
    double step_us;        /* < 0: NCCL's per-step latencies (hwLat); else every
                              step, inside a node or across, costs this (--latency-us) */
} costmodel_links_t;

/* Where one communicator's ranks sit. */
typedef struct costmodel_span {
    int ranks;    /* n >= 1 */
    int nodes;    /* nodes it touches, 1..n */
    int thinnest; /* fewest of its ranks on one of those nodes (its NICs there) */
    double busbw; /* > 0: the user's busbw for this communicator (--busbw-*) */
} costmodel_span_t;

/* NCCL's choice for one call and its time. */
typedef struct costmodel_choice {
    costmodel_algo_t algo;
    costmodel_proto_t proto;
    double latency_us; /* NCCL's latency of the choice plus call_us */
    double busbw_gbps; /* the ring busbw the choice starts from */
    double seconds;    /* the call's time */
} costmodel_choice_t;

/* Time of one collective of `bytes` (the whole buffer: an all-gather's output, a
 * reduce-scatter's input, an all-reduce's buffer; NCCL's nBytes) on span: the
 * fastest algorithm and protocol NCCL's tuning model allows there. A span of one
 * rank costs 0. Returns the seconds and fills *out when out is not NULL. Pure. */
double costmodel_collective(costmodel_coll_t c, const costmodel_span_t *s, double bytes,
                            const costmodel_links_t *lk, costmodel_choice_t *out);

/* The span of a layout's communicator kind: ranks, nodes touched (the most over
 * communicators of the kind), the fewest ranks on one node. Pure, O(world). */
typedef enum costmodel_comm {
    COSTMODEL_GROUP,   /* the G ranks of one group (ZeRO-3) */
    COSTMODEL_REPLICA, /* the R = groups ranks of one replica communicator */
    COSTMODEL_WORLD,   /* all W ranks */
} costmodel_comm_t;
costmodel_span_t costmodel_span(const bmt_layout_t *l, costmodel_comm_t which);

const char *costmodel_comm_name(costmodel_comm_t which);
const char *costmodel_coll_name(costmodel_coll_t c);
const char *costmodel_algo_name(costmodel_algo_t a);
const char *costmodel_proto_name(costmodel_proto_t p);

/* ---------------------------------------------------------------- model and GPU */

typedef enum costmodel_arch {
    COSTMODEL_GPT2,    /* LayerNorm, GELU MLP of 4C, biases, tied embeddings, learned positions */
    COSTMODEL_LLAMA,   /* RMSNorm, SwiGLU MLP, grouped-query attention, no biases */
    COSTMODEL_GENERIC, /* a bare count: L layers of P/L parameters, 12 C^2 each */
} costmodel_arch_t;

typedef struct costmodel_model {
    const char *name;  /* "d48", "llama3-70b"; NULL for a count */
    const char *alias; /* "gpt2-xl"; may be NULL */
    costmodel_arch_t arch;
    int layers;
    double hidden; /* C */
    double ffn;    /* F: the MLP's inner width */
    double kv_dim; /* width of K (and of V): C with full attention */
    int heads;     /* query heads (the attention's log-sum-exps: one a head and token) */
    double vocab;  /* 0 for a bare count */
    int context;   /* the default sequence length (GPT-2: its learned positions) */
    bool tied;     /* the head is the embedding */
    double params; /* the whole model */
} costmodel_model_t;

/* The preset named text (case-insensitive name or alias), or NULL. Static storage.
 * GPT-2 d12, d24, d36, d48 (gpt2 ... gpt2-xl); Llama 3.2 1B and 3B, Llama 3 8B,
 * 70B and 405B. */
const costmodel_model_t *costmodel_preset(const char *text);

/* The presets, ending with an entry whose name is NULL. */
const costmodel_model_t *costmodel_presets(void);

/* A bare parameter count as a model: layers (0: L = round(cbrt(P / (12 * 128^2))),
 * the hidden width about 128 L as in GPT-3 and Llama) of P / L parameters each,
 * C = sqrt(P / (12 L)), F = 4 C, no vocabulary, context 4096. Returns 0, or -1 when
 * layers is out of 0..COSTMODEL_MAX_LAYERS. */
int costmodel_model_from_count(double params, int layers, costmodel_model_t *out, bmt_error_t *err);

/* Parameters of one transformer layer of m. Pure. */
double costmodel_layer_params(const costmodel_model_t *m);

/* A GPU kind: its dense bf16 peak, memory and NVLink speed relative to H200. */
typedef struct costmodel_gpu {
    const char *name; /* "h200" */
    double peak_tflops;
    double mem_gib;      /* what cudaMemGetInfo reports as total */
    double nvlink_scale; /* NVLink bandwidth / H200's (NVLink 4: 1) */
} costmodel_gpu_t;

/* The GPU kind named text (h200, h100, a100, b200; case-insensitive), or NULL. */
const costmodel_gpu_t *costmodel_gpu(const char *text);

/* ---------------------------------------------------------------- inputs */

typedef struct costmodel_in {
    costmodel_model_t model;
    int seq;             /* T: tokens per sequence */
    int micro_batch;     /* B: sequences per GPU per micro-batch */
    int accum;           /* M: micro-batches per step (gradient accumulation) */
    bool ckpt;           /* activation checkpointing per block */
    double ckpt_budget;  /* --ckpt-budget in bytes (< 0: none): the last layers that fit keep
                          * their activations, as the trainers choose */
    int kept;            /* layers that keep their activations under checkpointing (the last) */
    bool head_whole;     /* every layer kept and the budget holds the head's whole logits */
    bool keep_attention; /* under checkpointing every layer keeps its attention's output and
                          * log-sum-exps, so a recomputation skips the attention (the
                          * trainers' --keep-attention, on by default) */
    bool fp8;            /* the trainers' --fp8 1: the layers' linear products take FP8
                          * operands (the head, attention and norms stay bf16), each layer
                          * keeps 1-byte codes of its products' inputs and weights */
    double fp8_speedup;  /* with fp8: those products run this many times faster */
    int zero_level;      /* 3: gathered in forward and again in backward; 2: once */
    int gather_bytes;    /* bytes per gathered parameter (bf16: 2) */
    int reduce_bytes;    /* bytes per gradient element in the reduce-scatter (f32: 4) */
    int shard_bytes;     /* bytes per element of the cross-group all-reduce (f32: 4) */
    double mfu;          /* compute runs at this fraction of peak_tflops */
    double peak_tflops;
    double gpu_mem_gib;
    costmodel_links_t links;
    double busbw_group, busbw_replica, busbw_world; /* > 0: given (--busbw-*); 0: links */
} costmodel_in_t;

/* What the user gave; 0 / NULL / -1 where not given. costmodel_setup turns it
 * into a costmodel_in_t with every default filled. */
typedef struct costmodel_opts {
    const char *model; /* --model NAME|COUNT (required) */
    int layers;        /* --layers, with a count */
    int seq, micro_batch, accum;
    int ckpt;               /* --ckpt 0|1; -1: 1 */
    double ckpt_budget_mib; /* --ckpt-budget MIB; < 0: not given */
    int keep_attention;     /* --keep-attention 0|1; -1: 1 */
    int fp8;                /* --fp8 0|1; -1: 0 */
    double fp8_speedup;     /* --fp8-speedup; 0: COSTMODEL_FP8_SPEEDUP */
    double mfu;             /* --mfu; 0: COSTMODEL_DEFAULT_MFU */
    const char *gpu;        /* --gpu; NULL: h200 */
    double gpu_mem_gib;
    double nvlink_gbps, nic_gbps; /* one busbw for all three collectives */
    double call_us;               /* >= 0: every protocol's call cost; < 0: fitted */
    double latency_us;            /* --latency-us; < 0: NCCL's table */
    double busbw_group, busbw_replica, busbw_world;
    int zero_level; /* 0: 3 */
    int grad_bytes; /* 0: 4 (the engine's f32 reduce) */
} costmodel_opts_t;

#define COSTMODEL_OPTS_INITIALIZER                                                                 \
    {                                                                                              \
        .ckpt = -1, .ckpt_budget_mib = -1, .keep_attention = -1, .fp8 = -1, .latency_us = -1,      \
        .call_us = -1                                                                              \
    }

/* The MFU our engine measured on one H200 without checkpointing (bench/NOTES.md:
 * d48 47.2%, d12 42.2%), used when --mfu is not given. */
#define COSTMODEL_DEFAULT_MFU 0.45

/* With --fp8 1: how many times faster the layers' linear products run with FP8
 * operands than in bf16, conversions included (--fp8-speedup). Fitted to GPT-2
 * d48 on one H200 without checkpointing, FP8 against bf16 in one call: 142.6
 * against 180.1 ms (bench/NOTES.md, eighteenth session), the products being
 * 90.3% of the model's FLOPs there. Hopper's FP8 peak is twice bf16's; the
 * conversions and the amax reductions take the rest. */
#define COSTMODEL_FP8_SPEEDUP 1.30

/* Fill *in from *o (defaults where not given). A GPT-2 preset with a --seq-len
 * beyond its 1024 positions gets a position table of that length (the
 * trainer's --max-seq; at most COSTMODEL_GPT2_MAX_POSITIONS), counted in its
 * parameters. Returns 0, or -1 with err naming the option: an unknown model or
 * GPU kind, --layers with a preset, --keep-attention or --ckpt-budget without
 * checkpointing, --fp8-speedup without --fp8 1, a --gpu-mem that leaves
 * nothing usable, a value out of range. *in is untouched on failure. */
int costmodel_setup(const costmodel_opts_t *o, costmodel_in_t *in, bmt_error_t *err);

/* ---------------------------------------------------------------- results */

/* One kind of collective in a step, on one communicator. */
typedef struct costmodel_row {
    const char *op; /* static text: "gather params (forward)", ... */
    costmodel_coll_t coll;
    costmodel_comm_t where;
    costmodel_span_t span;
    int calls;              /* per step */
    double bytes;           /* NCCL's nBytes summed over the calls */
    double sent;            /* bytes one GPU sends, summed over the calls */
    costmodel_choice_t big; /* NCCL's choice for the largest call */
    double seconds;         /* summed over the calls */
} costmodel_row_t;

#define COSTMODEL_ROWS 8

typedef struct costmodel_mem {
    double states;      /* f32 masters and AdamW's two moments: 12 P / G */
    double grads;       /* f32 gradient shards: 4 P / G */
    double gathered;    /* parameter slots (two blocks; every block at ZeRO-2) */
    double grad_full;   /* the full gradient buffers of a group of two or more */
    double activations; /* saved for the backward, at their peak */
    double transient;   /* one block's recomputation (checkpointing), the logits */
    double workspace;   /* the engine's own */
    double peak;        /* the estimate of the peak: see costmodel_eval */
    double usable;      /* gpu_mem_gib - COSTMODEL_RESERVE_GIB, in bytes */
    bool fits;          /* peak <= usable */
} costmodel_mem_t;

typedef struct costmodel_result {
    bmt_layout_t layout;
    costmodel_row_t rows[COSTMODEL_ROWS];
    int nrows;
    double compute;         /* seconds the compute stream is busy per step */
    double comm_busy;       /* seconds of the comm stream's collectives */
    double replica_busy;    /* seconds of the replica stream's collectives */
    double step;            /* the simulated step */
    double exposed;         /* step - compute */
    double exposed_replica; /* what the replica all-reduces add to the step */
    double exposed_group;   /* exposed - exposed_replica */
    double tokens_per_s;    /* the world's */
    double mfu;             /* model FLOPs (6N + 6LCT per token) / step / peak */
    costmodel_mem_t mem;
} costmodel_result_t;

/* Evaluate layout l. Returns 0 and fills *out, or -1 with err set when the layout
 * is inconsistent or in is out of range (costmodel_setup's ranges). */
int costmodel_eval(const bmt_layout_t *l, const costmodel_in_t *in, costmodel_result_t *out,
                   bmt_error_t *err);

/* A layout considered by the ranking, and why it is there. */
typedef struct costmodel_candidate {
    costmodel_result_t r;
    const char *why; /* "yours", "flat", "rail-aligned alternative", "divides the world" */
    bool yours;
} costmodel_candidate_t;

#define COSTMODEL_CANDIDATES 24

/* Step times closer than this fraction are not told apart: the recommendation
 * keeps the user's layout (the model's misses on measured runs reach ~12%, but
 * mostly in compute, which layouts of the same work share). */
#define COSTMODEL_MARGIN 0.01

/* Evaluate the user's layout and the others (same GPUs per node): flat ZeRO-3 (one
 * group of the world), the rail-aligned alternatives (bmt_layout_alternatives),
 * and every group size dividing the world. Sorted: layouts that fit by step time,
 * then those that do not by peak memory; at most max (the user's and flat always
 * kept). Returns the count, or -1 with err set. */
int costmodel_rank(const bmt_layout_t *user, const costmodel_in_t *in, costmodel_candidate_t *out,
                   size_t max, bmt_error_t *err);

/* The recommendation among n ranked candidates: the first that fits with the
 * user's number of GPUs (other worlds are shown, not recommended), or -1. */
int costmodel_recommended(const costmodel_candidate_t *cand, size_t n);

/* ---------------------------------------------------------------- parsing */

/* Parse a parameter count for the option named what ("--model"): a preset ("d48",
 * "gpt2-xl", "llama3-70b") or a decimal number with an optional exponent and an
 * optional case-insensitive suffix K, M, B or G, T ("1558000000", "1.5e9", "70B",
 * "350m"). Refuses empty text, signs, spaces, hexadecimal, inf/nan, trailing
 * characters, a count under 1 or over 1e15, with a message naming what. Returns 0
 * or -1; *out is untouched on failure. */
int costmodel_parse_params(const char *text, const char *what, double *out, bmt_error_t *err);

/* A bandwidth in GB/s: a decimal number in [COSTMODEL_MIN_GBPS, 1e5]. */
int costmodel_parse_gbps(const char *text, const char *what, double *out, bmt_error_t *err);

/* A latency in microseconds: a finite decimal number >= 0 and <= 1e6. */
int costmodel_parse_us(const char *text, const char *what, double *out, bmt_error_t *err);

/* A fraction in [COSTMODEL_MIN_MFU, 1] (--mfu). */
int costmodel_parse_fraction(const char *text, const char *what, double *out, bmt_error_t *err);

/* A speed-up factor in [COSTMODEL_MIN_FP8_SPEEDUP, 4] (--fp8-speedup). */
int costmodel_parse_speedup(const char *text, const char *what, double *out, bmt_error_t *err);

/* A memory size in GiB: > 0 and <= 1e6. */
int costmodel_parse_gib(const char *text, const char *what, double *out, bmt_error_t *err);

/* A memory size in MiB: >= 0 and <= 2^30 (--ckpt-budget, the trainers' range). */
int costmodel_parse_mib(const char *text, const char *what, double *out, bmt_error_t *err);

/* A ZeRO level: "2" or "3". */
int costmodel_parse_zero(const char *text, const char *what, int *out, bmt_error_t *err);

/* A dtype for gathers or gradients as bytes per element: "bf16", "fp16"/"f16" (2),
 * "f32"/"fp32" (4); case-insensitive. */
int costmodel_parse_dtype(const char *text, const char *what, int *bytes, bmt_error_t *err);

/* ---------------------------------------------------------------- output */

/* Append the model to a --plan text: the step's collectives on this layout, the
 * overlap, the memory, and the ranking with what decides it. cand and n are what
 * costmodel_rank returned (cand[i].yours marks the user's). Returns 0, or -1 on a
 * write error. */
int costmodel_print_text(FILE *out, const costmodel_in_t *in, const costmodel_candidate_t *cand,
                         size_t n);

/* The same as a new JSON object (the caller owns the reference), or NULL when out
 * of memory or a figure is not finite (JSON has no inf or nan; never an object
 * with a layout missing). docs/planner.md has its schema. */
json_t *costmodel_json(const costmodel_in_t *in, const costmodel_candidate_t *cand, size_t n);

#endif
