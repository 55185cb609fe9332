/* test_batch_submit.c -- pipelined group commit (mango_batch_submit and the
 * ticket API) in fs and sim modes:
 *   - tickets are handed out in order, empty batches included; the durable
 *     ticket only moves forward; mango_wait_durable and the eventfd work
 *     (readable after a deferred sync, not for a ticket durable at once);
 *     mango_reply_ticket names the open batch or the last one submitted;
 *   - the sync thread groups frames (fewer syncs than pipelined batches when
 *     the caller runs ahead) and the state survives a clean restart;
 *   - kill loop, in sim mode and in fs mode (both drop on SIGKILL every log
 *     byte not yet synced: sim maps the whole pool privately, fs the log): a
 *     child submits batches as fast as it can and reports on a pipe each
 *     counter value whose ticket became durable; after each SIGKILL a fresh
 *     process recovers the pool and must find the two counters equal (batches
 *     are atomic) and at least the last value reported durable.
 * Usage: test_batch_submit [kill ROUNDS [MODE] | child MODE POOL FD | verify MODE POOL MIN]
 * (`kill` runs only the kill loop: tests/CMakeLists.txt runs it against a
 * runtime without the commit sync, where it must fail.) */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "kill_child.h"
#include "test_config.h"

static uint64_t *pair; /* durable: two counters every batch increments together */

static void init_state(void *arg)
{
    pair = calloc(2, sizeof *pair);
    mango_capture(&pair, sizeof pair);
    mango_capture(pair, 2 * sizeof *pair);
}
static bool is_ro(void *c) { return true; }
static void nop(void *c) {}

static mango_persist_mode parse_mode(const char *m)
{
    return strcmp(m, "fs") == 0 ? MANGO_PERSIST_FS : MANGO_PERSIST_SIM;
}

static int start(const char *pool, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    cfg.log_size = 256u << 10; /* small: the ring turns many times */
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nop, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static void one_batch(void)
{
    CHECK(mango_batch_begin() == 0);
    pair[0]++;
    mango_capture(&pair[0], 8);
    pair[1]++;
    mango_capture(&pair[1], 8);
}

/* In-process API checks in one mode. */
static void api_checks(const char *pool, mango_persist_mode mode)
{
    unlink(pool);
    CHECK(start(pool, mode) == MANGO_FRESH);
    int fd = mango_durable_fd();
    CHECK(fd >= 0);
    uint64_t d0;
    CHECK(mango_durable_ticket(&d0) == 0);
    uint64_t t_prev = d0, t = 0;
    CHECK(mango_reply_ticket() == d0);
    mango_stats s0, s1;
    mango_get_stats(&s0);
    uint64_t most_in_flight = 0, over_bound = 0;
    for (int b = 0; b < 3000; b++) {
        one_batch();
        CHECK(mango_reply_ticket() == t_prev + 1); /* the open batch */
        CHECK(mango_batch_submit(&t) == 0);
        CHECK(t == t_prev + 1);
        CHECK(mango_reply_ticket() == t);
        t_prev = t;
        if (b % 16 == 0) { /* in flight: at most what is submitted and not yet durable */
            uint64_t before;
            mango_durable_ticket(&before);
            mango_stats f;
            mango_get_stats(&f);
            over_bound += f.batches_in_flight > t - before;
            if (f.batches_in_flight > most_in_flight)
                most_in_flight = f.batches_in_flight;
        }
        if (b % 500 == 0) { /* an empty batch gets a ticket too */
            CHECK(mango_batch_begin() == 0);
            CHECK(mango_batch_submit(&t) == 0 && t == t_prev + 1);
            t_prev = t;
        }
    }
    uint64_t d;
    CHECK(mango_durable_ticket(&d) == 0 && d <= t && d >= d0);
    mango_stats mid;
    printf("%s: at most %llu batches in flight at the samples\n", mode == MANGO_PERSIST_FS ? "fs" : "sim",
           (unsigned long long)most_in_flight);
    CHECK(over_bound == 0);
    if (mode == MANGO_PERSIST_FS) /* a sync takes far longer than a submit */
        CHECK(most_in_flight >= 1);
    CHECK(mango_wait_durable(t) == 0);
    CHECK(mango_durable_ticket(&d) == 0 && d == t);
    /* what INFO mangosteen reports (durable Redis) */
    mango_get_stats(&mid);
    CHECK(mid.batches_in_flight == 0);
    CHECK(mid.log_capacity == 256u << 10);
    CHECK(mid.log_unapplied_bytes <= mid.log_capacity);
    CHECK(strcmp(mango_mode_name(), mode == MANGO_PERSIST_FS ? "fs" : "sim") == 0);
    CHECK(strstr(mango_pool_path(), strrchr(pool, '/') ? strrchr(pool, '/') : pool) != NULL);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    CHECK(poll(&p, 1, 0) == 1);
    uint64_t v;
    CHECK(read(fd, &v, 8) == 8 && v >= 1);
    /* Cleared by the read. The sync that made t durable wakes waiters
     * before it writes the fd, so mango_wait_durable may return before that
     * last write: it may still land once (nothing else is in flight), and
     * then the fd is clear for good (a flaky failure here, session 37). */
    if (read(fd, &v, 8) == 8)
        CHECK(read(fd, &v, 8) == -1 && errno == EAGAIN);
    else
        CHECK(errno == EAGAIN);
    mango_get_stats(&s1);
    uint64_t pb = s1.pipelined_batches - s0.pipelined_batches;
    uint64_t ps = s1.pipeline_syncs - s0.pipeline_syncs;
    printf("%s: pipelined batches %llu, pipeline syncs %llu (%.1f frames per sync)\n",
           mode == MANGO_PERSIST_FS ? "fs" : "sim", (unsigned long long)pb, (unsigned long long)ps,
           ps ? (double)pb / (double)ps : 0.0);
    CHECK(pb == 3000);
    CHECK(ps >= 1 && ps <= pb);
    /* mango_batch_end after submits waits for everything in flight */
    one_batch();
    CHECK(mango_batch_submit(&t) == 0);
    one_batch();
    CHECK(mango_batch_end() == 0);
    CHECK(mango_durable_ticket(&d) == 0 && d == t + 1);
    CHECK(pair[0] == 3002 && pair[1] == 3002);
    /* A ticket durable when handed out (an end, or a submit with nothing in
     * flight and nothing to log) does not make the eventfd readable; a
     * deferred one does once synced. (The sync thread writes the eventfd
     * for the batches above after it wakes their waiters: drain until it
     * has stayed quiet for 200 ms.) */
    while (poll(&p, 1, 200) == 1)
        while (read(fd, &v, 8) == 8) {}
    CHECK(mango_batch_begin() == 0);
    CHECK(mango_batch_end() == 0);
    one_batch();
    CHECK(mango_batch_end() == 0);
    CHECK(mango_batch_begin() == 0);
    CHECK(mango_batch_submit(&t) == 0);
    CHECK(mango_durable_ticket(&d) == 0 && d == t);
    CHECK(poll(&p, 1, 0) == 0);
    one_batch();
    CHECK(mango_batch_submit(&t) == 0);
    CHECK(poll(&p, 1, 10 * 1000) == 1);
    CHECK(mango_wait_durable(t) == 0);
    CHECK(pair[0] == 3004 && pair[1] == 3004);
    one_batch();
    CHECK(mango_batch_submit(&t) == 0); /* shutdown drains it */
    CHECK(mango_shutdown() == 0);
    CHECK(start(pool, mode) == MANGO_RECOVERED);
    CHECK(pair[0] == 3005 && pair[1] == 3005);
    CHECK(mango_shutdown() == 0);
    CHECK(strcmp(mango_mode_name(), "") == 0 && strcmp(mango_pool_path(), "") == 0);
    unlink(pool);
}

/* Child of the kill loop: submit forever, report durable counter values. */
static int child(const char *mode, const char *pool, int fd)
{
    int st = start(pool, parse_mode(mode));
    if (st < 0) {
        fprintf(stderr, "child: %s\n", mango_last_error());
        return 2;
    }
    enum { RING = 4096 };
    static uint64_t value_of[RING]; /* ticket % RING -> counter value */
    uint64_t reported = 0, t;
    for (;;) {
        one_batch();
        uint64_t v = pair[0];
        if (mango_batch_submit(&t) != 0)
            return 3;
        value_of[t % RING] = v;
        uint64_t d;
        if (mango_durable_ticket(&d) != 0)
            return 4;
        if (t - d >= RING / 2) { /* keep the map valid: wait for the sync */
            mango_wait_durable(t - RING / 4);
            mango_durable_ticket(&d);
        }
        if (d > reported && t - d < RING / 2) {
            uint64_t val = value_of[d % RING];
            if (write(fd, &val, sizeof val) != sizeof val)
                return 5;
            reported = d;
        }
    }
}

static int verify(const char *mode, const char *pool, uint64_t min)
{
    int st = start(pool, parse_mode(mode));
    if (st < 0) {
        fprintf(stderr, "verify: %s\n", mango_last_error());
        return 2;
    }
    int bad = pair[0] != pair[1] || pair[0] < min;
    if (getenv("MANGO_TEST_VERBOSE"))
        fprintf(stderr, "verify: counters %llu/%llu, min %llu\n", (unsigned long long)pair[0],
                (unsigned long long)pair[1], (unsigned long long)min);
    if (bad)
        fprintf(stderr, "verify: counters %llu/%llu, acknowledged durable %llu\n",
                (unsigned long long)pair[0], (unsigned long long)pair[1], (unsigned long long)min);
    mango_shutdown();
    return bad ? 1 : 0;
}

static void kill_loop(const char *pool, int rounds, const char *mode)
{
    unlink(pool);
    uint64_t acked = 0;
    int lost = 0, verified = 0;
    srand((unsigned)getpid());
    for (int r = 0; r < rounds; r++) {
        CHECK(kill_child_round("test_batch_submit", mode, pool, 20, 200, &acked));
        int status;
        pid_t pid = fork();
        if (pid == 0) {
            char mintxt[32];
            snprintf(mintxt, sizeof mintxt, "%llu", (unsigned long long)acked);
            execl("/proc/self/exe", "test_batch_submit", "verify", mode, pool, mintxt, (char *)NULL);
            _exit(127);
        }
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            lost++;
        else
            verified++;
    }
    printf("kill loop (%s): rounds=%d acked=%llu verified=%d lost=%d\n", mode, rounds,
           (unsigned long long)acked, verified, lost);
    CHECK(lost == 0);
    CHECK(acked > 0);
    unlink(pool);
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "child") == 0)
        return child(argv[2], argv[3], atoi(argv[4]));
    if (argc == 5 && strcmp(argv[1], "verify") == 0)
        return verify(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    char pool[96];
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "kill") == 0) {
        const char *mode = argc == 4 ? argv[3] : "sim";
        snprintf(pool, sizeof pool, "%s/mango-submit-kill-%d.pool",
                 strcmp(mode, "fs") == 0 ? "/var/tmp" : "/dev/shm", (int)getpid());
        kill_loop(pool, atoi(argv[2]), mode);
        return check_report("test_batch_submit kill");
    }
    snprintf(pool, sizeof pool, "/var/tmp/mango-submit-%d.pool", (int)getpid());
    /* Every way the fs log can reach the file (MANGO_FS_LOG), and a bad one. */
    static const char *const fs_logs[] = {"direct", "buffered", "mmap"};
    for (unsigned i = 0; i < 3; i++) {
        setenv("MANGO_FS_LOG", fs_logs[i], 1);
        api_checks(pool, MANGO_PERSIST_FS);
    }
    setenv("MANGO_FS_LOG", "sometimes", 1);
    unlink(pool);
    CHECK(start(pool, MANGO_PERSIST_FS) == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), "MANGO_FS_LOG=sometimes") != NULL);
    unlink(pool);
    unsetenv("MANGO_FS_LOG");
    snprintf(pool, sizeof pool, "/dev/shm/mango-submit-%d.pool", (int)getpid());
    api_checks(pool, MANGO_PERSIST_SIM);
    snprintf(pool, sizeof pool, "/dev/shm/mango-submit-kill-%d.pool", (int)getpid());
    kill_loop(pool, 20, "sim");
    /* fs mode: the log is written through a private mapping (MANGO_FS_LOG,
     * default direct), so a SIGKILL drops every frame not yet synced, as
     * sim mode does: acknowledged values must have gone through the pwrite. */
    snprintf(pool, sizeof pool, "/var/tmp/mango-submit-kill-%d.pool", (int)getpid());
    kill_loop(pool, 10, "fs");
    return check_report("test_batch_submit");
}
