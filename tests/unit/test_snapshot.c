/* test_snapshot.c -- mango_snapshot, an online backup: a new pool holding
 * the durable state at one point between batches, written by a fork()
 * child while writers go on.
 *
 * The state: a .bss array of 64 pointers to heap records and a .bss count
 * `total` of commands; command t sets total = t and replaces record t % 64
 * with a new one (a, b and its padding all say t; sizes vary, the old one
 * is freed). One .bss word is written only outside batches, so recovery
 * must never restore it.
 *
 * For each mode (emulated, fs, sim):
 *   1. two threads run commands while the main thread takes a snapshot; a
 *      fresh process opens the snapshot (MANGO_CHECK_HEAP=1): it must be
 *      RECOVERED, hold a total between what was acknowledged before the
 *      call and what was run by the end, with every record consistent with
 *      that total and the outside-batch word not restored; it then runs a
 *      command on it and reopens it (a snapshot is a usable pool). The
 *      original pool recovers everything.
 *   2. errors: an existing path (left unchanged), inside a batch, in a fork()
 *      child, a writer that dies (MANGO_EIO, nothing left at the path).
 *   3. a process killed while its writer works: the writer stops (it
 *      polls for its parent), nothing is at the path, the pool restarts at
 *      once, and the next snapshot to that path succeeds with no leftover.
 *   4. a big batch (20 000 .bss blocks, through the big-batch file) just
 *      committed when the snapshot is taken: every byte it set is in it.
 * And before mango_init, and in mode none: MANGO_EINVAL. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "snapshot_files.h"
#include "kill_child.h"
#include "test_config.h"

#define NREC 64
typedef struct rec {
    uint64_t a;
    unsigned char pad[100];
    uint64_t b;
} rec;

static rec *recs[NREC];
static uint64_t total;
static uint64_t outside_batches; /* never written by a batch */
/* Command t sets seen[t % SEEN]: a byte of .bss first written by a recent
 * batch is restored only if the snapshot's bitmap names it (the bitmap
 * copied before the backend applied that batch would not). */
#define SEEN (1u << 20)
static unsigned char seen[SEEN];
/* One batch sets a byte in each of BIG_BLOCKS blocks of .bss: more than a
 * log frame holds (1 MiB log), so it goes through the big-batch file. */
#define BIG_BLOCKS 20000u
static unsigned char big_seen[BIG_BLOCKS * 32];

static void init_state(void *arg)
{
    (void)arg;
    total = 0;
    mango_capture(&total, sizeof total);
    memset(recs, 0, sizeof recs);
    mango_capture(recs, sizeof recs);
}
/* A command given this context is read-only and asks for a snapshot (and
 * a scratch range) from inside: refused, not a hang (session 37). */
static uint64_t read_only_asks;
static int read_only_snapshot_rc, read_only_scratch_rc;
static const char *read_only_snapshot_path;
static bool is_ro(void *c) { return c == &read_only_asks; }
static void bump(void *c)
{
    if (c == &read_only_asks) {
        read_only_snapshot_rc = mango_snapshot(read_only_snapshot_path, NULL);
        read_only_scratch_rc = mango_scratch(&outside_batches, sizeof outside_batches);
        return;
    }
    uint64_t t = ++total;
    mango_capture(&total, sizeof total);
    unsigned i = (unsigned)(t % NREC);
    rec *old = recs[i];
    rec *n = malloc(sizeof *n + (t % 7) * 50);
    n->a = n->b = t;
    memset(n->pad, (int)(t & 0xff), sizeof n->pad);
    mango_capture(n, sizeof *n);
    recs[i] = n;
    mango_capture(&recs[i], sizeof recs[i]);
    seen[t % SEEN] = 1;
    mango_capture(&seen[t % SEEN], 1);
    free(old);
    if (c)
        *(uint64_t *)c = t;
}

static int start(const char *pool, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

/* The records agree with total: record i holds the last t <= total with
 * t % 64 == i, or is NULL if there is none. The number of mismatches. */
static int state_mismatches(void)
{
    int bad = 0;
    for (unsigned i = 0; i < NREC; i++) {
        uint64_t t = total >= i ? total - (total - i) % NREC : 0;
        if (t == 0) {
            bad += recs[i] != NULL;
            continue;
        }
        const rec *r = recs[i];
        if (!r || r->a != t || r->b != t) {
            bad++;
            continue;
        }
        for (size_t k = 0; k < sizeof r->pad; k++)
            if (r->pad[k] != (unsigned char)(t & 0xff)) {
                bad++;
                break;
            }
    }
    for (uint64_t k = 1; k < SEEN; k++)
        bad += seen[k] != (total >= SEEN || k <= total);
    return bad;
}

/* The fresh process that opens a snapshot: exit 0 if it is sound. */
static int verify(const char *mode, const char *snap, const char *range)
{
    unsigned long long lo = 0, hi = 0, big = 0;
    if (sscanf(range, "%llu,%llu,%llu", &lo, &hi, &big) < 2)
        return 2;
    setenv("MANGO_CHECK_HEAP", "1", 1);
    int rc = start(snap, test_mode_named(mode));
    if (rc != MANGO_RECOVERED) {
        fprintf(stderr, "verify: opening %s: %d %s\n", snap, rc, mango_last_error());
        return 3;
    }
    int bad = state_mismatches();
    printf("%s: the snapshot holds total %llu (acknowledged before the call %llu, run by the end %llu), %d "
           "records wrong, outside-batch word %#llx\n", mode, (unsigned long long)total, lo, hi, bad,
           (unsigned long long)outside_batches);
    if (total < lo || total > hi || bad || outside_batches != 0)
        return 4;
    unsigned big_set = 0;
    for (unsigned k = 0; k < BIG_BLOCKS; k++)
        big_set += big_seen[k * 32 + 7] == 1;
    if (big) {
        printf("%s: the big batch's .bss bytes in the snapshot: %u of %u\n", mode, big_set, BIG_BLOCKS);
        if (big_set != BIG_BLOCKS)
            return 8;
    }
    uint64_t at = total, t = 0;
    if (mango_client_cmd(&t) != 0 || t != at + 1 || mango_shutdown() != MANGO_OK)
        return 5;
    if (start(snap, test_mode_named(mode)) != MANGO_RECOVERED || total != at + 1 || state_mismatches())
        return 6;
    return mango_shutdown() == MANGO_OK ? 0 : 7;
}

static _Atomic bool stop;
static _Atomic uint64_t acked;

static void *writer(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        uint64_t t = 0;
        if (mango_client_cmd(&t) != 0)
            return (void *)1;
        uint64_t seen = atomic_load(&acked);
        while (t > seen && !atomic_compare_exchange_weak(&acked, &seen, t))
            ;
    }
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int leftovers(const char *snap) { return snapshot_leftovers(snap, NULL, false); }

/* A TCP socket listening on 127.0.0.1:port (0: any), SO_REUSEADDR as
 * servers set it; -1 if it cannot bind. */
static int listening_socket(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static void online_snapshot(const char *self, const char *mode, const char *pool, const char *snap)
{
    unlink(pool);
    unlink(snap);
    memset(seen, 0, sizeof seen); /* an earlier mode's, in this process's .bss (no pool holds it) */
    CHECK(start(pool, test_mode_named(mode)) == MANGO_FRESH);
    outside_batches = 0xdead; /* a bitmap bit for it would restore this */
    atomic_store(&stop, false);
    atomic_store(&acked, 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, writer, NULL);
    sleep_ms(300);
    uint64_t lo = atomic_load(&acked);
    mango_snapshot_info info;
    int rc = mango_snapshot(snap, &info);
    printf("%s: snapshot: %d %s; heap %llu bytes, write side held %.3f ms, %.3f s in all\n", mode, rc,
           rc ? mango_last_error() : "", (unsigned long long)info.heap_bytes, info.pause_seconds * 1e3,
           info.seconds);
    CHECK(rc == MANGO_OK);
    CHECK(info.heap_bytes > 0 && info.pause_seconds <= info.seconds);
    sleep_ms(100); /* writers go on after it */
    atomic_store(&stop, true);
    void *res[2];
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], &res[i]);
    CHECK(res[0] == NULL && res[1] == NULL);
    uint64_t end = total;
    CHECK(end > lo);
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(leftovers(snap) == 0);
    char range[64];
    snprintf(range, sizeof range, "%llu,%llu", (unsigned long long)lo, (unsigned long long)end);
    int vr = kill_child_run(self, "verify", mode, snap, range);
    if (vr)
        fprintf(stderr, "%s: verifying the snapshot: status %d\n", mode, vr);
    CHECK(vr == 0);
    /* The pool itself is untouched by it. */
    CHECK(start(pool, test_mode_named(mode)) == MANGO_RECOVERED);
    CHECK(total == end && state_mismatches() == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    (void)self;
}

typedef struct start_args {
    const char *path;
    mango_snapshot_job *job;
    int rc;
} start_args;

static void *start_snapshot(void *arg)
{
    start_args *a = arg;
    a->rc = mango_snapshot_start(a->path, &a->job);
    return NULL;
}

static void errors(const char *mode, const char *pool, const char *snap)
{
    unlink(pool);
    unlink(snap);
    CHECK(start(pool, test_mode_named(mode)) == MANGO_FRESH);
    CHECK(mango_client_cmd(NULL) == 0);
    /* An existing path is never replaced. */
    FILE *f = fopen(snap, "w");
    CHECK(f && fputs("keep me\n", f) >= 0);
    if (f)
        fclose(f);
    CHECK(mango_snapshot(snap, NULL) == MANGO_EEXIST);
    char buf[32] = {0};
    f = fopen(snap, "r");
    CHECK(f && fgets(buf, sizeof buf, f) && strcmp(buf, "keep me\n") == 0);
    if (f)
        fclose(f);
    unlink(snap);
    /* Inside a batch: it would wait for the write side it holds. */
    CHECK(mango_batch_begin() == MANGO_OK);
    CHECK(mango_snapshot(snap, NULL) == MANGO_EINVAL);
    CHECK(mango_batch_end() == MANGO_OK);
    CHECK(!exists(snap));
    /* Inside a read-only command: the write side would wait for its own
     * read (it hung). */
    read_only_snapshot_path = snap;
    alarm(20);
    CHECK(mango_client_cmd(&read_only_asks) == 0);
    alarm(0);
    CHECK(read_only_snapshot_rc == MANGO_EINVAL && read_only_scratch_rc == MANGO_EINVAL);
    CHECK(!exists(snap));
    /* A fork() child. */
    pid_t pid = fork();
    if (pid == 0) {
        int r = mango_snapshot(snap, NULL);
        _exit(r == MANGO_EINVAL && strstr(mango_last_error(), "fork() child") ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(!exists(snap));
    /* A writer that dies before its pool is synced. */
    setenv("MANGO_TEST_SNAPSHOT", "kill", 1);
    int rc = mango_snapshot(snap, NULL);
    unsetenv("MANGO_TEST_SNAPSHOT");
    printf("%s: a writer that dies: %d %s\n", mode, rc, mango_last_error());
    CHECK(rc == MANGO_EIO && strstr(mango_last_error(), "signal 9"));
    CHECK(!exists(snap));
    CHECK(leftovers(snap) == 0);
    /* In two steps: a writer at work, then cancelled. It holds none of the
     * process's descriptors: a listening socket closed here frees its port. */
    int ls = listening_socket(0);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    CHECK(ls >= 0 && getsockname(ls, (struct sockaddr *)&sa, &sl) == 0);
    setenv("MANGO_TEST_SNAPSHOT", "stall", 1);
    mango_snapshot_job *job = NULL;
    rc = mango_snapshot_start(snap, &job);
    unsetenv("MANGO_TEST_SNAPSHOT");
    CHECK(rc == MANGO_OK && job);
    if (job) {
        CHECK(mango_snapshot_poll(job, false, NULL) == MANGO_EAGAIN);
        close(ls);
        int again = listening_socket(ntohs(sa.sin_port));
        printf("%s: the port of a socket closed while a writer works: %s\n", mode, again >= 0 ? "free" : "taken");
        CHECK(again >= 0);
        if (again >= 0)
            close(again);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        mango_snapshot_cancel(job);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        CHECK(t1.tv_sec - t0.tv_sec < 5);
        CHECK(!exists(snap));
        CHECK(leftovers(snap) == 0);
    }
    CHECK(mango_snapshot_start(snap, NULL) == MANGO_EINVAL);
    /* MANGO_SNAPSHOT_MBPS: a pace, or refused before anything starts. */
    /* (decimal digits only: strtoull took " 50" and "+50", and wrapped
     * " -18446744073709551566" around to 50) */
    static const char *bad_mbps[] = {"fast", " 50", "+50", " -18446744073709551566"};
    for (size_t i = 0; i < sizeof bad_mbps / sizeof bad_mbps[0]; i++) {
        setenv("MANGO_SNAPSHOT_MBPS", bad_mbps[i], 1);
        rc = mango_snapshot(snap, NULL);
        CHECK(rc == MANGO_EINVAL && strstr(mango_last_error(), "MANGO_SNAPSHOT_MBPS") && !exists(snap));
    }
    setenv("MANGO_SNAPSHOT_MBPS", "50", 1);
    CHECK(mango_snapshot(snap, NULL) == MANGO_OK && exists(snap));
    unsetenv("MANGO_SNAPSHOT_MBPS");
    unlink(snap);
    /* MANGO_SNAPSHOT_SHARE: a share of the disk's time, or refused likewise. */
    static const char *bad_shares[] = {"0", "101", "-5", "half", "50%", " 50", "+50",
                                        " -18446744073709551566"};
    for (size_t i = 0; i < sizeof bad_shares / sizeof bad_shares[0]; i++) {
        setenv("MANGO_SNAPSHOT_SHARE", bad_shares[i], 1);
        rc = mango_snapshot(snap, NULL);
        CHECK(rc == MANGO_EINVAL && strstr(mango_last_error(), "MANGO_SNAPSHOT_SHARE") && !exists(snap));
    }
    /* The pace used is reported: by default a quarter of the disk's time in
     * fs mode and no pacing elsewhere; a share or a rate as set. */
    unsetenv("MANGO_SNAPSHOT_SHARE");
    mango_snapshot_info si;
    memset(&si, 0xff, sizeof si);
    CHECK(mango_snapshot(snap, &si) == MANGO_OK && exists(snap));
    CHECK(si.share == (strcmp(mode, "fs") == 0 ? 25u : 100u) && si.mbps == 0);
    CHECK(si.paced_seconds >= 0 && si.paced_seconds <= si.seconds);
    unlink(snap);
    setenv("MANGO_SNAPSHOT_SHARE", "10", 1);
    CHECK(mango_snapshot(snap, &si) == MANGO_OK && exists(snap));
    CHECK(si.share == 10 && si.mbps == 0 && si.paced_seconds >= 0 && si.paced_seconds <= si.seconds);
    printf("%s: a snapshot at a 10 %% share: %.3f s, %.3f s of it paced\n", mode, si.seconds, si.paced_seconds);
    setenv("MANGO_SNAPSHOT_MBPS", "50", 1); /* a rate replaces the share */
    unlink(snap);
    CHECK(mango_snapshot(snap, &si) == MANGO_OK && exists(snap));
    CHECK(si.share == 100 && si.mbps == 50 && si.paced_seconds <= si.seconds);
    unsetenv("MANGO_SNAPSHOT_MBPS");
    unsetenv("MANGO_SNAPSHOT_SHARE");
    unlink(snap);
    /* Started on a thread that then exits, finished on this one: the
     * writer outlives the thread that forked it. */
    pthread_t starter;
    start_args sa2 = {.path = snap};
    pthread_create(&starter, NULL, start_snapshot, &sa2);
    pthread_join(starter, NULL);
    CHECK(sa2.rc == MANGO_OK && sa2.job);
    if (sa2.job) {
        rc = mango_snapshot_poll(sa2.job, true, NULL);
        printf("%s: a snapshot whose starting thread exited: %d %s\n", mode, rc, rc ? mango_last_error() : "");
        CHECK(rc == MANGO_OK && exists(snap));
    }
    unlink(snap);
    /* And the runtime goes on. */
    CHECK(mango_client_cmd(NULL) == 0);
    CHECK(mango_snapshot(snap, NULL) == MANGO_OK);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(snap);
}

/* A big batch (through the big-batch file) that the backend has not
 * applied when the snapshot is taken: its .data/.bss bits come from that
 * file (fs mode: the backend applies every 5 s). */
static void big_batch_pending(const char *self, const char *mode, const char *pool, const char *snap)
{
    unlink(pool);
    unlink(snap);
    memset(seen, 0, sizeof seen);
    memset(big_seen, 0, sizeof big_seen);
    CHECK(start(pool, test_mode_named(mode)) == MANGO_FRESH);
    mango_stats st0, st1;
    mango_get_stats(&st0);
    CHECK(mango_batch_begin() == MANGO_OK);
    for (unsigned k = 0; k < BIG_BLOCKS; k++) {
        big_seen[k * 32 + 7] = 1;
        mango_capture(&big_seen[k * 32 + 7], 1);
    }
    CHECK(mango_batch_end() == MANGO_OK);
    mango_get_stats(&st1);
    printf("%s: a batch of %u .bss blocks: %llu big batch(es); unapplied log at the snapshot %llu bytes\n", mode,
           BIG_BLOCKS, (unsigned long long)(st1.big_batches - st0.big_batches),
           (unsigned long long)st1.log_unapplied_bytes);
    CHECK(st1.big_batches == st0.big_batches + 1);
    CHECK(mango_snapshot(snap, NULL) == MANGO_OK);
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(kill_child_run(self, "verify", mode, snap, "0,0,1") == 0);
    unlink(snap);
}

/* Part 3's process: opens the pool and takes a snapshot whose writer
 * lingers (the test kills this process meanwhile). */
static int stalling(const char *mode, const char *pool, const char *snap)
{
    if (start(pool, test_mode_named(mode)) != MANGO_RECOVERED || mango_client_cmd(NULL) != 0)
        return 2;
    setenv("MANGO_TEST_SNAPSHOT", "stall", 1);
    mango_snapshot(snap, NULL);
    return 3; /* not reached: killed */
}

/* The writer's pid, from its temporary file's name ("<snap>.tmp.<pid>"); 0 if none. */
static pid_t writer_pid(const char *snap)
{
    pid_t pid = 0;
    snapshot_leftovers(snap, &pid, false);
    return pid;
}

/* Running: not gone, not a zombie. */
static bool running(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *c = strrchr(buf, ')');
    return c && c[2] != 'Z' && c[2] != 'X';
}

/* A writer paced to 1 MB/s idles for seconds after its first piece: killed
 * then, its process stops within a few tenths of a second (it idles in
 * slices, looking for its parent), not once the idle time is over. */
static void killed_while_paced(const char *self, const char *mode, const char *pool, const char *snap)
{
    unlink(snap);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MANGO_SNAPSHOT_MBPS", "1", 1);
        setenv("MANGO_SNAPSHOT_SHARE", "1", 1);
        execl(self, "test_snapshot", "paced", mode, pool, snap, (char *)NULL);
        _exit(127);
    }
    pid_t w = 0;
    for (int i = 0; i < 200 && (w = writer_pid(snap)) == 0; i++)
        sleep_ms(25);
    CHECK(w > 0);
    sleep_ms(300); /* into its pacing */
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (w > 0 && running(w)) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > 20)
            break;
        sleep_ms(10);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%s: a paced writer (1 MB/s) stopped %.2f s after its parent was killed\n", mode, took);
    CHECK(w > 0 && !running(w) && took < 1.0);
    CHECK(!exists(snap));
    /* its temporary file goes with the next snapshot to that path */
    CHECK(start(pool, test_mode_named(mode)) == MANGO_RECOVERED);
    CHECK(mango_snapshot(snap, NULL) == MANGO_OK && leftovers(snap) == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(snap);
}

static void killed_during_snapshot(const char *self, const char *mode, const char *pool, const char *snap)
{
    unlink(snap);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, "test_snapshot", "stall", mode, pool, snap, (char *)NULL);
        _exit(127);
    }
    /* Until the writer's temporary file appears (it lingers there). */
    for (int i = 0; i < 200 && leftovers(snap) == 0; i++)
        sleep_ms(25);
    CHECK(leftovers(snap) == 1);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    sleep_ms(200); /* the writer's death signal */
    CHECK(!exists(snap));
    int rc = start(pool, test_mode_named(mode)); /* the writer never held the pool's lock */
    printf("%s: restart after a kill during a snapshot: %d %s; writer's leftovers %d\n", mode, rc,
           rc < 0 ? mango_last_error() : "", leftovers(snap));
    CHECK(rc == MANGO_RECOVERED);
    if (rc != MANGO_RECOVERED)
        return;
    CHECK(mango_snapshot(snap, NULL) == MANGO_OK); /* and removes the dead writer's file */
    CHECK(leftovers(snap) == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(snap);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 5 && strcmp(argv[1], "verify") == 0)
        return verify(argv[2], argv[3], argv[4]);
    if (argc >= 5 && strcmp(argv[1], "stall") == 0)
        return stalling(argv[2], argv[3], argv[4]);
    if (argc >= 5 && strcmp(argv[1], "paced") == 0) { /* (paced by the environment: killed_while_paced) */
        if (start(argv[3], test_mode_named(argv[2])) != MANGO_RECOVERED || mango_batch_begin() != MANGO_OK)
            return 2;
        char *ballast = malloc(6u << 20); /* durable, non-zero: the writer has 6 MiB to copy */
        if (!ballast)
            return 2;
        memset(ballast, 0x5a, 6u << 20);
        if (mango_batch_end() != MANGO_OK)
            return 2;
        mango_snapshot(argv[4], NULL);
        return 3; /* not reached: killed */
    }
    srand((unsigned)getpid());
    CHECK(mango_snapshot("/var/tmp/never", NULL) == MANGO_EINVAL); /* before mango_init */
    char snap[96];
    snprintf(snap, sizeof snap, "/var/tmp/mango-snapshot-%d.snap", (int)getpid());
    {
        char pool[96];
        snprintf(pool, sizeof pool, "/dev/shm/mango-snapshot-none-%d.pool", (int)getpid());
        CHECK(start(pool, MANGO_PERSIST_NONE) == MANGO_FRESH);
        CHECK(mango_snapshot(snap, NULL) == MANGO_EINVAL);
        CHECK(mango_shutdown() == MANGO_OK);
    }
    const char *modes[] = {"emulated", "fs", "sim"};
    for (int i = 0; i < 3; i++) {
        char pool[96];
        snprintf(pool, sizeof pool, "%s/mango-snapshot-%d.pool", i ? "/var/tmp" : "/dev/shm", (int)getpid());
        online_snapshot("/proc/self/exe", modes[i], pool, snap);
        errors(modes[i], pool, snap);
        killed_during_snapshot("/proc/self/exe", modes[i], pool, snap);
        killed_while_paced("/proc/self/exe", modes[i], pool, snap);
        big_batch_pending("/proc/self/exe", modes[i], pool, snap);
        unlink(pool);
        unlink(snap);
    }
    return check_report("test_snapshot");
}
