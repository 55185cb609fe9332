/* pool_format.h -- the on-media layout of a Mangosteen pool (format version 2).
 * docs/pool-format.md describes it for humans; keep the two in step.
 *
 *   offset            size          what
 *   0                 4 KiB         pool_header (static after creation, CRC-32C)
 *   4 KiB             4 KiB         two pool_head_slot (alternating, each CRC-32C)
 *   8 KiB             4 KiB         region table (pool_region[], CRC in header)
 *   log_offset        log_size      redo log ring of frames (redo_log.h)
 *   region mirrors    ...           persistent copy of each durable region,
 *                                   plus a written-bytes bitmap for data regions
 *
 * All integers little-endian (the only target is x86-64).
 */
#ifndef MANGO_POOL_FORMAT_H
#define MANGO_POOL_FORMAT_H

#include <stdint.h>

#define POOL_MAGIC "MANGOPL\0"
#define POOL_FORMAT_VERSION 2u
#define POOL_HEADER_OFFSET 0u
#define POOL_HEAD_OFFSET 4096u
#define POOL_REGIONS_OFFSET 8192u
#define POOL_MAX_REGIONS 16u
#define POOL_FINGERPRINT_TEXT 2048u
/* The smallest heap region a pool may have: the allocator's root and a page
 * for the first chunk (what dheap_attach accepts), in whole pages. Heap
 * regions are whole pages; pool_create makes them 16 pages or more. */
#define POOL_MIN_HEAP_SIZE 8192u
/* No head slot names a log position or a sequence number beyond this (2^62:
 * centuries of writing at any speed). A slot that does is not valid: a
 * position near 2^64 made the log's tail wrap, and the backend then never
 * applied a frame while the frontend overwrote the ring (found by a review,
 * session 39). */
#define POOL_MAX_LSN (1ull << 62)

typedef struct pool_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size;      /* sizeof(pool_header) */
    uint64_t pool_size;        /* bytes; the file must be exactly this long */
    uint32_t created_mode;     /* persist_mode at creation (informational) */
    uint32_t region_count;
    uint64_t log_offset;
    uint64_t log_size;
    uint64_t heap_base;        /* virtual address of the durable heap */
    uint64_t heap_capacity;
    uint64_t create_time;      /* seconds since the epoch */
    uint64_t fingerprint;      /* hash of the process layout (layout.h) */
    uint32_t region_table_crc; /* CRC-32C of region_count pool_region entries */
    uint32_t reserved0;
    char fingerprint_text[POOL_FINGERPRINT_TEXT]; /* human-readable layout */
    uint32_t header_crc;       /* CRC-32C of all bytes before this field */
    uint32_t reserved1;
} pool_header;

/* Where the backend has applied the log up to. Two slots alternate so a torn
 * or corrupt slot leaves the other one valid; the larger valid `advance` wins.
 * The frontend never reuses log space past the older slot's head. */
typedef struct pool_head_slot {
    uint64_t advance;    /* increments with every head update */
    uint64_t head_lsn;   /* log position of the first unapplied frame */
    uint64_t next_seq;   /* sequence number expected at head_lsn */
    uint64_t generation; /* incremented at every open; frames carry it */
    uint32_t clean;      /* 1: written by a clean shutdown */
    uint32_t crc;        /* CRC-32C of the bytes before this field */
    uint8_t pad[64 - 40];
} pool_head_slot;

enum pool_region_kind {
    POOL_REGION_HEAP = 1, /* durable heap: copied whole up to the allocator's top */
    POOL_REGION_DATA = 2, /* executable .data/.bss: restored where the bitmap says */
};

typedef struct pool_region {
    uint32_t kind;
    uint32_t reserved;
    uint64_t vaddr;         /* 32-byte aligned */
    uint64_t size;          /* multiple of 32 */
    uint64_t mirror_offset; /* pool offset of the persistent copy */
    uint64_t bitmap_offset; /* data regions: one bit per byte written by RW commands */
    /* Data regions: how many of its first bytes only the dynamic loader
     * writes (the end of RELRO, the lazy-binding GOT: layout.h, data_start);
     * no bitmap bit or log block may name one. 0: not recorded (a pool made
     * before session 41, when this field was reserved and zero; recovery
     * then takes the bound from the running program). Heap regions: 0. */
    uint64_t loader_bytes;
} pool_region;

_Static_assert(sizeof(pool_head_slot) == 64, "head slot is one cache line");
_Static_assert(sizeof(pool_header) <= 4096, "header fits its page");
_Static_assert(sizeof(pool_region) * POOL_MAX_REGIONS <= 4096, "regions fit their page");

#endif
