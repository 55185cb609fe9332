/* recovery.h -- bringing a pool back: replay the log into the mirror, then
 * put the mirror into the process at the same addresses.
 *
 * Replay is idempotent (redo), so a crash during recovery is recovered by
 * recovering again. The head is advanced (and the generation bumped) only
 * after the replayed mirror bytes are durable.
 */
#ifndef MANGO_RECOVERY_H
#define MANGO_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

#include "log/redo_log.h"
#include "pool/pool.h"

typedef struct recovery_report {
    uint64_t frames_replayed;
    uint64_t blocks_replayed;
    uint64_t heap_bytes_restored; /* heap bytes copied */
    uint64_t heap_bytes_mapped;   /* heap bytes mapped copy-on-write from the pool file */
    uint64_t data_bytes_restored;
    int torn_tail;          /* an incomplete, unacknowledged last batch was discarded */
    int heap_walked;        /* walk_heap: the heap's metadata was walked before the replay */
    uint64_t torn_lsn;
    double replay_seconds;
    double restore_seconds;
} recovery_report;

/* Replay committed frames from the head; persist a new head with generation+1.
 * On return the log is empty and new frames may start at tail_lsn.
 *
 * Nothing is written until the log is validated and the heap's root, as the
 * replay will leave it, is found well formed. With walk_heap
 * (MANGO_CHECK_HEAP=1) the heap's whole metadata is walked (dheap_check) on
 * a private copy-on-write copy of the mirror with the log applied, also
 * before anything is written: an inconsistent heap is refused with
 * MANGO_EBADPOOL and the pool left byte-for-byte as it was. If the copy
 * cannot be mapped, a warning says so and rep->heap_walked stays 0 (the
 * caller then walks the restored heap). */
int recovery_replay(pool *p, bool walk_heap, recovery_report *rep, uint64_t *tail_lsn,
                    uint64_t *next_seq, uint64_t *generation);

/* Restore the heap mirror (up to the allocator's top) and the written
 * .data/.bss bytes at their original addresses.
 *
 * The heap's whole pages are mapped from the pool file MAP_PRIVATE (copy on
 * write) over the reservation at the heap's address: O(1), pages fault in
 * when first touched, and a page is copied only when first written. Why that
 * is safe while the backend keeps writing the mirror, and what fork() needs,
 * is explained in recovery.c. The mapping goes through an open file
 * description of its own, which holds no lock: the caller keeps the pool
 * locked while the mapping exists (also after pool_close, runtime.c's
 * kept_lock_fd), and a fork() child, whose heap pages the fork handler made
 * private, keeps no reference to the locked description. The caller must
 * unmap it (and call recovery_heap_unmapped) before opening the pool again.
 *
 * The heap is copied instead (with `threads` copiers) when MANGO_RESTORE=copy
 * is set, in pmem mode, or when the kernel lacks MADV_POPULATE_WRITE (5.14+).
 * .data/.bss are always copied, byte by byte where the bitmap says so. */
int recovery_restore(pool *p, unsigned threads, recovery_report *rep);

/* The heap reservation that recovery_restore mapped was unmapped or replaced:
 * forget it (the fork handler would otherwise touch the range). */
void recovery_heap_unmapped(void);
/* Is a restored heap still mapped shared with the pool file? (After a
 * fork: making it private failed, so the child sees the pool's later
 * writes in pages the parent has not written.) */
bool recovery_heap_still_shared(void);

#endif
