/* test_capture_fastpath.c -- the inline capture fast path, checked by the
 * capture verifier (built with the MangoCapture plugin; see CMakeLists.txt).
 *
 * Usage: test_capture_fastpath_{O0,O2} fast|off
 *   fast: the fast path is on (the default runtime configuration)
 *   off:  run with MANGO_CAPTURE_FASTPATH=0 (every capture calls the runtime)
 *
 * One runtime, local-mode commands, each its own batch, each checked by the
 * verifier (every changed durable byte must be in the batch's dedup set):
 *   A. single-block stores of 1..32 bytes into one durable heap buffer
 *      (fast: no slow-path call at all);
 *   B. stores crossing a 32-byte block (slow path);
 *   C. stores to .data and .bss globals (outside the heap: slow path);
 *   D. 32768 distinct blocks in one batch, each written twice: past the
 *      primary set's load limit, into the spill set;
 *   E. 16 blocks with the same home slot, each written twice (probe chains
 *      longer than the fast path follows: slow path);
 *   F. all of the above in one batch;
 *   G. stores to transient memory (a buffer mapped before mango_init): with
 *      the fast path on and the durable ranges all known to it (covers_all),
 *      no slow-path call and nothing logged.
 * Slow-path calls are counted by wrapping mango_capture (-Wl,--wrap).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mango.h"

#include "../../unit/check.h"

/* ---- slow-path counter (transient memory: not durable, not verified) ---- */

static uint64_t *slow_calls; /* mmap'd before mango_init */

void __real_mango_capture(const void *addr, size_t len);
__attribute__((annotate("mango_no_capture"), noinline)) void __wrap_mango_capture(const void *addr,
                                                                                  size_t len)
{
    if (mango_capture_active)
        ++*slow_calls;
    __real_mango_capture(addr, len);
}

/* ---- durable state ---- */

#define HOT_BYTES 4096u
#define WIDE_BYTES (1u << 20)
#define WIDE_BLOCKS (WIDE_BYTES / 32)
#define COLLIDE_STRIDE (4096u * 32u) /* blocks this far apart share a home slot */
#define COLLIDE_N 16u

static unsigned char *transient_buf; /* 4 KiB, mmap'd before mango_init: not durable */
static unsigned char *hot;     /* 4 KiB, 32-byte aligned */
static unsigned char *wide;    /* 1 MiB */
static unsigned char *collide; /* COLLIDE_N * COLLIDE_STRIDE + 32 */
static uint64_t g_data[64] = {1, 2, 3};   /* .data */
static uint32_t g_bss[512];              /* .bss */
static unsigned char g_bss_bytes[256] __attribute__((aligned(32)));

typedef struct __attribute__((packed)) crossing {
    unsigned char pad[28];
    uint64_t x; /* bytes 28..35: crosses the block */
    unsigned char pad2[11];
    uint32_t y; /* bytes 47..50 */
} crossing;

typedef struct blk32 {
    uint64_t w[4];
} __attribute__((aligned(32))) blk32;

/* ---- workloads (noinline: each is its own instrumented function) ---- */

__attribute__((noinline)) static void w_sizes(unsigned char *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        p[(i * 13) & (HOT_BYTES - 1)] = (unsigned char)i;                       /* 1 */
        ((uint16_t *)p)[(i * 7) & (HOT_BYTES / 2 - 1)] = (uint16_t)(i * 3);      /* 2 */
        ((uint32_t *)p)[(i * 5) & (HOT_BYTES / 4 - 1)] = (uint32_t)(i * 5 + 1);  /* 4 */
        ((uint64_t *)p)[(i * 3) & (HOT_BYTES / 8 - 1)] = i * 0x9E3779B97F4A7C15ull; /* 8 */
        __asm__ volatile("" ::: "memory");
    }
}

__attribute__((noinline)) static void w_wide_stores(unsigned char *p, uint64_t n)
{
    /* 16- and 32-byte stores, block aligned. */
    blk32 *b = (blk32 *)p;
    for (uint64_t i = 0; i < n; i++) {
        blk32 v = {{i, i + 1, i + 2, i + 3}};
        b[(i * 3) % (HOT_BYTES / 32)] = v;
        __asm__ volatile("" ::: "memory");
        memcpy(p + 16 + 32 * ((i * 5) % (HOT_BYTES / 32)), &v, 16);
        __asm__ volatile("" ::: "memory");
    }
}

__attribute__((noinline)) static void w_crossing(unsigned char *p, uint64_t seed)
{
    for (unsigned k = 0; k < 16; k++) {
        crossing *c = (crossing *)(p + 64 * k);
        c->x = seed * 31 + k;
        __asm__ volatile("" ::: "memory");
        c->y = (uint32_t)(seed + k);
        __asm__ volatile("" ::: "memory");
        uint16_t h = (uint16_t)(seed ^ k);
        memcpy(p + 64 * k + 31, &h, 2); /* bytes 31..32 */
        __asm__ volatile("" ::: "memory");
        uint64_t q[3] = {seed, ~seed, seed + k};
        memcpy(p + 1024 + 64 * k + 20, q, 24); /* 20..43 */
        __asm__ volatile("" ::: "memory");
    }
}

__attribute__((noinline)) static void w_globals(uint64_t seed)
{
    for (unsigned i = 0; i < 64; i += 3)
        g_data[i] = seed + i;
    for (unsigned i = 0; i < 512; i += 7)
        g_bss[i] = (uint32_t)(seed * i);
    g_bss_bytes[5] = (unsigned char)seed;
    g_bss_bytes[40] = (unsigned char)(seed >> 8);
}

__attribute__((noinline)) static void w_spill(unsigned char *p, uint64_t seed)
{
    /* One 8-byte store per block, then one 4-byte store elsewhere in it. */
    for (uint64_t b = 0; b < WIDE_BLOCKS; b++) {
        *(uint64_t *)(p + 32 * b + 8 * (b & 3)) = seed + b;
        __asm__ volatile("" ::: "memory");
    }
    for (uint64_t b = 0; b < WIDE_BLOCKS; b++) {
        *(uint32_t *)(p + 32 * b + 4 * ((b + 1) & 7)) = (uint32_t)(seed ^ b) | 1;
        __asm__ volatile("" ::: "memory");
    }
}

__attribute__((noinline)) static void w_collide(unsigned char *p, uint64_t seed)
{
    for (int pass = 0; pass < 2; pass++)
        for (unsigned k = 0; k < COLLIDE_N; k++) {
            *(uint32_t *)(p + (size_t)COLLIDE_STRIDE * k + 4 * pass) = (uint32_t)(seed + k + pass);
            __asm__ volatile("" ::: "memory");
        }
}

__attribute__((noinline)) static void w_transient(unsigned char *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        p[(i * 13) & 4095] = (unsigned char)i;
        ((uint64_t *)p)[(i * 3) & 511] = i;
        __asm__ volatile("" ::: "memory");
    }
}

/* ---- commands ---- */

typedef struct cmd {
    void (*fn)(uint64_t arg);
    uint64_t arg;
} cmd;

static bool is_ro(void *ctx) { (void)ctx; return false; }
static void process(void *ctx) { cmd *c = ctx; c->fn(c->arg); }

static uint64_t fast_heap_size; /* mango_capture_fastpath.heap_size, seen in a command */
static uint64_t fast_covers_all; /* and .covers_all */

static void c_setup(uint64_t arg)
{
    (void)arg;
    hot = aligned_alloc(32, HOT_BYTES);
    wide = aligned_alloc(32, WIDE_BYTES);
    /* 32-byte aligned base: the home slot depends on the block address only. */
    collide = aligned_alloc(32, (size_t)COLLIDE_N * COLLIDE_STRIDE + 32);
    memset(hot, 0, HOT_BYTES);
    memset(wide, 0, WIDE_BYTES);
    memset(collide, 0, (size_t)COLLIDE_N * COLLIDE_STRIDE + 32);
}

static void c_probe(uint64_t arg)
{
    (void)arg;
    uint64_t v = mango_capture_fastpath.heap_size;
    __atomic_store_n(&fast_heap_size, v, __ATOMIC_RELAXED);
    v = mango_capture_fastpath.covers_all;
    __atomic_store_n(&fast_covers_all, v, __ATOMIC_RELAXED);
}

static void c_nothing(uint64_t arg) { (void)arg; }
static void c_sizes(uint64_t arg) { w_sizes(hot, arg); }
static void c_wide_stores(uint64_t arg) { w_wide_stores(hot, arg); }
static void c_crossing(uint64_t arg) { w_crossing(hot, arg); }
static void c_globals(uint64_t arg) { w_globals(arg); }
static void c_spill(uint64_t arg) { w_spill(wide, arg); }
static void c_collide(uint64_t arg) { w_collide(collide, arg); }
static void c_transient(uint64_t arg) { w_transient(transient_buf, arg); }
static void c_all(uint64_t arg)
{
    w_sizes(hot, 2000);
    w_crossing(hot + 2048, arg);
    w_globals(arg + 1);
    w_collide(collide + 8, arg);
    w_spill(wide, arg + 2);
    w_wide_stores(hot, 500);
}

typedef struct outcome {
    uint64_t batches, missed, slow, log_blocks, overflow;
} outcome;

/* Slow-path calls a batch makes without any store of its own (the runtime
 * captures some of its own writes through mango_capture). */
static uint64_t base_slow, base_blocks;

static outcome run(const char *name, void (*fn)(uint64_t), uint64_t arg)
{
    mango_stats a, b;
    mango_get_stats(&a);
    uint64_t s0 = *slow_calls;
    cmd c = {fn, arg};
    int rc = mango_client_cmd(&c);
    CHECK(rc == 0);
    mango_get_stats(&b);
    outcome o = {b.verify_batches - a.verify_batches, b.verify_missed_blocks - a.verify_missed_blocks,
                 *slow_calls - s0 - base_slow, b.log_blocks - a.log_blocks - base_blocks,
                 b.overflow_blocks - a.overflow_blocks};
    printf("%-12s batches=%llu missed=%llu slow_calls=%llu log_blocks=%llu spilled=%llu\n", name,
           (unsigned long long)o.batches, (unsigned long long)o.missed, (unsigned long long)o.slow,
           (unsigned long long)o.log_blocks, (unsigned long long)o.overflow);
    CHECK(o.batches == 1);
    CHECK(o.missed == 0);
    return o;
}

int main(int argc, char **argv)
{
    bool fast = !(argc > 1 && strcmp(argv[1], "off") == 0);
    if (!fast)
        setenv("MANGO_CAPTURE_FASTPATH", "0", 1);
    slow_calls = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    transient_buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (slow_calls == MAP_FAILED || transient_buf == MAP_FAILED)
        return 2;
    char pool[256];
    snprintf(pool, sizeof pool, "/dev/shm/test_capture_fastpath.%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = pool;
    cfg.pool_size = 64ull << 20;
    cfg.log_size = 16ull << 20;
    cfg.mode = MANGO_PERSIST_EMULATED;
    cfg.verify_capture = true;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process};
    int rc = mango_init(&cfg, &cb);
    if (rc != MANGO_FRESH) {
        fprintf(stderr, "mango_init: %d %s\n", rc, mango_last_error());
        return 1;
    }

    outcome base = run("nothing", c_nothing, 0);
    base_slow = base.slow;
    base_blocks = base.log_blocks;
    run("setup", c_setup, 0);
    run("probe", c_probe, 0);
    printf("fast path %s (heap_size=%llu, covers_all=%llu)\n", fast ? "on" : "off",
           (unsigned long long)fast_heap_size, (unsigned long long)fast_covers_all);
    CHECK(fast ? fast_heap_size > 0 && fast_covers_all == 1 : fast_heap_size == 0 && fast_covers_all == 0);

    for (uint64_t r = 1; r <= 3; r++) {
        outcome o = run("sizes", c_sizes, 5000 * r);
        CHECK(fast ? o.slow == 0 : o.slow >= 5000 * r);
        CHECK(o.log_blocks == HOT_BYTES / 32 && o.overflow == 0);
        o = run("wide_stores", c_wide_stores, 1000 * r);
        CHECK(fast ? o.slow == 0 : o.slow > 0);
        o = run("crossing", c_crossing, r);
        CHECK(o.slow >= 32); /* x and the 2-byte copy cross in every record */
        o = run("globals", c_globals, r);
        /* Stores to a global with bytes between them are captured one by one
         * (the bytes between may be transient fields, session 38), each on
         * the fast path; merged, they took the slow path. */
        CHECK(fast ? o.slow == 0 : o.slow > 0);
        o = run("spill", c_spill, r);
        CHECK(o.slow <= 2 * WIDE_BLOCKS);
        /* Deduplicated exactly as by the slow path: one entry per block. */
        CHECK(o.log_blocks == WIDE_BLOCKS);
        CHECK(o.overflow == WIDE_BLOCKS - MANGO_CAPTURE_MAX_LOAD);
        if (fast)
            CHECK(o.slow < WIDE_BLOCKS); /* most go to the set or spill directly */
        o = run("collide", c_collide, r);
        /* The first 4 blocks of the chain fit the fast path's probe. */
        CHECK(fast ? o.slow >= 2 * (COLLIDE_N - 4) && o.slow < 2 * COLLIDE_N : o.slow >= 2 * COLLIDE_N);
        CHECK(o.log_blocks == COLLIDE_N && o.overflow == 0);
        run("all", c_all, r);
        o = run("transient", c_transient, 4000 * r);
        CHECK(fast ? o.slow == 0 : o.slow >= 8000 * r);
        CHECK(o.log_blocks == 0);
    }

    /* The stores really landed (and the set did not corrupt the heap). */
    CHECK(((crossing *)hot)->y != 0 || ((crossing *)hot)->x != 0);
    CHECK(g_data[3] != 0);
    CHECK(g_bss[7] != 0 && g_bss_bytes[5] != 0); /* (read: O2 keeps the stores) */
    CHECK(*(uint64_t *)(wide + 32 * 5 + 8) != 0);

    mango_stats st;
    mango_get_stats(&st);
    printf("total: verify_batches=%llu verify_missed_blocks=%llu\n",
           (unsigned long long)st.verify_batches, (unsigned long long)st.verify_missed_blocks);
    CHECK(st.verify_missed_blocks == 0);
    mango_shutdown();
    unlink(pool);
    return check_report("test_capture_fastpath");
}
