/* test_backend_cadence.c -- when the backend applies the log (backend.c,
 * emulated mode; the thread at normal priority, so that scheduling does not
 * decide the timings checked here):
 *   - small commits a millisecond apart start no round for a second: the
 *     backend is not woken per commit nor every millisecond;
 *   - a second after the first commit it applies what waits, and not before;
 *   - a mebibyte of committed log starts a round at once, long before that
 *     second, while less than a mebibyte does not;
 *   - with a 1 MiB log the threshold is an eighth of it (128 KiB).
 * Then the state comes back after a restart. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

#define BUF_BYTES (64u << 10)
#include "durable_buffer.h"

static unsigned turn, write_bytes = 256;

static bool is_ro(void *c) { (void)c; return false; }
static void write_chunk(void *c)
{
    (void)c;
    turn++;
    write_slot(turn - 1, write_bytes, (int)turn);
}

static char pool_path[64];

static int start(size_t log_size)
{
    mango_config cfg;
    small_test_config(&cfg, pool_path, MANGO_PERSIST_EMULATED);
    cfg.log_size = log_size;
    cfg.backend_priority = MANGO_BACKEND_PRIORITY_NORMAL;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = write_chunk, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static mango_stats stats(void)
{
    mango_stats st;
    mango_get_stats(&st);
    return st;
}

static bool command(void)
{
    int x = 0;
    return mango_client_cmd(&x) == 0;
}

/* Waits up to 5 s for the backend to have applied everything. */
static bool await_applied(void)
{
    for (int i = 0; i < 5000; i++) {
        if (stats().log_unapplied_bytes == 0)
            return true;
        usleep(1000);
    }
    return false;
}

/* Waits up to 5 s for a backend round after syncs0 (two syncs a round);
 * returns when it was seen, or -1. */
static double await_round(uint64_t syncs0)
{
    for (int i = 0; i < 5000; i++) {
        if (stats().backend_syncs > syncs0)
            return now_s();
        usleep(1000);
    }
    return -1;
}

/* Commits write_bytes-sized commands until at least bytes more of log were
 * written; false if a command failed. */
static bool commit_log_bytes(uint64_t bytes)
{
    uint64_t log0 = stats().log_bytes;
    while (stats().log_bytes - log0 < bytes)
        if (!command())
            return false;
    return true;
}

int main(void)
{
    snprintf(pool_path, sizeof pool_path, "/dev/shm/mango-cadence-%d.pool", (int)getpid());
    unsetenv("MANGO_BACKEND_PRIORITY");
    unlink(pool_path);

    /* A 16 MiB log: an eighth is 2 MiB, so the threshold is the mebibyte. */
    CHECK(start(16u << 20) == MANGO_FRESH);
    CHECK(await_applied()); /* the initial batch */
    mango_stats st = stats();
    CHECK(st.log_capacity >= (15u << 20));

    /* Small commits a millisecond apart for about 0.2 s. */
    uint64_t syncs0 = st.backend_syncs;
    double t0 = now_s();
    for (int i = 0; i < 200; i++) {
        CHECK(command());
        usleep(1000);
    }
    double elapsed = now_s() - t0;
    st = stats();
    printf("200 small commits over %.3f s: backend syncs +%llu, %llu bytes unapplied\n", elapsed,
           (unsigned long long)(st.backend_syncs - syncs0), (unsigned long long)st.log_unapplied_bytes);
    if (elapsed < 0.9) {
        CHECK(st.backend_syncs == syncs0); /* no round yet */
        CHECK(st.log_unapplied_bytes > 0);
    } else { /* a very slow machine: at most a round a second */
        CHECK(st.backend_syncs - syncs0 <= 2 * (uint64_t)(elapsed + 1));
    }
    CHECK(st.log_unapplied_bytes < (1u << 20));

    /* A second after the first commit, what waits is applied. */
    double t1 = await_round(syncs0);
    CHECK(t1 > 0);
    printf("the first round came %.3f s after the first commit\n", t1 - t0);
    CHECK(t1 - t0 >= 0.95);
    CHECK(await_applied());

    /* Three quarters of a mebibyte, written at once: no round for them
     * (checked 0.2 s later, well inside the second). */
    write_bytes = 8u << 10;
    syncs0 = stats().backend_syncs;
    t0 = now_s();
    CHECK(commit_log_bytes(3u << 18));
    usleep(200000);
    st = stats();
    elapsed = now_s() - t0;
    printf("768 KiB of log: backend syncs +%llu after %.3f s\n", (unsigned long long)(st.backend_syncs - syncs0),
           elapsed);
    if (elapsed < 0.9)
        CHECK(st.backend_syncs == syncs0);
    /* Past the mebibyte: a round at once. */
    CHECK(commit_log_bytes(1u << 19));
    t1 = await_round(syncs0);
    CHECK(t1 > 0);
    printf("past 1 MiB of log: a round %.3f s after the first of those commits\n", t1 - t0);
    CHECK(t1 - t0 < 0.9);
    CHECK(await_applied());
    unsigned last_turn = turn;
    CHECK(mango_shutdown() == MANGO_OK);

    /* The state comes back. */
    CHECK(start(16u << 20) == MANGO_RECOVERED);
    unsigned last = (last_turn - 1) * write_bytes % BUF_BYTES;
    CHECK(buf[last] == (unsigned char)last_turn && buf[last + write_bytes - 1] == (unsigned char)last_turn);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool_path);

    /* A 1 MiB log: the threshold is an eighth of it. */
    turn = 0;
    CHECK(start(1u << 20) == MANGO_FRESH);
    CHECK(await_applied());
    syncs0 = stats().backend_syncs;
    t0 = now_s();
    CHECK(commit_log_bytes(160u << 10));
    t1 = await_round(syncs0);
    CHECK(t1 > 0);
    printf("1 MiB log, 160 KiB committed: a round %.3f s after the first commit\n", t1 - t0);
    CHECK(t1 - t0 < 0.9);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool_path);
    return check_report("test_backend_cadence");
}
