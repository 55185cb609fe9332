/* dedup_set.c -- range splitting, the spill set, data ranges, the no-dedup
 * list and iteration for dedup_set.h. */
#include "capture/dedup_set.h"

#include <string.h>
#include <sys/mman.h>

static void spill_free(struct dedup_spill *sp);
static void ranges_free(dedup_set *s);

void dedup_init(dedup_set *s) { memset(s, 0, sizeof *s); }

void dedup_destroy(dedup_set *s)
{
    dedup_clear(s);
    spill_free(&s->spill);
    ranges_free(s);
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
        dedup_add_block(s, b, dedup_block_mask(b, addr, hi));
}

void dedup_add_range_nodedup(dedup_set *s, uintptr_t addr, size_t len)
{
    if (len == 0)
        return;
    uintptr_t hi = addr + len;
    for (uintptr_t b = addr & ~(uintptr_t)(DEDUP_BLOCK - 1); b < hi; b += DEDUP_BLOCK)
        dedup_append_nodedup(s, b, dedup_block_mask(b, addr, hi));
}

/* The spill set's memory comes from mmap: the runtime interposes malloc. */
static void spill_alloc(dedup_spill *sp, uint64_t cap)
{
    void *k = mmap(NULL, cap * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    void *m = mmap(NULL, cap * sizeof(uint32_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (k == MAP_FAILED || m == MAP_FAILED)
        __builtin_trap(); /* out of memory while capturing: cannot lose the store */
    sp->key = k;
    sp->mask = m;
    sp->cap = cap;
    sp->count = 0;
}

static void spill_free(dedup_spill *sp)
{
    if (sp->cap) {
        munmap(sp->key, sp->cap * sizeof(uint64_t));
        munmap(sp->mask, sp->cap * sizeof(uint32_t));
    }
    memset(sp, 0, sizeof *sp);
}

static void spill_insert(dedup_spill *sp, uint64_t block, uint32_t mask)
{
    uint64_t i = ((block >> 5) * 0x9E3779B97F4A7C15ull) >> 20 & (sp->cap - 1);
    while (sp->key[i] != 0 && sp->key[i] != block)
        i = (i + 1) & (sp->cap - 1);
    if (sp->key[i] == block) {
        sp->mask[i] |= mask;
        return;
    }
    sp->key[i] = block;
    sp->mask[i] = mask;
    sp->count++;
}

void dedup_add_overflow(dedup_set *s, uintptr_t block, uint32_t mask)
{
    dedup_spill *sp = &s->spill;
    if (sp->cap == 0)
        spill_alloc(sp, 1u << 16);
    if ((sp->count + 1) * 2 > sp->cap) { /* double and rehash */
        dedup_spill old = *sp;
        spill_alloc(sp, old.cap * 2);
        for (uint64_t i = 0; i < old.cap; i++)
            if (old.key[i])
                spill_insert(sp, old.key[i], old.mask[i]);
        spill_free(&old);
    }
    spill_insert(sp, block, mask);
}

/* ---- data ranges ---- */

#define RANGES_FIRST_CAP 256u
#define RANGES_FIRST_MERGE 64u

static void ranges_free(dedup_set *s)
{
    if (s->rng_cap)
        munmap(s->rng, s->rng_cap * sizeof *s->rng);
    s->rng = NULL;
    s->rng_cap = s->rng_n = s->rng_slots = s->rng_bytes = 0;
    s->rng_merge_at = 0;
}

static void ranges_grow(dedup_set *s)
{
    uint64_t cap = s->rng_cap ? s->rng_cap * 2 : RANGES_FIRST_CAP;
    dedup_range *r = mmap(NULL, cap * sizeof *r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        __builtin_trap(); /* out of memory while capturing: cannot lose the store */
    if (s->rng_n)
        memcpy(r, s->rng, s->rng_n * sizeof *r);
    if (s->rng_cap)
        munmap(s->rng, s->rng_cap * sizeof *s->rng);
    s->rng = r;
    s->rng_cap = cap;
}

void dedup_add_data_range(dedup_set *s, uintptr_t addr, size_t len)
{
    if (len == 0)
        return;
    if (s->rng_n == s->rng_cap)
        ranges_grow(s);
    s->rng[s->rng_n++] = (dedup_range){.addr = addr, .len = len};
    s->rng_merged = false;
    s->rng_slots += DEDUP_RANGE_SLOTS(len);
    s->rng_bytes += len;
    /* Merging whenever the count doubles keeps the list within twice the
     * number of disjoint ranges, at an amortized O(log n) per range. */
    if (s->rng_n >= (s->rng_merge_at ? s->rng_merge_at : RANGES_FIRST_MERGE))
        dedup_merge_ranges(s);
}

/* Shell sort by address (no allocation: the runtime interposes malloc, and
 * this runs while a batch captures). */
static void sort_ranges(dedup_range *r, uint64_t n)
{
    static const uint64_t gaps[] = {1391376, 463792, 198768, 86961, 33936, 13776, 4592, 1968, 861, 336,
                                    112, 48, 21, 7, 3, 1};
    for (unsigned g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        uint64_t gap = gaps[g];
        for (uint64_t i = gap; i < n; i++) {
            dedup_range v = r[i];
            uint64_t j = i;
            for (; j >= gap && r[j - gap].addr > v.addr; j -= gap)
                r[j] = r[j - gap];
            r[j] = v;
        }
    }
}

void dedup_merge_ranges(dedup_set *s)
{
    if (s->rng_n == 0 || s->rng_merged)
        return;
    sort_ranges(s->rng, s->rng_n);
    uint64_t out = 0;
    for (uint64_t i = 1; i < s->rng_n; i++) {
        dedup_range *cur = &s->rng[out];
        const dedup_range *nx = &s->rng[i];
        if (nx->addr <= cur->addr + cur->len) {
            uint64_t end = nx->addr + nx->len;
            if (end > cur->addr + cur->len)
                cur->len = end - cur->addr;
        } else {
            s->rng[++out] = *nx;
        }
    }
    s->rng_n = out + 1;
    s->rng_slots = s->rng_bytes = 0;
    for (uint64_t i = 0; i < s->rng_n; i++) {
        s->rng_slots += DEDUP_RANGE_SLOTS(s->rng[i].len);
        s->rng_bytes += s->rng[i].len;
    }
    s->rng_merged = true;
    uint64_t next = s->rng_n * 2;
    s->rng_merge_at = next > RANGES_FIRST_MERGE ? next : RANGES_FIRST_MERGE;
}

void dedup_for_each_range(const dedup_set *s, dedup_range_fn fn, void *arg)
{
    for (uint64_t i = 0; i < s->rng_n; i++)
        fn(arg, s->rng[i].addr, s->rng[i].len);
}

void dedup_append_nodedup(dedup_set *s, uintptr_t block, uint32_t mask)
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

/* A written block's mask is never 0 (dedup_add_range sets at least one
 * byte), so 0 marks a dropped one. */
void dedup_for_each(const dedup_set *s, dedup_visit_fn fn, void *arg)
{
    for (uint32_t k = 0; k < s->count; k++) {
        uint32_t i = s->used_slot[k];
        if (s->mask[i])
            fn(arg, s->key[i], s->mask[i]);
    }
    const dedup_spill *sp = &s->spill;
    if (sp->count)
        for (uint64_t i = 0; i < sp->cap; i++)
            if (sp->key[i] && sp->mask[i])
                fn(arg, sp->key[i], sp->mask[i]);
    for (const dedup_overflow_chunk *c = s->ovf_head; c; c = c->next)
        for (uint32_t k = 0; k < c->n; k++)
            if (c->mask[k])
                fn(arg, c->addr[k], c->mask[k]);
}

uint64_t dedup_drop(dedup_set *s, dedup_drop_fn drop, void *arg)
{
    uint64_t n = 0;
    for (uint32_t k = 0; k < s->count; k++) {
        uint32_t i = s->used_slot[k];
        if (s->mask[i] && drop(arg, s->key[i], s->mask[i])) {
            s->mask[i] = 0;
            n++;
        }
    }
    dedup_spill *sp = &s->spill;
    if (sp->count)
        for (uint64_t i = 0; i < sp->cap; i++)
            if (sp->key[i] && sp->mask[i] && drop(arg, sp->key[i], sp->mask[i])) {
                sp->mask[i] = 0;
                n++;
            }
    for (dedup_overflow_chunk *c = s->ovf_head; c; c = c->next)
        for (uint32_t k = 0; k < c->n; k++)
            if (c->mask[k] && drop(arg, c->addr[k], c->mask[k])) {
                c->mask[k] = 0;
                n++;
            }
    s->dropped += n;
    return n;
}

void dedup_clear(dedup_set *s)
{
    for (uint32_t k = 0; k < s->count; k++)
        s->key[s->used_slot[k]] = 0;
    s->count = 0;
    s->dropped = 0;
    if (s->spill.count) {
        /* Keep a modest table for the next big batch; give back a huge one. */
        if (s->spill.cap > (1u << 20))
            spill_free(&s->spill);
        else {
            memset(s->spill.key, 0, s->spill.cap * sizeof(uint64_t));
            s->spill.count = 0;
        }
    }
    if (s->rng_cap > (1u << 16))
        ranges_free(s); /* give back a huge list */
    s->rng_n = s->rng_slots = s->rng_bytes = 0;
    s->rng_merge_at = 0;
    if (s->ovf_head) {
        s->ovf_tail->next = s->ovf_free;
        s->ovf_free = s->ovf_head;
        s->ovf_head = s->ovf_tail = NULL;
    }
    s->ovf_count = 0;
}
