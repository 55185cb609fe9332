/* test_dedup_set.c -- the dedup set and its spill set: every written byte is
 * reported exactly once per block, masks are exact, and large batches stay
 * bounded by their distinct blocks; data ranges merge into exactly the bytes
 * written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "capture/dedup_set.h"

#include "check.h"

/* A check inside a hot loop: counts a failure only. */
#define CHECK_QUIET(c) \
    do {               \
        if (!(c))      \
            CHECK(c);  \
    } while (0)

#define SPAN (8u << 20) /* model of 8 MiB of memory */
static uint8_t *written, *reported;
static uint64_t visits, dup_visits;
static const uintptr_t BASE = 0x600000000000ull;

static void visit(void *arg, uintptr_t block, uint32_t mask)
{
    (void)arg;
    visits++;
    uint64_t off = block - BASE;
    for (unsigned b = 0; b < 32; b++)
        if (mask & (1u << b)) {
            if (reported[off + b])
                dup_visits++;
            reported[off + b] = 1;
        }
}

static void run(dedup_set *s, unsigned seed, unsigned n_writes, unsigned max_len, size_t span)
{
    memset(written, 0, SPAN);
    memset(reported, 0, SPAN);
    visits = dup_visits = 0;
    srand(seed);
    for (unsigned i = 0; i < n_writes; i++) {
        size_t len = 1 + (size_t)rand() % max_len;
        size_t off = (size_t)rand() % (span - len);
        memset(written + off, 1, len);
        dedup_add_range(s, BASE + off, len);
    }
    dedup_for_each(s, visit, NULL);
}

int main(void)
{
    written = mmap(NULL, SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    reported = mmap(NULL, SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    dedup_set *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    dedup_init(s);

    /* Small batch: stays in the primary set; masks exact. */
    run(s, 1, 500, 16, 1u << 16);
    CHECK(s->spill.count == 0);
    CHECK(memcmp(written, reported, SPAN) == 0);
    CHECK(dup_visits == 0);
    CHECK(visits == dedup_size(s));
    dedup_clear(s);
    CHECK(dedup_size(s) == 0);

    /* Large batch over 4 MiB: spills; still exact and each block once. */
    run(s, 2, 400000, 100, 4u << 20);
    CHECK(s->spill.count > 0);
    CHECK(memcmp(written, reported, SPAN) == 0);
    CHECK(dup_visits == 0);
    uint64_t distinct = 0;
    for (size_t b = 0; b < SPAN; b += 32) {
        int any = 0;
        for (unsigned k = 0; k < 32; k++)
            any |= written[b + k];
        distinct += any;
    }
    CHECK(visits == distinct); /* bounded by distinct blocks */
    dedup_clear(s);

    /* Rewriting the same 1 MiB many times logs it once. */
    for (int round = 0; round < 8; round++)
        dedup_add_range(s, BASE, 1u << 20);
    CHECK(dedup_size(s) == (1u << 20) / 32);
    dedup_clear(s);

    /* After clear, a reused spill set is empty and still exact. */
    run(s, 3, 100000, 64, 2u << 20);
    CHECK(memcmp(written, reported, SPAN) == 0 && dup_visits == 0);
    dedup_clear(s);

    /* No-dedup baseline keeps arrival order and duplicates. */
    dedup_add_range_nodedup(s, BASE, 64);
    dedup_add_range_nodedup(s, BASE, 64);
    CHECK(dedup_size(s) == 4);
    dedup_clear(s);

    /* Data ranges: 400 random ranges (many overlapping or touching) are
     * merged on the way and at the end into sorted, disjoint, non-touching
     * ranges whose union is exactly the bytes written. */
    memset(written, 0, SPAN);
    memset(reported, 0, SPAN);
    srand(4);
    for (unsigned i = 0; i < 400; i++) {
        size_t len = 4096 + (size_t)rand() % 20000;
        size_t off = (size_t)rand() % (SPAN - len);
        memset(written + off, 1, len);
        dedup_add_data_range(s, BASE + off, len);
        CHECK_QUIET(s->rng_n <= 400);
    }
    dedup_merge_ranges(s);
    uint64_t slots = 0, bytes = 0;
    int ordered = 1;
    for (uint64_t i = 0; i < s->rng_n; i++) {
        memset(reported + (s->rng[i].addr - BASE), 1, s->rng[i].len);
        slots += DEDUP_RANGE_SLOTS(s->rng[i].len);
        bytes += s->rng[i].len;
        if (i > 0 && s->rng[i].addr <= s->rng[i - 1].addr + s->rng[i - 1].len)
            ordered = 0;
    }
    CHECK(ordered);
    CHECK(memcmp(written, reported, SPAN) == 0);
    CHECK(s->rng_slots == slots && s->rng_bytes == bytes);
    CHECK(dedup_log_slots(s) == dedup_size(s) + slots);
    printf("400 data ranges merged into %llu (%llu bytes)\n", (unsigned long long)s->rng_n,
           (unsigned long long)bytes);
    /* The same range a million times stays one range. */
    dedup_clear(s);
    CHECK(s->rng_n == 0 && dedup_log_slots(s) == 0);
    for (unsigned i = 0; i < 1000000; i++)
        dedup_add_data_range(s, BASE + 4096, 8192);
    dedup_merge_ranges(s);
    CHECK(s->rng_n == 1 && s->rng_bytes == 8192 && s->rng_slots == DEDUP_RANGE_SLOTS(8192));
    dedup_clear(s);

    dedup_destroy(s);
    return check_report("test_dedup_set");
}
