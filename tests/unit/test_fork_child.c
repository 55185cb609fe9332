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
#include <fcntl.h>
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
    if (fcntl(0, F_GETFD) == -1) { /* the handler closes the pool's descriptors, nothing else */
        fprintf(stderr, "child: descriptor 0 was closed\n");
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

/* Part 3's process: opens the pool (recovering it: its heap is then mapped
 * from the pool file), forks a child that lingers 5 s, writes the child's
 * pid to pidfile and dies at once. */
static int parent_with_lingering_child(const char *mode, const char *pool, const char *pidfile)
{
    if (start(pool, test_mode_named(mode)) != MANGO_RECOVERED || mango_client_cmd(NULL) < 0)
        return 2;
    int ready[2];
    if (pipe(ready) != 0)
        return 3;
    pid_t pid = fork();
    if (pid == 0) { /* the fork handler has run by now: say so */
        close(ready[0]);
        if (write(ready[1], "r", 1) != 1)
            _exit(1);
        sleep(5);
        _exit(0);
    }
    char c;
    close(ready[1]);
    if (read(ready[0], &c, 1) != 1) /* (the window before the handler: a parent dying in it leaves it) */
        return 3;
    FILE *f = fopen(pidfile, "w");
    if (!f)
        return 3;
    fprintf(f, "%d\n", (int)pid);
    fclose(f);
    _exit(0); /* a crash, with the child still running */
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

/* Part 3: a child that outlives its parent (a snapshot writer after a
 * crash) does not keep the pool locked: the restart opens it while the
 * child runs. (Before, the child's copies of the pool's mapping and
 * descriptor kept the lock: "in use by another process" until it exited.) */
static void restart_beside_lingering_child(const char *self, const char *mode, const char *pool)
{
    unlink(pool);
    CHECK(start(pool, test_mode_named(mode)) == MANGO_FRESH); /* a pool to recover, with its heap mapped */
    CHECK(mango_client_cmd(NULL) >= 0);
    CHECK(mango_shutdown() == MANGO_OK);
    char pidfile[128];
    snprintf(pidfile, sizeof pidfile, "%s.child", pool);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, "test_fork_child", "linger", mode, pool, pidfile, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int child = 0;
    FILE *f = fopen(pidfile, "r");
    CHECK(f && fscanf(f, "%d", &child) == 1 && child > 0);
    if (f)
        fclose(f);
    unlink(pidfile);
    bool alive = child > 0 && kill(child, 0) == 0;
    int rc = start(pool, test_mode_named(mode));
    printf("%s: restart while the dead process's child %s: %d %s\n", mode, alive ? "runs" : "had ended", rc,
           rc < 0 ? mango_last_error() : "");
    CHECK(alive);
    CHECK(rc == MANGO_RECOVERED);
    CHECK(rc != MANGO_RECOVERED || *counter == 2);
    if (rc == MANGO_RECOVERED)
        CHECK(mango_shutdown() == MANGO_OK);
    if (child > 0)
        kill(child, SIGKILL);
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
    if (fcntl(0, F_GETFD) == -1 && open("/dev/null", O_RDONLY) != 0) /* (children check it stays open) */
        return check_report("test_fork_child: no descriptor 0");
    if (argc >= 4 && strcmp(argv[1], "parent") == 0)
        return crashing_parent(argv[2], argv[3]);
    if (argc >= 5 && strcmp(argv[1], "linger") == 0)
        return parent_with_lingering_child(argv[2], argv[3], argv[4]);
    const char *modes[] = {"emulated", "fs"};
    for (int i = 0; i < 2; i++) {
        char pool[96];
        snprintf(pool, sizeof pool, "%s/mango-fork-%d.pool", i ? "/var/tmp" : "/dev/shm", (int)getpid());
        crash_after_child("/proc/self/exe", modes[i], pool);
        parent_goes_on(modes[i], pool);
        restart_beside_lingering_child("/proc/self/exe", modes[i], pool);
    }
    return check_report("test_fork_child");
}
