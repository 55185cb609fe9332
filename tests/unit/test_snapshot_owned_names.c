/* test_snapshot_owned_names.c -- mango_snapshot refuses a path named like a
 * file that some pool owns ("<x>.tmp.<pid>", "<x>.copying-<pid>",
 * "<x>.bigbatch"), not only the live pool's own names: such a file is
 * removed by the next creation of, copy to, or open of <x>.
 *
 * Before the fix a snapshot to "<dir>/s.snap.tmp.2000000000" (a pid no
 * process has) was reported done, and the next snapshot to "<dir>/s.snap"
 * removed it as the leftover of a dead creation (found by a review). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

static bool ro(void *c) { (void)c; return false; }
static void proc(void *c) { (void)c; }

int main(void)
{
    char pool[128], snap[160], owned[3][200];
    snprintf(pool, sizeof pool, "/dev/shm/mango_test_snapshot_owned_names_%d.pool", (int)getpid());
    snprintf(snap, sizeof snap, "/dev/shm/mango_test_snapshot_owned_names_%d.snap", (int)getpid());
    snprintf(owned[0], sizeof owned[0], "%s.tmp.2000000000", snap);
    snprintf(owned[1], sizeof owned[1], "%s.copying-2000000000", snap);
    snprintf(owned[2], sizeof owned[2], "%s.bigbatch", snap);
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = ro, .process_request = proc};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);
    CHECK(mango_client_cmd(NULL) == 0);
    for (int i = 0; i < 3; i++) {
        unlink(owned[i]);
        int crc = mango_snapshot_check_path(owned[i]);
        int rc = mango_snapshot(owned[i], NULL);
        printf("snapshot to %s: check %d, snapshot %d %s\n", owned[i], crc, rc, rc ? mango_last_error() : "");
        CHECK(crc == MANGO_EINVAL && rc == MANGO_EINVAL && access(owned[i], F_OK) != 0);
    }
    /* What the refusal prevents: the next snapshot to snap removed the first. */
    bool kept = true;
    if (access(owned[0], F_OK) == 0) {
        CHECK(mango_snapshot(snap, NULL) == MANGO_OK);
        kept = access(owned[0], F_OK) == 0;
        printf("the first snapshot after one to its own path: %s\n", kept ? "kept" : "removed");
    }
    CHECK(kept);
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
    unlink(snap);
    for (int i = 0; i < 3; i++)
        unlink(owned[i]);
    return check_report("test_snapshot_owned_names");
}
