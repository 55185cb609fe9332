/* test_log_space_wait_fails.c -- a pipelined log sync that fails while the
 * combiner waits for log space must wake it with the error.
 *
 * Four threads submit 2 KiB writes (mango_client_submit: pipelined group
 * commit) into a 64 KiB log in sim mode with every sync slowed to 30 ms, so
 * the ring fills with sealed frames the sync thread has not synced yet and
 * the combiner waits for space (redo_log_wait_reusable). Then the N-th sync
 * of the log's pipeline fails (MANGO_FAULT_SYNC). Only those frames' sync
 * could have freed the space: before session 36 nothing woke the waiter, so
 * it slept for good holding the write side, every other thread blocked
 * behind it and the backend spun (a review reproduced it 4 times in 4 with
 * N = 3). Each round runs in a child process with a 20 s alarm: every writer
 * must return, with the error, and the child exit.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"

#define BUF_BYTES (1u << 20)
#define WRITE_BYTES 2048
#define WRITERS 4

#include "durable_buffer.h"
#include "test_config.h"

static _Atomic unsigned next_slot;
static _Atomic int writers_done, writers_failed;

static bool is_read_only(void *cmd) { (void)cmd; return false; }

static void process(void *cmd) { write_slot(atomic_fetch_add(&next_slot, 1), WRITE_BYTES, *(int *)cmd & 0xff); }

static void *writer(void *arg)
{
    int value = (int)(intptr_t)arg;
    for (int i = 0; i < 200; i++) {
        uint64_t ticket;
        if (mango_client_submit(&value, &ticket) != MANGO_OK) {
            atomic_fetch_add(&writers_failed, 1);
            break;
        }
    }
    atomic_fetch_add(&writers_done, 1);
    return NULL;
}

/* One round in this (child) process: 0 when every writer returned and one
 * at least saw the failure. */
static int round_main(const char *pool, const char *nth)
{
    setenv("MANGO_SIM_SYNC_DELAY_US", "30000", 1);
    arm_sync_fault(nth, "log.pipeline_sync", 20);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    cfg.log_size = 64u << 10;
    mango_callbacks cb = {.is_read_only = is_read_only, .process_request = process, .init_state = init_state};
    if (mango_init(&cfg, &cb) != MANGO_FRESH)
        return 3;
    pthread_t th[WRITERS];
    for (int i = 0; i < WRITERS; i++)
        pthread_create(&th[i], NULL, writer, (void *)(intptr_t)(i + 1));
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);
    mango_stats st;
    mango_get_stats(&st);
    printf("round (sync %s fails): %d of %d writers stopped on the error, %llu waits for log space\n", nth,
           atomic_load(&writers_failed), WRITERS, (unsigned long long)st.log_full_waits);
    mango_shutdown();
    return atomic_load(&writers_done) == WRITERS && atomic_load(&writers_failed) > 0 ? 0 : 1;
}

int main(void)
{
    char pool[128];
    snprintf(pool, sizeof pool, "/tmp/mango_test_log_space_wait_%d.pool", (int)getpid());
    const char *nths[] = {"2", "3", "4", "5"};
    fflush(stdout);
    for (unsigned i = 0; i < sizeof nths / sizeof nths[0]; i++) {
        unlink(pool);
        pid_t pid = fork();
        if (pid == 0) {
            int rc = round_main(pool, nths[i]);
            fflush(stdout);
            _exit(rc);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        if (WIFSIGNALED(status))
            fprintf(stderr, "round (sync %s fails): the child died of signal %d%s\n", nths[i], WTERMSIG(status),
                    WTERMSIG(status) == SIGALRM ? " (a hang)" : "");
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    unlink(pool);
    return check_report("test_log_space_wait_fails");
}
