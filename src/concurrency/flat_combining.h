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

/* The most client threads fc_create accepts (mango_config.max_threads). */
#define FC_MAX_THREADS_LIMIT 65536u

typedef struct fc_hooks {
    bool (*is_read_only)(void *ctx);
    void (*process)(void *ctx);
    /* Optional: runs read-only commands instead of process (the runtime's
     * process also notes a write's keys, which a read must not do). */
    void (*process_read)(void *ctx);
    /* Called by the combiner before the batch runs (start_tx). A non-zero
     * return aborts the batch: no command in it runs, each waiter gets it. */
    int (*batch_begin)(void *arg, unsigned batch_size);
    /* Called by the combiner after the batch ran (end_tx). ticket NULL: the
     * batch must be durable on return. Otherwise the hook may only hand the
     * batch to a sync in the background and store in *ticket what the batch's
     * commands must wait for (wait_durable), or 0 if the batch is durable.
     * Its return value is handed to every command of the batch. */
    int (*batch_end)(void *arg, uint64_t *ticket);
    /* Optional pipelined commit: with it, combined batches end with a ticket
     * (see batch_end); each command's thread waits for its batch's ticket
     * after the write side is released. Returns 0, or an error that replaces
     * the command's result. */
    int (*wait_durable)(void *arg, uint64_t ticket);
    /* Optional: called by a read-only command's thread after it left the
     * read side, with the command's ctx; a non-zero return replaces its
     * result. Every batch the read could have seen ended before the write
     * side was released, so before this call. It stores in *ticket what the
     * read must wait for (wait_durable), 0 for nothing: the runtime names
     * the batches in flight (or those that wrote the command's keys), and
     * refuses the read if one of them failed to commit. */
    int (*read_target)(void *arg, void *ctx, uint64_t *ticket);
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

/* Run one command. Read-only: runs it in parallel with other readers, returns
 * 0 (or read_target's or wait_durable's error). Read-write: returns once the batch holding it
 * has ended (and, with wait_durable, is durable); the result of batch_end (or
 * batch_begin's or wait_durable's error). MANGO_EINVAL when more than max_threads
 * threads hold slots. A thread's slot is released when the thread exits. */
int fc_execute(fc *f, void *ctx);

/* The same, without the wait for durability: on success *ticket gets what
 * the command's result must wait for (0: nothing), the ticket fc_execute
 * would have passed to wait_durable. hand_over: the caller must not be made
 * to wait for a sync either; the batch holding the command is then ended
 * with fc_batch_async() true. Without it, batch_end may still sync the batch
 * under the lock (then *ticket is 0). */
int fc_submit(fc *f, void *ctx, uint64_t *ticket, bool hand_over);

/* Run fn(arg) alone, as if it were a one-command read-write batch (used for
 * the application's init_state and for shutdown). */
int fc_execute_exclusive(fc *f, void (*fn)(void *), void *arg);
/* Run fn(arg) holding the write side, with no batch: no hook runs, nothing
 * is captured or committed (a snapshot's fork, which must see the state
 * between batches). MANGO_OK, or MANGO_EINVAL. */
int fc_execute_locked(fc *f, void (*fn)(void *), void *arg);

/* The same as a span: take the write side and run batch_begin; the caller runs
 * its commands; fc_exclusive_end runs batch_end (ticket NULL), releases,
 * returns its result.
 * Returns batch_begin's error (and holds nothing) on failure. */
int fc_exclusive_begin(fc *f);
int fc_exclusive_end(fc *f);

/* For batch_end, on the thread holding the write side: is a read-only
 * command waiting for the write side to be released? A pipelined commit pays
 * when readers can run during the sync; writers gain little from it (they
 * wait for a sync either way) and lose their batching (published writers
 * are collected into the next batch while the combiner syncs). */
bool fc_readers_waiting(fc *f);

/* For batch_end, on the thread holding the write side: does the batch hold a
 * command of fc_submit with hand_over? Its caller has other work to do, so
 * the batch goes to the sync thread rather than being synced under the lock. */
bool fc_batch_async(const fc *f);

/* For batch_end, on the thread holding the write side: did threads other
 * than the caller run read-only commands since the last call (by any
 * thread)? Each slot's own read counter against a snapshot kept in the slot:
 * readers share no counter. With reads that need not wait for a sync
 * (per-key read dependencies), a pipelined commit lets them run meanwhile
 * even when none is waiting at this moment. */
bool fc_reads_seen(fc *f);

/* Is the calling thread inside a read-only command of f (holding the read
 * side)? No combiner runs meanwhile; taking the write side would wait for
 * the caller itself. */
bool fc_in_read(fc *f);

#endif
