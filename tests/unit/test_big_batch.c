/* test_big_batch.c -- batches larger than a log frame go through the
 * big-batch file (src/log/big_batch.h):
 *   - emulated: batches that rewrite 1 MiB (5x what a frame of the 256 KiB
 *     log may hold), as 32 768 blocks or as one data range (stores below or
 *     above DEDUP_RANGE_MIN), mixed with small ones and with zero ranges, are
 *     committed, survive a restart, and the file is gone after a clean
 *     shutdown;
 *   - fs, pipelined (mango_batch_submit): a big batch between submitted small
 *     ones keeps the tickets in order and survives a restart;
 *   - a big batch committed but not yet applied when the process dies: with
 *     its file missing, damaged, or replaced by an earlier big batch's,
 *     recovery refuses with MANGO_EBADPOOL and leaves the pool byte for byte
 *     unchanged; with the file there but unreadable (a symlink loop: root
 *     ignores file modes) it fails with MANGO_EIO, not a bad pool, and
 *     leaves the pool unchanged too; with the file put back it recovers the
 *     batch;
 *   - a big batch whose file's name is removed after it was acknowledged (a
 *     temp-file cleaner) is still applied, through the runtime's own
 *     descriptor: a clean shutdown and a crash once it is applied both
 *     leave a pool that recovers it (the backend opened the file by name,
 *     failed, and the pool was refused for good: found by a review);
 *   - a relative pool path: the file stays beside the pool when the process
 *     changes directory, and recovery finds it;
 *   - a process with no descriptor left (connections up to the limit) still
 *     commits its first big batch, whose file is opened only then (the
 *     runtime holds spare descriptors for it);
 *   - a big batch whose file cannot be written (the path is a directory) is
 *     not acknowledged, stops further writes with the reason, and after a
 *     restart the state is the last acknowledged batch's;
 *   - kill loop (sim mode, which drops everything not synced): a child runs
 *     small and big batches and reports each acknowledged counter; after each
 *     SIGKILL (and, every third round, a SIGKILL during recovery too) a fresh
 *     process must find the big area uniform (big batches are atomic), in
 *     step with the counter, and the counter at least the last acknowledged.
 * Usage: test_big_batch [kill ROUNDS | child MODE POOL FD | verify MODE POOL MIN [MAX] |
 *                        die POOL N | unwritable POOL MODE | nofds POOL MODE]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"
#include "pool/pool_format.h"

#include "check.h"
#include "kill_child.h"
#include "test_config.h"

#define AREA (1u << 20)      /* 32 768 blocks: more than a frame of a 256 KiB log holds */
#define ZEROED (256u << 10)  /* recalloc'ed by every sixth batch: a zero range */

typedef struct state {
    uint64_t counter;  /* the last batch's number */
    uint64_t last_big; /* the last batch that rewrote the area */
    char *area;
    char *zeroed;      /* calloc'ed anew by batches k % 6 == 0, then k stored at its start */
} state;
static state *st;

static void init_state(void *arg)
{
    (void)arg;
    st = calloc(1, sizeof *st);
    st->area = calloc(1, AREA);
    st->zeroed = calloc(1, ZEROED);
    mango_capture(&st, sizeof st);
    mango_capture(st, sizeof *st);
}
static bool is_ro(void *c) { (void)c; return true; }
static void nop(void *c) { (void)c; }

static int start(const char *pool, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    cfg.log_size = 256u << 10;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nop, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static bool is_big(uint64_t k) { return k % 3 == 0; }

/* The body of batch k (between begin and end/submit). */
static void batch_body(uint64_t k)
{
    if (is_big(k)) {
        if (k % 2 == 0) { /* one store: a data range */
            memset(st->area, (int)(k & 0xff), AREA);
            mango_capture(st->area, AREA);
        } else { /* stores below the data-range size: 32 768 blocks */
            for (size_t off = 0; off < AREA; off += 2048) {
                memset(st->area + off, (int)(k & 0xff), 2048);
                mango_capture(st->area + off, 2048);
            }
        }
        st->last_big = k;
    }
    if (k % 6 == 0) {
        free(st->zeroed);
        st->zeroed = calloc(1, ZEROED); /* reused memory: logged as a zero range */
        memcpy(st->zeroed, &k, sizeof k);
        mango_capture(st->zeroed, sizeof k);
    }
    st->counter = k;
    mango_capture(st, sizeof *st);
}

/* The state a recovered process must hold: 0 or a reason. */
static const char *state_problem(void)
{
    static char why[128];
    uint64_t k = st->counter;
    uint64_t big = k / 3 * 3;
    if (st->last_big != big) {
        snprintf(why, sizeof why, "counter %llu but last big batch %llu", (unsigned long long)k,
                 (unsigned long long)st->last_big);
        return why;
    }
    for (size_t i = 0; i < AREA; i++)
        if ((unsigned char)st->area[i] != (unsigned char)(big & 0xff)) {
            snprintf(why, sizeof why, "counter %llu: area byte %zu is %u, not %u (a torn big batch)",
                     (unsigned long long)k, i, (unsigned char)st->area[i], (unsigned)(big & 0xff));
            return why;
        }
    uint64_t z;
    memcpy(&z, st->zeroed, sizeof z);
    if (z != k / 6 * 6) {
        snprintf(why, sizeof why, "counter %llu: zeroed area holds %llu", (unsigned long long)k,
                 (unsigned long long)z);
        return why;
    }
    for (size_t i = sizeof z; i < ZEROED; i++)
        if (st->zeroed[i]) {
            snprintf(why, sizeof why, "zeroed area byte %zu is not zero", i);
            return why;
        }
    return NULL;
}

static bool file_exists(const char *p) { return access(p, F_OK) == 0; }

static uint64_t file_hash(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    static char buf[1 << 16];
    uint64_t h = 1469598103934665603ull;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++)
            h = (h ^ (unsigned char)buf[i]) * 1099511628211ull;
    close(fd);
    return h;
}

static int run_self5(const char *a1, const char *a2, const char *a3, const char *a4, const char *a5)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_big_batch", a1, a2, a3, a4, a5, (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run_self(const char *a1, const char *a2, const char *a3, const char *a4)
{
    return run_self5(a1, a2, a3, a4, "-");
}

/* ---- part 1: emulated, in process ---- */
static void emulated_checks(const char *pool, const char *big_path)
{
    unlink(pool);
    unlink(big_path);
    if (start(pool, MANGO_PERSIST_EMULATED) != MANGO_FRESH) {
        CHECK(!"emulated start");
        return;
    }
    uint64_t cap = 0;
    mango_batch_room(NULL, &cap);
    printf("a frame holds up to %llu bytes of blocks; a big batch writes %u\n",
           (unsigned long long)cap, AREA);
    CHECK(cap > 0 && cap * 4 < AREA);
    mango_stats s0, s1;
    mango_get_stats(&s0);
    for (uint64_t k = 1; k <= 13; k++) {
        int b = mango_batch_begin();
        CHECK(b == MANGO_OK);
        if (b != MANGO_OK)
            break; /* (a failed runtime: nothing to write into) */
        batch_body(k);
        CHECK(mango_batch_end() == MANGO_OK);
        if (k == 3)
            CHECK(file_exists(big_path));
    }
    mango_get_stats(&s1);
    printf("13 batches, 4 big: %llu blocks logged, %llu bytes\n",
           (unsigned long long)(s1.log_blocks - s0.log_blocks),
           (unsigned long long)(s1.log_bytes - s0.log_bytes));
    /* Batches 3 and 9 log the area as blocks (48 bytes of log per 32), 6 and
     * 12 as one data range each (a header, then the bytes). */
    CHECK(s1.log_blocks - s0.log_blocks >= 2ull * (AREA / 32) + 2ull * (AREA / 48));
    CHECK(s1.big_batches - s0.big_batches == 4); /* batches 3, 6, 9 and 12 */
    CHECK(s1.big_batch_bytes - s0.big_batch_bytes >= 2ull * (AREA / 32) * 48 + 2ull * AREA);
    CHECK(s1.log_data_ranges - s0.log_data_ranges == 2 && s1.log_data_bytes - s0.log_data_bytes == 2ull * AREA);
    CHECK(s1.log_bytes - s0.log_bytes >= s1.big_batch_bytes - s0.big_batch_bytes);
    CHECK(s1.log_zero_ranges > s0.log_zero_ranges); /* the recalloc was a zero range */
    const char *why = state_problem();
    CHECK(why == NULL);
    /* Once the backend has moved both head slots past the last big frame
     * (it writes the head as it applies later frames), the next batch gives
     * the file's space back (it kept it until a restart). */
    struct stat fst = {0};
    CHECK(stat(big_path, &fst) == 0 && fst.st_size > 0);
    for (int i = 0; i < 1000 && stat(big_path, &fst) == 0 && fst.st_size > 0; i++) {
        usleep(10000);
        CHECK(mango_batch_begin() == MANGO_OK); /* small frames that keep the state */
        mango_capture(&st->counter, sizeof st->counter);
        CHECK(mango_batch_end() == MANGO_OK);
    }
    CHECK(stat(big_path, &fst) == 0 && fst.st_size == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(!file_exists(big_path)); /* clean shutdown: no frame names it */
    /* ... in either head slot: recovery falls back to the older one if the
     * clean one is damaged, and must not need the file then either. */
    pool_head_slot sl[2] = {{0}};
    FILE *pf = fopen(pool, "rb");
    CHECK(pf && fseek(pf, POOL_HEAD_OFFSET, SEEK_SET) == 0 && fread(sl, sizeof sl, 1, pf) == 1);
    if (pf)
        fclose(pf);
    CHECK(sl[0].clean + sl[1].clean == 1 && sl[0].head_lsn == sl[1].head_lsn);
    int rc = start(pool, MANGO_PERSIST_EMULATED);
    CHECK(rc == MANGO_RECOVERED);
    if (rc == MANGO_RECOVERED) {
        why = state_problem();
        if (why)
            printf("after restart: %s\n", why);
        CHECK(why == NULL && st->counter == 13);
    }
    mango_shutdown();
    unlink(pool);
}

/* Batches 1-3 (3 is big), the big-batch file's name removed once 3 is
 * acknowledged, then batches 4 and 5. */
static bool run_then_unlink(const char *pool, const char *big_path)
{
    unlink(pool);
    unlink(big_path);
    if (start(pool, MANGO_PERSIST_EMULATED) != MANGO_FRESH)
        return false;
    for (uint64_t k = 1; k <= 5; k++) {
        if (mango_batch_begin() != MANGO_OK)
            return false;
        batch_body(k);
        if (mango_batch_end() != MANGO_OK)
            return false;
        if (k == 3 && unlink(big_path) != 0)
            return false;
    }
    return true;
}

static void unlinked_file_checks(const char *pool, const char *big_path)
{
    /* A clean shutdown applies batch 3 from the unnamed file. */
    CHECK(run_then_unlink(pool, big_path));
    int rc = mango_shutdown();
    if (rc != MANGO_OK)
        printf("shutdown after the big-batch file's name was removed: %s\n", mango_last_error());
    CHECK(rc == MANGO_OK);
    rc = start(pool, MANGO_PERSIST_EMULATED);
    CHECK(rc == MANGO_RECOVERED);
    if (rc == MANGO_RECOVERED) {
        CHECK(state_problem() == NULL && st->counter == 5);
        /* The next big batch makes the file anew. */
        CHECK(mango_batch_begin() == MANGO_OK);
        batch_body(6);
        CHECK(mango_batch_end() == MANGO_OK);
        CHECK(file_exists(big_path));
        CHECK(mango_shutdown() == MANGO_OK);
    }
    /* A crash once the backend has applied everything: recovery does not
     * need the file. */
    pid_t pid = fork();
    if (pid == 0) {
        if (!run_then_unlink(pool, big_path))
            _exit(3);
        mango_stats s;
        for (int i = 0; i < 2000; i++) {
            mango_get_stats(&s);
            if (s.log_unapplied_bytes == 0)
                _exit(0); /* no shutdown: a crash */
            usleep(1000);
        }
        _exit(4); /* never applied */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        printf("the child (a crash after the big batch was applied) ended with status %d\n", status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    rc = start(pool, MANGO_PERSIST_EMULATED);
    if (rc < 0)
        printf("recovery after the crash: %s\n", mango_last_error());
    CHECK(rc == MANGO_RECOVERED);
    if (rc == MANGO_RECOVERED) {
        CHECK(state_problem() == NULL && st->counter == 5);
        mango_shutdown();
    }
    unlink(pool);
    unlink(big_path);
}

/* ---- part 2: fs, pipelined ---- */
static void fs_pipelined_checks(const char *pool, const char *big_path)
{
    unlink(pool);
    unlink(big_path);
    if (start(pool, MANGO_PERSIST_FS) != MANGO_FRESH) {
        CHECK(!"fs start");
        return;
    }
    uint64_t t, prev = 0;
    CHECK(mango_durable_ticket(&prev) == 0);
    for (uint64_t k = 1; k <= 8; k++) {
        int b = mango_batch_begin();
        CHECK(b == MANGO_OK);
        if (b != MANGO_OK)
            break;
        batch_body(k);
        CHECK(mango_batch_submit(&t) == MANGO_OK);
        CHECK(t == prev + 1);
        prev = t;
        if (is_big(k)) { /* committed inline: durable at once, with all before it */
            uint64_t d;
            CHECK(mango_durable_ticket(&d) == 0 && d == t);
        }
    }
    CHECK(mango_wait_durable(t) == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    int rc = start(pool, MANGO_PERSIST_FS);
    CHECK(rc == MANGO_RECOVERED);
    if (rc == MANGO_RECOVERED) {
        const char *why = state_problem();
        CHECK(why == NULL && st->counter == 8);
    }
    mango_shutdown();
    unlink(pool);
    unlink(big_path); /* a clean shutdown removed it, but not a failed one (mutants) */
}

/* ---- part 3: committed, unapplied, and the file is not right ---- */

/* Child: batches 1..n, then die at once (the backend waits a millisecond
 * before applying, so the last big frame is most likely still unapplied). */
static int die_after(const char *pool, uint64_t n, const char *cd)
{
    if (start(pool, MANGO_PERSIST_EMULATED) < 0)
        return 2;
    if (cd && chdir(cd) != 0) /* (a relative pool path now names another file) */
        return 6;
    for (uint64_t k = st->counter + 1; k <= n; k++) {
        if (mango_batch_begin() != MANGO_OK)
            return 3;
        batch_body(k);
        if (mango_batch_end() != MANGO_OK)
            return 4;
    }
    raise(SIGKILL);
    return 5;
}

/* Verify child: 0 recovered and right (20: and a big batch was replayed from
 * its file), 10 refused with a big-batch reason (a bad pool), 11 failed
 * because the big-batch file could not be read (MANGO_EIO), else a failure. */
static int verify(const char *mode, const char *pool, uint64_t min, uint64_t max)
{
    int rc = start(pool, test_mode_named(mode));
    if (rc == MANGO_EBADPOOL && strstr(mango_last_error(), ".bigbatch")) {
        printf("verify: refused: %s\n", mango_last_error());
        return 10;
    }
    if (rc == MANGO_EIO && strstr(mango_last_error(), ".bigbatch") &&
        strstr(mango_last_error(), "nothing was applied")) {
        printf("verify: could not read: %s\n", mango_last_error());
        return 11;
    }
    if (rc < 0) {
        fprintf(stderr, "verify: %s\n", mango_last_error());
        return 2;
    }
    const char *why = state_problem();
    if (!why && st->counter < min)
        why = "an acknowledged batch is lost";
    if (!why && st->counter > max)
        why = "a batch that was not acknowledged is there";
    if (why || getenv("MANGO_TEST_VERBOSE"))
        fprintf(stderr, "verify: counter %llu, acknowledged %llu: %s\n", (unsigned long long)st->counter,
                (unsigned long long)min, why ? why : "ok");
    mango_stats s;
    mango_get_stats(&s);
    bool replayed_big = s.recovery_blocks_replayed >= AREA / 48; /* (as a data range: AREA / 48 + 1) */
    mango_shutdown();
    return why ? 1 : replayed_big ? 20 : 0;
}

static void copy_file(const char *from, const char *to)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    CHECK(system(cmd) == 0);
}

static void bad_file_checks(const char *pool, const char *big_path)
{
    char aside[200], stale[200];
    snprintf(aside, sizeof aside, "%s.aside", big_path);
    snprintf(stale, sizeof stale, "%s.stale", big_path);
    int refused_missing = 0, refused_damaged = 0, refused_stale = 0, unreadable = 0, attempts = 0;
    for (; attempts < 10 && (!refused_missing || !refused_damaged || !refused_stale); attempts++) {
        unlink(pool);
        unlink(big_path);
        char n[16];
        CHECK(run_self("die", pool, "3", "-") == 128 + SIGKILL); /* batches 1-3: one big */
        if (!file_exists(big_path))
            continue; /* (cannot happen: only recovery and shutdown remove it) */
        copy_file(big_path, stale);
        int r3 = run_self("verify", "emulated", pool, "3");
        CHECK(r3 == 0 || r3 == 20);
        snprintf(n, sizeof n, "%d", 6);
        CHECK(run_self("die", pool, n, "-") == 128 + SIGKILL); /* 4-6: big batch 6 */
        uint64_t before = file_hash(pool);
        /* missing */
        CHECK(rename(big_path, aside) == 0);
        int v = run_self("verify", "emulated", pool, "6");
        if (v == 0 || v == 20)
            continue; /* the backend had applied batch 6: nothing to refuse, and right */
        CHECK(v == 10);
        CHECK(file_hash(pool) == before);
        refused_missing++;
        /* an earlier big batch's file */
        copy_file(stale, big_path);
        v = run_self("verify", "emulated", pool, "6");
        CHECK(v == 10 && file_hash(pool) == before);
        refused_stale += v == 10;
        /* damaged: one payload byte flipped */
        copy_file(aside, big_path);
        int fd = open(big_path, O_RDWR);
        CHECK(fd >= 0);
        unsigned char c;
        CHECK(pread(fd, &c, 1, 64 + 48 * 1000 + 20) == 1);
        c ^= 0x40;
        CHECK(pwrite(fd, &c, 1, 64 + 48 * 1000 + 20) == 1);
        close(fd);
        v = run_self("verify", "emulated", pool, "6");
        CHECK(v == 10 && file_hash(pool) == before);
        refused_damaged += v == 10;
        /* unreadable: a symlink to itself (open fails with ELOOP) */
        CHECK(unlink(big_path) == 0);
        const char *base = strrchr(big_path, '/');
        CHECK(symlink(base ? base + 1 : big_path, big_path) == 0);
        v = run_self("verify", "emulated", pool, "6");
        CHECK(v == 11 && file_hash(pool) == before);
        unreadable += v == 11;
        CHECK(unlink(big_path) == 0);
        /* put back: recovers batch 6 */
        CHECK(rename(aside, big_path) == 0);
        CHECK(run_self("verify", "emulated", pool, "6") == 20); /* batch 6 replayed from the file */
        CHECK(!file_exists(big_path)); /* recovery removed it */
    }
    printf("unapplied big batch: %d attempts; refused missing %d, stale %d, damaged %d; unreadable %d\n",
           attempts, refused_missing, refused_stale, refused_damaged, unreadable);
    CHECK(refused_missing > 0 && refused_stale > 0 && refused_damaged > 0 && unreadable > 0);
    unlink(pool);
    unlink(big_path);
    unlink(aside);
    unlink(stale);
}

/* ---- part 3b: a relative pool path, then a change of directory ---- */
static void relative_path_checks(void)
{
    char dir[] = "/dev/shm/mango-big-rel-XXXXXX", other[] = "/dev/shm/mango-big-other-XXXXXX";
    char here[4096];
    CHECK(getcwd(here, sizeof here) != NULL);
    CHECK(mkdtemp(dir) != NULL && mkdtemp(other) != NULL);
    CHECK(chdir(dir) == 0);
    int replayed = 0, attempts = 0;
    for (; attempts < 5 && !replayed; attempts++) {
        unlink("rel.pool");
        CHECK(run_self("die", "rel.pool", "3", other) == 128 + SIGKILL);
        CHECK(access("rel.pool.bigbatch", F_OK) == 0); /* beside the pool, not in `other` */
        char stray[200];
        snprintf(stray, sizeof stray, "%s/rel.pool.bigbatch", other);
        CHECK(access(stray, F_OK) != 0);
        int v = run_self("verify", "emulated", "rel.pool", "3");
        CHECK(v == 0 || v == 20);
        replayed += v == 20;
    }
    printf("relative pool path, then chdir: big batch replayed after %d attempts\n", attempts);
    CHECK(replayed == 1);
    unlink("rel.pool");
    unlink("rel.pool.bigbatch");
    CHECK(chdir(here) == 0);
    CHECK(rmdir(dir) == 0 && rmdir(other) == 0);
}

/* ---- part 4: the big-batch file cannot be written ---- */

/* Child: batches 1-2, then big batch 3 with a directory where the file
 * should be, or (MANGO_FAULT_SYNC_SITE=big_batch.sync) with the file's sync
 * failing. 0 if it failed as it must, naming the file. */
/* A fresh pool and batches 1-2 in it: 0, or the child's exit status. */
static int start_with_two_batches(const char *pool, const char *mode)
{
    if (start(pool, test_mode_named(mode)) != MANGO_FRESH)
        return 2;
    for (uint64_t k = 1; k <= 2; k++) {
        if (mango_batch_begin() != MANGO_OK)
            return 3;
        batch_body(k);
        if (mango_batch_end() != MANGO_OK)
            return 4;
    }
    return 0;
}

static int unwritable(const char *pool, const char *mode)
{
    int rc = start_with_two_batches(pool, mode);
    if (rc != 0)
        return rc;
    if (mango_batch_begin() != MANGO_OK)
        return 5;
    batch_body(3);
    rc = mango_batch_end();
    printf("big batch whose file fails: %d: %s\n", rc, mango_last_error());
    if (rc != MANGO_EIO || !strstr(mango_last_error(), ".bigbatch"))
        return 6;
    rc = mango_batch_begin(); /* every later write is refused, saying why */
    printf("next batch: %d: %s\n", rc, mango_last_error());
    if (rc == MANGO_OK || !strstr(mango_last_error(), ".bigbatch"))
        return 7;
    mango_shutdown();
    return 0;
}

/* Child: batches 1-2, then every descriptor the process may have is taken
 * (as by connections up to the limit), then big batch 3, whose file is
 * opened only now. 0 if it committed. */
static int no_descriptors_left(const char *pool, const char *mode)
{
    struct rlimit rl = {.rlim_cur = 128, .rlim_max = 128};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 10;
    int rc = start_with_two_batches(pool, mode);
    if (rc != 0)
        return rc;
    int taken = 0;
    while (open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0)
        taken++;
    if (errno != EMFILE)
        return 6;
    if (mango_batch_begin() != MANGO_OK)
        return 7;
    batch_body(3);
    rc = mango_batch_end();
    printf("%s: big batch with no descriptor left (%d taken): %d: %s\n", mode, taken, rc,
           rc == MANGO_OK ? "ok" : mango_last_error());
    if (rc != MANGO_OK)
        return 8;
    return mango_shutdown() == MANGO_OK ? 0 : 9;
}

static void unwritable_checks(const char *pool, const char *big_path)
{
    unlink(pool);
    unlink(big_path);
    CHECK(mkdir(big_path, 0700) == 0);
    CHECK(run_self("unwritable", pool, "emulated", "-") == 0);
    CHECK(rmdir(big_path) == 0);
    CHECK(run_self5("verify", "emulated", pool, "2", "2") == 0); /* batches 1-2, not 3 */
    unlink(pool);
    /* The file's sync fails (EIO; ENOSPC in sim mode, where the staged file
     * is then never copied): the same. */
    static const char *const modes[] = {"emulated", "sim"}, *const errs[] = {"1", "1:ENOSPC"};
    for (int i = 0; i < 2; i++) {
        unlink(pool);
        unlink(big_path);
        setenv("MANGO_FAULT_SYNC", errs[i], 1);
        setenv("MANGO_FAULT_SYNC_SITE", "big_batch.sync", 1);
        int u = run_self("unwritable", pool, modes[i], "-");
        unsetenv("MANGO_FAULT_SYNC");
        unsetenv("MANGO_FAULT_SYNC_SITE");
        CHECK(u == 0);
        CHECK(run_self5("verify", modes[i], pool, "2", "2") == 0);
    }
    unlink(pool);
    unlink(big_path);
    /* The file is opened when the first batch outgrows the log: a process
     * out of descriptors by then (connections up to the limit) failed that
     * open with EMFILE, and the uncommitted batch stopped every write. */
    static const char *const all_modes[] = {"emulated", "sim", "fs"};
    for (int i = 0; i < 3; i++) {
        unlink(pool);
        unlink(big_path);
        CHECK(run_self("nofds", pool, all_modes[i], "-") == 0);
        CHECK(run_self5("verify", all_modes[i], pool, "3", "3") == 0);
    }
    unlink(pool);
    unlink(big_path);
}

/* ---- part 5: kill loop ---- */

static int child(const char *mode, const char *pool, int fd)
{
    if (start(pool, test_mode_named(mode)) < 0) {
        fprintf(stderr, "child: %s\n", mango_last_error());
        return 2;
    }
    for (uint64_t k = st->counter + 1;; k++) {
        if (mango_batch_begin() != MANGO_OK)
            return 3;
        batch_body(k);
        if (mango_batch_end() != MANGO_OK)
            return 4;
        if (write(fd, &k, sizeof k) != sizeof k)
            return 5;
    }
}

static void kill_loop(const char *pool, const char *big_path, int rounds)
{
    unlink(pool);
    unlink(big_path);
    uint64_t acked = 0;
    int lost = 0, recovery_kills = 0, big_replays = 0;
    srand((unsigned)getpid());
    /* Until some recovery replayed a big batch from its file (a third of
     * the rounds do), at most three times the rounds asked for. */
    int r = 0;
    for (; r < rounds || (big_replays == 0 && r < 3 * rounds); r++) {
        CHECK(kill_child_round("test_big_batch", "sim", pool, 30, 250, &acked));
        if (r % 3 == 2) { /* a crash during recovery */
            int status;
            pid_t pid = fork();
            if (pid == 0) {
                execl("/proc/self/exe", "test_big_batch", "verify", "sim", pool, "0", (char *)NULL);
                _exit(127);
            }
            struct timespec rs = {0, (rand() % 4000) * 1000L};
            nanosleep(&rs, NULL);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            recovery_kills += WIFSIGNALED(status);
        }
        char mintxt[32];
        snprintf(mintxt, sizeof mintxt, "%llu", (unsigned long long)acked);
        int rv = run_self("verify", "sim", pool, mintxt);
        lost += rv != 0 && rv != 20;
        big_replays += rv == 20;
    }
    printf("kill loop (sim): rounds=%d acked=%llu (%llu big batches) recovery kills=%d "
           "recoveries that replayed a big batch=%d lost=%d\n", r, (unsigned long long)acked,
           (unsigned long long)(acked / 3), recovery_kills, big_replays, lost);
    CHECK(lost == 0);
    CHECK(big_replays >= 1); /* the kills do land between a big batch's commit and its apply */
    CHECK(acked >= 6); /* at least two big batches acknowledged */
    unlink(pool);
    unlink(big_path);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach CTest's regexes even if a mutant aborts later */
    if (argc >= 5 && strcmp(argv[1], "child") == 0)
        return child(argv[2], argv[3], atoi(argv[4]));
    if (argc >= 5 && strcmp(argv[1], "verify") == 0)
        return verify(argv[2], argv[3], strtoull(argv[4], NULL, 10),
                      argc >= 6 && strcmp(argv[5], "-") ? strtoull(argv[5], NULL, 10) : UINT64_MAX);
    if (argc >= 4 && strcmp(argv[1], "unwritable") == 0)
        return unwritable(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "nofds") == 0)
        return no_descriptors_left(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "die") == 0)
        return die_after(argv[2], strtoull(argv[3], NULL, 10),
                         argc >= 5 && strcmp(argv[4], "-") ? argv[4] : NULL);
    char pool[96], big[120];
    snprintf(pool, sizeof pool, "/dev/shm/mango-big-%d.pool", (int)getpid());
    snprintf(big, sizeof big, "%s.bigbatch", pool);
    emulated_checks(pool, big);
    bad_file_checks(pool, big);
    unlinked_file_checks(pool, big);
    unwritable_checks(pool, big);
    relative_path_checks();
    kill_loop(pool, big, argc >= 3 && strcmp(argv[1], "kill") == 0 ? atoi(argv[2]) : 12);
    snprintf(pool, sizeof pool, "/var/tmp/mango-big-%d.pool", (int)getpid());
    snprintf(big, sizeof big, "%s.bigbatch", pool);
    fs_pipelined_checks(pool, big);
    return check_report("test_big_batch");
}
