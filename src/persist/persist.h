/* persist.h -- every ordering point of Mangosteen goes through here.
 *
 * A persist_domain is one mapped pool in one persistence mode. Writers flush
 * the byte ranges they wrote, then either fence (order) or sync (wait until
 * durable). What each call does depends on the mode:
 *
 *   mode      flush(range)              fence      sync
 *   pmem      clwb each 64 B line       sfence     sfence
 *   fs        remember the page range   -          msync(MS_SYNC) one range, fdatasync several
 *   emulated  -                         -          - (tmpfs; process crashes only)
 *   none      -                         -          -
 *   sim       remember the 64 B lines   -          pwrite the lines to the file
 *
 * In sim mode the pool is mapped privately: the file only ever holds what a
 * sync wrote, so a killed process leaves exactly what a power failure would
 * (at cache-line granularity, with every flushed-but-unsynced line lost).
 *
 * A crash simulator can observe every store/flush/fence/sync through
 * persist_set_observer(). Counters record syncs for benchmarks.
 */
#ifndef MANGO_PERSIST_H
#define MANGO_PERSIST_H

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

typedef struct persist_domain {
    persist_mode mode;
    char *base;
    size_t len;
    int fd;
    bool failed; /* a sync failed: nothing may be acknowledged any more */
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

/* Counters (atomic). */
uint64_t persist_sync_count(void);

#endif
