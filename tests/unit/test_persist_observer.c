/* test_persist_observer.c -- unsetting the persistence observer while a
 * persist call is in flight (persist.h).
 *
 * `kvstore powerfail` unsets its observer once it has its images, while the
 * backend thread is still applying the log. persist_sync used to test the
 * observer once and then load it again for every SYNC_RANGE event, so an
 * unset landing between the two made the backend call a NULL function
 * pointer (an intermittent SIGSEGV of the simulator under load). Each persist
 * call must report all of its events to the observer it started with.
 *
 * Part 1 is deterministic: the observer unsets itself during the first range
 * of a two-range sync. Part 2 races a syncing thread against another thread
 * that sets and unsets the observer. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "persist/persist.h"

#include "check.h"

#define POOL (64u * 1024u)

static persist_domain dom;
static char path[] = "/tmp/mango-test-persist-observer-XXXXXX";

static int n_range, n_sync, n_other;

/* Part 1: unsets itself at the first range of a sync, as the simulator's main
 * thread might do from another thread at that instant. */
static void self_unsetting(persist_event ev, const void *addr, size_t len, const char *where)
{
    if (ev == PERSIST_EV_SYNC_RANGE) {
        if (n_range++ == 0)
            persist_set_observer(NULL);
    } else if (ev == PERSIST_EV_SYNC)
        n_sync++;
    else
        n_other++;
}

/* Part 2: counts events; yields inside, to widen the window between a sync's
 * range events. */
static _Atomic uint64_t seen;
static void counting(persist_event ev, const void *addr, size_t len, const char *where)
{
    atomic_fetch_add_explicit(&seen, 1, memory_order_relaxed);
    if (ev == PERSIST_EV_SYNC_RANGE)
        sched_yield();
}

static _Atomic int stop;

static void *syncer(void *arg)
{
    persist_ranges r = {0};
    uint64_t rounds = 0;
    while (!atomic_load(&stop)) {
        /* Eight ranges that do not touch: eight SYNC_RANGE events per sync. */
        for (unsigned i = 0; i < PERSIST_MAX_RANGES; i++) {
            char *p = dom.base + i * 4096u;
            memset(p, (int)(rounds + i), 64);
            persist_note_store(p, 64, "test.store");
            persist_flush(&dom, &r, p, 64, "test.flush");
        }
        if (persist_sync(&dom, &r, "test.sync") != 0)
            break;
        rounds++;
    }
    *(uint64_t *)arg = rounds;
    return NULL;
}

int main(void)
{
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, POOL) == 0);
    char *base = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(base != MAP_FAILED);
    dom = (persist_domain){.mode = PERSIST_SIM, .base = base, .len = POOL, .fd = fd};

    /* ---- part 1: deterministic ---- */
    persist_ranges r = {0};
    memset(base, 0xa1, 64);
    memset(base + 8192, 0xb2, 64);
    persist_set_observer(self_unsetting);
    persist_flush(&dom, &r, base, 64, "test.flush");
    persist_flush(&dom, &r, base + 8192, 64, "test.flush");
    CHECK(r.n == 2);
    CHECK(persist_sync(&dom, &r, "test.sync") == 0); /* crashed here before the fix */
    /* The sync in flight reported both of its ranges and its end to the
     * observer it started with; nothing after the unset is reported. */
    CHECK(n_range == 2);
    CHECK(n_sync == 1);
    CHECK(n_other == 2); /* the two flushes before the sync */
    persist_flush(&dom, &r, base + 128, 64, "test.flush");
    CHECK(persist_sync(&dom, &r, "test.sync") == 0);
    CHECK(n_range == 2 && n_sync == 1 && n_other == 2);
    /* The sync wrote both ranges to the file (sim mode: pwrite). */
    char got[64], want[64];
    memset(want, 0xb2, sizeof want);
    CHECK(pread(fd, got, sizeof got, 8192) == (ssize_t)sizeof got && !memcmp(got, want, sizeof got));

    /* ---- part 2: a thread syncs while another sets and unsets ---- */
    uint64_t rounds = 0;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, syncer, &rounds) == 0);
    for (unsigned i = 0; i < 20000; i++) {
        persist_set_observer(counting);
        sched_yield();
        persist_set_observer(NULL);
        if (i % 64 == 0)
            usleep(10);
    }
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    CHECK(rounds > 0);
    printf("test_persist_observer: %llu syncs raced, %llu events observed\n",
           (unsigned long long)rounds, (unsigned long long)atomic_load(&seen));

    munmap(base, POOL);
    close(fd);
    unlink(path);
    return check_report("test_persist_observer");
}
