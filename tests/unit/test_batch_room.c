/* test_batch_room.c -- mango_batch_room() reports the open batch's distinct
 * captured bytes (32-byte blocks: a block written twice counts once; a data
 * range, a store of 4 KiB or more, its log entries) and the
 * most a batch may hold; 0 used outside a batch; 0 capacity without a
 * durable mode. An event loop uses it to end a batch early between commands
 * (the durable Redis does). mango_heap_room() reports the durable heap's
 * allocated bytes and capacity (0 and 0 without a durable mode). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

static char *area; /* durable: 64 KiB in the durable heap */

static void init_state(void *arg)
{
    (void)arg;
    area = malloc(64 << 10);
    memset(area, 0, 64 << 10);
    mango_capture(&area, sizeof area);
    mango_capture(area, 64 << 10);
}
static bool is_ro(void *c) { (void)c; return false; }
static void nop(void *c) { (void)c; }

int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-room-%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED); /* 1 MiB log */
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nop, .init_state = init_state};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);

    uint64_t used = 1, cap = 0;
    mango_batch_room(&used, &cap);
    printf("outside a batch: used %llu, capacity %llu\n", (unsigned long long)used, (unsigned long long)cap);
    CHECK(used == 0);
    /* One frame may take half of the 1 MiB ring: a little less than 512 KiB
     * / (32 + per-entry overhead) blocks of 32 bytes. */
    CHECK(cap > (1u << 20) / 4 && cap < (1u << 20) / 2);
    CHECK(cap % 32 == 0);

    char *a = (char *)(((uintptr_t)area + 31) & ~(uintptr_t)31); /* block-aligned */
    CHECK(mango_batch_begin() == MANGO_OK);
    mango_batch_room(&used, NULL);
    uint64_t base = used; /* whatever the batch start itself captured */
    memset(a, 1, 2048); /* below the data-range size: 64 blocks */
    mango_capture(a, 2048);
    mango_batch_room(&used, NULL);
    printf("after 2 KiB: used %llu (base %llu)\n", (unsigned long long)used, (unsigned long long)base);
    CHECK(used - base == 2048);
    memset(a, 2, 2048); /* the same blocks again: no growth */
    mango_capture(a, 2048);
    mango_batch_room(&used, NULL);
    CHECK(used - base == 2048);
    memset(a + 2048, 3, 100); /* 100 bytes from a block boundary: 4 blocks */
    mango_capture(a + 2048, 100);
    mango_batch_room(&used, NULL);
    CHECK(used - base == 2048 + 4 * 32);
    /* 4 KiB into the heap is a data range: a header entry and 86 of 48
     * bytes, 87 entries counted as 32 each; written again, still one. */
    uint64_t before = used;
    memset(a + 8192, 4, 4096);
    mango_capture(a + 8192, 4096);
    mango_batch_room(&used, NULL);
    printf("after a 4 KiB range: used %llu\n", (unsigned long long)(used - before));
    CHECK(used - before == 87 * 32);
    memset(a + 8192, 5, 4096);
    mango_capture(a + 8192, 4096);
    mango_batch_room(&used, NULL);
    CHECK(used - before == 87 * 32);
    CHECK(mango_batch_end() == MANGO_OK);
    mango_batch_room(&used, NULL);
    CHECK(used == 0);
    /* The durable heap's room: the initial state is in it; a 1 MiB
     * allocation in a batch adds at least that; the capacity is the pool's. */
    uint64_t alloc0 = 0, hcap = 0, alloc1 = 0, hcap1 = 0;
    mango_heap_room(&alloc0, &hcap);
    printf("heap: %llu of %llu bytes allocated\n", (unsigned long long)alloc0, (unsigned long long)hcap);
    CHECK(alloc0 >= (64u << 10) && hcap > (8u << 20) && hcap < (32u << 20));
    CHECK(mango_batch_begin() == MANGO_OK);
    char *big = malloc(1u << 20);
    CHECK(big != NULL);
    CHECK(mango_batch_end() == MANGO_OK);
    mango_heap_room(&alloc1, &hcap1);
    CHECK(alloc1 >= alloc0 + (1u << 20) && hcap1 == hcap);
    mango_stats hs;
    mango_get_stats(&hs);
    CHECK(hs.heap_capacity == hcap && hs.heap_allocated_bytes == alloc1);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);

    /* No durability: nothing to fill. */
    snprintf(pool, sizeof pool, "/dev/shm/mango-room-none-%d.pool", (int)getpid());
    small_test_config(&cfg, pool, MANGO_PERSIST_NONE);
    CHECK(mango_init(&cfg, &cb) >= 0);
    mango_batch_room(&used, &cap);
    CHECK(used == 0 && cap == 0);
    mango_heap_room(&used, &cap);
    CHECK(used == 0 && cap == 0);
    /* Its mode is named, and no pool is open (it said "?": found by the
     * docs review, session 40; INFO mangosteen showed mango_mode:?). */
    CHECK(strcmp(mango_mode_name(), "none") == 0 && strcmp(mango_pool_path(), "") == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
    return check_report("test_batch_room");
}
