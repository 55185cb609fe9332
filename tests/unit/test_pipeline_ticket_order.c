/* test_pipeline_ticket_order.c -- an inline ticket is durable before it is
 * handed out (src/log/commit_pipeline.c).
 *
 * Lock-free readers (read_target, mango_reply_ticket) load the last ticket
 * handed out (`submitted`), then the durable one; one that sees ticket t
 * handed out but not durable waits for the durable eventfd, which an inline
 * ticket never writes. pipeline_ticket_inline stored `submitted` before
 * `durable`, so a reader in between waited for a wake-up that never came
 * (found by a review, session 39; test_durable_fd_window sees it through
 * the public API, but only now and then). Here one thread hands out inline
 * tickets as fast as it can while another loads the pair as the readers do,
 * for 0.5 s: the durable ticket must never be behind the one handed out.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "log/commit_pipeline.h"

#include "check.h"

static commit_pipeline pipe_;
static _Atomic int stop;

static void *hand_out(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        pipeline_ticket_inline(&pipe_);
    return NULL;
}

int main(void)
{
    CHECK(pipeline_start(&pipe_, NULL, false, NULL, NULL) == 0); /* tickets only */
    pthread_t t;
    pthread_create(&t, NULL, hand_out, NULL);
    unsigned long looks = 0, behind = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 10000; i++) {
            uint64_t handed = atomic_load(&pipe_.submitted);
            uint64_t durable = atomic_load(&pipe_.durable);
            behind += durable < handed;
            looks++;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9 < 0.5);
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("%lu looks at (handed out, durable), %lu with the inline ticket handed out and not durable; "
           "%llu tickets\n", looks, behind, (unsigned long long)atomic_load(&pipe_.submitted));
    CHECK(behind == 0);
    CHECK(pipeline_stop(&pipe_) == 0);
    return check_report("test_pipeline_ticket_order");
}
