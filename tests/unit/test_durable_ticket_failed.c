/* test_durable_ticket_failed.c -- mango_durable_ticket reports a failed
 * inline commit.
 *
 * A batch is opened and its reply's ticket taken (mango_reply_ticket: the
 * open batch's future ticket); its inline commit (mango_batch_end) then
 * fails (MANGO_FAULT_SYNC=3 at log.commit_sync). The batch gets no ticket,
 * so the durable ticket never reaches the reply's: mango_durable_ticket must
 * say so with an error (MANGO_EFAILED, with the cause in the message) and a
 * durable ticket below the reply's. Before the fix it returned MANGO_OK, and
 * a caller holding the reply until that ticket was durable waited for good
 * (a review found it). mango_wait_durable(reply) must return the same
 * error at once: it slept for good, waiting for a ticket the stopped runtime
 * would never hand out (found by a review, session 39; the 30 s alarm ends
 * the child then). Emulated mode (every commit inline) and sim mode with
 * MANGO_PIPELINE=0, each in a child process (the fault settings are read
 * once per process). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

static uint64_t marker; /* durable .bss */

static bool ro(void *c) { (void)c; return false; }
static void proc(void *c) { (void)c; }

static int child(const char *pool, mango_persist_mode mode)
{
    arm_sync_fault("3", "log.commit_sync", 30); /* the first two: init's batch and batch 1 */
    setenv("MANGO_PIPELINE", "0", 1);
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = ro, .process_request = proc};
    if (mango_init(&cfg, &cb) != MANGO_FRESH)
        return 3;
    mango_batch_begin();
    marker = 1;
    mango_capture(&marker, sizeof marker);
    int rc1 = mango_batch_end(); /* succeeds */
    uint64_t d1 = 0;
    int t1 = mango_durable_ticket(&d1);
    mango_batch_begin();
    marker = 2;
    mango_capture(&marker, sizeof marker);
    uint64_t reply = mango_reply_ticket();
    int rc2 = mango_batch_end(); /* fails */
    uint64_t d2 = 0;
    int t2 = mango_durable_ticket(&d2);
    const char *why = mango_last_error();
    bool says_why = strstr(why, "Input/output error") != NULL;
    int w = mango_wait_durable(reply);
    bool wait_says_why = strstr(mango_last_error(), "Input/output error") != NULL;
    printf("%s: batch 1 %d (durable ticket %d, %llu), batch 2 %d, its reply's ticket %llu: durable ticket %d "
           "(%s), %llu\n",
           mode == MANGO_PERSIST_SIM ? "sim" : "emulated", rc1, t1, (unsigned long long)d1, rc2,
           (unsigned long long)reply, t2, why, (unsigned long long)d2);
    printf("  mango_wait_durable(%llu): %d (%s)\n", (unsigned long long)reply, w, mango_last_error());
    mango_shutdown();
    return rc1 == MANGO_OK && t1 == MANGO_OK && rc2 == MANGO_EIO && reply == d1 + 1 && t2 == MANGO_EFAILED &&
                   says_why && d2 < reply && w == MANGO_EFAILED && wait_says_why
               ? 0
               : 1;
}

int main(void)
{
    char pool[128];
    snprintf(pool, sizeof pool, "/tmp/mango_test_durable_ticket_failed_%d.pool", (int)getpid());
    CHECK(each_mode_in_a_child(pool, child) == 0);
    unlink(pool);
    char big[200];
    snprintf(big, sizeof big, "%s.bigbatch", pool);
    unlink(big);
    return check_report("test_durable_ticket_failed");
}
