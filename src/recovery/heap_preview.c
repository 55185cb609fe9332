/* heap_preview.c -- the heap as the replay will leave it (heap_preview.h). */
#define _GNU_SOURCE
#include "recovery/heap_preview.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/error.h"

#define PAGE_BYTES 4096u

/* validate() (pool.c) refuses smaller heaps: the root always fits. */
_Static_assert(POOL_MIN_HEAP_SIZE >= DHEAP_FIRST_CHUNK + PAGE_BYTES &&
                   POOL_MIN_HEAP_SIZE >= sizeof(dheap_root),
               "a valid pool's heap holds the root and what dheap_attach needs");

void heap_preview_init(heap_preview *hp, const pool *p, const pool_region *heap)
{
    memset(hp, 0, sizeof *hp);
    hp->heap = heap;
    /* (Bounded anyway: the mirror's end may be the mapping's.) */
    size_t n = heap->size < sizeof hp->root ? (size_t)heap->size : sizeof hp->root;
    memcpy(&hp->root, p->base + heap->mirror_offset, n);
}

int heap_preview_map(heap_preview *hp, const pool *p)
{
    char *copy = mmap(NULL, hp->heap->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, p->fd,
                      (off_t)hp->heap->mirror_offset);
    if (copy == MAP_FAILED)
        return errno;
    hp->copy = copy;
    return 0;
}

void heap_preview_unmap(heap_preview *hp)
{
    if (hp->copy)
        munmap(hp->copy, hp->heap->size);
    hp->copy = NULL;
}

/* Zeros over [off, off+n) of the copy: the whole pages among them replaced
 * by anonymous zero pages (a zero range can span a whole calloc'ed table),
 * the ends cleared. Each replacement can split the copy's mapping: past
 * HEAP_PREVIEW_ZERO_MAPS of them, only ranges of HEAP_PREVIEW_ZERO_MAP_BIG or
 * more (few can be apart) are mapped, others cleared in place. Tens of
 * thousands of page-sized ranges (a pending log of callocs, each valid) took
 * the process to vm.max_map_count, and the walk's own mmap then failed: the
 * heap was called inconsistent (a review of the CLI with hostile files). */
static void zero_copy(heap_preview *hp, uint64_t off, uint64_t n)
{
    char *copy = hp->copy;
    uint64_t a = (off + PAGE_BYTES - 1) & ~(uint64_t)(PAGE_BYTES - 1);
    uint64_t b = (off + n) & ~(uint64_t)(PAGE_BYTES - 1);
    bool map = b > a && (hp->zero_maps < HEAP_PREVIEW_ZERO_MAPS || b - a >= HEAP_PREVIEW_ZERO_MAP_BIG);
    hp->zero_maps += map;
    if (map && mmap(copy + a, b - a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                    -1, 0) != MAP_FAILED) {
        memset(copy + off, 0, a - off);
        memset(copy + b, 0, off + n - b);
    } else {
        memset(copy + off, 0, n);
    }
}

void heap_preview_bytes(heap_preview *hp, uint64_t addr, uint64_t len, const char *src)
{
    uint64_t lo = hp->heap->vaddr, hi = lo + sizeof hp->root;
    if (hp->copy && addr >= lo && addr - lo < hp->heap->size) {
        uint64_t off = addr - lo, n = len < hp->heap->size - off ? len : hp->heap->size - off;
        if (src)
            memcpy(hp->copy + off, src, n);
        else
            zero_copy(hp, off, n);
    }
    for (uint64_t x = addr > lo ? addr : lo; x < addr + len && x < hi; x++)
        ((char *)&hp->root)[x - lo] = src ? src[x - addr] : 0;
}

int heap_preview_frame(void *arg, const log_frame *f, const log_entry *e)
{
    heap_preview *hp = arg;
    for (uint32_t i = 0; i < f->n_entries; i++) {
        if (log_entry_is_data(&e[i])) {
            heap_preview_bytes(hp, log_entry_data_addr(&e[i]), log_entry_data_len(&e[i]), (const char *)&e[i + 1]);
            i += (uint32_t)log_entry_slots(&e[i]) - 1;
            continue;
        }
        if (log_entry_is_zero(&e[i])) {
            heap_preview_bytes(hp, e[i].addr & ~LOG_ZERO_TAG, log_entry_zero_len(&e[i]), NULL);
            continue;
        }
        /* Heap blocks are applied whole (backend_apply_frame); blocks of
         * data regions never overlap the heap. */
        heap_preview_bytes(hp, e[i].addr, LOG_BLOCK_SIZE, (const char *)e[i].data);
    }
    return MANGO_OK;
}

int heap_preview_walk(const heap_preview *hp)
{
    if (dheap_attach(hp->copy, hp->heap->size, false, NULL) != 0)
        return -2;
    int rc = dheap_check();
    dheap_detach();
    return rc == 0 ? 0 : -1;
}
