/* test_scratch.c -- scratch memory (mango_scratch, MANGO_SCRATCH): a block
 * whose written bytes are all scratch is left out of the log, a batch that
 * wrote only scratch commits nothing, a block that also holds a written
 * byte that is not scratch is logged whole; bad ranges are refused; the
 * ranges are forgotten at mango_shutdown (the section's come back at the
 * next mango_init). Then a kill loop in sim mode: a scratch-only batch's
 * ticket still waits for the batches before it (every acknowledged counter
 * survives), and what recovery finds in scratch bytes is what was logged. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "kill_child.h"
#include "test_config.h"

/* In the durable heap, 32-byte aligned: counter and stat share a block,
 * stat2 has one of its own. */
typedef struct state {
    _Alignas(32) uint64_t counter;
    uint64_t stat; /* scratch */
    uint64_t pad[2];
    uint64_t stat2; /* scratch, alone in its block */
    uint64_t pad2[3];
} state;

static state *st;                              /* .bss, durable */
static uint64_t g_value;                       /* .bss, durable */
static uint64_t g_cursor MANGO_SCRATCH = 7;    /* scratch from mango_init on */
static char *big_area;                         /* 1 MiB in the durable heap */

static void init_state(void *arg)
{
    (void)arg;
    void *raw = malloc(sizeof(state) + 32);
    st = (state *)(((uintptr_t)raw + 31) & ~(uintptr_t)31);
    memset(st, 0, sizeof *st);
    big_area = malloc(1 << 20);
    mango_capture(&st, sizeof st);
    mango_capture(&big_area, sizeof big_area);
    mango_capture(st, sizeof *st);
}
static bool is_ro(void *c) { (void)c; return false; }
static void nop(void *c) { (void)c; }

static int start(const char *pool, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nop, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static void set(void *p, uint64_t v)
{
    *(uint64_t *)p = v;
    mango_capture(p, sizeof v);
}

typedef struct delta {
    uint64_t log_blocks, dropped, scratch_batches, syncs, batches;
} delta;

static void snap(delta *d)
{
    mango_stats s;
    mango_get_stats(&s);
    d->log_blocks = s.log_blocks;
    d->dropped = s.scratch_blocks_dropped;
    d->scratch_batches = s.scratch_batches;
    d->syncs = s.frontend_syncs;
    d->batches = s.batches;
}

/* One batch writing the n addresses; the stats it moved. */
static delta batch_writing(void **addrs, int n, uint64_t v)
{
    delta a, b;
    snap(&a);
    CHECK(mango_batch_begin() == MANGO_OK);
    for (int i = 0; i < n; i++)
        set(addrs[i], v);
    CHECK(mango_batch_end() == MANGO_OK);
    snap(&b);
    delta d = {b.log_blocks - a.log_blocks, b.dropped - a.dropped, b.scratch_batches - a.scratch_batches,
               b.syncs - a.syncs, b.batches - a.batches};
    return d;
}

static void in_process_checks(const char *pool)
{
    unlink(pool);
    uint64_t local = 0;
    CHECK(mango_scratch(&g_value, 8) == MANGO_EINVAL); /* before mango_init */
    CHECK(start(pool, MANGO_PERSIST_EMULATED) == MANGO_FRESH);
    CHECK(mango_scratch(&local, sizeof local) == MANGO_EINVAL); /* the stack is not durable */
    printf("stack: %s\n", mango_last_error());
    CHECK(mango_scratch(NULL, 8) == MANGO_EINVAL);
    CHECK(mango_scratch(&g_value, 0) == MANGO_OK); /* nothing to mark */
    CHECK(mango_scratch(big_area, 96 << 10) == MANGO_EINVAL); /* 3072 blocks: more than the table takes */
    printf("too large: %s\n", mango_last_error());
    CHECK(mango_scratch(&st->stat, sizeof st->stat) == MANGO_OK);
    CHECK(mango_scratch(&st->stat2, sizeof st->stat2) == MANGO_OK);
    CHECK(mango_scratch(&st->stat2, sizeof st->stat2) == MANGO_OK); /* again: no harm */

    /* Only scratch: nothing logged, no sync, one batch counted. */
    void *only[] = {&st->stat2, &g_cursor, &st->stat};
    delta d = batch_writing(only, 3, 1);
    printf("scratch only: logged %llu, dropped %llu, syncs %llu\n", (unsigned long long)d.log_blocks,
           (unsigned long long)d.dropped, (unsigned long long)d.syncs);
    CHECK(d.batches == 1 && d.log_blocks == 0 && d.dropped == 3 && d.scratch_batches == 1 && d.syncs == 0);
    /* The refused 96 KiB range left nothing behind: its blocks are logged. */
    void *big[] = {big_area + 4096};
    d = batch_writing(big, 1, 2);
    CHECK(d.log_blocks == 1 && d.dropped == 0);
    /* A block with a written non-scratch byte is logged whole. */
    void *shared[] = {&st->counter, &st->stat};
    d = batch_writing(shared, 2, 3);
    CHECK(d.log_blocks == 1 && d.dropped == 0 && d.scratch_batches == 0 && d.syncs == 1);
    /* Only the pure-scratch block of a batch is dropped. */
    void *mixed[] = {&g_value, &g_cursor, &st->stat2};
    d = batch_writing(mixed, 3, 4);
    CHECK(d.log_blocks == 1 && d.dropped == 2 && d.scratch_batches == 0);
    /* Beyond the primary set (the spill set) and beyond a log frame (a big
     * batch, through the big-batch file): the scratch block written last is
     * still dropped, every other block logged. */
    for (int n = 3000; n <= 24000; n += 21000) {
        delta a, b;
        mango_stats s0, s1;
        mango_get_stats(&s0);
        snap(&a);
        CHECK(mango_batch_begin() == MANGO_OK);
        for (int k = 0; k < n; k++)
            set(big_area + 32 * k, (uint64_t)k + 1);
        set(&st->stat2, (uint64_t)n);
        CHECK(mango_batch_end() == MANGO_OK);
        snap(&b);
        mango_get_stats(&s1);
        printf("%d blocks and a scratch one: logged %llu, dropped %llu, big batches %llu\n", n,
               (unsigned long long)(b.log_blocks - a.log_blocks), (unsigned long long)(b.dropped - a.dropped),
               (unsigned long long)(s1.big_batches - s0.big_batches));
        CHECK(b.log_blocks - a.log_blocks == (uint64_t)n && b.dropped - a.dropped == 1);
        CHECK(s1.big_batches - s0.big_batches == (n > 10000)); /* 24 000 blocks: more than a frame of the 1 MiB log */
    }
    /* A partly written scratch block: still only scratch bytes. */
    d = batch_writing((void *[]){(char *)&st->stat2 + 4}, 1, 5); /* writes bytes 4..11 of stat2 and the pad */
    CHECK(d.log_blocks == 1 && d.dropped == 0); /* 4 bytes past stat2 are not scratch */
    CHECK(mango_shutdown() == MANGO_OK);

    /* A new mango_init forgets mango_scratch's ranges and marks the
     * MANGO_SCRATCH globals again. */
    CHECK(start(pool, MANGO_PERSIST_EMULATED) == MANGO_RECOVERED);
    void *heap_stat[] = {&st->stat2};
    d = batch_writing(heap_stat, 1, 6);
    CHECK(d.log_blocks == 1 && d.dropped == 0);
    void *cursor[] = {&g_cursor};
    d = batch_writing(cursor, 1, 7);
    CHECK(d.log_blocks == 0 && d.dropped == 1 && d.scratch_batches == 1);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);

    /* Without a durable mode it is a no-op. */
    CHECK(start(pool, MANGO_PERSIST_NONE) == MANGO_FRESH);
    CHECK(mango_scratch(&local, sizeof local) == MANGO_OK);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
}

/* A range spanning three blocks from an unaligned start to an unaligned
 * end marks exactly its bytes; a free of heap memory unmarks it, so that
 * the allocator's own writes there are logged (a heap whose free-list links
 * were dropped would be refused by MANGO_CHECK_HEAP=1 after a restart). */
static void edge_and_free_checks(const char *pool)
{
    unlink(pool);
    setenv("MANGO_CHECK_HEAP", "1", 1);
    CHECK(start(pool, MANGO_PERSIST_EMULATED) == MANGO_FRESH);
    char *base = big_area + 32 * 100; /* big_area is a large chunk's payload, 16-aligned: */
    base = (char *)(((uintptr_t)base + 31) & ~(uintptr_t)31);
    CHECK(mango_scratch(base + 30, 40) == MANGO_OK); /* bytes 30..69: blocks 0 (30-31), 1, 2 (64-69) */
    struct { int off, len; uint64_t logged, dropped; } cases[] = {
        {29, 1, 1, 0}, {30, 1, 0, 1}, {30, 2, 0, 1}, {31, 2, 0, 2}, {32, 32, 0, 1}, {69, 1, 0, 1},
        {70, 1, 1, 0}, {60, 12, 1, 1}, {29, 42, 2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        delta a, b;
        snap(&a);
        CHECK(mango_batch_begin() == MANGO_OK);
        memset(base + cases[i].off, (int)i + 1, (size_t)cases[i].len);
        mango_capture(base + cases[i].off, (size_t)cases[i].len);
        CHECK(mango_batch_end() == MANGO_OK);
        snap(&b);
        bool ok = b.log_blocks - a.log_blocks == cases[i].logged && b.dropped - a.dropped == cases[i].dropped;
        if (!ok)
            printf("bytes %d..%d: logged %llu (want %llu), dropped %llu (want %llu)\n", cases[i].off,
                   cases[i].off + cases[i].len - 1, (unsigned long long)(b.log_blocks - a.log_blocks),
                   (unsigned long long)cases[i].logged, (unsigned long long)(b.dropped - a.dropped),
                   (unsigned long long)cases[i].dropped);
        CHECK(ok);
    }

    /* An object of its own (a chunk: its free writes links into it). */
    CHECK(mango_batch_begin() == MANGO_OK);
    char *obj = malloc(512);
    memset(obj, 0xAB, 512); /* (logged: what a dropped free-list link would leave in the mirror) */
    mango_capture(obj, 512);
    st->pad[0] = (uint64_t)(uintptr_t)obj; /* reachable */
    mango_capture(&st->pad[0], 8);
    CHECK(mango_batch_end() == MANGO_OK);
    CHECK(mango_scratch(obj, 512) == MANGO_OK);
    void *in_obj[] = {obj + 64};
    delta d = batch_writing(in_obj, 1, 1);
    CHECK(d.log_blocks == 0 && d.dropped == 1);
    delta a, b;
    snap(&a);
    CHECK(mango_batch_begin() == MANGO_OK);
    free(obj);
    st->pad[0] = 0;
    mango_capture(&st->pad[0], 8);
    CHECK(mango_batch_end() == MANGO_OK);
    snap(&b);
    printf("free of a scratch object: logged %llu blocks, dropped %llu\n",
           (unsigned long long)(b.log_blocks - a.log_blocks), (unsigned long long)(b.dropped - a.dropped));
    CHECK(b.dropped - a.dropped == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    int rc = start(pool, MANGO_PERSIST_EMULATED); /* walks the heap first: the freed chunk's links */
    if (rc != MANGO_RECOVERED)
        printf("restart after the free: %d %s\n", rc, mango_last_error());
    CHECK(rc == MANGO_RECOVERED);
    CHECK(rc != MANGO_RECOVERED || mango_shutdown() == MANGO_OK);
    unsetenv("MANGO_CHECK_HEAP");
    unlink(pool);
}

/* ---- the kill loop ---- */

static int open_marked(const char *mode, const char *pool, int want)
{
    int rc = start(pool, test_mode_named(mode));
    if (rc != want && !(want == -100 && (rc == MANGO_FRESH || rc == MANGO_RECOVERED))) {
        fprintf(stderr, "mango_init: %d %s\n", rc, mango_last_error());
        return rc < 0 ? rc : -1;
    }
    if (mango_scratch(&st->stat, 8) || mango_scratch(&st->stat2, 8))
        return -1;
    return rc;
}

/* Counter batch i (counter = i; its block carries stat = i - 1), then a
 * scratch-only batch (stat = stat2 = g_cursor = i), submitted; the counter
 * is reported once the scratch-only batch's ticket is durable. */
static int child(const char *mode, const char *pool, int fd)
{
    if (open_marked(mode, pool, -100) < 0)
        return 2;
    uint64_t i = st->counter;
    if (mango_batch_begin() != MANGO_OK) /* stat as the scratch batch after counter i set it */
        return 3;
    set(&st->stat, i);
    if (mango_batch_end() != MANGO_OK)
        return 3;
    for (;;) {
        i++;
        uint64_t t;
        if (mango_batch_begin() != MANGO_OK)
            return 3;
        set(&st->counter, i);
        if (mango_batch_submit(&t) != MANGO_OK || mango_batch_begin() != MANGO_OK) {
            fprintf(stderr, "child: %s\n", mango_last_error());
            return 3;
        }
        set(&st->stat, i);
        set(&st->stat2, i);
        set(&g_cursor, i);
        if (mango_batch_submit(&t) != MANGO_OK || mango_wait_durable(t) != MANGO_OK) {
            fprintf(stderr, "child: %s\n", mango_last_error());
            return 3;
        }
        if (write(fd, &i, sizeof i) != sizeof i)
            return 4;
    }
}

static int verify(const char *mode, const char *pool, uint64_t acked)
{
    int rc = open_marked(mode, pool, MANGO_RECOVERED);
    if (rc < 0)
        return 2;
    uint64_t c = st->counter, s = st->stat, s2 = st->stat2, g = g_cursor;
    mango_shutdown();
    /* The counter's block was logged whole: with it, stat as the scratch
     * batch before set it. stat2's and g_cursor's blocks never were. */
    bool ok = c >= acked && s == (c ? c - 1 : 0) && s2 == 0 && g == 7;
    if (!ok)
        fprintf(stderr, "recovered counter %llu (acked %llu), stat %llu, stat2 %llu, g_cursor %llu\n",
                (unsigned long long)c, (unsigned long long)acked, (unsigned long long)s,
                (unsigned long long)s2, (unsigned long long)g);
    return ok ? 0 : 1;
}

static void kill_loop(const char *pool, int rounds)
{
    unlink(pool);
    uint64_t acked = 0;
    int lost = 0, bad = 0;
    srand((unsigned)getpid());
    for (int r = 0; r < rounds; r++) {
        bad += !kill_child_round("test_scratch", "sim", pool, 20, 150, &acked);
        char txt[32];
        snprintf(txt, sizeof txt, "%llu", (unsigned long long)acked);
        lost += kill_child_run("test_scratch", "verify", "sim", pool, txt) != 0;
    }
    printf("kill loop (sim): rounds=%d acked=%llu lost=%d\n", rounds, (unsigned long long)acked, lost);
    CHECK(bad == 0);
    CHECK(lost == 0);
    CHECK(acked >= 10);
    unlink(pool);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 5 && strcmp(argv[1], "child") == 0)
        return child(argv[2], argv[3], atoi(argv[4]));
    if (argc >= 5 && strcmp(argv[1], "verify") == 0)
        return verify(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    char pool[96];
    snprintf(pool, sizeof pool, "/dev/shm/mango-scratch-%d.pool", (int)getpid());
    in_process_checks(pool);
    edge_and_free_checks(pool);
    kill_loop(pool, argc >= 3 && strcmp(argv[1], "kill") == 0 ? atoi(argv[2]) : 10);
    return check_report("test_scratch");
}
