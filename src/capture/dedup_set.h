/* dedup_set.h -- intra-batch deduplication of captured stores (paper, Fig. 3).
 *
 * A fixed-size, cache-line-aligned open-addressing set of 32-byte block
 * addresses with linear probing. Beside each block it keeps a 32-bit mask of
 * the bytes the batch wrote (the backend restores .data/.bss byte-exactly).
 * Past 60 % load, new blocks go to the spill set: a second open-addressing
 * set that lives in mmap'd memory and doubles when half full. The paper's
 * overflow buffer kept spilled blocks in arrival order without deduplication,
 * so a large batch rewriting the same blocks logged them again and again (2M
 * stores over 1 MiB logged 1.85M blocks and overflowed a 64 MiB log); with the
 * spill set the log of a batch is bounded by the distinct blocks it wrote.
 * The append-only list remains only for MANGO_DEDUP=0 (the benchmark's
 * baseline).
 *
 * Data ranges: a store of DEDUP_RANGE_MIN bytes or more into the durable heap
 * (a memcpy of a large value) is kept as one (address, length) range instead
 * of one block per 32 bytes, and logged as a data-range entry carrying its
 * bytes (log/redo_log.h): a 100 MB value then costs the log about 100 MB and
 * the capture nothing per block. Ranges are merged (sorted, overlapping or
 * touching ones joined) whenever their number doubles, and once more before
 * the batch is logged, so a batch that rewrites the same range many times
 * logs it once. A block of the sets may also lie inside a range; both carry
 * the memory's content at commit, so logging both is redundant, not wrong.
 * The combiner owns all of it; no locks.
 */
#ifndef MANGO_DEDUP_SET_H
#define MANGO_DEDUP_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEDUP_BLOCK 32u
#define DEDUP_SLOTS 4096u /* 32 KiB of keys + 16 KiB of masks */
#define DEDUP_MAX_LOAD (DEDUP_SLOTS * 6 / 10)
/* Home slot of a block (include/mango_capture_inline.h inlines the same probe
 * into instrumented code; capture.c checks that the two agree). */
/* Stores at least this long into the durable heap become data ranges. */
#define DEDUP_RANGE_MIN 4096u
/* Log slots (48-byte entries) a data range of len bytes takes: a header entry
 * and its bytes (log/redo_log.h, LOG_DATA_TAG). */
#define DEDUP_RANGE_SLOTS(len) (1u + ((uint64_t)(len) + 47u) / 48u)
#define DEDUP_HASH(block) ((uint32_t)(((uint64_t)(block) >> 5) * 0x9E3779B1u) & (DEDUP_SLOTS - 1))

/* The mask of the bytes of block that [lo, hi) covers. */
static inline uint32_t dedup_block_mask(uintptr_t block, uintptr_t lo, uintptr_t hi)
{
    uintptr_t a = lo > block ? lo - block : 0;
    uintptr_t b = hi < block + DEDUP_BLOCK ? hi - block : DEDUP_BLOCK;
    return (uint32_t)(((1ull << b) - 1) & ~((1ull << a) - 1));
}

typedef struct dedup_overflow_chunk {
    struct dedup_overflow_chunk *next;
    uint32_t n;
    uint64_t addr[1022];
    uint32_t mask[1022];
} dedup_overflow_chunk;

/* The spill set: open addressing, doubles at 50 % load. */
typedef struct dedup_spill {
    uint64_t *key; /* 0 = empty */
    uint32_t *mask;
    uint64_t cap;  /* power of two; 0 until first used */
    uint64_t count;
} dedup_spill;

typedef struct dedup_range {
    uint64_t addr, len;
} dedup_range;

typedef struct dedup_set {
    _Alignas(64) uint64_t key[DEDUP_SLOTS]; /* block address, 0 = empty */
    uint32_t mask[DEDUP_SLOTS];
    uint32_t used_slot[DEDUP_MAX_LOAD];      /* filled slots, for a fast clear */
    uint32_t count;
    uint64_t dropped; /* blocks dedup_drop() emptied (mask 0), still in their slots */
    dedup_spill spill;
    /* MANGO_DEDUP=0 only: blocks in arrival order, not deduplicated */
    dedup_overflow_chunk *ovf_head, *ovf_tail, *ovf_free;
    uint64_t ovf_count;
    /* data ranges (mmap'd; doubles when full), merged when rng_n reaches
     * rng_merge_at */
    dedup_range *rng;
    uint64_t rng_n, rng_cap, rng_merge_at;
    uint64_t rng_slots; /* log slots of rng[0..rng_n) as they stand */
    uint64_t rng_bytes; /* and their bytes */
    bool rng_merged;    /* rng is merged: nothing added since the last merge */
} dedup_set;

void dedup_init(dedup_set *s);
void dedup_destroy(dedup_set *s);
/* Record that [addr, addr+len) was written (addr/len already filtered). */
void dedup_add_range(dedup_set *s, uintptr_t addr, size_t len);
/* The same without deduplication: every block goes to the overflow buffer, in
 * order (the benchmark's "dedup off" baseline; MANGO_DEDUP=0). */
void dedup_add_range_nodedup(dedup_set *s, uintptr_t addr, size_t len);
/* Record that [addr, addr+len) was written, as a data range (the caller
 * checked that it lies in the durable heap and is long enough). */
void dedup_add_data_range(dedup_set *s, uintptr_t addr, size_t len);
/* Sort the data ranges and join overlapping or touching ones (before they
 * are logged; also done on the way as they accumulate). */
void dedup_merge_ranges(dedup_set *s);
typedef void (*dedup_range_fn)(void *arg, uintptr_t addr, uint64_t len);
void dedup_for_each_range(const dedup_set *s, dedup_range_fn fn, void *arg);
/* Total block entries (set + overflow), less those dropped. */
static inline uint64_t dedup_size(const dedup_set *s)
{
    return s->count + s->spill.count + s->ovf_count - s->dropped;
}
/* Log slots the batch takes as it stands: its blocks and its data ranges. */
static inline uint64_t dedup_log_slots(const dedup_set *s) { return dedup_size(s) + s->rng_slots; }
typedef void (*dedup_visit_fn)(void *arg, uintptr_t block, uint32_t mask);
/* Visit every block with its mask (not the dropped ones). */
void dedup_for_each(const dedup_set *s, dedup_visit_fn fn, void *arg);
/* At the end of a batch, before it is logged: drop every block drop() says
 * to (its mask becomes 0; it stays in its slot until dedup_clear, so the
 * probe chains hold, but no longer counts or is visited). Returns how many
 * it dropped. Nothing may be added to the set after it. */
typedef bool (*dedup_drop_fn)(void *arg, uintptr_t block, uint32_t mask);
uint64_t dedup_drop(dedup_set *s, dedup_drop_fn drop, void *arg);
void dedup_clear(dedup_set *s);

/* Add a block to the spill set (past the primary set's load limit). */
void dedup_add_overflow(dedup_set *s, uintptr_t block, uint32_t mask);
/* Append a block to the arrival-order list (no deduplication). */
void dedup_append_nodedup(dedup_set *s, uintptr_t block, uint32_t mask);

/* Inline fast path for one block. */
static inline void dedup_add_block(dedup_set *s, uintptr_t block, uint32_t mask)
{
    uint32_t i = DEDUP_HASH(block);
    for (;;) {
        uint64_t k = s->key[i];
        if (k == block) {
            s->mask[i] |= mask;
            return;
        }
        if (k == 0)
            break;
        i = (i + 1) & (DEDUP_SLOTS - 1);
    }
    if (s->count >= DEDUP_MAX_LOAD) {
        dedup_add_overflow(s, block, mask);
        return;
    }
    s->key[i] = block;
    s->mask[i] = mask;
    s->used_slot[s->count++] = i;
}

#endif
