/* test_deferred_free.c -- durable objects freed outside read-write commands
 * (queued for the next batch, split_alloc.c) around mango_shutdown:
 *
 *  - frees still queued at a clean shutdown are done by its last batch,
 *    durably: the pool, opened again, holds only what the state reaches
 *    (they were lost, and the pool kept the objects for good);
 *  - a free made after mango_shutdown does nothing (nothing is queued), and
 *    the next mango_init, recovering the same pool (where the object is
 *    live) or making a new one, frees nothing it did not hand out (the
 *    queued free used to be applied there: a live object handed out twice,
 *    or an abort on a pointer the new heap never gave);
 *  - frees queued while a batch is open (made while it is paused, or by
 *    another thread) are done by that batch: a process that ends right
 *    after it, with no other batch and no mango_shutdown (a crash), leaves
 *    a pool that recovers with them freed. They used to wait for the next
 *    batch, and a crash before it kept the objects for good (durable
 *    Redis: an EXEC's argument copies released after its last command).
 *
 * Found by a review of the heap (deferred_reinit.c, deferred_shutdown_leak.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/split_alloc.h"
#include "mango.h"

#include "check.h"
#include "counter_state.h"
#include "test_config.h"

static char *keep, *keep2; /* .bss: durable */

static int start(const char *pool)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
    int rc = mango_init(&cfg, &cb);
    if (rc < 0)
        fprintf(stderr, "mango_init: %s\n", mango_last_error());
    return rc;
}

static uint64_t chunks(void)
{
    mango_stats s;
    mango_get_stats(&s);
    return s.heap_chunks;
}

static void *free_elsewhere(void *p)
{
    free(p); /* not a read-write thread: queued */
    return NULL;
}

/* keep = a new durable object of n bytes filled with c, in a batch. */
static void make_keep(size_t n, char c)
{
    CHECK(mango_batch_begin() == 0);
    keep = malloc(n);
    CHECK(keep != NULL);
    memset(keep, c, n);
    mango_capture(keep, n);
    mango_capture(&keep, sizeof keep);
    CHECK(mango_batch_end() == 0);
}

int main(void)
{
    char a[64], b[64];
    snprintf(a, sizeof a, "/dev/shm/test-deferred-free-a-%d.pool", (int)getpid());
    snprintf(b, sizeof b, "/dev/shm/test-deferred-free-b-%d.pool", (int)getpid());
    unlink(a);
    unlink(b);

    /* 1. A free pending at shutdown: done by shutdown's last batch. */
    CHECK(start(a) == MANGO_FRESH);
    CHECK(chunks() == 1); /* the counter */
    make_keep(5000, 'L');
    char *x = keep;
    CHECK(mango_batch_begin() == 0);
    keep = NULL; /* unlinked in a committed batch, freed later by another thread */
    mango_capture(&keep, sizeof keep);
    CHECK(mango_batch_end() == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_elsewhere, x) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(split_alloc_deferred_pending());
    CHECK(chunks() == 2); /* queued, not yet freed */
    CHECK(mango_shutdown() == 0);
    CHECK(!split_alloc_deferred_pending());
    CHECK(start(a) == MANGO_RECOVERED); /* reads the pool's mirror */
    CHECK(keep == NULL);
    CHECK(chunks() == 1);

    /* 2. A free after shutdown, same pool next: nothing is queued, and the
     * recovered object stays live and is not handed out again. */
    make_keep(100, 'K');
    x = keep;
    CHECK(mango_shutdown() == 0);
    free(x); /* the pool is closed: does nothing */
    CHECK(!split_alloc_deferred_pending());
    CHECK(x[0] == 'K'); /* the heap is still mapped: readable */
    CHECK(start(a) == MANGO_RECOVERED);
    CHECK(keep == x && keep[0] == 'K');
    CHECK(chunks() == 2);
    CHECK(mango_batch_begin() == 0); /* would drain a queued free of keep */
    char *y = malloc(100);
    CHECK(y != NULL && y != keep);
    memset(y, 'Y', 100);
    mango_capture(y, 100);
    CHECK(mango_batch_end() == 0);
    CHECK(keep[0] == 'K');
    CHECK(chunks() == 3);

    /* 3. A free after shutdown, a new pool next: its first batch frees
     * nothing (it aborted on the pointer, which the new heap never gave). */
    x = keep;
    CHECK(mango_shutdown() == 0);
    free(x);
    free(y);
    CHECK(!split_alloc_deferred_pending());
    CHECK(start(b) == MANGO_FRESH);
    CHECK(chunks() == 1);
    CHECK(mango_batch_begin() == 0);
    CHECK(mango_batch_end() == 0);
    CHECK(chunks() == 1);
    /* and the queue is open again on the new heap: */
    make_keep(300, 'N');
    CHECK(chunks() == 2);
    x = keep;
    CHECK(mango_batch_begin() == 0);
    keep = NULL;
    mango_capture(&keep, sizeof keep);
    CHECK(mango_batch_end() == 0);
    CHECK(pthread_create(&t, NULL, free_elsewhere, x) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(split_alloc_deferred_pending());
    CHECK(mango_batch_begin() == 0); /* drains it */
    CHECK(mango_batch_end() == 0);
    CHECK(!split_alloc_deferred_pending());
    CHECK(chunks() == 1);
    CHECK(mango_shutdown() == 0);

    /* 4. Frees queued while the batch is open are done by it. The child
     * ends without mango_shutdown right after the batch (a crash). */
    unlink(b);
    pid_t pid = fork();
    if (pid == 0) {
        CHECK(start(b) == MANGO_FRESH);
        make_keep(700, 'P');
        keep2 = keep;
        mango_capture(&keep2, sizeof keep2);
        make_keep(900, 'Q');
        CHECK(chunks() == 3);
        char *p = keep, *q = keep2;
        CHECK(mango_batch_begin() == 0);
        keep = keep2 = NULL;
        mango_capture(&keep, sizeof keep);
        mango_capture(&keep2, sizeof keep2);
        CHECK(mango_batch_pause() == 0);
        free(p); /* paused: queued */
        CHECK(mango_batch_resume() == 0);
        CHECK(pthread_create(&t, NULL, free_elsewhere, q) == 0); /* queued */
        CHECK(pthread_join(t, NULL) == 0);
        CHECK(split_alloc_deferred_pending());
        CHECK(mango_batch_end() == 0); /* does both frees */
        CHECK(!split_alloc_deferred_pending());
        CHECK(chunks() == 1);
        fflush(stdout);
        _exit(check_failed ? 1 : 0); /* no shutdown, no other batch */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(start(b) == MANGO_RECOVERED);
    CHECK(keep == NULL && keep2 == NULL);
    CHECK(chunks() == 1);
    CHECK(mango_shutdown() == 0);

    unlink(a);
    unlink(b);
    return check_report("test_deferred_free");
}
