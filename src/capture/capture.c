/* capture.c -- mango_capture(): filter by durable range, feed the dedup set. */
#include "capture/capture.h"

#include "mango.h"

#include <stdlib.h>
#include <string.h>

__thread bool mango_capture_active __attribute__((tls_model("initial-exec")));

static unsigned n_ranges;
static uintptr_t range_lo[CAPTURE_MAX_RANGES], range_hi[CAPTURE_MAX_RANGES];
static dedup_set *current_set;

void capture_set_ranges(unsigned n, const uintptr_t *lo, const uintptr_t *hi)
{
    if (n > CAPTURE_MAX_RANGES)
        n = CAPTURE_MAX_RANGES;
    for (unsigned i = 0; i < n; i++) {
        range_lo[i] = lo[i];
        range_hi[i] = hi[i];
    }
    n_ranges = n;
}

bool capture_is_durable(uintptr_t addr, size_t len)
{
    for (unsigned i = 0; i < n_ranges; i++)
        if (addr < range_hi[i] && addr + len > range_lo[i])
            return true;
    return false;
}

unsigned capture_get_ranges(uintptr_t *lo, uintptr_t *hi, unsigned max)
{
    unsigned n = n_ranges < max ? n_ranges : max;
    for (unsigned i = 0; i < n; i++) {
        lo[i] = range_lo[i];
        hi[i] = range_hi[i];
    }
    return n;
}

void capture_begin(dedup_set *set)
{
    current_set = set;
    mango_capture_active = true;
}

void capture_end(void)
{
    mango_capture_active = false;
    current_set = NULL;
}

static void capture_range_nodedup(const void *addr, size_t len)
{
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    for (unsigned i = 0; i < n_ranges; i++) {
        uintptr_t a = lo > range_lo[i] ? lo : range_lo[i];
        uintptr_t b = hi < range_hi[i] ? hi : range_hi[i];
        if (a < b)
            dedup_add_range_nodedup(current_set, a, b - a);
    }
}

bool mango_in_rw_command(void) { return mango_capture_active; }

/* MANGO_DEDUP=0 turns intra-batch deduplication off (benchmarks only). */
static int dedup_off = -1;

void mango_capture(const void *addr, size_t len)
{
    if (!mango_capture_active || len == 0)
        return;
    if (__builtin_expect(dedup_off != 0, 0)) {
        if (dedup_off < 0) {
            const char *v = getenv("MANGO_DEDUP");
            dedup_off = v && strcmp(v, "0") == 0;
        }
        if (dedup_off) {
            capture_range_nodedup(addr, len);
            return;
        }
    }
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    for (unsigned i = 0; i < n_ranges; i++) {
        uintptr_t a = lo > range_lo[i] ? lo : range_lo[i];
        uintptr_t b = hi < range_hi[i] ? hi : range_hi[i];
        if (a < b)
            dedup_add_range(current_set, a, b - a);
    }
}
