/* durable_heap.c -- the durable allocator (see durable_heap.h).
 *
 * Layout of the range [base, base + capacity):
 *
 *   base + 0          dheap_root (public fields, then free-list heads/counters)
 *   base + FIRST_OFF  chunk, chunk, chunk, ...            <- carved from top
 *   base + top        never-carved (or given-back) space up to capacity
 *
 * Every chunk starts with an 8-byte header (chunk_hdr) and its payload starts
 * right after it. Chunks start at offsets of 8 modulo 16 and their sizes are
 * multiples of 16, so user pointers are 16-byte aligned (the base is page
 * aligned). Chunks tile [FIRST_OFF, top) exactly; each header records its own
 * size, so the heap can be walked upwards. A small 24-byte object (a Redis
 * dictEntry) takes a 32-byte chunk.
 *
 * Small requests (<= DHEAP_SMALL_MAX) are rounded up to one of DHEAP_NCLASSES
 * size classes. A freed small chunk goes, unchanged, to its class's LIFO
 * singly linked free list (link in the first payload word) and is only ever
 * reused for the same class: small chunks are never split or merged.
 *
 * Large requests take a page-multiple chunk. Free large chunks sit on one
 * doubly linked list (next/prev offsets in the first two payload words),
 * searched first fit; a fit that is bigger than needed is split and the tail
 * goes back on the list. On free, a large chunk is merged with a free large
 * neighbour on either side (small chunks are never merged), and if the result
 * ends at top it is given back by lowering top instead of being listed. To
 * find the neighbour below without a size-of-previous field, a free large
 * chunk keeps its size in its last 8 bytes (a footer) and the chunk right
 * above it carries the PREV_FREE_LARGE flag (boundary tags). Hence the
 * invariants dheap_check verifies: no two free large chunks are adjacent, the
 * last chunk is never a free large one, and a chunk has the flag exactly when
 * the chunk below it is a free large one whose footer holds its size.
 *
 * memalign over-allocates by `align` bytes and places an 8-byte ALIAS header
 * right before the aligned pointer; it records the distance back to the real
 * chunk. Freeing through an alias inverts the alias's magic, so a second free
 * of the same aligned pointer is detected.
 *
 * Durability: every store the allocator makes inside the range goes through
 * meta_write() / META_SET(), which write and then report the bytes to the
 * capture callback. There are no other stores to the range in this file except
 * the payload copy in realloc and the zeroing in calloc, each followed by an
 * explicit capture. Links are offsets from base, never pointers.
 *
 * Single writer (the combiner): no locks. No libc allocation is used.
 */
#define _GNU_SOURCE
#include "alloc/durable_heap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#define HDR 8u
#define PAGE 4096u
#define ROUND_UP(x, a) (((x) + ((a) - 1)) & ~((uint64_t)(a) - 1))
/* The first chunk's header; its payload starts at 1024. */
#define FIRST_OFF ((uint64_t)1024 - HDR)
_Static_assert(FIRST_OFF == DHEAP_FIRST_CHUNK, "the first chunk's offset is part of the pool format (docs/pool-format.md)");
_Static_assert(sizeof(dheap_root) <= FIRST_OFF, "the root must end before the first chunk");

#define HDR_MAGIC 0xD17Eu
#define ST_INUSE 0x1u
#define ST_FREE 0x2u
#define ST_ALIAS 0x3u
#define ST_MASK 0x7Fu
#define PREV_FREE_LARGE 0x80u /* state flag: the chunk below is a free large one */
#define CLS_LARGE 0xFFu
#define CLS_ALIAS 0xFEu
/* size16 is 32 bits: chunks stay below 64 GiB. */
#define MAX_CHUNK ((((uint64_t)UINT32_MAX) << 4) & ~((uint64_t)PAGE - 1))

typedef struct chunk_hdr {
    uint32_t size16; /* chunk size / 16, header included; ALIAS: distance back to the real chunk / 16 */
    uint16_t magic;  /* HDR_MAGIC ^ (offset / 16): a header copied elsewhere does not validate */
    uint8_t cls;     /* small class index, CLS_LARGE or CLS_ALIAS */
    uint8_t state;   /* ST_INUSE, ST_FREE or ST_ALIAS, | PREV_FREE_LARGE */
} chunk_hdr;
_Static_assert(sizeof(chunk_hdr) == HDR, "chunk header must be 8 bytes");
_Static_assert(DHEAP_NCLASSES < CLS_ALIAS, "class indexes fit the header");

static char *g_base;
static uint64_t g_cap;
static dheap_root *g_root;
static dheap_capture_fn g_capture;
static dheap_zero_fn g_zero;
#define ZERO_RANGE_MIN 4096u /* smaller zeroings are logged block by block */

/* ---- the one way to write metadata ----------------------------------- */

static inline void meta_write(void *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
    if (g_capture)
        g_capture(dst, len);
}

/* Store val into the lvalue lv (which lives in the heap range) and capture it. */
#define META_SET(lv, val)                                                     \
    do {                                                                      \
        __typeof__(lv) meta_v_ = (val);                                       \
        meta_write(&(lv), &meta_v_, sizeof meta_v_);                          \
    } while (0)

/* Report payload bytes the allocator wrote on the user's behalf. */
static inline void capture_payload(const void *p, size_t len)
{
    if (g_capture && len)
        g_capture(p, len);
}

/* ---- helpers ----------------------------------------------------------- */

static void die(const char *op, const void *p, const char *why)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "mangosteen durable heap: %s(%p): %s\n", op, p, why);
    if (n > 0)
        (void)!write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    abort();
}

static inline chunk_hdr *hdr_at(uint64_t off) { return (chunk_hdr *)(g_base + off); }
static inline uint64_t *link_at(uint64_t off) { return (uint64_t *)(g_base + off + HDR); }
/* A free large chunk's footer: its size, in its last 8 bytes. */
static inline uint64_t *footer_of(uint64_t off, uint64_t size) { return (uint64_t *)(g_base + off + size - 8); }
static inline uint16_t magic_for(uint64_t off) { return (uint16_t)(HDR_MAGIC ^ (uint16_t)(off >> 4)); }
static inline uint64_t csize(const chunk_hdr *h) { return (uint64_t)h->size16 << 4; }
static inline unsigned cstate(const chunk_hdr *h) { return h->state & ST_MASK; }
static inline uint8_t prev_flag(const chunk_hdr *h) { return h->state & PREV_FREE_LARGE; }

static void set_hdr(uint64_t off, uint64_t size, unsigned state, uint8_t cls, uint8_t flag)
{
    chunk_hdr h = {
        .size16 = (uint32_t)(size >> 4),
        .magic = magic_for(off),
        .cls = cls,
        .state = (uint8_t)(state | flag),
    };
    meta_write(hdr_at(off), &h, sizeof h);
}

/* Set or clear the PREV_FREE_LARGE flag of the chunk at off (which exists). */
static void set_prev_flag(uint64_t off, bool on)
{
    chunk_hdr *h = hdr_at(off);
    uint8_t st = (uint8_t)(on ? h->state | PREV_FREE_LARGE : h->state & ~PREV_FREE_LARGE);
    if (st != h->state)
        META_SET(h->state, st);
}

/* Chunk bytes (header included) of small class c: 16..1024 in steps of 16,
 * then four classes per doubling up to 32 KiB. */
static inline uint64_t class_chunk(unsigned c)
{
    if (c < 64)
        return (uint64_t)(c + 1) * 16;
    unsigned k = c - 64;
    uint64_t d = (uint64_t)1024 << (k / 4);
    return d + d * (k % 4 + 1) / 4;
}

/* Smallest class whose payload holds n bytes, 1 <= n <= DHEAP_SMALL_MAX. */
static inline unsigned size_class(size_t n)
{
    if (n + HDR <= 1024)
        return (unsigned)((n + HDR + 15) / 16) - 1;
    unsigned c = 64;
    while (class_chunk(c) - HDR < n)
        c++;
    return c;
}

/* ---- carving and the large free list ---------------------------------- */

/* Carve an in-use chunk of `size` bytes at top; 0 if the range is exhausted.
 * The chunk below top is never a free large one, so no flag. */
static uint64_t carve(uint64_t size, uint8_t cls)
{
    dheap_root *r = g_root;
    uint64_t off = r->top;
    if (size > g_cap - off)
        return 0;
    set_hdr(off, size, ST_INUSE, cls, 0);
    META_SET(r->top, off + size);
    if (r->hwm && off + size > r->hwm)
        META_SET(r->hwm, off + size);
    return off;
}

static void large_push(uint64_t off)
{
    dheap_root *r = g_root;
    uint64_t head = r->large_free;
    META_SET(link_at(off)[0], head);
    META_SET(link_at(off)[1], (uint64_t)0);
    if (head)
        META_SET(link_at(head)[1], off);
    META_SET(r->large_free, off);
}

static void large_unlink(uint64_t off)
{
    uint64_t next = link_at(off)[0], prev = link_at(off)[1];
    if (prev)
        META_SET(link_at(prev)[0], next);
    else
        META_SET(g_root->large_free, next);
    if (next)
        META_SET(link_at(next)[1], prev);
}

static inline bool is_free_large(uint64_t off)
{
    chunk_hdr *h = hdr_at(off);
    return cstate(h) == ST_FREE && h->cls == CLS_LARGE;
}

/* Make [off, off + size) a free large chunk (header, footer, the flag of the
 * chunk above, which exists) and list it. flag: the header's own. */
static void make_free_large(uint64_t off, uint64_t size, uint8_t flag)
{
    set_hdr(off, size, ST_FREE, CLS_LARGE, flag);
    META_SET(*footer_of(off, size), size);
    set_prev_flag(off + size, true);
    large_push(off);
}

static uint64_t alloc_large(uint64_t need)
{
    for (uint64_t off = g_root->large_free; off; off = link_at(off)[0]) {
        chunk_hdr *h = hdr_at(off);
        if (h->magic != magic_for(off) || !is_free_large(off))
            die("malloc", g_base + off + HDR, "corrupt large free list");
        uint64_t sz = csize(h);
        uint8_t flag = prev_flag(h);
        if (sz < need)
            continue;
        large_unlink(off);
        set_hdr(off, need, ST_INUSE, CLS_LARGE, flag);
        if (sz > need) /* split: the tail stays free (a chunk follows it: a free large one is never last) */
            make_free_large(off + need, sz - need, 0);
        else
            set_prev_flag(off + sz, false);
        return off;
    }
    return carve(need, CLS_LARGE);
}

/* Return the in-use chunk at off to the heap. */
static void free_chunk(uint64_t off)
{
    dheap_root *r = g_root;
    chunk_hdr *h = hdr_at(off);
    uint64_t sz = csize(h);
    uint8_t flag = prev_flag(h);
    META_SET(r->allocated, r->allocated - sz);
    META_SET(r->inuse_chunks, r->inuse_chunks - 1);

    if (h->cls != CLS_LARGE) {
        unsigned c = h->cls;
        set_hdr(off, sz, ST_FREE, (uint8_t)c, flag);
        META_SET(link_at(off)[0], r->small_free[c]);
        META_SET(r->small_free[c], off);
        return;
    }

    uint64_t end = off + sz;
    if (end < r->top && is_free_large(end) && sz + csize(hdr_at(end)) <= MAX_CHUNK) {
        large_unlink(end);
        sz += csize(hdr_at(end));
        end = off + sz;
    }
    if (flag) {
        uint64_t prev = *(const uint64_t *)(g_base + off - 8); /* the footer below */
        uint64_t poff = off - prev;
        if (prev < PAGE || prev > off - FIRST_OFF || hdr_at(poff)->magic != magic_for(poff) ||
            !is_free_large(poff) || csize(hdr_at(poff)) != prev)
            die("free", g_base + off + HDR, "corrupt footer of the free chunk below");
        if (sz + prev <= MAX_CHUNK) {
            large_unlink(poff);
            off = poff;
            sz += prev;
            flag = prev_flag(hdr_at(poff));
        }
    }
    if (end == r->top) {
        /* Give the space back to the wilderness. (If a free large chunk was
         * left below, unmerged at MAX_CHUNK, it is last now: that breaks an
         * invariant only at 64 GiB chunks, as before.) */
        META_SET(r->top, off);
        return;
    }
    make_free_large(off, sz, flag);
}

/* Validate a user pointer; return the offset of its (in-use) chunk. If p is
 * a memalign alias, *alias gets the alias header's offset (else 0). Aborts on
 * foreign pointers, double frees and corrupt headers. */
static uint64_t resolve(const char *op, const void *p, uint64_t *alias)
{
    if (!g_root)
        die(op, p, "durable heap not attached");
    if (!dheap_contains(p))
        die(op, p, "pointer not in the durable heap");
    uint64_t u = (uint64_t)((const char *)p - g_base);
    dheap_root *r = g_root;
    if ((u & 15) || u < FIRST_OFF + HDR || u >= r->top)
        die(op, p, "invalid pointer");
    uint64_t off = u - HDR;
    chunk_hdr *h = hdr_at(off);
    if (h->magic != magic_for(off))
        die(op, p, "invalid pointer (no chunk header; double free of an aligned block?)");
    *alias = 0;
    if (cstate(h) == ST_ALIAS) {
        uint64_t dist = csize(h);
        if (dist == 0 || dist > off - FIRST_OFF)
            die(op, p, "corrupt alias header");
        *alias = off;
        off -= dist;
        h = hdr_at(off);
        if (h->magic != magic_for(off))
            die(op, p, "corrupt alias header");
    }
    if (cstate(h) == ST_FREE)
        die(op, p, "double free or use after free");
    if (cstate(h) != ST_INUSE)
        die(op, p, "invalid pointer (bad chunk state)");
    uint64_t sz = csize(h);
    if (sz < 2 * HDR || sz > r->top - off || (*alias && *alias + HDR >= off + sz))
        die(op, p, "corrupt chunk header");
    return off;
}

/* ---- public API -------------------------------------------------------- */

/* Attaching again (e.g. mango_init after mango_shutdown) replaces the previous
 * attachment; nothing is kept outside the range. */
int dheap_attach(void *base, size_t capacity, bool fresh, dheap_capture_fn capture)
{
    if (!base || ((uintptr_t)base & (PAGE - 1)) || (capacity & 15) ||
        capacity < FIRST_OFF + PAGE)
        return MANGO_EINVAL;
    dheap_root *root = (dheap_root *)base;
    if (!fresh && !dheap_extent_of_root(root, capacity))
        return MANGO_EBADPOOL;
    g_base = base;
    g_cap = capacity;
    g_capture = capture;
    g_root = root;
    if (fresh) {
        dheap_root init;
        memset(&init, 0, sizeof init);
        init.magic = DHEAP_MAGIC;
        init.version = DHEAP_VERSION;
        init.capacity = capacity;
        init.top = FIRST_OFF;
        init.hwm = FIRST_OFF;
        meta_write(root, &init, sizeof init);
    }
    return 0;
}

void dheap_set_zero_capture(dheap_zero_fn fn) { g_zero = fn; }

void dheap_detach(void)
{
    g_zero = NULL;
    g_root = NULL;
    g_base = NULL;
    g_cap = 0;
    g_capture = NULL;
}

bool dheap_contains(const void *p)
{
    return g_base && (uintptr_t)p - (uintptr_t)g_base < g_cap;
}

uint64_t dheap_extent_of_root(const dheap_root *root, uint64_t capacity)
{
    if (!root || root->magic != DHEAP_MAGIC || root->version != DHEAP_VERSION ||
        root->capacity != capacity)
        return 0;
    uint64_t top = root->top;
    if (top < FIRST_OFF || top > capacity || (top & 15) != (FIRST_OFF & 15))
        return 0;
    if (root->hwm && (root->hwm < top || root->hwm > capacity))
        return 0;
    return top;
}

void *dheap_malloc(size_t n)
{
    dheap_root *r = g_root;
    if (!r) {
        errno = ENOMEM;
        return NULL;
    }
    if (n == 0)
        n = 1;
    uint64_t off;
    if (n <= DHEAP_SMALL_MAX) {
        unsigned c = size_class(n);
        off = r->small_free[c];
        if (off) {
            chunk_hdr *h = hdr_at(off);
            if (off < FIRST_OFF || off >= r->top || h->magic != magic_for(off) ||
                cstate(h) != ST_FREE || h->cls != c)
                die("malloc", g_base + off + HDR, "corrupt small free list");
            META_SET(r->small_free[c], link_at(off)[0]);
            set_hdr(off, csize(h), ST_INUSE, (uint8_t)c, prev_flag(h));
        } else {
            off = carve(class_chunk(c), (uint8_t)c);
        }
    } else if (n > MAX_CHUNK - HDR - PAGE) {
        off = 0;
    } else {
        off = alloc_large(ROUND_UP((uint64_t)n + HDR, PAGE));
    }
    if (!off) {
        errno = ENOMEM;
        return NULL;
    }
    META_SET(r->allocated, r->allocated + csize(hdr_at(off)));
    META_SET(r->inuse_chunks, r->inuse_chunks + 1);
    return g_base + off + HDR;
}

void dheap_free(void *p)
{
    if (!p)
        return;
    uint64_t alias;
    uint64_t off = resolve("free", p, &alias);
    if (alias)
        META_SET(hdr_at(alias)->magic, (uint16_t)~magic_for(alias)); /* never valid */
    free_chunk(off);
}

size_t dheap_usable_size(const void *p)
{
    if (!p)
        return 0;
    uint64_t alias;
    uint64_t off = resolve("malloc_usable_size", p, &alias);
    return (size_t)(g_base + off + csize(hdr_at(off)) - (const char *)p);
}

void *dheap_calloc(size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    uint64_t hwm = g_root ? g_root->hwm : 0;
    char *p = dheap_malloc(total);
    /* A chunk carved from never handed-out space (at or above hwm) is zero
     * already, in memory and in the pool: nothing to write, nothing to log.
     * This keeps a big calloc (a growing dict's new table: 32 MB at 4M
     * buckets) from filling a batch with zeros. Reused memory is zeroed; a
     * large zeroing is logged as one zero range (its 32-byte aligned
     * interior) when the runtime takes it, else block by block. */
    if (!p || (hwm && (uint64_t)(p - g_base) - HDR >= hwm))
        return p;
    /* memset is interposed (libc_interpose.c) and would report every block
     * itself: zero with capture off, then report as chosen below. The
     * barriers keep the compiler, which assumes memset reads no global,
     * from dropping the flag's store as dead. */
    bool active = mango_capture_active;
    mango_capture_active = false;
    __asm__ volatile("" ::: "memory");
    memset(p, 0, total);
    __asm__ volatile("" ::: "memory");
    mango_capture_active = active;
    char *a = (char *)ROUND_UP((uintptr_t)p, 32), *b = (char *)((uintptr_t)(p + total) & ~(uintptr_t)31);
    if (g_zero && b > a && (size_t)(b - a) >= ZERO_RANGE_MIN && g_zero(a, (size_t)(b - a))) {
        capture_payload(p, (size_t)(a - p));
        capture_payload(b, (size_t)(p + total - b));
    } else {
        capture_payload(p, total);
    }
    return p;
}

void *dheap_realloc(void *p, size_t n)
{
    if (!p)
        return dheap_malloc(n);
    if (n == 0) {
        dheap_free(p);
        return NULL;
    }
    size_t usable = dheap_usable_size(p); /* validates p */
    /* Stay in place unless that would waste more than half the block. */
    if (n <= usable && n >= usable / 2)
        return p;
    void *q = dheap_malloc(n);
    if (!q)
        return NULL;
    size_t copy = n < usable ? n : usable;
    memcpy(q, p, copy);
    capture_payload(q, copy);
    dheap_free(p);
    return q;
}

void *dheap_memalign(size_t align, size_t n)
{
    if (align <= 16) /* every chunk's payload is 16-byte aligned */
        return dheap_malloc(n);
    if (align & (align - 1)) { /* like glibc: round up to a power of two */
        if (align > MAX_CHUNK / 2) {
            errno = EINVAL;
            return NULL;
        }
        size_t a = 16;
        while (a < align)
            a <<= 1;
        align = a;
    }
    if (align > MAX_CHUNK / 2 || n > MAX_CHUNK - align) {
        errno = ENOMEM;
        return NULL;
    }
    char *p = dheap_malloc(n + align);
    if (!p || ((uintptr_t)p & (align - 1)) == 0)
        return p;
    /* p is 16-aligned, so a - p <= align and a + n stays inside the block. */
    char *a = (char *)ROUND_UP((uintptr_t)p + HDR, align);
    uint64_t aoff = (uint64_t)(a - g_base) - HDR;
    uint64_t dist = aoff - ((uint64_t)(p - g_base) - HDR);
    set_hdr(aoff, dist, ST_ALIAS, CLS_ALIAS, 0);
    return a;
}

uint64_t dheap_root_payload(const dheap_root *root) { return root->allocated - root->inuse_chunks * HDR; }

void dheap_usage(uint64_t *chunks, uint64_t *payload, uint64_t *allocated)
{
    const dheap_root *r = g_root;
    if (chunks)
        *chunks = r ? r->inuse_chunks : 0;
    if (payload)
        *payload = r ? dheap_root_payload(r) : 0;
    if (allocated)
        *allocated = r ? r->allocated : 0;
}

/* ---- consistency check (tests) ----------------------------------------- */

static int check_fail(const char *why, uint64_t off)
{
    char buf[200];
    int n = snprintf(buf, sizeof buf, "dheap_check: %s (offset 0x%llx)\n", why,
                     (unsigned long long)off);
    if (n > 0)
        (void)!write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    return -1;
}

int dheap_check(void)
{
    dheap_root *r = g_root;
    if (!r)
        return check_fail("not attached", 0);
    if (dheap_extent_of_root(r, g_cap) == 0)
        return check_fail("invalid root", 0);

    uint64_t free_small[DHEAP_NCLASSES] = {0};
    uint64_t free_large = 0, inuse = 0, inuse_n = 0, last = 0;
    bool prev_free_large = false;
    uint64_t off = FIRST_OFF, top = r->top;
    while (off < top) {
        chunk_hdr *h = hdr_at(off);
        uint64_t sz = csize(h);
        unsigned st = cstate(h);
        if (h->magic != magic_for(off))
            return check_fail("bad chunk magic", off);
        if (st != ST_INUSE && st != ST_FREE)
            return check_fail("bad chunk state", off);
        if (sz < 2 * HDR || sz > top - off)
            return check_fail("bad chunk size", off);
        if ((prev_flag(h) != 0) != prev_free_large)
            return check_fail("PREV_FREE_LARGE flag does not match the chunk below", off);
        bool fl = false;
        if (h->cls < DHEAP_NCLASSES) {
            if (sz != class_chunk(h->cls))
                return check_fail("small chunk size does not match class", off);
            if (st == ST_FREE)
                free_small[h->cls]++;
        } else if (h->cls == CLS_LARGE) {
            if (sz % PAGE)
                return check_fail("large chunk not a page multiple", off);
            if (st == ST_FREE) {
                if (prev_free_large)
                    return check_fail("adjacent free large chunks", off);
                if (*footer_of(off, sz) != sz)
                    return check_fail("free large chunk's footer is not its size", off);
                free_large++;
                fl = true;
            }
        } else {
            return check_fail("bad chunk class", off);
        }
        if (st == ST_INUSE) {
            inuse += sz;
            inuse_n++;
        }
        prev_free_large = fl;
        last = off;
        off += sz;
    }
    if (off != top)
        return check_fail("chunks overrun top", off);
    if (prev_free_large)
        return check_fail("free large chunk at top", last);
    if (r->allocated != inuse)
        return check_fail("root.allocated wrong", r->allocated);
    if (r->inuse_chunks != inuse_n)
        return check_fail("root.inuse_chunks wrong", r->inuse_chunks);
    if (r->hwm && (r->hwm < r->top || r->hwm > g_cap))
        return check_fail("root.hwm below top or past the range", r->hwm);

    for (unsigned c = 0; c < DHEAP_NCLASSES; c++) {
        uint64_t n = 0;
        for (uint64_t e = r->small_free[c]; e; e = link_at(e)[0]) {
            if (++n > free_small[c])
                return check_fail("small free list longer than free chunk count (cycle?)", e);
            if (e < FIRST_OFF || e >= top || (e & 15) != (FIRST_OFF & 15))
                return check_fail("small free list entry out of range", e);
            chunk_hdr *h = hdr_at(e);
            if (h->magic != magic_for(e) || cstate(h) != ST_FREE || h->cls != c)
                return check_fail("small free list entry is not a free chunk of its class", e);
        }
        if (n != free_small[c])
            return check_fail("free small chunk missing from its list", c);
    }
    uint64_t n = 0, back = 0;
    for (uint64_t e = r->large_free; e; back = e, e = link_at(e)[0]) {
        if (++n > free_large)
            return check_fail("large free list longer than free chunk count (cycle?)", e);
        if (e < FIRST_OFF || e >= top || (e & 15) != (FIRST_OFF & 15))
            return check_fail("large free list entry out of range", e);
        chunk_hdr *h = hdr_at(e);
        if (h->magic != magic_for(e) || !is_free_large(e))
            return check_fail("large free list entry is not a free large chunk", e);
        if (link_at(e)[1] != back)
            return check_fail("large free list back link wrong", e);
    }
    if (n != free_large)
        return check_fail("free large chunk missing from the list", n);
    return 0;
}

/* ---- hooks used by split_alloc.c ------------------------------------------ */

bool dheap_attached(void) { return g_root != NULL; }

/* Report bytes written into the heap on the user's behalf (realloc copies). */
void dheap_capture(const void *addr, size_t len) { capture_payload(addr, len); }
