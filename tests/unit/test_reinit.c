/* test_reinit.c -- mango_init / mango_shutdown / mango_init in one process:
 * the second init recovers the state at the same addresses, and a third init
 * on a new pool starts FRESH with an empty durable heap. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "counter_state.h"
#include "test_config.h"


static int start(const char *pool)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

int main(void)
{
    char a[64], b[64];
    snprintf(a, sizeof a, "/dev/shm/mango-reinit-a-%d.pool", (int)getpid());
    snprintf(b, sizeof b, "/dev/shm/mango-reinit-b-%d.pool", (int)getpid());
    unlink(a);
    unlink(b);
    CHECK(start(a) == MANGO_FRESH);
    int x;
    for (int i = 0; i < 100; i++)
        CHECK(mango_client_cmd(&x) == 0);
    uint64_t *before = counter;
    CHECK(*counter == 100);
    CHECK(mango_shutdown() == 0);

    int st = start(a);
    if (st < 0)
        fprintf(stderr, "second init: %s\n", mango_last_error());
    CHECK(st == MANGO_RECOVERED);
    CHECK(counter == before && *counter == 100);
    CHECK(mango_client_cmd(&x) == 0 && *counter == 101);
    CHECK(mango_shutdown() == 0);

    CHECK(start(b) == MANGO_FRESH);
    CHECK(*counter == 0);
    CHECK(mango_shutdown() == 0);
    unlink(a);
    unlink(b);
    return check_report("test_reinit");
}
