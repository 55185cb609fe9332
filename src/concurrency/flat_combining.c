/* flat_combining.c -- the runtime's concurrency control.
 *
 * Owns the writer-preference reader/writer lock with flat combining described
 * in flat_combining.h: per-thread slots, the writer flag, combiner election,
 * batch collection and the batch_begin/batch_end bracketing. Blocking goes
 * through futex_wait.h.
 *
 * Shared state and who writes it:
 *   wrflag        0/1, set by the CAS that elects a combiner (or an exclusive
 *                 caller), cleared by that same thread.
 *   slot.rflag    written only by the slot's owner (reader announce).
 *   slot.status   EMPTY -> READY   by the owner (publishes ctx)
 *                 READY -> STARTED by the combiner holding wrflag
 *                 STARTED -> DONE  by that combiner (publishes result)
 *                 DONE -> EMPTY    by the owner (after reading result)
 *                 So STARTED only exists while its combiner holds wrflag, and
 *                 READY->STARTED needs no CAS: only the wrflag holder does it.
 *   slot.owned    claims a slot for a thread; cleared by the pthread key
 *                 destructor when the thread exits.
 *
 * Memory ordering (the part that matters):
 *   The shared-lock handshake is Dekker-style. A reader stores rflag=1 and
 *   then loads wrflag; a combiner sets wrflag=1 (CAS) and then loads every
 *   rflag. With release/acquire alone, each thread's load may be satisfied
 *   before its own store is visible to the other (store->load reordering,
 *   which x86 performs through its store buffer), and both would proceed.
 *   Making those stores/RMWs and loads seq_cst puts them in one total order,
 *   so at least one side sees the other's flag: the reader backs off or the
 *   combiner waits for it. The same four accesses also give the needed
 *   happens-before edges: a reader's clear of rflag (a release) read by the
 *   combiner orders the reader's reads before the batch's writes, and the
 *   combiner's clear of wrflag (a release) read by a reader orders the batch's
 *   writes before the reader's reads.
 *   ctx is published by the owner's release store of READY and read by the
 *   combiner after an acquire load of READY; result (and ticket) is published by the
 *   combiner's (seq_cst, hence release) store of DONE and read by the owner
 *   after an acquire load of DONE.
 *   Every store to a word someone may sleep on is seq_cst and is followed by
 *   fw_wake(); see futex_wait.h for why that cannot lose a wake-up.
 *
 * Pipelined commit (hooks.wait_durable): batch_end may hand the batch to a
 * background sync and give it a ticket. The combiner stores the ticket in each
 * of the batch's slots with the result; each owner waits for it after the
 * write side is released, so the next batch runs while this one syncs. A
 * reader asks hooks.read_target() after it leaves the read side what it may
 * have read, and waits for that. fc_submit hands either ticket to its caller
 * instead of waiting (RPC mode holds the response, not the thread).
 *
 * fc_execute never allocates. The only possible allocation is glibc's own,
 * inside pthread_setspecific on a thread's first call, and only for key
 * indices >= 32 (the runtime creates far fewer keys than that).
 */
#include "concurrency/flat_combining.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "concurrency/futex_wait.h"
#include "mango.h"
#include "runtime/error.h"

#define FC_CACHELINE 64
/* Upper bound on max_threads, to keep the slot array a sane size. */

enum { FC_EMPTY = 0, FC_READY = 1, FC_STARTED = 2, FC_DONE = 3 };

typedef struct fc_slot {
    _Alignas(FC_CACHELINE) _Atomic uint32_t rflag; /* reader announce */
    _Atomic uint32_t rwaiters;   /* sleepers on rflag (the combiner) */
    _Atomic uint32_t status;     /* FC_EMPTY .. FC_DONE */
    _Atomic uint32_t swaiters;   /* sleepers on status (the owner) */
    _Atomic uint32_t owned;      /* 1 while a live thread holds the slot */
    int result;                  /* valid once status == FC_DONE */
    void *ctx;                   /* valid once status == FC_READY */
    uint64_t ticket;             /* valid once status == FC_DONE (wait_durable) */
    _Atomic uint32_t reads;      /* read-only commands this slot's owner ran (fc_reads_seen) */
    uint32_t reads_snap;         /* reads at the last fc_reads_seen (write-side holder only) */
    uint32_t async;              /* valid once status == FC_READY: fc_submit's hand_over */
} fc_slot;

_Static_assert(sizeof(fc_slot) == FC_CACHELINE, "one slot per cache line");

struct fc {
    _Alignas(FC_CACHELINE) _Atomic uint32_t wrflag;
    _Atomic uint32_t wrwaiters; /* readers, queued writers, exclusive callers */
    _Atomic uint32_t rwaiting;  /* readers backing off for a writer (fc_readers_waiting) */

    _Alignas(FC_CACHELINE) fc_hooks hooks;
    unsigned max_threads;
    /* Slots ever claimed: scans stop here instead of at max_threads. Raised
     * (seq_cst) before a slot's owner touches rflag or status, and read
     * (seq_cst) after the combiner's CAS on wrflag: a reader the combiner's
     * scan misses raised it later, so it then sees wrflag and backs off. */
    _Atomic unsigned hwm;
    pthread_key_t key; /* value: this thread's fc_slot *, released at exit */
    unsigned recent_max;  /* group commit: largest recent batch (combiner only) */
    bool batch_async;     /* the batch being ended holds a command of fc_submit with hand_over (combiner only) */
    unsigned decay_tick;

    fc_slot slots[];
};

/* ---- slots --------------------------------------------------------------- */

static void slot_release(void *p)
{
    fc_slot *s = p;
    /* The owner only exits after its last fc_execute returned, so the slot is
     * EMPTY and no combiner will touch it again (a late FUTEX_WAKE from the
     * combiner that finished it is harmless: waiters always re-check). */
    atomic_store_explicit(&s->rflag, 0, memory_order_relaxed);
    atomic_store_explicit(&s->status, FC_EMPTY, memory_order_relaxed);
    atomic_store_explicit(&s->owned, 0, memory_order_release);
}

static fc_slot *slot_get(fc *f)
{
    fc_slot *s = pthread_getspecific(f->key);
    if (s)
        return s;
    for (unsigned i = 0; i < f->max_threads; i++) {
        s = &f->slots[i];
        uint32_t expect = 0;
        if (atomic_load_explicit(&s->owned, memory_order_relaxed) != 0)
            continue;
        if (!atomic_compare_exchange_strong_explicit(
                &s->owned, &expect, 1, memory_order_acquire,
                memory_order_relaxed))
            continue;
        if (pthread_setspecific(f->key, s) != 0) {
            atomic_store_explicit(&s->owned, 0, memory_order_release);
            mango_error(MANGO_EINVAL, "cannot record this thread's slot (pthread_setspecific)");
            return NULL;
        }
        unsigned want = i + 1, cur = atomic_load(&f->hwm);
        while (cur < want && !atomic_compare_exchange_weak(&f->hwm, &cur, want))
            ;
        return s;
    }
    mango_error(MANGO_EINVAL, "more than mango_config.max_threads (%u) threads have called in: a thread keeps "
                "its slot until it exits (raise max_threads)", f->max_threads);
    return NULL;
}

/* ---- the write side ------------------------------------------------------ */

static bool wr_try_acquire(fc *f)
{
    uint32_t expect = 0;
    /* Test before CAS: keeps queued writers from bouncing the line. */
    return atomic_load_explicit(&f->wrflag, memory_order_seq_cst) == 0 &&
           atomic_compare_exchange_strong_explicit(&f->wrflag, &expect, 1,
                                                   memory_order_seq_cst,
                                                   memory_order_seq_cst);
}

static void wr_release(fc *f)
{
    atomic_store_explicit(&f->wrflag, 0, memory_order_seq_cst);
    fw_wake(&f->wrflag, &f->wrwaiters);
}

/* Index of a slot whose reader flag is set, or -1. seq_cst loads: this is the
 * combiner's half of the Dekker handshake (its CAS on wrflag came first). */
static int find_reader(fc *f)
{
    unsigned n = atomic_load_explicit(&f->hwm, memory_order_seq_cst);
    for (unsigned j = 0; j < n; j++)
        if (atomic_load_explicit(&f->slots[j].rflag, memory_order_seq_cst))
            return (int)j;
    return -1;
}

/* Mark every READY slot STARTED; returns how many were taken. */
static unsigned collect_ready(fc *f)
{
    unsigned n = 0, hwm = atomic_load_explicit(&f->hwm, memory_order_seq_cst);
    for (unsigned j = 0; j < hwm; j++) {
        fc_slot *s = &f->slots[j];
        if (atomic_load_explicit(&s->status, memory_order_acquire) ==
            FC_READY) {
            /* The owner waits without writing status while READY, and only
             * the wrflag holder leaves READY, so a plain store suffices. No
             * wake: the owner sleeps on wrflag, not on status, while READY. */
            atomic_store_explicit(&s->status, FC_STARTED,
                                  memory_order_relaxed);
            n++;
        }
    }
    return n;
}

/* Called with wrflag held. Collects published commands while waiting for the
 * readers to leave; returns the number collected. */
static unsigned drain_readers(fc *f, bool collect)
{
    unsigned n = 0;
    for (;;) {
        if (collect)
            n += collect_ready(f);
        int j = find_reader(f);
        if (j < 0)
            return n;
        /* Readers that arrive from now on see wrflag and back off, so this
         * terminates once the current readers finish. */
        fc_slot *s = &f->slots[j];
        fw_wait_while_eq(&s->rflag, &s->rwaiters, 1);
    }
}

static int hook_begin(fc *f, unsigned n)
{
    return f->hooks.batch_begin ? f->hooks.batch_begin(f->hooks.arg, n) : 0;
}

static int hook_end(fc *f, uint64_t *ticket)
{
    return f->hooks.batch_end ? f->hooks.batch_end(f->hooks.arg, ticket) : 0;
}

/* Pipelined commit: wait, outside the lock, until what the command may have
 * seen or done is durable. */
static int wait_ticket(fc *f, uint64_t ticket)
{
    return ticket && f->hooks.wait_durable ? f->hooks.wait_durable(f->hooks.arg, ticket) : 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Group commit: when the batch's commit will be expensive, give writers that
 * are still waking up from the previous batch a moment to publish, until the
 * batch is as large as the recent largest one or the window closes. Yielding
 * (not spinning) hands the CPU to them: these machines have 2 cores. */
static unsigned gather(fc *f, unsigned n)
{
    unsigned target = f->recent_max;
    if (n >= target || !f->hooks.gather_window_ns)
        return n;
    uint64_t win = f->hooks.gather_window_ns(f->hooks.arg);
    if (win == 0)
        return n;
    uint64_t deadline = mono_ns() + win;
    while (n < target && mono_ns() < deadline) {
        sched_yield();
        n += collect_ready(f);
    }
    return n;
}

static void note_batch_size(fc *f, unsigned n)
{
    /* The largest recent batch, decaying by one every 16 batches so the
     * target follows a shrinking load. */
    if (n > f->recent_max)
        f->recent_max = n;
    else if (++f->decay_tick % 16 == 0 && f->recent_max > 1)
        f->recent_max--;
}

/* Called with wrflag held; releases it. */
static void combine(fc *f)
{
    unsigned n = drain_readers(f, true);
    if (n > 0) {
        n = gather(f, n);
        /* Read after the last collection: every STARTED slot lies below the
         * mark that collection used, and the mark only grows. */
        unsigned hwm = atomic_load_explicit(&f->hwm, memory_order_seq_cst);
        note_batch_size(f, n);
        int r = hook_begin(f, n);
        uint64_t ticket = 0;
        if (r == 0) {
            bool async = false;
            for (unsigned j = 0; j < hwm; j++) {
                fc_slot *s = &f->slots[j];
                if (atomic_load_explicit(&s->status, memory_order_relaxed) ==
                    FC_STARTED) {
                    f->hooks.process(s->ctx);
                    async |= s->async != 0;
                }
            }
            f->batch_async = async;
            r = hook_end(f, f->hooks.wait_durable ? &ticket : NULL);
            f->batch_async = false;
        }
        for (unsigned j = 0; j < hwm; j++) {
            fc_slot *s = &f->slots[j];
            if (atomic_load_explicit(&s->status, memory_order_relaxed) !=
                FC_STARTED)
                continue;
            s->result = r;
            s->ticket = ticket;
            atomic_store_explicit(&s->status, FC_DONE, memory_order_seq_cst);
            fw_wake(&s->status, &s->swaiters);
        }
    }
    wr_release(f);
}

/* ---- public API ---------------------------------------------------------- */

int fc_create(fc **out, unsigned max_threads, const fc_hooks *hooks)
{
    if (!out || !hooks || !hooks->process || max_threads == 0 ||
        max_threads > FC_MAX_THREADS_LIMIT)
        return MANGO_EINVAL;
    *out = NULL;
    size_t size = sizeof(fc) + (size_t)max_threads * sizeof(fc_slot);
    void *mem = NULL;
    if (posix_memalign(&mem, FC_CACHELINE, size) != 0)
        return MANGO_ENOMEM;
    memset(mem, 0, size);
    fc *f = mem;
    f->hooks = *hooks;
    f->max_threads = max_threads;
    atomic_init(&f->wrflag, 0);
    atomic_init(&f->wrwaiters, 0);
    atomic_init(&f->rwaiting, 0);
    atomic_init(&f->hwm, 0);
    for (unsigned i = 0; i < max_threads; i++) {
        fc_slot *s = &f->slots[i];
        atomic_init(&s->rflag, 0);
        atomic_init(&s->rwaiters, 0);
        atomic_init(&s->status, FC_EMPTY);
        atomic_init(&s->swaiters, 0);
        atomic_init(&s->owned, 0);
        atomic_init(&s->reads, 0);
    }
    int err = pthread_key_create(&f->key, slot_release);
    if (err != 0) {
        free(mem);
        return err == ENOMEM ? MANGO_ENOMEM : MANGO_EINVAL;
    }
    *out = f;
    return 0;
}

/* No thread may be inside fc_execute. Threads that still hold slots just lose
 * them: once the key is deleted their exit destructor no longer runs. */
void fc_destroy(fc *f)
{
    if (!f)
        return;
    pthread_key_delete(f->key);
    free(f);
}

int fc_execute(fc *f, void *ctx) { return fc_submit(f, ctx, NULL, false); }

/* The ticket a command must wait for: waited here (ticket_out NULL) or
 * handed to the caller. */
static int finish(fc *f, int r, uint64_t ticket, uint64_t *ticket_out)
{
    if (ticket_out) {
        *ticket_out = r == 0 ? ticket : 0;
        return r;
    }
    return r == 0 ? wait_ticket(f, ticket) : r;
}

int fc_submit(fc *f, void *ctx, uint64_t *ticket_out, bool hand_over)
{
    fc_slot *s = slot_get(f);
    if (!s)
        return MANGO_EINVAL;

    if (f->hooks.is_read_only && f->hooks.is_read_only(ctx)) {
        for (;;) {
            /* Reader half of the handshake: store rflag, then load wrflag,
             * both seq_cst (see the top of the file). */
            atomic_store_explicit(&s->rflag, 1, memory_order_seq_cst);
            if (atomic_load_explicit(&f->wrflag, memory_order_seq_cst) == 0) {
                (f->hooks.process_read ? f->hooks.process_read : f->hooks.process)(ctx);
                /* Only the owner writes it: no read-modify-write needed. */
                atomic_store_explicit(&s->reads, atomic_load_explicit(&s->reads, memory_order_relaxed) + 1,
                                      memory_order_relaxed);
                atomic_store_explicit(&s->rflag, 0, memory_order_seq_cst);
                fw_wake(&s->rflag, &s->rwaiters);
                /* It may have read batches still in flight, or one whose
                 * commit failed: every batch it could see ended before wrflag
                 * was cleared, so before this call. */
                uint64_t t = 0;
                int r = f->hooks.read_target ? f->hooks.read_target(f->hooks.arg, ctx, &t) : 0;
                return finish(f, r, t, ticket_out);
            }
            /* A writer holds or is taking the lock: step aside so it can
             * finish draining readers, and wait for it to release. */
            atomic_store_explicit(&s->rflag, 0, memory_order_seq_cst);
            fw_wake(&s->rflag, &s->rwaiters);
            atomic_fetch_add_explicit(&f->rwaiting, 1, memory_order_relaxed);
            fw_wait_while_eq(&f->wrflag, &f->wrwaiters, 1);
            atomic_fetch_sub_explicit(&f->rwaiting, 1, memory_order_relaxed);
        }
    }

    s->ctx = ctx;
    s->async = ticket_out && hand_over;
    atomic_store_explicit(&s->status, FC_READY, memory_order_release);
    for (;;) {
        uint32_t st = atomic_load_explicit(&s->status, memory_order_acquire);
        if (st == FC_DONE)
            break;
        if (st == FC_STARTED) {
            /* A combiner took our command; it will mark it DONE. */
            fw_wait_while_eq(&s->status, &s->swaiters, FC_STARTED);
            continue;
        }
        /* READY. Win wrflag and combine, or wait for the holder to either
         * take our command or let go of the lock. Our status cannot be
         * STARTED when the CAS wins (STARTED only lives while its combiner
         * holds wrflag), and if it went DONE meanwhile combine() simply
         * serves whoever else is READY. */
        if (wr_try_acquire(f)) {
            combine(f);
            continue;
        }
        unsigned i = 0;
        for (; i < FW_SPIN_ITERS; i++) {
            if (atomic_load_explicit(&s->status, memory_order_acquire) !=
                    FC_READY ||
                atomic_load_explicit(&f->wrflag, memory_order_acquire) == 0)
                break;
            fw_pause();
        }
        if (i == FW_SPIN_ITERS) {
            /* While READY we sleep on wrflag, not on status: a combiner that
             * takes us marks DONE before it clears wrflag, so the clear's wake
             * covers both outcomes. Sleep only once per wake-up: the next
             * combiner may already hold wrflag again, and our command may be
             * DONE, so the loop must recheck status before sleeping again. */
            fw_sleep_once_if_eq(&f->wrflag, &f->wrwaiters, 1);
        }
    }
    int r = s->result;
    uint64_t ticket = s->ticket;
    /* Only the owner leaves DONE; the combiner is finished with the slot. */
    atomic_store_explicit(&s->status, FC_EMPTY, memory_order_relaxed);
    return finish(f, r, ticket, ticket_out);
}

int fc_exclusive_begin(fc *f)
{
    if (!f)
        return MANGO_EINVAL;
    while (!wr_try_acquire(f))
        fw_wait_while_eq(&f->wrflag, &f->wrwaiters, 1);
    /* Published commands stay READY; their owners sleep on wrflag and retry
     * when we release it. */
    drain_readers(f, false);
    int r = hook_begin(f, 1);
    if (r != 0)
        wr_release(f);
    return r;
}

int fc_execute_locked(fc *f, void (*fn)(void *), void *arg)
{
    if (!f || !fn)
        return MANGO_EINVAL;
    while (!wr_try_acquire(f))
        fw_wait_while_eq(&f->wrflag, &f->wrwaiters, 1);
    drain_readers(f, false);
    fn(arg);
    wr_release(f);
    return MANGO_OK;
}

int fc_exclusive_end(fc *f)
{
    int r = hook_end(f, NULL);
    wr_release(f);
    return r;
}

bool fc_batch_async(const fc *f) { return f->batch_async; }

bool fc_readers_waiting(fc *f)
{
    return atomic_load_explicit(&f->rwaiting, memory_order_relaxed) != 0;
}

bool fc_in_read(fc *f)
{
    /* Only the owner writes its rflag, and it is 1 from before process_read
     * runs until after it returned. */
    const fc_slot *s = f ? pthread_getspecific(f->key) : NULL;
    return s && atomic_load_explicit(&s->rflag, memory_order_relaxed) != 0;
}

bool fc_reads_seen(fc *f)
{
    /* The combiner's own reads do not count: it will wait for its batch
     * anyway, so they could not run during the sync. */
    const fc_slot *own = pthread_getspecific(f->key);
    bool seen = false;
    unsigned n = atomic_load_explicit(&f->hwm, memory_order_relaxed);
    for (unsigned j = 0; j < n; j++) {
        /* Each slot against its own snapshot (taken by whichever thread
         * held the write side last): a change of combiner changes nothing. */
        fc_slot *s = &f->slots[j];
        uint32_t r = atomic_load_explicit(&s->reads, memory_order_relaxed);
        if (r != s->reads_snap) { /* (no store otherwise: the line is the owner's) */
            seen |= s != own;
            s->reads_snap = r;
        }
    }
    return seen;
}

int fc_execute_exclusive(fc *f, void (*fn)(void *), void *arg)
{
    if (!fn)
        return MANGO_EINVAL;
    int r = fc_exclusive_begin(f);
    if (r != 0)
        return r;
    fn(arg);
    return fc_exclusive_end(f);
}
