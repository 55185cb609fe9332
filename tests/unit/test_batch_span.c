/* test_batch_span.c -- event-loop mode: mango_batch_begin/end bracket many
 * commands executed by the caller into one durable batch; readers on other
 * threads never see a half-applied span; the state survives a restart. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

static uint64_t *pair; /* durable: two counters kept equal by every batch */

static void init_state(void *arg)
{
    pair = calloc(2, sizeof *pair);
    mango_capture(&pair, sizeof pair);
    mango_capture(pair, 2 * sizeof *pair);
}
static bool is_ro(void *c) { return true; }
static _Atomic int torn_reads, stop;
static void read_pair(void *c)
{
    if (pair[0] != pair[1])
        atomic_fetch_add(&torn_reads, 1);
}
static void *reader(void *arg)
{
    int x;
    while (!atomic_load(&stop))
        mango_client_cmd(&x);
    return NULL;
}

static int start(const char *pool)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = read_pair, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-batch-%d.pool", (int)getpid());
    unlink(pool);
    CHECK(start(pool) == MANGO_FRESH);
    pthread_t r[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&r[i], NULL, reader, NULL);
    mango_stats s0, s1;
    mango_get_stats(&s0);
    for (int b = 0; b < 2000; b++) {
        CHECK(mango_batch_begin() == 0);
        CHECK(mango_batch_open());
        for (int k = 0; k < 10; k++) { /* ten "commands" in one batch */
            pair[0]++;
            mango_capture(&pair[0], 8);
            pair[1]++;
            mango_capture(&pair[1], 8);
        }
        CHECK(mango_batch_end() == 0);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(r[i], NULL);
    mango_get_stats(&s1);
    CHECK(pair[0] == 20000 && pair[1] == 20000);
    CHECK(atomic_load(&torn_reads) == 0);
    CHECK(s1.batches - s0.batches == 2000);
    CHECK(s1.frontend_syncs - s0.frontend_syncs == 2000); /* one sync per span */
    /* pause/resume: allocations while paused are transient, durable again after */
    CHECK(mango_batch_pause() == MANGO_EINVAL); /* no batch open */
    CHECK(mango_batch_begin() == 0);
    void *durable = malloc(64);
    CHECK(mango_batch_pause() == 0);
    void *transient = malloc(64);
    CHECK(!mango_in_rw_command());
    CHECK(mango_batch_resume() == 0);
    void *durable2 = malloc(64);
    CHECK((uintptr_t)durable >= 0x600000000000ull && (uintptr_t)durable2 >= 0x600000000000ull);
    CHECK((uintptr_t)transient < 0x600000000000ull);
    free(durable);
    free(durable2);
    CHECK(mango_batch_pause() == 0);
    CHECK(mango_batch_end() == 0); /* ends while paused */
    free(transient);
    CHECK(mango_batch_end() == MANGO_EINVAL);              /* nothing open */
    CHECK(mango_batch_begin() == 0 && mango_batch_begin() == MANGO_EINVAL && mango_batch_end() == 0);
    CHECK(mango_shutdown() == 0);
    CHECK(start(pool) == MANGO_RECOVERED);
    CHECK(pair[0] == 20000 && pair[1] == 20000);
    CHECK(mango_shutdown() == 0);
    unlink(pool);
    return check_report("test_batch_span");
}
