/* examples/generate/sample.c — the token sampler (see sample.h).
 *
 * Layer: pure functions under the generate program; nothing of libbmt.
 *
 * Top-k keeps the k best candidates in a min-heap ordered by (logit, -index),
 * a total order, so the set and its sorted order are unique whatever the
 * input order of equal logits: O(V log k) per token, no allocation.
 */
#include "sample.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void gen_rng_seed(gen_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t gen_rng_next(gen_rng_t *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double gen_rng_uniform(gen_rng_t *r) { return (double)(gen_rng_next(r) >> 11) * 0x1.0p-53; }

int gen_argmax(const float *logits, int V)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* Candidate a goes before b: a larger logit, or the same and a lower index. */
static int better(const float *z, int a, int b) { return z[a] > z[b] || (z[a] == z[b] && a < b); }

/* The min-heap h (n): the worst candidate at the root. */
static void sift_down(int *h, int n, int i, const float *z)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && better(z, h[c], h[c + 1]))
            c++; /* the worse child */
        if (!better(z, h[i], h[c]))
            return;
        int t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

static void sift_up(int *h, int i, const float *z)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!better(z, h[p], h[i]))
            return;
        int t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* The k best indices of z (V), best first, into order (k). */
static void top_k(const float *z, int V, int k, int *order)
{
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n < k) {
            order[n] = i;
            sift_up(order, n++, z);
        } else if (better(z, i, order[0])) {
            order[0] = i;
            sift_down(order, n, 0, z);
        }
    }
    for (int end = n - 1; end > 0; end--) { /* the worst left goes last */
        int t = order[0];
        order[0] = order[end];
        order[end] = t;
        sift_down(order, end, 0, z);
    }
}

int gen_sample(const float *logits, int V, const gen_sampling_t *s, gen_rng_t *r, int *order)
{
    if (s->temperature == 0 || s->top_k == 1)
        return gen_argmax(logits, V);
    const int k = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    if (k < V)
        top_k(logits, V, k, order);
    const double zmax = logits[k < V ? order[0] : gen_argmax(logits, V)];
    double sum = 0;
    for (int j = 0; j < k; j++)
        sum += exp((logits[k < V ? order[j] : j] - zmax) / s->temperature);
    const double u = gen_rng_uniform(r) * sum;
    double run = 0;
    int last = -1; /* the last candidate with a weight: u may round up to sum */
    for (int j = 0; j < k; j++) {
        const int i = k < V ? order[j] : j;
        const double w = exp((logits[i] - zmax) / s->temperature);
        run += w;
        if (w > 0)
            last = i;
        if (run > u)
            return i;
    }
    return last >= 0 ? last : (k < V ? order[0] : gen_argmax(logits, V));
}
