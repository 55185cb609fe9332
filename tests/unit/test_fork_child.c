/* test_fork_child.c -- a fork() child never writes the pool. The child
 * inherits the runtime's state, the pool's shared mappings and file, but
 * not its threads: a batch it ended would put its frame in the parent's
 * log, and a shutdown would close the pool under the parent. So in a child
 * every call that would write the pool or wait for it fails with
 * MANGO_EINVAL, naming the fork, and leaves it alone, including the end of
 * a batch the parent had open when it forked (an event loop that forks
 * mid-pass, whose child leaves through exit() and handlers that end the
 * batch and shut down, as durable Redis's do).
 *
 * Part 1, for each mode: a process opens a pool, commits counter = 1, opens
 * a batch that sets 3, forks; the child sets 999 and leaves through exit();
 * the process then dies without ending its batch. Recovery must find 1:
 * 999 would be the child's frame (before the guard, the child committed it
 * and then hung). Part 2: the parent of such children goes on, and
 * recovery finds what it committed. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "counter_state.h"
#include "test_config.h"


static int start(const char *pool, mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static void set_counter(uint64_t v)
{
    *counter = v;
    mango_capture(counter, sizeof *counter);
}

/* In a forked child: a call must fail with MANGO_EINVAL naming the fork.
 * Counts those that did not. */
static int bad;
static void refused(int rc, const char *what)
{
    if (rc == MANGO_EINVAL && strstr(mango_last_error(), "fork() child"))
        return;
    fprintf(stderr, "child: %s: %d (%s)\n", what, rc, mango_last_error());
    bad++;
}

static void child_calls(void)
{
    uint64_t t;
    refused(mango_batch_end(), "mango_batch_end");
    refused(mango_batch_begin(), "mango_batch_begin");
    refused(mango_batch_submit(&t), "mango_batch_submit");
    refused(mango_client_cmd(NULL), "mango_client_cmd");
    refused(mango_client_submit(NULL, &t), "mango_client_submit");
    refused(mango_wait_durable(1), "mango_wait_durable");
    refused(mango_durable_fd(), "mango_durable_fd");
    refused(mango_batch_bulk_begin(), "mango_batch_bulk_begin");
    refused(mango_batch_bulk_end(), "mango_batch_bulk_end");
    refused(mango_rpc_start(NULL), "mango_rpc_start");
    refused(mango_rpc_stop(), "mango_rpc_stop");
    if (mango_batch_open()) { /* the parent's batch is not the child's */
        fprintf(stderr, "child: mango_batch_open() is true\n");
        bad++;
    }
}

/* What durable Redis's exit handler does. */
static void at_exit(void)
{
    if (mango_batch_end() != MANGO_EINVAL || mango_shutdown() != MANGO_EINVAL)
        _exit(90);
}

/* Fork; the child stores 999, runs child_calls, and leaves by exit() (its
 * handler ends the batch and shuts down) or _exit(). Returns the child's
 * exit status: 0 when every call was refused. */
static int fork_child(bool by_exit)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* a child that waits for the parent's threads dies instead */
        set_counter(999);
        child_calls();
        if (by_exit) {
            atexit(at_exit);
            exit(bad);
        }
        refused(mango_shutdown(), "mango_shutdown");
        _exit(bad);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

/* Part 1's process: exit status 0, or what went wrong. */
static int crashing_parent(const char *mode, const char *pool)
{
    alarm(30);
    if (start(pool, test_mode_named(mode)) != MANGO_FRESH || mango_client_cmd(NULL) < 0)
        return 2;
    if (mango_batch_begin() != MANGO_OK)
        return 3;
    set_counter(3);
    int rc = fork_child(true);
    if (rc != 0) {
        fprintf(stderr, "%s: the child's status %d\n", mode, rc);
        return 4;
    }
    if (*counter != 3)
        return 5;
    _exit(0); /* a crash: the open batch (3) is never committed */
}

static void crash_after_child(const char *self, const char *mode, const char *pool)
{
    unlink(pool);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, "test_fork_child", "parent", mode, pool, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
    printf("%s: a process that forked mid-batch and died: status %d\n", mode, rc);
    CHECK(rc == 0);
    CHECK(start(pool, test_mode_named(mode)) == MANGO_RECOVERED);
    printf("%s: recovered counter %llu (999: the child's frame)\n", mode, (unsigned long long)*counter);
    CHECK(*counter == 1);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
}

static void parent_goes_on(const char *mode, const char *pool)
{
    unlink(pool);
    CHECK(start(pool, test_mode_named(mode)) == MANGO_FRESH);
    CHECK(mango_client_cmd(NULL) >= 0); /* 1 */
    int rc = fork_child(false);
    printf("%s: child of a process without a batch open: status %d\n", mode, rc);
    CHECK(rc == 0);
    CHECK(mango_batch_begin() == MANGO_OK);
    set_counter(3);
    rc = fork_child(true);
    printf("%s: child of a process with its batch open: status %d\n", mode, rc);
    CHECK(rc == 0);
    CHECK(mango_batch_end() == MANGO_OK);
    CHECK(mango_client_cmd(NULL) >= 0); /* 4 */
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(start(pool, test_mode_named(mode)) == MANGO_RECOVERED);
    CHECK(*counter == 4);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && strcmp(argv[1], "parent") == 0)
        return crashing_parent(argv[2], argv[3]);
    const char *modes[] = {"emulated", "fs"};
    for (int i = 0; i < 2; i++) {
        char pool[96];
        snprintf(pool, sizeof pool, "%s/mango-fork-%d.pool", i ? "/var/tmp" : "/dev/shm", (int)getpid());
        crash_after_child("/proc/self/exe", modes[i], pool);
        parent_goes_on(modes[i], pool);
    }
    return check_report("test_fork_child");
}
