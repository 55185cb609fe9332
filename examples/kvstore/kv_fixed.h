/* kv_fixed.h -- the paper's Listing 2 key-value store: fixed-size values in a
 * durable array addressed by index, plus a per-client table of the sequence
 * number of the last PUT applied. The table is bookkeeping, not a duplicate
 * filter: kv_fixed_process applies every PUT and records its seq as given,
 * so a repeated or stale seq is applied again (a client that retries must
 * compare its seq with kv_fixed_client_seq itself). The drivers number each
 * client's PUTs 1, 2, ... from it after a restart, and the crash test uses
 * it to check that acknowledged PUTs survived and batches were never
 * half-applied. */
#ifndef KV_FIXED_H
#define KV_FIXED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_MAX_CLIENTS 64

enum kv_op { KV_GET = 1, KV_PUT = 2, KV_FILL = 3 /* bulk load: every value := fill pattern */ };

typedef struct kv_fixed_cmd {
    int op;
    uint32_t index;
    uint32_t client;   /* < KV_MAX_CLIENTS */
    uint64_t seq;      /* PUT: client's request number, recorded durably (not checked) */
    const char *value; /* PUT: value_size bytes; FILL: one value copied everywhere */
    char *out;         /* GET: value_size bytes of output */
    int status;        /* 0 ok, -1 bad index */
} kv_fixed_cmd;

typedef struct kv_fixed_params {
    uint32_t n_values;
    uint32_t value_size;
} kv_fixed_params;

/* Run as mango's init_state (under capture). */
void kv_fixed_init(void *params /* kv_fixed_params* */);
bool kv_fixed_is_read_only(void *cmd);
void kv_fixed_process(void *cmd);
/* mango's request_keys: a GET or PUT names its index; FILL writes every
 * value, so it names none (-1). The per-client table and the PUT count are
 * bookkeeping no command reads (inspected after mango_init only). Inline:
 * it reads only the command, so the hand-annotated build shares it. */
static inline int kv_fixed_request_keys(void *cmd, uint64_t *keys, unsigned max)
{
    const kv_fixed_cmd *c = cmd;
    if (c->op == KV_FILL || max < 1)
        return -1;
    keys[0] = c->index;
    return 1;
}

/* Test only: a GET names index + 1 instead, so it may answer before the PUT
 * it read is durable (tests/linearizability must catch it). */
static inline int kv_fixed_request_wrong_keys(void *cmd, uint64_t *keys, unsigned max)
{
    int n = kv_fixed_request_keys(cmd, keys, max);
    if (n == 1 && ((const kv_fixed_cmd *)cmd)->op == KV_GET)
        keys[0] += 1;
    return n;
}

/* Inspection (after mango_init): */
uint32_t kv_fixed_n_values(void);
uint32_t kv_fixed_value_size(void);
const char *kv_fixed_value(uint32_t index);
uint64_t kv_fixed_client_seq(uint32_t client);
/* PUTs applied in total; clients number their PUTs 1, 2, ... so this equals
 * the sum of kv_fixed_client_seq() unless a batch was half-applied. */
uint64_t kv_fixed_total_puts(void);

#endif
