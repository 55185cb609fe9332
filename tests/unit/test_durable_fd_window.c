/* test_durable_fd_window.c -- a ticket handed out is never made durable
 * without the durable eventfd saying so, once a reader has seen it not
 * durable yet.
 *
 * An event loop (durable Redis's, or any mango_client_submit caller) holds
 * a reply whose ticket is past mango_durable_ticket() and polls
 * mango_durable_fd(). An inline ticket (a batch that wrote nothing while no
 * sync was in flight) is made durable by the combiner without writing the
 * eventfd; it stored `submitted` before `durable`, so a reader in between
 * got a ticket not yet durable that then became durable in silence: its
 * reply waited for some later sync, or for good (found by a review, session
 * 39: 2-5 reads in 5 s). Sim mode, pipelined: two threads submit commands
 * that store nothing, one submits reads and, for each read whose ticket is
 * past the durable one, polls the eventfd; a ticket found durable after
 * 200 ms of silence counts as a miss.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

typedef struct cmd {
    int read_only;
} cmd;

static bool is_ro(void *c) { return ((cmd *)c)->read_only; }
static void nothing(void *c) { (void)c; }
static _Atomic int stop;

static void *writer(void *arg)
{
    (void)arg;
    cmd c = {0};
    while (!atomic_load(&stop)) {
        uint64_t t;
        if (mango_client_submit(&c, &t) != MANGO_OK) {
            fprintf(stderr, "writer: %s\n", mango_last_error());
            exit(2);
        }
    }
    return NULL;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

int main(void)
{
    char pool[128];
    snprintf(pool, sizeof pool, "/dev/shm/mango-test-fd-window-%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nothing};
    if (mango_init(&cfg, &cb) < 0) {
        fprintf(stderr, "mango_init: %s\n", mango_last_error());
        return 1;
    }
    int fd = mango_durable_fd();
    CHECK(fd >= 0);
    pthread_t w[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&w[i], NULL, writer, NULL);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long reads = 0, behind = 0, silent = 0, never = 0;
    cmd r = {1};
    while (seconds_since(&t0) < 2.0) {
        uint64_t t = 0, d = 0, v;
        while (read(fd, &v, sizeof v) == sizeof v) {
        }
        CHECK(mango_client_submit(&r, &t) == MANGO_OK);
        reads++;
        CHECK(mango_durable_ticket(&d) == MANGO_OK);
        if (d >= t)
            continue;
        behind++;
        /* As an event loop does: wait for the eventfd, then look again. */
        struct timespec tw;
        clock_gettime(CLOCK_MONOTONIC, &tw);
        for (;;) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            int n = poll(&p, 1, 200);
            mango_durable_ticket(&d);
            if (n > 0 || d >= t) {
                if (n == 0)
                    silent++; /* durable, and the eventfd never said so */
                break;
            }
            if (seconds_since(&tw) > 10) { /* not durable at all */
                never++;
                break;
            }
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(w[i], NULL);
    printf("reads %lu, ticket past the durable one %lu, made durable with the eventfd silent %lu, "
           "never durable %lu\n", reads, behind, silent, never);
    CHECK(silent == 0 && never == 0);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
    return check_report("test_durable_fd_window");
}
