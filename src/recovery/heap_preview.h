/* heap_preview.h -- the durable heap as replaying the pending log will leave
 * it, seen without writing the pool.
 *
 * Always the heap's root: the mirror's bytes with every pending entry that
 * overlaps it applied to a private copy (recovery checks it before writing;
 * `mango check` reports it). On request, the whole heap: a private
 * copy-on-write mapping of the heap's mirror in the pool file with the log
 * applied, whose metadata can then be walked (dheap_check) before anything
 * is written. Only the pages the log writes take memory; a zero range's
 * whole pages become anonymous zero pages. Used by recovery
 * (MANGO_CHECK_HEAP=1) and by `mango check`.
 */
#ifndef MANGO_HEAP_PREVIEW_H
#define MANGO_HEAP_PREVIEW_H

#include <stdint.h>

#include "alloc/durable_heap.h"
#include "log/redo_log.h"
#include "pool/pool.h"

/* At most this many zero ranges become anonymous pages in the copy (each
 * adds up to two mappings; vm.max_map_count is 65530 by default), and then
 * only those of at least ..._BIG bytes (cheap to map, costly to clear). */
#define HEAP_PREVIEW_ZERO_MAPS 8192u
#define HEAP_PREVIEW_ZERO_MAP_BIG (4ull << 20)

typedef struct heap_preview {
    const pool_region *heap;
    dheap_root root;
    char *copy; /* the whole heap; NULL: the root only */
    unsigned zero_maps; /* zero ranges mapped as anonymous pages so far */
} heap_preview;

/* Start from the mirror as it is: the root copied, no whole-heap copy. */
void heap_preview_init(heap_preview *hp, const pool *p, const pool_region *heap);
/* Map the whole-heap copy (before any entry is applied). 0, or an errno. */
int heap_preview_map(heap_preview *hp, const pool *p);
void heap_preview_unmap(heap_preview *hp);

/* Apply [addr, addr+len) -- the bytes at src, or zeros if src is NULL --
 * where it overlaps the heap (the copy, if mapped) and its root. A range
 * that starts in the heap region is cut at its end. */
void heap_preview_bytes(heap_preview *hp, uint64_t addr, uint64_t len, const char *src);
/* A redo_log_scan visitor (arg: the heap_preview) for frames that were
 * validated: applies every entry as backend_apply_frame would. */
int heap_preview_frame(void *arg, const log_frame *f, const log_entry *e);

/* Walk the copy's metadata: 0 if consistent; -1 if dheap_check found a
 * problem (it said which on stderr); -2 if the allocator cannot attach the
 * copy at all. The copy is attached only for the walk. */
int heap_preview_walk(const heap_preview *hp);

#endif
