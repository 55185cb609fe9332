/* capture_cost.c -- what capture costs per store, measured inside the runtime.
 *
 * Built twice from this file: `capture_cost` through the mango-cc plugin and
 * `capture_cost_plain` without it (the uninstrumented baseline). Each prints
 * one line per measurement: `name=... ns=...` (bench/capture_bench.py puts the
 * two side by side).
 *
 *   store_transient    stores to transient memory outside any command
 *                      (instrumented build: the inactive TLS check only)
 *   store_active_hot   stores inside a read-write command to one 4 KiB durable
 *                      buffer: the capture call plus a dedup hit per store
 *   store_active_wide  the same over 1 MiB, each word stored once (one pass):
 *                      a new block every 4th store, the set fills and spills
 *                      to the overflow buffer. (Until session 39 it made
 *                      2 000 000 stores, 15 passes, so after the first pass
 *                      every store hit the set: a new block every 61st store
 *                      on the whole; found by a review.)
 *   fill_memcpy_100k   a 100 KB value copied into durable memory with memcpy:
 *                      one range capture (plugin) per copy; time per copy,
 *                      commit included
 *   fill_loop_100k     the same value copied by an 8-byte store loop the
 *                      compiler may not turn into memcpy: one capture per
 *                      store; commit included
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#define HOT_BYTES 4096u
#define WIDE_BYTES (1u << 20)
#define FILL_BYTES 102400u

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Durable state (.bss pointers to durable heap buffers). */
static uint64_t *hot, *wide;
static char *value_dst;

/* The store loop under test: a stride that defeats vectorisation and memset
 * idiom recognition, so every iteration is one scalar 8-byte store. */
__attribute__((noinline)) static void store_loop(uint64_t *buf, uint64_t mask, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        buf[(i * 7) & mask] = i;
}

__attribute__((noinline)) static void copy_loop(uint64_t *dst, const uint64_t *src, size_t words)
{
    for (size_t i = 0; i < words; i++) {
        dst[i] = src[i];
        __asm__ volatile("" ::: "memory"); /* keep it a loop of stores */
    }
}

typedef struct cmd {
    int what;
    uint64_t n;
    const char *src;
    double seconds; /* measured inside the command */
} cmd;

enum { INIT, HOT, WIDE, FILL_MEMCPY, FILL_LOOP };

static bool is_ro(void *c) { return false; }

static void process(void *arg)
{
    cmd *c = arg;
    double t0 = now();
    switch (c->what) {
    case INIT:
        hot = malloc(HOT_BYTES);
        wide = malloc(WIDE_BYTES);
        value_dst = malloc(FILL_BYTES);
        memset(hot, 0, HOT_BYTES);
        memset(wide, 0, WIDE_BYTES);
        memset(value_dst, 0, FILL_BYTES);
        break;
    case HOT:
        store_loop(hot, HOT_BYTES / 8 - 1, c->n);
        break;
    case WIDE:
        store_loop(wide, WIDE_BYTES / 8 - 1, c->n);
        break;
    case FILL_MEMCPY:
        memcpy(value_dst, c->src, FILL_BYTES);
        break;
    case FILL_LOOP:
        copy_loop((uint64_t *)value_dst, (const uint64_t *)c->src, FILL_BYTES / 8);
        break;
    }
    c->seconds = now() - t0;
}

static void run(cmd *c)
{
    int rc = mango_client_cmd(c);
    if (rc) {
        fprintf(stderr, "capture_cost: %s\n", mango_last_error());
        exit(2);
    }
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

int main(int argc, char **argv)
{
    const char *pool = argc > 1 ? argv[1] : "/dev/shm/mango-capture-cost.pool";
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    unlink(pool);
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = pool;
    cfg.mode = MANGO_PERSIST_EMULATED;
    cfg.pool_size = 256u << 20;
    cfg.log_size = 64u << 20;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process};
    int st = mango_init(&cfg, &cb);
    if (st < 0) {
        fprintf(stderr, "capture_cost: %s\n", mango_last_error());
        return 2;
    }
    cmd init = {.what = INIT};
    run(&init);

    const uint64_t n = 2000000; /* stores per measurement */
    double v[32];
    if (reps > 32)
        reps = 32;

    /* Inactive: transient memory, outside any command. */
    uint64_t *transient = malloc(HOT_BYTES);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        store_loop(transient, HOT_BYTES / 8 - 1, n);
        v[r] = (now() - t0) / n * 1e9;
    }
    printf("name=store_transient ns=%.3f\n", median(v, reps));

    for (int r = 0; r < reps; r++) {
        cmd c = {.what = HOT, .n = n};
        run(&c);
        v[r] = c.seconds / n * 1e9;
    }
    printf("name=store_active_hot ns=%.3f\n", median(v, reps));

    const uint64_t wide_n = WIDE_BYTES / 8; /* one pass: store_loop's stride visits every word once */
    for (int r = 0; r < reps; r++) {
        cmd c = {.what = WIDE, .n = wide_n};
        run(&c);
        v[r] = c.seconds / wide_n * 1e9;
    }
    printf("name=store_active_wide ns=%.3f\n", median(v, reps));

    char *src = malloc(FILL_BYTES);
    for (size_t i = 0; i < FILL_BYTES; i++)
        src[i] = (char)(i * 31);
    const int fills = 200;
    for (int what = FILL_MEMCPY; what <= FILL_LOOP; what++) {
        mango_stats s0, s1;
        for (int r = 0; r < reps; r++) {
            mango_get_stats(&s0);
            double t0 = now();
            for (int k = 0; k < fills; k++) {
                cmd c = {.what = what, .src = src};
                run(&c);
            }
            v[r] = (now() - t0) / fills * 1e9;
            mango_get_stats(&s1);
        }
        printf("name=%s ns=%.0f log_bytes_per_fill=%.0f\n",
               what == FILL_MEMCPY ? "fill_memcpy_100k" : "fill_loop_100k", median(v, reps),
               (double)(s1.log_bytes - s0.log_bytes) / fills);
    }
    mango_shutdown();
    unlink(pool);
    return 0;
}
