/* read_deps.h -- what a read-only command must wait for, by key.
 *
 * With pipelined commit (fs and sim modes) a read-only command may have read
 * batches whose sync is still in flight, and must not answer before they are
 * durable. Without more knowledge it waits for every batch ended before it
 * (runtime.c, read_done). When the application names the keys of its
 * requests (mango_callbacks.request_keys), the runtime keeps here, for each
 * key, the ticket of the last batch that wrote it, and a read waits only for
 * its own keys' batches.
 *
 * The table: READ_DEPS_SLOTS words, a key's slot chosen by a hash; two keys
 * that share a slot share a ticket, so a collision only makes a read wait
 * longer. Plus one word for writes without keys (a request that named none,
 * an exclusive batch, more keys in a batch than fit the pending list): every
 * read waits for it.
 *
 * Threads: only the thread holding the write side of the lock adds keys and
 * publishes (the combiner, inside its batch). Readers load slots after they
 * left the read side; the combiner publishes before it releases the write
 * side, so a read that saw a batch's writes sees that batch's ticket (or a
 * later one: waiting longer is safe). Slots are atomics with relaxed order:
 * the lock's release/acquire pair orders them.
 */
#ifndef MANGO_READ_DEPS_H
#define MANGO_READ_DEPS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define READ_DEPS_SLOT_BITS 14
#define READ_DEPS_SLOTS (1u << READ_DEPS_SLOT_BITS)
#define READ_DEPS_PENDING 1024 /* keys written by one batch before it counts as unkeyed */

typedef struct read_deps {
    _Atomic uint64_t unkeyed;               /* last batch that wrote without keys */
    _Atomic uint64_t slot[READ_DEPS_SLOTS]; /* last batch that wrote a key of the slot */
    /* The open batch (combiner only). */
    uint32_t pending[READ_DEPS_PENDING]; /* slots written */
    unsigned n_pending;
    bool pending_unkeyed;
} read_deps;

void read_deps_init(read_deps *d);

/* The combiner: the batch's command wrote these keys (n >= 0), or state
 * beyond any keys (n < 0). */
void read_deps_note_write(read_deps *d, const uint64_t *keys, int n);
/* The combiner: the batch ended with this ticket (durable once it is), or
 * failed (ticket 0: drop what was noted). exclusive: a batch whose commands
 * were not noted (mango_batch_*, init_state): it counts as unkeyed. */
void read_deps_publish(read_deps *d, uint64_t ticket, bool exclusive);

/* A reader of these n keys (n >= 0): the ticket that must be durable before
 * it answers (0: none). */
uint64_t read_deps_target(const read_deps *d, const uint64_t *keys, int n);

#endif
