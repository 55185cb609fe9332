/* redo_log.c -- frame append/commit for the combiner, scanning for the backend
 * and recovery (format and invariants in redo_log.h). */
#include "log/redo_log.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pool/crc32c.h"
#include "runtime/error.h"

static uint64_t round64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

static uint32_t frame_header_crc(const log_frame *f)
{
    return crc32c(0, f, offsetof(log_frame, header_crc));
}

void redo_log_init(redo_log *l, pool *p, uint64_t tail_lsn, uint64_t next_seq, uint64_t generation,
                   uint64_t reusable_lsn)
{
    memset(l, 0, sizeof *l);
    l->pool = p;
    l->ring = pool_log(p);
    l->cap = p->hdr->log_size;
    l->tail_lsn = tail_lsn;
    l->next_seq = next_seq;
    l->generation = generation;
    atomic_store(&l->committed_lsn, tail_lsn);
    atomic_store(&l->reusable_lsn, reusable_lsn);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->space_cv, NULL);
}

void redo_log_destroy(redo_log *l)
{
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->space_cv);
}

uint32_t redo_log_max_entries(const redo_log *l)
{
    /* A frame must fit wherever the tail stands once everything before it is
     * applied and reusable. One that does not fit before the ring's end is
     * padded to it, so pad + frame must stay within the ring: true for any
     * tail position only if the frame is at most half of it (less a rounding
     * block). A larger frame could wait for space that never comes: a 47 MB
     * frame in a 64 MiB ring hung the durable Redis, its backend spinning. */
    return (uint32_t)((l->cap / 2 - sizeof(log_frame) - 64) / sizeof(log_entry));
}

static void write_pad(redo_log *l, uint64_t lsn, uint64_t bytes)
{
    log_frame *f = (log_frame *)(l->ring + lsn % l->cap);
    memset(f, 0, sizeof *f);
    f->magic = LOG_FRAME_MAGIC;
    f->version = LOG_FRAME_VERSION;
    f->kind = LOG_FRAME_PAD;
    f->lsn = lsn;
    f->seq = l->next_seq;
    f->generation = l->generation;
    f->payload_crc = crc32c(0, NULL, 0);
    f->frame_bytes = bytes;
    f->durable_lsn = atomic_load_explicit(&l->committed_lsn, memory_order_acquire);
    f->header_crc = frame_header_crc(f);
    persist_note_store(f, sizeof *f, "log.pad");
}

int redo_log_wait_reusable(redo_log *l, uint64_t lsn)
{
    if (atomic_load_explicit(&l->reusable_lsn, memory_order_acquire) >= lsn)
        return MANGO_OK;
    pthread_mutex_lock(&l->mu);
    atomic_fetch_add_explicit(&l->full_waits, 1, memory_order_relaxed);
    while (atomic_load_explicit(&l->reusable_lsn, memory_order_acquire) < lsn) {
        if (l->pool->pd.failed) {
            pthread_mutex_unlock(&l->mu);
            return mango_error(MANGO_EIO, "waiting for the backend to free log space, but it has failed");
        }
        l->space_waiters++;
        if (l->kick) {
            pthread_mutex_unlock(&l->mu);
            l->kick(l->kick_arg);
            pthread_mutex_lock(&l->mu);
            if (atomic_load(&l->reusable_lsn) >= lsn) {
                l->space_waiters--;
                break;
            }
            /* A failure while the mutex was dropped for the kick: its
             * wake-up (redo_log_wake_space_waiters) came before this wait. */
            if (l->pool->pd.failed) {
                l->space_waiters--;
                continue; /* the check at the top returns the error */
            }
        }
        pthread_cond_wait(&l->space_cv, &l->mu);
        l->space_waiters--;
    }
    /* Space came, but the pool may have failed meanwhile (a sync of the log,
     * a big batch or the backend's): nothing more may be committed. */
    bool failed = l->pool->pd.failed;
    pthread_mutex_unlock(&l->mu);
    if (failed)
        return mango_error(MANGO_EIO, "waiting for the backend to free log space, but the pool has failed");
    return MANGO_OK;
}

int redo_log_reserve(redo_log *l, uint32_t n, log_frame_writer *w)
{
    uint64_t bytes = round64(sizeof(log_frame) + (uint64_t)n * sizeof(log_entry));
    if (n > redo_log_max_entries(l))
        return mango_error(MANGO_EINVAL,
                           "a batch wrote %u blocks (%llu bytes of log) but one batch may take at most "
                           "half of the %llu-byte log; configure a larger log_size",
                           n, (unsigned long long)bytes, (unsigned long long)l->cap);
    uint64_t off = l->tail_lsn % l->cap;
    uint64_t pad = off + bytes > l->cap ? l->cap - off : 0;
    uint64_t need_end = l->tail_lsn + pad + bytes;
    /* No head past POOL_MAX_LSN (a pool would refuse it): the tail never
     * gets there. (A pool opens with its head at most there, so no wrap.) */
    if (need_end > POOL_MAX_LSN)
        return mango_error(MANGO_EIO, "the log's position would pass 2^62 (%llu): no more writes are accepted",
                           (unsigned long long)need_end);
    if (need_end > l->cap) {
        int rc = redo_log_wait_reusable(l, need_end - l->cap);
        if (rc != MANGO_OK)
            return rc;
    }
    w->pad_lsn = l->tail_lsn;
    w->pad_bytes = pad;
    if (pad) {
        write_pad(l, l->tail_lsn, pad);
        l->tail_lsn += pad;
    }
    w->lsn = l->tail_lsn;
    w->bytes = bytes;
    w->hdr = (log_frame *)(l->ring + w->lsn % l->cap);
    w->entries = (log_entry *)(w->hdr + 1);
    w->capacity = n;
    w->n = 0;
    return MANGO_OK;
}

static uint64_t seal_frame(redo_log *l, log_frame_writer *w)
{
    log_frame *f = w->hdr;
    size_t payload = (size_t)w->n * sizeof(log_entry);
    uint64_t bytes = round64(sizeof(log_frame) + payload);
    memset((char *)w->entries + payload, 0, bytes - sizeof(log_frame) - payload);
    f->magic = LOG_FRAME_MAGIC;
    f->version = LOG_FRAME_VERSION;
    f->kind = LOG_FRAME_BATCH;
    f->lsn = w->lsn;
    f->seq = l->next_seq;
    f->generation = l->generation;
    f->n_entries = w->n;
    f->payload_crc = crc32c(0, w->entries, payload);
    f->frame_bytes = bytes;
    f->durable_lsn = atomic_load_explicit(&l->committed_lsn, memory_order_acquire);
    f->reserved = 0;
    f->header_crc = frame_header_crc(f);
    persist_note_store(f, bytes, "log.frame");
    return bytes;
}

int redo_log_commit(redo_log *l, log_frame_writer *w)
{
    uint64_t bytes = seal_frame(l, w);
    log_frame *f = w->hdr;
    persist_domain *pd = &l->pool->pd;
    persist_ranges r = {0};
    /* A PAD written by reserve fills the ring's end; it must be as durable as
     * the frame, or recovery would find garbage followed by a good frame. */
    if (w->pad_bytes)
        persist_flush(pd, &r, l->ring + w->pad_lsn % l->cap, sizeof(log_frame), "log.flush_pad");
    persist_flush(pd, &r, f, bytes, "log.flush");
#ifndef MANGO_MUTATE_NO_COMMIT_SYNC
    int rc = persist_sync(pd, &r, "log.commit_sync");
    if (rc != 0)
        return mango_error(MANGO_EIO, "sync of the redo log failed (%s); the batch is not durable "
                           "and the runtime accepts no more writes", strerror(-rc));
#endif
    l->tail_lsn = w->lsn + bytes;
    l->next_seq++;
    /* seq_cst: pairs with the backend's sleeping flag (backend_notify). */
    atomic_store(&l->committed_lsn, l->tail_lsn);
    return MANGO_OK;
}

void redo_log_seal(redo_log *l, log_frame_writer *w)
{
    uint64_t bytes = seal_frame(l, w);
    l->tail_lsn = w->lsn + bytes;
    l->next_seq++;
}

int redo_log_sync_upto(redo_log *l, uint64_t from_lsn, uint64_t to_lsn)
{
    if (to_lsn <= from_lsn)
        return MANGO_OK;
    persist_domain *pd = &l->pool->pd;
    persist_ranges r = {0};
    /* At most one turn of the ring: log space is reused only below the
     * committed (durable) end, so [from, to) is shorter than the ring. */
    uint64_t a = from_lsn % l->cap, len = to_lsn - from_lsn;
    if (a + len <= l->cap) {
        persist_flush(pd, &r, l->ring + a, len, "log.flush");
    } else {
        persist_flush(pd, &r, l->ring + a, l->cap - a, "log.flush");
        persist_flush(pd, &r, l->ring, a + len - l->cap, "log.flush");
    }
#ifndef MANGO_MUTATE_NO_COMMIT_SYNC
    int rc = persist_sync(pd, &r, "log.pipeline_sync");
    if (rc != 0)
        return mango_error(MANGO_EIO, "sync of the redo log failed (%s); the batches in it are not "
                           "durable and the runtime accepts no more writes", strerror(-rc));
#endif
    atomic_store(&l->committed_lsn, to_lsn);
    return MANGO_OK;
}

/* Log bytes [lo, hi) were applied and are below both head slots: drop this
 * process's copies of the ring pages that lie wholly inside (fs mode's
 * private ring, persist_write_through_release). Called before the new limit
 * is published, so the frontend, still bound by the old one, writes no page
 * of the range meanwhile; lo is rounded up past the page the old limit ends
 * in, which the frontend may already be filling for its next lap. */
static void drop_released_pages(redo_log *l, uint64_t lo, uint64_t hi)
{
    persist_domain *d = &l->pool->pd;
    if (!d->wt_hi)
        return;
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE); /* madvise needs whole pages */
    lo = (lo + pg - 1) / pg * pg;
    if (lo < l->dropped_lsn)
        lo = l->dropped_lsn;
    hi = hi / pg * pg;
    if (hi <= lo)
        return;
    if (hi - lo > l->cap)
        lo = hi - l->cap;
    uint64_t a = lo % l->cap, len = hi - lo;
    uint64_t first = len < l->cap - a ? len : l->cap - a;
    persist_write_through_release(d, l->ring + a, first);
    if (len > first)
        persist_write_through_release(d, l->ring, len - first);
    l->dropped_lsn = hi;
}

void redo_log_wake_space_waiters(redo_log *l)
{
    pthread_mutex_lock(&l->mu);
    pthread_cond_broadcast(&l->space_cv);
    pthread_mutex_unlock(&l->mu);
}

void redo_log_release(redo_log *l, uint64_t lsn)
{
    pthread_mutex_lock(&l->mu);
    uint64_t old = atomic_load_explicit(&l->reusable_lsn, memory_order_relaxed);
    if (lsn > old)
        drop_released_pages(l, old, lsn);
    atomic_store_explicit(&l->reusable_lsn, lsn, memory_order_release);
    if (l->space_waiters)
        pthread_cond_broadcast(&l->space_cv);
    pthread_mutex_unlock(&l->mu);
}

/* ---- scanning ---- */

/* Is there a complete, committed frame at pos? On failure says why. */
static const log_frame *frame_at(const char *ring, uint64_t cap, uint64_t pos, uint64_t seq,
                                 uint64_t gen, bool check_payload, char *why, size_t whylen)
{
    uint64_t off = pos % cap;
    if (off > cap - sizeof(log_frame)) { /* (an unaligned position: the header would cross the end) */
        snprintf(why, whylen, "frame position %llu is not %zu-byte aligned", (unsigned long long)pos,
                 sizeof(log_frame));
        return NULL;
    }
    const log_frame *f = (const log_frame *)(ring + off);
    if (f->magic != LOG_FRAME_MAGIC || f->header_crc != frame_header_crc(f)) {
        snprintf(why, whylen, "frame header checksum mismatch");
        return NULL;
    }
    if (f->version != LOG_FRAME_VERSION || f->lsn != pos || f->generation != gen || f->seq != seq ||
        f->frame_bytes < sizeof(log_frame) || f->frame_bytes % 64 || f->frame_bytes > cap - off ||
        (f->kind != LOG_FRAME_BATCH && f->kind != LOG_FRAME_PAD) ||
        sizeof(log_frame) + (uint64_t)f->n_entries * sizeof(log_entry) > f->frame_bytes) {
        snprintf(why, whylen, "stale or foreign frame (lsn %llu seq %llu gen %llu)",
                 (unsigned long long)f->lsn, (unsigned long long)f->seq,
                 (unsigned long long)f->generation);
        return NULL;
    }
    if (f->kind == LOG_FRAME_PAD && off + f->frame_bytes != cap) {
        snprintf(why, whylen, "pad frame does not end at the ring's end");
        return NULL;
    }
    if (check_payload && crc32c(0, f + 1, (size_t)f->n_entries * sizeof(log_entry)) != f->payload_crc) {
        snprintf(why, whylen, "frame payload checksum mismatch (torn or corrupt)");
        return NULL;
    }
    return f;
}

/* After a bad frame at pos (sequence seq): look at every complete frame of
 * this lap after it. One written when pos was already durable (its
 * durable_lsn > pos) proves the bad frame had been committed: corruption.
 * Others were in flight with it (pipelined commit) and are dropped; *dropped
 * counts them. A candidate whose header is sound (this lap, this
 * generation, its checksum) is the one frame written at its position, so
 * no frame starts inside it: the search skips its extent, and checksums
 * each byte of the ring at most once. (It checksummed every candidate's
 * payload: a crafted ring of headers each reaching the ring's end, each
 * payload wrong, took an hour for 64 MiB, in check and recovery alike.) */
static bool committed_frame_follows(const char *ring, uint64_t cap, uint64_t pos, uint64_t seq,
                                    uint64_t gen, uint64_t *dropped)
{
    char why[96];
    *dropped = 0;
    for (uint64_t d = 64; d < cap; d += 64) {
        uint64_t cand = pos + d;
        if (cand % cap > cap - sizeof(log_frame))
            continue; /* (only from an unaligned pos, which frame_at refuses) */
        const log_frame *f = (const log_frame *)(ring + cand % cap);
        if (f->magic != LOG_FRAME_MAGIC || f->lsn != cand || f->seq < seq || f->seq - seq > cap / 64)
            continue;
        if (!frame_at(ring, cap, cand, f->seq, gen, false, why, sizeof why))
            continue;
        d += f->frame_bytes - 64; /* (and the loop's 64: the next candidate is past this frame) */
        if (!frame_at(ring, cap, cand, f->seq, gen, true, why, sizeof why))
            continue;
        if (f->durable_lsn > pos)
            return true;
        ++*dropped;
    }
    return false;
}

static int scan(const char *ring, uint64_t cap, uint64_t from_lsn, uint64_t from_seq, uint64_t generation,
                uint64_t limit_lsn, bool clean_head, log_frame_visitor visit, void *arg,
                log_scan_result *out)
{
    memset(out, 0, sizeof *out);
    uint64_t pos = from_lsn, seq = from_seq;
    while (pos < limit_lsn) {
        /* The backend scans only frames this process committed (limit set):
         * their payload is known to be whole, so skip its checksum. */
        const log_frame *f = frame_at(ring, cap, pos, seq, generation, limit_lsn == UINT64_MAX,
                                      out->torn_reason, sizeof out->torn_reason);
        if (!f) {
            if (limit_lsn != UINT64_MAX) {
                /* The backend only scans what the frontend committed: never torn. */
                out->end_lsn = pos;
                out->next_seq = seq;
                return mango_error(MANGO_EBADPOOL, "log frame at lsn %llu (seq %llu): %s",
                                   (unsigned long long)pos, (unsigned long long)seq, out->torn_reason);
            }
            if (clean_head && pos == from_lsn) {
                out->torn_lsn = pos; /* the end: nothing was committed after a clean head */
                break;
            }
            if (committed_frame_follows(ring, cap, pos, seq, generation, &out->dropped_after_torn)) {
                out->end_lsn = pos;
                out->next_seq = seq;
                return mango_error(MANGO_EBADPOOL,
                                   "redo log corrupt: frame at lsn %llu (seq %llu) is bad (%s) but "
                                   "committed frames follow it; refusing to recover",
                                   (unsigned long long)pos, (unsigned long long)seq, out->torn_reason);
            }
            /* Torn: a frame of this lap was started here. Anything else (a
             * stale frame from an earlier lap, zeroes) is the log's clean end. */
            const log_frame *t = (const log_frame *)(ring + pos % cap);
            bool fits = pos % cap <= cap - sizeof(log_frame); /* (see frame_at) */
            out->torn_tail = (fits && t->magic == LOG_FRAME_MAGIC && t->lsn == pos &&
                              t->generation == generation) ||
                             out->dropped_after_torn > 0;
            out->torn_lsn = pos;
            break;
        }
        if (f->kind == LOG_FRAME_BATCH) {
            int rc = visit ? visit(arg, f, (const log_entry *)(f + 1)) : 0;
            if (rc != 0) {
                out->end_lsn = pos;
                out->next_seq = seq;
                return rc;
            }
            out->frames++;
            out->entries += f->n_entries;
            seq++;
        }
        pos += f->frame_bytes;
    }
    out->end_lsn = pos;
    out->next_seq = seq;
    return MANGO_OK;
}

int redo_log_scan(const char *ring, uint64_t cap, uint64_t from_lsn, uint64_t from_seq,
                  uint64_t generation, uint64_t limit_lsn, log_frame_visitor visit, void *arg,
                  log_scan_result *out)
{
    return scan(ring, cap, from_lsn, from_seq, generation, limit_lsn, false, visit, arg, out);
}

int redo_log_scan_from_clean_head(const char *ring, uint64_t cap, uint64_t from_lsn, uint64_t from_seq,
                                  uint64_t generation, log_frame_visitor visit, void *arg,
                                  log_scan_result *out)
{
    return scan(ring, cap, from_lsn, from_seq, generation, UINT64_MAX, true, visit, arg, out);
}
