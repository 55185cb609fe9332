/* durable_write.h -- hand annotation for the explicit-capture benchmark
 * baseline: each helper stores, then reports the bytes with mango_capture(). */
#ifndef KV_DURABLE_WRITE_H
#define KV_DURABLE_WRITE_H

#include <string.h>

#include "mango.h"

/* memcpy into durable memory. */
static inline void dw_copy(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    mango_capture(dst, n);
}

/* memset of durable memory. */
static inline void dw_fill(void *dst, int c, size_t n)
{
    memset(dst, c, n);
    mango_capture(dst, n);
}

/* Scalar or pointer store: DW_SET(obj->field, value). */
#define DW_SET(lvalue, value)                              \
    do {                                                   \
        (lvalue) = (value);                                \
        mango_capture(&(lvalue), sizeof(lvalue));          \
    } while (0)

#endif
