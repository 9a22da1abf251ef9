/* examples/generate/sample.h — choosing the next token from a row of logits:
 * greedy, or a seeded draw after temperature and top-k.
 *
 * Pure: no I/O, no allocation, no global state. The draw depends only on the
 * logits, the settings and the RNG's state, through integer arithmetic and
 * IEEE double operations in a fixed order, so a seed gives the same ids on
 * every machine (docs/generate.md, "Sampling").
 *
 * The RNG is xoshiro256** (Blackman and Vigna, 2018), its 256-bit state filled
 * from the 64-bit seed by splitmix64, as its authors recommend.
 */
#ifndef GEN_SAMPLE_H
#define GEN_SAMPLE_H

#include <stdint.h>

typedef struct gen_rng {
    uint64_t s[4];
} gen_rng_t;

/* The state for seed (any value, 0 included): s[i] = the i-th output of
 * splitmix64 started at seed. */
void gen_rng_seed(gen_rng_t *r, uint64_t seed);

/* The next 64 bits of xoshiro256**. */
uint64_t gen_rng_next(gen_rng_t *r);

/* A double in [0, 1): the top 53 bits of gen_rng_next times 2^-53. */
double gen_rng_uniform(gen_rng_t *r);

typedef struct gen_sampling {
    double temperature; /* 0: greedy; > 0: the logits are divided by it */
    int top_k;          /* 0: every token; k >= 1: only the k largest logits */
} gen_sampling_t;

/* The next token of a row of V logits (finite; the caller checks).
 *   greedy (temperature 0, or top_k 1): the index of the largest logit, the
 *     lowest index among equal ones; no random number is used;
 *   else: the candidates are every token in index order (top_k 0 or >= V), or
 *     the top_k largest logits in decreasing order, equal logits by increasing
 *     index; each candidate i has weight w_i = exp((z_i - z_max) / temperature)
 *     (double); u = gen_rng_uniform(r) * sum w; the token is the first
 *     candidate whose running sum of weights exceeds u (the last one if
 *     rounding leaves none). One random number per call.
 * order: scratch of V ints (used when 0 < top_k < V). */
int gen_sample(const float *logits, int V, const gen_sampling_t *s, gen_rng_t *r, int *order);

/* The index of the largest of V logits, the lowest among equal ones. */
int gen_argmax(const float *logits, int V);

#endif
