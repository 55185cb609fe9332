/* test_data_range_entries.c -- data-range log entries (redo_log.h,
 * LOG_DATA_TAG): a store of 4 KiB or more into the durable heap is logged as
 * its bytes, not as 32-byte blocks.
 *   - format: the backend's frame check accepts well-formed ranges only
 *     (inside the heap region, not longer than the frame holds, reserved
 *     fields zero), and applying a frame copies the bytes, with the zero
 *     ranges and blocks around it in order;
 *   - end to end (emulated pool): large copies, overlapping rewrites, a range
 *     beside blocks and a range that is rewritten a thousand times in one
 *     batch survive a restart byte for byte, and the rewritten one is logged
 *     once;
 *   - MANGO_DATA_RANGES=0 logs the same batches as blocks (the comparison
 *     switch), with the same result; a size sets the smallest store logged
 *     as a range; a bad value is refused before the pool is made.
 * Usage: test_data_range_entries [child off POOL]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "log/redo_log.h"
#include "mango.h"

#include "check.h"
#include "hand_pool.h"
#include "test_config.h"

/* ---- part 1: the format, on a pool built by hand ---- */


/* A frame's entries holding one data range of len bytes of `fill` at va;
 * returns the number of entries. */
static uint32_t data_entries(log_entry *e, uint64_t va, uint64_t len, int fill)
{
    memset(e, 0, sizeof *e);
    e->addr = LOG_DATA_TAG | va;
    memcpy(e->data, &len, sizeof len);
    uint64_t slots = LOG_DATA_PAYLOAD_SLOTS(len);
    memset(e + 1, 0, slots * sizeof *e);
    memset(e + 1, fill, len);
    return (uint32_t)(1 + slots);
}

static int check_n(const log_entry *e, uint32_t n)
{
    log_frame f = {.seq = 1, .n_entries = n};
    return backend_check_frame(&p, &f, e);
}

static void format_checks(void)
{
    hand_pool_setup();
    static log_entry e[512];
    uint32_t n = data_entries(e, HEAP_VA + 100, 5000, 0x11); /* any alignment */
    CHECK(n == 1 + 105);
    CHECK(log_entry_is_data(&e[0]) && !log_entry_is_zero(&e[0]) && log_entry_slots(&e[0]) == n);
    CHECK(check_n(e, n) == MANGO_OK);
    CHECK(check_n(e, n - 1) == MANGO_EBADPOOL); /* its bytes run past the frame */
    data_entries(e, HEAP_VA + HEAP_SIZE - 4000, 5000, 0x11);
    CHECK(check_n(e, n) == MANGO_EBADPOOL); /* past the heap region's end */
    data_entries(e, DATA_VA, 4096, 0x11);
    CHECK(check_n(e, 1 + 86) == MANGO_EBADPOOL); /* .data/.bss: blocks only */
    data_entries(e, 0x1000, 4096, 0x11);
    CHECK(check_n(e, 1 + 86) == MANGO_EBADPOOL); /* in no region */
    uint64_t zero = 0;
    data_entries(e, HEAP_VA, 4096, 0x11);
    memcpy(e[0].data, &zero, sizeof zero);
    CHECK(check_n(e, 1 + 86) == MANGO_EBADPOOL); /* empty */
    uint64_t huge = 1ull << 50;
    memcpy(e[0].data, &huge, sizeof huge);
    CHECK(log_entry_slots(&e[0]) == 0);
    CHECK(check_n(e, 1 + 86) == MANGO_EBADPOOL); /* absurd length */
    data_entries(e, HEAP_VA, 4096, 0x11);
    e[0].mask = 1;
    CHECK(check_n(e, 1 + 86) == MANGO_EBADPOOL); /* no mask */
    data_entries(e, HEAP_VA, 4096, 0x11);
    e[0].data[20] = 1;
    CHECK(check_n(e, 1 + 86) == MANGO_EBADPOOL); /* reserved bytes of the header */

    /* Apply, in order: zero [8192, 8192+16384); a range of 5000 bytes at
     * 10000 (over part of it); a block at 12288 (inside the range: holds
     * the content at commit, here a different fill to see the order); a
     * range of 4096 bytes at 900000. */
    uint32_t k = 0;
    memset(&e[k], 0, sizeof e[k]);
    e[k].addr = LOG_ZERO_TAG | (HEAP_VA + 8192);
    uint64_t zl = 16384;
    memcpy(e[k].data, &zl, sizeof zl);
    k++;
    k += data_entries(&e[k], HEAP_VA + 10000, 5000, 0x22);
    memset(&e[k], 0, sizeof e[k]);
    e[k].addr = HEAP_VA + 12288;
    e[k].mask = 0xffffffffu;
    memset(e[k].data, 0x33, LOG_BLOCK_SIZE);
    k++;
    k += data_entries(&e[k], HEAP_VA + 900000, 4096, 0x44);
    log_frame f = {.seq = 2, .n_entries = k};
    persist_ranges rg = {0};
    CHECK(backend_check_frame(&p, &f, e) == MANGO_OK);
    CHECK(backend_apply_frame(&p, &f, e, &rg) == MANGO_OK);
    int ok = 1;
    for (size_t i = 0; i < HEAP_SIZE && ok; i++) {
        unsigned char want = 0x5A;
        if (i >= 8192 && i < 8192 + 16384)
            want = 0;
        if (i >= 10000 && i < 15000)
            want = 0x22;
        if (i >= 12288 && i < 12288 + LOG_BLOCK_SIZE)
            want = 0x33;
        if (i >= 900000 && i < 904096)
            want = 0x44;
        if ((unsigned char)mirror[i] != want) {
            fprintf(stderr, "mirror byte %zu: %#x, expected %#x\n", i, (unsigned char)mirror[i], want);
            ok = 0;
        }
    }
    CHECK(ok);
    /* A malformed range stops the apply with an error. */
    n = data_entries(e, HEAP_VA + HEAP_SIZE - 32, 4096, 0x11);
    log_frame fb = {.seq = 3, .n_entries = n};
    CHECK(backend_apply_frame(&p, &fb, e, &rg) == MANGO_EBADPOOL);
    free(mirror);
}

/* ---- part 2: end to end ---- */

#define BIG (120u << 10) /* two of them fit a frame of the 1 MiB log, as blocks too */
typedef struct state {
    char *a, *b;       /* BIG bytes each */
    char *small;       /* 4 KiB written in 64-byte pieces: blocks */
    uint64_t round;
} state;
static state *st;

static void init_state(void *arg)
{
    (void)arg;
    st = calloc(1, sizeof *st);
    st->a = calloc(1, BIG);
    st->b = calloc(1, BIG);
    st->small = calloc(1, 4096);
    mango_capture(&st, sizeof st);
    mango_capture(st, sizeof *st);
}
static bool is_ro(void *c) { (void)c; return false; }
static void nop(void *c) { (void)c; }

static int start(const char *pool)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED); /* 1 MiB log */
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nop, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static void fill(char *d, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        d[i] = (char)((i * 131 + seed * 7) >> 3);
}

/* One batch of round r; want_a/want_b: the expected content afterwards. */
static void batch(uint64_t r, char *want_a, char *want_b)
{
    CHECK(mango_batch_begin() == MANGO_OK);
    fill(want_a, BIG, r);
    memcpy(st->a, want_a, BIG); /* one large copy */
    /* Overlapping rewrites of b: [0, 80K), [40K, 120K), [20K, 30K). */
    fill(want_b, BIG, r + 1000);
    memcpy(st->b, want_b, 80u << 10);
    memcpy(st->b + (40u << 10), want_b + (40u << 10), 80u << 10);
    memcpy(st->b + (20u << 10), want_b + (20u << 10), 10u << 10);
    /* The same 8 KiB of a, rewritten 1000 times: the last write stands. */
    for (int i = 0; i < 1000; i++) {
        memset(want_a + 8192, i & 0xff, 8192);
        memcpy(st->a + 8192, want_a + 8192, 8192);
    }
    /* Beside a range: small stores (blocks). */
    for (int i = 0; i < 64; i++)
        memset(st->small + 64 * i, (int)(r + i), 64);
    st->round = r;
    mango_capture(&st->round, sizeof st->round);
    CHECK(mango_batch_end() == MANGO_OK);
}

static int same_state(const char *want_a, const char *want_b, uint64_t r)
{
    if (st->round != r || memcmp(st->a, want_a, BIG) != 0 || memcmp(st->b, want_b, BIG) != 0)
        return 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++)
            if (st->small[64 * i + j] != (char)(r + i))
                return 0;
    return 1;
}

/* Three batches, a restart, the state checked; returns the log bytes. */
static uint64_t end_to_end(const char *pool, int ranges_expected)
{
    unlink(pool);
    if (start(pool) != MANGO_FRESH) {
        CHECK(!"start");
        return 0;
    }
    char *want_a = malloc(BIG), *want_b = malloc(BIG); /* (outside batches: transient) */
    mango_stats s0, s1;
    mango_get_stats(&s0);
    for (uint64_t r = 1; r <= 3; r++)
        batch(r, want_a, want_b);
    mango_get_stats(&s1);
    uint64_t bytes = s1.log_bytes - s0.log_bytes, ranges = s1.log_data_ranges - s0.log_data_ranges;
    printf("data ranges %s: %llu logged (%llu bytes of them), %llu log bytes for 3 batches\n",
           ranges_expected ? "on" : "off", (unsigned long long)ranges,
           (unsigned long long)(s1.log_data_bytes - s0.log_data_bytes), (unsigned long long)bytes);
    if (ranges_expected) {
        /* Per batch: a (its 8 KiB rewrites inside it) and b's three copies
         * merged into one: two ranges of BIG bytes. */
        CHECK(ranges == 6 && s1.log_data_bytes - s0.log_data_bytes == 6ull * BIG);
        CHECK(bytes < 3 * (2 * BIG + 64 * 1024));
    } else {
        CHECK(ranges == 0);
        CHECK(bytes > 3 * (2 * BIG / 32 * 48));
    }
    CHECK(same_state(want_a, want_b, 3));
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(start(pool) == MANGO_RECOVERED);
    CHECK(same_state(want_a, want_b, 3));
    /* And a crash-free restart after one more batch applied by recovery. */
    batch(4, want_a, want_b);
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(start(pool) == MANGO_RECOVERED);
    CHECK(same_state(want_a, want_b, 4));
    CHECK(mango_shutdown() == MANGO_OK);
    free(want_a);
    free(want_b);
    unlink(pool);
    return bytes;
}

/* MANGO_DATA_RANGES: bad values are refused before the pool is made; a size
 * sets the smallest store logged as a range. */
static void setting_checks(const char *pool)
{
    static const char *bad[] = {"abc", "100", "-5", "4096x", "2000000000", "255",
                                 /* (strtoull took these; the last wrapped around to 512) */
                                 " 512", "+512", " -18446744073709551104"};
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unlink(pool);
        setenv("MANGO_DATA_RANGES", bad[i], 1);
        int rc = start(pool);
        CHECK(rc == MANGO_EINVAL && strstr(mango_last_error(), "MANGO_DATA_RANGES") != NULL);
        CHECK(access(pool, F_OK) != 0); /* nothing made */
        if (rc >= 0)
            mango_shutdown();
    }
    printf("a bad value: %s\n", mango_last_error());
    setenv("MANGO_DATA_RANGES", "2048", 1);
    unlink(pool);
    if (start(pool) != MANGO_FRESH) {
        CHECK(!"start with MANGO_DATA_RANGES=2048");
        unsetenv("MANGO_DATA_RANGES");
        return;
    }
    char src[3000];
    memset(src, 7, sizeof src);
    mango_stats a, b, c;
    mango_get_stats(&a);
    CHECK(mango_batch_begin() == MANGO_OK);
    memcpy(st->a, src, 3000); /* a range at this setting */
    CHECK(mango_batch_end() == MANGO_OK);
    mango_get_stats(&b);
    CHECK(mango_batch_begin() == MANGO_OK);
    memcpy(st->b, src, 2000); /* blocks */
    CHECK(mango_batch_end() == MANGO_OK);
    mango_get_stats(&c);
    CHECK(b.log_data_ranges - a.log_data_ranges == 1 && b.log_data_bytes - a.log_data_bytes == 3000);
    CHECK(c.log_data_ranges == b.log_data_ranges);
    CHECK(mango_shutdown() == MANGO_OK);
    unsetenv("MANGO_DATA_RANGES");
    unlink(pool);
}

int main(int argc, char **argv)
{
    char pool[64];
    if (argc == 4 && strcmp(argv[1], "child") == 0 && strcmp(argv[2], "off") == 0) {
        end_to_end(argv[3], 0);
        return check_report("test_data_range_entries (MANGO_DATA_RANGES=0)");
    }
    format_checks();
    snprintf(pool, sizeof pool, "/dev/shm/mango-drange-%d.pool", (int)getpid());
    end_to_end(pool, 1);
    setting_checks(pool);
    /* MANGO_DATA_RANGES is read at mango_init: a child process with it off. */
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MANGO_DATA_RANGES", "0", 1);
        execl("/proc/self/exe", "test_data_range_entries", "child", "off", pool, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return check_report("test_data_range_entries");
}
