/* kv_hashmap.h -- a resizable chained hash map with variable-size keys and
 * values: the kind of pointer-rich structure (nodes, a bucket array that is
 * reallocated on growth, frees) that durable memory must get right. */
#ifndef KV_HASHMAP_H
#define KV_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kvh_op { KVH_GET = 1, KVH_PUT = 2, KVH_DEL = 3 };

typedef struct kvh_cmd {
    int op;
    const char *key;
    size_t key_len;
    const char *value; /* PUT */
    size_t value_len;
    char *out;         /* GET: output buffer */
    size_t out_cap;
    size_t out_len;    /* GET: value length */
    int status;        /* 0 found/ok, 1 not found, -1 value does not fit out */
} kvh_cmd;

void kvh_init(void *unused); /* mango init_state */
bool kvh_is_read_only(void *cmd);
void kvh_process(void *cmd);
/* mango's request_keys: the hash of the key (growing the bucket array moves
 * nodes, but no GET's answer depends on where they are). */
int kvh_request_keys(void *cmd, uint64_t *keys, unsigned max);

uint64_t kvh_count(void);
uint64_t kvh_buckets(void);
/* Consistency walk (tests): 0 if every node hashes to its bucket and the
 * count matches. */
int kvh_check(void);

#endif
