/* test_stopped_error.c -- once a failed sync stops the runtime, every later
 * call fails with MANGO_EFAILED and says why: the stopping error's message
 * ("No space left on device") is part of its own. Before, only the command
 * that hit the failure said it; with several client threads, the one that
 * printed first often said only "stopped after an error". */
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


int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-stopped-%d.pool", (int)getpid());
    unlink(pool);
    /* The 12th sync of the process fails with ENOSPC (read once, at the first sync). */
    setenv("MANGO_FAULT_SYNC", "12:ENOSPC", 1);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    cfg.backend_priority = MANGO_BACKEND_PRIORITY_NORMAL;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);
    int x = 0, rc = 0, i;
    for (i = 0; i < 1000 && rc == 0; i++)
        rc = mango_client_cmd(&x);
    printf("first failure after %d commands: %s: %s\n", i, mango_strerror(rc), mango_last_error());
    CHECK(rc == MANGO_EIO);
    CHECK(strstr(mango_last_error(), "No space left on device") != NULL);

    /* Every later call: EFAILED, and still the cause. */
    rc = mango_client_cmd(&x);
    printf("next command: %s: %s\n", mango_strerror(rc), mango_last_error());
    CHECK(rc == MANGO_EFAILED);
    CHECK(strstr(mango_last_error(), "No space left on device") != NULL);
    rc = mango_batch_begin();
    CHECK(rc == MANGO_EFAILED);
    CHECK(strstr(mango_last_error(), "No space left on device") != NULL);

    /* Shutdown reports the failure again (the pool is left as the crash left
     * it, not marked clean): it returned 0 after a failed pipelined sync
     * (noted by a review, session 37). */
    rc = mango_shutdown();
    printf("shutdown: %s: %s\n", mango_strerror(rc), mango_last_error());
    CHECK(rc == MANGO_EFAILED);
    CHECK(strstr(mango_last_error(), "No space left on device") != NULL);
    unlink(pool);
    return check_report("test_stopped_error");
}
