/* trace.c -- MANGO_TRACE_RECOVERY phase timestamps (trace.h). */
#define _GNU_SOURCE
#include "recovery/trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int enabled = -1;
static double last;

bool recovery_trace_enabled(void)
{
    if (enabled < 0) {
        const char *v = getenv("MANGO_TRACE_RECOVERY");
        enabled = v && *v && strcmp(v, "0") != 0;
    }
    return enabled;
}

static void emit(const char *phase)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    char buf[400];
    int n = snprintf(buf, sizeof buf, "mango-trace %d %.6f +%.3f %s\n", (int)getpid(), t,
                     last > 0 ? (t - last) * 1e3 : 0.0, phase);
    last = t;
    if (n > 0)
        (void)!write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

void recovery_trace(const char *phase)
{
    if (recovery_trace_enabled())
        emit(phase);
}

void recovery_tracef(const char *fmt, ...)
{
    if (!recovery_trace_enabled())
        return;
    char phase[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(phase, sizeof phase, fmt, ap);
    va_end(ap);
    emit(phase);
}
