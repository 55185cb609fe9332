/* test_nested_calls.c -- commands and batches do not nest: a call that would
 * wait for the write side its own thread holds back is refused.
 *
 *  - mango_client_cmd and mango_client_submit from inside a read-only
 *    command (its read flag holds writers off: a write waited for good; a
 *    read ended the outer read early);
 *  - mango_batch_begin and mango_client_cmd from inside a read-write
 *    command (the combiner holds the write side);
 *  - mango_client_cmd while an exclusive batch is open on the thread;
 *  - mango_client_cmd from a signal handler that interrupted a read-write
 *    command (the trampoline turns capture off there).
 * Each must return MANGO_EINVAL with a message saying so, and the runtime
 * keeps working, in emulated, sim and none mode (none: no capture at all).
 * Before session 39 (noted by a review of the concurrency core) the first
 * hung; the first version of the check missed none mode and the handler.
 * Each mode runs in a child with a 20 s alarm.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

typedef struct cmd {
    int read_only;
    int nest;   /* what the command calls inside: 0 none, 1 client_cmd, 2 client_submit, 3 batch_begin,
                 * 4 client_cmd from a signal handler */
    int nested_rc;
    char why[200];
} cmd;

static uint64_t counter; /* durable .bss */

static bool is_ro(void *c) { return ((cmd *)c)->read_only; }

static cmd *in_handler; /* the command the handler reports into */

static void handler(int sig)
{
    (void)sig;
    cmd inner = {.read_only = 0};
    in_handler->nested_rc = mango_client_cmd(&inner);
    snprintf(in_handler->why, sizeof in_handler->why, "%s", mango_last_error());
}

static void process(void *arg)
{
    cmd *c = arg;
    if (!c->read_only) {
        counter++;
        mango_capture(&counter, sizeof counter);
    }
    cmd inner = {.read_only = 0};
    uint64_t ticket;
    switch (c->nest) {
    case 1: c->nested_rc = mango_client_cmd(&inner); break;
    case 2: c->nested_rc = mango_client_submit(&inner, &ticket); break;
    case 3: c->nested_rc = mango_batch_begin(); break;
    case 4:
        in_handler = c;
        raise(SIGUSR1);
        return;
    default: return;
    }
    snprintf(c->why, sizeof c->why, "%s", mango_last_error());
}

static bool refused(const cmd *c, const char *what)
{
    bool ok = c->nested_rc == MANGO_EINVAL && strstr(c->why, "do not nest") != NULL;
    if (!ok)
        printf("%s: %d (%s)\n", what, c->nested_rc, c->why);
    return ok;
}

static int child(const char *pool, mango_persist_mode mode)
{
    alarm(20); /* a hang fails the child */
    mango_config cfg;
    small_test_config(&cfg, pool, mode);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process};
    if (mango_init(&cfg, &cb) != MANGO_FRESH)
        return 3;
    int bad = 0;
    cmd c = {.read_only = 1, .nest = 1};
    bad += mango_client_cmd(&c) != MANGO_OK || !refused(&c, "client_cmd in a read");
    cmd s = {.read_only = 1, .nest = 2};
    bad += mango_client_cmd(&s) != MANGO_OK || !refused(&s, "client_submit in a read");
    cmd w = {.read_only = 0, .nest = 3};
    bad += mango_client_cmd(&w) != MANGO_OK || !refused(&w, "batch_begin in a write");
    cmd w2 = {.read_only = 0, .nest = 1};
    bad += mango_client_cmd(&w2) != MANGO_OK || !refused(&w2, "client_cmd in a write");
    signal(SIGUSR1, handler);
    cmd h = {.read_only = 0, .nest = 4};
    bad += mango_client_cmd(&h) != MANGO_OK || !refused(&h, "client_cmd in a handler during a write");
    bad += mango_batch_begin() != MANGO_OK;
    cmd in_batch = {.read_only = 0};
    int rc = mango_client_cmd(&in_batch);
    bad += rc != MANGO_EINVAL || strstr(mango_last_error(), "do not nest") == NULL;
    bad += mango_batch_end() != MANGO_OK;
    cmd plain = {.read_only = 0};
    bad += mango_client_cmd(&plain) != MANGO_OK; /* still working */
    bad += counter != 4; /* the three writes that nested, and the last one */
    bad += mango_shutdown() != MANGO_OK;
    printf("%s: %d checks failed\n",
           mode == MANGO_PERSIST_SIM ? "sim" : mode == MANGO_PERSIST_NONE ? "none" : "emulated", bad);
    return bad ? 1 : 0;
}

static int child_none(const char *pool, int unused)
{
    (void)unused;
    return child(pool, MANGO_PERSIST_NONE);
}

int main(void)
{
    char pool[128];
    snprintf(pool, sizeof pool, "/dev/shm/mango-test-nested-%d.pool", (int)getpid());
    CHECK(each_mode_in_a_child(pool, child) == 0);
    CHECK(child_ok(status_of_child(child_none, pool, 0)));
    unlink(pool);
    return check_report("test_nested_calls");
}
