/* big_batch.c -- the big-batch file: writing a batch too large for a log
 * frame, and reading it back for the backend and recovery (big_batch.h). */
#define _GNU_SOURCE
#include "log/big_batch.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pool/crc32c.h"
#include "runtime/error.h"

#define STAGING_BYTES (1u << 20) /* entries are written in 1 MiB pwrites */

static uint32_t header_crc(const big_batch_header *h)
{
    return crc32c(0, h, offsetof(big_batch_header, header_crc));
}

void big_batch_writer_init(big_batch_writer *w)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->stage_fd = -1;
    for (int i = 0; i < BIG_BATCH_SPARE_FDS; i++)
        w->spare_fds[i] = -1;
}

void big_batch_hold_spare_fds(big_batch_writer *w)
{
    for (int i = 0; i < BIG_BATCH_SPARE_FDS; i++)
        if (w->spare_fds[i] < 0)
            w->spare_fds[i] = open("/", O_PATH | O_CLOEXEC);
}

static void release_spare_fds(big_batch_writer *w)
{
    for (int i = 0; i < BIG_BATCH_SPARE_FDS; i++)
        if (w->spare_fds[i] >= 0) {
            close(w->spare_fds[i]);
            w->spare_fds[i] = -1;
        }
}

/* Where the file's bytes are written before its sync. */
static int out_fd(const big_batch_writer *w) { return w->stage_fd >= 0 ? w->stage_fd : w->fd; }

/* Does path still name the file open as fd? */
static bool names_file(const char *path, int fd)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Open (creating) the file, and sim mode's staging file, and make the
 * file's name durable. */
static int open_file(big_batch_writer *w, persist_domain *pd, const char *path)
{
    if (w->stage_fd < 0) {
        int e = persist_stage_file(pd, &w->stage_fd);
        if (e != 0)
            return mango_error(MANGO_EIO, "cannot make the big-batch staging file: %s", strerror(-e));
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return mango_error(MANGO_EIO, "cannot open the big-batch file %s: %s", path, strerror(errno));
    /* The file must still exist after a crash once a frame names it. */
    char dir[sizeof(((pool *)0)->big_batch_path)];
    snprintf(dir, sizeof dir, "%s", path);
    int s = persist_sync_file(pd, fd, -1, 0, "big_batch.create");
    if (s == 0)
        s = persist_sync_directory(dirname(dir), "big_batch.create_dir");
    if (s != 0) {
        close(fd);
        pd->failed = true;
        return mango_error(MANGO_EIO, "cannot make the big-batch file %s durable: %s", path, strerror(-s));
    }
    w->fd = fd;
    return MANGO_OK;
}

int big_batch_begin(big_batch_writer *w, persist_domain *pd, const char *path)
{
    if (!w->buf) {
        w->buf = mmap(NULL, STAGING_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (w->buf == MAP_FAILED) {
            w->buf = NULL;
            return mango_error(MANGO_ENOMEM, "cannot allocate the big-batch staging buffer");
        }
    }
    if (w->fd >= 0 && !names_file(path, w->fd)) {
        /* Removed or replaced behind our back (a temp-file cleaner): what we
         * wrote through the old descriptor would not be found by recovery. */
        close(w->fd);
        w->fd = -1;
    }
    if (w->fd < 0) {
        /* The spares make room for what is opened here (a process may have
         * used every other descriptor by now); taken again after. */
        release_spare_fds(w);
        int rc = open_file(w, pd, path);
        big_batch_hold_spare_fds(w);
        if (rc != MANGO_OK)
            return rc;
    }
    w->used = 0;
    w->file_off = sizeof(big_batch_header);
    w->n = 0;
    w->crc = 0;
    w->err = 0;
    return MANGO_OK;
}

static void flush_staging(big_batch_writer *w)
{
    if (w->used == 0)
        return;
    w->crc = crc32c(w->crc, w->buf, w->used);
    if (!w->err)
        w->err = persist_write_file(out_fd(w), w->buf, w->used, w->file_off);
    w->file_off += w->used;
    w->used = 0;
}

static log_entry *next_entry(big_batch_writer *w)
{
    if (w->used + sizeof(log_entry) > STAGING_BYTES)
        flush_staging(w);
    log_entry *e = (log_entry *)(w->buf + w->used);
    w->used += sizeof(log_entry);
    w->n++;
    return e;
}

void big_batch_put(big_batch_writer *w, uintptr_t block, uint32_t mask)
{
    log_entry *e = next_entry(w);
    e->addr = block;
    e->mask = mask;
    e->reserved = 0;
    memcpy(e->data, (const void *)block, LOG_BLOCK_SIZE);
}

/* A zero range's or data range's header entry: tagged address, length. */
static void put_range_header(big_batch_writer *w, uint64_t tagged_addr, uint64_t len)
{
    log_entry *e = next_entry(w);
    e->addr = tagged_addr;
    e->mask = 0;
    e->reserved = 0;
    memset(e->data, 0, LOG_BLOCK_SIZE);
    memcpy(e->data, &len, sizeof len);
}

void big_batch_put_zero(big_batch_writer *w, uintptr_t addr, uint64_t len)
{
    put_range_header(w, LOG_ZERO_TAG | addr, len);
}

void big_batch_put_data(big_batch_writer *w, uintptr_t addr, uint64_t len)
{
    put_range_header(w, LOG_DATA_TAG | addr, len);
    uint64_t slots = LOG_DATA_PAYLOAD_SLOTS(len), pad = slots * sizeof(log_entry) - len;
    /* The bytes go to the file straight from memory (in the file they are
     * contiguous, as in a frame); the zero padding after them through the
     * staging buffer. */
    flush_staging(w);
    w->crc = crc32c(w->crc, (const void *)addr, len);
    if (!w->err)
        w->err = persist_write_file(out_fd(w), (const void *)addr, len, w->file_off);
    w->file_off += len;
    memset(w->buf, 0, pad);
    w->used = pad;
    w->n += slots;
}

int big_batch_finish(big_batch_writer *w, persist_domain *pd, const char *path, uint64_t generation,
                     uint64_t seq, uint64_t lsn, log_entry *ref)
{
    flush_staging(w);
    if (w->n > UINT32_MAX)
        return mango_error(MANGO_EINVAL, "a batch wrote %llu blocks; one batch may hold at most %u",
                           (unsigned long long)w->n, UINT32_MAX);
    big_batch_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, BIG_BATCH_MAGIC, sizeof h.magic);
    h.version = BIG_BATCH_VERSION;
    h.header_size = sizeof h;
    h.generation = generation;
    h.seq = seq;
    h.lsn = lsn;
    h.n_entries = w->n;
    h.payload_crc = w->crc;
    h.header_crc = header_crc(&h);
    uint64_t file_bytes = sizeof h + w->n * sizeof(log_entry);
    int e = w->err;
    if (!e)
        e = persist_write_file(out_fd(w), &h, sizeof h, 0);
    if (!e && ftruncate(out_fd(w), (off_t)file_bytes) != 0) /* a longer earlier batch's tail */
        e = -errno;
    if (e) {
        pd->failed = true; /* like a failed sync: nothing more may be acknowledged */
        return mango_error(MANGO_EIO, "cannot write the big-batch file %s: %s; the batch is not "
                           "durable and the runtime accepts no more writes", path, strerror(-e));
    }
    int s = persist_sync_file(pd, w->fd, w->stage_fd, file_bytes, "big_batch.sync");
    if (s != 0)
        return mango_error(MANGO_EIO, "sync of the big-batch file %s failed (%s); the batch is not "
                           "durable and the runtime accepts no more writes", path, strerror(-s));
    if (!names_file(path, w->fd)) {
        pd->failed = true;
        return mango_error(MANGO_EIO, "the big-batch file %s was removed or replaced while a batch was "
                           "written to it; the batch is not durable and the runtime accepts no more "
                           "writes", path);
    }
    big_batch_ref r = {.n_entries = w->n, .file_bytes = file_bytes, .payload_crc = w->crc,
                       .header_crc = h.header_crc};
    ref->addr = LOG_BIG_TAG;
    ref->mask = 0;
    ref->reserved = 0;
    memcpy(ref->data, &r, sizeof r);
    w->batches++;
    w->bytes += file_bytes;
    return MANGO_OK;
}

void big_batch_release(big_batch_writer *w)
{
    /* Not an ordering point: whatever a crash leaves of this truncation,
     * recovery reads the file only for a frame past the head, and none is.
     * A failed truncation only keeps the space: the next big batch rewrites
     * the file from its start. */
    if (w->fd >= 0)
        (void)!ftruncate(w->fd, 0);
    if (w->stage_fd >= 0)
        (void)!ftruncate(w->stage_fd, 0);
    w->pending = false;
}

void big_batch_writer_close(big_batch_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    if (w->stage_fd >= 0)
        close(w->stage_fd);
    if (w->buf)
        munmap(w->buf, STAGING_BYTES);
    release_spare_fds(w);
    big_batch_writer_init(w);
}

/* ---- reading ---- */

static int refuse(const big_batch_scan *s, const log_frame *f, const char *why)
{
    return mango_error(MANGO_EBADPOOL,
                       "committed batch seq %llu keeps its entries in the big-batch file %s, which %s; "
                       "refusing to use the pool (restore that file beside the pool and try again)",
                       (unsigned long long)f->seq, s->path, why);
}

/* The file is there but this process cannot read it (permissions, a symlink
 * loop, too many open files, an I/O error, no address space): the pool is not
 * bad, and nothing was applied. MANGO_EIO, so `mango check` exits 2, not 1. */
static int unreadable(const big_batch_scan *s, const log_frame *f, const char *what, int err)
{
    return mango_error(MANGO_EIO,
                       "committed batch seq %llu keeps its entries in the big-batch file %s, which %s (%s); "
                       "nothing was applied (make that file readable and try again)",
                       (unsigned long long)f->seq, s->path, what, strerror(err));
}

int big_batch_visit(void *arg, const log_frame *f, const log_entry *e)
{
    big_batch_scan *s = arg;
    /* A reference is a frame's only entry. (One among other entries is an
     * address outside every region, which the visitors refuse.) */
    if (f->n_entries != 1 || !log_entry_is_big_ref(e))
        return s->visit ? s->visit(s->arg, f, e) : MANGO_OK;
    big_batch_ref r;
    memcpy(&r, e->data, sizeof r);
    if (e->mask || e->reserved || r.reserved)
        return mango_error(MANGO_EBADPOOL, "log frame seq %llu holds a malformed big-batch reference",
                           (unsigned long long)f->seq);
    char why[160];
    /* The frontend's descriptor (the backend) or the file by name. */
    bool own = !(s->writer && s->writer->fd >= 0);
    int fd = own ? open(s->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) /* (a FIFO must not hang the open) */
                 : s->writer->fd;
    if (fd < 0)
        return errno == ENOENT ? refuse(s, f, "is missing") : unreadable(s, f, "cannot be opened", errno);
    struct stat st;
    big_batch_header h;
    uint64_t want = sizeof h + r.n_entries * sizeof(log_entry);
    const char *bad = NULL;
    const char *failed = NULL; /* (a read error, not a bad file) */
    int err = 0;
    ssize_t got = 0;
    if (fstat(fd, &st) != 0) {
        failed = "cannot be examined";
        err = errno;
    } else if (!S_ISREG(st.st_mode)) {
        bad = "is not a regular file";
    } else if ((got = pread(fd, &h, sizeof h, 0)) < 0) {
        failed = "cannot be read";
        err = errno;
    } else if (got != (ssize_t)sizeof h) {
        bad = "is too short to hold a header";
    } else if (memcmp(h.magic, BIG_BATCH_MAGIC, sizeof h.magic) != 0 || h.header_crc != header_crc(&h)) {
        bad = "has a damaged header";
    } else if (h.version != BIG_BATCH_VERSION || h.header_size != sizeof h) {
        bad = "has a format version this build does not read";
    } else if (h.generation != f->generation || h.seq != f->seq || h.lsn != f->lsn ||
             h.n_entries != r.n_entries || h.payload_crc != r.payload_crc ||
             h.header_crc != r.header_crc || r.file_bytes != want || r.n_entries > UINT32_MAX) {
        snprintf(why, sizeof why, "holds another batch (seq %llu, generation %llu)",
                 (unsigned long long)h.seq, (unsigned long long)h.generation);
        bad = why;
    } else if ((uint64_t)st.st_size < want) {
        bad = "is shorter than its entries (truncated)";
    }
    void *map = bad || failed ? MAP_FAILED : mmap(NULL, want, PROT_READ, MAP_SHARED, fd, 0);
    if (!bad && !failed && map == MAP_FAILED) {
        failed = "cannot be mapped";
        err = errno;
    }
    if (own)
        close(fd);
    if (failed)
        return unreadable(s, f, failed, err);
    if (bad)
        return refuse(s, f, bad);
    const log_entry *entries = (const log_entry *)((const char *)map + sizeof h);
    int rc = MANGO_OK;
    if (s->verify && crc32c(0, entries, r.n_entries * sizeof(log_entry)) != r.payload_crc)
        rc = refuse(s, f, "fails its checksum (torn or corrupt)");
    if (rc == MANGO_OK) {
        log_frame whole = *f;
        whole.n_entries = (uint32_t)r.n_entries;
        rc = s->visit ? s->visit(s->arg, &whole, entries) : MANGO_OK;
        s->big_frames++;
        s->big_entries += r.n_entries;
    }
    munmap(map, want);
    return rc;
}
