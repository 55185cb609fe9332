/* test_flat_combining.c -- unit tests for src/concurrency/flat_combining.c.
 *
 * Covers: reader/writer/combiner mutual exclusion (plus fc_execute_exclusive),
 * that concurrent writers really get batched, propagation of batch_begin
 * errors and batch_end results, the max_threads limit, slot reuse after a
 * thread exits, two fc instances used by the same threads, and the pipelined
 * commit hooks (tickets waited for outside the lock, by writers and readers)
 * and fc_readers_waiting.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "concurrency/flat_combining.h"
#include "mango.h"

static _Atomic int g_failed_checks_a;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, \
                    #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            atomic_fetch_add(&g_failed_checks_a, 1);                         \
        }                                                                    \
    } while (0)

/* ---- shared model ------------------------------------------------------ */

typedef struct model {
    /* Protected by the write side; deliberately non-atomic. */
    unsigned long a, b;
    unsigned long batches;
    unsigned long batched_cmds;
    unsigned max_batch;
    unsigned long multi_batches; /* batches with n > 1 */
    unsigned long processed;
    int begin_error; /* batch_begin returns this */
    int end_base;    /* batch_end returns end_base + batch number */
    unsigned end_sleep_us; /* batch_end sleeps this long (a "persist") */
    unsigned yield_every;  /* process yields the CPU every Nth call */
    _Atomic unsigned yield_ctr;
    /* Violation detectors (atomic so the checks themselves do not race). */
    _Atomic int in_batch;
    _Atomic int readers_inside;
    _Atomic unsigned long violations;
    unsigned long end_calls;
    /* Pipelined commit (wait_durable / read_target hooks). */
    _Atomic unsigned long ended;    /* ticket of the last ended batch */
    unsigned long null_ticket_ends; /* batch_end calls that had to be durable */
    int wait_error;                 /* wait_durable returns this */
    unsigned wait_sleep_us;         /* wait_durable sleeps this long (a "sync") */
    _Atomic int waiting;            /* threads inside wait_durable */
    unsigned long begins_while_waiting; /* batches begun while a thread waited */
    fc *f;                          /* set: batch_end counts fc_batch_async */
    unsigned long async_ends;       /* batch_end calls with fc_batch_async() true */
} model;

typedef struct cmd {
    bool ro;
    model *m;
    int batch_seen; /* batch number that ran it (RW), or the last batch it saw (RO) */
} cmd;

/* The ticket this thread's last wait_durable call waited for. */
static __thread unsigned long last_waited;

static bool h_is_ro(void *ctx) { return ((cmd *)ctx)->ro; }

static void burn(unsigned n)
{
    for (volatile unsigned i = 0; i < n; i++)
        ;
}

static void maybe_yield(model *m)
{
    if (m->yield_every &&
        atomic_fetch_add_explicit(&m->yield_ctr, 1, memory_order_relaxed) %
                m->yield_every ==
            0)
        sched_yield();
}

static void h_process(void *ctx)
{
    cmd *c = ctx;
    model *m = c->m;
    maybe_yield(m);
    if (c->ro) {
        atomic_fetch_add(&m->readers_inside, 1);
        if (atomic_load(&m->in_batch) != 0)
            atomic_fetch_add(&m->violations, 1);
        unsigned long a = m->a;
        burn(50);
        unsigned long b = m->b;
        if (a != b)
            atomic_fetch_add(&m->violations, 1);
        c->batch_seen = (int)m->batches;
        atomic_fetch_sub(&m->readers_inside, 1);
    } else {
        if (atomic_load(&m->in_batch) != 1 ||
            atomic_load(&m->readers_inside) != 0)
            atomic_fetch_add(&m->violations, 1);
        m->a++;
        burn(20);
        m->b++;
        m->processed++;
        c->batch_seen = (int)m->batches;
    }
}

static int h_begin(void *arg, unsigned n)
{
    model *m = arg;
    if (atomic_fetch_add(&m->in_batch, 1) != 0)
        atomic_fetch_add(&m->violations, 1);
    if (atomic_load(&m->readers_inside) != 0)
        atomic_fetch_add(&m->violations, 1);
    if (m->begin_error) {
        atomic_fetch_sub(&m->in_batch, 1);
        return m->begin_error;
    }
    if (atomic_load(&m->waiting) > 0)
        m->begins_while_waiting++;
    m->batches++;
    m->batched_cmds += n;
    if (n > m->max_batch)
        m->max_batch = n;
    if (n > 1)
        m->multi_batches++;
    return 0;
}

static int h_end(void *arg, uint64_t *ticket)
{
    model *m = arg;
    m->end_calls++;
    if (m->f && fc_batch_async(m->f))
        m->async_ends++;
    if (ticket) {
        *ticket = m->batches; /* durable later, in wait_durable */
        atomic_store(&m->ended, m->batches);
    } else {
        m->null_ticket_ends++;
    }
    /* Stand-in for making the batch durable: gives writers time to queue. */
    if (m->end_sleep_us)
        usleep(m->end_sleep_us);
    if (atomic_fetch_sub(&m->in_batch, 1) != 1)
        atomic_fetch_add(&m->violations, 1);
    return m->end_base ? m->end_base + (int)m->batches : 0;
}

static int h_wait(void *arg, uint64_t ticket)
{
    model *m = arg;
    atomic_fetch_add(&m->waiting, 1);
    last_waited = ticket;
    if (m->wait_sleep_us)
        usleep(m->wait_sleep_us);
    atomic_fetch_sub(&m->waiting, 1);
    return m->wait_error;
}

/* A read waits for the last ended batch's ticket, as the runtime's does. */
static int h_read_target(void *arg, void *ctx, uint64_t *ticket)
{
    (void)ctx;
    *ticket = atomic_load(&((model *)arg)->ended);
    return 0;
}

static fc_hooks make_hooks(model *m)
{
    fc_hooks h = {.is_read_only = h_is_ro,
                  .process = h_process,
                  .batch_begin = h_begin,
                  .batch_end = h_end,
                  .arg = m};
    return h;
}

static void excl_fn(void *arg)
{
    model *m = arg;
    if (atomic_load(&m->in_batch) != 1 || atomic_load(&m->readers_inside) != 0)
        atomic_fetch_add(&m->violations, 1);
    m->a++;
    burn(20);
    m->b++;
}

/* ---- worker ------------------------------------------------------------ */

typedef struct worker {
    pthread_barrier_t *start;
    fc *f;
    model *m;
    unsigned ops;
    unsigned rw_pct; /* percentage of RW commands */
    unsigned seed;
    bool use_exclusive;
    int expect_rw; /* expected result for RW if check_result */
    int check_mode; /* 0: expect 0, 1: expect expect_rw, 2: expect end_base+batch_seen */
    /* out */
    unsigned long rw_done, excl_done;
    unsigned long bad_results;
} worker;

static void *worker_main(void *p)
{
    worker *w = p;
    unsigned seed = w->seed;
    pthread_barrier_wait(w->start);
    for (unsigned i = 0; i < w->ops; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = (seed >> 16) % 100;
        if (w->use_exclusive && r == 0) {
            int rc = fc_execute_exclusive(w->f, excl_fn, w->m);
            if (rc != 0)
                w->bad_results++;
            w->excl_done++;
            continue;
        }
        cmd c = {.ro = r >= w->rw_pct, .m = w->m, .batch_seen = -1};
        int rc = fc_execute(w->f, &c);
        if (c.ro) {
            if (rc != 0)
                w->bad_results++;
            continue;
        }
        w->rw_done++;
        int want = w->check_mode == 0   ? 0
                   : w->check_mode == 1 ? w->expect_rw
                                        : w->m->end_base + c.batch_seen;
        if (rc != want)
            w->bad_results++;
        if (w->check_mode == 1 && c.batch_seen != -1) /* begin failed: must not run */
            w->bad_results++;
    }
    return NULL;
}

static void run_workers(fc *f, model *m, unsigned nthreads, unsigned ops,
                        unsigned rw_pct, bool excl, int check_mode,
                        int expect_rw, worker *ws)
{
    pthread_t th[16];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, nthreads);
    for (unsigned i = 0; i < nthreads; i++) {
        ws[i] = (worker){.start = &start, .f = f, .m = m, .ops = ops, .rw_pct = rw_pct,
                         .seed = 77 + i * 1337, .use_exclusive = excl,
                         .check_mode = check_mode, .expect_rw = expect_rw};
        pthread_create(&th[i], NULL, worker_main, &ws[i]);
    }
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
}

/* ---- tests ------------------------------------------------------------- */

static int test_mutual_exclusion(void)
{
    model m;
    memset(&m, 0, sizeof m);
    m.yield_every = 50;
    fc_hooks h = make_hooks(&m);
    fc *f;
    CHECK(fc_create(&f, 16, &h) == 0, "fc_create");
    worker ws[8];
    run_workers(f, &m, 8, 20000, 30, true, 0, 0, ws);
    unsigned long rw = 0, ex = 0, bad = 0;
    for (int i = 0; i < 8; i++) {
        rw += ws[i].rw_done;
        ex += ws[i].excl_done;
        bad += ws[i].bad_results;
    }
    CHECK(atomic_load(&m.violations) == 0, "%lu exclusion violations",
          atomic_load(&m.violations));
    CHECK(bad == 0, "%lu bad results", bad);
    CHECK(m.a == m.b, "a=%lu b=%lu", m.a, m.b);
    CHECK(m.a == rw + ex, "a=%lu expected %lu", m.a, rw + ex);
    CHECK(m.processed == rw, "processed %lu rw %lu", m.processed, rw);
    CHECK(m.batched_cmds == rw + ex, "batched %lu", m.batched_cmds);
    CHECK(ex > 0, "no exclusive ops ran");
    printf("  mutual exclusion: %lu rw, %lu exclusive, %lu batches (max %u)\n",
           rw, ex, m.batches, m.max_batch);
    fc_destroy(f);
    return 0;
}

static int test_batching(void)
{
    model m;
    memset(&m, 0, sizeof m);
    m.end_base = 1000;
    m.end_sleep_us = 50;
    fc_hooks h = make_hooks(&m);
    fc *f;
    CHECK(fc_create(&f, 8, &h) == 0, "fc_create");
    worker ws[8];
    /* All RW; also checks each command gets its own batch's batch_end result. */
    run_workers(f, &m, 8, 500, 100, false, 2, 0, ws);
    unsigned long rw = 0, bad = 0;
    for (int i = 0; i < 8; i++) {
        rw += ws[i].rw_done;
        bad += ws[i].bad_results;
    }
    CHECK(atomic_load(&m.violations) == 0, "%lu violations",
          atomic_load(&m.violations));
    CHECK(bad == 0, "%lu commands got a result other than their batch's", bad);
    CHECK(m.batched_cmds == rw && m.a == rw, "batched %lu a %lu rw %lu",
          m.batched_cmds, m.a, rw);
    CHECK(m.multi_batches > 0, "no batch had more than one command");
    CHECK(m.batches < rw, "batches %lu rw %lu", m.batches, rw);
    CHECK(m.max_batch <= 8, "max batch %u > threads", m.max_batch);
    printf("  batching: %lu cmds in %lu batches, %lu with n>1, max %u\n", rw,
           m.batches, m.multi_batches, m.max_batch);
    fc_destroy(f);
    return 0;
}

static int test_begin_error(void)
{
    model m;
    memset(&m, 0, sizeof m);
    m.begin_error = MANGO_EIO;
    fc_hooks h = make_hooks(&m);
    fc *f;
    CHECK(fc_create(&f, 8, &h) == 0, "fc_create");
    worker ws[8];
    run_workers(f, &m, 8, 500, 100, false, 1, MANGO_EIO, ws);
    unsigned long bad = 0;
    for (int i = 0; i < 8; i++)
        bad += ws[i].bad_results;
    CHECK(bad == 0, "%lu commands did not get MANGO_EIO or ran anyway", bad);
    CHECK(m.processed == 0 && m.a == 0, "process ran %lu times", m.processed);
    CHECK(m.end_calls == 0, "batch_end called %lu times", m.end_calls);
    /* The exclusive path propagates it too, without running fn. */
    CHECK(fc_execute_exclusive(f, excl_fn, &m) == MANGO_EIO, "exclusive");
    CHECK(m.a == 0, "exclusive fn ran");
    /* Read-only commands are unaffected. */
    cmd c = {.ro = true, .m = &m};
    CHECK(fc_execute(f, &c) == 0, "ro");
    fc_destroy(f);
    return 0;
}

static int test_end_result(void)
{
    model m;
    memset(&m, 0, sizeof m);
    m.end_base = 5000;
    fc_hooks h = make_hooks(&m);
    fc *f;
    CHECK(fc_create(&f, 4, &h) == 0, "fc_create");
    /* Single thread: each command is its own batch. */
    for (int i = 1; i <= 10; i++) {
        cmd c = {.ro = false, .m = &m, .batch_seen = -1};
        int rc = fc_execute(f, &c);
        CHECK(rc == 5000 + i && c.batch_seen == i, "rc %d seen %d i %d", rc,
              c.batch_seen, i);
    }
    CHECK(m.max_batch == 1, "max batch %u", m.max_batch);
    /* Exclusive returns batch_end's value and counts as a batch of one. */
    int rc = fc_execute_exclusive(f, excl_fn, &m);
    CHECK(rc == 5000 + 11, "exclusive rc %d", rc);
    CHECK(m.a == 11 && m.b == 11, "a %lu", m.a);
    /* Multi-threaded: every waiter gets its own batch's value (also in
     * test_batching); here with readers mixed in. */
    /* max_threads is 4 and main holds a slot: three more threads fit. */
    worker ws[3];
    memset(&m, 0, sizeof m);
    m.end_base = 7;
    m.yield_every = 20;
    run_workers(f, &m, 3, 2000, 60, false, 2, 0, ws);
    unsigned long bad = 0;
    for (int i = 0; i < 3; i++)
        bad += ws[i].bad_results;
    CHECK(bad == 0, "%lu wrong results", bad);
    fc_destroy(f);
    return 0;
}

/* Pipelined commit: every RW command waits for its own batch's ticket, every
 * RO command for a ticket at least the last batch it saw, both outside the
 * lock (batches begin while threads wait), and wait_durable's error becomes
 * the result; exclusive batches still end durable (NULL ticket). */
typedef struct pipe_worker {
    fc *f;
    model *m;
    unsigned ops, seed;
    unsigned long rw, ro, bad;
} pipe_worker;

static void *pipe_main(void *p)
{
    pipe_worker *w = p;
    unsigned seed = w->seed;
    for (unsigned i = 0; i < w->ops; i++) {
        seed = seed * 1103515245u + 12345u;
        cmd c = {.ro = (seed >> 16) % 100 < 40, .m = w->m, .batch_seen = -1};
        last_waited = 0;
        int rc = fc_execute(w->f, &c);
        if (rc != w->m->wait_error) {
            w->bad++;
            continue;
        }
        if (c.ro) {
            w->ro++;
            /* A read that saw batch k must have waited for a ticket >= k (a
             * read that saw nothing may skip the wait: ticket 0). */
            if (c.batch_seen > 0 && last_waited < (unsigned long)c.batch_seen)
                w->bad++;
        } else {
            w->rw++;
            if (last_waited != (unsigned long)c.batch_seen)
                w->bad++;
        }
    }
    return NULL;
}

static int test_pipelined_tickets(void)
{
    model m;
    memset(&m, 0, sizeof m);
    m.wait_sleep_us = 100;
    fc_hooks h = make_hooks(&m);
    h.wait_durable = h_wait;
    h.read_target = h_read_target;
    fc *f;
    CHECK(fc_create(&f, 8, &h) == 0, "fc_create");
    pipe_worker ws[6];
    pthread_t th[6];
    for (unsigned i = 0; i < 6; i++) {
        ws[i] = (pipe_worker){.f = f, .m = &m, .ops = 400, .seed = 11 + 97 * i};
        pthread_create(&th[i], NULL, pipe_main, &ws[i]);
    }
    unsigned long rw = 0, ro = 0, bad = 0;
    for (unsigned i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        rw += ws[i].rw;
        ro += ws[i].ro;
        bad += ws[i].bad;
    }
    CHECK(atomic_load(&m.violations) == 0, "%lu violations", atomic_load(&m.violations));
    CHECK(bad == 0, "%lu commands waited for the wrong ticket or got a wrong result", bad);
    CHECK(rw > 0 && ro > 0, "rw %lu ro %lu", rw, ro);
    CHECK(m.null_ticket_ends == 0, "%lu combined batches ended without a ticket", m.null_ticket_ends);
    CHECK(m.begins_while_waiting > 0, "no batch began while a thread waited: waits hold the lock?");
    printf("  pipelined: %lu rw, %lu ro, %lu batches, %lu begun while threads waited\n", rw, ro,
           m.batches, m.begins_while_waiting);
    /* The exclusive path must end durable: batch_end gets no ticket. */
    CHECK(fc_execute_exclusive(f, excl_fn, &m) == 0 && m.null_ticket_ends == 1, "exclusive");
    /* A failed wait replaces the result, for writers and readers. */
    m.wait_error = MANGO_EIO;
    m.wait_sleep_us = 0;
    cmd w = {.ro = false, .m = &m, .batch_seen = -1};
    CHECK(fc_execute(f, &w) == MANGO_EIO, "rw with a failed wait");
    cmd r = {.ro = true, .m = &m, .batch_seen = -1};
    CHECK(fc_execute(f, &r) == MANGO_EIO, "ro with a failed wait");
    fc_destroy(f);
    return 0;
}

/* fc_readers_waiting: true while a reader backs off for a held write side. */
typedef struct reader_arg {
    fc *f;
    model *m;
    int rc;
} reader_arg;

/* fc_submit: the same commands, but the ticket is handed back instead of
 * waited for, and batch_end knows the batch holds such a command. */
static int test_submit(void)
{
    model m;
    memset(&m, 0, sizeof m);
    fc_hooks h = make_hooks(&m);
    h.wait_durable = h_wait;
    h.read_target = h_read_target;
    fc *f;
    CHECK(fc_create(&f, 4, &h) == 0, "fc_create");
    m.f = f;
    m.wait_error = MANGO_EIO; /* a wait would fail: fc_submit must not wait */
    last_waited = 12345;
    cmd w = {.ro = false, .m = &m, .batch_seen = -1};
    uint64_t t = 0;
    CHECK(fc_submit(f, &w, &t, true) == 0 && t == 1 && w.batch_seen == 1, "rw submit: rc, ticket %llu",
          (unsigned long long)t);
    CHECK(m.async_ends == 1, "batch_end saw fc_batch_async %lu times", m.async_ends);
    cmd r = {.ro = true, .m = &m, .batch_seen = -1};
    t = 0;
    CHECK(fc_submit(f, &r, &t, true) == 0 && t == 1, "ro submit: ticket %llu", (unsigned long long)t);
    CHECK(last_waited == 12345, "fc_submit waited for ticket %lu", last_waited);
    /* fc_execute waits (and gets the wait's error), and its batch is not async. */
    CHECK(fc_execute(f, &w) == MANGO_EIO && last_waited == 2 && m.async_ends == 1, "rw execute");
    CHECK(fc_execute(f, &r) == MANGO_EIO, "ro execute");
    /* Without hand_over: the ticket still comes back unwaited, but the
     * batch is not marked for the sync thread. */
    last_waited = 12345;
    CHECK(fc_submit(f, &w, &t, false) == 0 && t == 3 && m.async_ends == 1 && last_waited == 12345,
          "rw submit without hand_over: ticket %llu", (unsigned long long)t);
    /* A failed batch hands back its error and no ticket. */
    m.begin_error = MANGO_EIO;
    t = 7;
    CHECK(fc_submit(f, &w, &t, true) == MANGO_EIO && t == 0, "failed submit: ticket %llu", (unsigned long long)t);
    fc_destroy(f);
    return 0;
}

static void *reader_main(void *p)
{
    reader_arg *a = p;
    cmd c = {.ro = true, .m = a->m, .batch_seen = -1};
    a->rc = fc_execute(a->f, &c);
    return NULL;
}

static int test_readers_waiting(void)
{
    model m;
    memset(&m, 0, sizeof m);
    fc_hooks h = make_hooks(&m);
    fc *f;
    CHECK(fc_create(&f, 4, &h) == 0, "fc_create");
    CHECK(!fc_readers_waiting(f), "a reader waits before any exists");
    CHECK(fc_exclusive_begin(f) == 0, "exclusive begin");
    reader_arg a = {.f = f, .m = &m, .rc = -1};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &a);
    bool seen = false;
    for (int i = 0; i < 2000 && !seen; i++) { /* up to 2 s */
        seen = fc_readers_waiting(f);
        if (!seen)
            usleep(1000);
    }
    CHECK(seen, "the blocked reader was never reported");
    CHECK(fc_exclusive_end(f) == 0, "exclusive end");
    pthread_join(th, NULL);
    CHECK(a.rc == 0, "reader rc %d", a.rc);
    CHECK(!fc_readers_waiting(f), "a reader still counted after it ran");
    fc_destroy(f);
    return 0;
}

/* process_read runs read-only commands (process keeps the writes);
 * fc_reads_seen reports reads of other threads since its last call, not the
 * caller's own. */
static _Atomic unsigned long reads_via_process_read;

static void h_process_read(void *ctx)
{
    atomic_fetch_add(&reads_via_process_read, 1);
    h_process(ctx);
}

static int test_process_read_and_reads_seen(void)
{
    model m;
    memset(&m, 0, sizeof m);
    fc_hooks h = make_hooks(&m);
    h.process_read = h_process_read;
    fc *f;
    CHECK(fc_create(&f, 4, &h) == 0, "fc_create");
    cmd r = {.ro = true, .m = &m, .batch_seen = -1};
    CHECK(fc_execute(f, &r) == 0, "ro");
    cmd w = {.ro = false, .m = &m, .batch_seen = -1};
    CHECK(fc_execute(f, &w) == 0, "rw");
    CHECK(atomic_load(&reads_via_process_read) == 1, "process_read ran %lu times",
          atomic_load(&reads_via_process_read));
    CHECK(m.processed == 1, "process ran %lu writes", m.processed);
    /* This thread's own read does not count. */
    CHECK(!fc_reads_seen(f), "the caller's own read was reported");
    CHECK(fc_execute(f, &r) == 0, "ro");
    CHECK(!fc_reads_seen(f), "the caller's own read was reported");
    /* Another thread's does, once. */
    reader_arg a = {.f = f, .m = &m, .rc = -1};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &a);
    pthread_join(th, NULL);
    CHECK(a.rc == 0, "reader rc %d", a.rc);
    CHECK(fc_reads_seen(f), "another thread's read was not reported");
    CHECK(!fc_reads_seen(f), "a read reported twice");
    CHECK(atomic_load(&reads_via_process_read) == 3, "process_read ran %lu times",
          atomic_load(&reads_via_process_read));
    fc_destroy(f);
    return 0;
}

/* fc_reads_seen when the caller changes (review of 2026-11-25: a sum that
 * left out each caller's own slot compared sums over different slots, so it
 * missed reads and reported reads that never happened). B is a thread that
 * stays alive and runs a read or an fc_reads_seen call when told. */
typedef struct seen_peer {
    fc *f;
    model *m;
    _Atomic int step; /* 1: read, 2: call fc_reads_seen; the peer sets 0 when done */
    bool seen;
    _Atomic bool quit;
} seen_peer;

static void *seen_peer_main(void *p)
{
    seen_peer *b = p;
    while (!atomic_load(&b->quit)) {
        int st = atomic_load(&b->step);
        if (st == 1) {
            cmd c = {.ro = true, .m = b->m, .batch_seen = -1};
            fc_execute(b->f, &c);
        } else if (st == 2) {
            b->seen = fc_reads_seen(b->f);
        } else {
            usleep(100);
            continue;
        }
        atomic_store(&b->step, 0);
    }
    return NULL;
}

static void peer_do(seen_peer *b, int step)
{
    atomic_store(&b->step, step);
    while (atomic_load(&b->step) != 0)
        usleep(100);
}

static int test_reads_seen_across_callers(void)
{
    model m;
    memset(&m, 0, sizeof m);
    fc_hooks h = make_hooks(&m);
    fc *f;
    CHECK(fc_create(&f, 4, &h) == 0, "fc_create");
    seen_peer b = {.f = f, .m = &m};
    pthread_t tb;
    pthread_create(&tb, NULL, seen_peer_main, &b);
    cmd r = {.ro = true, .m = &m, .batch_seen = -1};
    peer_do(&b, 1);                        /* B reads */
    CHECK(fc_execute(f, &r) == 0, "ro");   /* A reads */
    CHECK(fc_reads_seen(f), "A did not see B's read");
    reader_arg a = {.f = f, .m = &m, .rc = -1};
    pthread_t tc;                          /* C reads, while A and B hold their slots */
    pthread_create(&tc, NULL, reader_main, &a);
    pthread_join(tc, NULL);
    peer_do(&b, 2);
    CHECK(b.seen, "B did not see C's read");
    CHECK(!fc_reads_seen(f), "A saw reads although nobody read since B's call");
    peer_do(&b, 1);                        /* B reads again */
    peer_do(&b, 2);
    CHECK(!b.seen, "B saw its own read");
    CHECK(!fc_reads_seen(f), "B's read, already seen by B's call, was seen again");
    atomic_store(&b.quit, true);
    pthread_join(tb, NULL);
    fc_destroy(f);
    return 0;
}

/* -- thread limit -- */

typedef struct holder {
    fc *f;
    model *m;
    int rc;
    pthread_barrier_t *entered;
    pthread_barrier_t *leave;
} holder;

static void *holder_main(void *p)
{
    holder *hd = p;
    cmd c = {.ro = false, .m = hd->m, .batch_seen = -1};
    hd->rc = fc_execute(hd->f, &c);
    pthread_barrier_wait(hd->entered);
    pthread_barrier_wait(hd->leave);
    return NULL;
}

static void *try_once_main(void *p)
{
    holder *hd = p;
    cmd c = {.ro = true, .m = hd->m};
    hd->rc = fc_execute(hd->f, &c);
    return NULL;
}

static int test_thread_limit(void)
{
    model m;
    memset(&m, 0, sizeof m);
    fc_hooks h = make_hooks(&m);
    fc *f, *f2;
    CHECK(fc_create(&f, 3, &h) == 0, "fc_create");
    CHECK(fc_create(&f2, 1, &h) == 0, "fc_create 2");
    {
        fc *bad;
        CHECK(fc_create(&bad, 0, &h) == MANGO_EINVAL, "max_threads 0");
        fc_hooks nop = {0};
        CHECK(fc_create(&bad, 4, &nop) == MANGO_EINVAL, "no process hook");
    }

    pthread_barrier_t entered, leave[3];
    pthread_barrier_init(&entered, NULL, 4);
    holder hd[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        pthread_barrier_init(&leave[i], NULL, 2);
        hd[i] = (holder){.f = f, .m = &m, .rc = -100, .entered = &entered,
                         .leave = &leave[i]};
        pthread_create(&th[i], NULL, holder_main, &hd[i]);
    }
    pthread_barrier_wait(&entered);
    for (int i = 0; i < 3; i++)
        CHECK(hd[i].rc == 0, "holder %d rc %d", i, hd[i].rc);

    /* Fourth live thread (main): no slot, for RW and RO alike. */
    cmd c = {.ro = false, .m = &m, .batch_seen = -1};
    CHECK(fc_execute(f, &c) == MANGO_EINVAL, "4th thread RW");
    CHECK(c.batch_seen == -1, "4th thread's command ran");
    c.ro = true;
    CHECK(fc_execute(f, &c) == MANGO_EINVAL, "4th thread RO");
    /* Another fc instance has its own slots. */
    c.ro = false;
    CHECK(fc_execute(f2, &c) == 0, "main on f2");

    /* One holder exits: its slot becomes reusable. */
    pthread_barrier_wait(&leave[0]);
    pthread_join(th[0], NULL);
    c.batch_seen = -1;
    CHECK(fc_execute(f, &c) == 0, "after exit, RW");
    CHECK(c.batch_seen >= 0, "command did not run");
    c.ro = true;
    CHECK(fc_execute(f, &c) == 0, "after exit, RO");

    /* Now main holds the freed slot: a fresh thread is refused again. */
    holder t = {.f = f, .m = &m, .rc = -100};
    pthread_t tt;
    pthread_create(&tt, NULL, try_once_main, &t);
    pthread_join(tt, NULL);
    CHECK(t.rc == MANGO_EINVAL, "5th thread rc %d", t.rc);
    /* f2 (max 1) is held by main: the same thread is refused there too. */
    t.f = f2;
    t.rc = -100;
    pthread_create(&tt, NULL, try_once_main, &t);
    pthread_join(tt, NULL);
    CHECK(t.rc == MANGO_EINVAL, "f2 second thread rc %d", t.rc);

    for (int i = 1; i < 3; i++) {
        pthread_barrier_wait(&leave[i]);
        pthread_join(th[i], NULL);
    }
    /* Slots freed by exited threads can be taken by new ones, repeatedly. */
    for (int k = 0; k < 10; k++) {
        t.f = f;
        t.rc = -100;
        pthread_create(&tt, NULL, try_once_main, &t);
        pthread_join(tt, NULL);
        CHECK(t.rc == 0, "reuse round %d rc %d", k, t.rc);
    }
    for (int i = 0; i < 3; i++)
        pthread_barrier_destroy(&leave[i]);
    pthread_barrier_destroy(&entered);
    fc_destroy(f);
    fc_destroy(f2);
    return 0;
}

/* -- two instances hammered by the same threads -- */

typedef struct two_arg {
    fc *f1, *f2;
    model *m1, *m2;
    unsigned long rw1, rw2;
} two_arg;

static void *two_main(void *p)
{
    two_arg *a = p;
    for (int i = 0; i < 3000; i++) {
        bool one = i & 1;
        cmd c = {.ro = (i % 3) == 0, .m = one ? a->m1 : a->m2,
                 .batch_seen = -1};
        int rc = fc_execute(one ? a->f1 : a->f2, &c);
        if (rc != 0)
            atomic_fetch_add(&c.m->violations, 1);
        if (!c.ro)
            (*(one ? &a->rw1 : &a->rw2))++;
    }
    return NULL;
}

static int test_two_instances(void)
{
    model m1, m2;
    memset(&m1, 0, sizeof m1);
    memset(&m2, 0, sizeof m2);
    fc_hooks h1 = make_hooks(&m1), h2 = make_hooks(&m2);
    fc *f1, *f2;
    CHECK(fc_create(&f1, 4, &h1) == 0, "create 1");
    CHECK(fc_create(&f2, 4, &h2) == 0, "create 2");
    two_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (two_arg){.f1 = f1, .f2 = f2, .m1 = &m1, .m2 = &m2};
        pthread_create(&th[i], NULL, two_main, &args[i]);
    }
    unsigned long rw1 = 0, rw2 = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        rw1 += args[i].rw1;
        rw2 += args[i].rw2;
    }
    CHECK(atomic_load(&m1.violations) == 0 && atomic_load(&m2.violations) == 0,
          "violations %lu %lu", atomic_load(&m1.violations),
          atomic_load(&m2.violations));
    CHECK(m1.a == rw1 && m2.a == rw2, "m1 %lu/%lu m2 %lu/%lu", m1.a, rw1, m2.a,
          rw2);
    fc_destroy(f1);
    fc_destroy(f2);
    return 0;
}

int main(void)
{
    struct {
        const char *name;
        int (*fn)(void);
    } tests[] = {
        {"mutual_exclusion", test_mutual_exclusion},
        {"batching", test_batching},
        {"begin_error", test_begin_error},
        {"end_result", test_end_result},
        {"thread_limit", test_thread_limit},
        {"two_instances", test_two_instances},
        {"pipelined_tickets", test_pipelined_tickets},
        {"readers_waiting", test_readers_waiting},
        {"process_read_and_reads_seen", test_process_read_and_reads_seen},
        {"reads_seen_across_callers", test_reads_seen_across_callers},
        {"submit", test_submit},
    };
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = atomic_load(&g_failed_checks_a);
        int rc = tests[i].fn();
        bool ok = rc == 0 && atomic_load(&g_failed_checks_a) == before;
        printf("%s %s\n", ok ? "PASS" : "FAIL", tests[i].name);
        if (ok)
            passed++;
        else
            failed++;
    }
    printf("test_flat_combining: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
