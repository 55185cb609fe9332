/* big_batch.h -- batches too large for a frame of the log ring.
 *
 * A frame may take at most half of the ring (redo_log_max_entries). A batch
 * with more blocks than that (one command that rewrote 40 MB, a FLUSHALL of
 * a big keyspace) is written instead to the pool's big-batch file,
 * `<pool>.bigbatch` beside the pool file, which is synced; only then is the
 * batch committed, by an ordinary one-entry frame in the ring whose entry
 * names the file (a reference entry). That frame is the batch's commit point,
 * as for any batch: after a crash before it is durable, no committed frame
 * names the file, and the next big batch overwrites it.
 *
 * The file (little-endian):
 *   0    64 bytes   big_batch_header (CRC-32C)
 *   64   n * 48     log entries, as in a frame (zero ranges, then data
 *                    ranges and blocks)
 *
 * The reference entry: addr == LOG_BIG_TAG, mask 0, data a big_batch_ref.
 * The tag puts the address outside every region, so a build that predates
 * big batches refuses such a pool instead of misapplying it. The header's
 * generation, sequence number and lsn equal the frame's, and its entry count
 * and payload checksum equal the reference's: a file left by an earlier big
 * batch never passes for the one a frame names.
 *
 * One file, so one big batch at a time: before writing the next one the
 * frontend waits until both head slots are past the previous big frame (the
 * log's reusable_lsn), after which no recovery can read the old content.
 * Recovery removes the file once the head is past everything, and so does a
 * clean shutdown. Scanners (backend, recovery, `mango check`) see a big
 * batch's entries through big_batch_visit, as if they were in the frame.
 */
#ifndef MANGO_BIG_BATCH_H
#define MANGO_BIG_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "log/redo_log.h"
#include "persist/persist.h"

#define BIG_BATCH_MAGIC "MANGOBB\0"
#define BIG_BATCH_VERSION 1u
#define LOG_BIG_TAG (1ull << 62)

typedef struct big_batch_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size; /* sizeof(big_batch_header) */
    uint64_t generation;  /* the committing frame's */
    uint64_t seq;
    uint64_t lsn;
    uint64_t n_entries;
    uint32_t payload_crc; /* CRC-32C of the n entries */
    uint32_t reserved;
    uint32_t reserved2;
    uint32_t header_crc;  /* CRC-32C of the 60 bytes before it */
} big_batch_header;

typedef struct big_batch_ref {
    uint64_t n_entries;
    uint64_t file_bytes;  /* header + entries */
    uint32_t payload_crc;
    uint32_t header_crc;  /* the file header's */
    uint64_t reserved;
} big_batch_ref;

_Static_assert(sizeof(big_batch_header) == 64, "big-batch header is one cache line");
_Static_assert(sizeof(big_batch_ref) == LOG_BLOCK_SIZE, "a reference fills an entry's data");

static inline bool log_entry_is_big_ref(const log_entry *e) { return e->addr == LOG_BIG_TAG; }

/* ---- writing (the frontend) ---- */

/* Descriptors a big batch's first commit opens: sim mode's staging memfd,
 * the file, and its directory for the sync that makes the file's name
 * durable. */
#define BIG_BATCH_SPARE_FDS 3

typedef struct big_batch_writer {
    int fd;            /* -1 until the first big batch */
    int stage_fd;      /* sim mode: where the file is written until its sync (persist.h) */
    char *buf;         /* staging for the entries */
    size_t used;
    uint64_t file_off; /* where buf[0] goes */
    uint64_t n;
    uint32_t crc;
    int err;           /* first write error (-errno), reported by finish */
    bool pending;      /* a committed big frame may still be needed (last_lsn) */
    uint64_t last_lsn; /* lsn of the last big frame committed */
    uint64_t batches;  /* statistics */
    uint64_t bytes;
    int spare_fds[BIG_BATCH_SPARE_FDS]; /* held for the file's first open (big_batch_hold_spare_fds) */
} big_batch_writer;

void big_batch_writer_init(big_batch_writer *w);
/* Hold BIG_BATCH_SPARE_FDS descriptors (O_PATH opens of "/") for the first
 * open of the file, made lazily when a batch outgrows the log: a process
 * that ran out of descriptors by then (connections up to the limit) could
 * otherwise not commit the batch, and a batch that cannot be committed
 * stops all writes. big_batch_begin closes them just before it opens what it
 * needs, and takes them again after. Best effort: a spare that cannot be
 * opened is left out. */
void big_batch_hold_spare_fds(big_batch_writer *w);
/* The last big batch's content is no longer needed (both head slots are
 * past its frame, the log's reusable_lsn): give its space back, truncating
 * the file (and sim mode's staging copy) to nothing. The file stays, empty,
 * for the next big batch. Without it the file kept the size of the largest
 * big batch until the next recovery or clean shutdown removed it. */
void big_batch_release(big_batch_writer *w);
/* Start a big batch: open (creating it, and syncing its directory, the first
 * time) the file at path. 0 or a MANGO_E* code with the error set. */
int big_batch_begin(big_batch_writer *w, persist_domain *pd, const char *path);
void big_batch_put(big_batch_writer *w, uintptr_t block, uint32_t mask);
void big_batch_put_zero(big_batch_writer *w, uintptr_t addr, uint64_t len);
void big_batch_put_data(big_batch_writer *w, uintptr_t addr, uint64_t len);
/* Write the header for the frame that will commit the batch (generation,
 * sequence number, position), sync the file, and fill *ref with the entry
 * that frame must hold. */
int big_batch_finish(big_batch_writer *w, persist_domain *pd, const char *path, uint64_t generation,
                     uint64_t seq, uint64_t lsn, log_entry *ref);
void big_batch_writer_close(big_batch_writer *w);

/* ---- reading (scanners) ---- */

/* Wraps a frame visitor: frames that name the big-batch file are passed on
 * with the file's entries (mapped read-only; n_entries the file's count);
 * other frames unchanged. verify: check the payload checksum and the whole
 * file (recovery, `mango check`); the backend reads what its own process
 * wrote and skips the payload checksum. A named file that is missing or does
 * not match fails the scan with MANGO_EBADPOOL.
 * writer: the backend's scan reads through the frontend's own descriptor
 * instead of opening path: a file whose name was removed after its batch was
 * acknowledged (a temp-file cleaner) is still applied. (Opened by name, it
 * failed the backend and the runtime; found by a review, session 39.) The
 * frontend neither closes nor rewrites the file while the backend may still
 * read a batch from it (it waits for the log's reusable_lsn first). */
typedef struct big_batch_scan {
    const char *path;
    const big_batch_writer *writer;
    bool verify;
    log_frame_visitor visit;
    void *arg;
    uint64_t big_frames;  /* big batches visited */
    uint64_t big_entries; /* their entries */
} big_batch_scan;

int big_batch_visit(void *scan, const log_frame *f, const log_entry *e);

#endif
