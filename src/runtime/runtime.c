/* runtime.c -- mango_init / mango_client_cmd / mango_shutdown: wires the pool,
 * recovery, capture, redo log, backend and concurrency control together.
 *
 * A read-write batch (paper, Fig. 2 and 3):
 *   batch_begin  capture on, allocations durable, deferred frees drained
 *   process      the application's commands; stores land in the dedup set
 *   batch_end    capture off; one frame with every captured block is written
 *                to the log and synced once; the backend is nudged
 *
 * In fs/sim mode a batch does not wait for its sync under the lock: the frame
 * is sealed and the sync thread of log/commit_pipeline.c makes it durable
 * while the next batch runs. mango_batch_submit (event-loop mode) returns a
 * ticket the caller holds replies against; combined batches (mango_client_cmd)
 * are waited for by each command's own thread once the lock is released
 * (wait_durable), and read-only commands wait for what they may have read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>

#include "alloc/durable_heap.h"
#include "alloc/split_alloc.h"
#include "backend/backend.h"
#include "capture/capture.h"
#include "capture/scratch.h"
#include "capture/verify.h"
#include "concurrency/flat_combining.h"
#include "concurrency/read_deps.h"
#include "log/big_batch.h"
#include "log/commit_pipeline.h"
#include "log/redo_log.h"
#include "mango.h"
#include "pool/pool.h"
#include "recovery/layout.h"
#include "recovery/recovery.h"
#include "recovery/trace.h"
#include "rpc/rpc_server.h"
#include "snapshot/snapshot.h"
#include "runtime/env_number.h"
#include "runtime/error.h"
#include "runtime/submit.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

typedef struct runtime {
    bool up;
    bool durable;
    bool verify; /* capture verifier on (test mode, capture/verify.h) */
    mango_callbacks cb;
    mango_config cfg;
    char pool_path[PATH_MAX];
    bool pool_created; /* this mango_init made the pool file (open_durable) */
    pool pool;
    redo_log log;
    big_batch_writer big; /* batches too large for a log frame */
    backend backend;
    commit_pipeline pipe;
    bool pipe_started;
    bool defer_commit; /* set by mango_batch_submit around its batch_end */
    fc *fc;
    dedup_set *set;
    process_layout layout;
    recovery_report recovery;
    void *heap;
    size_t heap_size;
    _Atomic int failed; /* MANGO_E* after a fatal error: no more writes */
    uint64_t commit_ns_ewma; /* average commit (write + sync) time, for group commit */
    /* stats (written by the combiner only, read racily) */
    uint64_t batches, rw_commands, log_blocks, log_bytes, overflow_blocks, commit_syncs, commit_ns, log_zero_ranges;
    uint64_t log_data_ranges, log_data_bytes;
    uint64_t scratch_blocks, scratch_batches; /* blocks left out as scratch; batches that logged nothing for it */
    size_t data_range_min; /* MANGO_DATA_RANGES (data_range_min_of) */
    uint64_t pipelined_batches;
    read_deps *deps; /* per-key read dependencies: request_keys given, fs/sim */
    /* Reads that waited for a sync: written only on that (sleeping) path,
     * and kept off the lines every read loads. */
    _Alignas(64) _Atomic uint64_t reads_waited;
    char reads_waited_pad[56];
} runtime;

static runtime rt;
/* A batch begun by mango_batch_begin is open on this thread. */
static __thread bool batch_open_here;
/* The ticket of the batch this thread ended last (set by batch_end, which
 * runs on the thread that ends the batch). */
static __thread uint64_t last_ticket_here;

/* The durable heap stays mapped after mango_shutdown (the application may
 * still read its objects). A later mango_init in the same process replaces it. */
static void *kept_heap;
static size_t kept_heap_size;
/* The pool's locked descriptor, kept open after mango_shutdown while
 * kept_heap is a copy-on-write mapping of the pool file: no other process
 * may write the file under it (recovery.h). -1: none. */
static int kept_lock_fd = -1;

void mango_config_default(mango_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->pool_size = 1ull << 30;
    cfg->log_size = 0; /* by the pool's file system: default_log_size() */
    cfg->mode = MANGO_PERSIST_AUTO;
    cfg->max_threads = 64;
    cfg->heap_base = 0x600000000000ull;
    cfg->create_if_missing = true;
}

static persist_mode to_persist_mode(mango_persist_mode m)
{
    switch (m) {
    case MANGO_PERSIST_EMULATED: return PERSIST_EMULATED;
    case MANGO_PERSIST_FS: return PERSIST_FS;
    case MANGO_PERSIST_PMEM: return PERSIST_PMEM;
    case MANGO_PERSIST_NONE: return PERSIST_NONE;
    case MANGO_PERSIST_SIM: return PERSIST_SIM;
    default: return 0;
    }
}

static int resolve_pool_path(const mango_config *cfg, char *out, size_t len)
{
    const char *p = cfg->pool_path;
    if (!p || !*p)
        p = getenv("MANGO_POOL");
    if (p && *p) {
        if ((size_t)snprintf(out, len, "%s", p) >= len)
            return mango_error(MANGO_EINVAL, "pool path too long");
        return MANGO_OK;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    const char *base = strrchr(exe, '/');
    snprintf(out, len, "/dev/shm/mango-%s.pool", base ? base + 1 : "app");
    return MANGO_OK;
}

/* ---- batch hooks ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Group commit window: worth waiting for more commands only when a commit
 * costs real time (fs mode); never more than half a commit, at most 1 ms. */
static uint64_t gather_window(void *arg)
{
    /* A sync in flight: this batch will be handed to the sync thread, whose
     * next sync also covers every batch sealed after it, so waiting here for
     * more commands gains nothing. (It cost: with 16 threads the combiner's
     * sched_yield loop took ~20 % of the CPU, and kvstore in fs mode at 50 %
     * PUTs ran at a third of its speed.) */
    if (rt.pipe.deferred_ok && !pipeline_idle(&rt.pipe))
        return 0;
    uint64_t c = rt.commit_ns_ewma;
    if (c < 20000)
        return 0;
    return c / 2 < 1000000 ? c / 2 : 1000000;
}

static void put_block(void *arg, uintptr_t block, uint32_t mask)
{
    redo_log_put(arg, block, mask);
}

static void put_block_big(void *arg, uintptr_t block, uint32_t mask)
{
    big_batch_put(arg, block, mask);
}

static void put_data(void *arg, uintptr_t addr, uint64_t len)
{
    redo_log_put_data(arg, addr, len);
}

static void put_data_big(void *arg, uintptr_t addr, uint64_t len)
{
    big_batch_put_data(arg, addr, len);
}

static void count_data_ranges(void)
{
    rt.log_data_ranges += rt.set->rng_n;
    rt.log_data_bytes += rt.set->rng_bytes;
}

/* Zero ranges of the open batch (dheap_calloc of reused heap memory), one
 * log entry each, written before the batch's blocks. Combiner thread only.
 * Not used under the capture verifier, which compares blocks. */
#define ZERO_RANGES_MAX 64
static struct {
    uintptr_t addr;
    uint64_t len;
} zero_ranges[ZERO_RANGES_MAX];
static unsigned n_zero;

/* A batch that fails to commit: forget what it captured. */
static void drop_batch(void)
{
    dedup_clear(rt.set);
    n_zero = 0;
}

static bool capture_zero(const void *addr, size_t len)
{
    if (capture_heap_bulk())
        return true; /* the bulk logs the heap's bytes, these zeros with them */
    if (!mango_capture_active || rt.verify || n_zero == ZERO_RANGES_MAX)
        return false;
    zero_ranges[n_zero].addr = (uintptr_t)addr;
    zero_ranges[n_zero].len = len;
    n_zero++;
    return true;
}

static int fail(int rc)
{
    mango_error_publish_fatal(); /* the message of the error that stops us */
    atomic_store(&rt.failed, rc);
    pipeline_note_stopped(&rt.pipe); /* waiters for tickets it will never hand out return */
    return rc;
}

/* Before an inline commit or an acknowledgement that must cover everything:
 * wait for frames still in the pipeline. */
static int drain_pipeline(void)
{
    if (pipeline_idle(&rt.pipe))
        return MANGO_OK;
    int rc = pipeline_wait(&rt.pipe, atomic_load(&rt.pipe.submitted));
    return rc == MANGO_OK ? MANGO_OK : fail(rc);
}

/* A batch with more blocks than a log frame may hold (log/big_batch.h):
 * its entries go to the big-batch file, synced, then a one-entry frame that
 * names the file commits it, synchronously (a pipelined frame could be torn
 * after the file was overwritten by the next big batch). Rare and slow by
 * nature: waits for earlier frames, and for the backend to be done with the
 * previous big batch. */
static int commit_big_batch(uint64_t n)
{
    pool *p = &rt.pool;
    if (n > UINT32_MAX) {
        drop_batch();
        return fail(mango_error(MANGO_EINVAL, "a batch wrote %llu blocks; one batch may hold at most %u",
                                (unsigned long long)n, UINT32_MAX));
    }
    int rc = drain_pipeline();
#ifndef MANGO_MUTATE_BIG_BATCH_NO_WAIT /* test-only: overwrite a file still needed */
    if (rc == MANGO_OK && rt.big.pending)
        rc = redo_log_wait_reusable(&rt.log, rt.big.last_lsn + 1);
#endif
    if (rc == MANGO_OK)
        rc = big_batch_begin(&rt.big, &p->pd, p->big_batch_path);
    if (rc != MANGO_OK) {
        drop_batch();
        return fail(rc);
    }
    for (unsigned i = 0; i < n_zero; i++)
        big_batch_put_zero(&rt.big, zero_ranges[i].addr, zero_ranges[i].len);
    rt.log_zero_ranges += n_zero;
    n_zero = 0;
    dedup_for_each_range(rt.set, put_data_big, &rt.big);
    count_data_ranges();
    dedup_for_each(rt.set, put_block_big, &rt.big);
    dedup_clear(rt.set);
    log_frame_writer w;
    rc = redo_log_reserve(&rt.log, 1, &w);
    if (rc == MANGO_OK)
        rc = big_batch_finish(&rt.big, &p->pd, p->big_batch_path, rt.log.generation, rt.log.next_seq,
                              w.lsn, &w.entries[0]);
    if (rc != MANGO_OK)
        return fail(rc);
    w.n = 1;
    rc = redo_log_commit(&rt.log, &w);
    if (rc != MANGO_OK)
        return fail(rc);
    rt.big.pending = true;
    rt.big.last_lsn = w.lsn;
    rt.log_blocks += n;
    rt.log_bytes += w.bytes + sizeof(big_batch_header) + n * sizeof(log_entry);
    rt.commit_syncs += 2;
    backend_notify(&rt.backend);
    last_ticket_here = pipeline_ticket_inline(&rt.pipe);
    return MANGO_OK;
}

/* This thread runs a batch: between batch_begin and batch_end_commit, in
 * every mode (mango_capture_active is off with MANGO_PERSIST_NONE, and in a
 * signal handler's trampoline). */
static __thread bool batch_running_here;

/* A pipelined sync failed; its error waits in the pipeline until the next
 * batch_begin adopts it (rt.failed). */
static bool pipeline_failed(void)
{
    return rt.pipe_started && __atomic_load_n(&rt.pipe.error, __ATOMIC_ACQUIRE);
}

static int batch_begin(void *arg, unsigned n)
{
    int f = atomic_load_explicit(&rt.failed, memory_order_relaxed);
    if (f)
        return mango_error_stopped();
    /* The backend has moved both head slots past the last big frame: no
     * recovery can read that big batch's file any more (the same test
     * commit_big_batch waits on before overwriting it), so free its space. */
    if (rt.big.pending &&
        atomic_load_explicit(&rt.log.reusable_lsn, memory_order_acquire) >= rt.big.last_lsn + 1)
        big_batch_release(&rt.big);
    if (pipeline_failed())
        return fail(mango_error(MANGO_EIO, "a pipelined log sync failed; no more writes are accepted"));
    rt.rw_commands += n;
    batch_running_here = true; /* until batch_end_commit (refuse_nested) */
    if (rt.durable) {
        signal_handlers_reset();
        capture_begin(rt.set);
        if (__builtin_expect(rt.verify, 0))
            capture_verify_begin(n); /* before any code of the batch writes */
        split_alloc_rw_thread = true;
        split_alloc_drain_deferred();
    }
    return MANGO_OK;
}

/* Ends the batch: logs what it wrote and makes it durable, or, for a batch
 * handed to the sync thread (defer), seals its frame and returns. Deferred:
 * mango_batch_submit's (rt.defer_commit) and combined batches (ticket !=
 * NULL: their commands wait for *ticket after the lock is released, in
 * wait_durable; *ticket 0 means durable already). A combined batch is
 * handed over only while a sync is in flight (an inline commit would wait for
 * it under the lock) or readers wait for the lock (they run during the sync).
 * Otherwise it is synced here, under the lock: writers wait for a sync either
 * way, and meanwhile those that arrive are gathered into the next batch; the
 * hand-over would only add two thread wake-ups and smaller batches (kvstore,
 * fs: one thread lost 10-15 %, four writers 17 %). With per-key read
 * dependencies (rt.deps) reads need not wait for the sync at all, so the
 * batch is also handed over whenever reads ran since the last batch: an
 * inline sync would hold them off the read side for its whole length. */
static int batch_end_commit(void *arg, uint64_t *ticket);

/* Ends the batch (batch_end_commit), then publishes its ticket on the keys
 * its commands wrote, before the write side is released (read_deps.h). */
static int batch_end(void *arg, uint64_t *ticket)
{
    int rc = batch_end_commit(arg, ticket);
    if (rt.deps)
        read_deps_publish(rt.deps, rc == MANGO_OK ? last_ticket_here : 0, ticket == NULL);
    return rc;
}

/* The application's read-write command, inside a combined batch; with
 * request_keys, its keys are noted for the batch's readers. (Read-only
 * commands run the application's process_request directly.) */
static void process_keyed(void *ctx)
{
    rt.cb.process_request(ctx);
    uint64_t keys[MANGO_MAX_KEYS];
    int n = rt.cb.request_keys(ctx, keys, MANGO_MAX_KEYS);
    read_deps_note_write(rt.deps, keys, n > MANGO_MAX_KEYS ? -1 : n);
}

static int batch_end_commit(void *arg, uint64_t *ticket)
{
    bool defer = rt.defer_commit ||
                 (ticket && (fc_batch_async(rt.fc) || !pipeline_idle(&rt.pipe) || fc_readers_waiting(rt.fc) ||
                             (rt.deps && fc_reads_seen(rt.fc))));
    defer = defer && rt.pipe.deferred_ok;
    rt.defer_commit = false;
    batch_running_here = false;
    if (ticket)
        *ticket = 0;
    rt.batches++;
    if (!rt.durable) {
        last_ticket_here = pipeline_ticket_inline(&rt.pipe);
        return MANGO_OK;
    }
    /* Frees queued while this batch was open (made while it was paused, or
     * by another thread) are done by this batch rather than the next: a
     * crash before the next one leaked them for good (in durable Redis, an
     * EXEC's argument copies that propagation releases after the EXEC's
     * last write section, found by a review). Still capturing here. */
    split_alloc_drain_deferred();
    split_alloc_rw_thread = false;
    capture_end();
    if (__builtin_expect(rt.verify, 0))
        capture_verify_end(rt.set);
    if (__builtin_expect(signal_handlers_unreturned() != 0, 0)) {
        drop_batch();
        return fail(mango_error(MANGO_EFAILED, "a signal handler that interrupted this batch did not return "
                                               "(siglongjmp?): stores after it were not captured, so the batch "
                                               "is not committed and no more writes are accepted"));
    }
    dedup_merge_ranges(rt.set);
    uint64_t scratch = scratch_drop(rt.set); /* blocks whose written bytes are all scratch */
    rt.scratch_blocks += scratch;
    uint64_t n = dedup_log_slots(rt.set) + n_zero;
    if (n == 0) {
        if (scratch) {
            dedup_clear(rt.set); /* the dropped blocks still hold their slots */
            rt.scratch_batches++;
        }
        /* Nothing to log, but the batch may have read state still in flight:
         * its ticket is durable only after every earlier one. */
        if (defer && !pipeline_idle(&rt.pipe)) {
            last_ticket_here = pipeline_ticket_deferred(&rt.pipe, false);
            if (ticket)
                *ticket = last_ticket_here;
            return MANGO_OK;
        }
        int rc = drain_pipeline();
        if (rc != MANGO_OK)
            return rc;
        last_ticket_here = pipeline_ticket_inline(&rt.pipe);
        return MANGO_OK;
    }
    rt.overflow_blocks += rt.set->ovf_count + rt.set->spill.count;
    if (rt.pool.pd.failed || atomic_load(&rt.backend.error)) {
        drop_batch();
        /* The sync thread's failed sync marks the pool failed before it
         * publishes why: let it get there, or fail() below would publish this
         * generic message first (fault.io_errors: "No space left on device"
         * was lost 2 runs in 10). */
        if (!pipeline_idle(&rt.pipe))
            (void)pipeline_wait(&rt.pipe, atomic_load(&rt.pipe.submitted));
        /* So must the backend, whose failed mirror sync persist.c marks
         * before backend_fail publishes it: with nothing in the pipeline
         * this thread got here first, and the application was told only
         * "the pool had an I/O error" (unit.test_stopped_error, about 1 run
         * in 30 under load). It says why within microseconds; 1 s bounds
         * the wait if nobody does. */
        (void)mango_error_await_fatal(1000);
        int rc = fail(mango_error(MANGO_EIO, "the pool had an I/O error; no more writes are accepted"));
        mango_error_adopt_fatal(); /* the backend's own message, if it stopped first */
        return rc;
    }
    if (n > redo_log_max_entries(&rt.log))
        return commit_big_batch(n);
    log_frame_writer w;
    int rc = redo_log_reserve(&rt.log, (uint32_t)n, &w);
    if (rc != MANGO_OK) {
        drop_batch();
        return fail(rc);
    }
    for (unsigned i = 0; i < n_zero; i++)
        redo_log_put_zero(&w, zero_ranges[i].addr, zero_ranges[i].len);
    rt.log_zero_ranges += n_zero;
    n_zero = 0;
    dedup_for_each_range(rt.set, put_data, &w);
    count_data_ranges();
    dedup_for_each(rt.set, put_block, &w);
    dedup_clear(rt.set);
    rt.log_blocks += n;
    rt.log_bytes += w.bytes;
    if (defer) {
        redo_log_seal(&rt.log, &w);
        rt.pipelined_batches++;
        last_ticket_here = pipeline_ticket_deferred(&rt.pipe, true);
        if (ticket)
            *ticket = last_ticket_here;
        return MANGO_OK;
    }
    rc = drain_pipeline();
    if (rc != MANGO_OK)
        return rc;
    /* Time one commit in 16 (two clock reads cost as much as a small
     * commit): enough for the group-commit window and the stats. */
    bool timed = (rt.commit_syncs & 15) == 0;
    uint64_t t0 = timed ? now_ns() : 0;
    rc = redo_log_commit(&rt.log, &w);
    if (rc != MANGO_OK)
        return fail(rc);
    if (timed) {
        uint64_t dt = now_ns() - t0;
        rt.commit_ns += dt * 16; /* an estimate of the total */
        rt.commit_ns_ewma = rt.commit_ns_ewma ? (rt.commit_ns_ewma * 3 + dt) / 4 : dt;
    }
    rt.commit_syncs++;
    backend_notify(&rt.backend);
    last_ticket_here = pipeline_ticket_inline(&rt.pipe);
    return MANGO_OK;
}

/* Pipelined combining (fs, sim): a combined batch's commands wait for its
 * ticket after the combiner released the lock, so the next batch runs while
 * this one syncs (read-only commands: read_target). */
static int wait_durable(void *arg, uint64_t ticket)
{
    (void)arg;
    int rc = pipeline_wait(&rt.pipe, ticket);
    return rc == MANGO_OK ? MANGO_OK : fail(mango_error(rc, "a pipelined log sync failed; no more writes are accepted"));
}

/* After a read-only command. It may have read a batch whose commit failed
 * (fail() runs under the write side, so its flag is visible here): refuse it,
 * as nothing of that batch may be reported. And in fs/sim mode it may have
 * read batches still in flight: it waits for everything ended so far, or,
 * with request_keys, for the batches that wrote its keys. */
static int read_target(void *arg, void *ctx, uint64_t *ticket)
{
    (void)arg;
    *ticket = 0;
    if (atomic_load(&rt.failed))
        return mango_error_stopped();
    if (!rt.pipe.deferred_ok)
        return MANGO_OK;
#ifdef MANGO_MUTATE_READS_DONT_WAIT /* test-only: reads answer before what they saw is durable */
    return MANGO_OK;
#endif
    uint64_t target = atomic_load(&rt.pipe.submitted);
    if (atomic_load(&rt.pipe.durable) >= target)
        return MANGO_OK;
    if (rt.deps) {
        /* Only the batches that wrote its keys (or wrote without keys). */
        uint64_t keys[MANGO_MAX_KEYS];
        int n = rt.cb.request_keys(ctx, keys, MANGO_MAX_KEYS);
        if (n >= 0 && n <= MANGO_MAX_KEYS) {
            uint64_t t = read_deps_target(rt.deps, keys, n);
            if (t < target)
                target = t;
            if (atomic_load(&rt.pipe.durable) >= target)
                return MANGO_OK;
        }
    }
    atomic_fetch_add_explicit(&rt.reads_waited, 1, memory_order_relaxed);
    *ticket = target;
    return MANGO_OK;
}

typedef struct init_args {
    bool fresh_heap;
    int rc;
} init_args;

static void run_init_state(void *arg)
{
    init_args *a = arg;
    if (a->fresh_heap) {
        a->rc = dheap_attach(rt.heap, rt.heap_size, true, capture_small_store);
        dheap_set_zero_capture(capture_zero);
        if (a->rc != MANGO_OK)
            return;
    }
    if (rt.cb.init_state)
        rt.cb.init_state(rt.cb.init_state_arg);
}

static void capture_noop(const void *a, size_t n) { (void)a; (void)n; }

static void notify_backend(void *b) { backend_notify(b); }

/* ---- init ---- */

/* fs mode: how the redo log reaches the file. MANGO_FS_LOG=buffered (the
 * default: O_DSYNC pwrite of the log pages from a private mapping, whose
 * pages are given back once the backend released them), direct (the same
 * with O_DIRECT, keeping the whole ring in memory) or mmap (msync of the
 * shared mapping, as the rest of the pool). An explicit kind the file system
 * cannot do is an error; the default falls back quietly, since every way is
 * equally durable. persist.h says why the pwrite ways are cheaper. */
static int setup_fs_log_writes(pool *p)
{
    if (p->pd.mode != PERSIST_FS)
        return MANGO_OK;
    const char *env = getenv("MANGO_FS_LOG");
    persist_wt_kind want = PERSIST_WT_BUFFERED;
    bool explicit_kind = env && *env;
    if (explicit_kind) {
        if (strcmp(env, "direct") == 0)
            want = PERSIST_WT_DIRECT;
        else if (strcmp(env, "buffered") == 0)
            want = PERSIST_WT_BUFFERED;
        else if (strcmp(env, "mmap") == 0)
            return MANGO_OK;
        else
            return mango_error(MANGO_EINVAL, "MANGO_FS_LOG=%s: expected direct, buffered or mmap",
                               env);
    }
    persist_wt_kind used;
    int e = persist_write_through(&p->pd, pool_log(p), p->hdr->log_size, want, &used);
    if (e == 0 && used == want)
        return MANGO_OK;
    if (p->pd.failed)
        return mango_error(MANGO_EIO, "%s: cannot remap the log ring: %s", rt.pool_path, strerror(-e));
    if (explicit_kind)
        return mango_error(e ? MANGO_EIO : MANGO_EINVAL, "MANGO_FS_LOG=%s: not possible on %s (%s)",
                           env, rt.pool_path, e ? strerror(-e) : "the file system refuses O_DIRECT");
    return MANGO_OK; /* a window of another kind, or none: msync as the rest of the pool */
}

/* The backend's priority: the configuration's, or MANGO_BACKEND_PRIORITY. */
static int backend_priority_of(const mango_config *cfg, mango_backend_priority *out)
{
    *out = cfg->backend_priority;
    if (*out != MANGO_BACKEND_PRIORITY_AUTO && *out != MANGO_BACKEND_PRIORITY_IDLE &&
        *out != MANGO_BACKEND_PRIORITY_NORMAL)
        return mango_error(MANGO_EINVAL, "unknown backend_priority %d", (int)cfg->backend_priority);
    const char *env = getenv("MANGO_BACKEND_PRIORITY");
    if (!env || !*env)
        return MANGO_OK;
    if (strcmp(env, "auto") == 0)
        *out = MANGO_BACKEND_PRIORITY_AUTO;
    else if (strcmp(env, "idle") == 0)
        *out = MANGO_BACKEND_PRIORITY_IDLE;
    else if (strcmp(env, "normal") == 0)
        *out = MANGO_BACKEND_PRIORITY_NORMAL;
    else
        return mango_error(MANGO_EINVAL, "MANGO_BACKEND_PRIORITY=%s: expected auto, idle or normal", env);
    return MANGO_OK;
}

/* The smallest store into the durable heap logged as a data range
 * (capture/dedup_set.h): DEDUP_RANGE_MIN, or MANGO_DATA_RANGES: 0 (off: blocks
 * only, for comparisons), 1 (the default), or a size in bytes (env_number.h). */
static int data_range_min_of(size_t *out)
{
    *out = DEDUP_RANGE_MIN;
    const char *env = getenv("MANGO_DATA_RANGES");
    if (!env || !*env || strcmp(env, "1") == 0)
        return MANGO_OK;
    if (strcmp(env, "0") == 0) {
        *out = 0;
        return MANGO_OK;
    }
    unsigned long long v = 0;
    if (!env_decimal(env, &v) || v < 256 || v > (1ull << 30))
        return mango_error(MANGO_EINVAL, "MANGO_DATA_RANGES=%s: expected 0 (off), 1 (stores of %u bytes or "
                           "more are data ranges) or the smallest such store in bytes, 256 to 1073741824",
                           env, DEDUP_RANGE_MIN);
    *out = (size_t)v;
    return MANGO_OK;
}

/* The log ring of a new pool when the configuration leaves it 0. On a disk
 * (fs mode) the log is also the checkpoint distance: the backend writes the
 * mirror once per quarter of the log (backend.c), and every round rewrites
 * each page it touches, so a longer log means fewer page writes per update
 * (Redis, 100 % HSET: 16 KB written per update with 64 MiB and 1 s rounds,
 * 3.7 KB with 256 MiB; docs/redis-benchmarks.md). 256 MiB there, if the pool has 1 GiB
 * or more; otherwise, and on tmpfs, where a ring costs memory, 64 MiB. */
static size_t default_log_size(const char *pool_path, const mango_config *cfg)
{
    const size_t small = 64ull << 20, large = 256ull << 20;
    if (cfg->pool_size < 4 * large || cfg->mode == MANGO_PERSIST_EMULATED ||
        cfg->mode == MANGO_PERSIST_SIM || cfg->mode == MANGO_PERSIST_NONE)
        return small;
    char dir[sizeof rt.pool_path];
    snprintf(dir, sizeof dir, "%s", pool_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir ? 1 : 0] = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    struct statfs sfs;
    if (statfs(dir, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC)
        return small;
    return large;
}

static int scratch_section(void);

/* A mango_init that fails after making the pool removes it: the pool holds
 * nothing yet, but it records the heap address and the layout, so a retry
 * with a corrected configuration (another heap_base) was refused as "a
 * different layout" (found by a review, session 37). */
static void forget_new_pool(bool created)
{
    if (created)
        unlink(rt.pool_path);
}

static int open_durable(const mango_config *cfg, int *status)
{
    int rc = resolve_pool_path(cfg, rt.pool_path, sizeof rt.pool_path);
    if (rc)
        return rc;
    rc = layout_read(&rt.layout, cfg->heap_base, 0);
    if (rc)
        return rc;
    bool created = false;
    if (access(rt.pool_path, F_OK) != 0) {
        if (!cfg->create_if_missing)
            return mango_error(MANGO_ENOENT, "pool %s does not exist", rt.pool_path);
        pool_create_params pp = {
            .pool_size = cfg->pool_size,
            .log_size = cfg->log_size ? cfg->log_size : default_log_size(rt.pool_path, cfg),
            .mode = to_persist_mode(cfg->mode),
            .heap_base = cfg->heap_base,
            .n_data = rt.layout.n_data,
            .fingerprint = rt.layout.fingerprint,
            .fingerprint_text = rt.layout.text,
        };
        for (unsigned i = 0; i < rt.layout.n_data; i++) {
            pp.data_vaddr[i] = rt.layout.data_lo[i];
            pp.data_size[i] = rt.layout.data_hi[i] - rt.layout.data_lo[i];
            pp.data_loader_bytes[i] = rt.layout.data_start[i] - rt.layout.data_lo[i];
        }
        rc = pool_create(rt.pool_path, &pp);
        if (rc && rc != MANGO_EEXIST)
            return rc;
        created = rc == MANGO_OK;
    }
    recovery_trace("init: layout read");
    if (kept_heap) {
        /* Before pool_open: a heap restored by mapping the pool keeps the
         * pool's lock (recovery.h). */
        dheap_detach();
        munmap(kept_heap, kept_heap_size);
        recovery_heap_unmapped();
        kept_heap = NULL;
        if (kept_lock_fd >= 0)
            close(kept_lock_fd);
        kept_lock_fd = -1;
    }
    /* (The layout and heap address are checked before a sparse pool's fill
     * writes anything.) */
    /* The data regions too: the fingerprint does not cover their sizes
     * (pool.h, pool_expect). */
    pool_expect expect = {.fingerprint = rt.layout.fingerprint, .fingerprint_text = rt.layout.text,
                          .heap_base = cfg->heap_base, .n_data = rt.layout.n_data};
    for (unsigned i = 0; i < rt.layout.n_data; i++) {
        expect.data_vaddr[i] = rt.layout.data_lo[i];
        expect.data_size[i] = rt.layout.data_hi[i] - rt.layout.data_lo[i];
    }
    rc = pool_open_expecting(&rt.pool, rt.pool_path, to_persist_mode(cfg->mode), true, &expect);
    if (rc)
        return rc;
    recovery_trace("init: pool opened and validated");
    pool *p = &rt.pool;
    /* (pool_open matched the regions to the layout. The table's own bound,
     * if recorded, is the same: the program's, whose layout made the pool.) */
    for (unsigned i = 0; i < p->nregions; i++)
        for (unsigned j = 0; j < rt.layout.n_data; j++)
            if (p->regions[i].kind == POOL_REGION_DATA && p->regions[i].vaddr == rt.layout.data_lo[j])
                p->loader_end[i] = rt.layout.data_start[j];
    rt.heap_size = p->hdr->heap_capacity;
    rt.heap = mmap((void *)(uintptr_t)cfg->heap_base, rt.heap_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (rt.heap == MAP_FAILED || rt.heap != (void *)(uintptr_t)cfg->heap_base) {
        if (rt.heap != MAP_FAILED)
            munmap(rt.heap, rt.heap_size);
        rt.heap = NULL;
        rc = mango_error(MANGO_ENOMEM, "cannot reserve the durable heap at %#llx (%zu bytes): %s",
                         (unsigned long long)cfg->heap_base, rt.heap_size, strerror(errno));
        goto fail_pool;
    }
    big_batch_writer_init(&rt.big); /* (fail_heap closes it) */
    /* Replay the log into the mirror (idempotent; a crash here is recovered
     * again). MANGO_CHECK_HEAP=1 walks the heap's metadata first, on a
     * private copy with the log applied, so a refusal writes nothing. */
    const char *check = getenv("MANGO_CHECK_HEAP");
    bool walk_heap = check && strcmp(check, "1") == 0;
    uint64_t tail, seq, gen;
    rc = recovery_replay(p, walk_heap, &rt.recovery, &tail, &seq, &gen);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mango_last_error());
        rc = mango_error(rc, "%s: %s", rt.pool_path, why);
        goto fail_heap;
    }
    const pool_region *hr = pool_find_region(p, POOL_REGION_HEAP);
    const dheap_root *root = hr ? (const dheap_root *)(p->base + hr->mirror_offset) : NULL;
    bool heap_valid = root && dheap_extent_of_root(root, hr->size) != 0;
    if (root && !heap_valid && root->magic != 0) {
        /* Never treat a damaged state as FRESH: that would discard it. */
        rc = mango_error(MANGO_EBADPOOL, "%s: the durable heap root in the pool is corrupt "
                         "(magic %#llx); refusing to recover", rt.pool_path,
                         (unsigned long long)root->magic);
        goto fail_heap;
    }
    if (heap_valid && !created) {
        unsigned threads = (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
        rc = recovery_restore(p, threads ? threads : 1, &rt.recovery);
        if (rc)
            goto fail_heap;
        rc = dheap_attach(rt.heap, rt.heap_size, false, capture_small_store);
        dheap_set_zero_capture(capture_zero);
        if (rc)
            goto fail_heap;
        if (walk_heap && !rt.recovery.heap_walked && dheap_check() != 0) {
            /* The walk before the replay could not map its copy (warned). */
            rc = mango_error(MANGO_EBADPOOL, "%s: the recovered durable heap's metadata is inconsistent "
                             "(MANGO_CHECK_HEAP=1; walked after the replay, which is written)", rt.pool_path);
            goto fail_heap;
        }
        *status = MANGO_RECOVERED;
    } else {
        *status = MANGO_FRESH; /* new pool, or a crash before init_state committed */
    }
    uintptr_t lo[CAPTURE_MAX_RANGES], hi[CAPTURE_MAX_RANGES];
    unsigned n = 0;
    lo[n] = (uintptr_t)rt.heap;
    hi[n++] = (uintptr_t)rt.heap + rt.heap_size;
    for (unsigned i = 0; i < rt.layout.n_data && n < CAPTURE_MAX_RANGES; i++) {
        lo[n] = rt.layout.data_lo[i];
        hi[n++] = rt.layout.data_hi[i];
    }
    capture_set_ranges(n, lo, hi);
    rc = scratch_section();
    if (rc)
        goto fail_heap;
    rc = capture_verify_setup(cfg->verify_capture, lo[0], hi[0]);
    if (rc)
        goto fail_heap;
    rt.verify = capture_verify_enabled();
    capture_set_data_ranges(rt.verify ? 0 : rt.data_range_min); /* the verifier compares blocks */
    redo_log_init(&rt.log, p, tail, seq, gen, tail);
    big_batch_hold_spare_fds(&rt.big); /* for the file's lazy open (big_batch.h) */
    rc = setup_fs_log_writes(p);
    if (rc)
        goto fail_heap;
    mango_backend_priority prio;
    rc = backend_priority_of(cfg, &prio);
    if (rc)
        goto fail_heap;
    rc = backend_start(&rt.backend, p, &rt.log, &rt.big, prio);
    if (rc)
        goto fail_heap;
    rc = pipeline_start(&rt.pipe, &rt.log, p->pd.mode == PERSIST_FS || p->pd.mode == PERSIST_SIM,
                        notify_backend, &rt.backend);
    if (rc) {
        backend_stop(&rt.backend, false);
        goto fail_heap;
    }
    rt.pipe_started = true;
    rt.pool_created = created;
    recovery_trace("init: heap attached, backend started");
    return MANGO_OK;
fail_heap:
    big_batch_writer_close(&rt.big); /* its spare descriptors */
    scratch_reset();
    dheap_detach(); /* harmless when nothing is attached */
    rt.verify = false;
    capture_verify_shutdown();
    munmap(rt.heap, rt.heap_size);
    recovery_heap_unmapped();
    rt.heap = NULL;
fail_pool:
    forget_new_pool(created); /* before pool_close: still holding its lock */
    pool_close(p);
    return rc;
}

/* ---- fork() children ---- */

/* fork(): the child inherits the runtime's state, the pool's file and
 * shared mappings, and an open batch, but none of its threads. A frame it
 * committed would land in the parent's log, a shutdown would close the pool
 * under the parent, and a wait would wait for a sync thread that is not
 * there. So a child refuses every call that writes the pool or waits for
 * it, and stops capturing on the forking thread (its stores stay in its
 * own memory; what it allocates comes from the glibc heap). */
static bool forked_child;   /* this process is a fork() child of the one that opened the pool */
static pid_t pool_owner;    /* that process */
static bool fork_handler;   /* the pthread_atfork handler is registered */
static _Atomic bool live;   /* from mango_init's success to the end of mango_shutdown */

static void on_fork_child(void)
{
    /* The pool's lock is the parent's: the child drops its references to the
     * locked description (its heap pages are private since the fork handler
     * of recovery.c), so that a child that outlives the parent (a snapshot
     * writer after a crash) does not keep a restart out. */
    if (kept_lock_fd >= 0)
        close(kept_lock_fd);
    kept_lock_fd = -1;
    if (!atomic_load(&live))
        return; /* no runtime in the parent: the child may open a pool of its own */
    if (rt.durable)
        pool_forget_in_child(&rt.pool);
    forked_child = true;
    batch_open_here = false; /* the forking thread's, the child's only thread */
    mango_capture_active = false;
    split_alloc_rw_thread = false;
}

static int refused_in_child(const char *what)
{
    return mango_error(MANGO_EINVAL, "%s: this process is a fork() child of the process that opened the pool "
                       "(pid %d); only that process may write the pool or wait for it", what, (int)pool_owner);
}

/* ---- scratch memory (capture/scratch.h) ---- */

/* The index of the durable range [lo, hi) lies in (0: the durable heap), or
 * -1 if none holds it whole. */
static int durable_range_of(uintptr_t lo, uintptr_t hi)
{
    uintptr_t rlo[CAPTURE_MAX_RANGES], rhi[CAPTURE_MAX_RANGES];
    unsigned n = capture_get_ranges(rlo, rhi, CAPTURE_MAX_RANGES);
    for (unsigned i = 0; i < n; i++)
        if (lo >= rlo[i] && hi <= rhi[i])
            return (int)i;
    return -1;
}

/* A durable free: the freed bytes are scratch no more (scratch.h). */
static void scratch_on_free(const void *p, size_t n) { scratch_unmark_heap((uintptr_t)p, (uintptr_t)p + n); }

typedef struct scratch_args {
    uintptr_t lo;
    size_t len;
    bool in_heap;
    int rc;
} scratch_args;

static void scratch_add_exclusive(void *arg)
{
    scratch_args *a = arg;
    a->rc = scratch_add(a->lo, a->len, a->in_heap);
}

int mango_scratch(const void *addr, size_t len)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_scratch: mango_init has not been called");
    if (len == 0 || !rt.durable)
        return MANGO_OK;
    uintptr_t lo = (uintptr_t)addr;
    if (!addr || lo + len < lo)
        return mango_error(MANGO_EINVAL, "mango_scratch: bad range %p, %zu bytes", addr, len);
    int range = durable_range_of(lo, lo + len);
    if (range < 0)
        return mango_error(MANGO_EINVAL, "mango_scratch: [%p, +%zu) is not durable memory (the durable heap "
                           "or the executable's data): only durable bytes are logged", addr, len);
    scratch_args a = {.lo = lo, .len = len, .in_heap = range == 0};
    if (batch_open_here || mango_capture_active) {
        scratch_add_exclusive(&a); /* this thread holds the write side: batch ends read the table under it */
    } else if (fc_in_read(rt.fc)) {
        /* The write side would wait for this thread's own read (a hang,
         * found by a review, session 37). */
        return mango_error(MANGO_EINVAL, "mango_scratch: called inside a read-only command; call it at start-up, "
                           "in init_state or in a read-write command");
    } else {
        int rc = fc_execute_exclusive(rt.fc, scratch_add_exclusive, &a);
        if (rc != MANGO_OK)
            return rc;
    }
    if (a.rc == MANGO_OK && a.in_heap)
        dheap_set_free_hook(scratch_on_free);
    return a.rc;
}

/* ---- snapshots (snapshot/snapshot.h) ---- */

struct mango_snapshot_job {
    const char *path;
    bool shares_disk; /* (found before the write side is taken) */
    snapshot_job job;
    double t0, held_until;
    int rc;
};

static double now_s(void) { return (double)now_ns() / 1e9; }

/* Holding the write side, between batches (no batch is open: nothing of
 * a batch not yet committed is in the child's image): every batch so far
 * durable, then fork (the bits of .data/.bss the backend has not applied
 * yet come from the log). */
static void snapshot_locked(void *arg)
{
    mango_snapshot_job *j = arg;
    int rc = MANGO_OK;
    /* Frees queued for the next batch (made outside read-write commands):
     * the fork's image would hold those objects allocated, and nothing
     * reaches them, so a server started on the snapshot kept them forever
     * (found by a review, session 36: 564 allocations of 200 SETs with EX).
     * A batch of their own frees them first. Other threads' frees wait
     * from here until the fork: those queued while that batch synced were
     * never freed in the snapshot (found by a review: a thread freeing
     * 300 000 objects left 244 000 of them allocated in it). */
    split_alloc_deferred_hold();
    if (split_alloc_deferred_pending()) {
        rc = batch_begin(NULL, 0);
        if (rc == MANGO_OK)
            rc = batch_end_commit(NULL, NULL);
    }
    if (rc == MANGO_OK)
        rc = drain_pipeline();
    /* mango_snapshot_start checked rt.failed before it waited for the write
     * side; a batch that held it meanwhile may have failed to commit, and
     * its stores are in memory, answered with an error: the fork would copy
     * them (found by a review). Checked here, under the write side. */
    if (rc == MANGO_OK && (atomic_load(&rt.failed) || rt.pool.pd.failed || atomic_load(&rt.backend.error)))
        rc = mango_error_stopped();
    uint64_t applied = atomic_load(&rt.backend.applied_lsn); /* before the bitmaps are read */
    if (rc == MANGO_OK)
        rc = snapshot_start(&rt.pool, &rt.log, applied, j->path, j->shares_disk, &j->job);
    split_alloc_deferred_release();
    if (rc == MANGO_OK && recovery_heap_still_shared()) {
        /* The fork could not make a restored heap private (recovery.c says
         * so on stderr): the child would see the pool's later writes. */
        snapshot_cancel(&j->job);
        rc = mango_error(MANGO_ENOMEM, "mango_snapshot: the restored heap could not be made private at the fork "
                         "(memory short?): the writer would see later batches; nothing was written");
    }
    j->held_until = now_s();
    j->rc = rc;
}

/* Is path one of the names the live pool gives its own files: its
 * big-batch file (removed by a clean shutdown and by recovery, and written
 * by the next big batch) or a creation's temporary file (removed as
 * abandoned)? A snapshot named so was reported done, then destroyed (found
 * by a review, session 36). */
static bool names_a_file_of_the_pool(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    const char *base = slash ? slash + 1 : path;
    char *absdir = realpath(dir, NULL);
    if (!absdir)
        return false; /* no such folder: the writer reports it */
    char full[2 * PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", strcmp(absdir, "/") == 0 ? "" : absdir, base);
    free(absdir);
    const char *big = rt.pool.big_batch_path; /* "<absolute pool path>.bigbatch" */
    size_t n = strlen(big) - strlen(".bigbatch");
    return strcmp(full, big) == 0 || (strncmp(full, big, n) == 0 && strncmp(full + n, ".tmp.", 5) == 0);
}

int mango_snapshot_check_path(const char *path)
{
    if (!rt.up || !rt.durable)
        return mango_error(MANGO_EINVAL, "mango_snapshot: there is no pool");
    if (!path || !*path)
        return mango_error(MANGO_EINVAL, "mango_snapshot: no path");
    if (access(path, F_OK) == 0)
        return mango_error(MANGO_EEXIST, "mango_snapshot: %s exists: a snapshot never replaces a file", path);
    if (names_a_file_of_the_pool(path))
        return mango_error(MANGO_EINVAL, "mango_snapshot: %s is a name the pool uses for its own files "
                           "(<pool>.bigbatch, <pool>.tmp.*), which it removes or overwrites", path);
    /* Named like a file of any pool, as `mango copy` refuses: a snapshot at
     * "<x>.tmp.<dead pid>" was removed by the next snapshot to <x> as a dead
     * creation's leftover (found by a review). */
    const char *owned = pool_owned_name_pattern(path);
    if (owned)
        return mango_error(MANGO_EINVAL, "mango_snapshot: %s ends in %s, as files a pool owns do "
                           "(<pool>.bigbatch, <pool>.tmp.<pid>, <pool>.copying-<pid>), which the pool's "
                           "creation, opening or copy removes", path, owned);
    return MANGO_OK;
}

int mango_snapshot_start(const char *path, mango_snapshot_job **out)
{
    double t0 = now_s();
    if (out)
        *out = NULL;
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_snapshot: mango_init has not been called");
    if (forked_child)
        return refused_in_child("mango_snapshot");
    if (!rt.durable)
        return mango_error(MANGO_EINVAL, "mango_snapshot: there is no pool (persistence mode none)");
    if (!path || !*path || !out)
        return mango_error(MANGO_EINVAL, "mango_snapshot: no path%s", out ? "" : " or no job pointer");
    if (batch_open_here || batch_running_here || fc_in_read(rt.fc))
        return mango_error(MANGO_EINVAL, "mango_snapshot: called inside a batch or a command; call it outside "
                           "any (it waits for the write side, which a read-only command's own read would "
                           "hold back for good)");
    int f = atomic_load(&rt.failed);
    if (f)
        return mango_error_stopped();
    int prc = mango_snapshot_check_path(path);
    if (prc != MANGO_OK)
        return prc;
    mango_snapshot_job *j = calloc(1, sizeof *j);
    if (!j)
        return mango_error(MANGO_ENOMEM, "mango_snapshot: no memory for the job");
    j->path = path;
    j->t0 = t0;
    j->shares_disk = snapshot_shares_disk(&rt.pool, path);
    int rc = fc_execute_locked(rt.fc, snapshot_locked, j);
    if (rc == MANGO_OK)
        rc = j->rc;
    j->path = NULL; /* (the caller's string: only needed until the fork) */
    if (rc == MANGO_OK)
        rc = snapshot_started(&j->job);
    if (rc != MANGO_OK) {
        free(j);
        return rc;
    }
    *out = j;
    return MANGO_OK;
}

int mango_snapshot_poll(mango_snapshot_job *j, bool wait, mango_snapshot_info *info)
{
    if (!j)
        return mango_error(MANGO_EINVAL, "mango_snapshot_poll: no job");
    if (forked_child)
        return refused_in_child("mango_snapshot_poll");
    int rc = snapshot_finish(&j->job, wait);
    if (rc == MANGO_EAGAIN)
        return rc;
    if (info) {
        info->heap_bytes = j->job.heap_bytes;
        info->pause_seconds = j->held_until - j->t0;
        info->seconds = now_s() - j->t0;
        info->share = j->job.share;
        info->mbps = (double)j->job.bytes_per_s / 1e6;
        info->paced_seconds = j->job.got_report ? j->job.report.paced_seconds : 0;
        info->shares_disk = j->job.shares_disk;
    }
    free(j);
    return rc;
}

void mango_snapshot_cancel(mango_snapshot_job *j)
{
    if (!j || forked_child) /* (the writer is the parent's, not this child's) */
        return;
    snapshot_cancel(&j->job);
    free(j);
}

int mango_snapshot(const char *path, mango_snapshot_info *info)
{
    if (info)
        memset(info, 0, sizeof *info);
    mango_snapshot_job *j;
    int rc = mango_snapshot_start(path, &j);
    return rc == MANGO_OK ? mango_snapshot_poll(j, true, info) : rc;
}

/* Globals declared MANGO_SCRATCH: the linker gathers them in the section
 * mango_scratch and names its bounds (weak: 0 when no object has one). */
extern char __start_mango_scratch_globals[] __attribute__((weak, visibility("hidden")));
extern char __stop_mango_scratch_globals[] __attribute__((weak, visibility("hidden")));

static int scratch_section(void)
{
    uintptr_t lo = (uintptr_t)__start_mango_scratch_globals, hi = (uintptr_t)__stop_mango_scratch_globals;
    if (!lo || hi <= lo)
        return MANGO_OK;
    if (durable_range_of(lo, hi) < 0)
        return mango_error(MANGO_EINVAL, "the mango_scratch_globals section [%#lx, %#lx) is not in the executable's "
                           "writable data (declare MANGO_SCRATCH only on writable globals of the executable)",
                           (unsigned long)lo, (unsigned long)hi);
    int rc = scratch_add(lo, hi - lo, false);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", mango_last_error());
        return mango_error(rc, "the MANGO_SCRATCH globals: %s", why);
    }
    return MANGO_OK;
}

int mango_init(const mango_config *cfg_in, const mango_callbacks *cb)
{
    if (rt.up)
        return mango_error(MANGO_EINVAL, "mango_init called twice");
    if (!cb || !cb->is_read_only || !cb->process_request)
        return mango_error(MANGO_EINVAL, "callbacks is_read_only and process_request are required");
    mango_config cfg;
    mango_config_default(&cfg);
    if (cfg_in) {
        cfg = *cfg_in;
        mango_config dflt;
        mango_config_default(&dflt);
        if (!cfg.pool_size) cfg.pool_size = dflt.pool_size;
        if (!cfg.max_threads) cfg.max_threads = dflt.max_threads;
        if (!cfg.heap_base) cfg.heap_base = dflt.heap_base;
    }
    if (cfg.heap_base % 4096)
        return mango_error(MANGO_EINVAL, "heap_base %#lx is not page aligned", (unsigned long)cfg.heap_base);
    if (cfg.max_threads > FC_MAX_THREADS_LIMIT) /* checked before the pool is touched */
        return mango_error(MANGO_EINVAL, "max_threads %u: at most %u", cfg.max_threads, FC_MAX_THREADS_LIMIT);
    if (cfg.mode > MANGO_PERSIST_SIM)
        return mango_error(MANGO_EINVAL, "unknown persistence mode %d", (int)cfg.mode);
    size_t range_min; /* checked before the pool is touched */
    int rc0 = data_range_min_of(&range_min);
    if (rc0)
        return rc0;
    split_alloc_link_anchor();
    libc_interpose_link_anchor();
    libc_interpose_outparams_link_anchor();
    signal_interpose_link_anchor();
    if (!fork_handler) {
        if (pthread_atfork(NULL, NULL, on_fork_child) != 0)
            return mango_error(MANGO_ENOMEM, "pthread_atfork: cannot register the fork handler");
        fork_handler = true;
    }
    memset(&rt, 0, sizeof rt);
    rt.data_range_min = range_min;
    pool_owner = getpid();
    mango_error_reset_fatal();
    rt.cb = *cb;
    rt.cfg = cfg;
    rt.durable = cfg.mode != MANGO_PERSIST_NONE;
    int status = MANGO_FRESH;
    if (rt.durable) {
        rt.set = mmap(NULL, sizeof *rt.set, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (rt.set == MAP_FAILED)
            return mango_error(MANGO_ENOMEM, "cannot allocate the dedup set");
        dedup_init(rt.set);
        int rc = open_durable(&cfg, &status);
        if (rc) {
            munmap(rt.set, sizeof *rt.set);
            return rc;
        }
    }
    if (!rt.durable) {
        pipeline_start(&rt.pipe, NULL, false, NULL, NULL); /* tickets only */
        rt.pipe_started = true;
    }
    if (cb->request_keys && rt.pipe.deferred_ok) {
        rt.deps = mmap(NULL, sizeof *rt.deps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (rt.deps == MAP_FAILED) {
            rt.deps = NULL; /* reads then wait for every batch in flight, as without keys */
        } else {
            read_deps_init(rt.deps);
        }
    }
    fc_hooks hooks = {
        .is_read_only = cb->is_read_only,
        .process = rt.deps ? process_keyed : cb->process_request,
        .process_read = cb->process_request,
        .batch_begin = batch_begin,
        .batch_end = batch_end,
        .gather_window_ns = gather_window,
        .wait_durable = rt.pipe.deferred_ok ? wait_durable : NULL,
        .read_target = read_target,
    };
    int rc = fc_create(&rt.fc, cfg.max_threads, &hooks);
    if (rc) {
        if (rt.deps) {
            munmap(rt.deps, sizeof *rt.deps);
            rt.deps = NULL;
        }
        pipeline_stop(&rt.pipe);
        rt.pipe_started = false;
        if (rt.durable) {
            /* Undo open_durable, as its own failure path does, so that a
             * retry in this process can reserve the heap again. */
            backend_stop(&rt.backend, false);
            big_batch_writer_close(&rt.big);
            redo_log_destroy(&rt.log);
            scratch_reset();
            dheap_detach();
            rt.verify = false;
            capture_verify_shutdown();
            munmap(rt.heap, rt.heap_size);
            recovery_heap_unmapped();
            rt.heap = NULL;
            forget_new_pool(rt.pool_created); /* before pool_close: still holding its lock */
            pool_close(&rt.pool);
            dedup_destroy(rt.set);
            munmap(rt.set, sizeof *rt.set);
            rt.set = NULL;
        }
        return mango_error(rc, "cannot set up flat combining for %u threads (%s)", cfg.max_threads,
                           rc == MANGO_ENOMEM ? "out of memory" : "no thread-specific key left");
    }
    rt.up = true;
    if (status == MANGO_FRESH) {
        init_args a = {.fresh_heap = rt.durable};
        rc = fc_execute_exclusive(rt.fc, run_init_state, &a);
        if (rc == MANGO_OK)
            rc = a.rc;
        if (rc) {
            mango_shutdown();
            return rc;
        }
    }
    (void)capture_noop;
    atomic_store(&live, true);
    return status;
}

/* A command, or a batch, started from inside a command or an open batch
 * on this thread would wait for the write side its own thread holds back
 * (a read-only command's read flag, a combiner's or an exclusive batch's
 * write side): a hang, or a nested read that ended the outer one's early
 * (noted by a review, session 39). Refused instead, with no pool too, and
 * from a signal handler that interrupted a command. */
static int refuse_nested(const char *call)
{
    if (batch_open_here || batch_running_here || fc_in_read(rt.fc))
        return mango_error(MANGO_EINVAL, "%s: called inside a command or a batch on this thread; commands "
                           "and batches do not nest", call);
    return MANGO_OK;
}

int mango_client_cmd(void *ctx)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_init has not been called");
    if (forked_child)
        return refused_in_child("mango_client_cmd");
    int nested = refuse_nested("mango_client_cmd");
    if (nested)
        return nested;
    int f = atomic_load_explicit(&rt.failed, memory_order_relaxed);
    if (f)
        return mango_error_stopped();
    int rc = fc_execute(rt.fc, ctx);
    if (rc < 0 && atomic_load(&rt.failed))
        mango_error_adopt_fatal(); /* the combiner that failed was another thread */
    return rc;
}

int mango_client_submit(void *ctx, uint64_t *ticket) { return runtime_submit(ctx, ticket, false); }

int runtime_submit(void *ctx, uint64_t *ticket, bool may_wait)
{
    if (!ticket)
        return mango_error(MANGO_EINVAL, "mango_client_submit: ticket is NULL");
    *ticket = 0;
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_init has not been called");
    if (forked_child)
        return refused_in_child("mango_client_submit");
    int nested = refuse_nested("mango_client_submit");
    if (nested)
        return nested;
    int f = atomic_load_explicit(&rt.failed, memory_order_relaxed);
    if (f)
        return mango_error_stopped();
    int rc = fc_submit(rt.fc, ctx, ticket, !may_wait);
    if (rc < 0 && atomic_load(&rt.failed))
        mango_error_adopt_fatal(); /* the combiner that failed was another thread */
    return rc;
}

int mango_batch_begin(void)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_init has not been called");
    if (forked_child)
        return refused_in_child("mango_batch_begin");
    if (batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_begin: a batch is already open on this thread");
    int nested = refuse_nested("mango_batch_begin");
    if (nested)
        return nested;
    int f = atomic_load_explicit(&rt.failed, memory_order_relaxed);
    if (f)
        return mango_error_stopped();
    int rc = fc_exclusive_begin(rt.fc);
    if (rc == MANGO_OK)
        batch_open_here = true;
    return rc;
}

static int bulk_finish(void);

int mango_batch_end(void)
{
    if (forked_child)
        return refused_in_child("mango_batch_end"); /* the parent's batch: the parent ends it */
    if (!batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_end: no batch is open on this thread");
    mango_batch_resume(); /* a paused batch ends like any other */
    int brc = bulk_finish(); /* on failure the batch is dropped (rt.failed) */
    batch_open_here = false;
    int rc = fc_exclusive_end(rt.fc);
    return brc != MANGO_OK ? brc : rc;
}

int mango_batch_submit(uint64_t *ticket)
{
    if (forked_child)
        return refused_in_child("mango_batch_submit");
    if (!batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_submit: no batch is open on this thread");
    mango_batch_resume();
    int brc = bulk_finish(); /* on failure the batch is dropped (rt.failed) */
    batch_open_here = false;
    rt.defer_commit = true; /* read and cleared by batch_end, under the write side */
    last_ticket_here = 0;
    int rc = fc_exclusive_end(rt.fc);
    if (ticket)
        *ticket = last_ticket_here;
    return brc != MANGO_OK ? brc : rc;
}

bool mango_commit_is_pipelined(void) { return rt.up && rt.pipe.deferred_ok; }

void mango_batch_room(uint64_t *used, uint64_t *capacity)
{
    uint64_t u = 0, c = 0;
    if (rt.up && rt.durable) {
        c = (uint64_t)redo_log_max_entries(&rt.log) * LOG_BLOCK_SIZE;
        if (batch_open_here) {
            dedup_merge_ranges(rt.set); /* (once per new range; batch_end merges anyway) */
            u = (dedup_log_slots(rt.set) + n_zero) * LOG_BLOCK_SIZE;
        }
    }
    if (used)
        *used = u;
    if (capacity)
        *capacity = c;
}

void mango_heap_room(uint64_t *allocated, uint64_t *capacity)
{
    uint64_t a = 0, c = 0;
    if (rt.up && rt.durable) {
        dheap_usage(NULL, NULL, &a);
        c = rt.heap_size;
    }
    if (allocated)
        *allocated = a;
    if (capacity)
        *capacity = c;
}

typedef struct fits_args {
    size_t bytes;
    bool fits;
} fits_args;

static void fits_locked(void *arg)
{
    fits_args *a = arg;
    a->fits = dheap_fits(a->bytes);
}

bool mango_heap_fits(size_t bytes)
{
    if (!rt.up || !rt.durable)
        return true;
    if (mango_capture_active) /* a read-write command: this thread is the heap's writer */
        return dheap_fits(bytes) || (dheap_reclaim() && dheap_fits(bytes));
    /* Elsewhere it only looks, but dheap_fits walks the free lists the
     * combiner rewrites: looking from another thread while a batch ran
     * followed links that had become user data (SIGSEGV, found by a
     * review). So it looks holding the write side, unless no combiner can
     * run anyway: this thread's own batch is open (paused) or its command
     * is running (read-only, or a combined batch's), or this is a fork
     * child (it has no combiner; the parent's cannot write its memory). */
    if (batch_open_here || split_alloc_rw_thread || forked_child || fc_in_read(rt.fc))
        return dheap_fits(bytes);
    fits_args a = {.bytes = bytes, .fits = false};
    (void)fc_execute_locked(rt.fc, fits_locked, &a); /* (fails only without rt.fc) */
    return a.fits;
}

uint64_t mango_reply_ticket(void)
{
    if (!rt.up)
        return 0;
    return atomic_load(&rt.pipe.submitted) + (batch_open_here ? 1 : 0);
}

int mango_durable_ticket(uint64_t *durable)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_init has not been called");
    int err = 0;
    uint64_t d = pipeline_durable(&rt.pipe, &err);
    if (durable)
        *durable = d;
    if (err) {
        mango_error(MANGO_EIO, "a pipelined log sync failed; batches after ticket %llu are not "
                    "durable", (unsigned long long)d);
        mango_error_adopt_fatal(); /* the sync thread's message says why */
        return MANGO_EIO;
    }
    /* Any other failure: an inline commit's (fail()) hands out no ticket, so
     * the one its replies wait for (mango_reply_ticket) never comes, and
     * the runtime takes no more writes (found by a review: reported OK, a
     * caller waiting for that ticket waited for good). */
    if (atomic_load_explicit(&rt.failed, memory_order_acquire))
        return mango_error_stopped();
    return MANGO_OK;
}

int mango_wait_durable(uint64_t ticket)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_init has not been called");
    if (forked_child)
        return refused_in_child("mango_wait_durable");
    int rc = pipeline_wait(&rt.pipe, ticket);
    if (rc == MANGO_EFAILED) /* the runtime stopped before handing it out */
        return mango_error_stopped();
    if (rc != MANGO_OK) {
        mango_error(MANGO_EIO, "a pipelined log sync failed; ticket %llu is not durable",
                    (unsigned long long)ticket);
        mango_error_adopt_fatal(); /* the sync thread's message says why */
        return MANGO_EIO;
    }
    return MANGO_OK;
}

int mango_durable_fd(void)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_init has not been called");
    if (forked_child) /* the parent's eventfd: a read here would take its wake-ups */
        return refused_in_child("mango_durable_fd");
    int fd = pipeline_event_fd(&rt.pipe);
    if (fd < 0)
        return mango_error(MANGO_ENOMEM, "eventfd: %s", strerror(errno));
    return fd;
}

bool mango_batch_open(void) { return batch_open_here; }

int mango_batch_pause(void)
{
    if (!batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_pause: no batch is open on this thread");
    if (rt.durable) {
        if (rt.verify && mango_capture_active)
            capture_verify_pause();
        mango_capture_active = false;
        split_alloc_rw_thread = false;
    }
    return MANGO_OK;
}

int mango_batch_resume(void)
{
    if (!batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_resume: no batch is open on this thread");
    if (rt.durable) {
        if (rt.verify && !mango_capture_active)
            capture_verify_resume();
        mango_capture_active = true;
        split_alloc_rw_thread = true;
    }
    return MANGO_OK;
}

/* ---- Bulk loading (mango_batch_bulk_begin / _end) ----
 *
 * While on, heap stores are not captured (capture_set_heap_bulk). At the end
 * the heap is logged as it is: [old_top, new_top), carved during the bulk,
 * in pieces that are committed as frames of their own, synchronously, before
 * the batch; [0, old_top) with the batch, as one data range. Recovery from
 * any point before the batch is durable must find the state of bulk_begin:
 *   - the pieces lie at or above old_top, where that state's heap has
 *     nothing (recovery restores the heap up to its top; the allocator
 *     carves past it), and [0, old_top), the root included, is untouched
 *     until the batch;
 *   - but that state's allocator takes the space at or above its hwm for
 *     zero, in memory and in the pool (dheap_calloc logs nothing there), and
 *     the pieces make it non-zero in the pool. So the first piece's frame
 *     also carries the root as it was at bulk_begin (root_then, durable:
 *     bulk_begin committed the batch so far) with hwm raised past every
 *     piece: that state's callocs there then zero and log.
 * The batch itself carries the real root (with the allocator's own hwm),
 * so the state after it is the allocator's, exact. */
static struct {
    bool on;             /* between bulk_begin and bulk_finish */
    bool active;         /* durable mode, not verifying: capture is really off */
    uint64_t old_top;    /* the heap's top at bulk_begin */
    dheap_root root_then;
    long kill_after;     /* MANGO_TEST_BULK_KILL_AFTER, -1: off */
    uint64_t pieces;     /* committed so far by this bulk */
    void (*progress)(void *arg, uint64_t done, uint64_t total); /* mango_set_bulk_progress */
    void *progress_arg;
} bulk = {.kill_after = -1};

void mango_set_bulk_progress(void (*fn)(void *arg, uint64_t done, uint64_t total), void *arg)
{
    bulk.progress = fn;
    bulk.progress_arg = arg;
}

static void bulk_test_kill(uint64_t pieces_done)
{
    if (bulk.kill_after >= 0 && pieces_done >= (uint64_t)bulk.kill_after) {
        fprintf(stderr, "mangosteen: TEST HOOK MANGO_TEST_BULK_KILL_AFTER: SIGKILL after %llu pieces\n",
                (unsigned long long)pieces_done);
        raise(SIGKILL);
    }
}

int mango_batch_bulk_begin(void)
{
    if (forked_child)
        return refused_in_child("mango_batch_bulk_begin");
    if (!batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_bulk_begin: no batch is open on this thread");
    if (bulk.on)
        return mango_error(MANGO_EINVAL, "mango_batch_bulk_begin: the batch is already in a bulk load");
    if (rt.durable && !mango_capture_active)
        return mango_error(MANGO_EINVAL, "mango_batch_bulk_begin: the batch is paused (resume it first)");
    bulk.active = rt.durable && !rt.verify;
    bulk.pieces = 0;
    const char *k = getenv("MANGO_TEST_BULK_KILL_AFTER");
    unsigned long long kill_after = 0;
    if (k && *k && (!env_decimal(k, &kill_after) || kill_after > (unsigned long long)LONG_MAX))
        return mango_error(MANGO_EINVAL, "test hook MANGO_TEST_BULK_KILL_AFTER='%s': expected a number of pieces", k);
    bulk.kill_after = k && *k ? (long)kill_after : -1;
    if (bulk.active) {
        /* What the batch wrote so far becomes durable now, so that the root
         * in memory is the durable one (root_then). Its replies' ticket is
         * then durable too: everything they reported is. */
        int rc = batch_end_commit(NULL, NULL);
        if (rc != MANGO_OK)
            return rc;
        /* Taken before batch_begin: it drains the frees queued meanwhile
         * (another thread's, or this one's while paused), which change the
         * root in memory but become durable only with the batch. With them
         * the first piece made a root durable whose free lists named
         * objects still in use (found by a review, session 36). */
        memcpy(&bulk.root_then, rt.heap, sizeof bulk.root_then);
        bulk.old_top = bulk.root_then.top;
        rc = batch_begin(NULL, 0);
        if (rc != MANGO_OK)
            return rc;
        capture_set_heap_bulk(true);
        bulk_test_kill(0);
    }
    bulk.on = true;
    return MANGO_OK;
}

/* One piece [lo, hi) of the heap as a frame of its own, with root_then
 * (hwm raised) in the first. Synchronous; no ticket: the batch's replies
 * wait for the batch. */
static int bulk_commit_piece(uint64_t lo, uint64_t hi, bool first, uint64_t hwm)
{
    dheap_root root = bulk.root_then;
    if (root.hwm && root.hwm < hwm)
        root.hwm = hwm;
    uint64_t n = LOG_DATA_PAYLOAD_SLOTS(hi - lo) + 1;
    if (first)
        n += LOG_DATA_PAYLOAD_SLOTS(sizeof root) + 1;
    log_frame_writer w;
    int rc = redo_log_reserve(&rt.log, (uint32_t)n, &w);
    if (rc != MANGO_OK)
        return fail(rc);
    if (first)
        redo_log_put_data_from(&w, (uintptr_t)rt.heap, &root, sizeof root);
    redo_log_put_data(&w, (uintptr_t)rt.heap + lo, hi - lo);
    rc = redo_log_commit(&rt.log, &w);
    if (rc != MANGO_OK)
        return fail(rc);
    rt.batches++;
    rt.commit_syncs++;
    rt.log_bytes += w.bytes;
    rt.log_data_ranges += first ? 2 : 1;
    rt.log_data_bytes += hi - lo + (first ? sizeof root : 0);
    backend_notify(&rt.backend);
    return MANGO_OK;
}

int mango_batch_bulk_end(void)
{
    if (forked_child)
        return refused_in_child("mango_batch_bulk_end");
    if (!batch_open_here)
        return mango_error(MANGO_EINVAL, "mango_batch_bulk_end: no batch is open on this thread");
    if (!bulk.on)
        return mango_error(MANGO_EINVAL, "mango_batch_bulk_end: the batch is not in a bulk load");
    return bulk_finish();
}

/* Ends the bulk, if one is on (see above); the batch stays open. */
static int bulk_finish(void)
{
    if (!bulk.on)
        return MANGO_OK;
    bulk.on = false;
    if (!bulk.active)
        return MANGO_OK;
    capture_set_heap_bulk(false);
    const dheap_root *now = rt.heap;
    uint64_t new_top = now->top, hwm = now->hwm;
    int rc = drain_pipeline(); /* redo_log_commit: nothing sealed may wait */
    if (rc != MANGO_OK)
        return rc;
    /* A quarter of the log a piece: the backend applies one while the next
     * is written. */
    uint64_t piece = ((uint64_t)redo_log_max_entries(&rt.log) / 2 - 8) * sizeof(log_entry);
    piece &= ~(uint64_t)4095;
    if (piece < 4096)
        piece = 4096;
    for (uint64_t lo = bulk.old_top; lo < new_top; lo += piece) {
        uint64_t hi = new_top - lo > piece ? lo + piece : new_top;
        rc = bulk_commit_piece(lo, hi, lo == bulk.old_top, hwm);
        if (rc != MANGO_OK)
            return rc;
        bulk_test_kill(++bulk.pieces);
        if (bulk.progress)
            bulk.progress(bulk.progress_arg, hi - bulk.old_top, new_top - bulk.old_top);
    }
    /* The heap below old_top (the root with it), with the batch. */
    uint64_t below = bulk.old_top < new_top ? bulk.old_top : new_top;
    bool active = mango_capture_active;
    mango_capture_active = true;
    mango_capture(rt.heap, (size_t)below);
    mango_capture_active = active;
    return MANGO_OK;
}

/* ---- RPC mode (src/rpc) ---- */

/* The running server. mango_rpc_get_stats and mango_rpc_port may be called
 * from any thread, also while another stops the server: rpc_mu guards the
 * pointer and those reads, so a stop cannot free the server under them. A
 * stop takes the server out under the lock and stops it outside it (a
 * callback of a worker being joined may call them: it then finds no
 * server). Starts and stops themselves are not made safe against each
 * other (one server per process, started and stopped by one thread). */
static rpc_server *rpc;
static pthread_mutex_t rpc_mu = PTHREAD_MUTEX_INITIALIZER;

int mango_rpc_start(const mango_rpc_config *cfg)
{
    if (!rt.up)
        return mango_error(MANGO_EINVAL, "mango_rpc_start: mango_init has not been called");
    if (forked_child)
        return refused_in_child("mango_rpc_start");
    if (rpc)
        return mango_error(MANGO_EINVAL, "mango_rpc_start: already serving on port %d", rpc_server_port(rpc));
    mango_rpc_config none = {0};
    rpc_server *s = NULL;
    int rc = rpc_server_start(&s, cfg ? cfg : &none, &rt.cb, rt.cfg.max_threads ? rt.cfg.max_threads : 64);
    if (rc != MANGO_OK)
        return rc;
    pthread_mutex_lock(&rpc_mu);
    rpc = s;
    pthread_mutex_unlock(&rpc_mu);
    if (rt.pipe.deferred_ok) {
        /* Workers hold responses and wait for the listener's wake-up. One
         * call by hand covers an advance made before it was installed. */
        pipeline_set_listener(&rt.pipe, rpc_server_durable_advanced, s);
        int err = 0;
        uint64_t d = pipeline_durable(&rt.pipe, &err);
        rpc_server_durable_advanced(s, d, err != 0);
    }
    return MANGO_OK;
}

int mango_rpc_port(void)
{
    pthread_mutex_lock(&rpc_mu);
    int port = rpc ? rpc_server_port(rpc) : -1;
    pthread_mutex_unlock(&rpc_mu);
    return port >= 0 ? port : mango_error(MANGO_EINVAL, "mango_rpc_port: not serving");
}

void mango_rpc_get_stats(mango_rpc_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rpc_mu);
    if (rpc)
        rpc_server_stats(rpc, out);
    pthread_mutex_unlock(&rpc_mu);
}

/* The listener first (it returns once no call is in progress): the sync
 * thread must not call into a server being freed. */
static void stop_rpc_server(void)
{
    if (rt.pipe.deferred_ok)
        pipeline_set_listener(&rt.pipe, NULL, NULL);
    pthread_mutex_lock(&rpc_mu);
    rpc_server *s = rpc;
    rpc = NULL;
    pthread_mutex_unlock(&rpc_mu);
    rpc_server_stop(s);
}

int mango_rpc_stop(void)
{
    if (forked_child) /* the listening socket is the parent's too */
        return refused_in_child("mango_rpc_stop");
    if (!rpc)
        return mango_error(MANGO_EINVAL, "mango_rpc_stop: not serving");
    stop_rpc_server();
    return MANGO_OK;
}

/* Under the write side, at shutdown: a last batch frees the durable objects
 * whose frees are queued (made outside read-write commands), as
 * snapshot_locked does before its fork. No later batch would, so the pool
 * kept them allocated for good (found by a review). */
static void shutdown_drain_locked(void *arg)
{
    int *rc = arg;
    *rc = batch_begin(NULL, 0);
    if (*rc == MANGO_OK)
        *rc = batch_end_commit(NULL, NULL);
}

int mango_shutdown(void)
{
    if (forked_child) /* the parent's runtime: nothing here to stop, nothing to close */
        return rt.up ? refused_in_child("mango_shutdown") : MANGO_OK;
    if (rpc) /* its workers may be inside commands */
        stop_rpc_server();
    if (!rt.up)
        return MANGO_OK;
    /* Stopped before this call: a batch failed, or a pipelined sync did.
     * Then the result is MANGO_EFAILED, as mango.h says, not the failed
     * sync's own code a second time (it returned MANGO_EIO: found by a
     * review, session 40), and no drain batch is tried. */
    bool stopped_before = atomic_load(&rt.failed) || pipeline_failed();
    int drc = MANGO_OK;
    if (rt.durable) {
        /* (Not with a batch open on this thread: it holds the write side.) */
        if (!batch_open_here && !stopped_before && split_alloc_deferred_pending())
            fc_execute_locked(rt.fc, shutdown_drain_locked, &drc);
        /* From here on a durable free outside a batch does nothing: no batch
         * will run against this heap (split_alloc.h). */
        split_alloc_deferred_close();
    }
    rt.up = false;
    int rc = MANGO_OK;
    fc_destroy(rt.fc);
    rt.fc = NULL;
    if (rt.deps) {
        munmap(rt.deps, sizeof *rt.deps);
        rt.deps = NULL;
    }
    int prc = MANGO_OK;
    if (rt.pipe_started) {
        prc = pipeline_stop(&rt.pipe); /* drains frames in flight first */
        rt.pipe_started = false;
        if (prc != MANGO_OK)
            atomic_store(&rt.failed, prc);
    }
    if (rt.durable) {
        rc = backend_stop(&rt.backend, atomic_load(&rt.failed) == 0);
        big_batch_writer_close(&rt.big);
        if (rt.recovery.heap_bytes_mapped && kept_lock_fd < 0)
            kept_lock_fd = fcntl(rt.pool.fd, F_DUPFD_CLOEXEC, 0); /* the lock outlives pool_close */
        /* Drained and marked clean: no frame names the big-batch file. */
        if (rc == MANGO_OK && atomic_load(&rt.failed) == 0)
            unlink(rt.pool.big_batch_path);
        redo_log_destroy(&rt.log);
        pool_close(&rt.pool);
        dedup_destroy(rt.set);
        munmap(rt.set, sizeof *rt.set);
        rt.verify = false;
        capture_verify_shutdown();
        scratch_reset();
        dheap_set_free_hook(NULL);
        rt.set = NULL;
        /* The heap stays mapped and attached: the application may still read
         * its objects; nothing is logged any more, and a free of one does
         * nothing (the deferred queue is closed above). */
        kept_heap = rt.heap;
        kept_heap_size = rt.heap_size;
    }
    atomic_store(&live, false);
    if (drc != MANGO_OK)
        return drc;
    if (prc != MANGO_OK && !stopped_before) { /* the final drain's sync failed: its code, and the sync thread's message */
        mango_error_stopped();
        char why[1024];
        snprintf(why, sizeof why, "%s", mango_last_error());
        return mango_error(prc, "mango_shutdown: the last batches' sync failed: %s", why);
    }
    if (rc != MANGO_OK) /* (the backend's own failure, if it is what stopped the runtime: EFAILED then, as above) */
        return stopped_before ? mango_error_stopped() : rc;
    /* A runtime stopped by an earlier failure (a failed pipelined sync, say)
     * did not mark the pool clean: say so, rather than report a clean stop
     * (it returned 0; noted by a review, session 37). */
    return atomic_load(&rt.failed) ? mango_error_stopped() : MANGO_OK;
}

void mango_get_stats(mango_stats *out)
{
    memset(out, 0, sizeof *out);
    out->batches = rt.batches;
    out->reads_waited = atomic_load_explicit(&rt.reads_waited, memory_order_relaxed);
    out->rw_commands = rt.rw_commands;
    out->log_blocks = rt.log_blocks;
    out->log_bytes = rt.log_bytes;
    out->overflow_blocks = rt.overflow_blocks;
    out->log_full_waits = atomic_load_explicit(&rt.log.full_waits, memory_order_relaxed);
    uint64_t pipe_syncs = atomic_load_explicit(&rt.pipe.deferred_syncs, memory_order_relaxed);
    out->frontend_syncs = rt.commit_syncs + pipe_syncs;
    out->pipelined_batches = rt.pipelined_batches;
    out->pipeline_syncs = pipe_syncs;
    out->commit_ns_total = rt.commit_ns + atomic_load_explicit(&rt.pipe.deferred_sync_ns, memory_order_relaxed);
    out->backend_syncs = atomic_load_explicit(&rt.backend.syncs, memory_order_relaxed);
    out->backend_lowered = rt.backend.lowered;
    out->backend_boosts = atomic_load_explicit(&rt.backend.boosts, memory_order_relaxed);
    capture_verify_stats(&out->verify_batches, &out->verify_missed_blocks);
    dheap_usage(&out->heap_chunks, &out->heap_payload_bytes, &out->heap_allocated_bytes);
    out->heap_carved_bytes = dheap_carved();
    out->heap_reclaims = dheap_reclaims();
    out->log_zero_ranges = rt.log_zero_ranges;
    out->log_data_ranges = rt.log_data_ranges;
    out->log_data_bytes = rt.log_data_bytes;
    out->scratch_blocks_dropped = rt.scratch_blocks;
    out->scratch_batches = rt.scratch_batches;
    out->big_batches = rt.big.batches;
    out->big_batch_bytes = rt.big.bytes;
    out->heap_capacity = rt.up && rt.durable ? rt.heap_size : 0;
    out->recovery_frames_replayed = rt.recovery.frames_replayed;
    out->recovery_blocks_replayed = rt.recovery.blocks_replayed;
    out->recovery_torn_tail = rt.recovery.torn_tail ? 1 : 0;
    if (rt.up) {
        out->log_capacity = rt.log.cap;
        uint64_t committed = atomic_load(&rt.log.committed_lsn), applied = atomic_load(&rt.backend.applied_lsn);
        out->log_unapplied_bytes = committed > applied ? committed - applied : 0;
        uint64_t submitted = atomic_load(&rt.pipe.submitted), durable = atomic_load(&rt.pipe.durable);
        out->batches_in_flight = submitted > durable ? submitted - durable : 0;
    }
}

/* (Mode none opens no pool, so its persist mode is unset: "none", not "?".) */
const char *mango_mode_name(void)
{
    return !rt.up ? "" : rt.durable ? persist_mode_name(rt.pool.pd.mode) : "none";
}

const char *mango_pool_path(void) { return rt.up ? rt.pool_path : ""; }
