/* test_snapshot_after_failure.c -- a snapshot asked for while a batch whose
 * commit then fails holds the write side is refused: its stores were
 * answered with an error and must never be in a snapshot.
 *
 * Batch 1 sets a durable .bss marker to 1 and commits. Batch 2 sets it to 2;
 * while it is open a second thread calls mango_snapshot (the runtime has
 * not failed yet, so the call passes its first check and waits for the
 * write side); then batch 2's log sync fails (MANGO_FAULT_SYNC=3 at
 * log.commit_sync). The snapshot must fail with MANGO_EFAILED and leave
 * nothing at its path. Before the fix it forked anyway and wrote a snapshot
 * holding marker 2 (a review found it). Emulated and sim mode, each in a
 * child process (the fault settings are read once per process). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "snapshot_files.h"
#include "test_config.h"

static uint64_t marker; /* durable .bss */
static _Atomic int go;
static char snap_path[160];
static int snap_rc = 99;

static bool ro(void *c) { (void)c; return false; }
static void proc(void *c) { (void)c; }

static void *snapper(void *arg)
{
    (void)arg;
    while (!atomic_load(&go))
        usleep(1000);
    snap_rc = mango_snapshot(snap_path, NULL);
    return NULL;
}

static int child(const char *pool, mango_persist_mode mode)
{
    unlink(snap_path); /* (left by the other mode's child) */
    arm_sync_fault("3", "log.commit_sync", 30);
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = ro, .process_request = proc};
    if (mango_init(&cfg, &cb) != MANGO_FRESH)
        return 3;
    mango_batch_begin();
    marker = 1;
    mango_capture(&marker, sizeof marker);
    int rc1 = mango_batch_end();
    pthread_t t;
    pthread_create(&t, NULL, snapper, NULL);
    mango_batch_begin();
    marker = 2;
    mango_capture(&marker, sizeof marker);
    atomic_store(&go, 1);
    usleep(200000); /* the snapshot passes its first check and waits for the write side */
    int rc2 = mango_batch_end();
    pthread_join(t, NULL);
    bool left = access(snap_path, F_OK) == 0;
    printf("%s: batch 1 %d, batch 2 %d, snapshot %d (%s), file left: %s\n", mode == MANGO_PERSIST_SIM ? "sim" : "emulated",
           rc1, rc2, snap_rc, snap_rc ? mango_last_error() : "ok", left ? "yes" : "no");
    mango_shutdown();
    return rc1 == MANGO_OK && rc2 == MANGO_EIO && snap_rc == MANGO_EFAILED && !left ? 0 : 1;
}

int main(void)
{
    char pool[128];
    snprintf(pool, sizeof pool, "/tmp/mango_test_snapshot_after_failure_%d.pool", (int)getpid());
    snprintf(snap_path, sizeof snap_path, "%s.snap", pool);
    CHECK(each_mode_in_a_child(pool, child) == 0);
    remove_pool_files(pool);
    unlink(snap_path);
    return check_report("test_snapshot_after_failure");
}
