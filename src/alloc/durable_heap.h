/* durable_heap.h -- the durable allocator.
 *
 * Serves malloc/free for read-write commands from a fixed virtual range (the
 * durable heap reservation). All of its metadata lives inside that range and
 * every write it makes to metadata is reported through the capture callback,
 * so the redo log carries allocator state like any other durable store and
 * recovery restores it by copying bytes. Only one thread (the combiner) uses it
 * at a time, so it takes no locks.
 *
 * Layout: a dheap_root at the base of the range, then chunks. `top` is the end
 * of the carved part; recovery copies [base, base + top) only.
 */
#ifndef MANGO_DURABLE_HEAP_H
#define MANGO_DURABLE_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DHEAP_MAGIC 0x5045484f474e414dULL /* "MANGOHEP" */
/* 4: requests of up to 128 bytes are headerless slab objects (versions 1
 * to 3 are refused) */
#define DHEAP_VERSION 4

/* Small size classes, in chunk bytes (an 8-byte header included): 16..1024
 * in steps of 16 (64 classes), then four classes per doubling up to 32 KiB
 * (20 classes). Larger requests are "large" chunks: page multiples, first
 * fit, split and coalesced. */
#define DHEAP_NCLASSES 84
#define DHEAP_SMALL_MAX (32768 - 8) /* the largest small payload */
/* Offset of the first chunk's header (its payload starts at 1024). */
#define DHEAP_FIRST_CHUNK 1016
/* Requests of up to DHEAP_SLAB_MAX bytes are served from slabs: objects of
 * 8 bytes (8-byte aligned) or 16, 32, ... 128 (16-byte aligned) with no
 * header, packed into 16 KiB regions of the range (aligned on 16 KiB) that
 * a byte map names. */
#define DHEAP_NSLABS 9
#define DHEAP_SLAB_MAX 128
#define DHEAP_SLAB_BYTES 16384

typedef void (*dheap_capture_fn)(const void *addr, size_t len);
/* Takes [addr, addr+len) (32-byte aligned), just zeroed, as one zero range
 * of the open batch instead of its blocks; false: capture it as usual. */
typedef bool (*dheap_zero_fn)(const void *addr, size_t len);

/* The first bytes of the heap range. Stable: recovery reads it from the mirror. */
typedef struct dheap_root {
    uint64_t magic;
    uint64_t version;
    uint64_t capacity; /* bytes in the range */
    uint64_t top;      /* offset from base of the first never-carved byte */
    /* implementation-private fields follow (durable_heap.c). All links are
     * offsets from base (0 = none), so a root image can be validated without
     * knowing where it will be mapped. */
    uint64_t allocated;  /* bytes (headers included) of chunks in use */
    uint64_t large_free; /* head of the doubly linked list of free large chunks */
    uint64_t small_free[DHEAP_NCLASSES]; /* per-class singly linked free lists */
    uint64_t inuse_chunks; /* chunks in use (version 2): with allocated, the payload in use */
    uint64_t hwm; /* the highest top ever reached: the bytes from here on were never
                   * handed out, so they are zero in memory and in the pool
                   * (0: unknown, as in pools of the first version-2 builds) */
    /* version 4: slabs */
    uint64_t slab_map;  /* payload offset of the slab map (0: none yet): a byte per
                         * DHEAP_SLAB_BYTES of the range, 0 or a slab class + 1 */
    uint64_t slab_free[DHEAP_NSLABS]; /* per slab class: freed objects, LIFO (link in the first word) */
    uint64_t slab_next[DHEAP_NSLABS]; /* per slab class: the newest slab's next never-used object (0: none) */
    uint64_t slab_objects; /* slab objects in use (counted in inuse_chunks, their size in allocated) */
    uint64_t hole; /* header offset of the free chunk left below a slab by its alignment,
                    * carved first by small chunk requests (0: none) */
} dheap_root;

/* Attach to [base, base+capacity), which must be mapped read-write.
 * fresh: write a new root (captured). Otherwise the root must already be valid
 * (restored by recovery). Returns 0 or a negative MANGO_E* code. */
int dheap_attach(void *base, size_t capacity, bool fresh, dheap_capture_fn capture);
void dheap_detach(void);
/* Where calloc reports a large zeroed range of reused memory (NULL: as
 * ordinary stores). Cleared by dheap_detach. */
void dheap_set_zero_capture(dheap_zero_fn fn);
/* Called with each object free is about to release, [p, p + n) (NULL: none;
 * cleared by dheap_detach): the runtime unmarks scratch memory there. */
typedef void (*dheap_free_hook_fn)(const void *p, size_t n);
void dheap_set_free_hook(dheap_free_hook_fn fn);

void *dheap_malloc(size_t n);
void *dheap_calloc(size_t n, size_t size);
void *dheap_realloc(void *p, size_t n);
void *dheap_memalign(size_t align, size_t n);
void dheap_free(void *p);
size_t dheap_usable_size(const void *p);

/* Is p inside the attached heap range? (cheap; usable before attach: false) */
bool dheap_contains(const void *p);

/* Validate a root image (e.g. read from the pool mirror); returns the number
 * of bytes from base that recovery must copy, or 0 if the root is invalid. */
uint64_t dheap_extent_of_root(const dheap_root *root, uint64_t capacity);

/* Is a heap attached? (split_alloc routes by this) */
bool dheap_attached(void);
/* Bumped by every dheap_attach and dheap_detach (never 0 once either ran):
 * pointers remembered under one value (split_alloc's queue of deferred
 * frees) belong to that attachment and mean nothing under another. */
uint64_t dheap_epoch(void);
/* Report bytes of the heap written on the heap's behalf (e.g. realloc's copy
 * done by split_alloc) through the attached capture callback. */
void dheap_capture(const void *addr, size_t len);

/* What the attached heap holds in use: *chunks allocations, *payload their
 * bytes (the sum of dheap_usable_size over them, except that a memalign
 * block counts whole, from its chunk's start) and *allocated the same with
 * the 8-byte chunk headers (slab objects have none). O(1), read from the root, so right after
 * recovery too. Zeros when nothing is attached; any pointer may be NULL. */
void dheap_usage(uint64_t *chunks, uint64_t *payload, uint64_t *allocated);
/* The attached heap's extent: bytes from its base to its top (0 when nothing
 * is attached). */
uint64_t dheap_carved(void);
/* Turn free space that only some requests can use (emptied slabs, free
 * small chunks, the hole, free large chunks next to them) into free large
 * chunks, or give it back at top. malloc does this by itself when a request
 * finds no room; callable in a write section (its stores are captured).
 * Does nothing (a walk of the whole heap saved) unless something was freed
 * or cut up since the last reclaim or the attach. Returns whether the heap
 * changed. */
bool dheap_reclaim(void);
/* Would one request of n bytes find room now, without reclaiming? Slab
 * objects are judged as small chunks (a slab can fall back to one). It
 * does not count malloc's last resort for a small request, the split of a
 * larger free small chunk: false is no promise that malloc fails. */
bool dheap_fits(size_t n);
/* Reclaims that changed the heap since attach (transient; a statistic). */
uint64_t dheap_reclaims(void);
/* The payload in use that a root image records (as dheap_usage's *payload). */
uint64_t dheap_root_payload(const dheap_root *root);

/* Walk all chunks and check metadata consistency; 0 if consistent. (tests) */
int dheap_check(void);

#endif
