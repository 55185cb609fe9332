/* persist.c -- flush, fence and sync for each persistence mode (see persist.h). */
#define _GNU_SOURCE /* O_DIRECT, statx */
#include "persist/persist.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/env_number.h"

/* Set and unset from any thread while other threads are inside persist calls
 * (kvstore powerfail unsets it while the backend still runs): every call loads
 * it once, with acquire, and reports all of its events to that one observer.
 * Loading it again per event would call NULL after a concurrent unset. */
static _Atomic(persist_observer_fn) observer;

static inline persist_observer_fn current_observer(void)
{
    return atomic_load_explicit(&observer, memory_order_acquire);
}

static _Atomic uint64_t sync_count;

/* ---- fault injection (tests) ----
 * MANGO_FAULT_SYNC=N[:EIO|ENOSPC]  the N-th sync of the process fails with
 *                                  that error (EIO by default) and writes
 *                                  nothing: the worst case of a failed msync.
 * MANGO_FAULT_SYNC_SITE=WHERE      with MANGO_FAULT_SYNC: count only the
 *                                  syncs made at that site (their `where`,
 *                                  e.g. big_batch.sync), so a test can fail
 *                                  one particular ordering point. The
 *                                  uncounted syncs (a new file's, a
 *                                  directory's, a writeback) fail only
 *                                  this way.
 * MANGO_FAULT_SHORT_WRITES=1       every pwrite here (sim mode's syncs, the
 *                                  big-batch file) stores at most half of
 *                                  what it was asked (exercises the loop).
 * MANGO_SIM_SYNC_DELAY_US=N        sim mode: every sync first sleeps N µs, as a
 *                                  device flush would (a kill then lands inside
 *                                  the window between a commit and its sync);
 *                                  a sync MANGO_FAULT_SYNC fails too. */
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static long long fault_sync_at = -1; /* -1: off */
static int fault_sync_errno = EIO;
static char fault_site[64];
static _Atomic uint64_t fault_site_count;
static int fault_short_writes;
static long sim_sync_delay_us;

/* A test hook set to something it cannot mean ends the process: read
 * loosely, "3x" or "1:ENOSPACE" turned the fault off or changed it, and the
 * test that set it passed without the fault it was written for. */
static void bad_test_hook(const char *name, const char *value, const char *expected)
{
    fprintf(stderr, "mangosteen: test hook %s='%s': expected %s\n", name, value, expected);
    _exit(2);
}

static void read_fault_env(void)
{
    const char *v = getenv("MANGO_FAULT_SYNC");
    if (v && *v) {
        char num[24] = "";
        size_t len = strcspn(v, ":");
        const char *err = v[len] == ':' ? v + len + 1 : NULL;
        unsigned long long n = 0;
        if (len < sizeof num)
            memcpy(num, v, len);
        if (len >= sizeof num || !env_decimal(num, &n) || n > (unsigned long long)LLONG_MAX ||
            (err && strcmp(err, "EIO") != 0 && strcmp(err, "ENOSPC") != 0))
            bad_test_hook("MANGO_FAULT_SYNC", v, "N, N:EIO or N:ENOSPC, N a decimal count (0: off)");
        if (n > 0) {
            fault_sync_at = (long long)n;
            if (err && strcmp(err, "ENOSPC") == 0)
                fault_sync_errno = ENOSPC;
        }
    }
    const char *site = getenv("MANGO_FAULT_SYNC_SITE");
    if (site && *site) {
        if (strlen(site) >= sizeof fault_site)
            bad_test_hook("MANGO_FAULT_SYNC_SITE", site, "a sync site's name (e.g. log.commit_sync)");
        snprintf(fault_site, sizeof fault_site, "%s", site);
    }
    const char *sw = getenv("MANGO_FAULT_SHORT_WRITES");
    if (sw && *sw && strcmp(sw, "0") != 0 && strcmp(sw, "1") != 0)
        bad_test_hook("MANGO_FAULT_SHORT_WRITES", sw, "0 or 1");
    fault_short_writes = sw && strcmp(sw, "1") == 0;
    const char *dl = getenv("MANGO_SIM_SYNC_DELAY_US");
    unsigned long long us = 0;
    if (dl && *dl) {
        if (!env_decimal(dl, &us) || us > 60000000ull)
            bad_test_hook("MANGO_SIM_SYNC_DELAY_US", dl, "microseconds, 0 to 60000000");
        sim_sync_delay_us = (long)us;
    }
}

/* pwrite all of [buf, buf + len) at off, across short writes (made short on
 * purpose under MANGO_FAULT_SHORT_WRITES). 0 or -errno. */
static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const char *p = buf;
    while (len > 0) {
        size_t ask = fault_short_writes && len > 1 ? len / 2 : len;
        ssize_t w = pwrite(fd, p, ask, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return 0;
}

int persist_write_file(int fd, const void *buf, size_t len, uint64_t off)
{
    pthread_once(&fault_once, read_fault_env);
    return pwrite_all(fd, buf, len, off);
}

/* Is this sync (the process's nth, made at where) the one that must fail? */
static bool fault_now(uint64_t nth, const char *where)
{
    if (fault_sync_at <= 0)
        return false;
    if (!fault_site[0])
        return nth == (uint64_t)fault_sync_at;
    return where && strcmp(where, fault_site) == 0 &&
           atomic_fetch_add_explicit(&fault_site_count, 1, memory_order_relaxed) + 1 == (uint64_t)fault_sync_at;
}

/* The syncs below persist_sync_file (a new file's, a directory's, a
 * writeback) are not counted: they fail only at the site
 * MANGO_FAULT_SYNC_SITE names, so the numbering of the counted syncs stays
 * the same. 0, or the injected -errno. */
static int fault_uncounted(const char *where)
{
    pthread_once(&fault_once, read_fault_env);
    return fault_now(0, where) ? -fault_sync_errno : 0;
}

#define LINE 64u

const char *persist_mode_name(persist_mode m)
{
    switch (m) {
    case PERSIST_EMULATED: return "emulated";
    case PERSIST_FS: return "fs";
    case PERSIST_PMEM: return "pmem";
    case PERSIST_NONE: return "none";
    case PERSIST_SIM: return "sim";
    }
    return "?";
}

void persist_set_observer(persist_observer_fn fn)
{
    atomic_store_explicit(&observer, fn, memory_order_release);
}

static persist_domain *domains[4];
static pthread_mutex_t domains_mu = PTHREAD_MUTEX_INITIALIZER;

void persist_register_domain(persist_domain *d)
{
    pthread_mutex_lock(&domains_mu);
    for (unsigned i = 0; i < 4; i++)
        if (!domains[i]) {
            domains[i] = d;
            break;
        }
    pthread_mutex_unlock(&domains_mu);
}

void persist_unregister_domain(persist_domain *d)
{
    pthread_mutex_lock(&domains_mu);
    for (unsigned i = 0; i < 4; i++)
        if (domains[i] == d)
            domains[i] = NULL;
    pthread_mutex_unlock(&domains_mu);
}

persist_domain *persist_domain_of(const void *addr)
{
    for (unsigned i = 0; i < 4; i++) {
        persist_domain *d = domains[i];
        if (d && (const char *)addr >= d->base && (const char *)addr < d->base + d->len)
            return d;
    }
    return NULL;
}

uint64_t persist_sync_count(void) { return atomic_load_explicit(&sync_count, memory_order_relaxed); }

void persist_note_store(const void *addr, size_t len, const char *where)
{
    persist_observer_fn obs = current_observer();
    if (obs)
        obs(PERSIST_EV_STORE, addr, len, where);
}

/* The page size, read once (fs-mode flushes round to pages on every call). */
static size_t page_size(void)
{
    static _Atomic size_t cached;
    size_t pg = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!pg) {
        pg = (size_t)sysconf(_SC_PAGESIZE);
        atomic_store_explicit(&cached, pg, memory_order_relaxed);
    }
    return pg;
}

static void ranges_add(persist_ranges *r, uintptr_t lo, uintptr_t hi)
{
    for (unsigned i = 0; i < r->n; i++) {
        if (lo <= r->hi[i] && hi >= r->lo[i]) { /* overlaps or touches */
            if (lo < r->lo[i]) r->lo[i] = lo;
            if (hi > r->hi[i]) r->hi[i] = hi;
            return;
        }
    }
    if (r->n < PERSIST_MAX_RANGES) {
        r->lo[r->n] = lo;
        r->hi[r->n] = hi;
        r->n++;
        return;
    }
    /* Full: widen the last range to cover the new one (msync of clean pages is cheap). */
    unsigned k = r->n - 1;
    if (lo < r->lo[k]) r->lo[k] = lo;
    if (hi > r->hi[k]) r->hi[k] = hi;
}

#if defined(__x86_64__)
__attribute__((target("clwb"))) static void flush_lines_clwb(uintptr_t a, uintptr_t end)
{
    for (; a < end; a += LINE)
        __builtin_ia32_clwb((void *)a);
}
__attribute__((target("clflushopt"))) static void flush_lines_clflushopt(uintptr_t a, uintptr_t end)
{
    for (; a < end; a += LINE)
        __builtin_ia32_clflushopt((void *)a);
}
static void flush_lines_clflush(uintptr_t a, uintptr_t end)
{
    for (; a < end; a += LINE)
        __builtin_ia32_clflush((void *)a);
}
static void (*flush_lines)(uintptr_t, uintptr_t);

static void pick_flush(void)
{
    __builtin_cpu_init();
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (b & (1u << 24))
        flush_lines = flush_lines_clwb;
    else if (b & (1u << 23))
        flush_lines = flush_lines_clflushopt;
    else
        flush_lines = flush_lines_clflush;
}
#endif

void persist_flush(persist_domain *d, persist_ranges *r, const void *addr, size_t len,
                   const char *where)
{
    if (len == 0)
        return;
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    persist_observer_fn obs = current_observer();
    if (obs)
        obs(PERSIST_EV_FLUSH, addr, len, where);
    switch (d->mode) {
    case PERSIST_PMEM:
#if defined(__x86_64__)
        if (!flush_lines)
            pick_flush();
        flush_lines(lo & ~(uintptr_t)(LINE - 1), hi);
#endif
        break;
    case PERSIST_FS: {
        uintptr_t pg = page_size();
        ranges_add(r, lo & ~(pg - 1), (hi + pg - 1) & ~(pg - 1));
        break;
    }
    case PERSIST_SIM:
        ranges_add(r, lo & ~(uintptr_t)(LINE - 1), (hi + LINE - 1) & ~(uintptr_t)(LINE - 1));
        break;
    default:
        break;
    }
}

void persist_fence(persist_domain *d, const char *where)
{
    persist_observer_fn obs = current_observer();
    if (obs)
        obs(PERSIST_EV_FENCE, NULL, 0, where);
    if (d->mode == PERSIST_PMEM)
        __builtin_ia32_sfence();
    else
        atomic_thread_fence(memory_order_seq_cst);
}

/* fs mode, write-through window: write the pages holding [lo, hi) from the
 * private mapping to the same offsets of the file; O_DSYNC makes each pwrite
 * return only once its data is durable. */
static int write_through(persist_domain *d, uintptr_t lo, uintptr_t hi)
{
    uintptr_t a = lo & ~(uintptr_t)(d->wt_align - 1);
    uintptr_t b = (hi + d->wt_align - 1) & ~(uintptr_t)(d->wt_align - 1);
    if (a < d->wt_lo) a = d->wt_lo;
    if (b > d->wt_hi) b = d->wt_hi;
    off_t off = (off_t)(a - (uintptr_t)d->base);
    const char *src = (const char *)a;
    size_t len = b - a;
    while (len > 0) {
        ssize_t w = pwrite(d->wt_fd, src, len, off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        /* A short direct write ends on an aligned boundary (it is made of
         * whole blocks), so the rest stays aligned. */
        src += w;
        off += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fs mode: sync r, sending what lies in the write-through window to
 * write_through() and the rest to msync / fdatasync. */
#define WRITEBACK_CHUNK (1u << 20)

/* MANGO_FS_PACED=0: write large ranges back in one go (comparisons). */
static bool paced_writeback(void)
{
    static int paced = -1;
    if (paced < 0) {
        const char *v = getenv("MANGO_FS_PACED");
        paced = !(v && strcmp(v, "0") == 0);
    }
    return paced;
}

/* Drop this process's page-table entries of a large written range of the
 * shared mapping (see sync_fs); the data stays in the page cache. Advice: a
 * failure only keeps the shootdowns. Never inside the private write-through
 * window: there MADV_DONTNEED would throw away log frames the frontend has
 * written but not yet synced. sync_fs takes the window out of the ranges it
 * passes, but ranges_add widens a range when the set is full, so the window
 * is clipped here as well. */
static void unmap_written_range(persist_domain *d, uintptr_t lo, uintptr_t hi)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    lo = lo / pg * pg;
    hi = (hi + pg - 1) / pg * pg;
    if (lo < (uintptr_t)d->base || hi > (uintptr_t)d->base + d->len)
        return;
    if (d->wt_hi && lo < d->wt_hi && hi > d->wt_lo) {
        unmap_written_range(d, lo, d->wt_lo > lo ? d->wt_lo : lo);
        unmap_written_range(d, d->wt_hi < hi ? d->wt_hi : hi, hi);
        return;
    }
    if (hi - lo > WRITEBACK_CHUNK)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static int sync_fs(persist_domain *d, const persist_ranges *r)
{
    persist_ranges rest = {0};
    int rc = 0;
    for (unsigned i = 0; i < r->n; i++) {
        uintptr_t lo = r->lo[i], hi = r->hi[i];
        if (d->wt_hi && lo < d->wt_hi && hi > d->wt_lo) {
            if (lo < d->wt_lo)
                ranges_add(&rest, lo, d->wt_lo);
            if (hi > d->wt_hi)
                ranges_add(&rest, d->wt_hi, hi);
            if (rc == 0)
                rc = write_through(d, lo < d->wt_lo ? d->wt_lo : lo, hi > d->wt_hi ? d->wt_hi : hi);
        } else {
            ranges_add(&rest, lo, hi);
        }
    }
    /* Large ranges (the backend's mirror rounds) are first unmapped from
     * this process: writeback write-protects each page it cleans that is
     * still mapped writable, and on x86 that is a TLB shootdown per page, an
     * IPI to every CPU running this process and a wait for its answer (Redis,
     * 100 % HSET, 32 clients: ~20 % of the backend's time in a round, ~500
     * shootdowns/s). One madvise flushes once for the whole range (~20/s).
     * MADV_DONTNEED keeps a shared file mapping's dirty data in the page
     * cache, and the next round's first store to a page faults it back in,
     * as the store to a write-protected page faulted before. p->base is
     * MAP_SHARED in fs mode (sim's private mapping never comes here; the
     * private write-through window is not in rest). */
    for (unsigned i = 0; rc == 0 && i < rest.n; i++)
        unmap_written_range(d, rest.lo[i], rest.hi[i]);
    /* Then they are written back a chunk at a time, each waited for, before
     * the flush: a commit's flush, queued in the device behind every write
     * issued before it, then waits for one chunk instead of a whole round's
     * pages. */
    if (rc == 0 && paced_writeback())
        for (unsigned i = 0; i < rest.n && rc == 0; i++) {
            uint64_t lo = rest.lo[i] - (uintptr_t)d->base, hi = rest.hi[i] - (uintptr_t)d->base;
            if (hi - lo <= WRITEBACK_CHUNK)
                continue;
            for (uint64_t a = lo; a < hi && rc == 0; a += WRITEBACK_CHUNK) {
                uint64_t n = hi - a < WRITEBACK_CHUNK ? hi - a : WRITEBACK_CHUNK;
                if (sync_file_range(d->fd, (off64_t)a, (off64_t)n,
                                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                        SYNC_FILE_RANGE_WAIT_AFTER) != 0)
                    rc = -errno;
            }
        }
    /* Each msync is a write-back of its range plus a device cache flush.
     * One range: msync it. Several (the backend's scattered mirror pages):
     * one fdatasync writes back every dirty page of the file and flushes
     * once, instead of once per range. */
    if (rc == 0 && rest.n == 1) {
        if (msync((void *)rest.lo[0], rest.hi[0] - rest.lo[0], MS_SYNC) != 0)
            rc = -errno;
    } else if (rc == 0 && rest.n > 1) {
        if (fdatasync(d->fd) != 0)
            rc = -errno;
    }
    return rc;
}

int persist_write_through(persist_domain *d, void *addr, size_t len, persist_wt_kind kind,
                          persist_wt_kind *used)
{
    if (used)
        *used = PERSIST_WT_NONE;
    if (d->mode != PERSIST_FS || kind == PERSIST_WT_NONE || len == 0)
        return 0;
    size_t pg = page_size();
    uintptr_t lo = (uintptr_t)addr;
    if (lo % pg || len % pg || lo < (uintptr_t)d->base || lo + len > (uintptr_t)d->base + d->len)
        return -EINVAL;
    if (d->wt_hi)
        return -EBUSY;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", d->fd);
    int fd = -1;
    if (kind == PERSIST_WT_DIRECT) {
        fd = open(path, O_WRONLY | O_CLOEXEC | O_DSYNC | O_DIRECT);
#ifdef STATX_DIOALIGN
        struct statx stx;
        if (fd >= 0 && statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
            (stx.stx_mask & STATX_DIOALIGN) &&
            (stx.stx_dio_offset_align == 0 || stx.stx_dio_mem_align == 0 ||
             pg % stx.stx_dio_offset_align || pg % stx.stx_dio_mem_align)) {
            close(fd); /* direct I/O unsupported, or coarser than a page */
            fd = -1;
        }
#endif
        if (fd < 0)
            kind = PERSIST_WT_BUFFERED;
    }
    if (fd < 0 && (fd = open(path, O_WRONLY | O_CLOEXEC | O_DSYNC)) < 0)
        return -errno;
    /* Whatever the shared mapping still holds dirty goes to the file first;
     * the private pages then read the same page cache until first written. */
    if (msync(addr, len, MS_SYNC) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    void *m = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, d->fd,
                   (off_t)(lo - (uintptr_t)d->base));
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        /* A failed MAP_FIXED may have unmapped the range already: put the
         * shared mapping back, or mark the domain failed (nothing may be
         * written through a hole). */
        if (mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, d->fd,
                 (off_t)(lo - (uintptr_t)d->base)) == MAP_FAILED)
            d->failed = true;
        return -e;
    }
    d->wt_lo = lo;
    d->wt_hi = lo + len;
    d->wt_fd = fd;
    d->wt_kind = kind;
    d->wt_align = pg;
    if (used)
        *used = kind;
    return 0;
}

void persist_write_through_release(persist_domain *d, void *addr, size_t len)
{
    uintptr_t lo = (uintptr_t)addr;
    if (d->wt_kind != PERSIST_WT_BUFFERED || len == 0 || lo < d->wt_lo || lo + len > d->wt_hi)
        return;
    madvise(addr, len, MADV_DONTNEED); /* advice: a failure only keeps the memory */
}

void persist_domain_release(persist_domain *d)
{
    if (d->wt_hi) {
        close(d->wt_fd);
        d->wt_hi = d->wt_lo = 0;
        d->wt_kind = PERSIST_WT_NONE;
    }
}

int persist_sync(persist_domain *d, persist_ranges *r, const char *where)
{
    int rc = 0;
    persist_observer_fn obs = current_observer(); /* one observer for the whole sync */
    uint64_t nth = atomic_fetch_add_explicit(&sync_count, 1, memory_order_relaxed) + 1;
    pthread_once(&fault_once, read_fault_env);
    if (d->mode == PERSIST_SIM && sim_sync_delay_us > 0 && r->n > 0) {
        /* A failing sync takes its time too: reads of other keys can run
         * while it is in flight (test_read_deps). */
        struct timespec ts = {sim_sync_delay_us / 1000000, (sim_sync_delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (fault_now(nth, where)) {
        r->n = 0;
        d->failed = true;
        if (obs)
            obs(PERSIST_EV_SYNC, NULL, 0, where);
        return -fault_sync_errno;
    }
    if (obs && (d->mode == PERSIST_FS || d->mode == PERSIST_SIM))
        for (unsigned i = 0; i < r->n; i++)
            obs(PERSIST_EV_SYNC_RANGE, (const void *)r->lo[i], r->hi[i] - r->lo[i], where);
    if (d->mode == PERSIST_FS) {
        rc = sync_fs(d, r);
    } else if (d->mode == PERSIST_SIM) {
        for (unsigned i = 0; i < r->n && rc == 0; i++)
            rc = pwrite_all(d->fd, (const void *)r->lo[i], r->hi[i] - r->lo[i],
                            r->lo[i] - (uintptr_t)d->base);
    } else if (d->mode == PERSIST_PMEM) {
        __builtin_ia32_sfence();
    } else {
        atomic_thread_fence(memory_order_seq_cst);
    }
    r->n = 0;
    if (rc != 0)
        d->failed = true; /* fsyncgate: never retry as if the data were safe */
    if (obs)
        obs(PERSIST_EV_SYNC, NULL, 0, where);
    return rc;
}

int persist_stage_file(const persist_domain *d, int *fd)
{
    *fd = -1;
    if (d->mode != PERSIST_SIM)
        return 0;
    *fd = memfd_create("mango-sim-stage", MFD_CLOEXEC);
    return *fd >= 0 ? 0 : -errno;
}

/* Sim mode: what a sync of a staged file writes to the file. */
static int copy_stage(int from, int to, uint64_t len)
{
    static char buf[1 << 16];
    for (uint64_t off = 0; off < len;) {
        size_t n = len - off < sizeof buf ? (size_t)(len - off) : sizeof buf;
        ssize_t r = pread(from, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : -EIO;
        int e = pwrite_all(to, buf, (size_t)r, off);
        if (e != 0)
            return e;
        off += (uint64_t)r;
    }
    return ftruncate(to, (off_t)len) == 0 ? 0 : -errno;
}

int persist_sync_file(persist_domain *d, int fd, int stage_fd, uint64_t len, const char *where)
{
    persist_observer_fn obs = current_observer();
    uint64_t nth = atomic_fetch_add_explicit(&sync_count, 1, memory_order_relaxed) + 1;
    pthread_once(&fault_once, read_fault_env);
    int rc = 0;
    if (fault_now(nth, where)) {
        rc = -fault_sync_errno;
    } else {
        if (obs)
            obs(PERSIST_EV_SYNC_RANGE, NULL, 0, where);
        if (stage_fd >= 0 && d->mode == PERSIST_SIM)
            rc = copy_stage(stage_fd, fd, len);
        if (rc == 0 && d->mode != PERSIST_NONE && fdatasync(fd) != 0)
            rc = -errno;
    }
    if (rc != 0)
        d->failed = true; /* as persist_sync: never retry as if the data were safe */
    if (obs)
        obs(PERSIST_EV_SYNC, NULL, 0, where);
    return rc;
}

int persist_sync_new_file(void *base, size_t len, int fd, const char *where)
{
    int f = fault_uncounted(where);
    if (f != 0)
        return f;
    if ((base && msync(base, len, MS_SYNC) != 0) || fsync(fd) != 0)
        return -errno;
    return 0;
}

int persist_writeback(int fd, uint64_t off, uint64_t len, const char *where)
{
    int f = fault_uncounted(where);
    if (f != 0)
        return f;
    if (sync_file_range(fd, (off64_t)off, (off64_t)len,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0 &&
        errno != ENOSYS && errno != EINVAL)
        return -errno;
    return 0;
}

int persist_sync_directory(const char *dir, const char *where)
{
    int f = fault_uncounted(where);
    if (f != 0)
        return f;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    int rc = fsync(dfd) != 0 && errno != EINVAL ? -errno : 0; /* EINVAL: cannot sync directories */
    close(dfd);
    return rc;
}
