/* mango_copy.c -- `mango copy POOL DEST`: a backup of a pool no process has
 * open.
 *
 * The source is opened as `mango check` opens it (validated, read-only, a
 * shared flock held to the end: a running process holds the pool
 * exclusively, so it is refused, and no process can open it while it is
 * copied). The copy is sparse (only the source's data extents, and of them
 * only chunks that are not all zeros, are written), synced, checked like
 * `mango check` (with its big-batch file, if the source has one), and only
 * then moved to DEST (and DEST.bigbatch) without replacing anything there. A
 * failure leaves nothing behind.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"
#include "mango_cli.h"
#include "persist/persist.h"
#include "pool/pool.h"
#include "runtime/error.h"

const char *copy_usage =
    "NAME\n"
    "    mango copy - copy a Mangosteen pool that no process has open\n"
    "\n"
    "SYNOPSIS\n"
    "    mango copy [--quiet] [--no-check] POOL DEST\n"
    "\n"
    "DESCRIPTION\n"
    "    Makes DEST a copy of POOL, for a backup or to move a pool: with\n"
    "    POOL.bigbatch as DEST.bigbatch when there is one (a batch too large for\n"
    "    the log keeps its entries there until the mirror has them). A pool left\n"
    "    by a crash copies as well as a cleanly closed one: the copy recovers\n"
    "    exactly as the original would, by the same binary.\n"
    "\n"
    "    POOL is validated and held with a shared lock while it is copied, so a\n"
    "    pool that a running process has open is refused (stop the process, or\n"
    "    have the application write a snapshot: mango_snapshot() in mango.h writes\n"
    "    a running process's state as a new pool; durable Redis: MANGOSNAPSHOT\n"
    "    PATH, BGSAVE writing an RDB file), and no process can open it until the\n"
    "    copy is done. A plain cp of a pool in use\n"
    "    can capture a state that never existed.\n"
    "\n"
    "    The copy is sparse (holes and all-zero chunks are not written; DEST has\n"
    "    POOL's size and permissions), synced to disk, and checked the way\n"
    "    `mango check` checks a pool before it gets its name. The first process\n"
    "    that opens the copy for writing (outside tmpfs) reserves its blocks and\n"
    "    writes the holes of its log ring, so it needs POOL's full size free on\n"
    "    disk then, and is refused, unchanged, without it. DEST and\n"
    "    DEST.bigbatch must not exist: nothing is ever replaced. DEST must not\n"
    "    end in .bigbatch, .tmp.<digits> or .copying-<digits>: a pool removes\n"
    "    files so named beside it (its big-batch file, abandoned temporary\n"
    "    files) when it opens or is created. On any failure nothing is left at\n"
    "    DEST. Progress goes to stderr when it is a terminal.\n"
    "\n"
    "OPTIONS\n"
    "    -q, --quiet     print nothing on success (errors still)\n"
    "    -n, --no-check  do not check the copy (faster for large pools; the\n"
    "                    source is still validated as it is opened)\n"
    "    -h, --help      print this text and exit\n"
    "\n"
    "EXIT STATUS\n"
    "    0  DEST is a usable copy of POOL\n"
    "    1  POOL is bad (its copy does not check): nothing was left at DEST\n"
    "    2  usage error; POOL missing or in use; DEST exists; an I/O error\n";

#define CHUNK (1u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct copy_job {
    const char *what;   /* for messages */
    bool progress;      /* to stderr, once a second */
    uint64_t written;   /* bytes written (not holes) */
    uint64_t scanned;   /* bytes of data extents read */
    double last_report;
    bool read_failed;   /* the error was the source's (else the copy's) */
} copy_job;

/* Copy the file open at in (size bytes, mode) to a new file path, sparse,
 * synced. 0, or an errno (path removed; j->read_failed says which side). */
static int copy_sparse(int in, uint64_t size, mode_t mode, const char *path, copy_job *j)
{
    int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0)
        return errno;
    int e = 0;
    char *buf = malloc(CHUNK);
    if (!buf || fchmod(out, mode & 07777) != 0 || ftruncate(out, (off_t)size) != 0) /* (not the umask's) */
        e = buf ? errno : ENOMEM;
    for (uint64_t off = 0; !e && off < size;) {
        off_t data = lseek(in, (off_t)off, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO)
                break; /* only a hole is left */
            if (errno != EINVAL) {
                e = errno;
                j->read_failed = true;
                break;
            }
            data = (off_t)off; /* no SEEK_DATA here: read it all */
        }
        off_t hole = lseek(in, data, SEEK_HOLE);
        uint64_t end = hole < 0 ? size : (uint64_t)hole;
        for (uint64_t at = (uint64_t)data; !e && at < end;) {
            size_t n = end - at < CHUNK ? (size_t)(end - at) : CHUNK;
            ssize_t r = pread(in, buf, n, (off_t)at);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                e = r < 0 ? errno : EIO; /* the file shrank under the lock: not a pool process */
                j->read_failed = true;
                break;
            }
            if (!pool_bytes_zero(buf, (size_t)r)) {
                for (ssize_t done = 0; done < r;) {
                    ssize_t w = pwrite(out, buf + done, (size_t)(r - done), (off_t)(at + (uint64_t)done));
                    if (w < 0) {
                        if (errno == EINTR)
                            continue;
                        e = errno;
                        break;
                    }
                    done += w;
                }
                j->written += (uint64_t)r;
            }
            at += (uint64_t)r;
            j->scanned += (uint64_t)r;
            double t = now_s();
            if (j->progress && t - j->last_report >= 1.0) {
                char a[32], b[32];
                fprintf(stderr, "\rmango copy: %s: %s read, %s written ", j->what, human(j->scanned, a, sizeof a),
                        human(j->written, b, sizeof b));
                j->last_report = t;
            }
        }
        off = end;
    }
    free(buf);
    if (!e)
        e = -persist_sync_new_file(NULL, 0, out, "copy.sync");
    if (close(out) != 0 && !e)
        e = errno;
    if (e)
        unlink(path);
    return e;
}

/* Sync the directory holding path, so that renames into it are durable. */
static int sync_dir_of(const char *path)
{
    char d[4200];
    snprintf(d, sizeof d, "%s", path); /* (dirname may write to its argument) */
    return -persist_sync_directory(dirname(d), "copy.dir_sync");
}

/* 0 if path does not exist, else a message's errno (EEXIST: it exists). */
static int existence(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0)
        return EEXIST;
    return errno == ENOENT ? 0 : errno;
}

/* Temporary files of this copy, removed if a signal stops it. */
static char tmp[4200], tmp_big[4200];

static void on_signal(int sig)
{
    unlink(tmp); /* async-signal-safe */
    unlink(tmp_big);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void copy_removed(const char *file, long pid, long long bytes)
{
    (void)bytes;
    fprintf(stderr, "mango copy: removed %s, left by a copy whose process %ld is gone\n", file, pid);
}

int cmd_copy(int argc, char **argv)
{
    bool quiet = false, no_check = false;
    optind = parse_flags(argc, argv, "copy", copy_usage, "no-check", &quiet, &no_check);
    bool check = !no_check;
    if (argc - optind != 2)
        usage_error("copy", argc - optind < 2 ? "missing %s" : "unexpected argument '%s'",
                    argc - optind == 0 ? "POOL and DEST" : argc - optind == 1 ? "DEST" : argv[optind + 2]);
    const char *src = argv[optind], *dst = argv[optind + 1];
    if (!*src || !*dst) /* ('' as DEST copied the whole pool, then failed to rename it) */
        usage_error("copy", "%s is empty", !*src ? "POOL" : "DEST");
    char dst_big[4200];
    if (snprintf(dst_big, sizeof dst_big, "%s.bigbatch", dst) >= (int)sizeof dst_big ||
        snprintf(tmp, sizeof tmp, "%s.copying-%d", dst, (int)getpid()) >= (int)sizeof tmp ||
        snprintf(tmp_big, sizeof tmp_big, "%s.bigbatch", tmp) >= (int)sizeof tmp_big)
        usage_error("copy", "DEST is too long");
    /* A name a pool gives its own files is removed by that pool's next open
     * (or its creation, or a copy): a backup made there would be destroyed
     * (found by a review, session 37; mango_snapshot refuses them too). */
    const char *owned = pool_owned_name_pattern(dst);
    if (owned) {
        fprintf(stderr, "mango copy: %s: DEST must not end in %s: pools use such names for their own "
                        "files (<pool>.bigbatch, <pool>.tmp.<pid>, <pool>.copying-<pid>) and remove them "
                        "when they open or are created; choose another DEST\n", dst, owned);
        return EXIT_USAGE;
    }
    const char *names[] = {dst, dst_big};
    for (int i = 0; i < 2; i++) {
        int e = existence(names[i]);
        if (e == EEXIST) {
            fprintf(stderr, "mango copy: %s exists: nothing is replaced (remove it first, or choose another "
                            "DEST)%s\n", names[i],
                    i == 1 && existence(dst) == 0 ? "; a copy stopped between its two files leaves only this one" : "");
            return EXIT_USAGE;
        }
        if (e) {
            fprintf(stderr, "mango copy: %s: %s\n", names[i], strerror(e));
            return EXIT_USAGE;
        }
    }
    pool_remove_abandoned(dst, ".copying-", copy_removed); /* DEST.copying-PID[.bigbatch] */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    pool p;
    int rc = pool_open(&p, src, 0, false);
    if (rc != MANGO_OK) {
        fprintf(stderr, "mango copy: %s%s\n", mango_last_error(),
                rc == MANGO_EBUSY ? "; stop that process first, or have the application write a snapshot "
                                    "(mango_snapshot(); durable Redis: MANGOSNAPSHOT PATH)" : "");
        return exit_code_for(rc);
    }
    struct stat st;
    if (fstat(p.fd, &st) != 0) {
        fprintf(stderr, "mango copy: cannot stat %s: %s\n", src, strerror(errno));
        pool_close(&p);
        return EXIT_USAGE;
    }
    double t0 = now_s();
    copy_job j = {.what = src, .progress = !quiet && isatty(2), .last_report = t0};
    int e = copy_sparse(p.fd, (uint64_t)st.st_size, st.st_mode, tmp, &j);
    if (e) {
        fprintf(stderr, "%smango copy: cannot %s %s: %s\n", j.progress ? "\n" : "", j.read_failed ? "read" : "write",
                j.read_failed ? src : tmp, strerror(e));
        pool_close(&p);
        return EXIT_USAGE;
    }
    bool big = false;
    int bfd = open(p.big_batch_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* (a FIFO: no hang) */
    if (bfd >= 0) {
        struct stat bst;
        e = fstat(bfd, &bst) != 0 ? errno : !S_ISREG(bst.st_mode) ? EINVAL : 0;
        j.read_failed = e != 0;
        j.what = p.big_batch_path;
        if (!e)
            e = copy_sparse(bfd, (uint64_t)bst.st_size, bst.st_mode, tmp_big, &j);
        close(bfd);
        big = e == 0;
    } else if (errno != ENOENT) {
        e = errno;
        j.read_failed = true; /* (the source's file: DEST's was never opened) */
    }
    if (e == EINVAL && j.read_failed) { /* (fstat above: not a regular file) */
        struct stat bst;
        fprintf(stderr, "%smango copy: %s is not a regular file (%s): a pool's big-batch file is one; move it "
                        "away if the pool does not need it (mango check says whether the log names it)\n",
                j.progress ? "\n" : "", p.big_batch_path,
                stat(p.big_batch_path, &bst) != 0 ? "gone" : pool_file_kind(bst.st_mode));
        unlink(tmp);
        pool_close(&p);
        return EXIT_USAGE;
    }
    if (e) {
        fprintf(stderr, "%smango copy: cannot %s %s: %s\n", j.progress ? "\n" : "",
                j.read_failed ? "read" : "write", j.read_failed ? p.big_batch_path : tmp_big, strerror(e));
        unlink(tmp);
        pool_close(&p);
        return EXIT_USAGE;
    }
    if (j.progress)
        fputc('\n', stderr);
    if (check) {
        /* Its warnings (a torn tail, a damaged head slot) name DEST, where the
         * copy will be, not the temporary file, gone once the copy is done. */
        int cr = check_one_as(tmp, dst, true, true);
        if (cr != EXIT_OK) {
            fprintf(stderr, "mango copy: the copy of %s %s (above); nothing was left at %s\n", src,
                    cr == EXIT_BAD ? "does not check" : "could not be checked", dst);
            unlink(tmp);
            unlink(tmp_big);
            pool_close(&p);
            return cr;
        }
    }
    /* The big-batch file first: a DEST is never without the file it needs. */
    e = big ? pool_publish_no_replace(tmp_big, dst_big) : 0;
    if (!e) {
        e = pool_publish_no_replace(tmp, dst);
        if (e && big)
            unlink(dst_big);
    }
    const char *why = e == EEXIST ? "it appeared while copying: nothing is replaced" : e ? strerror(e) : NULL;
    int se = e ? 0 : sync_dir_of(dst);
    if (se) { /* published, but the names may not survive a power failure: take them back */
        why = strerror(se);
        unlink(dst);
        if (big)
            unlink(dst_big);
    }
    pool_close(&p);
    if (why) {
        fprintf(stderr, "mango copy: cannot %s %s: %s; nothing was left there\n", se ? "sync the directory of" : "move the copy to",
                dst, why);
        unlink(tmp);
        unlink(tmp_big);
        return EXIT_USAGE;
    }
    if (!quiet) {
        char a[32], b[32];
        printf("%s -> %s: %s pool, %s written%s in %.2f s%s\n", src, dst, human((uint64_t)st.st_size, a, sizeof a),
               human(j.written, b, sizeof b), big ? " (with its big-batch file)" : "", now_s() - t0,
               check ? "; the copy checks ok" : "");
    }
    return EXIT_OK;
}
