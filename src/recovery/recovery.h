/* recovery.h -- bringing a pool back: replay the log into the mirror, then
 * copy the mirror into the process at the same addresses.
 *
 * Replay is idempotent (redo), so a crash during recovery is recovered by
 * recovering again. The head is advanced (and the generation bumped) only
 * after the replayed mirror bytes are durable.
 */
#ifndef MANGO_RECOVERY_H
#define MANGO_RECOVERY_H

#include <stdint.h>

#include "log/redo_log.h"
#include "pool/pool.h"

typedef struct recovery_report {
    uint64_t frames_replayed;
    uint64_t blocks_replayed;
    uint64_t heap_bytes_restored;
    uint64_t data_bytes_restored;
    int torn_tail;          /* an incomplete, unacknowledged last batch was discarded */
    uint64_t torn_lsn;
    double replay_seconds;
    double restore_seconds;
} recovery_report;

/* Replay committed frames from the head; persist a new head with generation+1.
 * On return the log is empty and new frames may start at tail_lsn. */
int recovery_replay(pool *p, recovery_report *rep, uint64_t *tail_lsn, uint64_t *next_seq,
                    uint64_t *generation);

/* Copy the heap mirror (up to the allocator's top) and the written .data/.bss
 * bytes into memory at their original addresses, using `threads` copiers. */
int recovery_restore(pool *p, unsigned threads, recovery_report *rep);

#endif
