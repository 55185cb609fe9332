/* read_deps.c -- the per-key ticket table of read_deps.h: the combiner
 * notes the keys each command wrote and publishes the batch's ticket on them;
 * a reader takes the largest ticket of its keys' slots and of unkeyed writes. */
#include "concurrency/read_deps.h"

#include <string.h>

static uint32_t slot_of(uint64_t key)
{
    /* Fibonacci hashing: the top bits of key * 2^64/phi. Applications often
     * use small consecutive keys (array indexes), which this spreads. */
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - READ_DEPS_SLOT_BITS));
}

void read_deps_init(read_deps *d)
{
    memset(d, 0, sizeof *d);
}

void read_deps_note_write(read_deps *d, const uint64_t *keys, int n)
{
    if (d->pending_unkeyed)
        return; /* the whole batch counts as unkeyed already */
    if (n < 0 || d->n_pending + (unsigned)n > READ_DEPS_PENDING) {
        d->pending_unkeyed = true;
        return;
    }
    for (int i = 0; i < n; i++)
        d->pending[d->n_pending++] = slot_of(keys[i]);
}

void read_deps_publish(read_deps *d, uint64_t ticket, bool exclusive)
{
    if (ticket != 0) {
        if (exclusive || d->pending_unkeyed) {
            atomic_store_explicit(&d->unkeyed, ticket, memory_order_relaxed);
        } else {
            for (unsigned i = 0; i < d->n_pending; i++)
                atomic_store_explicit(&d->slot[d->pending[i]], ticket, memory_order_relaxed);
        }
    }
    d->n_pending = 0;
    d->pending_unkeyed = false;
}

uint64_t read_deps_target(const read_deps *d, const uint64_t *keys, int n)
{
    uint64_t t = atomic_load_explicit(&d->unkeyed, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        uint64_t s = atomic_load_explicit(&d->slot[slot_of(keys[i])], memory_order_relaxed);
        if (s > t)
            t = s;
    }
    return t;
}
