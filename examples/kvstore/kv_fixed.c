/* kv_fixed.c -- Listing 2's store: PUT/GET of fixed-size values at an index. */
#include "kv_fixed.h"

#include <stdlib.h>
#include <string.h>

/* Durable state: these globals live in .bss and are written only by
 * read-write commands, so Mangosteen restores them; the array is on the
 * durable heap. */
static char *store;
static uint32_t store_n, store_vsize;
static uint64_t client_seq[KV_MAX_CLIENTS];
static uint64_t total_puts; /* every PUT adds 1: equals the sum of client_seq */

void kv_fixed_init(void *arg)
{
    const kv_fixed_params *p = arg;
    char *s = malloc((size_t)p->n_values * p->value_size);
    if (!s)
        abort();
    memset(s, 0, (size_t)p->n_values * p->value_size);
    store = s;
    store_n = p->n_values;
    store_vsize = p->value_size;
}

bool kv_fixed_is_read_only(void *arg) { return ((kv_fixed_cmd *)arg)->op == KV_GET; }

void kv_fixed_process(void *arg)
{
    kv_fixed_cmd *c = arg;
    if (c->op == KV_FILL) {
        for (uint32_t i = 0; i < store_n; i++)
            memcpy(store + (size_t)i * store_vsize, c->value, store_vsize);
        c->status = 0;
        return;
    }
    if (c->index >= store_n || c->client >= KV_MAX_CLIENTS) {
        c->status = -1;
        return;
    }
    char *slot = store + (size_t)c->index * store_vsize;
    if (c->op == KV_GET) {
        memcpy(c->out, slot, store_vsize);
    } else {
        memcpy(slot, c->value, store_vsize);
        client_seq[c->client] = c->seq;
        total_puts = total_puts + 1;
    }
    c->status = 0;
}

uint32_t kv_fixed_n_values(void) { return store_n; }
uint32_t kv_fixed_value_size(void) { return store_vsize; }
const char *kv_fixed_value(uint32_t index) { return store + (size_t)index * store_vsize; }
uint64_t kv_fixed_client_seq(uint32_t client) { return client_seq[client]; }
uint64_t kv_fixed_total_puts(void) { return total_puts; }
