/* verify.h -- the capture verifier (test mode, issue #3).
 *
 * With mango_config.verify_capture or MANGO_VERIFY_CAPTURE=1, every read-write
 * batch is bracketed by a snapshot of durable memory (the durable ranges the
 * capture filter knows: the durable heap up to its carved top, and the
 * executable's .data/.bss) and a diff at 32-byte block granularity. A block
 * whose changed bytes are not all covered by the dedup set's mask for it is a
 * missed store: the redo log would not carry it, so recovery would lose it.
 * Each one is reported (address, bytes, the global or heap field it falls in)
 * to stderr or $MANGO_VERIFY_REPORT and counted in mango_stats.
 *
 * The runtime's own globals share the executable's .bss with the application
 * and change during a batch (counters, the backend thread's state); the
 * verifier recognises them through the executable's symbol table (local
 * symbols of the runtime's source files) and does not report them.
 *
 * Cost: two passes over all durable bytes per batch (copy, compare). For tests.
 */
#ifndef MANGO_CAPTURE_VERIFY_H
#define MANGO_CAPTURE_VERIFY_H

#include <stdbool.h>
#include <stdint.h>

#include "capture/dedup_set.h"

/* Called by mango_init after capture_set_ranges(). Enables the verifier when
 * `want` or MANGO_VERIFY_CAPTURE=1; [heap_lo, heap_hi) is the durable heap
 * range (a dheap_root at heap_lo gives the carved top). Resets the counters.
 * Returns 0, or a negative MANGO_E* code if the shadow cannot be mapped. */
int capture_verify_setup(bool want, uintptr_t heap_lo, uintptr_t heap_hi);
bool capture_verify_enabled(void);

/* Batch hooks (combiner thread only). begin: after capture is switched on and
 * before any code of the batch writes (before deferred frees are drained).
 * end: after capture is switched off, before the set is consumed. */
void capture_verify_begin(unsigned n_commands);
void capture_verify_end(const dedup_set *set);
/* An open batch stops (pause) and starts (resume) capturing. With
 * MANGO_VERIFY_PAUSED=ignore, .data/.bss bytes changed in between are not
 * reported (the application's transient bookkeeping); durable-heap stores
 * made in between still are. Otherwise, and outside a verified batch,
 * no-ops. Call pause only on a capturing -> paused transition. */
void capture_verify_pause(void);
void capture_verify_resume(void);

/* Counters since setup (readable after shutdown). */
void capture_verify_stats(uint64_t *batches, uint64_t *missed_blocks);

/* Writes the totals line, releases the shadow and closes the report. */
void capture_verify_shutdown(void);

/* Is `name` (an STT_FILE symbol: a source basename) one of the runtime's own
 * source files, whose globals are never reported? (tests) */
bool capture_verify_is_runtime_file(const char *name);

#endif
