/* ycsb_hist.h: HDR-style log-bucket latency histogram (nanoseconds).
 *
 * Values below 2^(SUB_BITS+1) ns get one bucket each; above, every power of
 * two is split into 2^SUB_BITS linear buckets, so a bucket's width is under
 * 1/128 of its values (< 0.8 % relative error). Values up to 2^43 ns (~2.4 h)
 * are kept; larger ones land in the last bucket. Count, sum, min and max are
 * exact. Also used by examples/rpc_add/add_bench.c (so it stays free of
 * anything YCSB- or Redis-specific). */
#ifndef YCSB_HIST_H
#define YCSB_HIST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HIST_SUB_BITS 7
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_MAX_MSB 42
#define HIST_NB ((HIST_MAX_MSB - HIST_SUB_BITS + 1) * HIST_SUB + HIST_SUB)

typedef struct {
    uint64_t *b;
    uint64_t count, sum, min, max;
} hist_t;

static inline void hist_init(hist_t *h)
{
    memset(h, 0, sizeof *h);
    h->b = calloc(HIST_NB, sizeof *h->b);
    if (!h->b) abort();
    h->min = UINT64_MAX;
}

static inline void hist_free(hist_t *h)
{
    free(h->b);
    h->b = NULL;
}

static inline unsigned hist_index(uint64_t v)
{
    const uint64_t cap = ((uint64_t)2 << HIST_MAX_MSB) - 1;
    if (v > cap) v = cap;
    int msb = 63 - __builtin_clzll(v | 1);
    if (msb <= HIST_SUB_BITS) return (unsigned)v;
    int shift = msb - HIST_SUB_BITS;
    return (unsigned)shift * HIST_SUB + (unsigned)(v >> shift);
}

/* highest value that maps to bucket i */
static inline uint64_t hist_upper(unsigned i)
{
    if (i < 2 * HIST_SUB) return i;
    unsigned shift = (i >> HIST_SUB_BITS) - 1;
    uint64_t m = i - shift * HIST_SUB;
    return ((m + 1) << shift) - 1;
}

static inline void hist_record(hist_t *h, uint64_t v)
{
    h->b[hist_index(v)]++;
    h->count++;
    h->sum += v;
    if (v < h->min) h->min = v;
    if (v > h->max) h->max = v;
}

/* Records the n values first, first - step, ..., first - (n - 1) * step (the
 * caller keeps them >= 0) as n hist_record calls would, but a bucket at a
 * time: ycsb_redis --target counts the operations a run never started this
 * way, up to millions of them. */
static inline void hist_record_series(hist_t *h, uint64_t first, uint64_t step, uint64_t n)
{
    uint64_t v = first;
    while (n > 0) {
        unsigned i = hist_index(v);
        uint64_t lo = i ? hist_upper(i - 1) + 1 : 0; /* the bucket's lowest value */
        uint64_t m = step ? (v - lo) / step + 1 : n;  /* values from v down still in it */
        if (m > n) m = n;
        uint64_t last = v - (m - 1) * step;
        h->b[i] += m;
        h->count += m;
        h->sum += m * v - step * (m * (m - 1) / 2);
        if (last < h->min) h->min = last;
        if (v > h->max) h->max = v;
        n -= m;
        if (n) v = last - step;
    }
}

static inline void hist_merge(hist_t *dst, const hist_t *src)
{
    if (!src->count) return;
    for (unsigned i = 0; i < HIST_NB; i++) dst->b[i] += src->b[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min) dst->min = src->min;
    if (src->max > dst->max) dst->max = src->max;
}

/* p-th percentile (0 < p <= 100) in microseconds: the upper bound of the
 * bucket holding the ceil(p% * count)-th smallest value, capped at max. */
static inline double hist_pct_us(const hist_t *h, double p)
{
    if (!h->count) return 0;
    uint64_t target = (uint64_t)((p / 100.0) * (double)h->count + 0.999999999);
    if (target < 1) target = 1;
    if (target > h->count) target = h->count;
    uint64_t cum = 0;
    for (unsigned i = 0; i < HIST_NB; i++) {
        cum += h->b[i];
        if (cum >= target) {
            uint64_t u = hist_upper(i);
            return (double)(u < h->max ? u : h->max) / 1000.0;
        }
    }
    return (double)h->max / 1000.0;
}

static inline double hist_mean_us(const hist_t *h) { return h->count ? (double)h->sum / (double)h->count / 1000.0 : 0; }
static inline double hist_max_us(const hist_t *h) { return h->count ? (double)h->max / 1000.0 : 0; }

#endif
