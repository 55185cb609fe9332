/* counter_state.h -- the smallest durable state, shared by the runtime tests
 * that need only one value: a uint64_t in the durable heap (counter, a .bss
 * pointer, durable too) that init_state sets to 0 and every read-write
 * command (bump) increments. Nothing is read-only. For RPC mode, clients
 * with no state of their own and an empty response (counter_rpc_*). */
#ifndef MANGO_TEST_COUNTER_STATE_H
#define MANGO_TEST_COUNTER_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "mango.h"

static uint64_t *counter;

static void init_state(void *arg)
{
    (void)arg;
    counter = malloc(sizeof *counter);
    *counter = 0;
    mango_capture(&counter, sizeof counter);
    mango_capture(counter, sizeof *counter);
}
static bool is_ro(void *c) { (void)c; return false; }
static void bump(void *c)
{
    (void)c;
    (*counter)++;
    mango_capture(counter, sizeof *counter);
}

static inline void *counter_rpc_init_client(void *params)
{
    (void)params;
    return malloc(1);
}
static inline void counter_rpc_destroy_client(void *ctx) { free(ctx); }
static inline mango_response counter_rpc_get_response(void *ctx)
{
    (void)ctx;
    return (mango_response){"", 0};
}

#endif
