/* test_head_sync_fails.c -- a failed sync of the log head stops the backend
 * for good, wherever it was written.
 *
 * One writer fills a 64 KiB log (sim mode) with 2 KiB commands, so it keeps
 * waiting for log space; the backend then writes the head both at the end of
 * a round and, while the writer waits, once more on its own (to move the
 * older head slot along: backend.c). The N-th "head.sync" fails
 * (MANGO_FAULT_SYNC_SITE), for N over a range, so both writes are hit (which
 * one a given N hits depends on timing). Before the fix a failed rewrite
 * was only counted and retried: the retry "succeeded", the waiting writer's
 * command was acknowledged, mango_shutdown returned 0 and marked the head
 * clean; a rewrite that kept failing left the writer asleep for good while
 * the backend spun (a review found both). Each N runs in a child with a 20 s
 * alarm; after the failure:
 *   - no head.sync is issued again (a failed sync is never retried),
 *   - the writer returns with an error (no hang),
 *   - mango_shutdown reports an error and neither head slot is clean.
 * And a shutdown whose own drain's head sync fails (a new pool, no
 * commands): it returns an error whose message names the failed sync (it
 * said "no error": the backend's message stayed on its thread; found by a
 * review, session 39).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"
#include "persist/persist.h"
#include "pool/pool_format.h"

#include "check.h"

#define BUF_BYTES (1u << 20)
#include "durable_buffer.h"
#include "test_config.h"

static _Atomic unsigned next_slot;
static _Atomic int head_syncs, fail_at, failed_flag, head_syncs_after;

static bool is_read_only(void *cmd) { (void)cmd; return false; }
static void process(void *cmd) { (void)cmd; write_slot(atomic_fetch_add(&next_slot, 1), 2048, 7); }

static void observe(persist_event ev, const void *a, size_t len, const char *where)
{
    (void)a;
    (void)len;
    if (ev != PERSIST_EV_SYNC || !where || strcmp(where, "head.sync") != 0)
        return;
    if (atomic_load(&failed_flag))
        atomic_fetch_add(&head_syncs_after, 1);
    if (atomic_fetch_add(&head_syncs, 1) + 1 == atomic_load(&fail_at))
        atomic_store(&failed_flag, 1);
}

/* One N in this (child) process: 0 if every check holds. */
static int round_main(const char *pool, int n)
{
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    arm_sync_fault(nbuf, "head.sync", 20);
    atomic_store(&fail_at, n);
    persist_set_observer(observe);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    cfg.log_size = 64u << 10;
    mango_callbacks cb = {.is_read_only = is_read_only, .process_request = process, .init_state = init_state};
    if (mango_init(&cfg, &cb) != MANGO_FRESH)
        return 3;
    int refused = 0, i;
    for (i = 0; i < 2000 && !refused; i++) {
        int c = 0;
        refused = mango_client_cmd(&c) != MANGO_OK;
    }
    int src = mango_shutdown();
    persist_set_observer(NULL);
    pool_head_slot sl[2];
    FILE *fp = fopen(pool, "rb");
    bool read_ok = fp && fseek(fp, POOL_HEAD_OFFSET, SEEK_SET) == 0 && fread(sl, sizeof sl, 1, fp) == 1;
    if (fp)
        fclose(fp);
    bool clean = read_ok && (sl[0].clean || sl[1].clean);
    printf("N=%-2d failed=%d commands=%d refused=%d head.syncs after the failure=%d shutdown=%d clean=%d\n", n,
           atomic_load(&failed_flag), i, refused, atomic_load(&head_syncs_after), src, clean);
    if (!atomic_load(&failed_flag))
        return 4; /* the N-th head.sync never came */
    return refused && atomic_load(&head_syncs_after) == 0 && src != MANGO_OK && read_ok && !clean ? 0 : 1;
}

/* No commands: the 3rd head.sync is the shutdown drain's (a new pool's
 * start makes two). */
static int shutdown_round(const char *pool, int unused)
{
    (void)unused;
    arm_sync_fault("3", "head.sync", 20);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_SIM);
    mango_callbacks cb = {.is_read_only = is_read_only, .process_request = process, .init_state = init_state};
    if (mango_init(&cfg, &cb) != MANGO_FRESH)
        return 3;
    int src = mango_shutdown();
    const char *why = mango_last_error();
    printf("shutdown with its head sync failing: %d, \"%s\"\n", src, why);
    return src != MANGO_OK && strstr(why, "sync") != NULL ? 0 : 1;
}

int main(void)
{
    char pool[128], big[160];
    snprintf(pool, sizeof pool, "/tmp/mango_test_head_sync_fails_%d.pool", (int)getpid());
    snprintf(big, sizeof big, "%s.bigbatch", pool);
    for (int n = 3; n <= 14; n++) {
        unlink(pool);
        int status = status_of_child(round_main, pool, n);
        CHECK(status != -1);
        if (status != -1 && WIFSIGNALED(status))
            fprintf(stderr, "N=%d: the child died of signal %d%s\n", n, WTERMSIG(status),
                    WTERMSIG(status) == SIGALRM ? " (a hang)" : "");
        CHECK(child_ok(status));
    }
    unlink(pool);
    CHECK(child_ok(status_of_child(shutdown_round, pool, 0)));
    unlink(pool);
    unlink(big);
    return check_report("test_head_sync_fails");
}
