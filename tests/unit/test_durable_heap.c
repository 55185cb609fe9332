/* test_durable_heap.c -- the durable allocator on its own.
 *
 * The capture callback plays the runtime: it copies every reported range into
 * a "mirror" (what replaying the redo log would rebuild) and, in the precise
 * phase, marks a shadow bitmap. The test reports its own payload writes the
 * same way, as an application's instrumentation would.
 *
 *  1. API basics and edge cases (realloc/calloc/memalign/usable_size);
 *     chunk sizes, boundary tags; large chunks grown in place by realloc;
 *     slabs (headerless objects of up to 128
 *     bytes), the hole and its boundary-tag flag, the slab map in reused
 *     space, the fallback to chunks; corrupt roots refused.
 *  2. Precise capture: per operation, snapshot the heap, run the op, diff;
 *     every changed byte must have been reported.
 *  3. Workload: 100k random malloc/calloc/memalign/realloc/free, 1 B..1 MiB
 *     (then again with 80 % of the requests of 1..128 bytes),
 *     with pattern-checked payloads, an overlap check on every allocation,
 *     periodic dheap_check() and heap == mirror comparisons; three simulated
 *     crashes restore [base, base+top) from the mirror into a fresh mapping at
 *     the same address, re-attach and carry on.
 *  4. Exhaustion: ENOMEM, reuse after free, top given back after large frees.
 *     Reclaiming: space stranded in emptied slabs, small chunks and free
 *     large chunks below top serves any request once the heap is full; a
 *     small heap under random work, every change captured, crashes.
 *  5. Programming errors (double free, foreign pointer) abort, in a child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc/durable_heap.h"

#include "check.h"
/* For checks inside hot loops: count a pass only once per call site. */
#define REQUIRE(cond)                                                            \
    do {                                                                         \
        if (!(cond)) {                                                           \
            check_failed++;                                                            \
            if (check_failed < 20)                                                     \
                fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                        \
    } while (0)

/* ---- the fake runtime --------------------------------------------------- */

static char *g_lo, *g_hi;   /* attached range */
static char *g_mirror;      /* log-replay image of the range, or NULL */
static uint8_t *g_bits;     /* precise phase: one bit per byte of the range */
static unsigned long g_bad_captures;

static void set_bits(size_t off, size_t len)
{
    while (len && (off & 7)) {
        g_bits[off >> 3] |= (uint8_t)(1u << (off & 7));
        off++, len--;
    }
    memset(g_bits + (off >> 3), 0xff, len >> 3);
    off += len & ~(size_t)7;
    len &= 7;
    while (len) {
        g_bits[off >> 3] |= (uint8_t)(1u << (off & 7));
        off++, len--;
    }
}

static size_t g_captured_bytes; /* total reported, for the calloc test */

static void capture(const void *addr, size_t len)
{
    const char *p = addr;
    g_captured_bytes += len;
    if (len == 0 || p < g_lo || p > g_hi || len > (size_t)(g_hi - p)) {
        g_bad_captures++;
        return;
    }
    size_t off = (size_t)(p - g_lo);
    if (g_mirror)
        memcpy(g_mirror + off, p, len);
    if (g_bits)
        set_bits(off, len);
}

/* The zero-range callback: like capture(), for a range that is all zero. */
static size_t g_zero_calls, g_zero_bytes;
static bool zero_capture(const void *addr, size_t len)
{
    const char *p = addr;
    if (((uintptr_t)p & 31) || (len & 31) || len < 4096 || p < g_lo || len > (size_t)(g_hi - p)) {
        g_bad_captures++;
        return false;
    }
    for (size_t i = 0; i < len; i++)
        if (p[i]) {
            g_bad_captures++; /* reported before being zeroed */
            break;
        }
    g_zero_calls++;
    g_zero_bytes += len;
    size_t off = (size_t)(p - g_lo);
    if (g_mirror)
        memset(g_mirror + off, 0, len);
    if (g_bits)
        set_bits(off, len);
    return true;
}

static void *map_range(void *at, size_t len)
{
    int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (at ? MAP_FIXED : 0);
    void *p = mmap(at, len, PROT_READ | PROT_WRITE, fl, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return p;
}

static uint64_t heap_top(void) { return ((dheap_root *)g_lo)->top; }

/* A fresh zeroed mapping of cap bytes with a new heap attached; the test's
 * globals point at it. */
static char *fresh_heap(size_t cap)
{
    char *base = map_range(NULL, cap);
    g_lo = base, g_hi = base + cap;
    CHECK(dheap_attach(base, cap, true, capture) == 0);
    return base;
}

/* ---- payload patterns and the object table ------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

typedef struct obj {
    char *p;
    size_t n;
    uint64_t v; /* pattern seed */
    size_t align;
    int zero; /* calloc'd and not written since: all bytes must be 0 */
} obj;

/* Byte j of an object holds byte j%8 of the word (v + j/8). */
static void fill_from(obj *o, size_t from)
{
    size_t j = from;
    for (; j < o->n && (j & 7); j++)
        o->p[j] = (char)((o->v + j / 8) >> (8 * (j & 7)));
    uint64_t *w = (uint64_t *)o->p;
    for (; j + 8 <= o->n; j += 8)
        w[j / 8] = o->v + j / 8;
    for (; j < o->n; j++)
        o->p[j] = (char)((o->v + j / 8) >> (8 * (j & 7)));
    if (o->n > from)
        capture(o->p + from, o->n - from); /* the application reports its own stores */
}

static void fill(obj *o, uint64_t v)
{
    o->v = v;
    o->zero = 0;
    fill_from(o, 0);
}

/* Check the first len bytes hold o's pattern. */
static int pattern_ok(const obj *o, size_t len)
{
    if (o->zero) {
        for (size_t i = 0; i < len; i++)
            if (o->p[i])
                return 0;
        return 1;
    }
    const uint64_t *w = (const uint64_t *)o->p;
    size_t nw = len / 8;
    for (size_t i = 0; i < nw; i++)
        if (w[i] != o->v + i)
            return 0;
    uint64_t t = o->v + nw;
    return memcmp(o->p + nw * 8, &t, len - nw * 8) == 0;
}

static unsigned g_tiny_percent; /* share of requests of 1..128 bytes (slab objects), on top */

static size_t rand_size(size_t max)
{
    if (rnd() % 100 < g_tiny_percent)
        return 1 + rnd() % 128;
    unsigned r = (unsigned)(rnd() % 100);
    size_t n;
    if (r < 70)
        n = 1 + rnd() % 256;
    else if (r < 90)
        n = 1 + rnd() % 32768;
    else if (r < 99)
        n = 32769 + rnd() % (256 * 1024);
    else
        n = 1 + rnd() % (1024 * 1024);
    return n > max ? 1 + n % max : n;
}

static int overlaps_any(const obj *tab, size_t nslots, size_t self, const char *p, size_t n)
{
    for (size_t i = 0; i < nslots; i++)
        if (i != self && tab[i].p && p < tab[i].p + tab[i].n && tab[i].p < p + n)
            return 1;
    return 0;
}

/* One random operation on slot s. Returns 0 if an allocation failed. */
static int random_op(obj *tab, size_t nslots, size_t s, size_t maxsz)
{
    obj *o = &tab[s];
    if (!o->p) {
        size_t n = rand_size(maxsz);
        unsigned k = (unsigned)(rnd() % 10);
        size_t align = n <= 8 ? 8 : 16; /* 8-byte slab objects: 8-byte aligned */
        char *p;
        if (k < 6) {
            p = dheap_malloc(n);
        } else if (k < 8) {
            p = dheap_calloc(1, n);
        } else {
            align = (size_t)1 << (5 + rnd() % 8); /* 32 .. 4096 */
            if (rnd() % 50 == 0)
                align = 65536;
            p = dheap_memalign(align, n);
        }
        if (!p)
            return 0;
        REQUIRE(((uintptr_t)p & (align - 1)) == 0);
        REQUIRE(dheap_contains(p) && dheap_contains(p + n - 1));
        REQUIRE(dheap_usable_size(p) >= n);
        REQUIRE(!overlaps_any(tab, nslots, s, p, n));
        o->p = p;
        o->n = n;
        o->align = align;
        if (k >= 6 && k < 8) {
            /* Leave calloc'd memory as is, so the allocator's own capture
             * of the zeroing is what the checks see. */
            o->zero = 1;
        } else {
            fill(o, rnd());
        }
        return 1;
    }
    REQUIRE(pattern_ok(o, o->n));
    if (rnd() % 10 < 6) {
        dheap_free(o->p);
        o->p = NULL;
        return 1;
    }
    size_t n = rand_size(maxsz);
    char *q = dheap_realloc(o->p, n);
    if (!q)
        return 0; /* the old block is untouched */
    REQUIRE(!overlaps_any(tab, nslots, s, q, n));
    o->p = q;
    size_t keep = n < o->n ? n : o->n;
    REQUIRE(pattern_ok(o, keep));
    REQUIRE(dheap_usable_size(q) >= n);
    o->n = n;
    o->align = 16;
    /* Only the grown part is written here: the prefix is realloc's copy,
     * which the allocator itself must have reported. */
    if (o->zero)
        fill(o, rnd());
    else
        fill_from(o, keep);
    return 1;
}

/* ---- 1. basics ----------------------------------------------------------- */

static void test_basics(void)
{
    size_t cap = 16 << 20;
    char *base = map_range(NULL, cap);
    g_lo = base, g_hi = base + cap;
    CHECK(dheap_malloc(10) == NULL); /* not attached */
    CHECK(!dheap_contains(base));
    CHECK(dheap_attach(base + 1, cap, true, capture) != 0);
    CHECK(dheap_attach(base, cap, false, capture) != 0); /* no valid root yet */
    CHECK(dheap_attach(base, cap, true, capture) == 0);
    CHECK(dheap_contains(base) && dheap_contains(base + cap - 1) && !dheap_contains(base + cap));
    CHECK(dheap_check() == 0);
    CHECK(dheap_extent_of_root((dheap_root *)base, cap) == heap_top());
    CHECK(dheap_extent_of_root((dheap_root *)base, cap * 2) == 0);

    char *a = dheap_malloc(0);
    CHECK(a && ((uintptr_t)a & 7) == 0 && dheap_usable_size(a) >= 1);
    char *b = dheap_malloc(100);
    CHECK(b && dheap_usable_size(b) >= 100);
    memset(b, 'x', 100);
    char *c = dheap_realloc(b, 5000);
    CHECK(c && c[0] == 'x' && c[99] == 'x');
    char *d = dheap_realloc(c, 40);
    CHECK(d && d[0] == 'x' && d[39] == 'x');
    CHECK(dheap_realloc(d, 0) == NULL);
    char *e = dheap_realloc(NULL, 77);
    CHECK(e != NULL);
    uint32_t *z = dheap_calloc(1000, sizeof *z);
    int allz = z != NULL;
    for (int i = 0; z && i < 1000; i++)
        allz &= z[i] == 0;
    CHECK(allz);
    errno = 0;
    CHECK(dheap_calloc(SIZE_MAX / 2, 4) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(dheap_malloc(SIZE_MAX) == NULL && errno == ENOMEM);
    for (size_t al = 32; al <= (1u << 20); al <<= 1) {
        char *m = dheap_memalign(al, 24);
        CHECK(m && ((uintptr_t)m & (al - 1)) == 0 && dheap_usable_size(m) >= 24);
        memset(m, 1, 24);
        char *m2 = dheap_realloc(m, 100000);
        CHECK(m2 && m2[23] == 1);
        dheap_free(m2);
    }
    char *odd = dheap_memalign(48, 10); /* rounded up to 64 */
    CHECK(odd && ((uintptr_t)odd & 63) == 0);
    dheap_free(odd);
    /* A large block freed and reallocated comes back (first fit). */
    char *big = dheap_malloc(300000);
    char *guard = dheap_malloc(16);
    dheap_free(big);
    char *big2 = dheap_malloc(200000);
    CHECK(big2 == big);
    dheap_free(big2);
    dheap_free(guard);
    dheap_free(a);
    dheap_free(e);
    dheap_free(z);
    CHECK(dheap_check() == 0);
    CHECK(((dheap_root *)base)->allocated == 0);
    uint64_t n0 = 1, p0 = 1, a0 = 1;
    dheap_usage(&n0, &p0, &a0);
    CHECK(n0 == 0 && p0 == 0 && a0 == 0);
    dheap_detach();
    dheap_usage(&n0, &p0, &a0);
    CHECK(n0 == 0 && p0 == 0 && a0 == 0); /* nothing attached */
    CHECK(!dheap_contains(base));
    munmap(base, cap);
}

/* ---- 1a. chunk sizes and boundary tags --------------------------------------
 * Up to 128 bytes a request takes a headerless slab object of 8 bytes
 * (8-byte aligned) or 16, 32, ... 128: a 10-byte one 16, a 24-byte one (a
 * Redis dictEntry) 32, a 128-byte one 128. Past that a chunk is its payload
 * plus an 8-byte header, rounded to 16: a 200-byte object takes 208. A free large
 * chunk is found from the chunk above it by its footer: freeing the middle of
 * three merges all three, and a free chunk below one given back to top goes
 * back with it. */
static uint64_t allocated_now(void) { return ((dheap_root *)g_lo)->allocated; }

static void test_chunk_sizes_and_merging(void)
{
    size_t cap = 16 << 20;
    char *base = fresh_heap(cap);
    static const struct {
        size_t n, chunk, usable;
    } sizes[] = {{1, 8, 8},           {8, 8, 8},            {9, 16, 16},         {16, 16, 16},
                 {17, 32, 32},        {24, 32, 32},         {33, 48, 48},        {64, 64, 64},
                 {65, 80, 80},        {104, 112, 112},      {128, 128, 128},     {129, 144, 136},
                 {200, 208, 200},     {1016, 1024, 1016},   {1017, 1280, 1272},  {1272, 1280, 1272},
                 {32760, 32768, 32760}, {32761, 36864, 36856}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t before = allocated_now();
        char *p = dheap_malloc(sizes[i].n);
        uint64_t got = allocated_now() - before;
        uintptr_t align = sizes[i].n <= 8 ? 8 : 16;
        if (got != sizes[i].chunk || dheap_usable_size(p) != sizes[i].usable || ((uintptr_t)p & (align - 1)))
            fprintf(stderr, "malloc(%zu): chunk %llu, usable %zu (want %zu, %zu)\n", sizes[i].n,
                    (unsigned long long)got, dheap_usable_size(p), sizes[i].chunk, sizes[i].usable);
        CHECK(got == sizes[i].chunk && dheap_usable_size(p) == sizes[i].usable && ((uintptr_t)p & (align - 1)) == 0);
        dheap_free(p);
    }
    CHECK(dheap_check() == 0);

    /* The middle of three free large chunks merges with both neighbours. */
    char *a = dheap_malloc(40000), *b = dheap_malloc(40000), *c = dheap_malloc(40000);
    char *guard = dheap_malloc(40000); /* carved after c (small ones may come from the hole) */
    CHECK(guard > c);
    dheap_free(a);
    dheap_free(c);
    CHECK(dheap_check() == 0);
    dheap_free(b);
    CHECK(dheap_check() == 0);
    uint64_t head = ((dheap_root *)base)->large_free;
    CHECK(head == (uint64_t)(a - base) - 8 && ((uint64_t *)(base + head + 8))[0] == 0); /* one free chunk */
    char *abc = dheap_malloc(3 * 40960 - 8); /* exactly the merged chunk */
    CHECK(abc == a && ((dheap_root *)base)->large_free == 0);
    CHECK(dheap_check() == 0);

    /* A free chunk below the last one leaves with it when that one is freed. */
    uint64_t top0 = heap_top();
    char *y = dheap_malloc(40000), *z = dheap_malloc(40000);
    CHECK(heap_top() == top0 + 2 * 40960);
    dheap_free(y);
    CHECK(dheap_check() == 0);
    dheap_free(z);
    CHECK(heap_top() == top0 && dheap_check() == 0);
    dheap_free(abc);
    dheap_free(guard);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);
}

/* ---- 1b'. realloc in place -----------------------------------------------------
 * A large chunk grows where it lies when the space above it is free: into a
 * free large chunk (split when that leaves a tail, whole when it fits
 * exactly) or at top; otherwise it moves. Growing in place writes headers
 * only: a string grown by appends from 1 to 64 MiB was copied, and logged,
 * whole at every step (~2 GB) before session 38. Every change in the range
 * is reported (diffed against a snapshot). */
static unsigned long g_unreported;

/* realloc(p, n) with every changed byte of the heap checked as reported. */
static char *checked_realloc(char *base, char *snap, size_t cap, char *p, size_t n)
{
    size_t len = heap_top() + (8u << 20);
    if (len > cap)
        len = cap;
    memcpy(snap, base, len);
    memset(g_bits, 0, cap / 8);
    char *q = dheap_realloc(p, n);
    for (size_t j = 0; j < len; j++)
        if (snap[j] != base[j] && !(g_bits[j >> 3] & (1u << (j & 7))))
            if (g_unreported++ < 5)
                fprintf(stderr, "realloc(%zu): unreported change at offset %zu\n", n, j);
    return q;
}

static int filled_with(const char *p, char c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != c)
            return 0;
    return 1;
}

static void test_realloc_in_place(void)
{
    size_t cap = 96u << 20;
    char *base = fresh_heap(cap);
    char *snap = map_range(NULL, cap);
    g_bits = map_range(NULL, cap / 8);
    g_unreported = 0;

    /* Into a free large chunk above: split, the tail stays free and serves. */
    char *a = dheap_malloc(100000), *b = dheap_malloc(500000), *guard = dheap_malloc(40000);
    memset(a, 'a', 100000);
    dheap_free(b);
    uint64_t before = allocated_now();
    char *a2 = checked_realloc(base, snap, cap, a, 300000);
    CHECK(a2 == a && filled_with(a2, 'a', 100000) && dheap_usable_size(a2) >= 300000);
    CHECK(allocated_now() - before == 303104 - 102400); /* page-rounded chunks, header included */
    CHECK(dheap_check() == 0);
    char *tail = dheap_malloc(200000); /* 204 800 of the 299 008 left */
    CHECK(tail > a2 && tail < guard);
    dheap_free(tail);
    CHECK(dheap_check() == 0);

    /* Exactly the two chunks: nothing free is left between it and guard. */
    size_t whole = (size_t)(guard - a2) - 8; /* a2's chunk and the free one above */
    char *a3 = checked_realloc(base, snap, cap, a2, whole);
    CHECK(a3 == a && filled_with(a3, 'a', 100000) && ((dheap_root *)base)->large_free == 0);
    CHECK(dheap_check() == 0); /* guard's boundary-tag flag cleared */

    /* The chunk above in use: it moves, contents kept. */
    char *a4 = checked_realloc(base, snap, cap, a3, whole + 4096);
    CHECK(a4 != a3 && a4 > guard && filled_with(a4, 'a', 100000));
    CHECK(dheap_check() == 0);

    /* A free chunk above too small for the request: it moves too. */
    char *c = dheap_malloc(50000), *d = dheap_malloc(50000), *guard2 = dheap_malloc(40000);
    memset(c, 'c', 50000);
    dheap_free(d);
    char *c2 = checked_realloc(base, snap, cap, c, 200000);
    CHECK(c2 != c && filled_with(c2, 'c', 50000));
    CHECK(dheap_check() == 0);

    /* memalign's blocks (an alias header before the pointer) move as before. */
    char *m = dheap_memalign(4096, 40000);
    memset(m, 'm', 40000);
    char *m2 = checked_realloc(base, snap, cap, m, 80000);
    CHECK(m2 && filled_with(m2, 'm', 40000));
    CHECK(dheap_check() == 0);

    /* The last chunk grows at top, step by step as appends grow a string
     * (by a bit more than 1 MiB each time), and stays where it is; only its
     * header and the root change. Then top has no room: NULL, p intact. */
    char *s = dheap_malloc(1 << 20);
    memset(s, 's', 1 << 20);
    size_t reported = g_captured_bytes, moved = 0;
    for (size_t n = 2u << 20; n <= (64u << 20); n += (1u << 20) + 4096) {
        char *s2 = checked_realloc(base, snap, cap, s, n);
        CHECK(s2 != NULL);
        moved += s2 != s;
        s = s2;
    }
    reported = g_captured_bytes - reported;
    printf("realloc in place: 1 -> 64 MiB in 60 steps, %zu moves, %zu bytes reported\n", moved, reported);
    CHECK(moved == 0 && reported < 8192 && filled_with(s, 's', 1 << 20));
    CHECK(dheap_check() == 0);
    errno = 0;
    CHECK(dheap_realloc(s, cap) == NULL && errno == ENOMEM && filled_with(s, 's', 1 << 20));
    CHECK(dheap_check() == 0);

    CHECK(g_unreported == 0);
    dheap_free(s);
    dheap_free(m2);
    dheap_free(c2);
    dheap_free(guard2);
    dheap_free(a4);
    dheap_free(guard);
    CHECK(dheap_check() == 0 && allocated_now() == 0);
    dheap_detach();
    munmap((void *)g_bits, cap / 8);
    g_bits = NULL;
    munmap(snap, cap);
    munmap(base, cap);
}

/* ---- 1c. slabs ----------------------------------------------------------------
 * Objects of a class (8 bytes, or 16 to 128 by 16) lie back to back in
 * 16 KiB-aligned slabs, with no header; a freed one is reused first; a slab
 * holds (16 KiB - 8) / size objects; the space skipped to align a slab
 * becomes the hole, which small chunks are carved from before top; memalign
 * past 16 bytes never hands out a slab object; a heap too small for a slab
 * falls back to chunks; a double free that free() cannot see is found by
 * dheap_check. */
static void test_slabs(void)
{
    size_t cap = 16 << 20;
    char *base = fresh_heap(cap);
    dheap_root *r = (dheap_root *)base;
    char *big = dheap_malloc(5000); /* top no longer on a 16 KiB boundary */
    uint64_t top_before = heap_top();
    static char *p[2100];
    for (int i = 0; i < 2100; i++)
        p[i] = dheap_malloc(10);
    CHECK(r->slab_map != 0 && r->slab_objects == 2100);
    CHECK(((uint64_t)(p[0] - base) & 16383) == 0); /* the first object opens a slab */
    int packed = 1;
    for (int i = 1; i < 1023; i++)
        packed &= p[i] == p[i - 1] + 16;
    CHECK(packed);                                            /* no headers */
    CHECK(((uint64_t)(p[1023] - base) & 16383) == 0);         /* 1023 a slab: the next opens another */
    CHECK(p[1023] == p[0] + 16384);                           /* right above it */
    CHECK(r->hole != 0 && r->hole >= top_before && r->hole < (uint64_t)(p[0] - base));
    uint64_t hole = r->hole;
    char *h = dheap_malloc(200); /* a chunk: carved from the hole */
    CHECK(h && (uint64_t)(h - base) == hole + 8 && r->hole == hole + 208);
    CHECK(dheap_usable_size(p[5]) == 16 && dheap_usable_size(h) == 200);
    CHECK(dheap_check() == 0);
    dheap_free(p[7]);
    dheap_free(p[3]);
    CHECK(dheap_malloc(9) == p[3] && dheap_malloc(16) == p[7]); /* LIFO reuse */
    /* Each class in its own slabs. */
    char *o32 = dheap_malloc(24), *o48 = dheap_malloc(40), *o64 = dheap_malloc(64);
    CHECK(dheap_usable_size(o32) == 32 && dheap_usable_size(o48) == 48 && dheap_usable_size(o64) == 64);
    CHECK(((uint64_t)(o32 - base) >> 14) != ((uint64_t)(o48 - base) >> 14) &&
          ((uint64_t)(o48 - base) >> 14) != ((uint64_t)(o64 - base) >> 14));
    char *o32b = dheap_realloc(o32, 30); /* fits: stays */
    CHECK(o32b == o32);
    char *grown = dheap_realloc(o32, 1000); /* out of the slab, contents kept */
    CHECK(grown && dheap_usable_size(grown) >= 1000);
    char *shrunk = dheap_realloc(grown, 20);
    CHECK(shrunk && dheap_usable_size(shrunk) == 32);
    /* memalign: 16 bytes or less, a slab object of at least 16 bytes (an
     * 8-byte one is only 8-byte aligned); more, always a chunk. */
    char *m16 = dheap_memalign(16, 1), *m8 = dheap_memalign(8, 1);
    CHECK(m16 && ((uintptr_t)m16 & 15) == 0 && dheap_usable_size(m16) == 16);
    CHECK(m8 && ((uintptr_t)m8 & 7) == 0 && dheap_usable_size(m8) == 8);
    dheap_free(m16);
    dheap_free(m8);
    for (size_t al = 32; al <= 256; al *= 2) {
        char *m = dheap_memalign(al, 1);
        CHECK(m && ((uintptr_t)m & (al - 1)) == 0 && dheap_usable_size(m) >= 1);
        CHECK(base[r->slab_map + ((uint64_t)(m - base) >> 14)] == 0); /* not in a slab */
        dheap_free(m);
    }
    uint64_t map_before = r->slab_map;
    CHECK(dheap_check() == 0);
    for (int i = 0; i < 2100; i++)
        dheap_free(p[i]);
    dheap_free(o48);
    dheap_free(o64);
    dheap_free(shrunk);
    dheap_free(h);
    dheap_free(big);
    CHECK(dheap_check() == 0 && r->allocated == 0 && r->inuse_chunks == 0 && r->slab_objects == 0);
    CHECK(r->slab_map == map_before);
    /* A double free that is not the last free: free() cannot see it, the
     * check does. */
    char *x = dheap_malloc(8), *y = dheap_malloc(8);
    dheap_free(x);
    dheap_free(y);
    uint64_t saved_head = r->slab_free[0], saved_objects = r->slab_objects;
    uint64_t saved_alloc = r->allocated, saved_chunks = r->inuse_chunks, saved_link = *(uint64_t *)x;
    dheap_free(x);
    fprintf(stderr, "(a dheap_check failure follows, on purpose)\n");
    CHECK(dheap_check() != 0);
    r->slab_free[0] = saved_head, r->slab_objects = saved_objects; /* undo by hand */
    r->allocated = saved_alloc, r->inuse_chunks = saved_chunks, *(uint64_t *)x = saved_link;
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);

    /* Too small for a slab: requests of up to 128 bytes take chunks, and no
     * slab map is made. */
    cap = 8192;
    base = fresh_heap(cap);
    char *small = dheap_malloc(10);
    CHECK(small && dheap_usable_size(small) == 24 && ((dheap_root *)base)->slab_objects == 0);
    CHECK(((dheap_root *)base)->slab_map == 0);
    CHECK(dheap_check() == 0);
    dheap_free(small);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);
}

/* ---- 1d. the hole next to a free large chunk, the map in reused space ----
 * The hole can sit right above a large chunk; when that chunk is freed the
 * hole carries the PREV_FREE_LARGE flag (state bit 7), which must move to a
 * chunk carved from the hole, or to the first small chunk the hole is cut
 * into when a bigger gap replaces it (dheap_check compares every flag with
 * the chunk below). The slab map made in a reused large chunk is zeroed. */
static int flag_at(const char *base, uint64_t hdr_off) { return (base[hdr_off + 7] & 0x80) != 0; }

static void test_hole_flags_and_map_reuse(void)
{
    size_t cap = 16 << 20;
    char *base = fresh_heap(cap);
    dheap_root *r = (dheap_root *)base;
    /* A large chunk full of garbage, freed below a guard: the map reuses it. */
    char *junk = dheap_malloc(100000), *guard = dheap_malloc(40000);
    memset(junk, 0xAB, 100000);
    capture(junk, 100000);
    dheap_free(junk);
    char *x = dheap_malloc(10); /* the first slab, and the map */
    CHECK(x && r->slab_map == (uint64_t)(junk - base)); /* in the reused chunk */
    CHECK(dheap_check() == 0);                           /* its bytes were zeroed */
    /* The map took one page of the 25: fill the rest, so that the large
     * chunks below come from top. */
    char *fill = dheap_malloc(24 * 4096 - 8);
    CHECK(fill && r->large_free == 0);
    /* Scenario A: a hole above a freed large chunk, cut into small chunks. */
    char *L = dheap_malloc(40000); /* 10 pages at top */
    uint64_t L_end = (uint64_t)(L - base) - 8 + 40960;
    char *y = dheap_malloc(24); /* a new slab of 32: its gap is the hole */
    CHECK(y && r->hole == L_end);
    dheap_free(L);
    CHECK(flag_at(base, r->hole) && dheap_check() == 0);
    uint64_t old_hole = r->hole;
    /* 13 pages: too big for L's free chunk, so at top, and the next gap is
     * 12 KiB against the hole's 8. */
    char *M = dheap_malloc(13 * 4096 - 8);
    uint64_t M_end = (uint64_t)(M - base) - 8 + 13 * 4096;
    char *z = dheap_malloc(40); /* a new slab of 48 */
    CHECK(z && r->hole == M_end);                       /* the new gap is the hole */
    CHECK(flag_at(base, old_hole) && dheap_check() == 0); /* the old one cut up, flag kept */
    /* Scenario B: carving from a hole that has the flag. */
    dheap_free(M);
    uint64_t hole = r->hole;
    CHECK(flag_at(base, hole));
    char *h = dheap_malloc(200);
    CHECK(h && (uint64_t)(h - base) == hole + 8 && flag_at(base, hole) && !flag_at(base, r->hole));
    CHECK(dheap_check() == 0);
    dheap_free(h);
    dheap_free(x);
    dheap_free(y);
    dheap_free(z);
    dheap_free(guard);
    dheap_free(fill);
    CHECK(dheap_check() == 0 && r->allocated == 0);
    dheap_detach();
    munmap(base, cap);
}

/* ---- 1e. corrupt roots ----------------------------------------------------
 * A root whose slab fields point outside the heap, below the chunks, or at
 * misaligned offsets is refused by dheap_extent_of_root (recovery and `mango
 * check` then refuse the pool); a slab_next that passes that check but names
 * no object of its class stops malloc instead of handing out memory. */
/* dheap_check reports a stray link in a slab free list (a use after free
 * that wrote over a freed object's first word) and stops there: it used to
 * follow the link and die with SIGBUS. */
static void test_check_stops_at_a_stray_link(void)
{
    char *base = fresh_heap(4 << 20);
    char *a = dheap_malloc(40), *b = dheap_malloc(40);
    dheap_free(a);
    dheap_free(b);
    memcpy(b, "\x40\x41\x41\x41\x41\x41\x41\x41", 8); /* b is the list's head */
    fprintf(stderr, "(a dheap_check failure follows, on purpose)\n");
    CHECK(dheap_check() != 0);
    dheap_detach();
    munmap(base, 4 << 20);
}

static void test_corrupt_slab_roots(void)
{
    size_t cap = 16 << 20;
    char *base = fresh_heap(cap);
    dheap_root *r = (dheap_root *)base;
    char *a = dheap_malloc(10), *b = dheap_malloc(300);
    dheap_free(dheap_malloc(20)); /* slab_free[2] set */
    (void)a, (void)b;
    CHECK(dheap_check() == 0 && r->slab_map && r->slab_next[1] && r->slab_free[2]);
    dheap_root good = *r;
    CHECK(dheap_extent_of_root(&good, cap) == r->top);
    struct {
        const char *what;
        uint64_t *field;
        uint64_t value;
    } bad[] = {
        {"slab_map below the chunks", &good.slab_map, 16},
        {"slab_map at top", &good.slab_map, good.top},
        {"slab_map misaligned", &good.slab_map, good.slab_map + 8},
        {"hole at top", &good.hole, good.top},
        {"hole misaligned", &good.hole, 1024},
        {"slab_next in the root", &good.slab_next[1], 16},
        {"slab_next past top", &good.slab_next[1], good.top},
        {"slab_free misaligned", &good.slab_free[2], good.slab_free[2] + 4},
        {"slab_free in the root", &good.slab_free[2], 8},
        {"more slab objects than allocations", &good.slab_objects, good.inuse_chunks + 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t keep = *bad[i].field;
        *bad[i].field = bad[i].value;
        if (dheap_extent_of_root(&good, cap) != 0) {
            fprintf(stderr, "corrupt root accepted: %s\n", bad[i].what);
            check_failed++;
        } else {
            check_passed++;
        }
        *bad[i].field = keep;
    }
    dheap_root nomap = good;
    nomap.slab_map = 0; /* slab lists without a map */
    CHECK(dheap_extent_of_root(&nomap, cap) == 0);
    CHECK(dheap_extent_of_root(&good, cap) == r->top);
    dheap_detach();
    munmap(base, cap);
}

/* ---- 1b. calloc of never handed-out space ---------------------------------
 * A chunk carved at or above the root's hwm is zero already, in memory and in
 * the pool: calloc neither writes nor reports it. Reused space (a free list,
 * or given back below hwm) is zeroed and reported as before. */
static int all_zero(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static void test_calloc_fresh_space(void)
{
    size_t cap = 64 << 20, big = 4 << 20;
    char *base = fresh_heap(cap);
    CHECK(((dheap_root *)base)->hwm == heap_top());
    g_captured_bytes = 0;
    char *a = dheap_calloc(1, big);
    CHECK(a && all_zero(a, big));
    CHECK(g_captured_bytes < 4096); /* the header and root fields only */
    CHECK(((dheap_root *)base)->hwm == heap_top());
    char *guard = dheap_malloc(40000); /* a large chunk: given back when freed at top */
    memset(a, 0x5A, big);
    dheap_free(a); /* onto the large free list (guard keeps it below top) */
    g_captured_bytes = 0;
    char *b = dheap_calloc(1, big);
    CHECK(b == a && all_zero(b, big));
    CHECK(g_captured_bytes >= big); /* reused: zeroed and reported */
    dheap_free(b);
    dheap_free(guard); /* both given back: top falls below hwm */
    CHECK(heap_top() < ((dheap_root *)base)->hwm);
    memset(base + heap_top(), 0x77, 4096); /* stale bytes between top and hwm */
    g_captured_bytes = 0;
    char *c = dheap_calloc(1, big);
    CHECK(c && all_zero(c, big) && g_captured_bytes >= big);
    /* With a zero-range callback, the same zeroing of reused memory is one
     * range (its 32-byte aligned interior) and the edges are captured. */
    dheap_free(c);
    dheap_set_zero_capture(zero_capture);
    g_captured_bytes = g_zero_calls = g_zero_bytes = 0;
    memset(base + heap_top(), 0x77, big); /* stale again */
    c = dheap_calloc(1, big);
    CHECK(c && all_zero(c, big) && g_zero_calls == 1 && g_zero_bytes >= big - 32 && g_zero_bytes <= big);
    CHECK(g_captured_bytes < 4096);
    char *small = dheap_calloc(1, 3000); /* below the range minimum: blocks */
    CHECK(small && g_zero_calls == 1);
    dheap_free(small);
    dheap_set_zero_capture(NULL);
    /* A root of the first version-2 builds has no hwm (0): nothing is
     * assumed zero, and it stays 0. */
    dheap_free(c);
    ((dheap_root *)base)->hwm = 0;
    g_captured_bytes = 0;
    char *d = dheap_calloc(1, 2 * big); /* carved past everything so far */
    CHECK(d && all_zero(d, 2 * big) && g_captured_bytes >= 2 * big);
    CHECK(((dheap_root *)base)->hwm == 0);
    dheap_free(d);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);
}

/* ---- 2. precise per-operation capture check ---------------------------- */

static void test_precise_capture(void)
{
    size_t cap = 8 << 20;
    char *base = map_range(NULL, cap);
    char *snap = map_range(NULL, cap);
    g_bits = map_range(NULL, cap / 8);
    g_lo = base, g_hi = base + cap;
    g_mirror = NULL;
    CHECK(dheap_attach(base, cap, true, capture) == 0);

    enum { NS = 64, OPS = 3000 };
    static obj tab[NS];
    unsigned long missed = 0, changed = 0, failed_ops = 0;
    for (int i = 0; i < OPS; i++) {
        size_t top0 = heap_top();
        size_t len = top0 + (512 << 10);
        if (len > cap)
            len = cap;
        memcpy(snap, base, len);
        memset(g_bits, 0, len / 8 + 1);
        g_tiny_percent = i % 2 ? 80 : 0; /* half the ops mostly on slabs */
        if (!random_op(tab, NS, rnd() % NS, 200000))
            failed_ops++;
        size_t top1 = heap_top();
        size_t end = top0 > top1 ? top0 : top1;
        REQUIRE(end <= len);
        for (size_t off = 0; off < end; off += 64) {
            size_t n = end - off < 64 ? end - off : 64;
            if (memcmp(snap + off, base + off, n) == 0)
                continue;
            for (size_t j = off; j < off + n; j++) {
                if (snap[j] == base[j])
                    continue;
                changed++;
                if (!(g_bits[j >> 3] & (1u << (j & 7)))) {
                    if (missed++ < 5)
                        fprintf(stderr, "uncaptured change at offset %zu (op %d)\n", j, i);
                }
            }
        }
    }
    g_tiny_percent = 0;
    CHECK(failed_ops == 0);
    CHECK(changed > 0);
    CHECK(missed == 0);
    CHECK(dheap_check() == 0);
    printf("precise capture: %d ops, %lu changed bytes, %lu uncaptured\n", OPS, changed, missed);
    for (int i = 0; i < NS; i++)
        if (tab[i].p)
            dheap_free(tab[i].p), tab[i].p = NULL;
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap((void *)g_bits, cap / 8);
    g_bits = NULL;
    munmap(snap, cap);
    munmap(base, cap);
}

/* ---- 3. workload with crashes -------------------------------------------- */

static size_t g_hwm; /* highest top seen: both images agree up to here */

/* dheap_usage() against the live objects: one chunk each; the payload is the
 * sum of their usable sizes, plus up to `align` bytes for each memalign block
 * (counted from its chunk's start). */
static int usage_matches(const obj *tab, size_t ns)
{
    uint64_t chunks, payload, allocated, live = 0, usable = 0, slack = 0;
    dheap_usage(&chunks, &payload, &allocated);
    for (size_t i = 0; i < ns; i++) {
        if (!tab[i].p)
            continue;
        live++;
        usable += dheap_usable_size(tab[i].p);
        if (tab[i].align > 16)
            slack += tab[i].align;
    }
    uint64_t headed = chunks - ((dheap_root *)g_lo)->slab_objects; /* chunks with a header */
    int ok = chunks == live && payload >= usable && payload <= usable + slack &&
             allocated == payload + 8 * headed && allocated == ((dheap_root *)g_lo)->allocated;
    if (!ok)
        fprintf(stderr, "usage: %llu chunks, %llu payload, %llu allocated; live %llu, usable %llu (+%llu)\n",
                (unsigned long long)chunks, (unsigned long long)payload, (unsigned long long)allocated,
                (unsigned long long)live, (unsigned long long)usable, (unsigned long long)slack);
    return ok;
}

static int mirror_matches(size_t cap)
{
    size_t end = g_hwm;
    if (heap_top() > end)
        end = heap_top();
    for (size_t off = 0; off < end; off += 4096) {
        size_t n = end - off < 4096 ? end - off : 4096;
        if (memcmp(g_lo + off, g_mirror + off, n) != 0) {
            for (size_t j = off; j < off + n; j++)
                if (g_lo[j] != g_mirror[j]) {
                    fprintf(stderr, "heap and mirror differ at offset %zu\n", j);
                    break;
                }
            return 0;
        }
    }
    (void)cap;
    return 1;
}

/* Simulated crash + recovery: only the mirror survives. */
static void crash_and_recover(size_t cap, obj *tab, size_t ns)
{
    char *base = g_lo;
    uint64_t extent = dheap_extent_of_root((dheap_root *)g_mirror, cap);
    CHECK(extent == heap_top());
    dheap_detach();
    map_range(base, cap); /* MAP_FIXED: a fresh, zeroed mapping at the same address */
    memcpy(base, g_mirror, extent);
    /* Past top the allocator must not depend on the contents: fill with
     * garbage, identically in both images so later comparisons stay exact. */
    if (g_hwm > extent) {
        memset(base + extent, 0xA5, g_hwm - extent);
        memset(g_mirror + extent, 0xA5, g_hwm - extent);
    }
    CHECK(dheap_attach(base, cap, false, capture) == 0);
    dheap_set_zero_capture(zero_capture);
    CHECK(dheap_check() == 0);
    CHECK(usage_matches(tab, ns)); /* the recovered root's counters */
    int ok = 1;
    for (size_t i = 0; i < ns; i++)
        if (tab[i].p && (!pattern_ok(&tab[i], tab[i].n) || dheap_usable_size(tab[i].p) < tab[i].n))
            ok = 0;
    CHECK(ok);
}

static void test_workload(unsigned tiny_percent)
{
    g_tiny_percent = tiny_percent;
    printf("workload with %u %% extra requests of 1..128 bytes\n", tiny_percent);
    size_t cap = 256u << 20;
    char *base = map_range(NULL, cap);
    g_mirror = map_range(NULL, cap);
    g_lo = base, g_hi = base + cap;
    g_hwm = 0;
    CHECK(dheap_attach(base, cap, true, capture) == 0);
    dheap_set_zero_capture(zero_capture); /* the mirror checks cover the ranges too */
    g_zero_calls = 0;

    enum { NS = 2048, OPS = 100000 };
    static obj tab[NS];
    unsigned long nulls = 0;
    for (int i = 1; i <= OPS; i++) {
        if (!random_op(tab, NS, rnd() % NS, 1u << 20))
            nulls++;
        if (heap_top() > g_hwm)
            g_hwm = heap_top();
        if (i % 2000 == 0)
            REQUIRE(dheap_check() == 0);
        if (i % 10000 == 0)
            REQUIRE(mirror_matches(cap));
        if (i % 30000 == 0)
            crash_and_recover(cap, tab, NS);
    }
    CHECK(nulls == 0);
    CHECK(g_bad_captures == 0);
    CHECK(g_zero_calls > 0); /* reused memory was calloc'd in large pieces */
    CHECK(dheap_check() == 0);
    CHECK(mirror_matches(cap));
    size_t live = 0, live_bytes = 0;
    for (int i = 0; i < NS; i++)
        if (tab[i].p)
            live++, live_bytes += tab[i].n;
    CHECK(usage_matches(tab, NS));
    printf("workload: %d ops, %zu live objects (%zu KiB), top %zu KiB, hwm %zu KiB, allocated %llu KiB\n",
           OPS, live, live_bytes >> 10, (size_t)heap_top() >> 10, g_hwm >> 10,
           (unsigned long long)((dheap_root *)base)->allocated >> 10);
    /* Free everything in random order: large frees must coalesce and give
     * the space back, so top ends well below the high-water mark. */
    static uint32_t order[NS];
    for (uint32_t i = 0; i < NS; i++)
        order[i] = i;
    for (uint32_t i = NS; i > 1; i--) {
        uint32_t j = (uint32_t)(rnd() % i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    int intact = 1;
    for (int i = 0; i < NS; i++) {
        obj *o = &tab[order[i]];
        if (!o->p)
            continue;
        intact &= pattern_ok(o, o->n);
        dheap_free(o->p);
        o->p = NULL;
    }
    CHECK(intact);
    printf("after freeing everything: top %zu KiB\n", (size_t)heap_top() >> 10);
    CHECK(dheap_check() == 0);
    CHECK(((dheap_root *)base)->allocated == 0);
    CHECK(mirror_matches(cap));
    dheap_detach();
    munmap(g_mirror, cap);
    g_mirror = NULL;
    munmap(base, cap);
    g_tiny_percent = 0;
}

/* ---- 4. exhaustion --------------------------------------------------------- */

static void test_exhaustion(void)
{
    size_t cap = 1 << 20;
    char *base = fresh_heap(cap);
    static void *ptrs[1 << 16];
    size_t n = 0;
    for (;;) {
        errno = 0;
        void *p = dheap_malloc(100);
        if (!p) {
            CHECK(errno == ENOMEM);
            break;
        }
        ptrs[n++] = p;
    }
    CHECK(n > 5000 && n < (1 << 16));
    CHECK(heap_top() <= cap);
    CHECK(dheap_malloc(40000) == NULL);
    CHECK(dheap_check() == 0);
    for (size_t i = 0; i < n; i++)
        dheap_free(ptrs[i]);
    size_t again = 0;
    while (again < n + 10 && (ptrs[again] = dheap_malloc(100)) != NULL)
        again++;
    CHECK(again == n); /* everything freed is reusable, nothing more */
    for (size_t i = 0; i < again; i++)
        dheap_free(ptrs[i]);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);

    /* Large chunks: fill, free in shuffled order, top comes back down. */
    cap = 64 << 20;
    base = fresh_heap(cap);
    uint64_t top0 = heap_top();
    n = 0;
    while ((ptrs[n] = dheap_malloc(40000 + rnd() % 300000)) != NULL)
        n++;
    CHECK(n > 100);
    CHECK(dheap_malloc(cap) == NULL);
    for (size_t i = n; i > 1; i--) {
        size_t j = rnd() % i;
        void *t = ptrs[i - 1];
        ptrs[i - 1] = ptrs[j];
        ptrs[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        dheap_free(ptrs[i]);
        if (i % 50 == 0)
            REQUIRE(dheap_check() == 0);
    }
    CHECK(dheap_check() == 0);
    CHECK(heap_top() == top0);
    CHECK(((dheap_root *)base)->large_free == 0);
    void *whole = dheap_malloc(cap - 2 * 4096);
    CHECK(whole != NULL);
    dheap_free(whole);
    CHECK(heap_top() == top0);
    dheap_detach();
    munmap(base, cap);
}

/* ---- 4b. reclaiming stranded space ------------------------------------------ */

/* Where top is once everything is freed and reclaimed: past the slab map
 * (an in-use chunk for good), or at the first chunk if there is none. */
static uint64_t top_when_empty(const char *base, size_t cap)
{
    uint64_t map = ((const dheap_root *)base)->slab_map;
    return map ? map - 8 + ((cap / 16384 + 8 + 4095) & ~(uint64_t)4095) : DHEAP_FIRST_CHUNK;
}

/* Fill a fresh heap of cap bytes with requests of n bytes until one fails;
 * returns how many succeeded (pointers in ptrs). */
static size_t fill_with(void **ptrs, size_t max, size_t n)
{
    size_t k = 0;
    while (k < max && (ptrs[k] = dheap_malloc(n)) != NULL)
        k++;
    return k;
}

static void free_all(void **ptrs, size_t k, size_t step, size_t first)
{
    for (size_t i = first; i < k; i += step)
        dheap_free(ptrs[i]), ptrs[i] = NULL;
}

static void test_reclaim(void)
{
    size_t cap = 4 << 20;
    static void *ptrs[1 << 20];
    size_t big = cap * 3 / 4;

    /* Emptied slabs of every class and free small chunks: stranded until
     * the large request reclaims them. */
    static const size_t sizes[] = {8, 24, 100, 128, 300, 1000, 20000};
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        g_mirror = map_range(NULL, cap); /* before the root is written */
        char *base = fresh_heap(cap);
        g_hwm = cap; /* both start zero: compare all of it */
        size_t k = fill_with(ptrs, 1 << 20, sizes[i]);
        CHECK(k > (cap / 2) / (sizes[i] + 16));
        CHECK(heap_top() > cap - 64 * 1024);
        /* Keep the highest object: the free space below it cannot be
         * given back at top, it must be merged. */
        size_t hi = 0;
        for (size_t j = 1; j < k; j++)
            if ((char *)ptrs[j] > (char *)ptrs[hi])
                hi = j;
        void *keep = ptrs[hi];
        ptrs[hi] = NULL;
        for (size_t j = 0; j < k; j++)
            if (ptrs[j])
                dheap_free(ptrs[j]), ptrs[j] = NULL;
        CHECK(dheap_check() == 0);
        uint64_t before = dheap_reclaims();
        void *p = dheap_malloc(big);
        CHECK(p != NULL);
        CHECK(dheap_reclaims() == before + 1);
        CHECK(dheap_check() == 0);
        CHECK(mirror_matches(cap)); /* every store of the reclaim was captured */
        dheap_free(p);
        dheap_free(keep);
        /* All of it comes back: only the slab map (if any) stays carved. */
        dheap_reclaim();
        CHECK(heap_top() == top_when_empty(base, cap));
        CHECK(dheap_check() == 0);
        CHECK(mirror_matches(cap));
        /* And serves the same requests again. */
        size_t again = fill_with(ptrs, 1 << 20, sizes[i]);
        CHECK(again + again / 50 + 2 >= k);
        free_all(ptrs, again, 1, 0);
        dheap_detach();
        munmap(g_mirror, cap);
        g_mirror = NULL;
        munmap(base, cap);
    }

    /* Slabs that still hold one live object each are not released, and a
     * reclaim that finds nothing to gain changes nothing. */
    {
        char *base = fresh_heap(cap);
        size_t k = fill_with(ptrs, 1 << 20, 24);
        size_t kept = 0, chunks = 0;
        uint64_t region = UINT64_MAX;
        for (size_t i = 0; i < k; i++) {
            if (dheap_usable_size(ptrs[i]) != 32) {
                chunks++; /* the fallback to small chunks once no slab fits */
                continue;
            }
            uint64_t r = (uint64_t)((char *)ptrs[i] - base) >> 14;
            if (r != region)
                region = r, kept++;
            else
                dheap_free(ptrs[i]), ptrs[i] = NULL;
        }
        CHECK(kept > 200 && chunks > 0);
        char *snap = map_range(NULL, cap);
        memcpy(snap, base, cap);
        uint64_t before = dheap_reclaims();
        errno = 0;
        void *p = dheap_malloc(big);
        CHECK(p == NULL && errno == ENOMEM);
        CHECK(dheap_reclaims() == before);
        CHECK(memcmp(snap, base, cap) == 0);
        CHECK(dheap_check() == 0);
        for (size_t i = 0; i < k; i++)
            if (ptrs[i])
                dheap_free(ptrs[i]), ptrs[i] = NULL;
        p = dheap_malloc(big);
        CHECK(p != NULL);
        CHECK(dheap_check() == 0);
        dheap_free(p);
        munmap(snap, cap);
        dheap_detach();
        munmap(base, cap);
    }

    /* Free large chunks below top serve small requests once top is full
     * (through the hole); before they served only large ones. */
    {
        char *base = fresh_heap(cap);
        size_t k = fill_with(ptrs, 1 << 20, 60000);
        CHECK(k > 40);
        free_all(ptrs, k, 2, 1);
        static void *q[1 << 15];
        size_t got = 0;
        while (got < (1 << 15) && (q[got] = dheap_malloc(500)) != NULL)
            got++;
        size_t freed = (k / 2) * 61440;
        CHECK(got * 512 > freed * 9 / 10);
        CHECK(dheap_check() == 0);
        free_all(q, got, 1, 0);
        free_all(ptrs, k, 2, 0);
        CHECK(dheap_malloc(big) != NULL);
        CHECK(dheap_check() == 0);
        dheap_detach();
        munmap(base, cap);
    }
}

/* The paths into a reclaim, each on its own: the frees that make one
 * worth running, the attach, memalign; what dheap_fits promises. */
static void test_reclaim_triggers(void)
{
    size_t cap = 4 << 20, big = cap * 3 / 4;
    static void *ptrs[1 << 20];

    /* Frees of slab objects after a reclaim make the next one run. */
    char *base = fresh_heap(cap);
    size_t k = fill_with(ptrs, 1 << 20, 24);
    CHECK(dheap_malloc(big) == NULL); /* reclaims: nothing to gain */
    CHECK(dheap_reclaim() == false);   /* nothing freed since: not even walked */
    for (size_t i = 0; i < k; i++)     /* the slab objects only */
        if (dheap_usable_size(ptrs[i]) == 32)
            dheap_free(ptrs[i]), ptrs[i] = NULL;
    void *p = dheap_malloc(big / 2);
    CHECK(p != NULL);
    dheap_free(p);
    dheap_detach();
    munmap(base, cap);

    /* A run of two free small chunks and a free large one above them,
     * below a live chunk: merged, the small remainder goes last, and the
     * live chunk's flag (the chunk below is a free large one) is cleared. */
    base = fresh_heap(cap);
    void *s0 = dheap_malloc(200), *s1 = dheap_malloc(200), *l0 = dheap_malloc(40000), *x0 = dheap_malloc(200);
    dheap_free(s0);
    dheap_free(s1);
    dheap_free(l0);
    CHECK(dheap_reclaim());
    CHECK(dheap_check() == 0);
    CHECK(dheap_malloc(40000) == s0); /* the merged piece, from the small chunk on */
    dheap_free(x0);
    dheap_detach();
    munmap(base, cap);

    /* A small request that takes a free large piece takes the smallest that
     * will do, leaving the big one whole. */
    base = fresh_heap(cap);
    void *a = dheap_malloc(400000), *sep1 = dheap_malloc(300), *b = dheap_malloc(40000),
         *sep2 = dheap_malloc(300);
    while (dheap_malloc(300))
        ;
    dheap_free(b);
    dheap_free(a); /* the list: a, then b */
    CHECK(dheap_malloc(1000) != NULL);
    CHECK(dheap_malloc(400000) == a);
    CHECK(dheap_check() == 0);
    (void)sep1, (void)sep2;
    dheap_detach();
    munmap(base, cap);

    /* A recovered heap with stranded space reclaims on its first need. */
    base = fresh_heap(cap);
    k = fill_with(ptrs, 1 << 20, 40);
    CHECK(dheap_malloc(big) == NULL);
    free_all(ptrs, k, 1, 0);
    dheap_detach();
    CHECK(dheap_attach(base, cap, false, capture) == 0);
    uint64_t before = dheap_reclaims();
    p = dheap_malloc(big);
    CHECK(p != NULL && dheap_reclaims() == before + 1);
    dheap_free(p);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);

    /* memalign reclaims too. */
    base = fresh_heap(cap);
    k = fill_with(ptrs, 1 << 20, 300);
    free_all(ptrs, k, 1, 0);
    p = dheap_memalign(4096, big);
    CHECK(p != NULL && ((uintptr_t)p & 4095) == 0);
    dheap_free(p);
    dheap_detach();
    munmap(base, cap);

    /* A run of a free large chunk and a free small one at top is given
     * back, though it is as merged as it can be. */
    base = fresh_heap(cap);
    uint64_t top0 = heap_top();
    void *l = dheap_malloc(40000), *s = dheap_malloc(200);
    dheap_free(l);
    dheap_free(s);
    CHECK(heap_top() > top0);
    CHECK(dheap_reclaim());
    CHECK(heap_top() == top0);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);

    /* With top full, a slab is made inside a free large chunk: its objects
     * are slab objects, inside the freed chunk, and the rest of the chunk
     * stays usable. */
    g_mirror = map_range(NULL, cap);
    base = fresh_heap(cap);
    g_hwm = cap;
    void *first = dheap_malloc(8); /* the slab map, and a first slab at top */
    k = fill_with(ptrs, 1 << 20, 60000);
    CHECK(k > 20);
    while (dheap_malloc(3000)) /* top full to the last bytes */
        ;
    while (dheap_malloc(200))
        ;
    CHECK(heap_top() > cap - 256);
    for (size_t i = 1; i < k; i += 2)
        dheap_free(ptrs[i]), ptrs[i] = NULL;
    char *o = dheap_malloc(40);
    CHECK(o && dheap_usable_size(o) == 48);
    int inside = 0;
    for (size_t i = 1; i < k; i += 2)
        inside |= o >= (char *)ptrs[i - 1] + 60000 && (i + 1 >= k || o < (char *)ptrs[i + 1]);
    CHECK(inside);
    char *o2 = dheap_malloc(40);
    CHECK(o2 == o + 48); /* the same slab, next object */
    CHECK(dheap_malloc(50000) != NULL); /* what is left of freed chunks */
    CHECK(dheap_check() == 0);
    CHECK(mirror_matches(cap));
    (void)first;
    dheap_detach();
    munmap(g_mirror, cap);
    g_mirror = NULL;
    munmap(base, cap);

    /* dheap_fits(n) promises room for n without a reclaim, on a heap
     * whose free space lies in pieces of many sizes. */
    base = fresh_heap(cap);
    k = 0;
    while ((ptrs[k] = dheap_malloc(1 + rnd() % 200000)) != NULL)
        k++;
    for (size_t i = 0; i < k; i++)
        if (rnd() % 3 == 0)
            dheap_free(ptrs[i]), ptrs[i] = NULL;
    unsigned fit = 0, unfit = 0;
    for (int i = 0; i < 2000; i++) {
        size_t n = i % 4 == 3 ? (1 + rnd() % 146) * 4096 - rnd() % 9 : 1 + rnd() % (i % 2 ? 600000 : 300);
        uint64_t r0 = dheap_reclaims();
        if (!dheap_fits(n)) {
            unfit++;
            continue;
        }
        fit++;
        void *q = dheap_malloc(n);
        REQUIRE(q != NULL && dheap_reclaims() == r0);
        if (q && rnd() % 2)
            dheap_free(q);
    }
    CHECK(fit > 100 && unfit > 100);
    CHECK(dheap_check() == 0);
    dheap_detach();
    munmap(base, cap);
}

/* Free small chunks between live objects (found by a review: a heap 96.7 %
 * free refused every 3000-byte request). 6000-byte objects alternate with
 * 200-byte ones until the heap is full, then the big ones are freed: each
 * 6 KiB chunk is alone between two live ones, and smaller requests of other
 * classes split it. Every store is captured; the captured image recovers. */
static void test_stranded_small(void)
{
    size_t cap = 4 << 20;
    static void *big[1 << 12];
    static void *got[1 << 14];
    g_mirror = map_range(NULL, cap);
    char *base = fresh_heap(cap);
    g_hwm = cap;
    size_t n = 0;
    for (;;) {
        void *b = dheap_malloc(6000);
        if (!b)
            break;
        big[n++] = b;
        if (!dheap_malloc(200))
            break;
    }
    CHECK(n > 500);
    for (size_t i = 0; i < n; i++)
        dheap_free(big[i]);
    uint64_t allocated;
    dheap_usage(NULL, NULL, &allocated);
    uint64_t free_bytes = cap - allocated;
    size_t k = 0;
    while (k < (1 << 14) && (got[k] = dheap_malloc(3000)) != NULL)
        k++;
    printf("stranded small chunks: %zu of 6000 bytes freed (%.1f %% free), then %zu requests of 3000 served "
           "(%.1f %% of the free bytes; %llu reclaims)\n", n, 100.0 * (double)free_bytes / (double)cap, k,
           100.0 * (double)k * 3000 / (double)free_bytes, (unsigned long long)dheap_reclaims());
    CHECK(k >= 2 * n - 2); /* two per freed 6 KiB chunk (before: none) */
    CHECK(dheap_reclaims() <= 2); /* the splits do not make every request walk the heap */
    CHECK(dheap_check() == 0);
    CHECK(mirror_matches(cap));
    /* Every other one freed again: 500-byte requests take six of each. */
    size_t freed = 0;
    for (size_t i = 0; i < k; i += 2, freed++)
        dheap_free(got[i]);
    size_t more = 0;
    while (more < 7 * freed && dheap_malloc(500))
        more++;
    CHECK(more >= 6 * freed);
    CHECK(dheap_check() == 0);
    CHECK(mirror_matches(cap));
    /* A crash: the captured image alone is a consistent heap. */
    uint64_t top = heap_top();
    CHECK(dheap_extent_of_root((dheap_root *)g_mirror, cap) == top);
    dheap_detach();
    map_range(base, cap);
    memcpy(base, g_mirror, top);
    CHECK(dheap_attach(base, cap, false, capture) == 0);
    CHECK(dheap_check() == 0);
    dheap_usage(NULL, NULL, &allocated);
    CHECK(allocated == ((dheap_root *)g_mirror)->allocated);
    dheap_detach();
    munmap(g_mirror, cap);
    g_mirror = NULL;
    munmap(base, cap);
}

/* Regions the slab map names. */
static uint64_t slab_regions(const char *base, size_t cap)
{
    uint64_t map = ((const dheap_root *)base)->slab_map, n = 0;
    for (size_t i = 0; map && i < cap / 16384; i++)
        n += base[map + i] != 0;
    return n;
}

/* Random work on a heap too small for it, so requests fail and reclaim
 * often, with both checks of the other tests: every changed byte captured
 * (per operation), the mirror equal to the heap, simulated crashes. */
static void test_reclaim_workload(void)
{
    size_t cap = 2 << 20;
    g_mirror = map_range(NULL, cap);
    char *base = fresh_heap(cap);
    char *snap = map_range(NULL, cap);
    g_bits = map_range(NULL, cap / 8);
    dheap_set_zero_capture(zero_capture);
    g_hwm = 0;
    enum { NS = 2048, OPS = 12000 };
    static obj tab[NS];
    memset(tab, 0, sizeof tab);
    unsigned long failed = 0, missed = 0;
    uint64_t reclaims = 0, slabs_before = 0, slabs_released = 0, slabs_remade = 0;
    for (int i = 1; i <= OPS; i++) {
        /* Phases that move the heap between slab objects and chunks; each
         * chunk phase starts by freeing every slab-sized object (a FLUSHALL
         * of small keys, say), the others are random work. */
        unsigned tiny = (i / 1500) % 2 ? 0 : 95;
        memcpy(snap, base, cap);
        memset(g_bits, 0, cap / 8);
        uint64_t r0 = dheap_reclaims();
        if (tiny != g_tiny_percent && !tiny) {
            for (int j = 0; j < NS; j++)
                if (tab[j].p && tab[j].n <= 128)
                    dheap_free(tab[j].p), tab[j].p = NULL;
        } else if (!random_op(tab, NS, rnd() % NS, 32 * 1024)) {
            failed++;
        }
        g_tiny_percent = tiny;
        reclaims += dheap_reclaims() - r0;
        uint64_t nslabs = slab_regions(base, cap);
        slabs_released += nslabs < slabs_before ? slabs_before - nslabs : 0;
        uint64_t map = ((const dheap_root *)base)->slab_map, top_before = ((const dheap_root *)snap)->top;
        for (size_t j = 0; map && nslabs > slabs_before && j < cap / 16384; j++)
            if (base[map + j] && !snap[map + j] && (j + 1) * 16384 <= top_before)
                slabs_remade++; /* made below the old top: inside a free chunk */
        slabs_before = nslabs;
        for (size_t off = 0; off < cap; off += 64) {
            if (memcmp(snap + off, base + off, 64) == 0)
                continue;
            for (size_t j = off; j < off + 64; j++)
                if (snap[j] != base[j] && !(g_bits[j >> 3] & (1u << (j & 7))) && missed++ < 5)
                    fprintf(stderr, "uncaptured change at offset %zu (op %d)\n", j, i);
        }
        if (heap_top() > g_hwm)
            g_hwm = heap_top();
        if (i % 100 == 0)
            REQUIRE(dheap_check() == 0);
        if (i % 1000 == 0)
            REQUIRE(mirror_matches(cap));
        if (i % 4000 == 0)
            crash_and_recover(cap, tab, NS);
    }
    g_tiny_percent = 0;
    printf("reclaim workload: %d ops, %lu failed for room, %llu reclaims, %llu slabs released, %llu made "
           "in free chunks, %lu uncaptured\n", OPS, failed, (unsigned long long)reclaims,
           (unsigned long long)slabs_released, (unsigned long long)slabs_remade, missed);
    CHECK(failed > 0);
    CHECK(reclaims > 10);
    CHECK(slabs_released > 0);
    CHECK(slabs_remade > 0);
    CHECK(missed == 0);
    CHECK(dheap_check() == 0);
    CHECK(usage_matches(tab, NS));
    for (int i = 0; i < NS; i++)
        if (tab[i].p)
            dheap_free(tab[i].p), tab[i].p = NULL;
    dheap_reclaim();
    CHECK(heap_top() == top_when_empty(base, cap));
    CHECK(dheap_check() == 0);
    CHECK(mirror_matches(cap));
    dheap_detach();
    munmap(g_mirror, cap);
    g_mirror = NULL;
    munmap((void *)g_bits, cap / 8);
    g_bits = NULL;
    munmap(snap, cap);
    munmap(base, cap);
}

/* ---- 5. programming errors abort ------------------------------------------ */

static int aborts(void (*fn)(char *base, size_t cap))
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0)
            dup2(fd, 2);
        size_t cap = 1 << 20;
        char *base = map_range(NULL, cap);
        g_lo = base, g_hi = base + cap;
        if (dheap_attach(base, cap, true, capture) != 0)
            _exit(3);
        fn(base, cap);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return 0;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void double_free(char *b, size_t c) { void *p = dheap_malloc(10); dheap_free(p); dheap_free(p); }
static void double_free_chunk(char *b, size_t c) { void *p = dheap_malloc(200); dheap_free(p); dheap_free(p); }
static void slab_interior_free(char *b, size_t c) { char *p = dheap_malloc(40); dheap_free(p + 16); }
static void slab_unused_free(char *b, size_t c) { char *p = dheap_malloc(40); dheap_free(p + 48 * 3); }
static void double_free_large(char *b, size_t c) { void *p = dheap_malloc(100000); void *g = dheap_malloc(1); dheap_free(p); dheap_free(p); (void)g; }
static void double_free_aligned(char *b, size_t c) { void *p = dheap_memalign(256, 10); dheap_free(p); dheap_free(p); }
static void foreign_free(char *b, size_t c) { static char x[64]; dheap_free(x + 16); }
static void interior_free(char *b, size_t c) { char *p = dheap_malloc(200); dheap_free(p + 32); }
static void unaligned_free(char *b, size_t c) { char *p = dheap_malloc(200); dheap_free(p + 1); }
static void beyond_top_free(char *b, size_t c) { dheap_free(b + c / 2); }
static void no_error(char *b, size_t c) { void *p = dheap_malloc(10); dheap_free(p); }
static void map_free(char *b, size_t c) { dheap_free(dheap_malloc(10)); dheap_free(b + ((dheap_root *)b)->slab_map); }
/* A chunk header whose size field reads 0, its magic intact (a corrupt pool's
 * heap mirror; found by fuzzing pool files): the reclaim walk stepped by 0
 * bytes from it forever, so a start without MANGO_CHECK_HEAP=1 hung at its
 * first request that found no room. It must stop. (alarm: the hang is then
 * SIGALRM, not SIGABRT.) */
static void zero_size_chunk_reclaim(char *b, size_t c)
{
    static void *p[4096];
    alarm(20);
    size_t k = 0;
    while (k < sizeof p / sizeof p[0] && (p[k] = dheap_malloc(1000)) != NULL)
        k++;
    if (k < 4)
        _exit(4);
    for (size_t i = 0; i < k; i += 2)
        dheap_free(p[i]);
    memset((char *)p[1] - 8, 0, 4); /* the in-use chunk's size / 16 */
    dheap_malloc(c / 2);            /* no room: reclaims */
}
/* A slab_next inside a live chunk: in range and aligned, so the root passes;
 * malloc must stop rather than hand out the chunk's bytes. */
static void slab_next_in_a_chunk(char *b, size_t c)
{
    dheap_free(dheap_malloc(10));
    char *p = dheap_malloc(300);
    ((dheap_root *)b)->slab_next[3] = (uint64_t)(p - b);
    if (dheap_extent_of_root((dheap_root *)b, c) == 0)
        _exit(4); /* refused earlier: not this test's case */
    dheap_malloc(48);
}

/* Damaged links behind the root's heads (a damaged pool; the root check of
 * every open sees the heads only). Each was followed out of the heap
 * (SIGSEGV), looped, or made the allocator store through it; each must
 * stop with the allocator's message. two_free_large: free large chunks of
 * 40 KiB (*lo) and 60 KiB (*hi, listed first, its links returned), an
 * in-use large chunk (*above) right above the first, in-use small chunks
 * between and above. */
static uint64_t *two_free_large(char **lo, char **above, char **hi)
{
    char *a = dheap_malloc(40000), *x = dheap_malloc(40000), *g1 = dheap_malloc(300);
    char *c = dheap_malloc(60000), *g2 = dheap_malloc(300);
    if (!a || !x || !g1 || !c || !g2)
        _exit(4);
    dheap_free(a);
    dheap_free(c);
    *lo = a, *above = x, *hi = c;
    return (uint64_t *)c; /* the head's links: next, prev */
}
static void large_link_out_of_heap(char *b, size_t c)
{
    char *lo, *above, *hi;
    two_free_large(&lo, &above, &hi)[0] = (uint64_t)1 << 40;
    dheap_malloc(70000); /* the head is too small: follows its link */
}
static void large_link_cycle(char *b, size_t c)
{
    alarm(20); /* a hang is SIGALRM, not SIGABRT */
    char *lo, *above, *hi;
    uint64_t *head = two_free_large(&lo, &above, &hi);
    head[0] = ((dheap_root *)b)->large_free; /* the head links to itself */
    dheap_malloc(c / 2);                      /* no fit anywhere */
}
static void large_back_link_wrong(char *b, size_t c)
{
    char *lo, *above, *hi;
    two_free_large(&lo, &above, &hi);
    ((uint64_t *)lo)[1] = 0; /* the second's prev: none, as if it were the head */
    dheap_free(above);       /* merges with it: unlinks it */
    /* (unchecked, the head became the second's next, none: the 60 KiB
     * chunk, free, was no longer listed) */
    _exit(5);
}
/* dheap_fits (mango_heap_fits: Redis's guard before a big value's malloc)
 * follows the same list first: it looped on the cycle, or read through the
 * wild link (SIGSEGV), instead of stopping with the allocator's message. */
static void large_link_cycle_fits(char *b, size_t c)
{
    alarm(20); /* a hang is SIGALRM, not SIGABRT */
    char *lo, *above, *hi;
    uint64_t *head = two_free_large(&lo, &above, &hi);
    head[0] = ((dheap_root *)b)->large_free;
    (void)dheap_fits(c - c / 16); /* more than top has left: walks the list */
}
static void large_link_out_of_heap_fits(char *b, size_t c)
{
    char *lo, *above, *hi;
    two_free_large(&lo, &above, &hi)[0] = (uint64_t)1 << 40;
    (void)dheap_fits(c - c / 16);
}
/* A damaged size that still ends below top: the chunk it claims overlaps
 * the in-use chunk above it, whose bytes malloc handed out again (and
 * wrote a flag into) without a word. Its footer and the flag of the chunk
 * its size reaches give it away. */
static void large_size_inside_top(char *b, size_t c)
{
    char *lo, *above, *hi;
    two_free_large(&lo, &above, &hi);
    *(uint32_t *)(lo - 8) = (uint32_t)(65536 >> 4); /* 40 KiB -> 64 KiB: over *above */
    char *p = dheap_malloc(62000); /* the head (60 KiB) is too small: takes *lo */
    if (p && p + 62000 > above)
        _exit(6); /* (unchecked: handed out over the live chunk) */
}
static void hole_size_inside_top(char *b, size_t c)
{
    dheap_free(dheap_malloc(300));
    dheap_free(dheap_malloc(10));
    uint64_t h = ((dheap_root *)b)->hole;
    if (!h)
        _exit(4);
    uint32_t *sz = (uint32_t *)(b + h);
    char *slab = b + h + ((uint64_t)*sz << 4); /* the chunk above it */
    *sz += 4096 >> 4; /* reaches 4 KiB into the slab, below top */
    for (int i = 0; i < 16; i++) {
        char *p = dheap_malloc(1000);
        if (p >= slab && p < slab + 16384)
            _exit(6); /* (unchecked: a chunk carved in the slab) */
    }
}
static void small_link_out_of_heap_reclaim(char *b, size_t c)
{
    static char *p[1024];
    size_t k = 0;
    while (k < sizeof p / sizeof p[0] && (p[k] = dheap_malloc(1000)) != NULL)
        k++;
    if (k < 4)
        _exit(4);
    dheap_free(p[1]);
    dheap_free(p[2]); /* two free neighbours: a run that reclaim merges */
    *(uint64_t *)p[2] = (uint64_t)1 << 40; /* the class's head: its link */
    dheap_malloc(c / 2); /* no room: reclaims */
}
static void hole_past_top(char *b, size_t c)
{
    dheap_free(dheap_malloc(300)); /* a chunk, then a slab: its alignment leaves the hole */
    dheap_free(dheap_malloc(10));
    uint64_t h = ((dheap_root *)b)->hole;
    if (!h)
        _exit(4);
    *(uint32_t *)(b + h) = (uint32_t)((c * 8) >> 4); /* its size: far past top */
    for (int i = 0; i < 4096; i++)
        if (!dheap_malloc(1000))
            _exit(5);
}

static void test_errors(void)
{
    CHECK(aborts(double_free));
    CHECK(aborts(double_free_chunk));
    CHECK(aborts(slab_interior_free));
    CHECK(aborts(slab_unused_free));
    CHECK(aborts(double_free_large));
    CHECK(aborts(double_free_aligned));
    CHECK(aborts(foreign_free));
    CHECK(aborts(interior_free));
    CHECK(aborts(unaligned_free));
    CHECK(aborts(beyond_top_free));
    CHECK(aborts(map_free));
    CHECK(aborts(slab_next_in_a_chunk));
    CHECK(aborts(zero_size_chunk_reclaim));
    CHECK(aborts(large_link_out_of_heap));
    CHECK(aborts(large_link_cycle));
    CHECK(aborts(large_link_cycle_fits));
    CHECK(aborts(large_link_out_of_heap_fits));
    CHECK(aborts(large_back_link_wrong));
    CHECK(aborts(small_link_out_of_heap_reclaim));
    CHECK(aborts(hole_past_top));
    CHECK(aborts(large_size_inside_top));
    CHECK(aborts(hole_size_inside_top));
    CHECK(!aborts(no_error));
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x5eed1234ULL;
    rng_state = seed ? seed : 1;
    printf("seed 0x%llx\n", (unsigned long long)seed);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    test_basics();
    test_chunk_sizes_and_merging();
    test_realloc_in_place();
    test_slabs();
    test_hole_flags_and_map_reuse();
    test_corrupt_slab_roots();
    test_check_stops_at_a_stray_link();
    test_calloc_fresh_space();
    test_precise_capture();
    test_workload(0);
    test_workload(80); /* mostly slab objects: slabs, holes and their release */
    test_exhaustion();
    test_reclaim();
    test_reclaim_triggers();
    test_stranded_small();
    test_reclaim_workload();
    test_errors();
    CHECK(g_bad_captures == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("elapsed %.2f s\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return check_report("test_durable_heap");
}
