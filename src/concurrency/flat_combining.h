/* flat_combining.h -- Mangosteen's concurrency control (paper, Figure 2).
 *
 * A writer-preference reader-writer lock fused with flat combining:
 *   - read-only commands run in parallel under the shared side of the lock;
 *   - read-write commands are published in per-thread, cache-line-aligned
 *     slots; whichever writer wins the CAS on the writer flag becomes the
 *     combiner, waits for readers to drain, and runs every published command
 *     as one batch between hooks.batch_begin() and hooks.batch_end().
 * Waiting spins briefly, then sleeps on a futex (these machines have 2 cores).
 */
#ifndef MANGO_FLAT_COMBINING_H
#define MANGO_FLAT_COMBINING_H

#include <stdbool.h>
#include <stdint.h>

typedef struct fc_hooks {
    bool (*is_read_only)(void *ctx);
    void (*process)(void *ctx);
    /* Called by the combiner before the batch runs (start_tx). A non-zero
     * return aborts the batch: no command in it runs, each waiter gets it. */
    int (*batch_begin)(void *arg, unsigned batch_size);
    /* Called by the combiner after the batch ran (end_tx: makes it durable).
     * Its return value is handed to every command of the batch. */
    int (*batch_end)(void *arg);
    /* Optional group commit: how long (ns) the combiner may wait for more
     * commands before starting a batch smaller than recent ones. 0: never. */
    uint64_t (*gather_window_ns)(void *arg);
    void *arg;
} fc_hooks;

typedef struct fc fc;

/* max_threads: how many distinct threads may call fc_execute concurrently.
 * Returns 0 or a negative MANGO_E* code. */
int fc_create(fc **out, unsigned max_threads, const fc_hooks *hooks);
void fc_destroy(fc *f);

/* Run one command. Read-only: runs it in parallel with other readers, returns 0.
 * Read-write: returns once the batch holding it has ended; the result of
 * batch_end (or batch_begin's error). MANGO_EINVAL when more than max_threads
 * threads hold slots. A thread's slot is released when the thread exits. */
int fc_execute(fc *f, void *ctx);

/* Run fn(arg) alone, as if it were a one-command read-write batch (used for
 * the application's init_state and for shutdown). */
int fc_execute_exclusive(fc *f, void (*fn)(void *), void *arg);

/* The same as a span: take the write side and run batch_begin; the caller runs
 * its commands; fc_exclusive_end runs batch_end, releases, returns its result.
 * Returns batch_begin's error (and holds nothing) on failure. */
int fc_exclusive_begin(fc *f);
int fc_exclusive_end(fc *f);

#endif
