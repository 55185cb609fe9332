/* snapshot.c -- writing a snapshot pool from a fork() child's image of the
 * durable memory (snapshot.h says when and why). */
#define _GNU_SOURCE
#include "snapshot/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "log/big_batch.h"
#include "persist/persist.h"
#include "runtime/env_number.h"
#include "runtime/error.h"
#include "snapshot/disks.h"

#define PAGE 4096u

/* What the child needs, copied before the fork: the parent's pool mapping
 * is gone in the child (pool_forget_in_child). */
typedef struct snapshot_src {
    pool_create_params pp;
    char fingerprint_text[POOL_FINGERPRINT_TEXT];
    pool_region regions[POOL_MAX_REGIONS];
    unsigned nregions;
    const uint8_t *bits; /* every data region's written-bytes bitmap, in region order */
    uint64_t bits_at[POOL_MAX_REGIONS];
    uint64_t heap_bytes;
    pid_t parent; /* the process that started it: gone, the writer stops */
    uint64_t bytes_per_s; /* MANGO_SNAPSHOT_MBPS: the heap's copy paced to this (0: not paced) */
    unsigned share;       /* MANGO_SNAPSHOT_SHARE: percent of the time the writer may spend in
                           * writeback (100: not paced); with bytes_per_s set, 100 */
} snapshot_src;

/* The writer stops once the process that started it is gone (it would
 * otherwise go on writing for nobody). Polled: PR_SET_PDEATHSIG follows
 * the thread that forked, not the process. */
static bool parent_gone(const snapshot_src *s) { return getppid() != s->parent; }

static uint64_t bitmap_bytes(const pool_region *r) { return (r->size + 7) / 8; }

/* Written back as it goes, this much at a time: a flush of the whole heap
 * at the end queued up to a heap's worth of writes in front of the
 * application's log syncs on the same device (1 GiB in fs mode: an update
 * waited 0.5 s); a piece at a time, a log sync waits behind one piece
 * (durable Redis, 1 M keys, fs: its slowest SET during a snapshot 130 ms
 * with 8 MiB pieces, 8 ms with 2 MiB ones, and the snapshot 0.5 -> 0.2 s). */
#define WRITEBACK_PIECE (2u << 20)
/* The share of the time the writer keeps the disk busy by default
 * (MANGO_SNAPSHOT_SHARE; see copy_heap): in fs mode, where the application's
 * log syncs go to a disk, a quarter (durable Redis, 1 M keys: a client's
 * SETs during the snapshot at 72-74 % of their rate before it, against
 * 31 % unpaced, for a snapshot 0.47 s long instead of 0.18 s; BGSAVE
 * 1.0-1.2 s); in the other modes its syncs do not wait for a disk, and the
 * writer is not paced. */
#define SNAPSHOT_FS_SHARE 25
#define RUN_MAX (1u << 20)

/* The writer's idle time so far, for its report (only the writer, a
 * single-threaded child, touches it). */
static double paced_total;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The writer idles for pacing, in slices of at most 100 ms, so that it
 * notices its parent gone (a slow disk at a 1 % share owes 99 times each
 * piece's writeback: seconds). Counts what it slept. 0, or -1 once the
 * parent is gone. */
static int idle(const snapshot_src *s, double seconds)
{
    double until = mono_s() + seconds;
    for (double now = mono_s(); now < until; now = mono_s()) {
        if (parent_gone(s))
            return -1;
        double slice = until - now < 0.1 ? until - now : 0.1;
        usleep((useconds_t)(slice * 1e6));
        paced_total += mono_s() - now;
    }
    return 0;
}

/* The heap up to its top into the file at off0, all-zero pages left as
 * holes (they read as zeros), with pwrite (a full file system is ENOSPC
 * here, where a store into a mapping of a sparse file is SIGBUS): runs of
 * non-zero pages, written back a piece at a time. 0 or -errno. */
static int copy_heap(const snapshot_src *s, int fd, uint64_t off0, const char *heap, uint64_t extent)
{
    uint64_t run = 0, run_len = 0, synced = 0, written = 0;
    double t0 = mono_s(), owed = 0;
    for (uint64_t off = 0; off < extent; off += PAGE) {
        size_t n = extent - off < PAGE ? (size_t)(extent - off) : PAGE;
        bool zero = pool_bytes_zero(heap + off, n);
        bool piece_end = off + n - synced >= WRITEBACK_PIECE || off + n == extent;
        if (!zero) {
            if (run_len && (run + run_len != off || run_len >= RUN_MAX)) {
                int e = persist_write_file(fd, heap + run, run_len, off0 + run);
                if (e)
                    return e;
                run_len = 0;
            }
            if (!run_len)
                run = off;
            run_len += n;
            written += n;
        }
        if (run_len && (zero || piece_end)) {
            int e = persist_write_file(fd, heap + run, run_len, off0 + run);
            if (e)
                return e;
            run_len = 0;
        }
        if (!piece_end)
            continue;
        double w0 = mono_s();
        int e = persist_writeback(fd, off0 + synced, off + n - synced, "snapshot.writeback");
        if (e)
            return e;
        synced = off + n;
        if (parent_gone(s))
            return -ECHILD;
        /* Paced by share: after each piece, idle (100 - share) / share of the
         * time its writeback took, so the device serves the application's
         * log syncs alone that much of the time, however fast it is. */
        if (s->share < 100)
            owed += (mono_s() - w0) * (double)(100 - s->share) / (double)s->share;
        if (owed >= 0.001) {
            double slept = mono_s();
            if (idle(s, owed) != 0)
                return -ECHILD;
            owed -= mono_s() - slept;
        }
        double ahead = s->bytes_per_s ? (double)written / (double)s->bytes_per_s - (mono_s() - t0) : 0;
        if (ahead > 0 && idle(s, ahead) != 0) /* paced: the application's own writes keep most of the disk */
            return -ECHILD;
    }
    return 0;
}

/* The bytes of a data region that batches wrote (recovery restores only
 * those), and the bitmap that says which, into the file. 0 or -errno. */
static int copy_data(int fd, const pool_region *r, const char *data, const uint8_t *bits)
{
    uint64_t size = r->size;
    char *mirror = calloc(1, size);
    if (!mirror)
        return -ENOMEM;
    for (uint64_t i = 0; i < size; i += 8) {
        uint8_t m = bits[i / 8];
        if (m == 0xff && i + 8 <= size) {
            memcpy(mirror + i, data + i, 8);
            continue;
        }
        for (unsigned b = 0; b < 8 && i + b < size; b++)
            if (m & (1u << b))
                mirror[i + b] = data[i + b];
    }
    int e = persist_write_file(fd, mirror, size, r->mirror_offset);
    if (!e)
        e = persist_write_file(fd, bits, (size + 7) / 8, r->bitmap_offset);
    free(mirror);
    return e;
}

static int fill(void *arg, char *base, int fd, const pool_region *regs, unsigned n)
{
    (void)base;
    const snapshot_src *s = arg;
    if (n != s->nregions)
        return mango_error(MANGO_ELAYOUT, "snapshot: the new pool has %u regions, the pool %u", n, s->nregions);
    for (unsigned i = 0; i < n; i++) {
        const pool_region *a = &regs[i], *b = &s->regions[i];
        if (a->kind != b->kind || a->vaddr != b->vaddr || a->size != b->size || a->mirror_offset != b->mirror_offset ||
            a->bitmap_offset != b->bitmap_offset)
            return mango_error(MANGO_ELAYOUT, "snapshot: region %u of the new pool is laid out differently from the "
                               "pool's (a pool made by another version?)", i);
    }
    for (unsigned i = 0; i < n; i++) {
        const pool_region *r = &regs[i];
        int e = r->kind == POOL_REGION_HEAP
                    ? copy_heap(s, fd, r->mirror_offset, (const char *)(uintptr_t)r->vaddr, s->heap_bytes)
                    : copy_data(fd, r, (const char *)(uintptr_t)r->vaddr, s->bits + s->bits_at[i]);
        if (e == -ECHILD)
            return mango_error(MANGO_EIO, "mango_snapshot: the process that started it is gone");
        if (e)
            return mango_error(MANGO_EIO, "mango_snapshot: writing the %s's copy: %s",
                               r->kind == POOL_REGION_HEAP ? "durable heap" : "executable's data", strerror(-e));
    }
    /* Test hook: the writer dies, or lingers, before its pool is synced. */
    const char *t = getenv("MANGO_TEST_SNAPSHOT");
    if (t && strcmp(t, "kill") == 0)
        raise(SIGKILL);
    for (int i = 0; t && strcmp(t, "stall") == 0 && i < 300 && !parent_gone(s); i++)
        usleep(100000); /* (30 s at most) */
    if (parent_gone(s))
        return mango_error(MANGO_EIO, "mango_snapshot: the process that started it is gone");
    return MANGO_OK;
}

static void child_main(snapshot_src *s, const char *path, int report_fd)
{
    /* The application's handlers are not the writer's: a signal ends it
     * (its temporary file is then removed by the parent), and so does the
     * end of the thread that waits for it. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    /* Nor are its crash handlers: a writer that died of SIGBUS (a full disk
     * under the new file's mapping) ran Redis's, which wrote a bug report of
     * the live server into its log and could remove its pid file (found by
     * a review, session 36). The parent reports the signal. */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    signal(SIGFPE, SIG_DFL);
    signal(SIGILL, SIG_DFL);
    signal(SIGABRT, SIG_DFL);
    if (parent_gone(s))
        _exit(1);
    /* Nothing of the application's stays open here but stdin/out/err: a
     * listening socket kept by a writer would refuse a restarted server its
     * port (the pool's descriptors are gone already, pool_forget_in_child). */
    if (report_fd != 3) {
        if (dup2(report_fd, 3) != 3)
            _exit(1);
        if (report_fd < 3) { /* a process without stdin/out/err: keep the slot off the pipe */
            int null = open("/dev/null", O_RDWR);
            if (null < 0 || dup2(null, report_fd) != report_fd)
                _exit(1);
            if (null > 3)
                close(null);
        } else {
            close(report_fd);
        }
        report_fd = 3;
    }
    if (close_range(4, ~0u, 0) != 0)
        for (int fd = 4; fd < 65536; fd++)
            close(fd);
    if (write(report_fd, "S", 1) != 1) /* started: snapshot_started returns */
        _exit(1);
    snapshot_report r = {.rc = pool_create(path, &s->pp)};
    r.paced_seconds = paced_total;
    if (r.rc == MANGO_EEXIST)
        r.rc = mango_error(MANGO_EEXIST, "%s exists: a snapshot never replaces a file", path);
    /* pool_create's own messages name neither the snapshot nor its path but
     * the temporary file, gone by now ("cannot sync new pool <snap>.tmp.<pid>:
     * Input/output error" when the pool's final sync fails): say whose. */
    if (r.rc != MANGO_OK)
        snprintf(r.message, sizeof r.message, "%s%s",
                 strncmp(mango_last_error(), "mango_snapshot", 14) != 0 ? "mango_snapshot: " : "",
                 mango_last_error());
    ssize_t w = write(report_fd, &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
}

/* Frames committed but not yet applied: their .data/.bss blocks' masks go
 * into the bitmaps' copy, as the backend will put them into the pool's. */
typedef struct mark_ctx {
    snapshot_src *s;
    uint8_t *bits;
} mark_ctx;

static int mark_frame(void *arg, const log_frame *f, const log_entry *e)
{
    mark_ctx *m = arg;
    for (uint32_t i = 0; i < f->n_entries; i++) {
        if (log_entry_is_data(&e[i])) { /* (heap only) */
            uint64_t slots = log_entry_slots(&e[i]);
            if (slots == 0)
                return mango_error(MANGO_EBADPOOL, "mango_snapshot: a malformed data range in log frame seq %llu",
                                   (unsigned long long)f->seq);
            i += (uint32_t)slots - 1;
            continue;
        }
        if (log_entry_is_zero(&e[i]))
            continue; /* (heap only) */
        for (unsigned r = 0; r < m->s->nregions; r++) {
            const pool_region *d = &m->s->regions[r];
            if (d->kind != POOL_REGION_DATA || e[i].addr < d->vaddr || e[i].addr - d->vaddr >= d->size)
                continue;
            uint64_t off = e[i].addr - d->vaddr; /* 32-aligned: the block's bits are one aligned uint32_t */
            uint32_t *w = (uint32_t *)(m->bits + m->s->bits_at[r] + off / 8);
            *w |= e[i].mask;
            break;
        }
    }
    return MANGO_OK;
}

/* MANGO_SNAPSHOT_SHARE: unset or empty (the default: SNAPSHOT_FS_SHARE for
 * a pool in fs mode whose disk the snapshot may share, else 100), or 1..100
 * (100: not paced). */
static int share_of(persist_mode mode, bool shares_disk, unsigned *share)
{
    *share = mode == PERSIST_FS && shares_disk ? SNAPSHOT_FS_SHARE : 100;
    const char *env = getenv("MANGO_SNAPSHOT_SHARE");
    if (!env || !*env)
        return MANGO_OK;
    unsigned long long v = 0;
    if (!env_decimal(env, &v) || v < 1 || v > 100)
        return mango_error(MANGO_EINVAL, "MANGO_SNAPSHOT_SHARE=%s: expected the percent of the time a snapshot's "
                           "writer may keep the disk busy, 1 to 100 (100: not paced)", env);
    *share = (unsigned)v;
    return MANGO_OK;
}

/* MANGO_SNAPSHOT_MBPS: unset, empty or 0 (not paced), or 1..100000. */
static int pace_of(uint64_t *bytes_per_s)
{
    *bytes_per_s = 0;
    const char *env = getenv("MANGO_SNAPSHOT_MBPS");
    if (!env || !*env)
        return MANGO_OK;
    unsigned long long v = 0;
    if (!env_decimal(env, &v) || v > 100000)
        return mango_error(MANGO_EINVAL, "MANGO_SNAPSHOT_MBPS=%s: expected 0 (a snapshot's writer is not paced) or "
                           "its pace in MB/s, 1 to 100000", env);
    *bytes_per_s = v * 1000000ull;
    return MANGO_OK;
}

bool snapshot_shares_disk(const pool *p, const char *path)
{
    return p->pd.mode == PERSIST_FS && disks_relation(p->pd.fd, path) == DISK_SAME_OR_UNKNOWN;
}

int snapshot_start(const pool *p, const redo_log *log, uint64_t applied_lsn, const char *path, bool shares_disk,
                   snapshot_job *job)
{
    snapshot_src s;
    memset(&s, 0, sizeof s);
    int prc = pace_of(&s.bytes_per_s);
    /* Pacing leaves the pool's disk to the log's syncs: a snapshot on
     * another disk, or in memory, takes nothing from them. */
    if (prc == MANGO_OK)
        prc = share_of(p->pd.mode, shares_disk, &s.share);
    if (prc != MANGO_OK)
        return prc;
    if (s.bytes_per_s) /* a pace in MB/s replaces the share */
        s.share = 100;
    const pool_header *h = p->hdr;
    snprintf(s.fingerprint_text, sizeof s.fingerprint_text, "%s", h->fingerprint_text);
    s.pp.pool_size = h->pool_size;
    s.pp.log_size = h->log_size;
    s.pp.mode = (persist_mode)h->created_mode;
    s.pp.heap_base = h->heap_base;
    s.pp.fingerprint = h->fingerprint;
    s.pp.fingerprint_text = s.fingerprint_text;
    s.pp.fill = fill;
    s.pp.sparse = true; /* a backup: only the state's bytes are written, as by `mango copy` */
    s.pp.fill_arg = &s;
    s.nregions = p->nregions;
    memcpy(s.regions, p->regions, sizeof s.regions);
    uint64_t bits_len = 0;
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        if (r->kind == POOL_REGION_HEAP) {
            s.heap_bytes = dheap_extent_of_root((const dheap_root *)(uintptr_t)r->vaddr, r->size);
            if (s.heap_bytes == 0)
                return mango_error(MANGO_EINVAL, "mango_snapshot: the durable heap has no allocator root yet");
            continue;
        }
        if (s.pp.n_data == POOL_MAX_REGIONS - 1)
            return mango_error(MANGO_ELAYOUT, "mango_snapshot: too many data regions");
        s.pp.data_vaddr[s.pp.n_data] = r->vaddr;
        s.pp.data_size[s.pp.n_data] = r->size;
        s.pp.data_loader_bytes[s.pp.n_data++] = p->loader_end[i] > r->vaddr ? p->loader_end[i] - r->vaddr : 0;
        s.bits_at[i] = bits_len;
        bits_len += bitmap_bytes(r);
    }
    /* The bitmaps as they are now: the backend goes on setting bits once
     * the write side is released. Anonymous memory, not the heap's. */
    uint8_t *bits = NULL;
    if (bits_len) {
        bits = mmap(NULL, bits_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (bits == MAP_FAILED)
            return mango_error(MANGO_ENOMEM, "mango_snapshot: cannot copy the written-bytes bitmaps (%llu bytes)",
                               (unsigned long long)bits_len);
        for (unsigned i = 0; i < p->nregions; i++)
            if (p->regions[i].kind != POOL_REGION_HEAP)
                memcpy(bits + s.bits_at[i], p->base + p->regions[i].bitmap_offset, bitmap_bytes(&p->regions[i]));
        if (applied_lsn < log->tail_lsn) {
            mark_ctx m = {.s = &s, .bits = bits};
            big_batch_scan big = {.path = p->big_batch_path, .visit = mark_frame, .arg = &m};
            const log_frame *f = (const log_frame *)(log->ring + applied_lsn % log->cap);
            log_scan_result res;
            int rc = redo_log_scan(log->ring, log->cap, applied_lsn, f->seq, log->generation, log->tail_lsn,
                                   big_batch_visit, &big, &res);
            if (rc == MANGO_OK && res.end_lsn != log->tail_lsn)
                rc = mango_error(MANGO_EBADPOOL, "mango_snapshot: the log's committed frames end at %llu, not at "
                                 "its tail %llu", (unsigned long long)res.end_lsn,
                                 (unsigned long long)log->tail_lsn);
            if (rc != MANGO_OK) {
                munmap(bits, bits_len);
                return rc;
            }
        }
    }
    s.bits = bits;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        int e = errno;
        if (bits)
            munmap(bits, bits_len);
        return mango_error(MANGO_EIO, "mango_snapshot: pipe: %s", strerror(e));
    }
    s.parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        child_main(&s, path, pfd[1]);
    }
    int e = errno;
    if (bits)
        munmap(bits, bits_len);
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        return mango_error(MANGO_ENOMEM, "mango_snapshot: fork: %s", strerror(e));
    }
    job->pid = pid;
    job->result_fd = pfd[0];
    snprintf(job->tmp_path, sizeof job->tmp_path, "%s.tmp.%d", path, (int)pid); /* pool_create's name */
    snprintf(job->path, sizeof job->path, "%s", path);
    job->reported = false;
    job->heap_bytes = s.heap_bytes;
    job->share = s.share;
    job->shares_disk = p->pd.mode == PERSIST_FS && shares_disk;
    job->bytes_per_s = s.bytes_per_s;
    return MANGO_OK;
}

int snapshot_started(snapshot_job *job)
{
    char c;
    ssize_t n;
    while ((n = read(job->result_fd, &c, 1)) < 0 && errno == EINTR)
        ;
    if (n == 1 && c == 'S')
        return MANGO_OK;
    int rc = snapshot_finish(job, true);
    return rc != MANGO_OK ? rc : mango_error(MANGO_EIO, "mango_snapshot: the writer did not start");
}

int snapshot_finish(snapshot_job *job, bool wait)
{
    if (!job->reported) {
        if (!wait) {
            struct pollfd pf = {.fd = job->result_fd, .events = POLLIN};
            int n = poll(&pf, 1, 0);
            if (n == 0 || (n < 0 && errno == EINTR))
                return MANGO_EAGAIN;
        }
        size_t got = 0;
        snapshot_report *r = &job->report;
        while (got < sizeof *r) {
            ssize_t n = read(job->result_fd, (char *)r + got, sizeof *r - got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        close(job->result_fd);
        job->result_fd = -1;
        job->reported = true;
        job->got_report = got == sizeof *r;
    }
    /* Reaped, without waiting in a poll: a writer that reported may take a
     * while to exit (its copy of a big heap is torn down). */
    int st = 0;
    pid_t w;
    while ((w = waitpid(job->pid, &st, wait ? 0 : WNOHANG)) < 0 && errno == EINTR)
        ;
    if (w == 0)
        return MANGO_EAGAIN;
    if (job->got_report) {
        if (job->report.rc != MANGO_OK)
            return mango_error(job->report.rc, "%s", job->report.message);
        return MANGO_OK;
    }
    /* The writer died before it reported: its temporary file is left. */
    unlink(job->tmp_path);
    const char *left = access(job->path, F_OK) == 0
                           ? "; it may have finished just before: check the snapshot's path with mango check"
                           : "; nothing was left at the snapshot's path";
    if (w == job->pid && WIFSIGNALED(st))
        /* SIGBUS: a store into the new file's mapping found no disk block
         * behind it, as when the file system at the path is full (noted by
         * a review, session 37: the message said only "signal 7"). */
        return mango_error(MANGO_EIO, "mango_snapshot: the writer (pid %d) was killed by signal %d%s%s",
                           (int)job->pid, WTERMSIG(st),
                           WTERMSIG(st) == SIGBUS ? " (SIGBUS: probably no space left on the snapshot's file "
                                                    "system)"
                                                  : "",
                           left);
    return mango_error(MANGO_EIO, "mango_snapshot: the writer (pid %d) ended without a report (%s)%s", (int)job->pid,
                       w == job->pid ? "its exit status is not 0" : "another part of the process reaped it", left);
}

void snapshot_cancel(snapshot_job *job)
{
    kill(job->pid, SIGKILL);
    (void)snapshot_finish(job, true); /* (a writer that had finished leaves its snapshot) */
}
