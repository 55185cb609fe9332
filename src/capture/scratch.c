/* scratch.c -- the scratch table and the batch-end filter (scratch.h). */
#include "capture/scratch.h"

#include <string.h>

#include "mango.h"
#include "runtime/error.h"

/* The runtime's own .bss is never captured (it is not instrumented), so
 * plain arrays do. */
static uint64_t key[SCRATCH_SLOTS]; /* block address, 0 = empty */
static uint32_t mask[SCRATCH_SLOTS];
static unsigned used;
static uintptr_t heap_lo = UINTPTR_MAX, heap_hi; /* the span of the heap's scratch blocks */

_Static_assert(SCRATCH_SLOTS == DEDUP_SLOTS, "scratch.c probes with the dedup set's hash");
static inline uint32_t slot_of(uintptr_t block) { return DEDUP_HASH(block); }

/* The slot holding block, or the empty slot where it would go. */
static uint32_t find(uintptr_t block)
{
    uint32_t i = slot_of(block);
    while (key[i] != 0 && key[i] != block)
        i = (i + 1) & (SCRATCH_SLOTS - 1);
    return i;
}

int scratch_add(uintptr_t addr, size_t len, bool in_heap)
{
    if (len == 0)
        return MANGO_OK;
    uintptr_t hi = addr + len;
    uintptr_t first = addr & ~(uintptr_t)(DEDUP_BLOCK - 1);
    uint64_t blocks = (hi - first + DEDUP_BLOCK - 1) / DEDUP_BLOCK, fresh = 0;
    if (blocks <= SCRATCH_MAX_BLOCKS) /* (else refused below without a walk) */
        for (uintptr_t b = first; b < hi; b += DEDUP_BLOCK)
            fresh += key[find(b)] == 0;
    if (blocks > SCRATCH_MAX_BLOCKS || used + fresh > SCRATCH_MAX_BLOCKS)
        return mango_error(MANGO_EINVAL, "mango_scratch: at most %u blocks of 32 bytes may be scratch "
                           "(%u are, and [%#lx, +%zu) needs up to %llu more)", SCRATCH_MAX_BLOCKS, used,
                           (unsigned long)addr, len, (unsigned long long)(blocks > SCRATCH_MAX_BLOCKS ? blocks : fresh));
    if (in_heap) {
        heap_lo = first < heap_lo ? first : heap_lo;
        heap_hi = hi > heap_hi ? hi : heap_hi;
    }
    for (uintptr_t b = first; b < hi; b += DEDUP_BLOCK) {
        uint32_t i = find(b);
        if (key[i] == 0) {
            key[i] = b;
            mask[i] = 0;
            used++;
        }
        mask[i] |= dedup_block_mask(b, addr, hi);
    }
    return MANGO_OK;
}

void scratch_reset(void)
{
    memset(key, 0, sizeof key);
    used = 0;
    heap_lo = UINTPTR_MAX;
    heap_hi = 0;
}

/* The scratch mask of block, 0 if it has none. */
static uint32_t scratch_of(uintptr_t block)
{
    uint32_t i = find(block);
    return key[i] ? mask[i] : 0;
}

/* Clear the scratch bits of [lo, hi) in block's entry, if it has one. (An
 * entry left with no bits stays in its slot: it marks nothing, and keeps the
 * probe chains whole.) */
static void unmark(uint32_t i, uintptr_t lo, uintptr_t hi)
{
    if (key[i] && key[i] < hi && key[i] + DEDUP_BLOCK > lo)
        mask[i] &= ~dedup_block_mask(key[i], lo, hi);
}

void scratch_unmark_heap(uintptr_t lo, uintptr_t hi)
{
    if (hi <= heap_lo || lo >= heap_hi)
        return;
    uintptr_t first = lo & ~(uintptr_t)(DEDUP_BLOCK - 1);
    if ((hi - first) / DEDUP_BLOCK > SCRATCH_SLOTS / 4) { /* a large range: walk the table instead */
        for (uint32_t i = 0; i < SCRATCH_SLOTS; i++)
            unmark(i, lo, hi);
        return;
    }
    for (uintptr_t b = first; b < hi; b += DEDUP_BLOCK)
        unmark(find(b), lo, hi); /* (an empty slot: nothing to clear) */
}

static bool all_scratch(void *arg, uintptr_t block, uint32_t written)
{
    (void)arg;
    return (written & ~scratch_of(block)) == 0;
}

uint64_t scratch_drop(dedup_set *s)
{
    if (used == 0)
        return 0;
    return dedup_drop(s, all_scratch, NULL);
}
