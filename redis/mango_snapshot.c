/* mango_snapshot.c -- MANGOSNAPSHOT path: a backup of a running durable
 * Redis as a pool (durable Redis; docs/redis.md, "Backups").
 *
 * Compiled into redis-server next to mango_adapter.c.
 *
 * The command only asks: a snapshot must start between batches, and the
 * event loop may hold one open while its command runs. mangoCommit(), at the
 * end of the pass, once the pass's batch is submitted, starts it
 * (mango_snapshot_start: the write side is held while every batch so far
 * becomes durable and a writer process is forked, a few ms to some tens),
 * and each later pass polls it without blocking until the writer reports.
 * The outcome is logged and shown by INFO mangosteen (mango_snapshot_*). A
 * server that exits meanwhile stops the writer, which leaves nothing.
 *
 * The snapshot is a pool of its own: started with --mango-pool on it (the
 * same binary), the server recovers the dataset as it was at that point in
 * milliseconds, where an RDB file from BGSAVE is imported into a new pool
 * (seconds per million keys).
 */
#include "server.h" /* (first: its feature macros) */
#include "mango_adapter.h"
#include "mango.h"

#include <sys/stat.h>

static sds pending;               /* asked for, not started yet */
static mango_snapshot_job *job;   /* running */
static sds running;               /* its path */
static mstime_t started_ms;

static struct {
    const char *status; /* "none", "ok", "err" */
    sds path, error;
    mango_snapshot_info info;
    long long ended; /* unix time */
} last = {.status = "none"};

/* Is dir in the server's working directory (`dir`, where SAVE writes: Redis
 * chdirs there), or in a folder under it? Any client allowed MANGOSNAPSHOT
 * may write a snapshot there, as BGSAVE may; a file anywhere else takes
 * what moving `dir` takes, enable-protected-configs (noted by reviews,
 * sessions 36-37: the command could create a file at any path the server
 * may write). Both sides are resolved, so a symlinked folder counts where
 * it leads. (Until session 40 only `dir` itself was accepted, and a
 * subfolder was refused as "not in" it: found by a review.) */
static int in_working_directory(const char *dir, char here[PATH_MAX])
{
    char there[PATH_MAX];
    if (!realpath(".", here)) {
        snprintf(here, PATH_MAX, "(the working directory: %s)", strerror(errno));
        return 0;
    }
    if (!realpath(dir, there)) return 0;
    size_t n = strlen(here);
    if (n == 1) return 1; /* "/": everything is under it */
    return strncmp(here, there, n) == 0 && (there[n] == 0 || there[n] == '/');
}

void mangoSnapshotCommand(client *c)
{
    if (!mangoEnabled()) {
        addReplyError(c, "MANGOSNAPSHOT needs a Mangosteen pool (start with --mango-pool)");
        return;
    }
    if (pending || job) {
        addReplyErrorFormat(c, "a pool snapshot is already %s (to %s)", job ? "in progress" : "scheduled",
                            job ? running : pending);
        return;
    }
    const char *path = c->argv[1]->ptr;
    struct stat st;
    if (!*path || strchr(path, '\r') || strchr(path, '\n')) {
        addReplyError(c, "MANGOSNAPSHOT needs a file path");
        return;
    }
    if (lstat(path, &st) == 0) {
        addReplyErrorFormat(c, "%s exists: a pool snapshot never replaces a file", path);
        return;
    }
    if (mango_snapshot_check_path(path) != MANGO_OK) { /* one of the pool's own names */
        addReplyErrorFormat(c, "%s", mango_last_error());
        return;
    }
    /* Its folder, now, rather than from the writer later (INFO, the log). */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
    if (access(slash ? dir : ".", W_OK | X_OK) != 0) {
        addReplyErrorFormat(c, "cannot write a pool snapshot in %s: %s", slash ? dir : ".", strerror(errno));
        return;
    }
    char here[PATH_MAX];
    if (!in_working_directory(slash ? dir : ".", here) &&
        !allowProtectedAction(server.enable_protected_configs, c)) {
        addReplyErrorFormat(c, "MANGOSNAPSHOT writes outside the working directory (dir) only with "
                            "enable-protected-configs yes (or local, from a local connection), as moving dir "
                            "does: %s is not in %s or a folder under it", path, here);
        return;
    }
    pending = sdsnew(path);
    addReplyStatus(c, "Background pool snapshot scheduled");
}

static void finished(int rc, const char *path, const char *error)
{
    last.status = rc == MANGO_OK ? "ok" : "err";
    sdsfree(last.path);
    last.path = sdsnew(path);
    sdsfree(last.error);
    last.error = rc == MANGO_OK ? NULL : sdsmapchars(sdsnew(error), "\r\n", "  ", 2);
    last.ended = (long long)time(NULL);
}

/* The last snapshot's pace, for the log. */
static const char *pace_text(void)
{
    static char text[96];
    if (last.info.mbps > 0)
        snprintf(text, sizeof text, "at %.0f MB/s", last.info.mbps);
    else if (last.info.share < 100)
        snprintf(text, sizeof text, "the disk busy %u %% of the time at most", last.info.share);
    else if (!last.info.shares_disk)
        snprintf(text, sizeof text, "not paced: the pool's log syncs go to no disk it uses");
    else
        snprintf(text, sizeof text, "not paced");
    return text;
}

void mangoSnapshotStep(void)
{
    if (job) {
        int rc = mango_snapshot_poll(job, false, &last.info);
        if (rc != MANGO_EAGAIN) {
            job = NULL;
            finished(rc, running, mango_last_error());
            if (rc == MANGO_OK)
                serverLog(LL_NOTICE, "Mangosteen: pool snapshot %s done: %llu heap bytes, %.2f s (write side "
                          "held %.1f ms; paced %.2f s of it, %s)", running,
                          (unsigned long long)last.info.heap_bytes, last.info.seconds,
                          last.info.pause_seconds * 1e3, last.info.paced_seconds, pace_text());
            else
                serverLog(LL_WARNING, "Mangosteen: pool snapshot %s failed: %s", running, last.error);
            sdsfree(running);
            running = NULL;
        }
    }
    if (pending && !mango_batch_open()) {
        mango_snapshot_job *j;
        int rc = mango_snapshot_start(pending, &j);
        if (rc != MANGO_OK) {
            memset(&last.info, 0, sizeof last.info);
            finished(rc, pending, mango_last_error());
            serverLog(LL_WARNING, "Mangosteen: pool snapshot %s not started: %s", pending, last.error);
            sdsfree(pending);
        } else {
            job = j;
            running = pending;
            started_ms = mstime();
            serverLog(LL_NOTICE, "Mangosteen: pool snapshot %s started", running);
        }
        pending = NULL;
    }
}

void mangoSnapshotCancel(void)
{
    if (!job)
        return;
    mango_snapshot_cancel(job);
    job = NULL;
    serverLog(LL_WARNING, "Mangosteen: pool snapshot %s stopped: the server is exiting; nothing was left there",
              running);
}

sds mangoSnapshotInfo(sds info)
{
    info = sdscatprintf(info,
                        "mango_snapshot_in_progress:%d\r\n"
                        "mango_snapshot_current_seconds:%lld\r\n"
                        "mango_snapshot_last_status:%s\r\n"
                        "mango_snapshot_last_path:%s\r\n"
                        "mango_snapshot_last_time:%lld\r\n"
                        "mango_snapshot_last_seconds:%.3f\r\n"
                        "mango_snapshot_last_pause_ms:%.3f\r\n"
                        "mango_snapshot_last_heap_bytes:%llu\r\n"
                        "mango_snapshot_last_share:%u\r\n"
                        "mango_snapshot_last_mbps:%.0f\r\n"
                        "mango_snapshot_last_paced_seconds:%.3f\r\n"
                        "mango_snapshot_last_shares_disk:%d\r\n",
                        job || pending ? 1 : 0, job ? (long long)((mstime() - started_ms) / 1000) : -1LL,
                        last.status, last.path ? last.path : "", last.ended, last.info.seconds,
                        last.info.pause_seconds * 1e3, (unsigned long long)last.info.heap_bytes,
                        last.info.share, last.info.mbps, last.info.paced_seconds, last.info.shares_disk ? 1 : 0);
    if (last.error)
        info = sdscatprintf(info, "mango_snapshot_last_error:%s\r\n", last.error);
    return info;
}
