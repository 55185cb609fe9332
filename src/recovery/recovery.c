/* recovery.c -- log replay and same-address restore (recovery.h). */
#define _GNU_SOURCE
#include "recovery/recovery.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "alloc/durable_heap.h"
#include "backend/backend.h"
#include "recovery/trace.h"
#include "runtime/error.h"

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

/* The heap root as it will be after replay: the mirror's bytes with every
 * pending block that overlaps the root applied to a private copy. */
typedef struct root_preview {
    const pool_region *heap;
    dheap_root root;
} root_preview;

static int preview_visit(void *arg, const log_frame *f, const log_entry *e)
{
    root_preview *rp = arg;
    uint64_t lo = rp->heap->vaddr, hi = lo + sizeof rp->root;
    for (uint32_t i = 0; i < f->n_entries; i++) {
        uint64_t a = e[i].addr;
        if (a + LOG_BLOCK_SIZE <= lo || a >= hi)
            continue;
        for (unsigned b = 0; b < LOG_BLOCK_SIZE; b++)
            if (a + b >= lo && a + b < hi)
                ((char *)&rp->root)[a + b - lo] = (char)e[i].data[b];
    }
    return MANGO_OK;
}

int recovery_replay(pool *p, recovery_report *rep, uint64_t *tail_lsn, uint64_t *next_seq,
                    uint64_t *generation)
{
    double t0 = now();
    replay_ctx c = {.p = p};
    log_scan_result res;
    /* Validate the whole log (frames and block addresses) before writing a
     * byte: a pool refused for corruption must be left unchanged. */
    int rc = redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                           p->head.generation, UINT64_MAX, validate_visit, p, &res);
    if (rc != MANGO_OK)
        return rc;
    recovery_tracef("replay: log validated (%llu frames, %llu blocks)", (unsigned long long)res.frames,
                    (unsigned long long)res.entries);
    uint64_t valid_end = res.end_lsn;
    const pool_region *heap = pool_find_region(p, POOL_REGION_HEAP);
    if (heap) {
        root_preview rp = {.heap = heap};
        memcpy(&rp.root, p->base + heap->mirror_offset, sizeof rp.root);
        redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                      p->head.generation, valid_end, preview_visit, &rp, &res);
        if (rp.root.magic != 0 && dheap_extent_of_root(&rp.root, heap->size) == 0)
            return mango_error(MANGO_EBADPOOL,
                               "the durable heap root in the pool is corrupt (magic %#llx, top %#llx); "
                               "refusing to recover", (unsigned long long)rp.root.magic,
                               (unsigned long long)rp.root.top);
    }
    recovery_trace("replay: heap root previewed");
    rep->torn_tail = res.torn_tail;
    rep->torn_lsn = res.torn_lsn;
    rc = redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                       p->head.generation, valid_end, replay_visit, &c, &res);
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
    rep->frames_replayed = res.frames;
    rep->blocks_replayed = res.entries;
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
            parallel_copy((char *)r->vaddr, mirror, extent, threads);
            rep->heap_bytes_restored += extent;
            recovery_tracef("restore: heap copied (%llu bytes, %u threads)", (unsigned long long)extent,
                            threads);
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
