/* test_rpc_config.c -- mango_rpc_start's checks of its settings say what
 * they checked. A review found "0 worker threads; at most 7" for threads = 0
 * (the default, 8, was refused but 0 printed), and MANGO_RPC_SEND_TIMEOUT_MS
 * taken with leading spaces, a '+' or a '-' (strtoull: "-18446744073709551115"
 * wrapped around to 501 ms). Every such value must now fail with
 * MANGO_EINVAL and a message naming the variable; digits in range work. */
#define _GNU_SOURCE
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

    mango_shutdown();
    unlink(pool);
    return check_report("test_rpc_config");
}
