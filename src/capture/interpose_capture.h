/* interpose_capture.h -- what every libc interposer reports, and how
 * (libc_interpose.c, libc_interpose_outparams.c): CAPTURE(p, n) reports the
 * bytes a wrapped function wrote when this thread runs a read-write command;
 * mango_capture then keeps those inside a durable range. Private to
 * src/capture. */
#ifndef MANGO_INTERPOSE_CAPTURE_H
#define MANGO_INTERPOSE_CAPTURE_H

#include "capture/capture.h"
#include "mango.h"

#define unlikely(x) __builtin_expect(!!(x), 0)

#define CAPTURE(p, n)                                                            \
    do {                                                                         \
        if (unlikely(mango_capture_active))                                      \
            mango_capture((const void *)(p), (size_t)(n));                       \
    } while (0)

#endif
