/* test_snapshot_sync_fault.c -- a snapshot whose writer's sync fails is
 * reported as failed, leaves nothing behind, and costs the application
 * nothing.
 *
 * The writer (a fork() child) writes the durable heap back a piece at a
 * time (persist_writeback, site snapshot.writeback) and makes the new pool
 * durable at the end (persist_sync_new_file, site pool.create_sync, as any
 * pool creation). Each site is failed with EIO and with ENOSPC
 * (MANGO_FAULT_SYNC=1[:ENOSPC], MANGO_FAULT_SYNC_SITE=<site>), in emulated,
 * fs and sim mode:
 *   - a first process creates the pool and commits 10 batches;
 *   - a second one recovers it, starts a snapshot and commits a batch
 *     between polls (wait false) until mango_snapshot_poll returns: it must
 *     be MANGO_EIO with a message that starts "mango_snapshot: " and names
 *     the error, nothing at the
 *     snapshot's path, no temporary file "<snap>.tmp.*"; then 10 more
 *     batches commit, and the process ends without a shutdown (a crash);
 *   - a third process recovers every batch the second one committed.
 * The site counts are the process's: the pool is created in the first
 * process, so the writer's pool.create_sync is the second process's first
 * (the writer inherits the count at fork). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "snapshot_files.h"
#include "test_config.h"

static uint64_t counter;  /* durable .bss */
static uint64_t *cell;    /* durable heap: holds counter too */
static uint64_t *shared;  /* not durable: the second process's last counter, for the third */
static char snap[128];
static const char *fault_nth, *fault_site;
static int fault_errno;

static bool ro(void *c) { (void)c; return false; }
static void proc(void *c) { (void)c; }

static int start(const char *pool, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = ro, .process_request = proc};
    return mango_init(&cfg, &cb);
}

static int bump(void)
{
    int rc = mango_batch_begin();
    if (rc != MANGO_OK)
        return rc;
    counter++;
    mango_capture(&counter, sizeof counter);
    if (!cell) {
        cell = malloc(4096); /* a heap page for the writer to copy */
        memset(cell, 0x5a, 4096);
        mango_capture(cell, 4096);
        mango_capture(&cell, sizeof cell);
    }
    *cell = counter;
    mango_capture(cell, sizeof *cell);
    return mango_batch_end();
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int leftovers(void) { return snapshot_leftovers(snap, NULL, false); }

static int prepare(const char *pool, int mode)
{
    if (start(pool, (mango_persist_mode)mode) != MANGO_FRESH)
        return 2;
    for (int i = 0; i < 10; i++)
        if (bump() != MANGO_OK)
            return 3;
    return mango_shutdown() == MANGO_OK ? 0 : 4;
}

static int failing_snapshot(const char *pool, int mode)
{
    arm_sync_fault(fault_nth, fault_site, 60); /* a hang fails the child */
    if (start(pool, (mango_persist_mode)mode) != MANGO_RECOVERED || counter != 10 || !cell || *cell != 10)
        return 2;
    mango_snapshot_job *job = NULL;
    int rc = mango_snapshot_start(snap, &job);
    if (rc != MANGO_OK) {
        printf("  start: %d %s\n", rc, mango_last_error());
        return 3;
    }
    int during = 0, bad = 0;
    while ((rc = mango_snapshot_poll(job, false, NULL)) == MANGO_EAGAIN) {
        bad += bump() != MANGO_OK; /* the application goes on meanwhile */
        during++;
        usleep(1000);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mango_last_error());
    printf("  poll: %d %s (%d batches while the writer ran)\n", rc, msg, during);
    int fails = 0;
    /* Reported as failed, with the injected error named. */
    fails += rc != MANGO_EIO;
    fails += !strstr(msg, strerror(fault_errno));
    fails += strncmp(msg, "mango_snapshot: ", 16) != 0; /* whose failure it is */
    /* Nothing at the path, no temporary file. */
    fails += exists(snap);
    fails += leftovers() != 0;
    /* The application is unaffected: it keeps committing. */
    for (int i = 0; i < 10; i++)
        bad += bump() != MANGO_OK;
    fails += bad != 0;
    *shared = counter;
    if (fails)
        printf("  rc %d, file at the path %d, leftovers %d, failed batches %d\n", rc, exists(snap), leftovers(),
               bad);
    return fails ? 4 : 0; /* no shutdown: the third process recovers after a crash */
}

static int recovered(const char *pool, int mode)
{
    if (start(pool, (mango_persist_mode)mode) != MANGO_RECOVERED)
        return 2;
    printf("  recovered counter %llu, expected %llu\n", (unsigned long long)counter, (unsigned long long)*shared);
    if (counter != *shared || !cell || *cell != counter)
        return 3;
    return mango_shutdown() == MANGO_OK ? 0 : 4;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return 1;
    snprintf(snap, sizeof snap, "/var/tmp/mango-snapshot-sync-fault-%d.snap", (int)getpid());
    const struct {
        const char *name;
        mango_persist_mode mode;
    } modes[] = {{"emulated", MANGO_PERSIST_EMULATED}, {"fs", MANGO_PERSIST_FS}, {"sim", MANGO_PERSIST_SIM}};
    const char *sites[] = {"snapshot.writeback", "pool.create_sync"};
    const struct {
        const char *nth;
        int err;
    } faults[] = {{"1", EIO}, {"1:ENOSPC", ENOSPC}};
    for (unsigned m = 0; m < 3; m++)
        for (unsigned s = 0; s < 2; s++)
            for (unsigned f = 0; f < 2; f++) {
                char pool[128];
                snprintf(pool, sizeof pool, "%s/mango-snapshot-sync-fault-%d.pool",
                         modes[m].mode == MANGO_PERSIST_EMULATED ? "/dev/shm" : "/var/tmp", (int)getpid());
                fault_nth = faults[f].nth;
                fault_site = sites[s];
                fault_errno = faults[f].err;
                printf("%s, %s fails (MANGO_FAULT_SYNC=%s):\n", modes[m].name, sites[s], faults[f].nth);
                unlink(pool);
                *shared = 0;
                CHECK(child_ok(status_of_child(prepare, pool, (int)modes[m].mode)));
                CHECK(child_ok(status_of_child(failing_snapshot, pool, (int)modes[m].mode)));
                CHECK(child_ok(status_of_child(recovered, pool, (int)modes[m].mode)));
                CHECK(!exists(snap) && leftovers() == 0);
                unlink(snap);
                snapshot_leftovers(snap, NULL, true); /* (a failing round leaves none for the next) */
                remove_pool_files(pool);
            }
    return check_report("test_snapshot_sync_fault");
}
