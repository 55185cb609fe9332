/* commit_pipeline.c -- tickets, the sync thread and the durable eventfd of
 * pipelined group commit (see commit_pipeline.h). */
#define _GNU_SOURCE
#include "log/commit_pipeline.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "concurrency/futex_wait.h"
#include "runtime/error.h"

/* The durable ticket advanced or a sync failed: wake the waiters. */
static void wake_waiters(commit_pipeline *cp)
{
    atomic_fetch_add_explicit(&cp->durable_gen, 1, memory_order_seq_cst);
    fw_wake(&cp->durable_gen, &cp->durable_waiters);
}

static void signal_fd(commit_pipeline *cp)
{
    int fd = __atomic_load_n(&cp->event_fd, __ATOMIC_ACQUIRE);
    if (fd >= 0) {
        uint64_t one = 1;
        /* EAGAIN (counter saturated) is harmless: the fd is readable anyway. */
        ssize_t w = write(fd, &one, sizeof one);
        (void)w;
    }
}

/* Under mu: takes the listener for one call (tell_listener). */
static void *listener_take(commit_pipeline *cp, void (**fn)(void *, uint64_t, bool))
{
    *fn = cp->listener;
    if (*fn)
        cp->listener_calls++;
    return cp->listener_arg;
}

/* Without mu: calls it, then lets pipeline_set_listener know. */
static void tell_listener(commit_pipeline *cp, void (*fn)(void *, uint64_t, bool), void *arg,
                          uint64_t durable, bool failed)
{
    if (!fn)
        return;
    fn(arg, durable, failed);
    pthread_mutex_lock(&cp->mu);
    if (--cp->listener_calls == 0)
        pthread_cond_broadcast(&cp->listener_cv);
    pthread_mutex_unlock(&cp->mu);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *sync_main(void *arg)
{
    commit_pipeline *cp = arg;
    redo_log *l = cp->log;
    pthread_mutex_lock(&cp->mu);
    for (;;) {
        while (!cp->stop && atomic_load(&cp->durable) == atomic_load(&cp->submitted))
            pthread_cond_wait(&cp->work_cv, &cp->mu);
        uint64_t target = atomic_load(&cp->submitted);
        if (atomic_load(&cp->durable) == target)
            break; /* stop requested and nothing in flight */
        uint64_t to = cp->sealed_lsn;
        uint64_t frames = cp->deferred_frames;
        cp->deferred_frames = 0;
        pthread_mutex_unlock(&cp->mu);

        /* One sync for every frame sealed since the last one. The frontend
         * keeps sealing new frames past `to` meanwhile. */
        uint64_t from = atomic_load_explicit(&l->committed_lsn, memory_order_acquire);
        uint64_t t0 = now_ns();
        int rc = redo_log_sync_upto(l, from, to);
        uint64_t dt = now_ns() - t0;
        if (rc == MANGO_OK && to > from && cp->notify)
            cp->notify(cp->notify_arg);

        pthread_mutex_lock(&cp->mu);
        void (*fn)(void *, uint64_t, bool);
        if (rc != MANGO_OK) {
            mango_error_publish_fatal(); /* why, for the waiting threads */
            __atomic_store_n(&cp->error, rc, __ATOMIC_RELEASE);
            void *la = listener_take(cp, &fn);
            pthread_mutex_unlock(&cp->mu);
            wake_waiters(cp);
            /* A combiner may wait for log space that only the frames of
             * this failed sync hold: nothing else would wake it (it slept
             * for good holding the write side; found by a review, session
             * 36). The pool is marked failed by now. */
            redo_log_wake_space_waiters(l);
            signal_fd(cp);
            tell_listener(cp, fn, la, atomic_load(&cp->durable), true);
            return NULL;
        }
        if (to > from) {
            atomic_fetch_add_explicit(&cp->deferred_syncs, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&cp->deferred_sync_ns, dt, memory_order_relaxed);
            cp->frames_per_sync_total += frames;
        }
        atomic_store(&cp->durable, target);
        void *la = listener_take(cp, &fn);
        pthread_mutex_unlock(&cp->mu);
        wake_waiters(cp);
        signal_fd(cp);
        tell_listener(cp, fn, la, target, false);
        pthread_mutex_lock(&cp->mu);
    }
    pthread_mutex_unlock(&cp->mu);
    return NULL;
}

int pipeline_start(commit_pipeline *cp, redo_log *log, bool deferred, void (*notify)(void *),
                   void *notify_arg)
{
    memset(cp, 0, sizeof *cp);
    cp->log = log;
    cp->notify = notify;
    cp->notify_arg = notify_arg;
    cp->event_fd = -1;
    cp->sealed_lsn = log ? atomic_load(&log->committed_lsn) : 0;
    const char *env = getenv("MANGO_PIPELINE");
    if (env && strcmp(env, "0") == 0)
        deferred = false;
    cp->deferred_ok = deferred && log;
    pthread_mutex_init(&cp->mu, NULL);
    pthread_cond_init(&cp->work_cv, NULL);
    pthread_cond_init(&cp->listener_cv, NULL);
    if (cp->deferred_ok) {
        if (pthread_create(&cp->thread, NULL, sync_main, cp) != 0)
            return mango_error(MANGO_ENOMEM, "cannot start the commit sync thread");
        cp->started = true;
    }
    return MANGO_OK;
}

int pipeline_stop(commit_pipeline *cp)
{
    int rc = MANGO_OK;
    if (cp->started) {
        pthread_mutex_lock(&cp->mu);
        cp->stop = true;
        pthread_cond_signal(&cp->work_cv);
        pthread_mutex_unlock(&cp->mu);
        pthread_join(cp->thread, NULL);
        cp->started = false;
        rc = cp->error;
    }
    int fd = cp->event_fd;
    cp->event_fd = -1;
    if (fd >= 0)
        close(fd);
    pthread_mutex_destroy(&cp->mu);
    pthread_cond_destroy(&cp->work_cv);
    pthread_cond_destroy(&cp->listener_cv);
    return rc;
}

uint64_t pipeline_ticket_inline(commit_pipeline *cp)
{
    pthread_mutex_lock(&cp->mu);
    uint64_t t = atomic_load(&cp->submitted) + 1;
    /* Durable first: a reader that sees t handed out (mango_reply_ticket,
     * read_target, lock-free) then sees it durable, and does not wait on the
     * eventfd, which an inline ticket never writes (it waited for good: found
     * by a review, session 39). Everyone who compares the two under the lock
     * or holding the write side sees them equal again. */
    atomic_store(&cp->durable, t);
    atomic_store(&cp->submitted, t);
    if (cp->log)
        cp->sealed_lsn = atomic_load(&cp->log->committed_lsn);
    void (*fn)(void *, uint64_t, bool);
    void *la = listener_take(cp, &fn);
    pthread_mutex_unlock(&cp->mu);
    wake_waiters(cp);
    /* No signal_fd: the ticket is durable when handed out, and everything
     * earlier was drained (each deferred advance signalled it). The event
     * loop that committed knows; a wake-up would cost it a write, a read and
     * a pass, and a pass that commits an empty batch would wake the next
     * one: durable Redis spun through ~500 k idle passes a second while a
     * key had a TTL. */
    tell_listener(cp, fn, la, t, false);
    return t;
}

uint64_t pipeline_ticket_deferred(commit_pipeline *cp, bool sealed)
{
    pthread_mutex_lock(&cp->mu);
    uint64_t t = atomic_load(&cp->submitted) + 1;
    atomic_store(&cp->submitted, t);
    if (sealed) {
        cp->sealed_lsn = cp->log->tail_lsn;
        cp->deferred_frames++;
    }
    pthread_cond_signal(&cp->work_cv);
    pthread_mutex_unlock(&cp->mu);
    return t;
}

bool pipeline_idle(const commit_pipeline *cp)
{
    return atomic_load(&cp->durable) == atomic_load(&cp->submitted);
}

int pipeline_wait(commit_pipeline *cp, uint64_t t)
{
    for (;;) {
        /* The generation first: an advance after these loads changes it, so
         * the futex wait cannot miss it. */
        uint32_t gen = atomic_load_explicit(&cp->durable_gen, memory_order_seq_cst);
        if (atomic_load_explicit(&cp->durable, memory_order_seq_cst) >= t)
            return MANGO_OK;
        int err = __atomic_load_n(&cp->error, __ATOMIC_ACQUIRE);
        if (err != MANGO_OK)
            return err;
        if (atomic_load(&cp->stopped) && t > atomic_load(&cp->submitted))
            return MANGO_EFAILED; /* never handed out: never durable */
        fw_wait_while_eq(&cp->durable_gen, &cp->durable_waiters, gen);
    }
}

uint64_t pipeline_durable(commit_pipeline *cp, int *err)
{
    uint64_t d = atomic_load_explicit(&cp->durable, memory_order_acquire);
    if (err)
        *err = __atomic_load_n(&cp->error, __ATOMIC_ACQUIRE);
    return d;
}

int pipeline_event_fd(commit_pipeline *cp)
{
    pthread_mutex_lock(&cp->mu);
    if (cp->event_fd < 0) {
        int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd >= 0)
            __atomic_store_n(&cp->event_fd, fd, __ATOMIC_RELEASE);
    }
    int fd = cp->event_fd;
    pthread_mutex_unlock(&cp->mu);
    return fd;
}

void pipeline_set_listener(commit_pipeline *cp, void (*fn)(void *arg, uint64_t durable, bool failed),
                           void *arg)
{
    pthread_mutex_lock(&cp->mu);
    cp->listener = fn;
    cp->listener_arg = arg;
    if (!fn)
        while (cp->listener_calls)
            pthread_cond_wait(&cp->listener_cv, &cp->mu);
    pthread_mutex_unlock(&cp->mu);
}

void pipeline_note_stopped(commit_pipeline *cp)
{
    atomic_store(&cp->stopped, true);
    wake_waiters(cp); /* after the store: a waiter that missed it sees the generation move */
}
