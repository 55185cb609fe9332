/* split_alloc.h -- split allocation: routes the malloc family.
 *
 * The runtime defines malloc, free, calloc, realloc, memalign, posix_memalign,
 * aligned_alloc, valloc, pvalloc and malloc_usable_size in the executable, so
 * they interpose glibc's. While the calling thread runs read-write commands
 * (split_alloc_rw_thread is true) allocations come from the durable heap;
 * everywhere else from glibc (__libc_malloc & co). free/realloc route by
 * address. A durable object freed outside a read-write command is queued and
 * freed by a combiner (split_alloc_drain_deferred, at the start and at the
 * end of every batch), if the queue is open (split_alloc_deferred_close).
 */
#ifndef MANGO_SPLIT_ALLOC_H
#define MANGO_SPLIT_ALLOC_H

#include <stdbool.h>

/* Set by the runtime while this thread executes a read-write batch. */
extern __thread bool split_alloc_rw_thread __attribute__((tls_model("initial-exec")));

/* Referenced by mango_init so the interposer object is always linked in. */
void split_alloc_link_anchor(void);

/* Free the durable objects queued by free() calls made outside read-write
 * commands. Called by the combiner while capturing (when a batch begins and
 * before it ends). */
void split_alloc_drain_deferred(void);
/* Are frees queued (for the next combiner)? */
bool split_alloc_deferred_pending(void);
/* No batch will run against the attached heap any more (mango_shutdown,
 * after its last batch): empty the queue, and from now on drop the durable
 * frees made outside read-write commands instead of queueing them. The next
 * dheap_attach opens the queue again; a detach or attach also drops what an
 * earlier attachment queued. */
void split_alloc_deferred_close(void);
/* A snapshot, holding the write side: from hold to release, frees queued
 * by other threads wait, so that the queue drained by the snapshot's batch
 * stays empty until its fork (the calling thread's own queue operations go
 * on). */
void split_alloc_deferred_hold(void);
void split_alloc_deferred_release(void);

#endif
