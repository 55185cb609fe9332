/* commit_pipeline.h -- pipelined group commit: batch k's log sync overlaps
 * the execution of batch k+1.
 *
 * Every ended batch gets a ticket (1, 2, 3, ...; empty batches too). A ticket
 * is durable once every frame sealed up to it is durable. Two ways to get there:
 *
 *   inline     the frontend seals and syncs the frame itself (redo_log_commit)
 *              and the ticket is durable at once. Used in every mode by
 *              mango_batch_end and the flat-combining path, and by
 *              mango_batch_submit where a sync is cheap (pmem, emulated, none).
 *   deferred   mango_batch_submit in fs and sim modes: the frontend only seals
 *              the frame (redo_log_seal) and returns; the sync thread syncs
 *              the log from the committed end to the newest sealed frame with
 *              ONE sync covering every frame sealed meanwhile, publishes the
 *              new committed end to the backend, and marks the tickets durable
 *              (waking waiters and the eventfd; an inline ticket wakes waiters
 *              only).
 *
 * The backend only ever sees durable frames (committed_lsn is advanced after
 * the sync), so the mirror never holds an unacknowledged batch's bytes.
 * Recovery's rule for the frames in flight at a crash is in redo_log.h.
 *
 * Threads: one frontend at a time submits (the flat-combining write side is
 * held); any thread may wait; the sync thread is the only one that calls
 * redo_log_sync_upto. An inline commit first waits until nothing is in flight.
 */
#ifndef MANGO_COMMIT_PIPELINE_H
#define MANGO_COMMIT_PIPELINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "log/redo_log.h"

typedef struct commit_pipeline {
    redo_log *log;
    void (*notify)(void *arg); /* called after each deferred sync (backend wake-up) */
    void *notify_arg;
    bool deferred_ok;          /* this mode syncs deferred frames on the sync thread */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;    /* sync thread: new sealed frames, or stop */
    /* Waiters sleep on durable_gen (a futex word), bumped after every advance
     * of durable and after a failure: no mutex, so a sync that makes many
     * threads' batches durable wakes them without a convoy on mu. */
    _Atomic uint32_t durable_gen;
    _Atomic uint32_t durable_waiters;
    _Atomic uint64_t submitted; /* last ticket handed out */
    _Atomic uint64_t durable;   /* every ticket <= this is durable */
    uint64_t sealed_lsn;        /* log end after the last sealed frame (under mu) */
    int error;                  /* MANGO_EIO after a failed deferred sync (under mu) */
    _Atomic bool stopped;       /* the runtime stopped: no more tickets (pipeline_note_stopped) */
    bool stop;
    int event_fd;               /* eventfd written at every durable advance; -1: none */
    /* written by the sync thread only; mango_get_stats reads them (relaxed) */
    _Atomic uint64_t deferred_syncs;
    _Atomic uint64_t deferred_sync_ns; /* time in those syncs */
    uint64_t frames_per_sync_total; /* frames covered by deferred syncs */
    uint64_t deferred_frames;       /* sealed, not yet covered (under mu) */
    /* Told of every advance of durable and of a failure, after the waiters
     * (pipeline_set_listener); set and read under mu. */
    void (*listener)(void *arg, uint64_t durable, bool failed);
    void *listener_arg;
    unsigned listener_calls;        /* calls in progress (under mu) */
    pthread_cond_t listener_cv;     /* listener_calls fell to 0 */
} commit_pipeline;

/* deferred: start a sync thread (fs, sim). MANGO_PIPELINE=0 in the
 * environment turns deferral off (every submit commits inline). */
int pipeline_start(commit_pipeline *cp, redo_log *log, bool deferred, void (*notify)(void *),
                   void *notify_arg);
/* Waits for everything in flight, stops the sync thread. Returns its error. */
int pipeline_stop(commit_pipeline *cp);

/* The frontend committed inline (or the batch was empty and nothing is in
 * flight): the new ticket is durable at once. */
uint64_t pipeline_ticket_inline(commit_pipeline *cp);
/* The frontend sealed a frame (sealed: true) or ended an empty batch while
 * frames are in flight; hands it to the sync thread; returns its ticket. */
uint64_t pipeline_ticket_deferred(commit_pipeline *cp, bool sealed);

/* Nothing in flight (every ticket handed out is durable)? */
bool pipeline_idle(const commit_pipeline *cp);
/* Wait until ticket t is durable: 0, or MANGO_EIO if a deferred sync failed,
 * or MANGO_EFAILED for a ticket not handed out when the runtime stopped
 * (pipeline_note_stopped: it never comes). */
int pipeline_wait(commit_pipeline *cp, uint64_t t);
/* The runtime stopped (an inline commit failed, say): no ticket is handed out
 * any more. Wakes the waiters, so that those waiting for a ticket beyond the
 * last one handed out (a reply's, taken in the failed batch) return instead
 * of sleeping for good (found by a review, session 39). */
void pipeline_note_stopped(commit_pipeline *cp);
/* The durable ticket; *err gets 0 or MANGO_EIO. */
uint64_t pipeline_durable(commit_pipeline *cp, int *err);
/* An eventfd (EFD_NONBLOCK) that becomes readable when the sync thread
 * advances the durable ticket or a sync fails (not for an inline ticket,
 * durable when handed out); created on first call. -1 and errno on failure. */
int pipeline_event_fd(commit_pipeline *cp);
/* Calls fn(arg, durable, failed) after every advance of the durable ticket
 * and after a failed sync, on the thread that made it (the sync thread, or a
 * frontend committing inline), with no lock held. fn NULL removes it, and
 * returns only once no call is in progress. One listener at a time. */
void pipeline_set_listener(commit_pipeline *cp, void (*fn)(void *arg, uint64_t durable, bool failed),
                           void *arg);

#endif
