/* dedup_set.c -- range splitting, overflow buffer and iteration for dedup_set.h. */
#include "capture/dedup_set.h"

#include <string.h>
#include <sys/mman.h>

static inline uint32_t block_mask(uintptr_t block, uintptr_t lo, uintptr_t hi)
{
    uintptr_t a = lo > block ? lo - block : 0;
    uintptr_t b = hi < block + DEDUP_BLOCK ? hi - block : DEDUP_BLOCK;
    uint64_t m = ((1ull << b) - 1) & ~((1ull << a) - 1);
    return (uint32_t)m;
}

void dedup_init(dedup_set *s) { memset(s, 0, sizeof *s); }

void dedup_destroy(dedup_set *s)
{
    dedup_clear(s);
    dedup_overflow_chunk *c = s->ovf_free;
    while (c) {
        dedup_overflow_chunk *n = c->next;
        munmap(c, sizeof *c);
        c = n;
    }
    s->ovf_free = NULL;
}

void dedup_add_range(dedup_set *s, uintptr_t addr, size_t len)
{
    if (len == 0)
        return;
    uintptr_t hi = addr + len;
    uintptr_t b = addr & ~(uintptr_t)(DEDUP_BLOCK - 1);
    for (; b < hi; b += DEDUP_BLOCK)
        dedup_add_block(s, b, block_mask(b, addr, hi));
}

void dedup_add_range_nodedup(dedup_set *s, uintptr_t addr, size_t len)
{
    if (len == 0)
        return;
    uintptr_t hi = addr + len;
    for (uintptr_t b = addr & ~(uintptr_t)(DEDUP_BLOCK - 1); b < hi; b += DEDUP_BLOCK)
        dedup_add_overflow(s, b, block_mask(b, addr, hi));
}

/* Overflow chunks come from mmap: the runtime interposes malloc. */
void dedup_add_overflow(dedup_set *s, uintptr_t block, uint32_t mask)
{
    dedup_overflow_chunk *c = s->ovf_tail;
    if (!c || c->n == sizeof c->addr / sizeof c->addr[0]) {
        dedup_overflow_chunk *nc = s->ovf_free;
        if (nc) {
            s->ovf_free = nc->next;
        } else {
            nc = mmap(NULL, sizeof *nc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (nc == MAP_FAILED)
                __builtin_trap(); /* out of memory while capturing: cannot lose the store */
        }
        nc->next = NULL;
        nc->n = 0;
        if (c)
            c->next = nc;
        else
            s->ovf_head = nc;
        s->ovf_tail = nc;
        c = nc;
    }
    c->addr[c->n] = block;
    c->mask[c->n] = mask;
    c->n++;
    s->ovf_count++;
}

void dedup_for_each(const dedup_set *s, dedup_visit_fn fn, void *arg)
{
    for (uint32_t k = 0; k < s->count; k++) {
        uint32_t i = s->used_slot[k];
        fn(arg, s->key[i], s->mask[i]);
    }
    for (const dedup_overflow_chunk *c = s->ovf_head; c; c = c->next)
        for (uint32_t k = 0; k < c->n; k++)
            fn(arg, c->addr[k], c->mask[k]);
}

void dedup_clear(dedup_set *s)
{
    for (uint32_t k = 0; k < s->count; k++)
        s->key[s->used_slot[k]] = 0;
    s->count = 0;
    if (s->ovf_head) {
        s->ovf_tail->next = s->ovf_free;
        s->ovf_free = s->ovf_head;
        s->ovf_head = s->ovf_tail = NULL;
    }
    s->ovf_count = 0;
}
