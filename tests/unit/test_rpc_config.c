/* test_rpc_config.c -- mango_rpc_start's checks of its settings say what
 * they checked. A review found "0 worker threads; at most 7" for threads = 0
 * (the default, 8, was refused but 0 printed), and MANGO_RPC_SEND_TIMEOUT_MS
 * taken with leading spaces, a '+' or a '-' (strtoull: "-18446744073709551115"
 * wrapped around to 501 ms). Every such value must now fail with
 * MANGO_EINVAL and a message naming the variable; digits in range work. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "counter_state.h"
#include "test_config.h"


/* mango_rpc_start with `name` set to `value`: must fail with MANGO_EINVAL
 * and name the variable, or (ok) start and stop. */
static void start_with(const char *name, const char *value, bool ok)
{
    setenv(name, value, 1);
    mango_rpc_config rc = {.threads = 1};
    int r = mango_rpc_start(&rc);
    printf("%s=\"%s\": %d %s\n", name, value, r, r ? mango_last_error() : "");
    if (ok) {
        CHECK(r == MANGO_OK);
        if (r == MANGO_OK)
            mango_rpc_stop();
    } else {
        CHECK(r == MANGO_EINVAL);
        CHECK(strstr(mango_last_error(), name) != NULL);
        if (r == MANGO_OK)
            mango_rpc_stop();
    }
    unsetenv(name);
}

int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-rpc-config-%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    cfg.max_threads = 4;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state,
                          .init_client = counter_rpc_init_client, .destroy_client = counter_rpc_destroy_client,
                          .get_response = counter_rpc_get_response};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);

    /* threads = 0 means 8, over max_threads - 1 = 3: the message says 8. */
    mango_rpc_config rc = {0};
    int r = mango_rpc_start(&rc);
    printf("threads 0: %d %s\n", r, mango_last_error());
    CHECK(r == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), "8 worker threads") != NULL);
    CHECK(strstr(mango_last_error(), "at most 3") != NULL);
    if (r == MANGO_OK)
        mango_rpc_stop();
    rc.threads = 5;
    r = mango_rpc_start(&rc);
    CHECK(r == MANGO_EINVAL && strstr(mango_last_error(), "5 worker threads; at most 3") != NULL);

    static const char *const bad[] = {" 500", "+500", "-500", "-18446744073709551115", "500 ", "5e2",
                                      "abc", "99", "3600001", "99999999999999999999999"};
    const char *const names[] = {"MANGO_RPC_SEND_TIMEOUT_MS", "MANGO_RPC_FRAME_TIMEOUT_MS"};
    for (int n = 0; n < 2; n++) {
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
            start_with(names[n], bad[i], false);
        start_with(names[n], "100", true);
        start_with(names[n], "0500", true);
        start_with(names[n], "3600000", true);
    }

    /* max_connections and idle_timeout_ms (session 40): out of range is
     * refused naming the field; the bounds and 0 (the defaults) start. */
    static const struct { uint32_t max_connections, idle_timeout_ms; bool ok; const char *name; } limits[] = {
        {(1u << 20) + 1, 0, false, "max_connections"}, {UINT32_MAX, 0, false, "max_connections"},
        {0, 99, false, "idle_timeout_ms"}, {0, 1, false, "idle_timeout_ms"},
        {0, 86400001, false, "idle_timeout_ms"}, {0, UINT32_MAX, false, "idle_timeout_ms"},
        {1u << 20, 0, true, NULL}, {1, 100, true, NULL}, {0, 86400000, true, NULL}, {0, 0, true, NULL}};
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        mango_rpc_config lc = {.threads = 1, .max_connections = limits[i].max_connections,
                               .idle_timeout_ms = limits[i].idle_timeout_ms};
        r = mango_rpc_start(&lc);
        printf("max_connections %u idle_timeout_ms %u: %d %s\n", lc.max_connections, lc.idle_timeout_ms, r,
               r ? mango_last_error() : "");
        if (limits[i].ok) {
            CHECK(r == MANGO_OK);
        } else {
            CHECK(r == MANGO_EINVAL && strstr(mango_last_error(), limits[i].name) != NULL);
        }
        if (r == MANGO_OK)
            mango_rpc_stop();
    }

    mango_shutdown();
    unlink(pool);
    return check_report("test_rpc_config");
}
