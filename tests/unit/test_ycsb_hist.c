/* test_ycsb_hist.c -- the load generators' latency histogram
 * (bench/ycsb/ycsb_hist.h): hist_record_series, which ycsb_redis --target
 * uses to count the operations a run never started a bucket at a time, must
 * leave exactly what the same values recorded one by one leave (every
 * bucket, count, sum, min, max), across the one-value buckets, the
 * log-linear ones and the capped last bucket; and the percentiles read
 * from it are those of the one-by-one histogram. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "../../bench/ycsb/ycsb_hist.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Records the series both ways; true if the histograms are the same. */
static bool same_both_ways(uint64_t first, uint64_t step, uint64_t n)
{
    hist_t a, b;
    hist_init(&a);
    hist_init(&b);
    for (uint64_t k = 0; k < n; k++)
        hist_record(&a, first - k * step);
    hist_record_series(&b, first, step, n);
    bool same = a.count == b.count && a.sum == b.sum && a.min == b.min && a.max == b.max &&
                memcmp(a.b, b.b, HIST_NB * sizeof *a.b) == 0 && hist_pct_us(&a, 99) == hist_pct_us(&b, 99) &&
                hist_pct_us(&a, 50) == hist_pct_us(&b, 50);
    if (!same)
        printf("differs: first=%llu step=%llu n=%llu (count %llu/%llu sum %llu/%llu min %llu/%llu max %llu/%llu)\n",
               (unsigned long long)first, (unsigned long long)step, (unsigned long long)n,
               (unsigned long long)a.count, (unsigned long long)b.count, (unsigned long long)a.sum,
               (unsigned long long)b.sum, (unsigned long long)a.min, (unsigned long long)b.min,
               (unsigned long long)a.max, (unsigned long long)b.max);
    hist_free(&a);
    hist_free(&b);
    return same;
}

int main(void)
{
    /* Hand-picked: nothing, one value, steps of 0 and 1, small values (one
     * per bucket), a whole schedule of 2 M operations 4 µs apart, and values
     * past the last bucket's cap (2^43 ns). */
    CHECK(same_both_ways(0, 1, 0));
    CHECK(same_both_ways(5, 1, 1));
    CHECK(same_both_ways(1000, 0, 7));
    CHECK(same_both_ways(300, 1, 301));
    CHECK(same_both_ways(255, 2, 128));
    CHECK(same_both_ways(2000000ull * 4000, 4000, 2000000));
    CHECK(same_both_ways((1ull << 45) + 12345, 1ull << 30, 40000));
    /* Random series of every size of value and step. */
    for (int i = 0; i < 300; i++) {
        uint64_t step = rng() % (1ull << (rng() % 34)) + (i % 7 == 0 ? 0 : 1);
        uint64_t n = rng() % 20000 + 1;
        uint64_t last = rng() % (1ull << (rng() % 40));
        uint64_t first = last + (n - 1) * step;
        CHECK(same_both_ways(first, step, n));
    }
    return check_report("test_ycsb_hist");
}
