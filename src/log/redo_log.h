/* redo_log.h -- the persistent redo log: a ring of frames inside the pool.
 *
 * One read-write batch = one frame: a 64-byte header followed by one 48-byte
 * entry per captured 32-byte block. Positions are LSNs: monotonically growing
 * byte counts; the ring offset is lsn % log_size. A frame never wraps: when it
 * does not fit before the end of the ring, a PAD frame fills the rest and the
 * batch starts at the ring's beginning.
 *
 * Commit needs ONE ordering point: the whole frame (entries, then header) is
 * written and flushed, then synced once. A frame counts as committed only if
 * its header checksum, its LSN (== its position), its generation and sequence
 * number, and the checksum of its entries all match, so a torn frame is
 * detected at recovery instead of being ordered by a second fence.
 *
 * Synchronous commit (redo_log_commit) writes a frame only after the previous
 * one's sync returned. Pipelined commit (redo_log_seal now, redo_log_sync_upto
 * later from another thread; log/commit_pipeline.h) lets frames k+1.. be
 * written while k syncs, so after a crash any frame past the last completed
 * sync may be torn, in any order. Each frame records `durable_lsn`, the log end
 * known durable when it was written: a bad frame at position P followed by a
 * good frame whose durable_lsn > P means P was durable before that frame was
 * written, i.e. corruption, and recovery refuses; a good frame with
 * durable_lsn <= P was in flight together with P and is dropped with it.
 */
#ifndef MANGO_REDO_LOG_H
#define MANGO_REDO_LOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pool/pool.h"

#define LOG_FRAME_MAGIC 0x464c474du /* "MGLF" */
#define LOG_FRAME_VERSION 2u
#define LOG_BLOCK_SIZE 32u

enum { LOG_FRAME_BATCH = 1, LOG_FRAME_PAD = 2 };

typedef struct log_frame {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint64_t lsn;         /* position of this frame */
    uint64_t seq;         /* batch sequence number (PAD: the next batch's) */
    uint64_t generation;  /* pool generation (bumped at every open) */
    uint32_t n_entries;
    uint32_t payload_crc; /* CRC-32C of the entries */
    uint64_t frame_bytes; /* header + entries, rounded up to 64 */
    uint64_t durable_lsn; /* log end known durable when this frame was written */
    uint32_t reserved;
    uint32_t header_crc;  /* CRC-32C of the 60 bytes before it */
} log_frame;

typedef struct log_entry {
    uint64_t addr;  /* 32-byte aligned virtual address of the block */
    uint32_t mask;  /* bit i: byte i of the block was written by the batch */
    uint32_t reserved;
    uint8_t data[LOG_BLOCK_SIZE];
} log_entry;

/* A zero-range entry: addr is LOG_ZERO_TAG | the range's first byte (32-byte
 * aligned), mask 0, and data's first 8 bytes the range's length (a multiple
 * of 32); the range, inside the heap region, becomes zero. It stands for a
 * calloc of reused heap memory, which would otherwise log every block. The
 * tag puts the address outside every region, so a build that predates these
 * entries refuses the pool instead of misapplying them. A batch's zero
 * ranges come before its blocks in the frame, and a block inside a range
 * holds the block's content at commit, so applying in order is right. */
#define LOG_ZERO_TAG (1ull << 63)
static inline bool log_entry_is_zero(const log_entry *e) { return (e->addr & LOG_ZERO_TAG) != 0; }
static inline uint64_t log_entry_zero_len(const log_entry *e)
{
    uint64_t n;
    __builtin_memcpy(&n, e->data, sizeof n);
    return n;
}

/* A data range: the bytes of [addr, addr+len) as the batch left them, for a
 * large store into the heap (a memcpy of a big value) that would otherwise
 * log 48 bytes per 32. The header entry's addr is LOG_DATA_TAG | addr (any
 * alignment), mask 0, and data's first 8 bytes the length (the other 24
 * zero); the next LOG_DATA_PAYLOAD_SLOTS(len) entries are the bytes
 * themselves, 48 to an entry, the last one zero-padded. n_entries counts
 * them all. Readers step over a range with log_entry_slots(). The range lies
 * inside the heap region, and it holds the content at commit, as a block
 * does, so it may come in any order after the batch's zero ranges. The tag,
 * like the others, is an address outside every region: a build that
 * predates data ranges refuses the pool. */
#define LOG_DATA_TAG (1ull << 61)
#define LOG_DATA_MAX_LEN (1ull << 40) /* a sanity bound for readers */
#define LOG_DATA_PAYLOAD_SLOTS(len) (((uint64_t)(len) + sizeof(log_entry) - 1) / sizeof(log_entry))
static inline bool log_entry_is_data(const log_entry *e) { return (e->addr >> 61) == 1; }
static inline uint64_t log_entry_data_addr(const log_entry *e) { return e->addr & ~LOG_DATA_TAG; }
static inline uint64_t log_entry_data_len(const log_entry *e)
{
    uint64_t n;
    __builtin_memcpy(&n, e->data, sizeof n);
    return n;
}
/* Entries taken by the entry at e: 1, or a data range's header and bytes.
 * 0 for a data range whose length is out of bounds (readers refuse it). */
static inline uint64_t log_entry_slots(const log_entry *e)
{
    if (!log_entry_is_data(e))
        return 1;
    uint64_t len = log_entry_data_len(e);
    return len == 0 || len > LOG_DATA_MAX_LEN ? 0 : 1 + LOG_DATA_PAYLOAD_SLOTS(len);
}

_Static_assert(sizeof(log_frame) == 64, "frame header is one cache line");
_Static_assert(sizeof(log_entry) == 48, "entry size");

typedef struct redo_log {
    pool *pool;
    char *ring;
    uint64_t cap;
    /* frontend (combiner) state */
    uint64_t tail_lsn;
    uint64_t next_seq;
    uint64_t generation;
    /* published by the frontend after each commit's sync; consumed by the backend */
    _Atomic uint64_t committed_lsn;
    /* published by the backend: log space below this may be reused */
    _Atomic uint64_t reusable_lsn;
    uint64_t dropped_lsn; /* fs mode: ring pages below this were dropped (backend) */
    pthread_mutex_t mu;
    pthread_cond_t space_cv;
    _Atomic unsigned space_waiters;
    _Atomic uint64_t full_waits; /* (under mu; mango_get_stats reads it without) */
    /* called (without l->mu held) when the combiner starts waiting for space */
    void (*kick)(void *arg);
    void *kick_arg;
} redo_log;

/* An open frame being filled by the combiner. */
typedef struct log_frame_writer {
    log_frame *hdr;
    log_entry *entries;
    uint32_t capacity;
    uint32_t n;
    uint64_t lsn;
    uint64_t bytes;
    uint64_t pad_lsn;   /* a PAD frame written by reserve (pad_bytes 0: none) */
    uint64_t pad_bytes;
} log_frame_writer;

void redo_log_init(redo_log *l, pool *p, uint64_t tail_lsn, uint64_t next_seq, uint64_t generation,
                   uint64_t reusable_lsn);
void redo_log_destroy(redo_log *l);

/* Largest batch (in blocks) a frame can hold in this log. */
uint32_t redo_log_max_entries(const redo_log *l);

/* Wait until log space below lsn may be reused: the backend has applied it
 * and both head slots are past it (kicking the backend meanwhile). */
int redo_log_wait_reusable(redo_log *l, uint64_t lsn);
/* Reserve a frame for n entries, waiting for the backend if the log is full. */
int redo_log_reserve(redo_log *l, uint32_t n, log_frame_writer *w);
/* Append one block: copies 32 bytes from block_addr. */
static inline void redo_log_put(log_frame_writer *w, uintptr_t block_addr, uint32_t mask)
{
    log_entry *e = &w->entries[w->n++];
    e->addr = block_addr;
    e->mask = mask;
    e->reserved = 0;
    __builtin_memcpy(e->data, (const void *)block_addr, LOG_BLOCK_SIZE);
}
/* Append one zero-range entry (see log_entry). */
static inline void redo_log_put_zero(log_frame_writer *w, uintptr_t addr, uint64_t len)
{
    log_entry *e = &w->entries[w->n++];
    e->addr = LOG_ZERO_TAG | addr;
    e->mask = 0;
    e->reserved = 0;
    __builtin_memset(e->data, 0, LOG_BLOCK_SIZE);
    __builtin_memcpy(e->data, &len, sizeof len);
}
/* Append one data range (see LOG_DATA_TAG) for [addr, addr+len), whose
 * bytes are copied from src: addr's own bytes (redo_log_put_data), or others
 * that recovery must put there (a bulk load's earlier root, runtime.c). */
static inline void redo_log_put_data_from(log_frame_writer *w, uintptr_t addr, const void *src, uint64_t len)
{
    log_entry *e = &w->entries[w->n];
    e->addr = LOG_DATA_TAG | addr;
    e->mask = 0;
    e->reserved = 0;
    __builtin_memset(e->data, 0, LOG_BLOCK_SIZE);
    __builtin_memcpy(e->data, &len, sizeof len);
    uint64_t slots = LOG_DATA_PAYLOAD_SLOTS(len);
    char *payload = (char *)(e + 1);
    __builtin_memcpy(payload, src, len);
    __builtin_memset(payload + len, 0, slots * sizeof(log_entry) - len);
    w->n += (uint32_t)(1 + slots);
}
/* Append one data range: copies len bytes from addr. */
static inline void redo_log_put_data(log_frame_writer *w, uintptr_t addr, uint64_t len)
{
    redo_log_put_data_from(w, addr, (const void *)addr, len);
}
/* Seal, flush and sync the frame; publish it to the backend. Only when no
 * sealed frame is waiting for a pipelined sync. */
int redo_log_commit(redo_log *l, log_frame_writer *w);
/* Pipelined commit, step 1 (frontend): seal the frame (header, checksums) and
 * advance the tail, without flushing or syncing it. The frame is not
 * committed, and the backend does not see it, until step 2 covers it. */
void redo_log_seal(redo_log *l, log_frame_writer *w);
/* Step 2 (one sync thread): make the log [from_lsn, to_lsn) durable with one
 * sync, then publish to_lsn as committed. 0 or MANGO_EIO. */
int redo_log_sync_upto(redo_log *l, uint64_t from_lsn, uint64_t to_lsn);

/* Backend: space up to lsn may be reused (called after the head is durable). */
void redo_log_release(redo_log *l, uint64_t lsn);
/* Wakes the threads waiting for log space, to see a failure (the pool's
 * pd.failed, set before this call). */
void redo_log_wake_space_waiters(redo_log *l);

/* ---- scanning (backend and recovery) ---- */
typedef int (*log_frame_visitor)(void *arg, const log_frame *f, const log_entry *entries);

typedef struct log_scan_result {
    uint64_t end_lsn;    /* first position after the last committed frame */
    uint64_t next_seq;
    uint64_t frames;
    uint64_t entries;
    bool torn_tail;      /* an incomplete last frame was found (and ignored) */
    uint64_t dropped_after_torn; /* complete frames after it, written in the same
                                  * unsynced window (pipelined commit), dropped */
    uint64_t torn_lsn;
    char torn_reason[96];
} log_scan_result;

/* Visit committed frames from from_lsn (sequence from_seq) until limit_lsn or
 * the first invalid frame. Returns 0, a visitor's non-zero return, or
 * MANGO_EBADPOOL when an invalid frame is followed by a valid one. */
int redo_log_scan(const char *ring, uint64_t cap, uint64_t from_lsn, uint64_t from_seq,
                  uint64_t generation, uint64_t limit_lsn, log_frame_visitor visit, void *arg,
                  log_scan_result *out);
/* The same from a head written at a clean shutdown (pool_head_slot.clean):
 * everything committed before it was applied, so no committed frame can
 * follow it, and an invalid frame at from_lsn is the log's end without the
 * search of the whole ring for committed frames after it (reading a 256 MiB
 * ring cost a cold start 0.16-0.5 s). Once a valid frame is found there
 * (never after a clean shutdown), the scan is redo_log_scan's. */
int redo_log_scan_from_clean_head(const char *ring, uint64_t cap, uint64_t from_lsn, uint64_t from_seq,
                                  uint64_t generation, log_frame_visitor visit, void *arg,
                                  log_scan_result *out);

#endif
