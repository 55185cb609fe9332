/* recovery.c -- log replay and same-address restore (recovery.h). */
#define _GNU_SOURCE
#include "recovery/recovery.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "backend/backend.h"
#include "log/big_batch.h"
#include "recovery/heap_preview.h"
#include "recovery/trace.h"
#include "runtime/error.h"

#define PAGE_BYTES 4096u

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct replay_ctx {
    pool *p;
    persist_ranges ranges;
} replay_ctx;

static int replay_visit(void *arg, const log_frame *f, const log_entry *e)
{
    replay_ctx *c = arg;
    return backend_apply_frame(c->p, f, e, &c->ranges);
}

static int validate_visit(void *arg, const log_frame *f, const log_entry *e)
{
    return backend_check_frame(arg, f, e);
}

/* Walk the previewed heap's metadata (heap_preview.h). */
static int walk_preview(const heap_preview *hp, uint64_t frames)
{
    int rc = heap_preview_walk(hp);
    if (rc == -2)
        return mango_error(MANGO_EBADPOOL, "the durable heap (%llu bytes) is not one the allocator can attach "
                           "(MANGO_CHECK_HEAP=1); refusing to recover, the pool is unchanged",
                           (unsigned long long)hp->heap->size);
    if (rc != 0)
        return mango_error(MANGO_EBADPOOL,
                           "the durable heap's metadata is inconsistent (MANGO_CHECK_HEAP=1)%s: the reason "
                           "is on the line above; refusing to recover, the pool is unchanged",
                           frames ? " with the pending log applied" : "");
    return MANGO_OK;
}

int recovery_replay(pool *p, bool walk_heap, recovery_report *rep, uint64_t *tail_lsn,
                    uint64_t *next_seq, uint64_t *generation)
{
    double t0 = now();
    replay_ctx c = {.p = p};
    int lrc = pool_check_loader_bits(p);
    if (lrc != MANGO_OK)
        return lrc;
    rep->heap_walked = 0;
    log_scan_result res;
    /* Validate the whole log (frames and block addresses) before writing a
     * byte: a pool refused for corruption must be left unchanged. */
    /* Frames that keep their entries in the big-batch file are seen through
     * it (log/big_batch.h); the validation pass checks that file whole. */
    /* After a clean shutdown nothing can follow the head: the ring is not
     * searched for committed frames after it (redo_log_scan_from_clean_head). */
    big_batch_scan big = {.path = p->big_batch_path, .verify = true, .visit = validate_visit, .arg = p};
    int rc = p->head.clean
                 ? redo_log_scan_from_clean_head(pool_log(p), p->hdr->log_size, p->head.head_lsn,
                                                 p->head.next_seq, p->head.generation, big_batch_visit,
                                                 &big, &res)
                 : redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                                 p->head.generation, UINT64_MAX, big_batch_visit, &big, &res);
    if (rc != MANGO_OK)
        return rc;
    recovery_tracef("replay: log validated (%llu frames, %llu blocks)", (unsigned long long)res.frames,
                    (unsigned long long)res.entries);
    /* (From this whole-log scan: the later ones stop at valid_end.) */
    rep->torn_tail = res.torn_tail;
    rep->torn_lsn = res.torn_lsn;
    if (res.torn_tail)
        recovery_tracef("replay: torn tail discarded at lsn %llu (a batch never acknowledged; with "
                        "%llu complete frames after it, written before it was durable)",
                        (unsigned long long)res.torn_lsn, (unsigned long long)res.dropped_after_torn);
    uint64_t valid_end = res.end_lsn;
    const pool_region *heap = pool_find_region(p, POOL_REGION_HEAP);
    if (heap) {
        heap_preview hp;
        heap_preview_init(&hp, p, heap);
        int e = walk_heap ? heap_preview_map(&hp, p) : 0;
        if (e) /* (strict overcommit charges the whole heap) */
            fprintf(stderr, "mangosteen: cannot map a private copy of the durable heap to walk it before "
                    "recovery (%s); it is walked after recovery instead\n", strerror(e));
        big_batch_scan bigp = {.path = p->big_batch_path, .visit = heap_preview_frame, .arg = &hp};
        rc = redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                           p->head.generation, valid_end, big_batch_visit, &bigp, &res);
        /* (The scan can fail: it opens and maps the big-batch file.) */
        if (rc == MANGO_OK && hp.root.magic == DHEAP_MAGIC && hp.root.version != DHEAP_VERSION)
            rc = mango_error(MANGO_EBADPOOL,
                             "the durable heap in the pool has format version %llu, this build reads "
                             "version %u only; refusing to recover (open it with the build that made it)",
                             (unsigned long long)hp.root.version, (unsigned)DHEAP_VERSION);
        if (rc == MANGO_OK && hp.root.magic != 0 && dheap_extent_of_root(&hp.root, heap->size) == 0)
            rc = mango_error(MANGO_EBADPOOL,
                             "the durable heap root in the pool is corrupt (magic %#llx, top %#llx); "
                             "refusing to recover", (unsigned long long)hp.root.magic,
                             (unsigned long long)hp.root.top);
        if (rc == MANGO_OK && hp.copy && hp.root.magic != 0) {
            rc = walk_preview(&hp, res.frames);
            rep->heap_walked = rc == MANGO_OK;
            recovery_trace("replay: heap metadata walked on a private copy");
        }
        heap_preview_unmap(&hp);
        if (rc != MANGO_OK)
            return rc;
    }
    recovery_trace("replay: heap root previewed");
    big_batch_scan bigr = {.path = p->big_batch_path, .visit = replay_visit, .arg = &c};
    rc = redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                       p->head.generation, valid_end, big_batch_visit, &bigr, &res);
    if (rc != MANGO_OK)
        return rc;
    recovery_trace("replay: frames applied to the mirror");
    int s = persist_sync(&p->pd, &c.ranges, "recovery.mirror_sync");
    if (s != 0)
        return mango_error(MANGO_EIO, "sync of the mirror failed during recovery: %s", strerror(-s));
    uint64_t gen = p->head.generation + 1;
    /* Write the head twice so both slots name the new generation and position:
     * frames of the old generation are then never read again. */
    rc = pool_write_head(p, res.end_lsn, res.next_seq, gen, false);
    if (rc == MANGO_OK)
        rc = pool_write_head(p, res.end_lsn, res.next_seq, gen, false);
    if (rc != MANGO_OK)
        return rc;
    recovery_trace("replay: mirror synced, head written");
    /* Both head slots are past every frame: none names the big-batch file. */
    if (unlink(p->big_batch_path) != 0 && errno != ENOENT)
        fprintf(stderr, "mangosteen: cannot remove %s: %s (harmless: the next big batch "
                "overwrites it)\n", p->big_batch_path, strerror(errno));
    rep->frames_replayed = res.frames;
    rep->blocks_replayed = res.entries - bigr.big_frames + bigr.big_entries;
    rep->replay_seconds = now() - t0;
    *tail_lsn = res.end_lsn;
    *next_seq = res.next_seq;
    *generation = gen;
    return MANGO_OK;
}

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t len;
} copy_job;

static void *copy_worker(void *arg)
{
    copy_job *j = arg;
    memcpy(j->dst, j->src, j->len);
    return NULL;
}

static void parallel_copy(char *dst, const char *src, size_t len, unsigned threads)
{
    enum { MAXT = 16 };
    if (threads > MAXT)
        threads = MAXT;
    if (threads <= 1 || len < (8u << 20)) {
        memcpy(dst, src, len);
        return;
    }
    copy_job jobs[MAXT];
    pthread_t tid[MAXT];
    size_t chunk = (len / threads + 4095) & ~(size_t)4095;
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        size_t off = (size_t)i * chunk;
        if (off >= len)
            break;
        jobs[i] = (copy_job){dst + off, src + off, off + chunk > len ? len - off : chunk};
        if (i == 0 || pthread_create(&tid[i], NULL, copy_worker, &jobs[i]) != 0) {
            if (i != 0)
                copy_worker(&jobs[i]);
            continue;
        }
        started |= 1u << i;
    }
    copy_worker(&jobs[0]);
    for (unsigned i = 1; i < threads; i++)
        if (started & (1u << i))
            pthread_join(tid[i], NULL);
}

/* ---- mapping the heap mirror copy-on-write (see recovery.h) ---------------
 *
 * The pool file's heap mirror is mapped MAP_PRIVATE at the heap's address
 * instead of being copied. A page of such a mapping shows the file's page
 * until the process first writes it; the write makes a private copy. So a
 * page this process never wrote would show every later change to the file.
 * That is safe because of one invariant: after recovery, the only writer of
 * the heap mirror is the backend of this process (the pool is flock'ed, and
 * the mapping keeps the lock's file description alive while it exists), and
 * the backend writes a heap block only as the redo of a store this process
 * made to that block in a batch -- and that store already made the page
 * private. An entry whose block was captured but not stored (a capture of a
 * range that was only read) carries the bytes the process read, i.e. the
 * file's own bytes: writing them back changes nothing.
 *
 * fork() breaks the invariant: the child shares the file pages the parent has
 * not written yet, and the parent's backend keeps changing them. A
 * pthread_atfork prepare handler therefore makes every page private first
 * (MADV_POPULATE_WRITE); it is done once, by the first fork. */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static struct {
    pthread_mutex_t mu;
    uintptr_t lo;  /* the file-backed part of the heap: [lo, lo + len) */
    size_t len;    /* 0: nothing mapped from the pool (or already private) */
    bool handler;  /* the atfork handler is registered */
} cow = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int privatize(uintptr_t lo, size_t len)
{
    while (len) {
        if (madvise((void *)lo, len, MADV_POPULATE_WRITE) == 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

static void before_fork(void)
{
    pthread_mutex_lock(&cow.mu);
    if (cow.len) {
        double t0 = now();
        int rc = privatize(cow.lo, cow.len);
        if (rc != 0) {
            char msg[256];
            int n = snprintf(msg, sizeof msg,
                             "mangosteen: fork: cannot make the restored heap private (%s); the child "
                             "may see later changes of the pool file in pages the parent has not "
                             "written\n", strerror(-rc));
            if (n > 0)
                (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        } else {
            recovery_tracef("fork: restored heap made private (%zu bytes, %.3f s)", cow.len, now() - t0);
            cow.len = 0;
        }
    }
    pthread_mutex_unlock(&cow.mu);
}

bool recovery_heap_still_shared(void)
{
    pthread_mutex_lock(&cow.mu);
    bool shared = cow.len != 0;
    pthread_mutex_unlock(&cow.mu);
    return shared;
}

void recovery_heap_unmapped(void)
{
    pthread_mutex_lock(&cow.mu);
    cow.len = 0;
    pthread_mutex_unlock(&cow.mu);
}

/* Can this kernel make a private file mapping's pages private on demand? */
static bool populate_write_supported(void)
{
    /* The advice is checked before the (empty) range. */
    return madvise((void *)(uintptr_t)4096, 0, MADV_POPULATE_WRITE) == 0;
}

static const char *restore_method(const pool *p, const pool_region *r)
{
    const char *env = getenv("MANGO_RESTORE");
    if (env && strcmp(env, "copy") == 0)
        return "copy";
    /* pmem: untouched pages would be read from the device at its speed;
     * keep the heap in DRAM as the design says (not measured: no DAX here). */
    if (p->pd.mode == PERSIST_PMEM)
        return "copy";
    if (r->mirror_offset % PAGE_BYTES || r->vaddr % PAGE_BYTES || p->fd < 0)
        return "copy";
    if (!populate_write_supported())
        return "copy";
    return "map";
}

/* Map [0, full) of the heap mirror privately at the heap's address. Returns 0,
 * or an errno when the mapping failed and the range is anonymous memory again
 * (the reservation), or -1 when not even the reservation could be restored. */
static int map_heap(pool *p, const pool_region *r, size_t full)
{
    void *want = (void *)(uintptr_t)r->vaddr;
    /* Through an open file description of its own, not the locked one: a
     * fork() child keeps the heap but drops every reference to the locked
     * description (pool_forget_in_child), so that the pool's lock does not
     * outlive the parent in a lingering child (a snapshot writer); the
     * runtime keeps the lock itself while the heap is mapped (runtime.c). */
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", p->fd);
    int fd = open(self, O_RDONLY | O_CLOEXEC);
    void *m = mmap(want, full, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
                   fd >= 0 ? fd : p->fd, (off_t)r->mirror_offset);
    if (fd >= 0)
        close(fd);
    if (m == want)
        return 0;
    int e = errno;
    /* A failed MAP_FIXED may have removed the reservation: put it back. */
    void *a = mmap(want, full, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (a != want)
        return -1;
    return e ? e : EINVAL;
}

int recovery_restore(pool *p, unsigned threads, recovery_report *rep)
{
    double t0 = now();
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        const char *mirror = p->base + r->mirror_offset;
        if (r->kind == POOL_REGION_HEAP) {
            uint64_t extent = dheap_extent_of_root((const dheap_root *)mirror, r->size);
            if (extent == 0) {
                /* No valid root: the heap was never initialised (empty state). */
                const dheap_root *root = (const dheap_root *)mirror;
                if (root->magic != 0)
                    return mango_error(MANGO_EBADPOOL, "durable heap root in the pool is invalid");
                continue;
            }
            size_t full = (size_t)extent & ~(size_t)(PAGE_BYTES - 1);
            const char *how = full ? restore_method(p, r) : "copy";
            int mrc = 0;
            if (strcmp(how, "map") == 0 && (mrc = map_heap(p, r, full)) == 0) {
                /* The partial last page is copied: bytes past top stay zero, as
                 * with a copy. */
                memcpy((char *)r->vaddr + full, mirror + full, extent - full);
                pthread_mutex_lock(&cow.mu);
                if (!cow.handler && pthread_atfork(before_fork, NULL, NULL) == 0)
                    cow.handler = true;
                cow.lo = r->vaddr;
                cow.len = cow.handler ? full : 0;
                pthread_mutex_unlock(&cow.mu);
                if (!cow.handler) {
                    /* Without the fork handler, do not leave shared pages behind. */
                    int prc = privatize(r->vaddr, full);
                    if (prc != 0)
                        return mango_error(MANGO_ENOMEM, "cannot make the restored heap private: %s",
                                           strerror(-prc));
                }
                rep->heap_bytes_mapped += full;
                rep->heap_bytes_restored += extent - full;
                recovery_tracef("restore: heap mapped copy-on-write (%zu bytes; %llu copied)", full,
                                (unsigned long long)(extent - full));
            } else {
                if (mrc < 0)
                    return mango_error(MANGO_ENOMEM, "cannot map the durable heap from the pool, "
                                       "and its address range was lost");
                parallel_copy((char *)r->vaddr, mirror, extent, threads);
                rep->heap_bytes_restored += extent;
                recovery_tracef("restore: heap copied (%llu bytes, %u threads%s%s)",
                                (unsigned long long)extent, threads,
                                mrc ? ", mapping failed: " : "", mrc ? strerror(mrc) : "");
            }
        } else {
            const uint64_t *bits = (const uint64_t *)(p->base + r->bitmap_offset);
            char *dst = (char *)r->vaddr;
            for (uint64_t w = 0; w < r->size / 64; w++) {
                uint64_t m = bits[w];
                if (!m)
                    continue;
                if (m == ~0ull) {
                    memcpy(dst + w * 64, mirror + w * 64, 64);
                    rep->data_bytes_restored += 64;
                    continue;
                }
                for (unsigned b = 0; b < 64; b++)
                    if (m & (1ull << b)) {
                        dst[w * 64 + b] = mirror[w * 64 + b];
                        rep->data_bytes_restored++;
                    }
            }
            uint64_t tail = r->size % 64; /* size is a multiple of 32 */
            if (tail) {
                uint32_t m = ((const uint32_t *)bits)[(r->size / 32) - 1];
                uint64_t base = r->size - 32;
                for (unsigned b = 0; b < 32; b++)
                    if (m & (1u << b)) {
                        dst[base + b] = mirror[base + b];
                        rep->data_bytes_restored++;
                    }
            }
        }
    }
    recovery_tracef("restore: data regions (%llu bytes)", (unsigned long long)rep->data_bytes_restored);
    rep->restore_seconds = now() - t0;
    return MANGO_OK;
}
