/* hand_pool.h -- a pool built by hand in memory, for unit tests of the
 * backend's frame check and apply (backend.h): a 1 MiB heap region filled
 * with stale bytes (0x5A) and a 4 KiB .data region with its written-bytes
 * bitmap, emulated persistence (flushes are no-ops). Call hand_pool_setup()
 * first; free(mirror) at the end. */
#ifndef MANGO_TEST_HAND_POOL_H
#define MANGO_TEST_HAND_POOL_H

#include <stdlib.h>
#include <string.h>

#include "pool/pool.h"

#define HEAP_VA 0x600000000000ull
#define HEAP_SIZE (1u << 20)
#define DATA_VA 0x555500000000ull
#define DATA_SIZE 4096u

static pool p;
static char *mirror;

static void hand_pool_setup(void)
{
    mirror = calloc(1, HEAP_SIZE + 2 * DATA_SIZE);
    memset(mirror, 0x5A, HEAP_SIZE); /* stale bytes */
    p.base = mirror;
    p.size = HEAP_SIZE + 2 * DATA_SIZE;
    p.pd.mode = PERSIST_EMULATED;
    p.nregions = 2;
    p.regions[0] = (pool_region){.kind = POOL_REGION_HEAP, .vaddr = HEAP_VA, .size = HEAP_SIZE, .mirror_offset = 0};
    p.regions[1] = (pool_region){.kind = POOL_REGION_DATA, .vaddr = DATA_VA, .size = DATA_SIZE,
                                 .mirror_offset = HEAP_SIZE, .bitmap_offset = HEAP_SIZE + DATA_SIZE};
}

#endif
