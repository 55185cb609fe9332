/* test_self_copy.c -- a memmove/memcpy onto itself is not logged.
 *
 * Redis's listpack replaces an element of the same size in place by memmoving
 * the whole tail onto itself; those bytes do not change, so the interposed
 * memmove/memcpy (and their _chk forms) capture nothing when d == s. A
 * one-byte shift of the same range must still log every byte it covers (as
 * a data range: it is 4 KiB), and
 * it must survive recovery (so the check cannot pass by logging nothing). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

#define BYTES 4096u

extern void *__memmove_chk(void *d, const void *s, size_t n, size_t dl);
extern void *__memcpy_chk(void *d, const void *s, size_t n, size_t dl);

/* Opaque to the optimiser: calls go to the (interposed) libc functions. */
static void *launder(void *p)
{
    __asm__ volatile("" : "+r"(p));
    return p;
}
#define VF(f) ((__typeof__(&f))launder((void *)&f))

static unsigned char *buf; /* .bss, durable: points into the durable heap */
static int op;

static void init_state(void *arg)
{
    (void)arg;
    buf = malloc(BYTES + 64);
    for (unsigned i = 0; i < BYTES + 64; i++)
        buf[i] = (unsigned char)(i * 13 + 7);
    mango_capture(&buf, sizeof buf);
    mango_capture(buf, BYTES + 64);
}
static bool is_ro(void *c) { (void)c; return false; }
static void run_op(void *c)
{
    (void)c;
    switch (op) {
    case 0: VF(memmove)(buf, buf, BYTES); break;
    case 1: VF(memcpy)(buf, buf, BYTES); break;
    case 2: VF(__memmove_chk)(buf, buf, BYTES, BYTES + 64); break;
    case 3: VF(__memcpy_chk)(buf, buf, BYTES, BYTES + 64); break;
    case 4: VF(memmove)(buf, buf + 1, BYTES); break; /* a real shift */
    }
}

static int start(const char *pool)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = run_op, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static uint64_t data_bytes; /* data-range bytes the last op logged */

/* Log entries the op logged (blocks; a data range's header and pieces). */
static uint64_t blocks_of(int which)
{
    mango_stats a, b;
    mango_get_stats(&a);
    op = which;
    int x = 0;
    CHECK(mango_client_cmd(&x) == 0);
    mango_get_stats(&b);
    data_bytes = b.log_data_bytes - a.log_data_bytes;
    return b.log_blocks - a.log_blocks;
}

int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-selfcopy-%d.pool", (int)getpid());
    unlink(pool);
    CHECK(start(pool) == MANGO_FRESH);
    /* Each self-copy logs at most the one block holding `op` (.bss). */
    for (int k = 0; k < 4; k++) {
        uint64_t n = blocks_of(k);
        printf("self-copy op %d: %llu blocks logged\n", k, (unsigned long long)n);
        CHECK(n <= 1);
    }
    unsigned char want[BYTES];
    memcpy(want, buf + 1, BYTES);
    uint64_t n = blocks_of(4);
    printf("shift by one: %llu entries logged, %llu bytes of them a data range\n", (unsigned long long)n,
           (unsigned long long)data_bytes);
    /* 4 KiB into the heap: one data range (a header and 86 entries of 48
     * bytes) rather than 128 blocks. */
    CHECK(data_bytes >= BYTES && n >= 1 + BYTES / 48);
    CHECK(mango_shutdown() == 0);
    CHECK(start(pool) == MANGO_RECOVERED);
    CHECK(memcmp(buf, want, BYTES) == 0);
    CHECK(mango_shutdown() == 0);
    unlink(pool);
    return check_report("test_self_copy");
}
