/* backend.c -- the backend thread and the frame-apply function (backend.h). */
#define _GNU_SOURCE /* SCHED_IDLE */
#include "backend/backend.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "log/big_batch.h"
#include "runtime/error.h"

static const pool_region *region_of(const pool *p, uint64_t addr)
{
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        if (addr >= r->vaddr && addr - r->vaddr < r->size)
            return r;
    }
    return NULL;
}

int backend_check_loader_bytes(const pool *p, const pool_region *r, const log_entry *e, uint64_t seq)
{
    uint64_t end = p->loader_end[r - p->regions];
    if (r->kind != POOL_REGION_DATA || e->addr >= end)
        return MANGO_OK;
    for (unsigned b = 0; b < LOG_BLOCK_SIZE && e->addr + b < end; b++)
        if (e->mask & (1u << b))
            return mango_error(MANGO_EBADPOOL,
                               "log frame seq %llu writes block %#llx in the dynamic loader's part of the "
                               "data segment (below %#llx: the lazy-binding table, relocated data), which "
                               "the program never writes",
                               (unsigned long long)seq, (unsigned long long)e->addr, (unsigned long long)end);
    return MANGO_OK;
}

const pool_region *backend_zero_range(const pool *p, const log_entry *e, uint64_t *addr, uint64_t *len)
{
    *addr = e->addr & ~LOG_ZERO_TAG;
    *len = log_entry_zero_len(e);
    const pool_region *r = region_of(p, *addr);
    if (!r || r->kind != POOL_REGION_HEAP || e->mask || *addr % LOG_BLOCK_SIZE || *len == 0 ||
        *len % LOG_BLOCK_SIZE || *len > r->size - (*addr - r->vaddr))
        return NULL;
    return r;
}

const pool_region *backend_data_range(const pool *p, const log_entry *e, uint64_t left, uint64_t *addr,
                                      uint64_t *len)
{
    *addr = log_entry_data_addr(e);
    *len = log_entry_data_len(e);
    uint64_t slots = log_entry_slots(e), rest[3];
    memcpy(rest, e->data + 8, sizeof rest);
    const pool_region *r = region_of(p, *addr);
    if (slots == 0 || slots > left || e->mask || e->reserved || rest[0] || rest[1] || rest[2] || !r ||
        r->kind != POOL_REGION_HEAP || *len > r->size - (*addr - r->vaddr))
        return NULL;
    return r;
}

int backend_check_frame(const pool *p, const log_frame *f, const log_entry *e)
{
    for (uint32_t i = 0; i < f->n_entries;) {
        uint64_t a, n;
        if (log_entry_is_data(&e[i])) {
            if (!backend_data_range(p, &e[i], f->n_entries - i, &a, &n))
                return mango_error(MANGO_EBADPOOL,
                                   "log frame seq %llu holds a malformed data range at %#llx (%llu bytes)",
                                   (unsigned long long)f->seq, (unsigned long long)a,
                                   (unsigned long long)n);
            i += (uint32_t)log_entry_slots(&e[i]);
            continue;
        }
        const pool_region *r = NULL;
        if (log_entry_is_zero(&e[i]) ? !backend_zero_range(p, &e[i], &a, &n)
                                     : !(r = region_of(p, e[i].addr)) || e[i].addr % LOG_BLOCK_SIZE)
            return mango_error(MANGO_EBADPOOL,
                               "log frame seq %llu holds block %#llx outside every durable region",
                               (unsigned long long)f->seq, (unsigned long long)e[i].addr);
        int lrc = r ? backend_check_loader_bytes(p, r, &e[i], f->seq) : MANGO_OK;
        if (lrc != MANGO_OK)
            return lrc;
        i++;
    }
    return MANGO_OK;
}

int backend_apply_frame(pool *p, const log_frame *f, const log_entry *e, persist_ranges *rg)
{
    for (uint32_t i = 0; i < f->n_entries; i++) {
        if (log_entry_is_data(&e[i])) {
            uint64_t a, n;
            const pool_region *d = backend_data_range(p, &e[i], f->n_entries - i, &a, &n);
            if (!d)
                return mango_error(MANGO_EBADPOOL, "log frame seq %llu holds a malformed data range at %#llx",
                                   (unsigned long long)f->seq, (unsigned long long)a);
            char *dst = p->base + d->mirror_offset + (a - d->vaddr);
            memcpy(dst, &e[i + 1], n);
            persist_note_store(dst, n, "backend.apply_data");
            persist_flush(&p->pd, rg, dst, n, "backend.flush");
            i += (uint32_t)log_entry_slots(&e[i]) - 1; /* and the loop's 1 */
            continue;
        }
        if (log_entry_is_zero(&e[i])) {
            uint64_t a, n;
            const pool_region *z = backend_zero_range(p, &e[i], &a, &n);
            if (!z)
                return mango_error(MANGO_EBADPOOL, "log frame seq %llu holds a malformed zero range at %#llx",
                                   (unsigned long long)f->seq, (unsigned long long)e[i].addr);
            char *dst = p->base + z->mirror_offset + (a - z->vaddr);
            memset(dst, 0, n);
            persist_note_store(dst, n, "backend.apply_zero");
            persist_flush(&p->pd, rg, dst, n, "backend.flush");
            continue;
        }
        const pool_region *r = region_of(p, e[i].addr);
        if (!r || e[i].addr % LOG_BLOCK_SIZE)
            return mango_error(MANGO_EBADPOOL,
                               "log frame seq %llu holds block %#llx outside every durable region",
                               (unsigned long long)f->seq, (unsigned long long)e[i].addr);
        uint64_t off = e[i].addr - r->vaddr;
        char *dst = p->base + r->mirror_offset + off;
        if (r->kind == POOL_REGION_HEAP || e[i].mask == 0xffffffffu) {
            memcpy(dst, e[i].data, LOG_BLOCK_SIZE);
        } else {
            for (unsigned b = 0; b < LOG_BLOCK_SIZE; b++)
                if (e[i].mask & (1u << b))
                    dst[b] = (char)e[i].data[b];
        }
        persist_note_store(dst, LOG_BLOCK_SIZE, "backend.apply");
        persist_flush(&p->pd, rg, dst, LOG_BLOCK_SIZE, "backend.flush");
        if (r->kind == POOL_REGION_DATA) {
            /* off is 32-aligned, so the block's 32 bits are one aligned uint32_t. */
            uint32_t *bits = (uint32_t *)(p->base + r->bitmap_offset + off / 8);
            if ((*bits | e[i].mask) != *bits) {
                *bits |= e[i].mask;
                persist_note_store(bits, sizeof *bits, "backend.bitmap");
                persist_flush(&p->pd, rg, bits, sizeof *bits, "backend.flush_bitmap");
            }
        }
    }
    return MANGO_OK;
}

typedef struct apply_ctx {
    pool *p;
    persist_ranges ranges;
} apply_ctx;

static int apply_visitor(void *arg, const log_frame *f, const log_entry *e)
{
    apply_ctx *c = arg;
    return backend_apply_frame(c->p, f, e, &c->ranges);
}

/* Apply [applied, committed), sync the mirror, persist the head. */
static int backend_round(backend *b, uint64_t committed)
{
    pool *p = b->pool;
    apply_ctx c = {.p = p};
    big_batch_scan big = {.path = p->big_batch_path, .writer = b->big, .visit = apply_visitor, .arg = &c};
    log_scan_result res;
    int rc = redo_log_scan(b->log->ring, b->log->cap, b->applied_lsn, b->applied_seq,
                           b->log->generation, committed, big_batch_visit, &big, &res);
    if (rc != MANGO_OK)
        return rc;
#ifdef MANGO_MUTATE_HEAD_BEFORE_MIRROR_SYNC
    /* Test-only mutation: advance the head before the mirror is durable. */
    rc = pool_write_head(p, res.end_lsn, res.next_seq, b->log->generation, false);
    if (rc != MANGO_OK)
        return rc;
#endif
    int s = persist_sync(&p->pd, &c.ranges, "backend.mirror_sync");
    if (s != 0)
        return mango_error(MANGO_EIO, "sync of the mirror failed: %s", strerror(-s));
#ifndef MANGO_MUTATE_HEAD_BEFORE_MIRROR_SYNC
    rc = pool_write_head(p, res.end_lsn, res.next_seq, b->log->generation, false);
    if (rc != MANGO_OK)
        return rc;
#endif
    b->applied_lsn = res.end_lsn;
    b->applied_seq = res.next_seq;
    atomic_fetch_add_explicit(&b->rounds, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->syncs, 2, memory_order_relaxed);
    redo_log_release(b->log, p->older_head_lsn);
    return MANGO_OK;
}

/* When a round starts (emulated and pmem modes): once APPLY_WAKE_BYTES of
 * committed log wait (at most an eighth of the log, WAKE_FRACTION), the
 * frontend wakes the backend; with less waiting, the backend applies it
 * APPLY_INTERVAL_NS after the first commit it found. Lazy on purpose: a
 * wake-up per commit would cost more than the commit itself, and so did a
 * round every millisecond, the cadence until session 43: at 8 Redis clients
 * on two vCPUs its 1 300 wake-ups a second cost 4-10 % of the throughput
 * (docs/redis-benchmarks.md, session 43). A byte threshold, not a longer
 * interval alone: with 1 s and an eighth of a 64 MiB log, a round applied
 * 8 MiB of log that had left the cache and 32 clients at 100 % updates lost
 * up to 20 % (session 42); a mebibyte is still in the L2 cache and lost
 * nothing. The mirror lags the log by at most that much, which recovery
 * replays at memory speed. */
#define APPLY_INTERVAL_NS 1000000000ull
#define APPLY_WAKE_BYTES (1ull << 20)
/* fs mode: a round rewrites every page it touches (4 KiB per scattered
 * 32-byte block) and ends with a device cache flush that commits queue behind,
 * so rounds are rare: every 5 s, or when a quarter of the log waits. Measured
 * on Redis (100 % HSET, 32 clients, 256 MiB log): 16 KB written per update
 * with 1 s rounds at an eighth, 3.7 KB with these (docs/redis-benchmarks.md). A quarter
 * leaves room: the frontend may reuse log space only up to the older of the
 * two head slots, two rounds back. */
#define APPLY_INTERVAL_FS_NS 5000000000ull
#define WAKE_FRACTION_FS 4
#define WAKE_FRACTION 8

/* fs mode: a round that starts at a quarter of the log stays SCHED_IDLE until
 * half of the log waits. Boosted at a quarter, as before, every loaded round
 * ran at normal priority: its apply (a write fault per mirror page) and its
 * writeback took a CPU from the frontend for 100-250 ms every 1.5 s, halving
 * Redis's throughput and making most of its slowest operations (100 % HSET,
 * 32 clients: 87 % of those above p99 fell in rounds, 11 % of the time; in
 * rounds p99 3.9-4.7 ms against 0.75 ms outside). At idle priority the round
 * takes longer and the frontend keeps its CPU time (p99 in rounds 1.4-1.7
 * ms); the other quarter still leaves room before writers wait for space, and
 * a writer that waits raises the backend at once. In the other modes rounds
 * are short (a mebibyte of log) and the boost comes at an eighth of the log. */
#define BOOST_WAKES_FS 2

/* CLOCK_MONOTONIC time ns from now (any ns, not only below a second). */
static struct timespec deadline_after(uint64_t ns)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    uint64_t nsec = (uint64_t)t.tv_nsec + ns;
    t.tv_sec += (time_t)(nsec / 1000000000u);
    t.tv_nsec = (long)(nsec % 1000000000u);
    return t;
}

static bool has_pressure(backend *b, uint64_t committed)
{
    redo_log *l = b->log;
    return committed - b->applied_lsn >= b->wake_bytes || atomic_load(&l->space_waiters) ||
           atomic_load(&b->stop);
}

/* ---- priority (backend.h) ---- */

static int set_policy(pthread_t t, int policy)
{
    struct sched_param sp = {.sched_priority = 0};
    return pthread_setschedparam(t, policy, &sp);
}

/* Can this process take a thread out of SCHED_IDLE again? Asked of a
 * throwaway thread, so the answer covers capabilities, RLIMIT_NICE and any
 * seccomp policy without risking the backend itself. */
static void *probe_main(void *arg)
{
    bool *ok = arg;
    *ok = set_policy(pthread_self(), SCHED_IDLE) == 0 && set_policy(pthread_self(), SCHED_OTHER) == 0;
    return NULL;
}

static bool boost_permitted(void)
{
    bool ok = false;
    pthread_t t;
    if (pthread_create(&t, NULL, probe_main, &ok) != 0)
        return false;
    pthread_join(t, NULL);
    return ok;
}

/* Frontend: raise a lowered backend to SCHED_OTHER (under b->mu). */
static void boost_locked(backend *b)
{
    if (!b->lowered || atomic_load(&b->boosted))
        return;
    atomic_store(&b->boosted, 1);
    atomic_fetch_add_explicit(&b->boosts, 1, memory_order_relaxed);
    (void)set_policy(b->thread, SCHED_OTHER); /* permitted: probed at start */
}

/* Must the backend stay boosted? */
static bool keep_boost(backend *b)
{
    uint64_t backlog = atomic_load(&b->log->committed_lsn) - b->applied_lsn;
    return backlog >= b->wake_bytes / 2 || atomic_load(&b->log->space_waiters) || atomic_load(&b->stop);
}

/* Backend, after a round: lower itself again once it has caught up. */
static void maybe_lower(backend *b)
{
    if (!b->lowered || !atomic_load(&b->boosted) || keep_boost(b))
        return;
    pthread_mutex_lock(&b->mu);
    /* Again under b->mu: a writer that began to wait for space (or a stop)
     * after the check above boosts under b->mu, and seeing boosted set it
     * does nothing, so lowering now would leave the backend SCHED_IDLE
     * while that writer waits (found by a review). */
    if (!keep_boost(b)) {
        atomic_store(&b->boosted, 0);
        (void)set_policy(pthread_self(), SCHED_IDLE);
    }
    pthread_mutex_unlock(&b->mu);
}

/* A round or a head rewrite failed: stop for good. The failed sync is never
 * retried (a retry that "succeeds" proves nothing about what the failed one
 * dropped: fsyncgate), so the frontend must learn of it now: the error for
 * its threads, pd.failed for the commit path, and a wake-up for the writers
 * waiting for log space, which would otherwise sleep holding the write side. */
static void *backend_fail(backend *b, int rc)
{
    mango_error_publish_fatal(); /* why, for the frontend's threads */
    atomic_store(&b->error, rc);
    b->pool->pd.failed = true;
    redo_log_wake_space_waiters(b->log);
    return NULL;
}

static void *backend_main(void *arg)
{
    backend *b = arg;
    redo_log *l = b->log;
    pthread_setname_np(pthread_self(), "mango-backend"); /* top -H, tests */
    if (b->lowered) {
        pthread_mutex_lock(&b->mu);
        if (!atomic_load(&b->boosted)) /* a boost may have come first */
            (void)set_policy(pthread_self(), SCHED_IDLE);
        pthread_mutex_unlock(&b->mu);
    }
    for (;;) {
        uint64_t committed = atomic_load_explicit(&l->committed_lsn, memory_order_acquire);
        if (committed != b->applied_lsn) {
            int rc = backend_round(b, committed);
            if (rc != MANGO_OK)
                return backend_fail(b, rc);
            maybe_lower(b);
        }
        /* If the frontend waits for space that only lags because the older
         * head slot still names an older head, rewrite the head once. */
        if (atomic_load(&l->space_waiters) && b->pool->older_head_lsn != b->applied_lsn) {
            int rc = pool_write_head(b->pool, b->applied_lsn, b->applied_seq, l->generation, false);
            atomic_fetch_add_explicit(&b->syncs, 1, memory_order_relaxed);
            if (rc != MANGO_OK) /* as a round's failure: never retried */
                return backend_fail(b, rc);
            redo_log_release(l, b->pool->older_head_lsn);
            continue;
        }
        if (atomic_load(&b->stop) && atomic_load(&l->committed_lsn) == b->applied_lsn)
            return NULL;
        /* Sleep: untimed when there is nothing to apply (idle costs nothing),
         * otherwise until the apply interval passes or pressure builds. */
        pthread_mutex_lock(&b->mu);
        struct timespec until = deadline_after(b->interval_ns);
        for (;;) {
            uint64_t c = atomic_load(&l->committed_lsn);
            if (has_pressure(b, c))
                break;
            if (c == b->applied_lsn) {
                atomic_store(&b->sleeping, BACKEND_IDLE);
                if (atomic_load(&l->committed_lsn) != c)
                    continue; /* a commit raced with going idle */
                pthread_cond_wait(&b->cv, &b->mu);
                atomic_store(&b->sleeping, BACKEND_AWAKE);
                /* New work: start the apply interval from now. */
                until = deadline_after(b->interval_ns);
                continue;
            }
            atomic_store(&b->sleeping, BACKEND_TIMED);
            /* A commit that crossed wake_bytes between the load above and
             * this store saw AWAKE and sent no signal (found by a review,
             * session 36: the round then waited the whole interval). */
            if (has_pressure(b, atomic_load(&l->committed_lsn))) {
                atomic_store(&b->sleeping, BACKEND_AWAKE);
                break;
            }
            int w = pthread_cond_timedwait(&b->cv, &b->mu, &until);
            atomic_store(&b->sleeping, BACKEND_AWAKE);
            if (w == ETIMEDOUT)
                break;
        }
        pthread_mutex_unlock(&b->mu);
    }
}

static void backend_kick(void *arg)
{
    backend *b = arg;
    pthread_mutex_lock(&b->mu);
    boost_locked(b); /* a writer waits for log space */
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

int backend_start(backend *b, pool *p, redo_log *log, const big_batch_writer *big, mango_backend_priority prio)
{
    memset(b, 0, sizeof *b);
    if (prio != MANGO_BACKEND_PRIORITY_NORMAL) {
        b->lowered = boost_permitted();
        if (!b->lowered && prio == MANGO_BACKEND_PRIORITY_IDLE)
            return mango_error(MANGO_EINVAL,
                               "backend priority 'idle' needs permission to raise a thread out of "
                               "SCHED_IDLE again (root, CAP_SYS_NICE or RLIMIT_NICE >= 20); use "
                               "'auto' or 'normal'");
    }
    b->pool = p;
    b->log = log;
    b->big = big;
    b->applied_lsn = atomic_load(&log->committed_lsn);
    b->applied_seq = log->next_seq;
    bool fs = p->pd.mode == PERSIST_FS;
    if (fs) {
        b->wake_bytes = log->cap / WAKE_FRACTION_FS;
        b->boost_bytes = BOOST_WAKES_FS * b->wake_bytes;
        b->interval_ns = APPLY_INTERVAL_FS_NS;
    } else {
        b->boost_bytes = log->cap / WAKE_FRACTION;
        b->wake_bytes = b->boost_bytes < APPLY_WAKE_BYTES ? b->boost_bytes : APPLY_WAKE_BYTES;
        b->interval_ns = APPLY_INTERVAL_NS;
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    log->kick = backend_kick;
    log->kick_arg = b;
    if (pthread_create(&b->thread, NULL, backend_main, b) != 0)
        return mango_error(MANGO_ENOMEM, "cannot start the backend thread");
    b->started = true;
    return MANGO_OK;
}

void backend_notify(backend *b)
{
    int st = atomic_load(&b->sleeping);
    uint64_t backlog = atomic_load_explicit(&b->log->committed_lsn, memory_order_relaxed) - b->applied_lsn;
    bool pressure = backlog >= b->wake_bytes;
    /* A lowered backend that is far behind is raised whatever it is doing: it
     * may be runnable but starved, mid-round. */
    bool urgent = backlog >= b->boost_bytes;
    bool boost = urgent && b->lowered && !atomic_load_explicit(&b->boosted, memory_order_relaxed);
    if (st == BACKEND_IDLE || (st == BACKEND_TIMED && pressure) || boost) {
        pthread_mutex_lock(&b->mu);
        if (urgent)
            boost_locked(b);
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
}

int backend_stop(backend *b, bool drain)
{
    if (!b->started)
        return MANGO_OK;
    (void)drain; /* the thread drains everything committed before it looks at stop */
    pthread_mutex_lock(&b->mu);
    boost_locked(b); /* the drain should not wait for idle CPU time */
    atomic_store(&b->stop, 1);
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    b->started = false;
    int rc = atomic_load(&b->error);
    if (rc != MANGO_OK) /* the thread's message, for the caller (it said "no error") */
        mango_error_adopt_fatal();
    /* A failed pool gets no clean head: a sync failed somewhere (the log's,
     * a big batch's, the backend's), and clean would tell recovery that
     * everything up to here is safe. */
    if (rc == MANGO_OK && drain && b->pool->pd.failed)
        rc = mango_error(MANGO_EIO, "the pool had an I/O error; its head is not marked clean");
    else if (rc == MANGO_OK && drain)
        /* mango_shutdown then removes the big-batch file, so both head slots
         * must be past the last big frame (pool-format.md), not only the
         * clean one: recovery falls back to the other slot if the clean one
         * is damaged. The slot this head does not overwrite holds the last
         * round's head, which is the end of the log already: every head
         * write is at applied_lsn, and the drain above applied everything
         * (unit.test_big_batch checks that both slots name the same head). */
        rc = pool_write_head(b->pool, b->applied_lsn, b->applied_seq, b->log->generation, true);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    return rc;
}
