/* capture.h -- the capture entry point: which stores are recorded, and where.
 *
 * While a thread runs a read-write batch, mango_capture_active is true on it and
 * every reported store whose bytes fall inside a durable range (the durable
 * heap, the executable's .data/.bss) is added to the combiner's dedup set.
 * Stores to anything else (stack, transient heap, libraries) are dropped.
 */
#ifndef MANGO_CAPTURE_H
#define MANGO_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capture/dedup_set.h"

#define CAPTURE_MAX_RANGES 8

extern __thread bool mango_capture_active __attribute__((tls_model("initial-exec")));

/* Durable ranges, set once at init (before any batch). */
void capture_set_ranges(unsigned n, const uintptr_t *lo, const uintptr_t *hi);
bool capture_is_durable(uintptr_t addr, size_t len);
/* Copy the registered durable ranges into lo/hi (at most max); returns how
 * many there are. (Used by the capture verifier, verify.h.) */
unsigned capture_get_ranges(uintptr_t *lo, uintptr_t *hi, unsigned max);

/* Referenced by mango_init so the libc interceptors (libc_interpose.c,
 * libc_interpose_outparams.c) are always linked in. */
void libc_interpose_link_anchor(void);
void libc_interpose_outparams_link_anchor(void);

/* Signal handlers (signal_interpose.c): every handler the program installs
 * runs with capture and durable allocation off. The handlers entered on this
 * thread and not returned from (left by siglongjmp) since the count was last
 * reset; the runtime resets it when a batch begins and refuses to commit a
 * batch that ends with one counted. The anchor is referenced by mango_init
 * so the interposer is always linked in. */
unsigned signal_handlers_unreturned(void);
void signal_handlers_reset(void);
void signal_interpose_link_anchor(void);

/* mango_capture() for stores of at most 32 bytes that are usually inside
 * the durable heap (the durable allocator's metadata): the inline fast path
 * first. Same result as mango_capture(). */
void capture_small_store(const void *addr, size_t len);

/* Log stores of min_bytes or more into the durable heap (range 0) as data
 * ranges (dedup_set.h); 0: never. 0 until the runtime sets it (to
 * DEDUP_RANGE_MIN by default; 0 under the capture verifier, which compares
 * blocks). */
void capture_set_data_ranges(size_t min_bytes);

/* Bulk loading (mango_batch_bulk_begin): while on, stores into range 0 (the
 * durable heap) are not captured: the inline fast path is narrowed to
 * .data/.bss and the slow path skips the heap. .data/.bss stores still are. */
void capture_set_heap_bulk(bool on);
bool capture_heap_bulk(void);

/* The combiner brackets a batch with these. */
void capture_begin(dedup_set *set);
void capture_end(void);

#endif
