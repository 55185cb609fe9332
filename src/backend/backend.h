/* backend.h -- applies committed log frames to the pool's persistent mirror.
 *
 * One thread, lazy on purpose: it sleeps (untimed) while the log is empty; after
 * a commit it applies a second later, or at once when a mebibyte of log (at
 * most an eighth of it) is waiting or the frontend waits for space (fs mode:
 * every 5 s, or a quarter of the log; backend.c says why). It applies every
 * committed frame (zero ranges, data ranges and 32-byte blocks to the heap
 * mirror; masked bytes plus the written-bytes bitmap for .data/.bss), syncs
 * the mirror, then persists the new log head and releases log space.
 * Two syncs per round, however many batches the round covers.
 * Recovery uses the same apply function to replay the log.
 *
 * Priority: the backend is background work -- nothing waits for it while the
 * log has room. Where the process may raise a thread's priority again later
 * (root, CAP_SYS_NICE or RLIMIT_NICE >= 20; probed at start), it runs as
 * SCHED_IDLE and so takes only CPU time no other thread wants; the frontend
 * raises it to SCHED_OTHER (a "boost") as soon as the unapplied log reaches
 * boost_bytes (an eighth of the log; in fs mode half of it: backend.c says
 * why), a writer waits for log space, or at stop, and the backend lowers
 * itself again after a round that left less than half of wake_bytes. Where
 * raising is not permitted it stays at normal priority: lowering it for good
 * could starve it behind a busy machine while writers wait for log space.
 */
#ifndef MANGO_BACKEND_H
#define MANGO_BACKEND_H

#include <pthread.h>
#include <stdbool.h>

#include "log/big_batch.h"
#include "log/redo_log.h"
#include "mango.h"
#include "pool/pool.h"

enum { BACKEND_AWAKE = 0, BACKEND_TIMED = 1, BACKEND_IDLE = 2 };

typedef struct backend {
    pool *pool;
    redo_log *log;
    const big_batch_writer *big; /* the frontend's: big batches are read through its descriptor */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int sleeping; /* BACKEND_AWAKE / _TIMED / _IDLE */
    uint64_t wake_bytes;  /* unapplied log that makes the frontend wake us */
    uint64_t boost_bytes; /* unapplied log that makes it raise a lowered backend */
    uint64_t interval_ns; /* apply at least this often while work is pending */
    _Atomic int stop;
    _Atomic uint64_t applied_lsn; /* read by backend_notify on the frontend */
    uint64_t applied_seq;
    _Atomic int error; /* MANGO_E* once the backend failed */
    /* Counters the backend bumps and mango_get_stats reads (relaxed). */
    _Atomic uint64_t rounds;
    _Atomic uint64_t syncs; /* mirror + head syncs issued */
    bool lowered;          /* runs SCHED_IDLE between boosts (mango_backend_priority) */
    _Atomic int boosted;   /* lowered, and raised to SCHED_OTHER until it catches up */
    _Atomic uint64_t boosts; /* times the frontend raised it */
} backend;

/* Check that every block of a frame lies in a durable region and writes no
 * byte of the dynamic loader's (writes nothing). */
int backend_check_frame(const pool *p, const log_frame *f, const log_entry *e);
/* MANGO_EBADPOOL, naming the frame's seq, if block entry e, in region r,
 * writes a byte below r's loader_end (pool.h); else MANGO_OK. */
int backend_check_loader_bytes(const pool *p, const pool_region *r, const log_entry *e, uint64_t seq);
/* A zero-range entry's start and length, and the heap region holding it; NULL
 * if the entry is malformed (outside the heap region, unaligned, empty). */
const pool_region *backend_zero_range(const pool *p, const log_entry *e, uint64_t *addr, uint64_t *len);
/* A data-range entry (redo_log.h, LOG_DATA_TAG) with `left` entries from it
 * to the frame's end: its start, length and heap region; NULL if malformed
 * (outside the heap region, empty, longer than the frame holds, nonzero
 * reserved fields). */
const pool_region *backend_data_range(const pool *p, const log_entry *e, uint64_t left, uint64_t *addr,
                                      uint64_t *len);
/* Apply one frame to the mirror; flushed ranges accumulate in r. */
int backend_apply_frame(pool *p, const log_frame *f, const log_entry *e, persist_ranges *r);

/* prio (mango.h): AUTO lowers the thread where a boost is permitted; IDLE
 * fails where it is not; NORMAL never lowers it. */
int backend_start(backend *b, pool *p, redo_log *log, const big_batch_writer *big, mango_backend_priority prio);
/* Frontend: a commit was published. Cheap unless the backend sleeps. */
void backend_notify(backend *b);
/* Stop; with drain, apply everything committed first and mark the head clean
 * (not a failed pool's: then MANGO_EIO, or the backend's own error). */
int backend_stop(backend *b, bool drain);

#endif
