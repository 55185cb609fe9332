/* pool.c -- pool creation, validation, locking and mapping (see pool.h). */
#define _GNU_SOURCE
#include "pool/pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <libgen.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "pool/crc32c.h"
#include "runtime/error.h"

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

#define PAGE 4096u
static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

static uint32_t header_crc(const pool_header *h)
{
    return crc32c(0, h, offsetof(pool_header, header_crc));
}

static uint32_t slot_crc(const pool_head_slot *s)
{
    return crc32c(0, s, offsetof(pool_head_slot, crc));
}

persist_mode pool_detect_mode(int fd, size_t size)
{
    struct statfs sfs;
    if (fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC)
        return PERSIST_EMULATED;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
    if (m != MAP_FAILED) {
        munmap(m, size);
        return PERSIST_PMEM;
    }
    return PERSIST_FS;
}

static int zero_fill(int fd, uint64_t off, uint64_t len, const char *path)
{
    static const char zeros[1 << 16];
    while (len > 0) {
        size_t n = len < sizeof zeros ? (size_t)len : sizeof zeros;
        ssize_t w = pwrite(fd, zeros, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return mango_error(MANGO_EIO, "cannot write the log ring of %s: %s", path,
                               w < 0 ? strerror(errno) : "short write");
        off += (uint64_t)w;
        len -= (uint64_t)w;
    }
    return MANGO_OK;
}

/* A pool file with holes -- a backup written by mango_snapshot() or `mango
 * copy`, both sparse -- gets what pool_create() gives a new pool before it
 * is opened for writing:
 *   - its blocks reserved: a store into a hole of the mapping on a full disk
 *     is a SIGBUS that kills the process; here it is an error at open;
 *   - its log ring written: a commit into a hole or an unwritten extent
 *     changes file metadata, and its sync becomes a journal commit (a
 *     restored durable Redis ran at 34 k SET/s instead of 52 k in fs mode
 *     until its ring had been written once).
 * Only holes are written, and only where they read back as zeros, so the
 * pool's contents do not change. On a pool with no holes this costs one
 * fallocate (tens of microseconds). Not for tmpfs (stays sparse, as in
 * pool_create) or sim mode (a private mapping: the file is not written). */
/* A pool on tmpfs stays sparse (its untouched heap costs no memory), so a
 * store into a page the file system has no room for is a SIGBUS, which
 * kills the process in the middle of a batch (nothing acknowledged is lost:
 * the next start recovers, and meets the same wall). Say so when the pool's
 * unbacked part is larger than the file system's free space. */
static void warn_if_tmpfs_is_short(int fd, const struct statfs *sfs, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    uint64_t size = (uint64_t)st.st_size, held = (uint64_t)st.st_blocks * 512;
    uint64_t unbacked = size > held ? size - held : 0;
    uint64_t avail = (uint64_t)sfs->f_bavail * (uint64_t)sfs->f_bsize;
    if (unbacked <= avail)
        return;
    fprintf(stderr,
            "mangosteen: warning: pool %s is on tmpfs, where %llu MiB of its %llu MiB are not in "
            "memory yet, and the file system has %llu MiB free: writing past that kills this "
            "process with SIGBUS (nothing acknowledged is lost; the next start recovers). Give "
            "the tmpfs more room (mount -o remount,size=...) or use a smaller pool\n",
            path, (unsigned long long)(unbacked >> 20), (unsigned long long)(size >> 20),
            (unsigned long long)(avail >> 20));
}

typedef struct {
    uint64_t start, end;
} byte_range;

/* The holes of [start, end), as SEEK_HOLE reports them (ext4 and xfs count
 * unwritten extents, too): malloc'd into *out. Called before the blocks are
 * reserved: after a fallocate ext4 may call a freshly reserved range data. */
static int find_holes(int fd, uint64_t start, uint64_t end, byte_range **out, size_t *n, const char *path)
{
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    for (uint64_t off = start; off < end;) {
        off_t hole = lseek(fd, (off_t)off, SEEK_HOLE);
        if (hole < 0 || (uint64_t)hole >= end)
            break;
        off_t data = lseek(fd, hole, SEEK_DATA);
        uint64_t stop = data < 0 || (uint64_t)data > end ? end : (uint64_t)data;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            byte_range *grown = realloc(*out, cap * sizeof **out);
            if (!grown) {
                free(*out);
                return mango_error(MANGO_ENOMEM, "out of memory listing the holes of %s", path);
            }
            *out = grown;
        }
        (*out)[(*n)++] = (byte_range){(uint64_t)hole, stop};
        off = stop;
    }
    return MANGO_OK;
}

/* Write zeros over the parts of r that read back as zeros (all of it, unless
 * the file system called data a hole); *written grows by what was written. */
static int zero_where_zero(int fd, byte_range r, uint64_t *written, const char *path)
{
    enum { CHUNK = 1 << 16 };
    char *buf = malloc(CHUNK); /* (not static: pools may be opened by several threads) */
    if (!buf)
        return mango_error(MANGO_ENOMEM, "out of memory filling the log ring of %s", path);
    int rc = MANGO_OK;
    for (uint64_t at = r.start; at < r.end && rc == MANGO_OK;) {
        size_t want = r.end - at < CHUNK ? (size_t)(r.end - at) : CHUNK;
        ssize_t got = pread(fd, buf, want, (off_t)at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = mango_error(MANGO_EIO, "cannot read the log ring of %s: %s", path,
                             got < 0 ? strerror(errno) : "short read");
            break;
        }
        if (pool_bytes_zero(buf, (size_t)got)) {
            rc = zero_fill(fd, at, (uint64_t)got, path);
            *written += rc == MANGO_OK ? (uint64_t)got : 0;
        }
        at += (uint64_t)got;
    }
    free(buf);
    return rc;
}

/* A refused reservation leaves the file as it was, its space included: a
 * failed fallocate may have reserved part of what it was asked for, which
 * would keep the file system full until the pool is removed. Every range
 * that was a hole before becomes one again (unwritten: no byte changes). */
static void give_back(int fd, const byte_range *holes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)holes[i].start,
                        (off_t)(holes[i].end - holes[i].start));
}

static int give_sparse_pool_its_blocks(int fd, const char *path, uint64_t size, uint64_t log_offset,
                                       uint64_t log_size)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct stat before;
    if (fstat(fd, &before) != 0)
        return mango_error(MANGO_EIO, "cannot stat %s: %s", path, strerror(errno));
    uint64_t held = (uint64_t)before.st_blocks * 512;
    byte_range *holes;
    size_t nholes;
    int rc = find_holes(fd, 0, size, &holes, &nholes, path);
    if (rc != MANGO_OK)
        return rc;
    struct statfs fs;
    uint64_t free_bytes = fstatfs(fd, &fs) == 0 ? (uint64_t)fs.f_bfree * (uint64_t)fs.f_bsize : UINT64_MAX;
    /* (held counts the file's metadata blocks too: an estimate, used only
     * to skip a reservation that cannot succeed even with root's reserve) */
    int err = size > held && size - held > free_bytes ? ENOSPC : 0;
    const char *t = getenv("MANGO_FAULT_RESERVE_ANYWAY"); /* (tests: reach a fallocate that fails) */
    if (t && strcmp(t, "1") == 0)
        err = 0;
    if (!err && fallocate(fd, 0, 0, (off_t)size) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
        err = errno;
        give_back(fd, holes, nholes);
    }
    if (err) {
        free(holes);
        return mango_error(MANGO_EIO,
                           "cannot reserve the disk blocks of pool %s: %s (the pool is %llu MiB, its file "
                           "holds %llu MiB, the file system has %llu MiB free; a sparse pool, such as a "
                           "backup or a copy, gets all its blocks at its first writable open); free disk "
                           "space, or open it read-only (mango check, mango copy)",
                           path, strerror(err), (unsigned long long)(size >> 20), (unsigned long long)(held >> 20),
                           (unsigned long long)(free_bytes == UINT64_MAX ? 0 : free_bytes >> 20));
    }
    /* Of those holes, the log ring's (written once: commits then never
     * change file metadata). */
    size_t nring = 0;
    for (size_t i = 0; i < nholes; i++) {
        uint64_t a = holes[i].start > log_offset ? holes[i].start : log_offset;
        uint64_t b = holes[i].end < log_offset + log_size ? holes[i].end : log_offset + log_size;
        if (a < b)
            holes[nring++] = (byte_range){a, b};
    }
    nholes = nring;
    uint64_t filled = 0;
    for (size_t i = 0; i < nholes && rc == MANGO_OK; i++)
        rc = zero_where_zero(fd, holes[i], &filled, path);
    free(holes);
    if (rc != MANGO_OK || filled == 0)
        return rc;
    /* Durable now, or the first commit's sync would write it all. */
    int e = persist_sync_new_file(NULL, 0, fd, "pool.sparse_fill_sync");
    if (e != 0)
        return mango_error(MANGO_EIO, "cannot sync the log ring of %s: %s", path, strerror(-e));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr,
            "mangosteen: pool %s was sparse (a backup or a copy): reserved its %llu MiB and "
            "wrote %llu MiB of its log ring in %.2f s\n",
            path, (unsigned long long)(size >> 20), (unsigned long long)(filled >> 20),
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return MANGO_OK;
}

/* No such process, or only its exit status is left (a zombie: a writer
 * whose parent died stays one until its new parent reaps it). */
static bool process_gone(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false; /* (kill() found it: no /proc here, or another PID namespace's) */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold anything */
    return close_paren && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

/* pool.h. Whose process is gone, and whose file nobody holds locked (a
 * creator locks its file at once; the lock also covers a creator in another
 * PID namespace, which kill() cannot see). Best effort: a file that cannot
 * be examined is left alone. */
void pool_remove_abandoned(const char *path, const char *tag, pool_removed_fn removed)
{
    /* The directory and file name (libgen's functions may write to their
     * argument: each gets its own copy). */
    char dirbuf[4096], basebuf[4096], prefix[4096 + 32];
    snprintf(dirbuf, sizeof dirbuf, "%s", path);
    snprintf(basebuf, sizeof basebuf, "%s", path);
    const char *dir = dirname(dirbuf);
    size_t plen = (size_t)snprintf(prefix, sizeof prefix, "%s%s", basename(basebuf), tag);
    if (plen >= sizeof prefix)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        const char *digits = e->d_name + plen;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (digits[0] < '1' || digits[0] > '9' || (*end && strcmp(end, ".bigbatch")) || errno || pid > INT32_MAX)
            continue;
        if (pid == getpid() || !process_gone((pid_t)pid))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            unlinkat(dirfd(d), e->d_name, 0) == 0) {
            char file[4096 + 256];
            snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
            removed(file, pid, (long long)st.st_size);
        }
        close(fd);
    }
    closedir(d);
}

/* Does name end in tag followed by a pid as pool_remove_abandoned reads it? */
static bool ends_in_tag_pid(const char *name, const char *tag)
{
    size_t tl = strlen(tag);
    for (const char *at = strstr(name, tag); at; at = strstr(at + 1, tag)) {
        const char *d = at + tl;
        if (at == name || d[0] < '1' || d[0] > '9')
            continue;
        while (*d >= '0' && *d <= '9')
            d++;
        if (*d == '\0')
            return true;
    }
    return false;
}

const char *pool_owned_name_pattern(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    size_t n = strlen(name), bl = strlen(".bigbatch");
    if (n > bl && strcmp(name + n - bl, ".bigbatch") == 0)
        return ".bigbatch";
    if (ends_in_tag_pid(name, ".tmp."))
        return ".tmp.<pid>";
    if (ends_in_tag_pid(name, ".copying-"))
        return ".copying-<pid>";
    return NULL;
}

static void creation_removed(const char *file, long pid, long long bytes)
{
    fprintf(stderr, "mangosteen: removed %s (%lld bytes), left by a pool creation whose process %ld is gone\n",
            file, bytes, pid);
}

/* pool.h. (pool_create: another process may have created the pool
 * meanwhile: its pool is never replaced.) */
int pool_publish_no_replace(const char *tmp, const char *path)
{
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return errno;
    /* A file system without RENAME_NOREPLACE: a hard link fails on an
     * existing name too. */
    if (link(tmp, path) != 0)
        return errno;
    unlink(tmp);
    return 0;
}

static int validate(pool *p, const char *path, size_t file_size);

int pool_create(const char *path, const pool_create_params *pp)
{
    if (access(path, F_OK) == 0)
        return mango_error(MANGO_EEXIST, "pool %s already exists", path);
    /* A pool so named is another pool's file: the open or creation of the
     * pool named by the rest of the path removes it (mango copy refuses such
     * a DEST for the same reason). */
    const char *owned = pool_owned_name_pattern(path);
    if (owned)
        return mango_error(MANGO_EINVAL, "%s: a pool's name must not end in %s: pools use such names for their "
                           "own files (<pool>.bigbatch, <pool>.tmp.<pid>, <pool>.copying-<pid>) and remove "
                           "them when they open or are created", path, owned);
    if (pp->log_size < 64 * 1024 || pp->log_size % 4096)
        return mango_error(MANGO_EINVAL, "log size %zu: must be a multiple of 4096 and at least 64 KiB",
                           pp->log_size);
    /* Lay out the regions. Every size is bounded by the pool's before it is
     * added, so nothing wraps: a log size near 2^64 wrapped the offsets and
     * laid out a pool that never opens (and, on a disk, zero-filled the
     * file system up to ENOSPC). */
    pool_region regs[POOL_MAX_REGIONS];
    memset(regs, 0, sizeof regs);
    uint64_t off = align_up(POOL_REGIONS_OFFSET + PAGE, 65536);
    uint64_t log_offset = off;
    if (pp->n_data > POOL_MAX_REGIONS - 1)
        return mango_error(MANGO_EINVAL, "%u data regions: at most %u", pp->n_data, POOL_MAX_REGIONS - 1);
    if (pp->pool_size < off || pp->log_size > pp->pool_size - off)
        return mango_error(MANGO_EINVAL, "log size %zu does not fit in a pool of %zu bytes", pp->log_size,
                           pp->pool_size);
    off = align_up(off + pp->log_size, PAGE);
    unsigned n = 0;
    for (unsigned i = 0; i < pp->n_data; i++, n++) {
        regs[n].kind = POOL_REGION_DATA;
        regs[n].vaddr = pp->data_vaddr[i];
        regs[n].size = pp->data_size[i];
        regs[n].loader_bytes = pp->data_loader_bytes[i] <= pp->data_size[i] ? pp->data_loader_bytes[i] : 0;
        if (off > pp->pool_size || regs[n].size > pp->pool_size - off)
            break; /* (reported below) */
        regs[n].mirror_offset = off;
        off = align_up(off + regs[n].size, PAGE);
        regs[n].bitmap_offset = off;
        if (off > pp->pool_size || (regs[n].size + 7) / 8 > pp->pool_size - off)
            break;
        off = align_up(off + (regs[n].size + 7) / 8, PAGE);
    }
    if (n < pp->n_data || off > pp->pool_size || pp->pool_size - off < 16 * PAGE)
        return mango_error(MANGO_EINVAL,
                           "pool size %zu too small: log and data regions need %s%llu bytes plus a heap",
                           pp->pool_size, n < pp->n_data ? "more than " : "", (unsigned long long)off);
    regs[n].kind = POOL_REGION_HEAP;
    regs[n].vaddr = pp->heap_base;
    regs[n].mirror_offset = off;
    regs[n].size = (pp->pool_size - off) & ~(uint64_t)(PAGE - 1);
    uint64_t pool_size = off + regs[n].size;
    n++;

    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp)
        return mango_error(MANGO_EINVAL, "pool path too long");
    pool_remove_abandoned(path, ".tmp.", creation_removed);
    char dirbuf[4096]; /* (dirname may write to its argument) */
    snprintf(dirbuf, sizeof dirbuf, "%s", path);
    const char *dir = dirname(dirbuf);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return mango_error(errno == ENOENT ? MANGO_ENOENT : MANGO_EIO, "cannot create %s: %s", tmp,
                           strerror(errno));
    /* Held until the file is renamed: tells pool_remove_abandoned()
     * of other processes that this creation is alive. */
    flock(fd, LOCK_EX | LOCK_NB);
    int rc = MANGO_OK;
    /* Reserve the blocks up front on real file systems (ENOSPC now, not as a
     * SIGBUS later); on tmpfs stay sparse so unused heap costs no memory. */
    struct statfs sfs;
    bool tmpfs = fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
    int err = tmpfs || pp->sparse ? EOPNOTSUPP : posix_fallocate(fd, 0, (off_t)pool_size);
    if (err == EOPNOTSUPP || err == EINVAL)
        err = ftruncate(fd, (off_t)pool_size) ? errno : 0;
    if (err) {
        rc = mango_error(MANGO_EIO, "cannot size pool %s to %llu bytes: %s", tmp,
                         (unsigned long long)pool_size, strerror(err));
        goto fail;
    }
    /* fallocate leaves "unwritten" extents: the first write to each block
     * converts it, a metadata change that turns a commit's sync into a
     * journal commit. Write the log ring once now, so commits only ever
     * overwrite written blocks (fs mode: one data write and one cache flush). */
    if (!tmpfs && !pp->sparse && (rc = zero_fill(fd, log_offset, pp->log_size, tmp)) != MANGO_OK)
        goto fail;
    char *base = mmap(NULL, pool_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = mango_error(MANGO_EIO, "cannot map %s: %s", tmp, strerror(errno));
        goto fail;
    }
    memcpy(base + POOL_REGIONS_OFFSET, regs, sizeof(pool_region) * n);
    pool_head_slot *slots = (pool_head_slot *)(base + POOL_HEAD_OFFSET);
    memset(slots, 0, 2 * sizeof *slots);
    slots[0].advance = 1;
    slots[0].next_seq = 1;
    slots[0].clean = 1;
    slots[0].crc = slot_crc(&slots[0]);
    slots[1] = slots[0];
    slots[1].advance = 0;
    slots[1].crc = slot_crc(&slots[1]);

    pool_header *h = (pool_header *)base;
    memset(h, 0, sizeof *h);
    memcpy(h->magic, POOL_MAGIC, 8);
    h->version = POOL_FORMAT_VERSION;
    h->header_size = sizeof *h;
    h->pool_size = pool_size;
    /* The mode it was made for; AUTO (0) records what AUTO picks for this file. */
    h->created_mode = pp->mode ? pp->mode : pool_detect_mode(fd, pool_size);
    h->region_count = n;
    h->log_offset = log_offset;
    h->log_size = pp->log_size;
    h->heap_base = pp->heap_base;
    h->heap_capacity = regs[n - 1].size;
    h->create_time = (uint64_t)time(NULL);
    h->fingerprint = pp->fingerprint;
    h->region_table_crc = crc32c(0, regs, sizeof(pool_region) * n);
    snprintf(h->fingerprint_text, sizeof h->fingerprint_text, "%s", pp->fingerprint_text);
    h->header_crc = header_crc(h);
    /* What is published must open: run the opener's checks on the new
     * header and tables (a layout a future change gets wrong fails here,
     * not at the next start). */
    pool check = {.base = base, .size = pool_size, .fd = -1};
    if (validate(&check, tmp, pool_size) != MANGO_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mango_last_error());
        rc = mango_error(MANGO_EINVAL, "cannot create pool %s: the new pool would not open: %s", path, why);
        munmap(base, pool_size);
        goto fail;
    }
    if (pp->fill && (rc = pp->fill(pp->fill_arg, base, fd, regs, n)) != MANGO_OK) {
        munmap(base, pool_size);
        goto fail;
    }

    int e = persist_sync_new_file(base, pool_size, fd, "pool.create_sync");
    if (e != 0) {
        rc = mango_error(MANGO_EIO, "cannot sync new pool %s: %s", tmp, strerror(-e));
        munmap(base, pool_size);
        goto fail;
    }
    munmap(base, pool_size);
    int pe = pool_publish_no_replace(tmp, path);
    if (pe == EEXIST) {
        rc = mango_error(MANGO_EEXIST, "pool %s already exists (another process created it meanwhile)", path);
        goto fail;
    }
    if (pe != 0) {
        rc = mango_error(MANGO_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(pe));
        goto fail;
    }
    close(fd);
    /* Until the directory entry is durable a power failure could lose the
     * whole pool, and the next start would create a FRESH one: an error. */
    e = persist_sync_directory(dir, "pool.create_dir_sync");
    if (e != 0) {
        unlink(path);
        return mango_error(MANGO_EIO, "cannot sync the directory of new pool %s: %s", path,
                           strerror(-e));
    }
    return MANGO_OK;
fail:
    close(fd);
    unlink(tmp);
    return rc;
}

/* Validate the bytes of a mapped pool; fills p's copies. Writes nothing. */
/* [at, at + len) lies inside a file of size bytes (no overflow). */
static bool span_fits(uint64_t at, uint64_t len, uint64_t size)
{
    return at <= size && len <= size - at;
}

bool pool_slot_valid(const pool_head_slot *s)
{
    /* An unaligned head_lsn (no build writes one) would make the log scan
     * read a frame header across the ring's end, past the mapping; one
     * beyond POOL_MAX_LSN would make the tail wrap (pool_format.h). */
    return s->crc == slot_crc(s) && s->head_lsn % 64 == 0 && s->head_lsn <= POOL_MAX_LSN &&
           s->next_seq <= POOL_MAX_LSN;
}

static int validate(pool *p, const char *path, size_t file_size)
{
    if (file_size < POOL_REGIONS_OFFSET + PAGE)
        return mango_error(MANGO_EBADPOOL, "%s: not a Mangosteen pool (only %zu bytes)", path, file_size);
    const pool_header *h = (const pool_header *)p->base;
    if (memcmp(h->magic, POOL_MAGIC, 8) != 0)
        return mango_error(MANGO_EBADPOOL, "%s: not a Mangosteen pool (bad magic)", path);
    if (h->version != POOL_FORMAT_VERSION)
        return mango_error(MANGO_EBADPOOL,
                           "%s: pool format version %u%s, this build reads version %u only", path,
                           h->version,
                           h->header_crc != header_crc(h) ? " (or a corrupt header: its checksum "
                                                            "does not match either)" : "",
                           POOL_FORMAT_VERSION);
    if (h->header_size != sizeof(pool_header) || h->header_crc != header_crc(h))
        return mango_error(MANGO_EBADPOOL, "%s: pool header checksum mismatch (corrupt header)", path);
    if (h->pool_size != file_size)
        return mango_error(MANGO_EBADPOOL, "%s: file is %zu bytes but the pool is %llu (%s)",
                           path, file_size, (unsigned long long)h->pool_size,
                           file_size < h->pool_size ? "truncated?" : "grown: bytes appended?");
    if (h->region_count == 0 || h->region_count > POOL_MAX_REGIONS)
        return mango_error(MANGO_EBADPOOL, "%s: bad region count %u", path, h->region_count);
    const pool_region *regs = (const pool_region *)(p->base + POOL_REGIONS_OFFSET);
    if (crc32c(0, regs, sizeof(pool_region) * h->region_count) != h->region_table_crc)
        return mango_error(MANGO_EBADPOOL, "%s: region table checksum mismatch", path);
    /* The checksums only say the fields are as written: a field no build
     * writes (a crafted or a buggy pool) must still give an error, not a
     * division by zero or a mapping over the metadata. */
    if (h->log_offset % PAGE || h->log_size % 4096 || h->log_size < 64 * 1024 ||
        !span_fits(h->log_offset, h->log_size, file_size))
        return mango_error(MANGO_EBADPOOL, "%s: log outside the pool (offset %llu, %llu bytes)", path,
                           (unsigned long long)h->log_offset, (unsigned long long)h->log_size);
    uint64_t span_at[1 + 2 * POOL_MAX_REGIONS], span_len[1 + 2 * POOL_MAX_REGIONS];
    unsigned spans = 0, heaps = 0;
    span_at[spans] = h->log_offset;
    span_len[spans++] = h->log_size;
    for (unsigned i = 0; i < h->region_count; i++) {
        const pool_region *r = &regs[i];
        bool heap = r->kind == POOL_REGION_HEAP;
        uint64_t bitmap_bytes = (r->size >> 3) + ((r->size & 7) != 0);
        if ((!heap && r->kind != POOL_REGION_DATA) || r->size == 0 || !span_fits(r->mirror_offset, r->size, file_size) ||
            r->vaddr % 32 || r->size % 32 || r->vaddr + r->size < r->vaddr ||
            (!heap && (!span_fits(r->bitmap_offset, bitmap_bytes, file_size) || r->bitmap_offset % 8)) ||
            (heap && (r->vaddr != h->heap_base || r->size != h->heap_capacity)) ||
            r->loader_bytes > (heap ? 0 : r->size))
            return mango_error(MANGO_EBADPOOL, "%s: region %u is malformed", path, i);
        /* Recovery and `mango check` read the allocator's root from the
         * heap's mirror: a smaller heap would be read past its end (past
         * the mapping, at the file's end). */
        if (heap && (r->size < POOL_MIN_HEAP_SIZE || r->size % PAGE))
            return mango_error(MANGO_EBADPOOL, "%s: region %u, the heap, is malformed: %llu bytes (whole "
                               "pages, at least %u, expected)", path, i, (unsigned long long)r->size,
                               POOL_MIN_HEAP_SIZE);
        heaps += heap;
        span_at[spans] = r->mirror_offset;
        span_len[spans++] = r->size;
        if (!heap) {
            span_at[spans] = r->bitmap_offset;
            span_len[spans++] = bitmap_bytes;
        }
        p->regions[i] = *r;
        p->loader_end[i] = r->loader_bytes ? r->vaddr + r->loader_bytes : 0;
    }
    if (heaps != 1)
        return mango_error(MANGO_EBADPOOL, "%s: %u heap regions (one expected)", path, heaps);
    /* Recovery writes each region at its vaddr: two regions over the same
     * memory would each restore over the other (and make the data-region
     * comparison of check_expected ambiguous). */
    for (unsigned i = 0; i < h->region_count; i++)
        for (unsigned j = i + 1; j < h->region_count; j++)
            if (regs[i].vaddr < regs[j].vaddr + regs[j].size && regs[j].vaddr < regs[i].vaddr + regs[i].size)
                return mango_error(MANGO_EBADPOOL, "%s: regions %u and %u overlap in memory (%#llx+%llu, "
                                   "%#llx+%llu)", path, i, j, (unsigned long long)regs[i].vaddr,
                                   (unsigned long long)regs[i].size, (unsigned long long)regs[j].vaddr,
                                   (unsigned long long)regs[j].size);
    for (unsigned i = 0; i < spans; i++) {
        if (span_at[i] < POOL_REGIONS_OFFSET + PAGE)
            return mango_error(MANGO_EBADPOOL, "%s: the log or a region overlaps the pool's header", path);
        for (unsigned j = i + 1; j < spans; j++)
            if (span_at[i] < span_at[j] + span_len[j] && span_at[j] < span_at[i] + span_len[i])
                return mango_error(MANGO_EBADPOOL, "%s: the log and the regions overlap", path);
    }
    p->nregions = h->region_count;
    const pool_head_slot *s = (const pool_head_slot *)(p->base + POOL_HEAD_OFFSET);
    bool ok0 = pool_slot_valid(&s[0]), ok1 = pool_slot_valid(&s[1]);
    if (!ok0 && !ok1)
        return mango_error(MANGO_EBADPOOL, "%s: both log head slots are corrupt%s", path,
                           s[0].crc == slot_crc(&s[0]) || s[1].crc == slot_crc(&s[1])
                               ? " (a head_lsn that is not a multiple of 64, or a head_lsn or next_seq "
                                 "beyond 2^62, which no build writes)" : "");
    unsigned newest = (ok0 && (!ok1 || s[0].advance > s[1].advance)) ? 0 : 1;
    p->head = s[newest];
    p->head_slot = newest;
    p->slot_damaged = !(ok0 && ok1);
    p->older_head_lsn = p->slot_damaged ? s[newest].head_lsn : s[1 - newest].head_lsn;
    p->hdr = h;
    p->slots = (pool_head_slot *)(p->base + POOL_HEAD_OFFSET);
    return MANGO_OK;
}

int pool_open(pool *p, const char *path, persist_mode mode, bool writable)
{
    return pool_open_expecting(p, path, mode, writable, NULL);
}

/* Does the pool hold a data region of exactly [vaddr, vaddr + size)? */
static bool has_data_region(const pool *p, uint64_t vaddr, uint64_t size)
{
    for (unsigned i = 0; i < p->nregions; i++)
        if (p->regions[i].kind == POOL_REGION_DATA && p->regions[i].vaddr == vaddr && p->regions[i].size == size)
            return true;
    return false;
}

static int check_expected(const pool *p, const pool_expect *e)
{
    int rc = pool_check_fingerprint(p, e->fingerprint, e->fingerprint_text);
    if (rc == MANGO_OK && p->hdr->heap_base != e->heap_base)
        rc = mango_error(MANGO_ELAYOUT, "pool's durable heap is at %#llx, configuration says %#llx",
                         (unsigned long long)p->hdr->heap_base, (unsigned long long)e->heap_base);
    if (rc != MANGO_OK || e->n_data == 0)
        return rc;
    /* Same fingerprint, so same objects at the same addresses; the data
     * regions must match too (pool.h: the fingerprint does not cover their
     * sizes). Regions do not overlap (validate), so equal counts and every
     * expected region present means equal sets. */
    unsigned n = 0;
    for (unsigned i = 0; i < p->nregions; i++)
        n += p->regions[i].kind == POOL_REGION_DATA;
    bool same = n == e->n_data;
    for (unsigned i = 0; same && i < e->n_data; i++)
        same = has_data_region(p, e->data_vaddr[i], e->data_size[i]);
    if (same)
        return MANGO_OK;
    char pool_txt[512] = "", proc_txt[512] = "";
    size_t a = 0, b = 0;
    for (unsigned i = 0; i < p->nregions && a < sizeof pool_txt; i++)
        if (p->regions[i].kind == POOL_REGION_DATA)
            a += (size_t)snprintf(pool_txt + a, sizeof pool_txt - a, " %#llx+%llu",
                                  (unsigned long long)p->regions[i].vaddr, (unsigned long long)p->regions[i].size);
    for (unsigned i = 0; i < e->n_data && b < sizeof proc_txt; i++)
        b += (size_t)snprintf(proc_txt + b, sizeof proc_txt - b, " %#llx+%llu",
                              (unsigned long long)e->data_vaddr[i], (unsigned long long)e->data_size[i]);
    return mango_error(MANGO_ELAYOUT,
                       "pool was written by a process with a different layout: its executable's data "
                       "regions (.data/.bss) differ although the fingerprint matches (a program rebuilt "
                       "at the same path without a GNU build-id?); the pool is left unchanged.\n"
                       "  pool:   %u data region%s%s\n  process: %u data region%s%s",
                       n, n == 1 ? "" : "s", pool_txt, e->n_data, e->n_data == 1 ? "" : "s", proc_txt);
}

const char *pool_file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : "not a regular file";
}

int pool_open_expecting(pool *p, const char *path, persist_mode mode, bool writable, const pool_expect *expect)
{
    memset(p, 0, sizeof *p);
    p->fd = -1;
    /* O_NONBLOCK: an open of a FIFO would wait for a writer forever (mango
     * check of a FIFO hung); only regular files are pools. (The flag does
     * nothing to a regular file's reads and writes.) */
    struct stat st;
    /* Looked at before the open too: opening a device can act on it (a
     * watchdog starts counting; a tape rewinds), and a socket fails the open
     * itself (ENXIO) before fstat below could say what it is. (fstat after
     * the open still decides: the name may change in between.) */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return mango_error(MANGO_EINVAL, "%s is not a pool file: it is %s", path, pool_file_kind(st.st_mode));
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == EISDIR)
        return mango_error(MANGO_EINVAL, "%s is not a pool file: it is a directory", path);
    if (fd < 0 && errno == ENXIO && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return mango_error(MANGO_EINVAL, "%s is not a pool file: it is %s", path, pool_file_kind(st.st_mode));
    if (fd < 0 && errno != ENXIO)
        return mango_error(errno == ENOENT ? MANGO_ENOENT : MANGO_EIO, "cannot open pool %s: %s",
                           path, strerror(errno));
    if (fd < 0)
        return mango_error(MANGO_EIO, "cannot open pool %s: %s", path, strerror(ENXIO));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mango_error(MANGO_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mango_error(MANGO_EINVAL, "%s is not a pool file: it is %s", path, pool_file_kind(st.st_mode));
    }
    if (flock(fd, (writable ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK)
            return mango_error(MANGO_EBUSY, "pool %s is in use by another process", path);
        return mango_error(MANGO_EIO, "cannot lock pool %s: %s", path, strerror(e));
    }
    /* The big-batch file's name is absolute: a relative pool path would name
     * another file once the process changes directory (Redis's CONFIG SET
     * dir), and recovery would not find an acknowledged big batch. */
    char *abs = realpath(path, NULL);
    int n = abs ? snprintf(p->big_batch_path, sizeof p->big_batch_path, "%s.bigbatch", abs) : -1;
    free(abs);
    if (n < 0 || (size_t)n >= sizeof p->big_batch_path) {
        close(fd);
        return mango_error(MANGO_EINVAL, "%s: cannot resolve the pool's absolute path (%s)", path,
                           n < 0 ? strerror(errno) : "too long");
    }
    size_t size = (size_t)st.st_size;
    if (size < POOL_REGIONS_OFFSET + PAGE) {
        close(fd);
        return mango_error(MANGO_EBADPOOL, "%s: not a Mangosteen pool (only %zu bytes)", path, size);
    }
    /* Validate through a read-only mapping: a bad pool is never written. */
    p->base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p->base == MAP_FAILED) {
        close(fd);
        return mango_error(MANGO_EIO, "cannot map %s: %s", path, strerror(errno));
    }
    p->size = size;
    int rc = validate(p, path, size);
    if (rc == MANGO_OK && expect)
        rc = check_expected(p, expect);
    if (rc != MANGO_OK || !writable) {
        if (rc != MANGO_OK) {
            munmap(p->base, size);
            close(fd);
            return rc;
        }
        p->fd = fd;
        p->pd = (persist_domain){.mode = PERSIST_NONE, .base = p->base, .len = size, .fd = fd};
        return MANGO_OK;
    }
    uint64_t log_offset = p->hdr->log_offset, log_size = p->hdr->log_size;
    munmap(p->base, size);
    if (mode == 0)
        mode = pool_detect_mode(fd, size);
    struct statfs sfs;
    bool tmpfs = fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
    if (mode != PERSIST_SIM && !tmpfs &&
        (rc = give_sparse_pool_its_blocks(fd, path, size, log_offset, log_size)) != MANGO_OK) {
        close(fd);
        return rc;
    }
    if (mode != PERSIST_SIM && tmpfs)
        warn_if_tmpfs_is_short(fd, &sfs, path);
    int flags = MAP_SHARED;
    if (mode == PERSIST_SIM)
        flags = MAP_PRIVATE;
    if (mode == PERSIST_PMEM)
        flags = MAP_SHARED_VALIDATE | MAP_SYNC;
    p->base = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p->base == MAP_FAILED) {
        int e = errno;
        close(fd);
        if (mode == PERSIST_PMEM && (e == EOPNOTSUPP || e == EINVAL))
            return mango_error(MANGO_EINVAL,
                               "pmem mode needs a DAX file system (MAP_SYNC not supported for %s); "
                               "use mode fs or emulated", path);
        return mango_error(MANGO_EIO, "cannot map %s: %s", path, strerror(e));
    }
    rc = validate(p, path, size); /* the same bytes; re-point the pointers */
    if (rc != MANGO_OK) {
        munmap(p->base, size);
        close(fd);
        return rc;
    }
    p->fd = fd;
    p->writable = true;
    p->pd = (persist_domain){.mode = mode, .base = p->base, .len = size, .fd = fd};
    persist_register_domain(&p->pd);
    return MANGO_OK;
}

void pool_close(pool *p)
{
    if (p->writable) {
        persist_unregister_domain(&p->pd);
        persist_domain_release(&p->pd);
    }
    if (p->base && p->base != MAP_FAILED)
        munmap(p->base, p->size);
    if (p->fd >= 0)
        close(p->fd); /* releases the flock */
    p->base = NULL;
    p->fd = -1;
}

void pool_forget_in_child(pool *p)
{
    if (p->base && p->base != MAP_FAILED)
        munmap(p->base, p->size); /* the log's write-through pages lie inside it too */
    if (p->writable && p->pd.wt_hi) /* (wt_fd is set only with a write-through range) */
        close(p->pd.wt_fd);
    if (p->fd >= 0)
        close(p->fd);
    p->base = NULL;
    p->fd = -1;
}

int pool_check_fingerprint(const pool *p, uint64_t fingerprint, const char *text)
{
    if (p->hdr->fingerprint == fingerprint)
        return MANGO_OK;
    /* The pool's text is the file's: its control characters (a carriage
     * return, an escape sequence in a crafted header) are shown as '?', not
     * sent to the terminal. */
    char shown[601];
    size_t n = strnlen(p->hdr->fingerprint_text, sizeof shown - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p->hdr->fingerprint_text[i];
        shown[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    shown[n] = 0;
    return mango_error(MANGO_ELAYOUT,
                       "pool was written by a process with a different layout (fingerprint %016llx, "
                       "this process %016llx); the pool is left unchanged.\n  pool:    %s\n  "
                       "process: %.600s",
                       (unsigned long long)p->hdr->fingerprint, (unsigned long long)fingerprint, shown, text);
}

int pool_write_head(pool *p, uint64_t head_lsn, uint64_t next_seq, uint64_t generation, bool clean)
{
    unsigned target = 1 - p->head_slot;
    pool_head_slot s;
    memset(&s, 0, sizeof s);
    s.advance = p->head.advance + 1;
    s.head_lsn = head_lsn;
    s.next_seq = next_seq;
    s.generation = generation;
    s.clean = clean ? 1 : 0;
    s.crc = slot_crc(&s);
    memcpy(&p->slots[target], &s, sizeof s);
    persist_note_store(&p->slots[target], sizeof s, "head.write");
    persist_ranges r = {0};
    persist_flush(&p->pd, &r, &p->slots[target], sizeof s, "head.flush");
    int rc = persist_sync(&p->pd, &r, "head.sync");
    if (rc != 0)
        return mango_error(MANGO_EIO, "sync of the log head failed: %s", strerror(-rc));
    p->older_head_lsn = p->head.head_lsn;
    p->head = s;
    p->head_slot = target;
    return MANGO_OK;
}

const pool_region *pool_find_region(const pool *p, unsigned kind)
{
    for (unsigned i = 0; i < p->nregions; i++)
        if (p->regions[i].kind == kind)
            return &p->regions[i];
    return NULL;
}

/* No data region's bitmap may mark a byte below its loader_end (pool.h):
 * restoring it would write the mirror's byte over the dynamic loader's (a
 * lazily bound function's address), and the process would crash or hang at
 * its next call through it, after recovery had written the pool. The bitmap
 * has no checksum of its own: one flipped bit did it (a fuzzing review,
 * session 40). Recovery checks it before it writes anything, and so does
 * `mango check`. */
int pool_check_loader_bits(const pool *p)
{
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        if (r->kind != POOL_REGION_DATA || p->loader_end[i] <= r->vaddr)
            continue;
        uint64_t n = p->loader_end[i] - r->vaddr < r->size ? p->loader_end[i] - r->vaddr : r->size;
        const unsigned char *bits = (const unsigned char *)p->base + r->bitmap_offset;
        for (uint64_t b = 0; b < n; b++)
            if (bits[b / 8] & (1u << (b % 8)))
                return mango_error(MANGO_EBADPOOL,
                                   "the pool marks byte %#llx of the executable's data segment as written by "
                                   "the program, but it is the dynamic loader's (below %#llx: the lazy-binding "
                                   "table, relocated data); the pool's bitmap is damaged; refusing to recover, "
                                   "the pool is unchanged",
                                   (unsigned long long)(r->vaddr + b), (unsigned long long)p->loader_end[i]);
    }
    return MANGO_OK;
}
