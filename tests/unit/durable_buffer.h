/* durable_buffer.h -- a test state of one buffer of BUF_BYTES (defined by
 * the includer) in the durable heap, its pointer in .bss, and the writes of
 * write_bytes bytes of value at slot `turn` into it, each captured. */
#ifndef MANGO_TEST_DURABLE_BUFFER_H
#define MANGO_TEST_DURABLE_BUFFER_H

#include <stdlib.h>
#include <string.h>

#include "mango.h"

static unsigned char *buf; /* .bss, durable: points into the durable heap */

/* mango_callbacks.init_state */
static void init_state(void *arg)
{
    (void)arg;
    buf = malloc(BUF_BYTES);
    memset(buf, 0, BUF_BYTES);
    mango_capture(&buf, sizeof buf);
    mango_capture(buf, BUF_BYTES);
}

/* The turn-th write of write_bytes bytes of value (the buffer wraps). */
static void write_slot(unsigned turn, unsigned write_bytes, int value)
{
    unsigned off = (turn * write_bytes) % BUF_BYTES;
    memset(buf + off, value, write_bytes);
    mango_capture(buf + off, write_bytes);
}

#endif
