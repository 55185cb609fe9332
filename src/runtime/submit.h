/* submit.h -- the runtime's command submission with a choice, for RPC mode's
 * workers (runtime.c; the public form is mango_client_submit). */
#ifndef MANGO_RUNTIME_SUBMIT_H
#define MANGO_RUNTIME_SUBMIT_H

#include <stdbool.h>
#include <stdint.h>

/* mango_client_submit, but with may_wait the caller lets the combiner sync
 * the batch under the lock when that is cheaper (nothing in flight, no reader
 * waiting: the flat-combining rule of docs/architecture.md); *ticket is then
 * 0. A caller with other work at hand passes false: its batch goes to the
 * sync thread and it returns at once. */
int runtime_submit(void *ctx, uint64_t *ticket, bool may_wait);

#endif
