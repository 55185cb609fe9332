/* test_reinit.c -- mango_init / mango_shutdown / mango_init in one process:
 * the second init recovers the state at the same addresses, and a third init
 * on a new pool starts FRESH with an empty durable heap. Also: a max_threads
 * past the limit is refused before the pool is made (it used to fail after,
 * with no message, leaving the heap reserved so a corrected retry failed),
 * a thread past max_threads gets a message, and an init that fails after
 * making its pool removes it. */
#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "counter_state.h"
#include "test_config.h"


static int start_with(const char *pool, unsigned max_threads)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    cfg.max_threads = max_threads;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

static int start(const char *pool) { return start_with(pool, 0); }

static sem_t called, release;
static int thread_rc;
static char thread_error[256];

/* Calls in once, then keeps its slot (alive) until released. */
static void *holder(void *arg)
{
    (void)arg;
    int x;
    thread_rc = mango_client_cmd(&x);
    sem_post(&called);
    sem_wait(&release);
    return NULL;
}

/* Calls in once and records the error. */
static void *latecomer(void *arg)
{
    (void)arg;
    int x;
    thread_rc = mango_client_cmd(&x);
    snprintf(thread_error, sizeof thread_error, "%s", mango_last_error());
    return NULL;
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

    /* A heap_base that cannot be reserved (a range this process has mapped
     * already): the pool this init made is removed, so a retry at the
     * default address makes a new one instead of being refused as another
     * layout. */
    {
        mango_config cfg;
        small_test_config(&cfg, a, MANGO_PERSIST_EMULATED);
        void *taken = mmap(NULL, 256u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        CHECK(taken != MAP_FAILED);
        cfg.heap_base = (uintptr_t)taken;
        mango_callbacks cb = {.is_read_only = is_ro, .process_request = bump, .init_state = init_state};
        int rc = mango_init(&cfg, &cb);
        if (rc != MANGO_ENOMEM) fprintf(stderr, "rc %d: %s\n", rc, mango_last_error());
        CHECK(rc == MANGO_ENOMEM);
        CHECK(strstr(mango_last_error(), "cannot reserve the durable heap") != NULL);
        CHECK(access(a, F_OK) != 0);
        munmap(taken, 256u << 20);
        CHECK(start(a) == MANGO_FRESH);
        CHECK(mango_shutdown() == 0);
        unlink(a);
    }

    /* max_threads past the limit: refused before any pool exists. */
    CHECK(start_with(a, 70000) == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), "max_threads 70000") != NULL);
    CHECK(access(a, F_OK) != 0);
    CHECK(start_with(a, 2) == MANGO_FRESH); /* a corrected retry in the same process */

    /* A third thread with max_threads 2 (the main thread and a live holder
     * keep theirs). */
    sem_init(&called, 0, 0);
    sem_init(&release, 0, 0);
    pthread_t h, l;
    CHECK(mango_client_cmd(&x) == 0);
    CHECK(pthread_create(&h, NULL, holder, NULL) == 0);
    sem_wait(&called);
    CHECK(thread_rc == 0);
    CHECK(pthread_create(&l, NULL, latecomer, NULL) == 0);
    pthread_join(l, NULL);
    CHECK(thread_rc == MANGO_EINVAL);
    CHECK(strstr(thread_error, "more than mango_config.max_threads (2)") != NULL);
    sem_post(&release);
    pthread_join(h, NULL);
    CHECK(mango_client_cmd(&x) == 0 && *counter == 3); /* the latecomer's did not run */
    CHECK(mango_shutdown() == 0);
    unlink(a);
    return check_report("test_reinit");
}
