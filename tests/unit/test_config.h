/* test_config.h -- the small runtime configuration most unit tests start
 * from: a 32 MiB pool with a 1 MiB log at pool_path, in the given mode (and
 * the mode a test's command line names).
 * Tests set anything else (log size, backend priority) afterwards. */
#ifndef MANGO_TEST_CONFIG_H
#define MANGO_TEST_CONFIG_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

static inline void small_test_config(mango_config *cfg, const char *pool_path, mango_persist_mode mode)
{
    mango_config_default(cfg);
    cfg->pool_path = pool_path;
    cfg->mode = mode;
    cfg->pool_size = 32u << 20;
    cfg->log_size = 1u << 20;
}

/* Fails the nth sync at site (the persist module's fault hook, read at the
 * process's first sync) and ends the process with SIGALRM after alarm_s
 * seconds, so that a hang fails the test instead of stalling it. */
static inline void arm_sync_fault(const char *nth, const char *site, unsigned alarm_s)
{
    setenv("MANGO_FAULT_SYNC", nth, 1);
    setenv("MANGO_FAULT_SYNC_SITE", site, 1);
    alarm(alarm_s);
}

/* Runs fn(pool, arg) in a forked process (stdout flushed before the fork
 * and by the child) and returns its wait status, or -1 if the fork or the
 * wait failed. child_ok(status): it exited with 0. */
static inline int status_of_child(int (*fn)(const char *pool, int arg), const char *pool, int arg)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = fn(pool, arg);
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid ? status : -1;
}

static inline bool child_ok(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

/* Runs child(pool, mode) in a forked process, on a new pool, for emulated
 * then sim mode (a fault hook or a hang must not touch the test process).
 * Returns how many children did not exit with status 0. */
static inline int each_mode_in_a_child(const char *pool, int (*child)(const char *pool, mango_persist_mode mode))
{
    const mango_persist_mode modes[] = {MANGO_PERSIST_EMULATED, MANGO_PERSIST_SIM};
    int failed = 0;
    fflush(stdout);
    for (unsigned i = 0; i < 2; i++) {
        unlink(pool);
        pid_t pid = fork();
        if (pid == 0) {
            int rc = child(pool, modes[i]);
            fflush(stdout);
            _exit(rc);
        }
        int status = 0;
        failed += !(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

/* A mode named on a test's command line: "fs", "sim", else emulated. */
static inline mango_persist_mode test_mode_named(const char *m)
{
    return strcmp(m, "fs") == 0 ? MANGO_PERSIST_FS : strcmp(m, "sim") == 0 ? MANGO_PERSIST_SIM : MANGO_PERSIST_EMULATED;
}

#endif
