/* tests/progs/keep_check.c — what the trainers' --ckpt-budget relies on: a
 * model's act_bytes (the bytes one kept layer's activations take, and what
 * the head's whole logits add) against what keeping layers really holds.
 *
 *     bmlaunch -n 1 [--device cuda] -- keep_check --model gpt2|llama [--fp8 1]
 *                                             [--keep-attention 1]
 *
 * For k = 0, 1, 2, L-1 and L kept layers (llama_model_keep_layers /
 * gpt2_model_keep_layers, the head chunked), then L with the head's logits
 * whole: a fresh model of the trainers' "tiny" shape (B 4, T 64) with
 * checkpointing (and, with --keep-attention 1, each layer's attention output
 * kept outside the sets: *_model_keep_attention), one batch, one forward
 * (nothing of the backward), and the
 * activation memory the context counts afterwards (bmt_mem_get_stats: the
 * bytes asked for, stream-ordered ones as enqueued). A(k) is that count.
 * Checks, exact (the counters count requested bytes):
 *   A(k) - A(0) = k x layer for 0 < k < L: each kept layer holds one set;
 *   A(L) - A(0) = (L - 1) x layer: with no layer recomputed the scratch set
 *     that the recomputed layers share is not made (so the trainer's budget,
 *     which counts L sets, errs on the safe side by one);
 *   A(L, head) - A(L) >= head: the whole logits hold at least what act_bytes
 *     says they add (cuda; 0 on cpu, whose head keeps them whole always).
 * Output: "ok N - ..." / "not ok N - ..." lines and a summary; exit 1 on any
 * failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/device.h"
#include "gpt2/model.h"
#include "llama/config.h"
#include "llama/model.h"

enum {
    B = 4,
    T = 64
};

static int tap_n, tap_failed;

static void ok(int good, const char *what, long long got, long long want)
{
    printf("%sok %d - %s: %lld bytes (want %lld)\n", good ? "" : "not ", ++tap_n, what, got, want);
    tap_failed += !good;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "keep_check: " __VA_ARGS__);                                               \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

/* One model of either kind behind the calls the check makes. */
typedef struct model {
    bool llama;
    void *m;
} model_t;

static int keep_attention; /* --keep-attention */

static int model_make(bmt_ctx_t *ctx, bool llama, int fp8, model_t *out, bmt_error_t *err)
{
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER; /* checkpointing on */
    out->llama = llama;
    if (llama) {
        const llama_config_t c = { .n_layer = 4,
                                   .n_embd = 64,
                                   .n_head = 4,
                                   .n_kv_head = 2,
                                   .head_dim = 16,
                                   .ffn = 176,
                                   .vocab_size = 256,
                                   .max_seq_len = 256,
                                   .rms_eps = 1e-5,
                                   .rope_theta = 10000,
                                   .bos_token_id = -1 };
        out->m = llama_model_create(ctx, &c, B, T, &lc, 1, err);
        return out->m && llama_model_keep_attention(out->m, keep_attention, err) == 0 &&
                       (!fp8 || llama_model_fp8(out->m, 1, 0, err) == 0)
                   ? 0
                   : -1;
    }
    gpt2_config_t c;
    if (gpt2_config_by_name("tiny", &c, err) < 0)
        return -1;
    out->m = gpt2_model_create(ctx, &c, B, T, &lc, 1, err);
    return out->m && gpt2_model_keep_attention(out->m, keep_attention, err) == 0 &&
                   (!fp8 || gpt2_model_fp8(out->m, 1, 0, err) == 0)
               ? 0
               : -1;
}

static int keep(model_t *m, int k, bool head, bmt_error_t *err)
{
    return m->llama ? llama_model_keep_layers(m->m, k, head, err)
                    : gpt2_model_keep_layers(m->m, k, head, err);
}

static int act_bytes(model_t *m, int64_t *layer, int64_t *head)
{
    return m->llama ? llama_model_act_bytes(m->m, layer, head)
                    : gpt2_model_act_bytes(m->m, layer, head);
}

static int set_batch(model_t *m, const int32_t *in, const int32_t *tg, bmt_error_t *err)
{
    return m->llama ? llama_model_set_batch(m->m, in, tg, err)
                    : gpt2_model_set_batch(m->m, in, tg, err);
}

static bmt_blocklist_t *list_of(model_t *m)
{
    return m->llama ? llama_model_list(m->m) : gpt2_model_list(m->m);
}

static void model_free(model_t *m)
{
    if (m->llama)
        llama_model_destroy(m->m);
    else
        gpt2_model_destroy(m->m);
    m->m = NULL;
}

/* A(k): the activation bytes held after one forward of a fresh model that
 * keeps k layers (and the head's logits whole with head); *layer and *head
 * from its act_bytes, *L its layers. */
static long long held(bmt_ctx_t *ctx, bool llama, int fp8, int k, bool head, int64_t *layer,
                      int64_t *hb, int *L)
{
    bmt_error_t err;
    model_t m;
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++)
        in[i] = (i * 37 + 11) % 256, tg[i] = (i * 53 + 7) % 256;
    if (model_make(ctx, llama, fp8, &m, &err) < 0)
        DIE("%s", err.text);
    *L = act_bytes(&m, layer, hb);
    if (k < 0)
        k = *L + k + 1; /* -1: L, -2: L - 1 */
    bmt_mem_stats_t st;
    if (keep(&m, k, head, &err) < 0 || set_batch(&m, in, tg, &err) < 0 ||
        bmt_blocklist_forward(list_of(&m), &err) < 0 || bmt_device_synchronize(ctx, &err) < 0)
        DIE("%s", err.text);
    bmt_mem_get_stats(ctx, &st);
    model_free(&m);
    return (long long)st.current[BMT_MEM_ACTIVATION];
}

int main(int argc, char **argv)
{
    bool llama = false;
    int fp8 = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            llama = strcmp(argv[++i], "llama") == 0;
        else if (strcmp(argv[i], "--fp8") == 0 && i + 1 < argc)
            fp8 = atoi(argv[++i]);
        else if (strcmp(argv[i], "--keep-attention") == 0 && i + 1 < argc)
            keep_attention = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: keep_check --model gpt2|llama [--fp8 0|1] [--keep-attention 0|1]\n");
            return 2;
        }
    }
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        DIE("%s", err.text);
    const char *name = llama ? "llama" : "gpt2";
    int64_t layer = 0, head = 0;
    int L = 0;
    const long long a0 = held(ctx, llama, fp8, 0, false, &layer, &head, &L);
    printf("# %s on %s%s%s: L %d, act_bytes: a layer %lld, the head %lld; A(0) = %lld\n", name,
           bmt_device(ctx) == BMT_DEVICE_CUDA ? "cuda" : "cpu", fp8 ? ", FP8" : "",
           keep_attention ? ", attention kept" : "", L, (long long)layer, (long long)head, a0);
    char what[160];
    const int ks[] = { 1, 2, -2 };
    for (int i = 0; i < 3; i++) {
        int64_t l2, h2;
        int L2;
        const long long a = held(ctx, llama, fp8, ks[i], false, &l2, &h2, &L2);
        const int k = ks[i] < 0 ? L + ks[i] + 1 : ks[i];
        snprintf(what, sizeof(what), "%s: %d of %d layers kept hold %d x act_bytes' layer more",
                 name, k, L, k);
        ok(a - a0 == (long long)k * layer, what, a - a0, (long long)k * layer);
    }
    int64_t l2, h2;
    int L2;
    const long long aL = held(ctx, llama, fp8, -1, false, &l2, &h2, &L2);
    snprintf(what, sizeof(what),
             "%s: every layer kept holds %d x the layer more (no scratch set for recomputations)",
             name, L - 1);
    ok(aL - a0 == (long long)(L - 1) * layer, what, aL - a0, (long long)(L - 1) * layer);
    const long long aH = held(ctx, llama, fp8, -1, true, &l2, &h2, &L2);
    snprintf(what, sizeof(what), "%s: the head's logits whole hold at least act_bytes' head more",
             name);
    ok(aH - aL >= head && layer > 0, what, aH - aL, (long long)head);
    printf("keep_check: %d passed, %d failed\n", tap_n - tap_failed, tap_failed);
    bmt_finalize(ctx);
    return tap_failed ? 1 : 0;
}
