/* test_rpc_stats_stop.c -- mango_rpc_get_stats from one thread while
 * another stops the server: the stop must not free the server under the
 * read. A review suspected it could (mango_rpc_get_stats read the server
 * with no lock while mango_rpc_stop freed it). The test links with --wrap
 * around rpc_server_stats and rpc_server_stop (tests/CMakeLists.txt): the
 * stats read sleeps 300 ms inside, the main thread calls mango_rpc_stop
 * 50 ms into it, and a stop that begins while a read is inside is counted
 * (that read then skips the server, which may be freed). With the lock, the
 * stop waits for the read, and the read's counters are the server's. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"
#include "rpc/rpc_server.h"

#include "check.h"
#include "counter_state.h"
#include "test_config.h"

static _Atomic bool in_stats, stop_began;
static _Atomic unsigned stops_during_stats;

void __real_rpc_server_stats(const rpc_server *s, mango_rpc_stats *out);
void __real_rpc_server_stop(rpc_server *s);

void __wrap_rpc_server_stats(const rpc_server *s, mango_rpc_stats *out)
{
    atomic_store(&in_stats, true);
    usleep(300000);
    if (!atomic_load(&stop_began)) /* else the server may be freed: do not touch it */
        __real_rpc_server_stats(s, out);
    atomic_store(&in_stats, false);
}

void __wrap_rpc_server_stop(rpc_server *s)
{
    atomic_store(&stop_began, true);
    if (atomic_load(&in_stats))
        atomic_fetch_add(&stops_during_stats, 1);
    __real_rpc_server_stop(s);
}


static mango_rpc_stats seen;
static void *read_stats(void *arg)
{
    (void)arg;
    mango_rpc_get_stats(&seen);
    return NULL;
}

int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-rpc-stats-%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state,
                          .init_client = counter_rpc_init_client, .destroy_client = counter_rpc_destroy_client,
                          .get_response = counter_rpc_get_response};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);
    mango_rpc_config rc = {.threads = 1};
    CHECK(mango_rpc_start(&rc) == MANGO_OK);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, read_stats, NULL) == 0);
    usleep(50000); /* the read is inside, asleep */
    CHECK(mango_rpc_stop() == MANGO_OK);
    pthread_join(t, NULL);
    printf("stops begun during a stats read: %u\n", atomic_load(&stops_during_stats));
    CHECK(atomic_load(&stops_during_stats) == 0);
    mango_rpc_get_stats(&seen); /* no server: zeros */
    CHECK(seen.accepted == 0 && seen.requests == 0);
    CHECK(mango_rpc_port() < 0);
    mango_shutdown();
    unlink(pool);
    return check_report("test_rpc_stats_stop");
}
