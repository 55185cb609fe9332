/* capture.c -- mango_capture(): filter by durable range, feed the dedup set
 * (large stores into the durable heap as data ranges, the rest as blocks). */
#include "capture/capture.h"

#include "mango.h"
#include "mango_capture_inline.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

__thread bool mango_capture_active __attribute__((tls_model("initial-exec")));

static unsigned n_ranges;
static uintptr_t range_lo[CAPTURE_MAX_RANGES], range_hi[CAPTURE_MAX_RANGES];
static dedup_set *current_set;
static size_t data_range_min; /* 0: no data ranges */
static bool heap_bulk;           /* capture_set_heap_bulk */
static uintptr_t fast_heap_size; /* the fast path's heap size outside a bulk */

/* The inline fast path (include/mango_capture_inline.h) probes the primary set
 * as dedup_add_block() does: same geometry, same hash, same layout. */
_Static_assert(MANGO_CAPTURE_BLOCK == DEDUP_BLOCK, "fast path: block size");
_Static_assert(MANGO_CAPTURE_SLOTS == DEDUP_SLOTS, "fast path: slots");
_Static_assert(MANGO_CAPTURE_MAX_LOAD == DEDUP_MAX_LOAD, "fast path: load limit");
_Static_assert(offsetof(struct mango_capture_set_view, key) == offsetof(dedup_set, key), "fast path: key");
_Static_assert(offsetof(struct mango_capture_set_view, mask) == offsetof(dedup_set, mask), "fast path: mask");
_Static_assert(offsetof(struct mango_capture_set_view, used_slot) == offsetof(dedup_set, used_slot),
               "fast path: used_slot");
_Static_assert(offsetof(struct mango_capture_set_view, count) == offsetof(dedup_set, count), "fast path: count");
_Static_assert(sizeof(((dedup_set *)0)->key[0]) == sizeof(uint64_t) &&
                   sizeof(((dedup_set *)0)->mask[0]) == sizeof(uint32_t) &&
                   sizeof(((dedup_set *)0)->used_slot[0]) == sizeof(uint32_t) &&
                   sizeof(((dedup_set *)0)->count) == sizeof(uint32_t),
               "fast path: element types");
#define SAME_HASH(b) (MANGO_CAPTURE_HASH(b) == DEDUP_HASH(b))
_Static_assert(SAME_HASH(0x20) && SAME_HASH(0x7f0012345660ull) && SAME_HASH(0x555555554000ull) &&
                   SAME_HASH(0xffffffffffffffe0ull) && SAME_HASH(0x1000000000ull),
               "fast path: hash");

/* Read by instrumented code on the combiner thread while it captures. */
struct mango_capture_fastpath mango_capture_fastpath;

/* MANGO_DEDUP=0 turns intra-batch deduplication off (benchmarks only). */
static int dedup_off = -1;

static bool dedup_is_off(void)
{
    if (dedup_off < 0) {
        const char *v = getenv("MANGO_DEDUP");
        dedup_off = v && strcmp(v, "0") == 0;
    }
    return dedup_off;
}

void capture_set_ranges(unsigned n, const uintptr_t *lo, const uintptr_t *hi)
{
    if (n > CAPTURE_MAX_RANGES)
        n = CAPTURE_MAX_RANGES;
    for (unsigned i = 0; i < n; i++) {
        range_lo[i] = lo[i];
        range_hi[i] = hi[i];
    }
    n_ranges = n;
    /* The fast path covers the first range (the durable heap), shrunk to
     * whole blocks, and the second (the executable's .data/.bss; see
     * mango_capture_inline.h). MANGO_DEDUP=0 must see every store, and
     * MANGO_CAPTURE_FASTPATH=0 turns it off (comparisons). */
    const char *fp = getenv("MANGO_CAPTURE_FASTPATH");
    uintptr_t flo = 0, fhi = 0;
    if (n > 0 && !dedup_is_off() && !(fp && strcmp(fp, "0") == 0)) {
        flo = (lo[0] + DEDUP_BLOCK - 1) & ~(uintptr_t)(DEDUP_BLOCK - 1);
        fhi = hi[0] & ~(uintptr_t)(DEDUP_BLOCK - 1);
    }
    mango_capture_fastpath.heap_lo = flo;
    fast_heap_size = fhi > flo ? fhi - flo : 0;
    mango_capture_fastpath.heap_size = fast_heap_size;
    /* And the second range (the executable's .data/.bss), the same way. */
    uintptr_t dlo = 0, dhi = 0;
    if (n > 1 && fast_heap_size) {
        dlo = (lo[1] + DEDUP_BLOCK - 1) & ~(uintptr_t)(DEDUP_BLOCK - 1);
        dhi = hi[1] & ~(uintptr_t)(DEDUP_BLOCK - 1);
    }
    mango_capture_fastpath.data_lo = dlo;
    mango_capture_fastpath.data_size = dhi > dlo ? dhi - dlo : 0;
    /* Transient stores need no call when the fast path's ranges are exactly
     * the durable ones. */
    bool exact = fast_heap_size && n <= 2 && flo == lo[0] && fhi == hi[0];
    if (exact && n == 2)
        exact = mango_capture_fastpath.data_size && dlo == lo[1] && dhi == hi[1];
    mango_capture_fastpath.covers_all = exact;
}

void capture_set_heap_bulk(bool on)
{
    heap_bulk = on;
    /* A heap store then fails the fast path's heap test (a .data/.bss store
     * still passes its own): the fast path drops it as it drops transient
     * stores (covers_all), or it reaches mango_capture(), which skips it. */
    mango_capture_fastpath.heap_size = on ? 0 : fast_heap_size;
}

bool capture_heap_bulk(void) { return heap_bulk; }

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

void capture_set_data_ranges(size_t min_bytes) { data_range_min = min_bytes; }

void capture_begin(dedup_set *set)
{
    current_set = set;
    mango_capture_fastpath.set = (struct mango_capture_set_view *)(void *)set;
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
        if (a < b && !(i == 0 && heap_bulk))
            dedup_add_range_nodedup(current_set, a, b - a);
    }
}

void mango_capture_spill(uintptr_t block, uint32_t mask)
{
    dedup_add_overflow(current_set, block, mask);
}

bool mango_in_rw_command(void) { return mango_capture_active; }

/* The durable allocator's capture callback (dheap_attach): its stores are
 * header and link words inside the heap, which the inline fast path records
 * without the range loop of mango_capture(). */
void capture_small_store(const void *addr, size_t len)
{
    if (!mango_capture_active || heap_bulk) /* all of them heap stores */
        return;
    if (mango_capture_try_fast(addr, len))
        return;
    mango_capture(addr, len);
}

void mango_capture(const void *addr, size_t len)
{
    if (!mango_capture_active || len == 0)
        return;
    if (__builtin_expect(dedup_off != 0, 0) && dedup_is_off()) {
        capture_range_nodedup(addr, len);
        return;
    }
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    for (unsigned i = 0; i < n_ranges; i++) {
        uintptr_t a = lo > range_lo[i] ? lo : range_lo[i];
        uintptr_t b = hi < range_hi[i] ? hi : range_hi[i];
        if (a >= b || (i == 0 && heap_bulk)) /* a bulk load logs the heap itself */
            continue;
        /* Range 0 is the durable heap (runtime.c), whose mirror takes whole
         * bytes; .data/.bss keep per-byte masks, so blocks only. */
        if (i == 0 && data_range_min && b - a >= data_range_min)
            dedup_add_data_range(current_set, a, b - a);
        else
            dedup_add_range(current_set, a, b - a);
    }
}
