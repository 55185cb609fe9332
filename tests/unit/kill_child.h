/* kill_child.h -- one round of a unit test's kill loop: run this test
 * binary again as `ARGV0 child MODE POOL FD`, a child that writes each value
 * it saw acknowledged (a uint64_t) to the pipe FD, SIGKILL it after a random
 * min_ms .. min_ms + spread_ms milliseconds, and collect what it reported.
 * Shared by test_batch_submit.c and test_big_batch.c. kill_child_run: run
 * it again as `ARGV0 A1 A2 A3 A4` and wait (a verify step, say). */
#ifndef MANGO_TEST_KILL_CHILD_H
#define MANGO_TEST_KILL_CHILD_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The largest value the child reported, or acked if that is larger; false
 * if the pipe could not be made or the child ended some other way than by
 * the kill (it never exits on its own). */
static inline bool kill_child_round(const char *argv0, const char *mode, const char *pool, int min_ms,
                             int spread_ms, uint64_t *acked)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return false;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        char fdtxt[16];
        snprintf(fdtxt, sizeof fdtxt, "%d", pfd[1]);
        execl("/proc/self/exe", argv0, "child", mode, pool, fdtxt, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    struct timespec ts = {0, (min_ms + rand() % spread_ms) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    uint64_t v;
    while (read(pfd[0], &v, sizeof v) == sizeof v)
        if (v > *acked)
            *acked = v;
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status);
}

/* The exit status of `ARGV0 A1 A2 A3 A4` (this binary), or 128 + the signal
 * that ended it. */
static inline int kill_child_run(const char *argv0, const char *a1, const char *a2, const char *a3, const char *a4)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv0, a1, a2, a3, a4, (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#endif
