/* test_heap_fits.c -- mango_heap_fits() called outside any batch, while
 * writers on other threads take and free large chunks and fill their first
 * words (where a free chunk keeps its list links) with data: it walks the
 * heap's free lists, so it must look holding the write side (it followed
 * links that had become user data: SIGSEGV within 0.1 s, found by a review,
 * fits_race.c). Also: called from a read-only command, from a paused batch
 * and from a read-write command it answers without waiting for itself.
 *   test_heap_fits [SECONDS]   (default 2)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

enum { SLOTS = 64 };
static char **slots; /* durable array of durable blocks */
static volatile int stop;

typedef struct cmd {
    int op; /* 0: toggle a slot, 1: read-only, asks mango_heap_fits, 2: read-write, asks */
    unsigned r;
    int fits;
} cmd;

static void init_state(void *arg)
{
    (void)arg;
    slots = calloc(SLOTS, sizeof *slots);
    mango_capture(&slots, sizeof slots);
}
static bool is_ro(void *c) { return ((cmd *)c)->op == 1; }
static void process(void *c)
{
    cmd *k = c;
    if (k->op) {
        k->fits = mango_heap_fits(1u << 20) + 2 * mango_heap_fits(1u << 30);
        return;
    }
    unsigned i = k->r % SLOTS;
    if (slots[i]) {
        free(slots[i]);
        slots[i] = NULL;
    } else {
        size_t n = 4096 + (k->r >> 8) % (64 << 10);
        slots[i] = malloc(n);
        if (slots[i]) {
            memset(slots[i], 0x41, 64); /* user data where a free chunk's links were */
            mango_capture(slots[i], 64);
        }
    }
    mango_capture(&slots[i], sizeof slots[i]);
}

static void *writer(void *arg)
{
    unsigned s = (unsigned)(uintptr_t)arg;
    while (!stop) {
        s = s * 1103515245u + 12345u;
        cmd c = {.op = 0, .r = s};
        mango_client_cmd(&c);
    }
    return NULL;
}

static unsigned long looks, fitted;
static void *looker(void *arg)
{
    (void)arg;
    while (!stop) {
        /* More than any free piece: walks the whole large free list. */
        fitted += mango_heap_fits(30u << 20);
        looks++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int secs = argc > 1 ? atoi(argv[1]) : 2;
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/test-heap-fits-%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    cfg.log_size = 8u << 20;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process, .init_state = init_state};
    CHECK(mango_init(&cfg, &cb) == MANGO_FRESH);

    /* From inside the runtime's own sections: no wait for itself. */
    cmd ro = {.op = 1}, rw = {.op = 2};
    CHECK(mango_client_cmd(&ro) == 0 && ro.fits == 1); /* 1 MiB fits, 1 GiB does not (32 MiB pool) */
    CHECK(mango_client_cmd(&rw) == 0 && rw.fits == 1);
    CHECK(mango_batch_begin() == 0);
    CHECK(mango_batch_pause() == 0);
    CHECK(mango_heap_fits(1u << 20) && !mango_heap_fits(1u << 30));
    CHECK(mango_batch_resume() == 0);
    CHECK(mango_heap_fits(1u << 20));
    CHECK(mango_batch_end() == 0);
    CHECK(mango_heap_fits(1u << 20) && !mango_heap_fits(1u << 30));

    pthread_t w[2], l;
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&w[i], NULL, writer, (void *)(uintptr_t)(i + 1)) == 0);
    CHECK(pthread_create(&l, NULL, looker, NULL) == 0);
    sleep((unsigned)secs);
    stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(w[i], NULL);
    pthread_join(l, NULL);
    printf("%lu looks (%lu fitted), no crash\n", looks, fitted);
    CHECK(looks > 0);
    mango_stats st;
    mango_get_stats(&st);
    printf("%llu read-write commands\n", (unsigned long long)st.rw_commands);
    CHECK(mango_shutdown() == 0);
    unlink(pool);
    return check_report("test_heap_fits");
}
