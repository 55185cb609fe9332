/* fake_runtime.c -- a stand-in for the Mangosteen runtime's capture ABI, used
 * by the plugin tests. Compiled WITHOUT the plugin (its own stores must not be
 * captured). It records every mango_capture(addr, len) call while a test
 * region is being exercised and checks that the recorded ranges cover every
 * byte that changed. */
#include "fake_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__thread bool mango_capture_active __attribute__((tls_model("initial-exec")));

fr_range fr_ranges[FR_MAX_RANGES];
size_t fr_count;
size_t fr_dropped;

void mango_capture(const void *addr, size_t len)
{
    if (fr_count < FR_MAX_RANGES) {
        fr_ranges[fr_count].addr = (uintptr_t)addr;
        fr_ranges[fr_count].len = len;
        fr_count++;
    } else {
        fr_dropped++;
    }
}

void fr_set_active(bool on) { mango_capture_active = on; }
void fr_reset(void) { fr_count = 0; fr_dropped = 0; }
void fr_sink(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

void fr_snapshot(fr_region *r)
{
    if (!r->before)
        r->before = malloc(r->len);
    memcpy(r->before, r->base, r->len);
}

size_t fr_uncovered(const fr_region *r, const char *what)
{
    unsigned char *cov = calloc(r->len, 1);
    uintptr_t lo = (uintptr_t)r->base, hi = lo + r->len;
    for (size_t i = 0; i < fr_count; i++) {
        uintptr_t a = fr_ranges[i].addr, b = a + fr_ranges[i].len;
        if (b <= lo || a >= hi)
            continue;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        memset(cov + (a - lo), 1, b - a);
    }
    size_t missed = 0;
    const unsigned char *now = r->base, *was = r->before;
    for (size_t i = 0; i < r->len; i++) {
        if (now[i] != was[i] && !cov[i]) {
            if (missed < 5)
                fprintf(stderr, "  %s: byte %s+%zu (%p) changed but not captured\n",
                        what, r->name, i, (void *)(now + i));
            missed++;
        }
    }
    free(cov);
    return missed;
}

bool fr_intersects(const void *p, size_t len)
{
    uintptr_t lo = (uintptr_t)p, hi = lo + len;
    for (size_t i = 0; i < fr_count; i++) {
        uintptr_t a = fr_ranges[i].addr, b = a + fr_ranges[i].len;
        if (a < hi && b > lo)
            return true;
    }
    return false;
}
