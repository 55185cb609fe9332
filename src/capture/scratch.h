/* scratch.h -- scratch memory: durable bytes whose value recovery does not
 * need (statistics, cached clocks, cursors any value of which is valid).
 *
 * Stores to scratch bytes are captured like any other; at the end of a batch
 * a block whose written bytes are all scratch is dropped from the dedup set
 * before the batch is logged, so a batch that wrote only scratch logs nothing
 * and costs no sync (an idle server's timer, say). A block that also holds a
 * written non-scratch byte is logged whole, as always.
 *
 * The table maps a 32-byte block address to the mask of its scratch bytes
 * (open addressing, fixed size). It is read and written only by the thread
 * holding the write side: mango_scratch() (which takes it when called
 * outside a batch), the heap's free hook, and batch ends. mango.h states
 * the contract.
 */
#ifndef MANGO_SCRATCH_H
#define MANGO_SCRATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capture/dedup_set.h"

#define SCRATCH_SLOTS 4096u                   /* 32 KiB of keys + 16 KiB of masks */
#define SCRATCH_MAX_BLOCKS (SCRATCH_SLOTS / 2) /* 64 KiB of scratch memory */

/* Mark [addr, addr+len) scratch (the caller checked that it is durable;
 * in_heap: it lies in the durable heap). MANGO_OK, or MANGO_EINVAL when the
 * table cannot take its blocks (nothing of it is then added). */
int scratch_add(uintptr_t addr, size_t len, bool in_heap);
/* [lo, hi) of the durable heap is being freed: it is scratch no more (the
 * allocator writes its metadata there, which must be logged). On the thread
 * holding the write side, as every durable free runs. */
void scratch_unmark_heap(uintptr_t lo, uintptr_t hi);
/* Forget every range (mango_shutdown, so a later mango_init starts empty). */
void scratch_reset(void);
/* Drop from s the blocks whose written bytes are all scratch; returns how
 * many (0 at once when nothing is scratch). */
uint64_t scratch_drop(dedup_set *s);

#endif
