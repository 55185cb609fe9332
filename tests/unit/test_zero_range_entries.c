/* test_zero_range_entries.c -- zero-range log entries (redo_log.h): the
 * backend's frame check accepts well-formed ones only, and applying a frame
 * zeroes the range before the blocks that follow it (a block inside the range
 * keeps its logged content). The same two functions serve recovery's
 * validation and replay. The pool is built by hand in memory (emulated
 * persistence: flushes are no-ops). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "log/redo_log.h"
#include "mango.h"

#include "check.h"
#include "hand_pool.h"


static log_entry zero_entry(uint64_t va, uint64_t len)
{
    log_entry e;
    memset(&e, 0, sizeof e);
    e.addr = LOG_ZERO_TAG | va;
    memcpy(e.data, &len, sizeof len);
    return e;
}

static int check_one(log_entry e)
{
    log_frame f = {.seq = 1, .n_entries = 1};
    return backend_check_frame(&p, &f, &e);
}

int main(void)
{
    hand_pool_setup();
    /* Well-formed and malformed zero ranges. */
    CHECK(check_one(zero_entry(HEAP_VA + 4096, 8192)) == MANGO_OK);
    CHECK(check_one(zero_entry(HEAP_VA, HEAP_SIZE)) == MANGO_OK);             /* the whole region */
    CHECK(check_one(zero_entry(HEAP_VA + 32, HEAP_SIZE)) == MANGO_EBADPOOL);   /* past its end */
    CHECK(check_one(zero_entry(HEAP_VA + 16, 4096)) == MANGO_EBADPOOL);        /* not 32-aligned */
    CHECK(check_one(zero_entry(HEAP_VA + 4096, 100)) == MANGO_EBADPOOL);       /* length not 32-granular */
    CHECK(check_one(zero_entry(HEAP_VA + 4096, 0)) == MANGO_EBADPOOL);         /* empty */
    CHECK(check_one(zero_entry(DATA_VA, 1024)) == MANGO_EBADPOOL);             /* not in the heap */
    CHECK(check_one(zero_entry(0x1000, 1024)) == MANGO_EBADPOOL);              /* in no region */
    log_entry m = zero_entry(HEAP_VA + 4096, 4096);
    m.mask = 1;
    CHECK(check_one(m) == MANGO_EBADPOOL); /* a zero range carries no mask */

    /* Apply: zero [4096, 4096 + 16384), then a block inside it and one past it. */
    log_entry e[3];
    e[0] = zero_entry(HEAP_VA + 4096, 16384);
    memset(&e[1], 0, sizeof e[1]);
    e[1].addr = HEAP_VA + 8192;
    e[1].mask = 0xffffffffu;
    memset(e[1].data, 0xC3, LOG_BLOCK_SIZE);
    e[2] = e[1];
    e[2].addr = HEAP_VA + 4096 + 16384;
    log_frame f = {.seq = 2, .n_entries = 3};
    persist_ranges rg = {0};
    CHECK(backend_check_frame(&p, &f, e) == MANGO_OK);
    CHECK(backend_apply_frame(&p, &f, e, &rg) == MANGO_OK);
    int ok = 1;
    for (size_t i = 0; i < HEAP_SIZE; i++) {
        unsigned char want = 0x5A;
        if (i >= 4096 && i < 4096 + 16384)
            want = 0;
        if ((i >= 8192 && i < 8192 + LOG_BLOCK_SIZE) || (i >= 4096 + 16384 && i < 4096 + 16384 + LOG_BLOCK_SIZE))
            want = 0xC3;
        if ((unsigned char)mirror[i] != want) {
            fprintf(stderr, "mirror byte %zu: %#x, expected %#x\n", i, (unsigned char)mirror[i], want);
            ok = 0;
            break;
        }
    }
    CHECK(ok);
    /* A malformed range stops the apply with an error. */
    log_entry bad = zero_entry(HEAP_VA + HEAP_SIZE - 32, 64);
    log_frame fb = {.seq = 3, .n_entries = 1};
    CHECK(backend_apply_frame(&p, &fb, &bad, &rg) == MANGO_EBADPOOL);
    free(mirror);
    return check_report("test_zero_range_entries");
}
