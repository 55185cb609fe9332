/* kvstore_driver.h -- what the kvstore drivers share: options, the crash
 * tests' acknowledgement file, starting the store. */
#ifndef KVSTORE_DRIVER_H
#define KVSTORE_DRIVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_fixed.h"
#include "mango.h"

typedef struct opts {
    const char *cmd, *pool, *ack;
    const char *history;    /* history-worker/-test: log folder */
    uint32_t keys;          /* history-worker/-test: keys (default 8) */
    unsigned think_us;      /* history-worker/-test: mean pause between a client's ops */
    mango_persist_mode mode;
    size_t pool_size, log_size;
    unsigned threads, rounds, update_pct, min_ms, max_ms;
    uint32_t values, value_size;
    double seconds;
    uint64_t ops, seed;
    unsigned images;        /* powerfail: crash images to check */
    bool recovery_crashes;  /* powerfail: also crash inside recovery */
    bool cut_recovery;      /* verify: cut a crash image inside recovery (exit 3) */
    double zipf;            /* run: Zipfian key skew (0 = uniform) */
    bool tolerate_empty;    /* verify: a recovered pool without the store is a loss, not an error */
    const char *read_keys;  /* on (default), off, wrong (test: see kv_fixed.h) */
    bool quiet, seconds_set;
    bool values_set, value_size_set; /* given on the command line (demo) */
    char self[4096];
} opts;

extern opts O;

/* The hash-map crash test's record of what was acknowledged (hashmap
 * --ack FILE; kv_hashmap_ack.c): per key, the value length the last
 * acknowledged PUT or DEL left, and the command in flight. */
typedef struct hm_ack hm_ack;
/* Open (creating, every key absent) the record for `keys` keys; exits 2 if
 * the file was made for another number of keys. */
hm_ack *hm_ack_open(const char *path, uint32_t keys);
/* Compare the recovered lengths (0: absent) with the record: the number of
 * keys that lost an acknowledged command (the first few are printed). The
 * recovered lengths then become the record. */
uint64_t hm_ack_check(hm_ack *a, const uint32_t *recovered);
/* PUTs and DELs acknowledged so far, over all runs on the file. */
uint64_t hm_ack_total(const hm_ack *a);
/* Around one PUT (len: its value's length) or DEL (len 0) of key; applied:
 * the command changed the map (a PUT that found no memory did not). */
void hm_ack_begin(hm_ack *a, uint32_t key, uint32_t len);
void hm_ack_end(hm_ack *a, uint32_t key, uint32_t len, bool applied);

/* The crash tests' record of what was acknowledged: a small shared file that
 * survives the worker's SIGKILL. */
#define ACK_MAGIC 0x4b43414f474e414dull /* "MANGOACK" */
typedef struct ack_slot {
    _Atomic uint64_t acked;    /* highest seq whose PUT returned */
    _Atomic uint64_t inflight; /* seq of the PUT issued and not yet returned */
    char pad[48];
} ack_slot;
typedef struct ack_file {
    uint64_t magic;
    uint32_t threads, values, value_size, pad;
    _Atomic uint64_t total_acked;
    _Atomic uint64_t total_lost; /* acknowledged PUTs missing after recovery */
    _Atomic uint64_t total_torn; /* values not equal to any complete write */
    char pad2[16];
    ack_slot slot[KV_MAX_CLIENTS];
} ack_file;

ack_file *open_ack(bool create);
/* One acknowledged PUT of the crash tests: client's request number *seq + 1
 * writes its deterministic value (kv_workload.h); the in-flight mark is set
 * before the command and the ack mark after it. Advances *seq on success;
 * returns mango_client_cmd's result. val: O.value_size bytes of scratch. */
int kv_acked_put(uint32_t client, uint64_t *seq, ack_slot *a, char *val);
/* Open (creating) an acknowledgement file at path for the options in O. */
ack_file *open_ack_at(const char *path);
void die_usage_msg(const char *msg);
/* The --mode argument that selects m ("auto" for MANGO_PERSIST_AUTO). */
const char *kv_mode_name(mango_persist_mode m);
/* crash-test, history-test: --mode none (nothing durable) is a usage error. */
void kv_refuse_mode_none(const char *cmd);
/* verify --cut-recovery: install the simulator so recovery is cut (exit 3). */
void powerfail_cut_recovery(const char *pool_path, uint64_t seed);
/* The request_keys callback --read-keys asks for: keyed, or NULL (off). */
typedef int kv_keys_fn(void *cmd, uint64_t *keys, unsigned max);
kv_keys_fn *kv_read_keys_callback(kv_keys_fn *keyed);
/* Start the fixed-size store with the options in O; exits 2 on error. */
int start_fixed(void);
/* Recover and check against O.ack; 0 ok, 1 lost/torn. */
int run_verify(uint64_t *lost_out, uint64_t *torn_out);
/* kvstore powerfail (kv_powerfail.c). */
int run_powerfail(void);
/* kvstore history-worker / history-test (kv_history.c). */
int run_history_worker(void);
int run_history_test(void);

#endif
