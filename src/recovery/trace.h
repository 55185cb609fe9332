/* trace.h -- phase timestamps of start-up and recovery, for profiling.
 *
 * With MANGO_TRACE_RECOVERY=1 in the environment, recovery_trace("phase")
 * writes one line to stderr:
 *
 *   mango-trace <pid> <abs> +<ms> <phase>
 *
 * <abs> is CLOCK_MONOTONIC in seconds (the clock Python's time.monotonic()
 * reads, so an external driver can line its exec and first-PING times up with
 * these), +<ms> the time since the previous line of this process. Off (the
 * default) it costs one cached getenv test per call. No allocation.
 */
#ifndef MANGO_RECOVERY_TRACE_H
#define MANGO_RECOVERY_TRACE_H

#include <stdbool.h>

bool recovery_trace_enabled(void);
void recovery_trace(const char *phase);
/* printf-style variant for phases that carry numbers (bytes, frames). */
void recovery_tracef(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
