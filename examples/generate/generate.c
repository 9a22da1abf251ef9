/* examples/generate/generate.c — bin/generate: sample from a GPT-2 or Llama
 * checkpoint (docs/generate.md).
 *
 *   generate DIR --prompt-ids 1,2,3 [-n N] [--temperature X] [--top-k K] [--seed S]
 *   generate DIR --prompt TEXT --text ...           (byte-level models: V 256)
 *
 * Layer: a program above the decoders (decode.h) and the sampler (sample.h);
 * it owns the command line, the loop and the output. The loop: one forward
 * over the prompt (prefill), then per new token: choose it from the last
 * logits, and, unless it is the last, run it through the model at its
 * position (the cache holds the rest). --no-cache (a test's option) runs the
 * whole sequence again at every step instead, which must give the same bits
 * on the CPU (on the GPU the same numbers to bf16 rounding: docs/generate.md).
 *
 * Devices: --device cpu (the default) runs the CPU decoders in this process;
 * --device cuda runs the CUDA decoder (decode_cuda.c), which lives in another
 * binary, bin/generate-cuda: this file built with GEN_CUDA_MAIN and linked
 * with nn's CUDA layers and cuBLAS. bin/generate runs it (execv, the same
 * arguments) from its own directory once the command line is checked. Why two
 * binaries: libcublasLt's initializers run at every start of a program that
 * links it (0.5-0.8 s and 220 MB on this project's 2-core machine, before
 * main), which the CPU path must not pay; one binary would need dlopen.
 *
 * Output: the new ids on one line, space separated; with --text, then their
 * bytes and a newline. Nothing is printed before the whole sequence exists,
 * so a failure prints one line "generate: ..." on stderr and no ids: exit 2
 * for the command line (a bad value, an id outside the vocabulary, a sequence
 * longer than the model's positions), 1 for the files (directory, config.json,
 * generation_config.json, safetensors) or the model (a non-finite logit).
 * The end-of-sequence ids are generation_config.json's when the directory has
 * one, else config.json's, as transformers' generate() takes them (gencfg.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "decode.h"
#include "common/data.h"
#include "sample.h"

#define MAX_TOKENS (1 << 24) /* prompt and new tokens, each */

static const char USAGE[] =
    "usage: generate DIR (--prompt-ids ID,ID,... | --prompt TEXT) [options]\n"
    "  DIR                   an HF model directory (config.json: model_type gpt2, llama\n"
    "                        or mistral; model.safetensors, else model.safetensors.index.json;\n"
    "                        generation_config.json if any), or a trainer's --save-dir (the\n"
    "                        step its `latest` names)\n"
    "  --prompt-ids LIST     the prompt's token ids, comma separated\n"
    "  --prompt TEXT         the prompt's bytes as tokens (byte-level models: vocab_size 256)\n"
    "  -n, --new-tokens N    tokens to generate (default 32); prompt + N <= the model's positions\n"
    "  --temperature X       0 (default): greedy; > 0: sample from softmax(logits / X)\n"
    "  --top-k K             sample from the K largest logits only (default 0: all)\n"
    "  --seed S              the sampler's seed, an unsigned 64-bit integer (default 1337)\n"
    "  --ignore-eos          do not stop at the end-of-sequence ids (eos_token_id of\n"
    "                        generation_config.json, else of config.json)\n"
    "  --text                print the new tokens as bytes too, after the ids (vocab_size 256)\n"
    "  --device cpu|cuda     cpu (default): f32 on the CPU; cuda: bf16 on GPU 0 (of\n"
    "                        CUDA_VISIBLE_DEVICES), through bin/generate-cuda\n"
    "  -v, --verbose         the model, the time taken and the end-of-sequence ids, on stderr\n"
    "  -h, --help            this text\n";

/* One line on stderr and the exit status: 2 for the command line, 1 else. */
static _Noreturn void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("generate: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static long long parse_int(const char *opt, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi)
        die(2, "%s needs an integer from %lld to %lld, not '%s'", opt, lo, hi, s);
    return v;
}

static uint64_t parse_seed(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s < '0' || *s > '9' || *end != '\0' || errno != 0)
        die(2, "--seed needs an unsigned 64-bit integer, not '%s'", s);
    return v;
}

static double parse_temperature(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !isfinite(v) || v < 0)
        die(2, "--temperature needs a number >= 0, not '%s'", s);
    if (errno == ERANGE) /* too large is caught above: this is a number too small */
        die(2, "--temperature %s is too small for a double; use 0 for greedy decoding", s);
    return v;
}

/* "1,2,3" into a malloc'd list of *n ids (each 0 .. 2^31 - 1). */
static int32_t *parse_ids(const char *s, int *n)
{
    int cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (ids == NULL)
        die(1, "out of memory");
    for (const char *p = s;;) {
        const char *e = p;
        while (*e >= '0' && *e <= '9')
            e++;
        if (e == p || (*e != ',' && *e != '\0'))
            die(2, "--prompt-ids needs token ids separated by commas (\"1,2,3\"), not '%s'", s);
        while (e - p > 1 && *p == '0') /* leading zeros say nothing */
            p++;
        if (e - p > 10)
            die(2, "--prompt-ids: token %.*s is too large", (int)(e - p), p);
        char num[12];
        memcpy(num, p, (size_t)(e - p));
        num[e - p] = '\0';
        long long v = strtoll(num, NULL, 10);
        if (v > INT32_MAX)
            die(2, "--prompt-ids: token %s is too large", num);
        if (k == MAX_TOKENS)
            die(2, "--prompt-ids: more than %d tokens", MAX_TOKENS);
        if (k == cap && (ids = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t))) == NULL)
            die(1, "out of memory");
        ids[k++] = (int32_t)v;
        if (*e == '\0')
            break;
        p = e + 1;
    }
    *n = k;
    return ids;
}

/* dir, or, for a trainer's --save-dir (step directories and `latest` naming
 * the newest; docs/checkpoints.md), the step directory `latest` names, or
 * .tmp-NAME~old when a crash left NAME there. The rule of bmt_ckpt_resolve,
 * kept here: that lives in ckpt.o, which brings the runtime's communicators
 * (NCCL) into the generate-cuda mock, built without CUDA's libraries. */
static const char *model_dir(const char *dir, char *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (access(path, F_OK) == 0)
        return dir;
    snprintf(path, sizeof(path), "%s/latest", dir);
    /* O_NONBLOCK: a FIFO named latest must not block the open (it is refused) */
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dir;
    struct stat sb;
    FILE *f = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? fdopen(fd, "r") : NULL;
    if (f == NULL) {
        close(fd);
        die(1, "%s: not a regular file: a --save-dir's latest names its newest step directory",
            path);
    }
    char name[256] = "";
    const int ok = fgets(name, sizeof(name), f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    if (!ok || name[0] == '\0' || name[0] == '.' || strchr(name, '/'))
        die(1, "%s: '%s' is not the name of a step directory", path, name);
    if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
        die(1, "%s: the path is too long", path);
    if (stat(buf, &sb) == 0)
        return buf;
    /* A crash between the two renames of a re-saved name left its previous
     * checkpoint aside, whole, where a load through latest reads it
     * (docs/checkpoints.md, "Trust"). */
    const int e = errno;
    if ((size_t)snprintf(buf, len, "%s/.tmp-%s~old", dir, name) >= len || stat(buf, &sb) != 0)
        die(1,
            "%s names %s, which %s does not hold (%s): give a step directory, or write the name "
            "of one into latest",
            path, name, dir, strerror(e));
    return buf;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifndef GEN_CUDA_MAIN
/* --device cuda: generate-cuda, in this binary's directory, with the same
 * arguments (see the note at the top). Does not return: it becomes that
 * program, or prints one line and exits 1. */
static _Noreturn void exec_cuda(char **argv)
{
#ifndef BMT_HAVE_CUDA
    (void)argv;
    die(1, "--device cuda: this bmt was built without CUDA (no nvcc or cuda_runtime.h under "
           "CUDA_HOME, or NO_CUDA=1; docs/building.md)");
#else
    char self[4096], path[4096 + 16];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0)
        die(1, "--device cuda: /proc/self/exe: %s", strerror(errno));
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    *(slash ? slash : self) = '\0';
    snprintf(path, sizeof(path), "%s/generate-cuda", slash ? self : ".");
    fflush(NULL);
    execv(path, argv);
    die(1, "--device cuda runs in %s: %s", path, strerror(errno));
#endif
}
#endif

/* How to extend a sequence. */
typedef struct run {
    int n_new;               /* tokens to add, at most */
    gen_sampling_t sampling; /* how to choose each */
    uint64_t seed;           /* the sampler's */
    int ignore_eos;          /* 1: go on past an end-of-sequence token */
    int no_cache;            /* 1: run the whole sequence again at every step */
    FILE *dump;              /* NULL, or where each step's logits go (V f32) */
    const char *dump_name;
} run_t;

/* The loop every decoder shares: prefill the np tokens of seq (room for np +
 * r->n_new), then per new token choose it from the last logits and, unless it
 * is the last or an end-of-sequence token, run it at its position. Returns
 * the new length of seq, or -1 and err; *t_prefill: seconds of the prefill. */
static int extend(gen_decoder_t *d, const run_t *r, int32_t *seq, int np, double *t_prefill,
                  bmt_error_t *err)
{
    const int V = d->info.vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    int *order = malloc((size_t)V * sizeof(int));
    int len = np, rc = logits && order ? 0 : -1;
    if (rc < 0)
        snprintf(err->text, sizeof(err->text), "out of memory");
    gen_rng_t rng;
    gen_rng_seed(&rng, r->seed);
    double t0 = now_s();
    if (rc == 0 && !r->no_cache)
        rc = gen_decoder_forward(d, seq, np, logits, err);
    *t_prefill = now_s() - t0;
    while (rc == 0 && len < np + r->n_new) {
        if (r->no_cache) {
            gen_decoder_reset(d);
            if ((rc = gen_decoder_forward(d, seq, len, logits, err)) < 0)
                break;
        }
        if (r->dump && fwrite(logits, sizeof(float), (size_t)V, r->dump) != (size_t)V) {
            rc = -1;
            snprintf(err->text, sizeof(err->text), "%s: %s", r->dump_name, strerror(errno));
            break;
        }
        const int tok = gen_sample(logits, V, &r->sampling, &rng, order);
        seq[len++] = tok;
        int eos = 0;
        for (int i = 0; !r->ignore_eos && i < d->info.n_eos; i++)
            eos |= tok == d->info.eos[i];
        if (eos || len == np + r->n_new)
            break;
        if (!r->no_cache)
            rc = gen_decoder_forward(d, &seq[len - 1], 1, logits, err);
    }
    free(logits);
    free(order);
    return rc < 0 ? -1 : len;
}

enum {
    OPT_PROMPT_IDS = 256,
    OPT_PROMPT,
    OPT_TEMP,
    OPT_TOPK,
    OPT_SEED,
    OPT_TEXT,
    OPT_NO_EOS,
    OPT_NO_CACHE,
    OPT_DUMP,
    OPT_DEVICE
};

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "prompt-ids", required_argument, NULL, OPT_PROMPT_IDS },
        { "prompt", required_argument, NULL, OPT_PROMPT },
        { "new-tokens", required_argument, NULL, 'n' },
        { "temperature", required_argument, NULL, OPT_TEMP },
        { "top-k", required_argument, NULL, OPT_TOPK },
        { "seed", required_argument, NULL, OPT_SEED },
        { "ignore-eos", no_argument, NULL, OPT_NO_EOS },
        { "text", no_argument, NULL, OPT_TEXT },
        { "device", required_argument, NULL, OPT_DEVICE },
        { "verbose", no_argument, NULL, 'v' },
        { "help", no_argument, NULL, 'h' },
        /* for tests (docs/generate.md): no KV cache; each step's logits to a file */
        { "no-cache", no_argument, NULL, OPT_NO_CACHE },
        { "dump-logits", required_argument, NULL, OPT_DUMP },
        { NULL, 0, NULL, 0 },
    };
    const char *ids_arg = NULL, *text_arg = NULL, *dump = NULL;
    int n_new = 32, text = 0, verbose = 0, no_cache = 0, ignore_eos = 0, cuda = 0;
    gen_sampling_t smp = { 0, 0 };
    uint64_t seed = 1337;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":n:vh", opts, NULL)) != -1) {
        switch (c) {
        /* a second prompt is refused, not taken for the first: which one was meant? */
        case OPT_PROMPT_IDS:
            if (ids_arg)
                die(2, "--prompt-ids is given twice: give one prompt (its ids comma separated)");
            ids_arg = optarg;
            break;
        case OPT_PROMPT:
            if (text_arg)
                die(2, "--prompt is given twice: give one prompt");
            text_arg = optarg;
            break;
        case 'n': n_new = (int)parse_int("-n", optarg, 1, MAX_TOKENS); break;
        case OPT_TEMP: smp.temperature = parse_temperature(optarg); break;
        case OPT_TOPK: smp.top_k = (int)parse_int("--top-k", optarg, 0, INT32_MAX); break;
        case OPT_SEED: seed = parse_seed(optarg); break;
        case OPT_NO_EOS: ignore_eos = 1; break;
        case OPT_TEXT: text = 1; break;
        case 'v': verbose = 1; break;
        case 'h': /* a usage that was not written is no success (a full disk, a closed stdout) */
            if (fputs(USAGE, stdout) == EOF || fflush(stdout) != 0)
                die(1, "stdout: %s", strerror(errno));
            return 0;
        case OPT_NO_CACHE: no_cache = 1; break;
        case OPT_DUMP: dump = optarg; break;
        case OPT_DEVICE:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                die(2, "--device needs cpu or cuda, not '%s'", optarg);
            cuda = strcmp(optarg, "cuda") == 0;
            break;
        case ':': die(2, "%s needs a value", argv[optind - 1]);
        default: die(2, "unknown option '%s' (generate --help)", argv[optind - 1]);
        }
    }
    if (optind == argc)
        die(2, "no model directory (generate DIR --prompt-ids ...; --help)");
    if (optind != argc - 1)
        die(2, "one model directory, not several ('%s' and '%s')", argv[optind], argv[argc - 1]);
    char dirbuf[4096];
    const char *dir = model_dir(argv[optind], dirbuf, sizeof(dirbuf));
    if (ids_arg && text_arg)
        die(2, "--prompt-ids and --prompt: give one prompt");
    if (!ids_arg && !text_arg)
        die(2, "no prompt: give --prompt-ids or --prompt");
    if (text_arg && text_arg[0] == '\0')
        die(2, "--prompt is empty: give at least one byte");
    if (smp.temperature == 0 && smp.top_k > 1)
        die(2,
            "--top-k %d samples, and temperature 0 (the default) is greedy: give "
            "--temperature X > 0 as well, or drop --top-k",
            smp.top_k);

    bmt_error_t err = { { 0 } };
    gen_model_info_t info;
    if (gen_model_info(dir, &info, &err) < 0)
        die(1, "%s", err.text);
    const int V = info.vocab_size;
    if ((text_arg || text) && V != DATA_BYTE_VOCAB)
        die(2,
            "%s encodes bytes as tokens, for byte-level models (vocab_size %d); %s has "
            "vocab_size %d: use --prompt-ids%s",
            text_arg ? "--prompt" : "--text", DATA_BYTE_VOCAB, dir, V,
            text_arg ? "" : " and print the ids");
    int np = 0;
    int32_t *prompt;
    if (ids_arg) {
        prompt = parse_ids(ids_arg, &np);
        for (int i = 0; i < np; i++)
            if (prompt[i] >= V)
                die(2, "--prompt-ids: token %d (number %d) is outside the vocabulary [0, %d) of %s",
                    prompt[i], i + 1, V, dir);
    } else {
        size_t len = strlen(text_arg);
        if (len > MAX_TOKENS)
            die(2, "--prompt: more than %d bytes", MAX_TOKENS);
        np = (int)len;
        if ((prompt = malloc(len * sizeof(int32_t))) == NULL)
            die(1, "out of memory");
        for (int i = 0; i < np; i++)
            prompt[i] = (unsigned char)text_arg[i];
    }
    if ((long long)np + n_new > info.max_positions)
        die(2, "a prompt of %d tokens and -n %d make %lld positions; the model has %d (%s)", np,
            n_new, (long long)np + n_new, info.max_positions,
            strcmp(info.model_type, "gpt2") == 0 ? "n_positions" : "max_position_embeddings");

#ifdef GEN_CUDA_MAIN
    gen_decoder_t *(*open_decoder)(const char *, int, bmt_error_t *) =
        cuda ? gen_decoder_open_cuda : gen_decoder_open_cpu;
#else
    if (cuda) /* the command line is good: the rest runs in generate-cuda */
        exec_cuda(argv);
    gen_decoder_t *(*open_decoder)(const char *, int, bmt_error_t *) = gen_decoder_open_cpu;
#endif
    double t0 = now_s();
    gen_decoder_t *d = open_decoder(dir, np + n_new, &err);
    if (d == NULL)
        die(1, "%s", err.text);
    double t1 = now_s();
    /* The failures below free what is open before they end the program, so
     * that a sanitizer build reports no leak on them (test_generate's full
     * disk and closed stdout). */
    FILE *dumpf = NULL;
    if (dump && (dumpf = fopen(dump, "wb")) == NULL) {
        const int e = errno;
        gen_decoder_destroy(d), free(prompt);
        die(1, "%s: %s", dump, strerror(e));
    }

    /* seq: the prompt, then the new tokens */
    int32_t *seq = malloc(((size_t)np + n_new) * sizeof(int32_t));
    if (seq == NULL) {
        gen_decoder_destroy(d), free(prompt);
        die(1, "out of memory");
    }
    memcpy(seq, prompt, (size_t)np * sizeof(int32_t));
    const run_t run = { n_new, smp, seed, ignore_eos, no_cache, dumpf, dump };
    double t_prefill = 0;
    const int len = extend(d, &run, seq, np, &t_prefill, &err);
    if (len < 0) {
        if (dumpf)
            fclose(dumpf);
        gen_decoder_destroy(d), free(seq), free(prompt);
        die(1, "%s", err.text);
    }
    const int got = len - np;
    double t2 = now_s();
    if (dumpf && fclose(dumpf) != 0) {
        const int e = errno;
        gen_decoder_destroy(d), free(seq), free(prompt);
        die(1, "%s: %s", dump, strerror(e));
    }

    for (int i = np; i < len; i++)
        printf("%s%d", i > np ? " " : "", seq[i]);
    putchar('\n');
    if (text) {
        for (int i = np; i < len; i++)
            putchar(seq[i]);
        putchar('\n');
    }
    if (fflush(stdout) != 0) {
        const int e = errno;
        gen_decoder_destroy(d), free(seq), free(prompt);
        die(1, "stdout: %s", strerror(e));
    }
    if (verbose)
        fprintf(stderr,
                "generate: %s (%s) from %s: loaded in %.3f s; prompt %d tokens in %.1f ms; %d new "
                "tokens in %.1f ms (%.1f tokens/s)%s\n",
                d->info.model_type, d->info.summary, dir, t1 - t0, np, t_prefill * 1e3, got,
                (t2 - t1 - t_prefill) * 1e3, got / (t2 - t1 - t_prefill),
                got < n_new ? "; stopped at the end-of-sequence token" : "");
    if (verbose) { /* where the end of a sequence came from (docs/generate.md) */
        char ids[GEN_MAX_EOS * 12 + 8] = "none";
        for (int i = 0, at = 0; i < d->info.n_eos; i++)
            at +=
                snprintf(ids + at, sizeof(ids) - (size_t)at, "%s%d", i ? " " : "", d->info.eos[i]);
        fprintf(stderr, "generate: end-of-sequence ids: %s, from %s%s\n", ids, d->info.eos_from,
                ignore_eos && d->info.n_eos ? " (not applied: --ignore-eos)" : "");
        if (d->info.sampling[0])
            fprintf(stderr,
                    "generate: %s's sampling settings (%s) are not applied: generate's own flags "
                    "decide (--temperature, --top-k; greedy without them)\n",
                    d->info.sampling_from, d->info.sampling);
    }
    gen_decoder_destroy(d);
    free(seq);
    free(prompt);
    return 0;
}
