/* persist.h -- every ordering point of Mangosteen goes through here.
 *
 * A persist_domain is one mapped pool in one persistence mode. Writers flush
 * the byte ranges they wrote, then either fence (order) or sync (wait until
 * durable). What each call does depends on the mode:
 *
 *   mode      flush(range)              fence      sync
 *   pmem      clwb each 64 B line       sfence     sfence
 *   fs        remember the page range   -          msync(MS_SYNC) one range, fdatasync several;
 *                                                  pwrite(O_DSYNC) the pages of a write-through window
 *   emulated  -                         -          - (tmpfs; process crashes only)
 *   none      -                         -          -
 *   sim       remember the 64 B lines   -          pwrite the lines to the file
 *
 * In sim mode the pool is mapped privately: the file only ever holds what a
 * sync wrote, so a killed process leaves exactly what a power failure would
 * (at cache-line granularity, with every flushed-but-unsynced line lost).
 * The big-batch file beside it is staged the same way (persist_sync_file).
 *
 * A crash simulator can observe every store/flush/fence/sync through
 * persist_set_observer(). Counters record syncs for benchmarks.
 */
#ifndef MANGO_PERSIST_H
#define MANGO_PERSIST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum persist_mode {
    PERSIST_EMULATED = 1,
    PERSIST_FS = 2,
    PERSIST_PMEM = 3,
    PERSIST_NONE = 4,
    PERSIST_SIM = 5, /* test: private mapping, sync pwrite()s flushed lines to the file */
} persist_mode;

const char *persist_mode_name(persist_mode m);

/* Byte ranges flushed but not yet synced (fs mode). One per writer thread. */
#define PERSIST_MAX_RANGES 8
typedef struct persist_ranges {
    unsigned n;
    uintptr_t lo[PERSIST_MAX_RANGES], hi[PERSIST_MAX_RANGES];
} persist_ranges;

/* How the pages of a write-through window reach the file (fs mode). */
typedef enum persist_wt_kind {
    PERSIST_WT_NONE = 0,  /* no window: msync like the rest of the mapping */
    PERSIST_WT_DIRECT,    /* pwrite through an O_DIRECT|O_DSYNC descriptor */
    PERSIST_WT_BUFFERED,  /* pwrite through an O_DSYNC descriptor (page cache) */
} persist_wt_kind;

typedef struct persist_domain {
    persist_mode mode;
    char *base;
    size_t len;
    int fd;
    /* A sync failed: nothing may be acknowledged any more. Set by whichever
     * thread's sync failed (a combiner, the sync thread, the backend) and read
     * by the others, so atomic. */
    _Atomic bool failed;
    /* fs mode: the write-through window [wt_lo, wt_hi) (wt_hi == 0: none). */
    uintptr_t wt_lo, wt_hi;
    int wt_fd;
    persist_wt_kind wt_kind;
    size_t wt_align; /* file offset / length / memory alignment of its pwrites */
} persist_domain;

typedef enum persist_event {
    PERSIST_EV_STORE,  /* bytes written to the pool (reported by writers) */
    PERSIST_EV_FLUSH,
    PERSIST_EV_FENCE,
    PERSIST_EV_SYNC,       /* pmem/emulated: a fence over everything flushed;
                            * fs/sim: end of a sync whose ranges came before */
    PERSIST_EV_SYNC_RANGE, /* fs/sim: this byte range is being made durable */
} persist_event;

typedef void (*persist_observer_fn)(persist_event ev, const void *addr, size_t len,
                                    const char *where);
/* Install (or, with NULL, remove) the observer; any thread, at any time. Each
 * flush/fence/sync/note_store call reports all of its events to the observer
 * installed when it began, so a call in flight on another thread may still run
 * the old observer after this returns: an observer must stay callable until
 * the runtime is quiescent (e.g. after mango_shutdown). */
void persist_set_observer(persist_observer_fn fn);

/* Mapped pools, for observers that need a pool offset from an address. */
void persist_register_domain(persist_domain *d);
void persist_unregister_domain(persist_domain *d);
persist_domain *persist_domain_of(const void *addr);

/* Report a store into the pool (only the observer cares). */
void persist_note_store(const void *addr, size_t len, const char *where);
void persist_flush(persist_domain *d, persist_ranges *r, const void *addr, size_t len,
                   const char *where);
void persist_fence(persist_domain *d, const char *where);
/* Make every range in r durable, then empty r. 0, or -errno (then d->failed). */
int persist_sync(persist_domain *d, persist_ranges *r, const char *where);

/* fs mode: make [addr, addr + len) (page aligned, inside the mapping) a
 * write-through window. It is remapped privately, so its stores stay in this
 * process, and a sync writes its dirty pages to the file with pwrite() through
 * a second descriptor opened O_DSYNC (and O_DIRECT for PERSIST_WT_DIRECT)
 * instead of msync(). Such a sync touches no other dirty page of the file, no
 * page of the window is ever write-protected again after its first store, and
 * no TLB shoot-down reaches the other CPUs: the costs msync() has on a shared
 * mapping. Meant for the redo log, which is written only by this process and
 * always whole-page-synced. PERSIST_WT_DIRECT falls back to BUFFERED when the
 * file system refuses O_DIRECT. *used (may be NULL) gets the kind in effect.
 * A direct window's pages all stay in memory (len bytes, in time); a buffered
 * one's can be given back (persist_write_through_release).
 * Any other mode: nothing to do, MANGO_OK-style 0. Returns 0 or -errno. */
int persist_write_through(persist_domain *d, void *addr, size_t len, persist_wt_kind kind,
                          persist_wt_kind *used);
/* PERSIST_WT_BUFFERED window: [addr, addr + len) (page aligned) is durable
 * and will be rewritten before it is read again. Drop this process's copies
 * of its pages, which then read the page cache again (holding what was
 * written): the window's memory stays what is in use, not its whole size.
 * A no-op for a direct window, whose pages the page cache no longer holds
 * (reading them back would wait for the disk). */
void persist_write_through_release(persist_domain *d, void *addr, size_t len);
/* Close the window's descriptor (the mapping goes with the pool's). */
void persist_domain_release(persist_domain *d);

/* A file beside the pool that belongs to d's state (the big-batch file,
 * log/big_batch.h), written with pwrite(): make it durable (fdatasync) as a
 * sync of d. Counted and subject to fault injection like persist_sync; a
 * failure marks d failed. The observer sees it as PERSIST_EV_SYNC_RANGE with
 * no address (NULL, 0) followed by PERSIST_EV_SYNC. 0 or -errno.
 * Sim mode keeps such a file, too, holding only what a sync wrote: the writer
 * writes to a staging descriptor (persist_stage_file; -1 in other modes), and
 * this sync copies its first len bytes to fd, truncated to len, first. */
int persist_sync_file(persist_domain *d, int fd, int stage_fd, uint64_t len, const char *where);
/* Write [buf, buf + len) at off of a file persist_sync_file will sync,
 * across short writes. 0 or -errno. */
int persist_write_file(int fd, const void *buf, size_t len, uint64_t off);
/* *fd: in sim mode a volatile staging file for persist_sync_file (a memfd),
 * in any other mode -1 (write to the file itself). 0 or -errno. */
int persist_stage_file(const persist_domain *d, int *fd);

/* Pool creation, before any domain exists: make a new file's mapping and
 * the file durable, then (after its rename) its directory entry. Not seen by
 * the observer nor counted: creation is atomic by the rename, and a crash
 * before the directory sync only loses a pool that acknowledged nothing yet.
 * 0 or -errno. A fault is injected here only at the site
 * MANGO_FAULT_SYNC_SITE names (persist.c). base NULL: a file written with
 * write(), no mapping (`mango copy`'s copies). Also syncs the zeros pool_open writes into the log ring
 * of a sparse pool (a backup), which change no byte of it. */
int persist_sync_new_file(void *base, size_t len, int fd, const char *where);
int persist_sync_directory(const char *dir, const char *where);

/* Start writing [off, off + len) of fd back to the device and wait for it
 * (sync_file_range): not an ordering point (no device cache flush, no
 * metadata; a later persist_sync_new_file makes the file durable), only a
 * bound on the dirty pages a large writer queues in front of other syncs (a
 * snapshot's writer). Where the kernel or file system lacks it, nothing.
 * Not counted; faults as persist_sync_new_file's. 0 or -errno. */
int persist_writeback(int fd, uint64_t off, uint64_t len, const char *where);

/* Counters (atomic). */
uint64_t persist_sync_count(void);

#endif
