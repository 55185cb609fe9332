/* pool.h -- creating, validating, locking and mapping a pool file.
 *
 * Every check (size, magic, version, checksums, region table, and the
 * opener's layout and heap address) runs on a read-only view first, so a bad
 * pool is reported and left byte-for-byte unchanged. Only then may a writable
 * open write: a sparse pool (a backup) gets its blocks and its log ring
 * written once, which changes no byte of its contents. A writable open holds an exclusive flock for as long
 * as the pool is open; a second process gets MANGO_EBUSY.
 */
#ifndef MANGO_POOL_H
#define MANGO_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "persist/persist.h"
#include "pool/pool_format.h"

typedef struct pool {
    int fd;
    char *base;
    size_t size;
    persist_domain pd;
    const pool_header *hdr; /* inside the mapping */
    pool_head_slot *slots;  /* the two slots, inside the mapping */
    pool_region regions[POOL_MAX_REGIONS];
    unsigned nregions;
    /* Per data region: the bytes below this address are the dynamic
     * loader's (the end of RELRO, the lazy-binding GOT: layout.h,
     * data_start), never written by the program, so a pool whose bitmap or
     * log marks one is refused before recovery writes anything. pool_open
     * sets it from the region table (pool_region.loader_bytes), so the mango
     * CLI sees it too; the runtime then sets it from its own layout. 0
     * (unknown: a pool made before session 41, opened by the CLI) checks
     * nothing. */
    uint64_t loader_end[POOL_MAX_REGIONS];
    pool_head_slot head;    /* validated copy of the newest slot */
    unsigned head_slot;     /* index of the newest slot */
    uint64_t older_head_lsn;/* head_lsn of the other slot (log reuse limit) */
    bool slot_damaged;      /* one slot failed its checksum (the other was used) */
    bool writable;
    /* "<pool file>.bigbatch": where batches too large for a log frame go
     * (log/big_batch.h). Part of the pool's state while a frame names it. */
    char big_batch_path[4096 + 16];
} pool;

typedef struct pool_create_params {
    size_t pool_size;
    size_t log_size;
    persist_mode mode;
    uint64_t heap_base;
    unsigned n_data;          /* executable data regions */
    uint64_t data_vaddr[POOL_MAX_REGIONS - 1];
    uint64_t data_size[POOL_MAX_REGIONS - 1];
    uint64_t data_loader_bytes[POOL_MAX_REGIONS - 1]; /* pool_region.loader_bytes (0: unknown) */
    uint64_t fingerprint;
    const char *fingerprint_text;
    /* Optional: fill the new pool's region mirrors before it is synced and
     * given its name (a snapshot, snapshot/snapshot.h). base maps the whole
     * new file, fd is open on it read-write; regs are its n regions.
     * MANGO_OK, or an error (nothing is left at path). */
    int (*fill)(void *arg, char *base, int fd, const pool_region *regs, unsigned n);
    void *fill_arg;
    /* A sparse file: no blocks reserved, the log ring not written ahead
     * (a backup's, as `mango copy` writes them; see pool_create). */
    bool sparse;
} pool_create_params;

/* Create a new pool at path (fails with MANGO_EEXIST if it exists, also when
 * another process creates it meanwhile: a pool is never replaced). Built in a
 * temporary file and renamed into place, so a crash never leaves half a pool. */
int pool_create(const char *path, const pool_create_params *params);
/* A creation (tag ".tmp.") or a `mango copy` (".copying-") killed before its
 * rename leaves "<path><tag><pid>", and "<path><tag><pid>.bigbatch", as
 * large as a pool: remove those of path whose process is gone, calling
 * removed(file, pid, bytes) for each. */
typedef void (*pool_removed_fn)(const char *file, long pid, long long bytes);
void pool_remove_abandoned(const char *path, const char *tag, pool_removed_fn removed);
/* Does path's file name have the form of a file that the pool named by the
 * rest of it owns: "<pool>.bigbatch" (removed by recovery and a clean
 * shutdown, rewritten by big batches), "<pool>.tmp.<pid>" or
 * "<pool>.copying-<pid>" (removed as abandoned once that process is gone)?
 * The suffix's pattern (".bigbatch", ".tmp.<pid>", ".copying-<pid>"), or
 * NULL. A backup must not be given such a name. */
const char *pool_owned_name_pattern(const char *path);
/* Move a finished temporary file tmp to path unless path exists
 * (renameat2 RENAME_NOREPLACE, or a hard link where the file system lacks
 * it). 0, or an errno (EEXIST: path exists; tmp is left in place). */
int pool_publish_no_replace(const char *tmp, const char *path);

/* Open and validate. mode AUTO (0) picks the mode from the file system.
 * writable: lock exclusively and map read-write. */
int pool_open(pool *p, const char *path, persist_mode mode, bool writable);
/* What the opener needs the pool to be: written by a process with this
 * layout (fingerprint), with its durable heap at heap_base and, when n_data
 * is not 0, with exactly these executable data regions (vaddr and size, in
 * any order). The fingerprint hashes each object's path, load address and
 * build-id but not its segments' sizes: a binary without a build-id rebuilt
 * at the same path with other .data/.bss keeps its fingerprint, and only
 * this comparison tells that recovery would write old bytes over other
 * variables (or over unmapped memory, for a crafted table). */
typedef struct pool_expect {
    uint64_t fingerprint;
    const char *fingerprint_text;
    uint64_t heap_base;
    unsigned n_data;
    uint64_t data_vaddr[POOL_MAX_REGIONS - 1];
    uint64_t data_size[POOL_MAX_REGIONS - 1];
} pool_expect;
/* pool_open that also checks expect (may be NULL) on the read-only view,
 * before a writable open writes anything (a sparse pool's fill): a pool
 * refused for its layout is left as it was, blocks and all. */
/* What a file that is not a regular file is ("a directory", "a FIFO", "a
 * socket", ...), for messages that refuse it. */
const char *pool_file_kind(mode_t m);
int pool_open_expecting(pool *p, const char *path, persist_mode mode, bool writable, const pool_expect *expect);
void pool_close(pool *p);
/* In a fork() child: drop this process's mapping and descriptors of the pool
 * file without writing anything (no sync, no unlock: the lock belongs to
 * the parent and goes with its last reference). Async-signal-safe. */
void pool_forget_in_child(pool *p);

/* Check the pool was written by a process with this layout. */
int pool_check_fingerprint(const pool *p, uint64_t fingerprint, const char *text);

/* Is this head slot usable: its checksum matches and its head_lsn is a frame
 * position (64-byte aligned, as every frame is)? A slot that is not counts as
 * corrupt: the other one is used, as for a checksum mismatch. */
bool pool_slot_valid(const pool_head_slot *s);

/* Persist a new head into the older slot (flush + sync), making it the newest. */
int pool_write_head(pool *p, uint64_t head_lsn, uint64_t next_seq, uint64_t generation,
                    bool clean);

static inline char *pool_log(const pool *p) { return p->base + p->hdr->log_offset; }
const pool_region *pool_find_region(const pool *p, unsigned kind);
/* MANGO_EBADPOOL (the message names the byte) if a data region's bitmap
 * marks a byte below its loader_end, else MANGO_OK. */
int pool_check_loader_bits(const pool *p);

/* Choose the mode for a file: tmpfs -> emulated, DAX (MAP_SYNC works) -> pmem,
 * else fs. */
persist_mode pool_detect_mode(int fd, size_t size);

/* Are the n bytes at b all zero? Pool files are written sparse (snapshots,
 * `mango copy`), their zero chunks left as holes, and a sparse pool's holes
 * are filled only where they read back as zeros (pool_open). */
static inline bool pool_bytes_zero(const void *b, size_t n)
{
    const char *c = (const char *)b;
    return n == 0 || (c[0] == 0 && memcmp(c, c + 1, n - 1) == 0);
}

#endif
