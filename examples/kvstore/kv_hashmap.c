/* kv_hashmap.c -- chained hash map on the durable heap; doubles its bucket
 * array when the load factor passes 1. */
#include "kv_hashmap.h"

#include <stdlib.h>
#include <string.h>

typedef struct kvh_node {
    struct kvh_node *next;
    uint64_t hash;
    uint32_t key_len, value_len;
    char data[]; /* key then value */
} kvh_node;

typedef struct kvh_map {
    kvh_node **buckets;
    uint64_t n_buckets;
    uint64_t count;
} kvh_map;

static kvh_map *map; /* .bss, durable */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

void kvh_init(void *unused)
{
    (void)unused;
    kvh_map *m = malloc(sizeof *m);
    kvh_node **b = calloc(16, sizeof *b);
    if (!m || !b)
        abort();
    m->buckets = b;
    m->n_buckets = 16;
    m->count = 0;
    map = m;
}

bool kvh_is_read_only(void *arg) { return ((kvh_cmd *)arg)->op == KVH_GET; }

static kvh_node **find(uint64_t h, const char *key, size_t len)
{
    kvh_node **pp = &map->buckets[h & (map->n_buckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && (*pp)->key_len == len && memcmp((*pp)->data, key, len) == 0)
            return pp;
    return pp;
}

static void grow(void)
{
    uint64_t nb = map->n_buckets * 2;
    kvh_node **b = calloc(nb, sizeof *b);
    if (!b)
        return; /* stay at the current size */
    for (uint64_t i = 0; i < map->n_buckets; i++) {
        kvh_node *n = map->buckets[i];
        while (n) {
            kvh_node *next = n->next;
            kvh_node **slot = &b[n->hash & (nb - 1)];
            n->next = *slot;
            *slot = n;
            n = next;
        }
    }
    free(map->buckets);
    map->buckets = b;
    map->n_buckets = nb;
}

int kvh_request_keys(void *arg, uint64_t *keys, unsigned max)
{
    kvh_cmd *c = arg;
    if (max < 1)
        return -1;
    keys[0] = hash_bytes(c->key, c->key_len);
    return 1;
}

void kvh_process(void *arg)
{
    kvh_cmd *c = arg;
    uint64_t h = hash_bytes(c->key, c->key_len);
    kvh_node **pp = find(h, c->key, c->key_len);
    kvh_node *n = *pp;
    switch (c->op) {
    case KVH_GET:
        if (!n) {
            c->status = 1;
            return;
        }
        c->out_len = n->value_len;
        if (n->value_len > c->out_cap) {
            c->status = -1;
            return;
        }
        memcpy(c->out, n->data + n->key_len, n->value_len);
        c->status = 0;
        return;
    case KVH_DEL:
        if (!n) {
            c->status = 1;
            return;
        }
        *pp = n->next;
        map->count = map->count - 1;
        free(n);
        c->status = 0;
        return;
    case KVH_PUT: {
        kvh_node *nn = malloc(sizeof *nn + c->key_len + c->value_len);
        if (!nn) {
            c->status = -1;
            return;
        }
        nn->hash = h;
        nn->key_len = (uint32_t)c->key_len;
        nn->value_len = (uint32_t)c->value_len;
        memcpy(nn->data, c->key, c->key_len);
        memcpy(nn->data + c->key_len, c->value, c->value_len);
        if (n) { /* replace in place in the chain */
            nn->next = n->next;
            *pp = nn;
            free(n);
        } else {
            nn->next = NULL;
            *pp = nn;
            map->count = map->count + 1;
            if (map->count > map->n_buckets)
                grow();
        }
        c->status = 0;
        return;
    }
    }
    c->status = -1;
}

uint64_t kvh_count(void) { return map ? map->count : 0; }
uint64_t kvh_buckets(void) { return map ? map->n_buckets : 0; }

int kvh_check(void)
{
    uint64_t seen = 0;
    for (uint64_t i = 0; i < map->n_buckets; i++)
        for (kvh_node *n = map->buckets[i]; n; n = n->next) {
            if ((n->hash & (map->n_buckets - 1)) != i || hash_bytes(n->data, n->key_len) != n->hash)
                return -1;
            seen++;
        }
    return seen == map->count ? 0 : -2;
}
