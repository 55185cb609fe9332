/* test_rpc_shutdown.c -- mango_shutdown with an RPC server still running
 * stops the server's durability listener before it frees the server.
 *
 * In fs and sim modes the commit pipeline calls the RPC server's listener
 * (rpc_server_durable_advanced) after every durable advance, including the
 * inline commit of mango_shutdown's own last batch. A review found that
 * mango_shutdown, unlike mango_rpc_stop, freed the server first: the sync
 * thread then read freed memory and wrote to closed eventfds (a SIGSEGV with
 * MALLOC_PERTURB_). The test links with --wrap around the listener and
 * rpc_server_stop (tests/CMakeLists.txt): a listener call after the server
 * began to stop is counted, so the check needs no luck with the allocator.
 * Syncs are slowed to 300 ms, and shutdown starts while a write of a second
 * connection waits for its sync: the stopping worker waits for it, and the
 * sync's end then falls inside rpc_server_stop. The held response must
 * still reach its client before the connection is closed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mango.h"
#include "rpc/rpc_server.h"

#include "check.h"
#include "test_config.h"

static _Atomic bool server_stopping;
static _Atomic unsigned listener_calls, calls_after_stop;

void __real_rpc_server_durable_advanced(void *arg, uint64_t durable, bool failed);
void __real_rpc_server_stop(rpc_server *s);

void __wrap_rpc_server_durable_advanced(void *arg, uint64_t durable, bool failed)
{
    atomic_fetch_add(&listener_calls, 1);
    if (atomic_load(&server_stopping)) {
        atomic_fetch_add(&calls_after_stop, 1); /* the server may be freed: do not touch it */
        return;
    }
    __real_rpc_server_durable_advanced(arg, durable, failed);
}

void __wrap_rpc_server_stop(rpc_server *s)
{
    atomic_store(&server_stopping, true);
    __real_rpc_server_stop(s);
}

/* A durable counter; every request adds 1 and answers the new value. */
static uint64_t *counter;
typedef struct client {
    uint64_t reply;
} client;

static void init_state(void *arg)
{
    (void)arg;
    counter = calloc(1, sizeof *counter);
    mango_capture(&counter, sizeof counter);
    mango_capture(counter, sizeof *counter);
}
static void *init_client(void *params)
{
    (void)params;
    return calloc(1, sizeof(client));
}
static void destroy_client(void *ctx) { free(ctx); }
static bool is_read_only(void *ctx)
{
    (void)ctx;
    return false;
}
static void process(void *ctx)
{
    ++*counter;
    mango_capture(counter, sizeof *counter); /* (this file is not built with the capture plugin) */
    ((client *)ctx)->reply = *counter;
}
static mango_response get_response(void *ctx) { return (mango_response){&((client *)ctx)->reply, 8}; }

static bool recv_all(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
        if (k <= 0)
            return false;
        got += (size_t)k;
    }
    return true;
}

int main(void)
{
    setenv("MANGO_SIM_SYNC_DELAY_US", "300000", 1);
    char pool[] = "/tmp/mango-test-rpc-shutdown-XXXXXX";
    int tmp = mkstemp(pool);
    CHECK(tmp >= 0);
    close(tmp);
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    mango_callbacks cb = {.init_client = init_client, .destroy_client = destroy_client,
                          .is_read_only = is_read_only, .process_request = process,
                          .get_response = get_response, .init_state = init_state};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);
    CHECK(mango_commit_is_pipelined()); /* sim mode: the listener is installed */
    mango_rpc_config rc = {.threads = 1};
    CHECK(mango_rpc_start(&rc) == MANGO_OK);

    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)mango_rpc_port())};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0), fd2 = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(connect(fd2, (struct sockaddr *)&a, sizeof a) == 0);
    uint8_t req[5] = {1, 0, 0, 0, 'A'}, resp[12];
    for (uint64_t i = 1; i <= 2; i++) {
        uint64_t v = 0;
        CHECK(send(fd, req, sizeof req, 0) == (ssize_t)sizeof req);
        CHECK(recv_all(fd, resp, sizeof resp));
        memcpy(&v, resp + 4, sizeof v);
        CHECK(v == i);
    }
    CHECK(send(fd2, req, sizeof req, 0) == (ssize_t)sizeof req);
    /* It runs, and waits for its 300 ms sync: wait until its batch is in
     * flight (a fixed 50 ms could pass before a busy machine's worker read
     * the request, and the shutdown would then have nothing to answer). */
    bool flying = false;
    for (int i = 0; i < 50000 && !flying; i++) {
        mango_stats st;
        mango_get_stats(&st);
        flying = st.batches_in_flight > 0;
        if (!flying) usleep(100);
    }
    CHECK(flying);

    /* No mango_rpc_stop: shutdown stops the server itself. */
    CHECK(mango_shutdown() == MANGO_OK);
    printf("listener calls: %u, after the server began to stop: %u\n", atomic_load(&listener_calls),
           atomic_load(&calls_after_stop));
    CHECK(atomic_load(&listener_calls) > 0);
    CHECK(atomic_load(&calls_after_stop) == 0);
    uint64_t v = 0;
    CHECK(recv_all(fd2, resp, sizeof resp)); /* answered before the close */
    memcpy(&v, resp + 4, sizeof v);
    CHECK(v == 3);
    close(fd);
    close(fd2);
    unlink(pool);
    return check_report("test_rpc_shutdown");
}
