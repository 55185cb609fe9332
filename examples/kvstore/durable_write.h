/* durable_write.h -- the ONLY place the examples call mango_capture().
 *
 * Until the mango-cc compiler plugin captures stores automatically, every
 * store the key-value stores make to durable state goes through these helpers.
 * When the plugin lands, they become plain stores and this file disappears.
 */
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
