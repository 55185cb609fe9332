/* test_fork_child.c -- a fork() child never writes the pool. The child
 * inherits the runtime's state, the pool's shared mappings and file, but
 * not its threads: a batch it ended would put its frame in the parent's
 * log, and a shutdown would close the pool under the parent. So in a child
 * every call that would write the pool fails with MANGO_EINVAL (saying
 * why) and leaves it alone, including the end of a batch the parent had
 * open when it forked (an event loop that forks mid-pass, and a child that
 * leaves through exit(), whose handlers end the batch and shut down). The
 * parent goes on, and what it committed is what recovery finds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

static uint64_t *counter; /* .bss, durable: points into the durable heap */

static void init_state(void *arg)
{
    (void)arg;
    counter = malloc(sizeof *counter);
    *counter = 1;
    mango_capture(&counter, sizeof counter);
    mango_capture(counter, sizeof *counter);
}
static bool is_ro(void *c) { (void)c; return false; }
static void bump(void *c)
{
    (void)c;
    (*counter)++;
    mango_capture(counter, sizeof *counter);
}

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

/* In a forked child: every writing call is refused. Exit status: the
 * number of calls that were not. */
static int child_calls(bool batch_open_in_parent)
{
    int bad = 0;
    uint64_t t;
    if (batch_open_in_parent) {
        set_counter(999);
        bad += mango_batch_end() != MANGO_EINVAL;
        fprintf(stderr, "child, mango_batch_end: %s\n", mango_last_error());
    }
    bad += mango_batch_begin() != MANGO_EINVAL;
    bad += mango_batch_submit(&t) != MANGO_EINVAL;
    bad += mango_client_cmd(NULL) != MANGO_EINVAL;
    bad += mango_batch_bulk_begin() != MANGO_EINVAL;
    bad += strstr(mango_last_error(), "fork") == NULL;
    bad += mango_shutdown() != MANGO_EINVAL;
    fprintf(stderr, "child, mango_shutdown: %s\n", mango_last_error());
    return bad;
}

static int fork_and_wait(bool batch_open_in_parent, bool leave_by_exit)
{
    pid_t pid = fork();
    if (pid == 0) {
        int bad = child_calls(batch_open_in_parent);
        if (leave_by_exit)
            exit(bad); /* atexit handlers and stdio flushing run: still nothing written */
        _exit(bad);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static void run(const char *pool, mango_persist_mode mode, const char *name)
{
    unlink(pool);
    CHECK(start(pool, mode) == MANGO_FRESH);
    CHECK(mango_client_cmd(NULL) >= 0); /* counter 2 */
    /* A child of a process with no batch open. */
    int rc = fork_and_wait(false, false);
    printf("%s: child without a batch: %d calls not refused\n", name, rc);
    CHECK(rc == 0);
    /* A child forked while the parent's batch is open; the child ends it. */
    CHECK(mango_batch_begin() == MANGO_OK);
    set_counter(3);
    rc = fork_and_wait(true, true);
    printf("%s: child with the parent's batch open: %d calls not refused\n", name, rc);
    CHECK(rc == 0);
    CHECK(*counter == 3); /* the child's store stayed in its own memory */
    CHECK(mango_batch_end() == MANGO_OK);
    CHECK(mango_client_cmd(NULL) >= 0); /* counter 4: the parent goes on */
    CHECK(mango_shutdown() == MANGO_OK);
    CHECK(start(pool, mode) == MANGO_RECOVERED);
    printf("%s: recovered counter %llu\n", name, (unsigned long long)*counter);
    CHECK(*counter == 4);
    CHECK(mango_client_cmd(NULL) >= 0);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    char pool[96];
    snprintf(pool, sizeof pool, "/dev/shm/mango-fork-%d.pool", (int)getpid());
    run(pool, MANGO_PERSIST_EMULATED, "emulated");
    snprintf(pool, sizeof pool, "/var/tmp/mango-fork-%d.pool", (int)getpid());
    run(pool, MANGO_PERSIST_FS, "fs");
    return check_report("test_fork_child");
}
