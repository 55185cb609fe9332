/* kv_workload.h -- deterministic write contents for the crash test.
 *
 * Client t's request number s writes value_of(t, s) to index_of(t, s). Indexes
 * are partitioned by client (index % clients == t), so each index has a single
 * writer and its expected value after recovery is a pure function of the
 * client's durable sequence number. */
#ifndef KV_WORKLOAD_H
#define KV_WORKLOAD_H

#include <stdint.h>
#include <string.h>

static inline uint64_t kvw_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static inline uint32_t kvw_index(uint32_t t, uint64_t s, uint32_t clients, uint32_t n_values)
{
    uint32_t per = n_values / clients;
    return t + clients * (uint32_t)(kvw_mix(((uint64_t)t << 40) ^ s) % per);
}

/* Fill buf with the value of write (t, s) at index idx: a 16-byte header then
 * a pseudo-random pattern, so a partially applied value never verifies. */
static inline void kvw_value(char *buf, uint32_t size, uint32_t t, uint64_t s, uint32_t idx)
{
    uint64_t hdr[2] = {((uint64_t)t << 32) | idx, s};
    uint64_t x = kvw_mix(hdr[0] ^ kvw_mix(s));
    uint32_t i = 0;
    memcpy(buf, hdr, size < 16 ? size : 16);
    for (i = 16; i < size; i += 8) {
        x = kvw_mix(x + 0x9e3779b97f4a7c15ull);
        memcpy(buf + i, &x, size - i < 8 ? size - i : 8);
    }
}

#endif
