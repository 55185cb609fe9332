/* snapshot.h -- a new pool that holds this process's durable state as it is
 * at one point between batches (mango_snapshot): an online backup.
 *
 * The runtime calls snapshot_start on the thread that holds the write side,
 * once every batch so far is durable. It copies the pool's layout and its
 * written-bytes bitmaps of .data/.bss, adds to them the bits of the frames
 * the backend has not applied yet (read from the log ring, and the big-batch
 * file), and forks: the snapshot never waits for the backend. The child owns a copy-on-write
 * image of the durable memory at that point: it builds the new pool with
 * pool_create (the same layout, fingerprint, heap address and log size, an
 * empty log, a clean head), copies the durable heap up to the allocator's
 * top and the .data/.bss bytes the bitmaps mark into the mirrors, syncs it and
 * only then gives it its name. The parent releases the write side at once
 * and waits in snapshot_finish, while batches go on.
 *
 * Opening the snapshot recovers it like a pool that was shut down cleanly
 * at that point. A writer that dies leaves "<path>.tmp.<pid>", which the
 * next creation at that path removes (pool_remove_abandoned); a writer
 * whose process is gone stops at its next 2 MiB piece.
 */
#ifndef MANGO_SNAPSHOT_H
#define MANGO_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "log/redo_log.h"
#include "pool/pool.h"

/* The writer's report on the pipe: one write, below PIPE_BUF. */
typedef struct snapshot_report {
    int32_t rc;
    char message[1020];
    double paced_seconds; /* the writer idled this long to leave the disk to the application */
} snapshot_report;

typedef struct snapshot_job {
    pid_t pid;     /* the writer (a fork() child) */
    int result_fd; /* its report: a status and a message */
    uint64_t heap_bytes; /* the durable heap's extent it copies */
    unsigned share;      /* its pace: percent of the time in writeback (100: not paced by share) */
    uint64_t bytes_per_s; /* or its pace in bytes a second (0: none) */
    bool shares_disk;     /* fs mode: path may be on one of the pool's disks (disks.h) */
    char tmp_path[4200]; /* where it builds the pool: removed if it dies */
    char path[4200];     /* the snapshot's (for messages) */
    bool reported;       /* its report is read (got_report: whole), the writer not yet reaped */
    bool got_report;
    snapshot_report report;
} snapshot_job;

/* On the thread holding the write side, every frame of log committed (the
 * backend has applied those before applied_lsn, read before this call, and
 * may be applying more): fork the writer of a new pool at path with p's
 * layout. The bits of the frames from applied_lsn to the log's tail are
 * read from the log itself. MANGO_OK (then call snapshot_finish), or an
 * error (nothing was started). */
int snapshot_start(const pool *p, const redo_log *log, uint64_t applied_lsn, const char *path, bool shares_disk,
                   snapshot_job *job);
/* Before taking the write side (it reads /sys, and may stat a loop
 * device's backing file): whether a snapshot at path competes with p's log
 * syncs for a disk, as snapshot_start's shares_disk wants it (fs mode and
 * path maybe on one of the pool's disks; disks.h). */
bool snapshot_shares_disk(const pool *p, const char *path);
/* After the write side is released: wait until the writer holds none of
 * the process's descriptors but its report pipe (a listening socket it kept
 * would refuse a restarted server its port). MANGO_OK, or the writer's
 * error (the job is then ended). */
int snapshot_started(snapshot_job *job);
/* The writer's result: MANGO_OK once path is a durable, complete pool, or
 * its error (nothing was left at path). Without wait, MANGO_EAGAIN while
 * it works. Any other result ends the job. */
int snapshot_finish(snapshot_job *job, bool wait);
/* Stop the writer (SIGKILL) and wait for it; its temporary file is
 * removed. Ends the job. */
void snapshot_cancel(snapshot_job *job);

#endif
