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

static inline uint32_t slot_of(uintptr_t block) { return DEDUP_HASH(block) & (SCRATCH_SLOTS - 1); }

/* The slot holding block, or the empty slot where it would go. */
static uint32_t find(uintptr_t block)
{
    uint32_t i = slot_of(block);
    while (key[i] != 0 && key[i] != block)
        i = (i + 1) & (SCRATCH_SLOTS - 1);
    return i;
}

static inline uint32_t bytes_mask(uintptr_t block, uintptr_t lo, uintptr_t hi)
{
    uintptr_t a = lo > block ? lo - block : 0;
    uintptr_t b = hi < block + DEDUP_BLOCK ? hi - block : DEDUP_BLOCK;
    return (uint32_t)(((1ull << b) - 1) & ~((1ull << a) - 1));
}

int scratch_add(uintptr_t addr, size_t len)
{
    if (len == 0)
        return MANGO_OK;
    uintptr_t hi = addr + len;
    uintptr_t first = addr & ~(uintptr_t)(DEDUP_BLOCK - 1);
    unsigned fresh = 0;
    for (uintptr_t b = first; b < hi; b += DEDUP_BLOCK)
        fresh += key[find(b)] == 0;
    if (used + fresh > SCRATCH_MAX_BLOCKS)
        return mango_error(MANGO_EINVAL, "mango_scratch: at most %u blocks of 32 bytes may be scratch "
                           "(%u are, and [%#lx, +%zu) needs %u more)", SCRATCH_MAX_BLOCKS, used,
                           (unsigned long)addr, len, fresh);
    for (uintptr_t b = first; b < hi; b += DEDUP_BLOCK) {
        uint32_t i = find(b);
        if (key[i] == 0) {
            key[i] = b;
            mask[i] = 0;
            used++;
        }
        mask[i] |= bytes_mask(b, addr, hi);
    }
    return MANGO_OK;
}

void scratch_reset(void)
{
    memset(key, 0, sizeof key);
    used = 0;
}

unsigned scratch_blocks(void) { return used; }

static bool all_scratch(void *arg, uintptr_t block, uint32_t written)
{
    (void)arg;
    uint32_t i = slot_of(block);
    for (;;) {
        if (key[i] == block)
            return (written & ~mask[i]) == 0;
        if (key[i] == 0)
            return false;
        i = (i + 1) & (SCRATCH_SLOTS - 1);
    }
}

uint64_t scratch_drop(dedup_set *s)
{
    if (used == 0)
        return 0;
    return dedup_drop(s, all_scratch, NULL);
}
