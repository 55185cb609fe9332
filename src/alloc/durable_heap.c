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
 * multiples of 16, so their payloads are 16-byte aligned (the base is page
 * aligned). Chunks tile [FIRST_OFF, top) exactly; each header records its own
 * size, so the heap can be walked upwards. Requests of up to 128 bytes are
 * slab objects instead (below), with no header: a 24-byte object (a Redis
 * dictEntry) takes 32 bytes, an 8-byte one 8.
 *
 * Other small requests (<= DHEAP_SMALL_MAX) are rounded up to one of DHEAP_NCLASSES
 * size classes. A freed small chunk goes, unchanged, to its class's LIFO
 * singly linked free list (link in the first payload word) and is reused
 * for the same class; it is merged only by reclaim(), and split only as a
 * small request's last resort (split_small_malloc).
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
 * realloc grows a large chunk in place when the chunk above it is a free
 * large one with room, or when it is the last chunk and top has room
 * (grow_large); otherwise it moves the block (a copy, captured).
 *
 * Slabs. A request of up to 128 bytes takes a headerless object of 8 bytes
 * (slab class 0; 8-byte aligned, as jemalloc's) or of 16, 32, ... 128 (class
 * 1..8; 16-byte aligned) from a slab: a chunk (class CLS_SLAB,
 * released only by reclaim()) of exactly 16 KiB whose payload starts on a 16 KiB boundary
 * of the range, so it fills one 16 KiB region but for its last 8 bytes,
 * where the next chunk's header goes. The slab map, a byte per region of the
 * range in a large chunk of its own made with the first slab, names each
 * slab region's class (value class + 1; 0: not a slab); free() and
 * usable_size() look a pointer's region up there before reading a header,
 * and no chunk's payload starts in a slab region. A class hands out freed
 * objects first (a LIFO list linked through their first word), then the
 * never-used objects of its newest slab in order (slab_next), then a new
 * slab. Carving a slab at top first skips to the next boundary; the
 * skipped bytes become the hole, a free chunk (CLS_HOLE) that small chunk
 * requests carve from before they carve at top. Only one hole exists; the
 * smaller of an old hole and a new gap is cut into free small chunks.
 * When top has no room, a slab is made inside a free large chunk (its
 * 16 KiB boundary found there), and a small chunk request makes a free
 * large chunk the hole. A slab class falls back to an ordinary small chunk
 * when no slab can be made (a heap too small or full). Slab objects count in inuse_chunks and
 * allocated (by their size) like chunks; slab and map chunks do not. With
 * no header, free() catches a slab object's double free only when it is the
 * class's last freed object (dheap_check finds the others); it catches
 * foreign, interior and never-handed-out pointers as for chunks.
 *
 * memalign over-allocates by `align` bytes and places an 8-byte ALIAS header
 * right before the aligned pointer; it records the distance back to the real
 * chunk. Freeing through an alias inverts the alias's magic, so a second free
 * of the same aligned pointer is detected.
 *
 * Reclaiming. Freed small chunks and slab objects serve only their own
 * size, so a heap emptied of small objects could refuse a large request.
 * A request that finds no room therefore reclaims first (reclaim(), below):
 * slabs with no object in use leave the map, and runs of adjacent free
 * chunks become a free large chunk (or go back to top), then it is tried
 * again; a small request that still finds none splits a larger free small
 * chunk.
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
#include <sys/mman.h>
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
#define CLS_SLAB 0xFDu /* an in-use chunk holding a slab */
#define CLS_HOLE 0xFCu /* the free chunk left below a slab when aligning it */
#define SLAB_SHIFT 14
#define SLAB ((uint64_t)1 << SLAB_SHIFT)
_Static_assert(SLAB == DHEAP_SLAB_BYTES, "slab size is part of the format");
_Static_assert(DHEAP_SLAB_MAX == (DHEAP_NSLABS - 1) * 16, "slab classes: 8, then 16 to 128 by 16");
/* size16 is 32 bits: chunks stay below 64 GiB. */
#define MAX_CHUNK ((((uint64_t)UINT32_MAX) << 4) & ~((uint64_t)PAGE - 1))

typedef struct chunk_hdr {
    uint32_t size16; /* chunk size / 16, header included; ALIAS: distance back to the real chunk / 16 */
    uint16_t magic;  /* HDR_MAGIC ^ (offset / 16): a header copied elsewhere does not validate */
    uint8_t cls;     /* small class index, CLS_LARGE, CLS_ALIAS, CLS_SLAB or CLS_HOLE */
    uint8_t state;   /* ST_INUSE, ST_FREE or ST_ALIAS, | PREV_FREE_LARGE */
} chunk_hdr;
_Static_assert(sizeof(chunk_hdr) == HDR, "chunk header must be 8 bytes");
_Static_assert(DHEAP_NCLASSES < CLS_HOLE, "class indexes fit the header");

static char *g_base;
static uint64_t g_cap;
static dheap_root *g_root;
static dheap_capture_fn g_capture;
static dheap_zero_fn g_zero;
static dheap_free_hook_fn g_free_hook;
/* Frees since the last reclaim() (transient): a reclaim with none between
 * would find nothing new. */
static uint64_t g_frees_since_reclaim;
static uint64_t g_reclaims; /* reclaims that changed the heap, since attach */
static uint64_t g_epoch;    /* attaches and detaches so far (dheap_epoch) */
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

static inline bool is_free_large(uint64_t off)
{
    chunk_hdr *h = hdr_at(off);
    return cstate(h) == ST_FREE && h->cls == CLS_LARGE;
}

/* Is off a place a chunk header can be: from the first chunk to below top,
 * at 8 modulo 16? */
static inline bool chunk_off_below(uint64_t off, uint64_t top)
{
    return off >= FIRST_OFF && off < top && (off & 15) == (FIRST_OFF & 15);
}

static inline bool chunk_off_ok(uint64_t off) { return chunk_off_below(off, g_root->top); }

/* Die unless off, reached through the large free list or as a free large
 * neighbour, is a free large chunk whose size keeps it below top. The root
 * check of every open covers the list's head only; a damaged link behind it
 * (a damaged pool, found by fuzzing pool files) was followed outside the
 * range (SIGSEGV), and a damaged size or neighbour link made the allocator
 * write outside the chunk. dheap_check walks the whole list. */
static void listed_large(const char *op, uint64_t off)
{
    if (!chunk_off_ok(off) || hdr_at(off)->magic != magic_for(off) || !is_free_large(off) ||
        csize(hdr_at(off)) < PAGE || csize(hdr_at(off)) > g_root->top - off)
        die(op, g_base + off + HDR, "corrupt large free list");
    /* A size that ends below top but not at the chunk's end: its footer
     * and the boundary tag of the chunk it reaches (a free large chunk is
     * last only when left unmerged at MAX_CHUNK, see free_chunk) say so;
     * unchecked, the chunk above was handed out again. */
    uint64_t sz = csize(hdr_at(off)), end = off + sz;
    if (*footer_of(off, sz) != sz ||
        (end < g_root->top && (hdr_at(end)->magic != magic_for(end) || !prev_flag(hdr_at(end)))))
        die(op, g_base + off + HDR, "corrupt large free list (size)");
}

/* The large free list's element after off (off 0: its head), checked by
 * listed_large; *steps counts them, so that a cycle dies instead of
 * looping (each element has a page at least). */
static uint64_t large_next(const char *op, uint64_t off, uint64_t *steps)
{
    uint64_t e = off ? link_at(off)[0] : g_root->large_free;
    if (!e)
        return 0;
    if (++*steps > g_root->top / PAGE)
        die(op, g_base + e + HDR, "corrupt large free list (a cycle)");
    listed_large(op, e);
    return e;
}

/* Is off a free small chunk of class c (a link of small_free[c])? */
static bool small_free_ok(uint64_t off, unsigned c)
{
    if (!chunk_off_ok(off))
        return false;
    const chunk_hdr *h = hdr_at(off);
    return h->magic == magic_for(off) && cstate(h) == ST_FREE && h->cls == c;
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

static void large_unlink(const char *op, uint64_t off)
{
    uint64_t next = link_at(off)[0], prev = link_at(off)[1];
    /* It and its neighbours must be listed, and they must link back to it:
     * with a damaged size or link, the callers' stores went into another
     * chunk or dropped part of the list (as glibc checks its own bins). */
    listed_large(op, off);
    if (next)
        listed_large(op, next);
    if (prev)
        listed_large(op, prev);
    if ((prev ? link_at(prev)[0] : g_root->large_free) != off || (next && link_at(next)[1] != off))
        die(op, g_base + off + HDR, "corrupt large free list (links)");
    if (prev)
        META_SET(link_at(prev)[0], next);
    else
        META_SET(g_root->large_free, next);
    if (next)
        META_SET(link_at(next)[1], prev);
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

/* Make the first `need` bytes of the free large chunk at off an in-use
 * large chunk; the rest stays free. */
static void take_large(uint64_t off, uint64_t need)
{
    chunk_hdr *h = hdr_at(off);
    uint64_t sz = csize(h);
    uint8_t flag = prev_flag(h);
    large_unlink("malloc", off);
    set_hdr(off, need, ST_INUSE, CLS_LARGE, flag);
    if (sz > need) /* split: the tail stays free (a chunk follows it: a free large one is never last) */
        make_free_large(off + need, sz - need, 0);
    else
        set_prev_flag(off + sz, false);
}

static uint64_t alloc_large(uint64_t need)
{
    uint64_t steps = 0;
    for (uint64_t off = large_next("malloc", 0, &steps); off; off = large_next("malloc", off, &steps)) {
        if (csize(hdr_at(off)) < need)
            continue;
        take_large(off, need);
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
    g_frees_since_reclaim++;
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
        large_unlink("free", end);
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
            large_unlink("free", poff);
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

/* ---- the hole and slabs -------------------------------------------------- */

/* Make [off, off + size) free small chunks of up to 1024 bytes, listed by
 * class. flag: the first chunk's PREV_FREE_LARGE flag. */
static void release_as_small(uint64_t off, uint64_t size, uint8_t flag)
{
    dheap_root *r = g_root;
    while (size) {
        uint64_t piece = size > 1024 ? 1024 : size;
        unsigned c = (unsigned)(piece / 16) - 1; /* class_chunk(c) == piece */
        set_hdr(off, piece, ST_FREE, (uint8_t)c, flag);
        META_SET(link_at(off)[0], r->small_free[c]);
        META_SET(r->small_free[c], off);
        flag = 0;
        off += piece;
        size -= piece;
    }
}

/* Die unless the hole h (nonzero) is one: its header, and a size that
 * ends at top or at a chunk's header. (The root check put h below top; a
 * size past top made the carves walk out of the heap, one ending inside
 * the chunk above made them hand out its bytes, and keep_gap cut them.) */
static void hole_ok(uint64_t h)
{
    dheap_root *r = g_root;
    chunk_hdr *hh = hdr_at(h);
    uint64_t sz = csize(hh);
    if (hh->magic != magic_for(h) || hh->cls != CLS_HOLE || cstate(hh) != ST_FREE || sz < 2 * HDR ||
        sz > r->top - h || (sz < r->top - h && hdr_at(h + sz)->magic != magic_for(h + sz)))
        die("malloc", g_base + h + HDR, "corrupt hole");
}

/* Carve an in-use small chunk of `size` bytes from the hole; 0 if it has
 * no room. */
static uint64_t hole_carve(uint64_t size, uint8_t cls)
{
    dheap_root *r = g_root;
    uint64_t h = r->hole;
    if (!h)
        return 0;
    chunk_hdr *hh = hdr_at(h);
    uint64_t sz = csize(hh);
    hole_ok(h);
    if (size > sz)
        return 0;
    uint8_t flag = prev_flag(hh);
    if (sz > size) {
        set_hdr(h + size, sz - size, ST_FREE, CLS_HOLE, 0);
        META_SET(r->hole, h + size);
    } else {
        META_SET(r->hole, (uint64_t)0);
    }
    set_hdr(h, size, ST_INUSE, cls, flag);
    return h;
}

/* Object bytes of slab class s: 8, then 16, 32, ... 128. */
static inline uint64_t slab_obj(unsigned s) { return s ? (uint64_t)s * 16 : 8; }
/* The slab class of a request of n bytes, 1 <= n <= DHEAP_SLAB_MAX. */
static inline unsigned slab_class(size_t n) { return n <= 8 ? 0 : (unsigned)((n + 15) / 16); }
/* Objects in one slab: its 16 KiB but the last 8 bytes. */
static inline uint64_t slab_count(unsigned s) { return (SLAB - HDR) / slab_obj(s); }
static inline uint64_t map_len(void) { return (g_cap + SLAB - 1) >> SLAB_SHIFT; }

/* The slab class of the region holding offset u (< top), or -1. */
static inline int slab_class_at(uint64_t u)
{
    uint64_t m = g_root->slab_map;
    if (!m)
        return -1;
    return (int)((const uint8_t *)g_base)[m + (u >> SLAB_SHIFT)] - 1;
}

/* Is u the place of an object of slab class s (its region is a slab of s
 * and it is on one of the slab's object boundaries)? */
static bool slab_obj_at(uint64_t u, unsigned s)
{
    if (u < FIRST_OFF + HDR || u >= g_root->top || slab_class_at(u) != (int)s)
        return false;
    uint64_t in = u & (SLAB - 1);
    return in % slab_obj(s) == 0 && in / slab_obj(s) < slab_count(s);
}

/* Is u an object of the slab class s that has been handed out at least once
 * (an object's place, and not past the newest slab's next never-used
 * object)? */
static bool slab_obj_valid(uint64_t u, unsigned s)
{
    dheap_root *r = g_root;
    if (!slab_obj_at(u, s))
        return false;
    uint64_t next = r->slab_next[s];
    return !(next && (next & ~(SLAB - 1)) == (u & ~(SLAB - 1)) && u >= next);
}

static void zero_payload(char *p, size_t total);

/* The slab map: a large chunk of map_len() zero bytes. */
static bool map_create(void)
{
    dheap_root *r = g_root;
    uint64_t hwm = r->hwm;
    uint64_t off = alloc_large(ROUND_UP(map_len() + HDR, PAGE));
    if (!off)
        return false;
    if (!hwm || off < hwm) /* reused space; else zero already (see calloc) */
        zero_payload(g_base + off + HDR, (size_t)map_len());
    META_SET(r->slab_map, off + HDR);
    return true;
}

/* The bytes [at, at + gap) skipped to align a slab: keep the bigger of the
 * old hole and them as the hole, cut the other into free small chunks.
 * flag: the gap's first chunk's PREV_FREE_LARGE flag. */
static void keep_gap(uint64_t at, uint64_t gap, uint8_t flag)
{
    dheap_root *r = g_root;
    uint64_t h = r->hole;
    if (h)
        hole_ok(h);
    if (h && csize(hdr_at(h)) >= gap) {
        release_as_small(at, gap, flag);
    } else {
        if (h) {
            META_SET(r->hole, (uint64_t)0);
            release_as_small(h, csize(hdr_at(h)), prev_flag(hdr_at(h)));
        }
        set_hdr(at, gap, ST_FREE, CLS_HOLE, flag);
        META_SET(r->hole, at);
    }
    g_frees_since_reclaim++; /* a reclaim could merge the pieces again */
}

/* Make the 16 KiB region whose payload starts at obj a slab of class s. */
static void slab_named(uint64_t obj, unsigned s)
{
    META_SET(((uint8_t *)g_base)[g_root->slab_map + (obj >> SLAB_SHIFT)], (uint8_t)(s + 1));
    META_SET(g_root->slab_next[s], obj);
}

/* A new slab of class s inside a free large chunk (first fit), for when top
 * has no room: the bytes before its 16 KiB boundary are kept as a gap (see
 * keep_gap), those after it become free small chunks of up to 1024 bytes
 * and a free large chunk of the whole pages that are left. */
static bool slab_in_large(unsigned s)
{
    uint64_t steps = 0;
    for (uint64_t off = large_next("malloc", 0, &steps); off; off = large_next("malloc", off, &steps)) {
        uint64_t sz = csize(hdr_at(off)), obj = ROUND_UP(off + HDR, SLAB), at = obj - HDR;
        if (at + SLAB > off + sz)
            continue;
        uint64_t end = at + SLAB, tail = off + sz - end, rest = tail & (PAGE - 1);
        uint8_t flag = prev_flag(hdr_at(off));
        large_unlink("malloc", off);
        if (rest)
            release_as_small(end, rest, 0);
        if (tail > rest)
            make_free_large(end + rest, tail - rest, 0); /* the chunk above keeps its flag */
        else
            set_prev_flag(off + sz, false);
        set_hdr(at, SLAB, ST_INUSE, CLS_SLAB, at > off ? 0 : flag);
        if (at > off)
            keep_gap(off, at - off, flag);
        slab_named(obj, s);
        return true;
    }
    return false;
}

/* A new slab of class s at top (after the hole its alignment leaves), or
 * in a free large chunk when top has no room; false if neither has. */
static bool slab_new(unsigned s)
{
    dheap_root *r = g_root;
    if (!r->slab_map) {
        /* Room for the map, a gap and the slab after it, or no map: a heap
         * too small or too full for slabs keeps its space for chunks. */
        uint64_t need = ROUND_UP(map_len() + HDR, PAGE) + 2 * SLAB;
        if (need > g_cap - r->top || !map_create())
            return false;
    }
    uint64_t top = r->top;
    uint64_t obj = ROUND_UP(top + HDR, SLAB); /* the slab's payload */
    uint64_t off = obj - HDR;
    if (obj > g_cap || SLAB - HDR > g_cap - obj)
        return slab_in_large(s);
    if (off > top) /* the chunk below top is never a free large one: no flag */
        keep_gap(top, off - top, 0);
    set_hdr(off, SLAB, ST_INUSE, CLS_SLAB, 0);
    META_SET(r->top, off + SLAB);
    if (r->hwm && off + SLAB > r->hwm)
        META_SET(r->hwm, off + SLAB);
    slab_named(obj, s);
    return true;
}

/* An object of slab class s (its offset), counted; 0 if no slab can be made. */
static uint64_t slab_alloc(unsigned s)
{
    dheap_root *r = g_root;
    uint64_t u = r->slab_free[s];
    if (u) {
        if (!slab_obj_valid(u, s))
            die("malloc", g_base + u, "corrupt slab free list");
        META_SET(r->slab_free[s], *(uint64_t *)(g_base + u));
    } else {
        u = r->slab_next[s];
        if (!u) {
            if (!slab_new(s))
                return 0;
            u = r->slab_next[s];
        }
        if (!slab_obj_at(u, s))
            die("malloc", g_base + u, "corrupt slab_next");
        uint64_t next = u + slab_obj(s);
        if ((next & (SLAB - 1)) / slab_obj(s) >= slab_count(s) || !(next & (SLAB - 1)))
            next = 0; /* the slab is used up */
        META_SET(r->slab_next[s], next);
    }
    META_SET(r->allocated, r->allocated + slab_obj(s));
    META_SET(r->inuse_chunks, r->inuse_chunks + 1);
    META_SET(r->slab_objects, r->slab_objects + 1);
    return u;
}

/* If p is in a slab region, validate it as an object of that slab and return
 * its class; else -1 (p is checked as a chunk's payload then). */
static int slab_resolve(const char *op, const void *p)
{
    if (!g_root)
        die(op, p, "durable heap not attached");
    if (!dheap_contains(p))
        die(op, p, "pointer not in the durable heap");
    uint64_t u = (uint64_t)((const char *)p - g_base);
    if (u >= g_root->top)
        return -1; /* resolve() refuses it */
    int s = slab_class_at(u);
    if (s < 0)
        return -1;
    if (s >= DHEAP_NSLABS || !slab_obj_valid(u, (unsigned)s))
        die(op, p, "invalid pointer (not an object of its slab)");
    return s;
}

static void slab_free(uint64_t u, unsigned s)
{
    dheap_root *r = g_root;
    if (u == r->slab_free[s])
        die("free", g_base + u, "double free");
    g_frees_since_reclaim++;
    META_SET(*(uint64_t *)(g_base + u), r->slab_free[s]);
    META_SET(r->slab_free[s], u);
    META_SET(r->allocated, r->allocated - slab_obj(s));
    META_SET(r->inuse_chunks, r->inuse_chunks - 1);
    META_SET(r->slab_objects, r->slab_objects - 1);
}

/* ---- reclaiming stranded space -------------------------------------------- */

/* Free space the allocator cannot hand out for every request: small chunks
 * serve only their own class, slabs only theirs, the hole only small chunks,
 * and free large chunks below top only large requests. When a request finds
 * no room, reclaim() turns what it can into general space and the request is
 * tried again:
 *
 *  - a slab all of whose objects are free (counted by walking the class's
 *    free list and its never-used tail) is dropped from the map and from its
 *    class's list;
 *  - every run of adjacent free chunks (small, large, the hole, emptied
 *    slabs) that is not already as merged as it can be becomes one free large
 *    chunk of the run's whole pages, followed by small chunks of up to 1024
 *    bytes for the rest; a run that ends at top lowers top instead.
 *
 * Its stores go through META_SET like any other, so the batch that reclaims
 * is logged and recovered as a whole. Its cost is a walk of the chunks and of
 * the free lists, paid only when the heap has no room and something was
 * freed since the last reclaim. Transient bookkeeping (a count per slab
 * region, a bit per 16 bytes below top) lives in an anonymous mapping.
 * Returns whether anything changed. */

typedef struct reclaim_state {
    uint16_t *free_objs; /* per 16 KiB region: free objects of its slab */
    uint8_t *consumed;   /* per 16 bytes below top: a chunk header in a run being merged */
    size_t free_len, consumed_len;
} reclaim_state;

static bool slab_empty(const reclaim_state *st, uint64_t obj_off)
{
    int c = slab_class_at(obj_off);
    return c >= 0 && st->free_objs[obj_off >> SLAB_SHIFT] == slab_count((unsigned)c);
}

/* Can the chunk at off join a merged run? */
static bool run_member(const reclaim_state *st, uint64_t off)
{
    const chunk_hdr *h = hdr_at(off);
    /* (off < top.) A size the walk cannot step by (0: it stepped by nothing,
     * forever) or reaching past top is corrupt, as dheap_check says. */
    if (h->magic != magic_for(off) || csize(h) < 2 * HDR || csize(h) > g_root->top - off)
        die("malloc", g_base + off + HDR, "corrupt chunk header (reclaiming)");
    if (cstate(h) == ST_FREE)
        return h->cls < DHEAP_NCLASSES || h->cls == CLS_LARGE || h->cls == CLS_HOLE;
    return h->cls == CLS_SLAB && cstate(h) == ST_INUSE && slab_empty(st, off + HDR);
}

/* The run of members from off: its end; *merge: whether rewriting it gains
 * anything (an emptied slab in it, it ends at top, or it has more chunks than
 * its merged form would). */
static uint64_t run_end(const reclaim_state *st, uint64_t off, bool *merge)
{
    uint64_t end = off, members = 0;
    bool slab = false;
    while (end < g_root->top && run_member(st, end)) {
        uint64_t sz = csize(hdr_at(end));
        /* A run is cut at MAX_CHUNK: as in free_chunk, free large chunks
         * may then end up adjacent (only with chunks of 64 GiB). */
        if (members && end + sz - off > MAX_CHUNK)
            break;
        slab |= hdr_at(end)->cls == CLS_SLAB;
        members++;
        end += sz;
    }
    uint64_t len = end - off, pages = len & ~((uint64_t)PAGE - 1), rest = len - pages;
    uint64_t merged = (pages ? 1 : 0) + (rest + 1023) / 1024;
    *merge = members && (slab || end == g_root->top || members > merged);
    return end;
}

/* Drop from the list whose head is *head (links in each element's word at
 * element + link_at_off) the elements gone(). Stores only changed links. */
static void list_filter(uint64_t *head, uint64_t link_off, const reclaim_state *st,
                        bool (*gone)(const reclaim_state *, uint64_t))
{
    uint64_t *link = head;
    for (uint64_t e = *head; e;) {
        uint64_t next = *(const uint64_t *)(g_base + e + link_off);
        if (!gone(st, e)) {
            if (*link != e)
                META_SET(*link, e);
            link = (uint64_t *)(g_base + e + link_off);
        }
        e = next;
    }
    if (*link)
        META_SET(*link, (uint64_t)0);
}

static bool obj_in_empty_slab(const reclaim_state *st, uint64_t u) { return slab_empty(st, u); }
static bool chunk_consumed(const reclaim_state *st, uint64_t off)
{
    return (st->consumed[off >> 7] >> ((off >> 4) & 7)) & 1;
}

/* The small free lists' links, before list_filter follows them (a link
 * outside the range was read there: SIGSEGV). A list longer than its
 * class could hold is a cycle. */
static void check_small_lists(void)
{
    dheap_root *r = g_root;
    for (unsigned c = 0; c < DHEAP_NCLASSES; c++) {
        uint64_t n = 0, bound = r->top / class_chunk(c);
        for (uint64_t e = r->small_free[c]; e; e = link_at(e)[0])
            if (!small_free_ok(e, c) || ++n > bound)
                die("malloc", g_base + e + HDR, "corrupt small free list (reclaiming)");
    }
}

/* Count each slab's free objects (listed or never used). A list longer
 * than its class could hold (a cycle) is corruption. */
static void count_free_objects(reclaim_state *st)
{
    dheap_root *r = g_root;
    for (unsigned c = 0; c < DHEAP_NSLABS; c++) {
        uint64_t n = 0, bound = r->top / slab_obj(c);
        for (uint64_t e = r->slab_free[c]; e; e = *(const uint64_t *)(g_base + e)) {
            if (!slab_obj_valid(e, c) || ++n > bound)
                die("malloc", g_base + e, "corrupt slab free list (reclaiming)");
            st->free_objs[e >> SLAB_SHIFT]++;
        }
        uint64_t next = r->slab_next[c];
        if (next)
            st->free_objs[next >> SLAB_SHIFT] +=
                (uint16_t)(slab_count(c) - (next & (SLAB - 1)) / slab_obj(c));
    }
}

/* Rewrite the run [off, end): unlink its free large chunks, unmap its slabs,
 * forget the hole if it is in it; then give it back (at top) or make it a
 * free large chunk of its whole pages plus small chunks for the rest. */
static void merge_run(uint64_t off, uint64_t end)
{
    dheap_root *r = g_root;
    for (uint64_t m = off; m < end; m += csize(hdr_at(m))) {
        chunk_hdr *h = hdr_at(m);
        if (h->cls == CLS_LARGE)
            large_unlink("malloc", m);
        else if (h->cls == CLS_SLAB)
            META_SET(((uint8_t *)g_base)[r->slab_map + ((m + HDR) >> SLAB_SHIFT)], (uint8_t)0);
        else if (h->cls == CLS_HOLE)
            META_SET(r->hole, (uint64_t)0);
    }
    if (end == r->top) {
        META_SET(r->top, off); /* the chunk below is not free: no flag to fix */
        return;
    }
    uint64_t len = end - off, pages = len & ~((uint64_t)PAGE - 1), rest = len - pages;
    if (rest) {
        release_as_small(off + pages, rest, pages ? PREV_FREE_LARGE : 0);
        set_prev_flag(end, false);
    }
    if (pages)
        make_free_large(off, pages, 0); /* the chunk below the run is in use */
}

/* Walk the runs from the first chunk to top. Each one that merging gains
 * from is marked (its chunks' bits in st->consumed) or, if rewrite,
 * rewritten. Returns how many there were. */
static uint64_t merge_runs(reclaim_state *st, bool rewrite)
{
    uint64_t runs = 0;
    for (uint64_t off = FIRST_OFF; off < g_root->top;) {
        bool merge;
        uint64_t end = run_end(st, off, &merge);
        if (end == off) {
            off += csize(hdr_at(off));
            continue;
        }
        if (merge && rewrite) {
            merge_run(off, end);
        } else if (merge) {
            for (uint64_t m = off; m < end; m += csize(hdr_at(m)))
                st->consumed[m >> 7] |= (uint8_t)(1u << ((m >> 4) & 7));
        }
        runs += merge;
        off = end;
    }
    return runs;
}

static bool reclaim(void)
{
    dheap_root *r = g_root;
    if (!g_frees_since_reclaim)
        return false;
    reclaim_state st = {0};
    st.free_len = (size_t)map_len() * sizeof(uint16_t);
    st.consumed_len = (size_t)(r->top >> 7) + 1;
    st.free_objs = mmap(NULL, st.free_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    st.consumed = mmap(NULL, st.consumed_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bool changed = false;
    if (st.free_objs == MAP_FAILED || st.consumed == MAP_FAILED)
        goto out; /* no room to look: the request fails as before (and the
                   * next one tries again) */
    if (r->slab_map)
        count_free_objects(&st);
    check_small_lists();

    /* Mark the small chunks that merged runs will consume. */
    if (!merge_runs(&st, false)) {
        g_frees_since_reclaim = 0;
        goto out;
    }
    changed = true;
    g_reclaims++;
    for (unsigned c = 0; c < DHEAP_NSLABS; c++) {
        list_filter(&r->slab_free[c], 0, &st, obj_in_empty_slab);
        if (r->slab_next[c] && slab_empty(&st, r->slab_next[c]))
            META_SET(r->slab_next[c], (uint64_t)0);
    }
    for (unsigned c = 0; c < DHEAP_NCLASSES; c++)
        list_filter(&r->small_free[c], HDR, &st, chunk_consumed);
    /* The same runs again: a run's headers, its slabs' map bytes and top
     * are unchanged until it is rewritten itself. */
    merge_runs(&st, true);
    g_frees_since_reclaim = 0; /* everything mergeable is merged */
out:
    if (st.free_objs != MAP_FAILED && st.free_objs)
        munmap(st.free_objs, st.free_len);
    if (st.consumed != MAP_FAILED && st.consumed)
        munmap(st.consumed, st.consumed_len);
    return changed;
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
    if (off + HDR == r->slab_map)
        die(op, p, "invalid pointer (the allocator's slab map)");
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
    __atomic_add_fetch(&g_epoch, 1, __ATOMIC_RELEASE);
    g_frees_since_reclaim = 1; /* a recovered heap may hold stranded space */
    g_reclaims = 0;
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
void dheap_set_free_hook(dheap_free_hook_fn fn) { g_free_hook = fn; }

void dheap_detach(void)
{
    g_zero = NULL;
    g_free_hook = NULL;
    g_root = NULL;
    g_base = NULL;
    g_cap = 0;
    g_capture = NULL;
    __atomic_add_fetch(&g_epoch, 1, __ATOMIC_RELEASE);
}

uint64_t dheap_epoch(void) { return __atomic_load_n(&g_epoch, __ATOMIC_ACQUIRE); }

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
    uint64_t map = root->slab_map, nmap = (capacity + SLAB - 1) >> SLAB_SHIFT;
    if (map && (map < FIRST_OFF + HDR || map > top || nmap > top - map || (map & 15)))
        return 0;
    if (root->hole && !chunk_off_below(root->hole, top))
        return 0;
    for (unsigned s = 0; s < DHEAP_NSLABS; s++)
        for (int which = 0; which < 2; which++) {
            uint64_t u = which ? root->slab_free[s] : root->slab_next[s];
            if (u && (!map || u < FIRST_OFF + HDR || u >= top || (u & 7)))
                return 0;
        }
    if (root->slab_objects > root->inuse_chunks)
        return 0;
    /* The free lists' heads are chunk headers below top (a damaged head was
     * followed at the first allocation of its class: SIGSEGV, found by
     * fuzzing pool files; the links behind the heads are dheap_check's). */
    for (unsigned c = 0; c <= DHEAP_NCLASSES; c++) {
        uint64_t u = c < DHEAP_NCLASSES ? root->small_free[c] : root->large_free;
        if (u && !chunk_off_below(u, top))
            return 0;
    }
    return top;
}

/* Make a free large chunk of at least `size` bytes the hole, for small
 * chunk requests once top has no room (the old hole, too small for this
 * request, is cut into small chunks); false if the large free list has no
 * fit. */
static bool hole_from_large(uint64_t size)
{
    dheap_root *r = g_root;
    uint64_t want = ROUND_UP(size, PAGE), off = 0, best = 0;
    /* Best fit: the smallest piece that will do, so the large ones stay
     * whole for large requests. */
    uint64_t steps = 0;
    for (uint64_t e = large_next("malloc", 0, &steps); e; e = large_next("malloc", e, &steps)) {
        uint64_t sz = csize(hdr_at(e));
        if (sz >= want && (!off || sz < best))
            off = e, best = sz;
    }
    if (!off)
        return false;
    take_large(off, want);
    g_frees_since_reclaim++; /* a reclaim could make it general space again */
    uint64_t old = r->hole;
    if (old) {
        META_SET(r->hole, (uint64_t)0);
        release_as_small(old, csize(hdr_at(old)), prev_flag(hdr_at(old)));
    }
    set_hdr(off, want, ST_FREE, CLS_HOLE, prev_flag(hdr_at(off)));
    META_SET(r->hole, off);
    return true;
}

/* Make [off, off + size) free small chunks of the largest classes that fit
 * (class sizes are multiples of 16 from 16 up, so they tile it exactly). */
static void release_as_classes(uint64_t off, uint64_t size)
{
    dheap_root *r = g_root;
    while (size) {
        unsigned k = DHEAP_NCLASSES - 1;
        while (class_chunk(k) > size)
            k--;
        uint64_t piece = class_chunk(k);
        set_hdr(off, piece, ST_FREE, (uint8_t)k, 0);
        META_SET(link_at(off)[0], r->small_free[k]);
        META_SET(r->small_free[k], off);
        off += piece;
        size -= piece;
    }
}

/* Count the chunk at off (just taken) as in use; its payload. */
static void *chunk_taken(uint64_t off)
{
    dheap_root *r = g_root;
    META_SET(r->allocated, r->allocated + csize(hdr_at(off)));
    META_SET(r->inuse_chunks, r->inuse_chunks + 1);
    return g_base + off + HDR;
}

/* The last resort of a small chunk request (n <= DHEAP_SMALL_MAX), once
 * top, the hole, the large free list and a reclaim had no room: cut the
 * smallest free small chunk of a larger class, keep its first bytes for the
 * request and make the rest free small chunks (release_as_classes); NULL if
 * there is none. A free small chunk alone between live objects is a run
 * reclaim() does not rewrite (its merged form has as many chunks), so it
 * served its own class only: a heap 96.7 % free, in 6 KiB chunks between
 * 200-byte objects, refused every 3000-byte request (found by a review).
 * Splitting serves any smaller class from it exactly; giving up its whole
 * pages as a free large chunk instead (also tried) leaves 4 KiB of it to
 * large requests, which need more than 32 KiB, and to small ones through
 * the hole: one 3000-byte request per 6 KiB chunk where the split serves
 * two, and none of 5000 bytes. The pieces are not counted as frees for the
 * next reclaim (g_frees_since_reclaim): they are what is left of a run it
 * had no use for, and counting them made every request of a full heap walk
 * it. */
static void *split_small_malloc(size_t n)
{
    dheap_root *r = g_root;
    unsigned c = size_class(n);
    for (unsigned d = c + 1; d < DHEAP_NCLASSES; d++) {
        uint64_t off = r->small_free[d];
        if (!off)
            continue;
        chunk_hdr *h = hdr_at(off);
        if (!small_free_ok(off, d))
            die("malloc", g_base + off + HDR, "corrupt small free list");
        META_SET(r->small_free[d], link_at(off)[0]);
        uint64_t want = class_chunk(c);
        set_hdr(off, want, ST_INUSE, (uint8_t)c, prev_flag(h)); /* (the chunk above keeps its flag: 0) */
        release_as_classes(off + want, class_chunk(d) - want);
        return chunk_taken(off);
    }
    return NULL;
}

/* malloc from chunks only (memalign's aliases need a header); 0 if there is
 * no room without reclaiming. */
static void *chunk_malloc_once(size_t n)
{
    dheap_root *r = g_root;
    uint64_t off;
    if (n <= DHEAP_SMALL_MAX) {
        unsigned c = size_class(n);
        off = r->small_free[c];
        if (off) {
            chunk_hdr *h = hdr_at(off);
            if (!small_free_ok(off, c))
                die("malloc", g_base + off + HDR, "corrupt small free list");
            META_SET(r->small_free[c], link_at(off)[0]);
            set_hdr(off, csize(h), ST_INUSE, (uint8_t)c, prev_flag(h));
        } else {
            off = hole_carve(class_chunk(c), (uint8_t)c);
            if (!off)
                off = carve(class_chunk(c), (uint8_t)c);
            if (!off && hole_from_large(class_chunk(c)))
                off = hole_carve(class_chunk(c), (uint8_t)c);
        }
    } else if (n > MAX_CHUNK - HDR - PAGE) {
        off = 0;
    } else {
        off = alloc_large(ROUND_UP((uint64_t)n + HDR, PAGE));
    }
    if (!off)
        return NULL;
    return chunk_taken(off);
}

static void *malloc_once(size_t n)
{
    if (n <= DHEAP_SLAB_MAX) {
        uint64_t u = slab_alloc(slab_class(n));
        if (u)
            return g_base + u;
    }
    return chunk_malloc_once(n);
}

/* Try; when there is no room, reclaim stranded space and try once more;
 * last, for a small chunk, split a larger free small one. (n: the chunk
 * request; a slab object's falls back to a chunk of its size.) */
static void *alloc_retry(void *(*once)(size_t), size_t n)
{
    void *p = once(n);
    if (!p && reclaim())
        p = once(n);
    if (!p && n <= DHEAP_SMALL_MAX)
        p = split_small_malloc(n);
    if (!p)
        errno = ENOMEM;
    return p;
}

void *dheap_malloc(size_t n)
{
    if (!g_root) {
        errno = ENOMEM;
        return NULL;
    }
    return alloc_retry(malloc_once, n ? n : 1);
}

void dheap_free(void *p)
{
    if (!p)
        return;
    int s = slab_resolve("free", p);
    if (s >= 0) {
        if (g_free_hook)
            g_free_hook(p, (size_t)slab_obj((unsigned)s));
        slab_free((uint64_t)((char *)p - g_base), (unsigned)s);
        return;
    }
    uint64_t alias;
    uint64_t off = resolve("free", p, &alias);
    if (g_free_hook)
        g_free_hook(p, (size_t)(g_base + off + csize(hdr_at(off)) - (char *)p));
    if (alias)
        META_SET(hdr_at(alias)->magic, (uint16_t)~magic_for(alias)); /* never valid */
    free_chunk(off);
}

size_t dheap_usable_size(const void *p)
{
    if (!p)
        return 0;
    int s = slab_resolve("malloc_usable_size", p);
    if (s >= 0)
        return (size_t)slab_obj((unsigned)s);
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
    zero_payload(p, total);
    return p;
}

/* Zero [p, p + total) in the heap and report it: as one zero range if the
 * runtime takes it, else as ordinary stores. */
static void zero_payload(char *p, size_t total)
{
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
}

/* Grow the in-use large chunk at off to `need` bytes (a page multiple)
 * where it lies: into the free large chunk right above it (split if that
 * leaves a tail), or into the space at top when it is the last chunk. false
 * if neither has room; the heap is unchanged then. Before session 38 a
 * realloc always moved, so a string grown by appends to 64 MiB in steps of
 * about 1 MiB was copied, and logged, whole every time (~2 GB of log). */
static bool grow_large(uint64_t off, uint64_t need)
{
    dheap_root *r = g_root;
    chunk_hdr *h = hdr_at(off);
    uint64_t sz = csize(h), end = off + sz;
    uint8_t flag = prev_flag(h);
    if (need <= sz || need > MAX_CHUNK)
        return false;
    if (end == r->top) {
        if (need - sz > g_cap - end)
            return false;
        set_hdr(off, need, ST_INUSE, CLS_LARGE, flag);
        META_SET(r->top, off + need);
        if (r->hwm && off + need > r->hwm)
            META_SET(r->hwm, off + need);
    } else {
        chunk_hdr *above = hdr_at(end);
        if (above->magic != magic_for(end))
            die("realloc", g_base + off + HDR, "corrupt header of the chunk above");
        if (!is_free_large(end) || sz + csize(above) < need)
            return false;
        uint64_t total = sz + csize(above);
        large_unlink("realloc", end);
        set_hdr(off, need, ST_INUSE, CLS_LARGE, flag);
        if (total > need) /* the chunk above the tail keeps its flag */
            make_free_large(off + need, total - need, 0);
        else
            set_prev_flag(off + total, false);
    }
    META_SET(r->allocated, r->allocated + (need - sz));
    return true;
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
    /* A large chunk (not a slab object, not memalign's alias) grows in place
     * when the space above it is free. */
    if (n > usable && n > DHEAP_SMALL_MAX && n <= MAX_CHUNK - HDR - PAGE && slab_resolve("realloc", p) < 0) {
        uint64_t alias;
        uint64_t off = resolve("realloc", p, &alias);
        if (!alias && hdr_at(off)->cls == CLS_LARGE && grow_large(off, ROUND_UP((uint64_t)n + HDR, PAGE)))
            return p;
    }
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
    if (align <= 8)
        return dheap_malloc(n);
    if (align <= 16) /* all but the 8-byte slab objects are 16-byte aligned */
        return dheap_malloc(n < 16 ? 16 : n);
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
    if (!g_root) {
        errno = ENOMEM;
        return NULL;
    }
    char *p = alloc_retry(chunk_malloc_once, n + align);
    if (!p || ((uintptr_t)p & (align - 1)) == 0)
        return p;
    /* p is 16-aligned, so a - p <= align and a + n stays inside the block. */
    char *a = (char *)ROUND_UP((uintptr_t)p + HDR, align);
    uint64_t aoff = (uint64_t)(a - g_base) - HDR;
    uint64_t dist = aoff - ((uint64_t)(p - g_base) - HDR);
    set_hdr(aoff, dist, ST_ALIAS, CLS_ALIAS, 0);
    return a;
}

uint64_t dheap_root_payload(const dheap_root *root)
{
    return root->allocated - (root->inuse_chunks - root->slab_objects) * HDR;
}

uint64_t dheap_carved(void) { return g_root ? g_root->top : 0; }

bool dheap_reclaim(void)
{
    return g_root && reclaim();
}

uint64_t dheap_reclaims(void) { return g_reclaims; }

bool dheap_fits(size_t n)
{
    const dheap_root *r = g_root;
    if (!r)
        return false;
    if (n > MAX_CHUNK - HDR - PAGE)
        return false;
    uint64_t need = ROUND_UP((uint64_t)n + HDR, PAGE), most = g_cap - r->top;
    if (n <= DHEAP_SMALL_MAX) {
        unsigned c = size_class(n ? n : 1);
        if (r->small_free[c] || (r->hole && csize(hdr_at(r->hole)) >= class_chunk(c)))
            return true;
        need = class_chunk(c) > PAGE ? class_chunk(c) : PAGE;
    }
    /* (Checked as malloc follows it: mango_heap_fits runs before a big
     * value's malloc, and a damaged link hung or crashed here first.) */
    uint64_t steps = 0;
    for (uint64_t e = large_next("fits", 0, &steps); e && most < need; e = large_next("fits", e, &steps))
        if (csize(hdr_at(e)) > most)
            most = csize(hdr_at(e));
    return most >= need;
}

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

/* The slab map, the per-class lists and counters against the slabs the walk
 * found (slabs[c] per class); adds the slab objects' bytes to *inuse. */
static int check_slabs(const uint64_t *slabs, uint64_t *inuse)
{
    dheap_root *r = g_root;
    uint64_t named = 0, total = 0, objects = 0;
    if (r->slab_map) {
        const uint8_t *map = (const uint8_t *)g_base + r->slab_map;
        for (uint64_t i = 0; i < map_len(); i++)
            if (map[i])
                named++;
    }
    for (unsigned c = 0; c < DHEAP_NSLABS; c++)
        total += slabs[c];
    if (named != total)
        return check_fail("the slab map names regions that are not slabs", named);
    /* One bit per 8 bytes up to top: each free object is listed once. */
    size_t bits_len = (size_t)(r->top / 8 / 8 + 1);
    uint8_t *seen = NULL;
    if (total) {
        seen = mmap(NULL, bits_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (seen == MAP_FAILED)
            return check_fail("no memory for the check", bits_len);
    }
    int rc = 0;
    for (unsigned c = 0; c < DHEAP_NSLABS && !rc; c++) {
        uint64_t carved = slabs[c] * slab_count(c), next = r->slab_next[c];
        if (next) {
            if (!slab_obj_at(next, c))
                rc = check_fail("root.slab_next is not an object of its class", next);
            else
                carved -= slab_count(c) - (next & (SLAB - 1)) / slab_obj(c);
        }
        uint64_t nfree = 0;
        for (uint64_t e = r->slab_free[c]; e && !rc; e = rc ? 0 : *(const uint64_t *)(g_base + e)) {
            if (!slab_obj_valid(e, c))
                rc = check_fail("slab free list entry is not a used object of its class", e);
            else if (seen[e >> 6] & (1u << ((e >> 3) & 7)))
                rc = check_fail("slab object listed twice (double free?)", e);
            else if (++nfree > carved)
                rc = check_fail("slab free list longer than the objects carved", e);
            else
                seen[e >> 6] |= (uint8_t)(1u << ((e >> 3) & 7));
        }
        objects += carved - nfree;
        *inuse += (carved - nfree) * slab_obj(c);
    }
    if (seen)
        munmap(seen, bits_len);
    if (!rc && objects != r->slab_objects)
        rc = check_fail("root.slab_objects wrong", r->slab_objects);
    return rc;
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
    uint64_t slabs[DHEAP_NSLABS] = {0}, holes = 0, maps = 0;
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
        bool fl = false, counted = st == ST_INUSE;
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
            } else if (off + HDR == r->slab_map) {
                if (sz - HDR < map_len())
                    return check_fail("slab map chunk smaller than the map", off);
                counted = false; /* the slab map: allocator metadata */
                maps++;
            }
        } else if (h->cls == CLS_SLAB) {
            if (st != ST_INUSE || sz != SLAB || ((off + HDR) & (SLAB - 1)))
                return check_fail("bad slab chunk", off);
            int c = slab_class_at(off + HDR);
            if (c < 0 || c >= DHEAP_NSLABS)
                return check_fail("slab chunk not named by the slab map", off);
            slabs[c]++;
            counted = false;
        } else if (h->cls == CLS_HOLE) {
            if (st != ST_FREE || off != r->hole)
                return check_fail("a hole that is not the root's", off);
            holes++;
        } else {
            return check_fail("bad chunk class", off);
        }
        if (counted) {
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
    if (r->hole && holes != 1)
        return check_fail("root.hole is not a chunk", r->hole);
    if (r->slab_map && maps != 1)
        return check_fail("root.slab_map is not the payload of an in-use large chunk", r->slab_map);
    int rc = check_slabs(slabs, &inuse);
    if (rc)
        return rc;
    if (r->allocated != inuse)
        return check_fail("root.allocated wrong", r->allocated);
    if (r->inuse_chunks != inuse_n + r->slab_objects)
        return check_fail("root.inuse_chunks wrong", r->inuse_chunks);
    if (r->hwm && (r->hwm < r->top || r->hwm > g_cap))
        return check_fail("root.hwm below top or past the range", r->hwm);

    for (unsigned c = 0; c < DHEAP_NCLASSES; c++) {
        uint64_t n = 0;
        for (uint64_t e = r->small_free[c]; e; e = link_at(e)[0]) {
            if (++n > free_small[c])
                return check_fail("small free list longer than free chunk count (cycle?)", e);
            if (!chunk_off_below(e, top))
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
        if (!chunk_off_below(e, top))
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
