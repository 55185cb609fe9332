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

/* Zipfian key choice over [0, n) as YCSB draws it (Gray et al.'s method),
 * then scrambled with a hash so the hot keys are spread over the store. */
typedef struct kvw_zipf {
    uint64_t n;
    double theta, alpha, zetan, eta, half_pow_theta;
} kvw_zipf;

#include <math.h>

static inline void kvw_zipf_init(kvw_zipf *z, uint64_t n, double theta)
{
    double zeta2 = 0;
    z->n = n;
    z->theta = theta;
    z->zetan = 0;
    for (uint64_t i = 1; i <= n; i++)
        z->zetan += 1.0 / pow((double)i, theta);
    for (uint64_t i = 1; i <= 2; i++)
        zeta2 += 1.0 / pow((double)i, theta);
    z->alpha = 1.0 / (1.0 - theta);
    z->eta = (1.0 - pow(2.0 / (double)n, 1.0 - theta)) / (1.0 - zeta2 / z->zetan);
    z->half_pow_theta = 1.0 + pow(0.5, theta);
}

/* r: a uniformly random 64-bit number. */
static inline uint64_t kvw_zipf_next(const kvw_zipf *z, uint64_t r)
{
    double u = (double)(r >> 11) * (1.0 / 9007199254740992.0);
    double uz = u * z->zetan;
    uint64_t k;
    if (uz < 1.0)
        k = 0;
    else if (uz < z->half_pow_theta)
        k = 1;
    else
        k = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1.0, z->alpha));
    if (k >= z->n)
        k = z->n - 1;
    return kvw_mix(k + 0x5bd1e995) % z->n;
}

#endif
