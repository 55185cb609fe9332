/* mango_release.c -- releasing big durable objects in steps (durable Redis).
 *
 * Compiled into redis-server next to mango_adapter.c (see docs/redis.md,
 * "Releasing big objects in steps").
 *
 * Every store a write section makes is logged, and a log frame holds at most
 * half of the log. Freeing is such a store: each durable chunk freed writes
 * its header and a free-list link. A FLUSHALL of 20 000 YCSB records wrote
 * 960 896 log blocks (46 MB of log), more than one frame of the default
 * 64 MiB log may hold. Until the runtime had big batches (a batch too large
 * for a frame goes through the pool's big-batch file) the server had to stop
 * there: the batch could neither commit nor be dropped. The same happened to
 * a DEL of a big enough hash (60 000 fields with the tests' 8 MiB log), and
 * to the lazy forms (FLUSHALL ASYNC, UNLINK), whose frees came back from the
 * lazyfree thread as one deferred queue drained into one batch. Such a batch
 * now commits, but synchronously, with the event loop stopped while gigabytes
 * of log are written: releasing in steps keeps the server answering.
 *
 * So the unlinking and the freeing are split:
 *   - FLUSHALL/FLUSHDB (sync or ASYNC) swap in empty dicts in the command's
 *     batch and put the old ones on the graveyard (mangoEmptyDb);
 *   - a list, set, sorted set or hash that loses its last reference inside
 *     a write section (DEL, UNLINK, SET over it, expiry, eviction, a flushed
 *     database's values) goes to the graveyard instead of being freed when
 *     its frees would take the batch past a quarter of its room: a value
 *     of tens of thousands of elements, or any of GRAVE_SMALL_EFFORT
 *     elements or more in a batch already that full (a DEL of thousands of
 *     hashes) (mangoFreeLater);
 *   - lazyfree (UNLINK, the lazyfree-lazy-* options) no longer hands durable
 *     values to its thread: they are freed at once, or go to the graveyard
 *     (mangoFreeAsync);
 *   - at the end of every event-loop pass, in that pass's batch, the
 *     graveyard is released for at most RELEASE_STEP_NS or until the step
 *     has added an eighth of a batch's room to the batch (mangoReleaseStep),
 *     and the loop does not sleep while anything is left. Not without a
 *     durable mode (mango-mode none): Redis frees as usual.
 * The graveyard is durable: its nodes live in the durable heap, its head and
 * tail are .bss words written only in write sections, and every step is
 * part of a batch. After a crash the release goes on where the last durable
 * batch left it; nothing is leaked and nothing is freed twice.
 *
 * Released in steps: the buckets of a dict (a database, a hashtable-encoded
 * hash or set, a sorted set's dict), a sorted set's skiplist, a list's
 * quicklist nodes, a stream's radix trees (its consumer groups' pending
 * entries and consumers, then its nodes). Module values are freed at once.
 */
#include "server.h"
#include "mango_adapter.h"
#include "mango.h"

#include <stdint.h>
#include <time.h>

/* A value is freed at once when its frees fit in what is left of a quarter
 * of a batch's room (the adapter ends a pass's batch early at a quarter
 * too), at about FREE_BLOCKS_PER_ELEMENT log blocks an element of
 * lazyfreeGetFreeEffort (2-3 chunks, each a header and a free-list link).
 * Freeing at once whenever it fits keeps used_memory exact for maxmemory
 * eviction, which measures what each deletion frees: a value waiting on
 * the graveyard still counts. Below GRAVE_SMALL_EFFORT elements, always at
 * once. */
#define FREE_BLOCKS_PER_ELEMENT 5
#define GRAVE_SMALL_EFFORT 8
#define RELEASE_STEP_NS 1000000ull    /* time given to releasing per pass */
#define RELEASE_ROOM_DIVISOR 8        /* stop at this fraction of a batch's room */

/* One thing to release. A database: obj == NULL, dicts = {dict, expires}. */
typedef struct grave {
    struct grave *next;
    robj *obj;
    dict *dicts[2];
    int table;             /* the dict being released: hash table 0, then 1 */
    unsigned long bucket;  /* its next bucket */
    size_t bytes;          /* what it still holds of used_memory (an estimate) */
} grave;

/* Durable: written only inside write sections (restored by recovery). */
static grave *graves_head, *graves_tail;
static size_t graves_bytes; /* the graves' bytes together */

/* Test hook (redis/tests): MANGO_REDIS_TEST_RELEASE_PER_PASS=N frees at most
 * N elements a step, at most one step per 20 ms, and lets the loop sleep
 * between passes, so a release lasts long enough for a test to kill the
 * server in the middle of it. */
static long test_per_pass = -1; /* -1: not read yet; 0: off */
static uint64_t test_last_step_ns;

typedef struct step_budget {
    uint64_t deadline_ns;
    uint64_t used0;  /* the batch's bytes of blocks when the step began */
    uint64_t room;   /* stop once the step added this many bytes of blocks */
    unsigned long spent; /* elements freed in this step */
    unsigned long max;   /* elements allowed in this step */
    int out;         /* budget exhausted */
} step_budget;

/* Defined in t_zset.c and lazyfree.c without a declaration in server.h. */
void zslFreeNode(zskiplistNode *node);
size_t lazyfreeGetFreeEffort(robj *key, robj *obj, int dbid);

/* Can o be released in steps? */
static int steppable(const robj *o)
{
    return (o->type == OBJ_LIST && o->encoding == OBJ_ENCODING_QUICKLIST) ||
           ((o->type == OBJ_HASH || o->type == OBJ_SET) && o->encoding == OBJ_ENCODING_HT) ||
           (o->type == OBJ_ZSET && o->encoding == OBJ_ENCODING_SKIPLIST) ||
           o->type == OBJ_STREAM;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* May the step free one more element? Checks the clock and the batch's room
 * every 16 elements (and the test hook's cap at each). */
static int budget_left(step_budget *b)
{
    if (b->out) return 0;
    if (b->spent >= b->max) {
        b->out = 1;
        return 0;
    }
    if ((b->spent++ & 15) == 0) {
        uint64_t used = 0;
        mango_batch_room(&used, NULL);
        if ((used > b->used0 ? used - b->used0 : 0) >= b->room || now_ns() >= b->deadline_ns) b->out = 1;
    }
    return !b->out;
}

/* ---- what the graveyard holds of used_memory -------------------------------- *
 * maxmemory eviction measures what each deletion frees by the drop of
 * used_memory. A value put on the graveyard frees almost nothing at once, so
 * the eviction loop went on evicting other keys (672 of 3 000 against 23
 * when Redis frees at once; found by a review, session 37), and while the
 * release ran each command evicted more, up to OOM on an empty keyspace. So
 * the graveyard keeps an estimate of what it still holds, which
 * freeMemoryGetNotCountedMemory() leaves out of used_memory (a patch line,
 * as Redis leaves out replicas' buffers): sampled at the push, as MEMORY
 * USAGE does, then lowered by the drop of used_memory that each step
 * measures. */
#define GRAVE_SAMPLES 16

size_t objectComputeSize(robj *key, robj *o, size_t sample_size, int dbid); /* object.c */

static size_t table_bytes(dict *d)
{
    return d ? (DICTHT_SIZE(d->ht_size_exp[0]) + DICTHT_SIZE(d->ht_size_exp[1])) * sizeof(dictEntry *) +
                   sizeof(dict)
             : 0;
}

/* A flushed database's keyspace: its tables, and its entries as the first
 * GRAVE_SAMPLES of them average (key, value, dictEntry). */
static size_t db_bytes(dict *keys, dict *expires)
{
    size_t n = 0, sampled = 0;
    dictIterator *di = dictGetIterator(keys);
    dictEntry *de;
    while (n < GRAVE_SAMPLES && (de = dictNext(di))) {
        sampled += sdsZmallocSize(dictGetKey(de)) + sizeof(dictEntry) + objectComputeSize(NULL, dictGetVal(de), 5, 0);
        n++;
    }
    dictReleaseIterator(di);
    size_t bytes = table_bytes(keys) + table_bytes(expires);
    if (expires) bytes += dictSize(expires) * sizeof(dictEntry);
    return bytes + (n ? sampled / n * dictSize(keys) : 0);
}

/* Lowers g's share by what a step freed (used_memory before it: before). */
static void grave_freed(grave *g, size_t before)
{
    size_t now = zmalloc_used_memory(), freed = before > now ? before - now : 0;
    if (freed > g->bytes) freed = g->bytes;
    g->bytes -= freed;
    graves_bytes -= freed;
}

size_t mangoGravesBytes(void) { return graves_bytes; }

static void grave_push(robj *obj, dict *d0, dict *d1)
{
    grave *g = zmalloc(sizeof *g);
    g->next = NULL;
    g->obj = obj;
    g->dicts[0] = d0;
    g->dicts[1] = d1;
    g->table = 0;
    g->bucket = 0;
    /* 9/8 of the sample: MEMORY USAGE's sizes leave out the allocator's
     * rounding (a 60 000-field hash: sampled 6.09 MB, exact 6.28, freed
     * 6.70). An estimate short of what is freed lets eviction start again
     * before the release ends; one above lets used_memory pass maxmemory
     * by the difference until it ends. */
    size_t sampled = obj ? objectComputeSize(NULL, obj, GRAVE_SAMPLES, 0) : db_bytes(d0, d1);
    g->bytes = sampled + sampled / 8;
    graves_bytes += g->bytes;
    if (graves_tail) graves_tail->next = g;
    else graves_head = g;
    graves_tail = g;
}

/* Frees d's entries (with its type's destructors), tables and struct, bucket
 * by bucket from g's cursor. Returns 1 once d is gone. A bucket's chain is
 * freed whole (chains are short). */
static int release_dict_step(dict *d, grave *g, step_budget *b)
{
    while (g->table < 2) {
        int t = g->table;
        unsigned long size = DICTHT_SIZE(d->ht_size_exp[t]);
        while (g->bucket < size && d->ht_used[t] > 0) {
            if (!budget_left(b)) return 0;
            dictEntry *he = d->ht_table[t][g->bucket];
            while (he) {
                dictEntry *next = he->next;
                dictFreeKey(d, he);
                dictFreeVal(d, he);
                zfree(he);
                d->ht_used[t]--;
                he = next;
            }
            d->ht_table[t][g->bucket] = NULL;
            g->bucket++;
        }
        zfree(d->ht_table[t]);
        d->ht_table[t] = NULL;
        d->ht_size_exp[t] = -1;
        d->ht_used[t] = 0;
        g->table = t + 1;
        g->bucket = 0;
    }
    zfree(d);
    g->table = 0;
    g->bucket = 0;
    return 1;
}

/* A skiplist's nodes from the first on; the header's level-0 link always
 * points at the first node left. Returns 1 once the skiplist is gone. */
static int release_zsl_step(zskiplist *zsl, step_budget *b)
{
    zskiplistNode *x = zsl->header->level[0].forward;
    while (x && budget_left(b)) {
        zskiplistNode *next = x->level[0].forward;
        zslFreeNode(x);
        zsl->length--;
        x = next;
    }
    zsl->header->level[0].forward = x;
    if (x) {
        x->backward = NULL;
        return 0;
    }
    zslFree(zsl); /* the header and the struct */
    return 1;
}

/* A quicklist's nodes from the head on. Returns 1 once it is gone. */
static int release_quicklist_step(quicklist *ql, step_budget *b)
{
    quicklistNode *n = ql->head;
    while (n && budget_left(b)) {
        quicklistNode *next = n->next;
        zfree(n->entry);
        ql->count -= n->count;
        zfree(n);
        ql->len--;
        n = next;
    }
    ql->head = n;
    if (n) {
        n->prev = NULL;
        return 0;
    }
    ql->tail = NULL;
    quicklistRelease(ql); /* no nodes left: bookmarks and the struct */
    return 1;
}

/* The value of r's first element, or NULL if r is empty. */
static void *rax_first(rax *r)
{
    raxIterator it;
    raxStart(&it, r);
    raxSeek(&it, "^", NULL, 0);
    void *v = raxNext(&it) ? it.data : NULL;
    raxStop(&it);
    return v;
}

/* The value of *rp's first element; if *rp is empty, frees it, clears *rp
 * and returns NULL. */
static void *rax_first_or_free(rax **rp)
{
    void *v = raxSize(*rp) ? rax_first(*rp) : NULL;
    if (!v) {
        raxFree(*rp);
        *rp = NULL;
    }
    return v;
}

/* Removes r's first element (r is not empty). */
static void rax_remove_first(rax *r)
{
    raxIterator it;
    raxStart(&it, r);
    raxSeek(&it, "^", NULL, 0);
    serverAssert(raxNext(&it));
    raxRemove(r, it.key, it.key_len, NULL);
    raxStop(&it);
}

/* Empties *rp from its first element on, passing each value to free_value
 * (NULL: the values are owned elsewhere), then frees the tree and clears
 * *rp. Every state between two elements is a valid tree, so a crash between
 * batches resumes here. Returns 1 once *rp is gone (or was already). */
static int release_rax_step(rax **rp, void (*free_value)(void *), step_budget *b)
{
    rax *r = *rp;
    if (!r) return 1;
    while (raxSize(r) > 0) {
        if (!budget_left(b)) return 0;
        void *v = rax_first(r);
        rax_remove_first(r);
        if (free_value && v) free_value(v);
    }
    raxFree(r);
    *rp = NULL;
    return 1;
}

static void free_nack(void *na) { streamFreeNACK(na); }
static void free_listpack(void *lp) { lpFree(lp); }

/* A stream: each consumer group's pending entries (the NACKs, which the
 * consumers' own pending trees share), then its consumers one by one (each
 * one's pending tree, then the consumer), then the group; once no group is
 * left, the stream's nodes (listpacks) and the stream. Returns 1 once the
 * stream is gone. */
static int release_stream_step(stream *s, step_budget *b)
{
    streamCG *cg;
    while (s->cgroups && (cg = rax_first_or_free(&s->cgroups))) {
        if (!release_rax_step(&cg->pel, free_nack, b)) return 0;
        streamConsumer *sc;
        while (cg->consumers && (sc = rax_first_or_free(&cg->consumers))) {
            if (!release_rax_step(&sc->pel, NULL, b)) return 0; /* its NACKs are freed above */
            if (!budget_left(b)) return 0;
            rax_remove_first(cg->consumers);
            sdsfree(sc->name);
            zfree(sc);
        }
        if (!budget_left(b)) return 0;
        rax_remove_first(s->cgroups);
        zfree(cg);
    }
    if (!release_rax_step(&s->rax, free_listpack, b)) return 0;
    zfree(s);
    return 1;
}

static int release_object_step(grave *g, step_budget *b)
{
    robj *o = g->obj;
    if (o->type == OBJ_STREAM) {
        if (!release_stream_step(o->ptr, b)) return 0;
    } else if ((o->type == OBJ_HASH || o->type == OBJ_SET) && o->encoding == OBJ_ENCODING_HT) {
        if (!release_dict_step(o->ptr, g, b)) return 0;
    } else if (o->type == OBJ_ZSET && o->encoding == OBJ_ENCODING_SKIPLIST) {
        zset *zs = o->ptr;
        if (zs->dict) { /* its entries share their sds with the skiplist: no destructors */
            if (!release_dict_step(zs->dict, g, b)) return 0;
            zs->dict = NULL;
        }
        if (!release_zsl_step(zs->zsl, b)) return 0;
        zfree(zs);
    } else {
        serverAssert(o->type == OBJ_LIST && o->encoding == OBJ_ENCODING_QUICKLIST); /* steppable() */
        if (!release_quicklist_step(o->ptr, b)) return 0;
    }
    zfree(o);
    return 1;
}

/* A flushed database: the expires dict (its keys are the main dict's), then
 * the main dict, whose values may join the graveyard themselves. */
static int release_db_step(grave *g, step_budget *b)
{
    if (g->dicts[1]) {
        if (!release_dict_step(g->dicts[1], g, b)) return 0;
        g->dicts[1] = NULL;
    }
    if (!release_dict_step(g->dicts[0], g, b)) return 0;
    return 1;
}

static int in_durable_heap(const void *p)
{
    uintptr_t lo, hi;
    mangoHeapRange(&lo, &hi);
    return (uintptr_t)p >= lo && (uintptr_t)p < hi;
}

/* Without a durable mode (mango-mode none) batches hold nothing
 * (mango_batch_room gives a capacity of 0): a step could free nothing, and
 * the graveyard would keep what it got while the loop spun. Redis frees. */
static int releasing_in_steps(void)
{
    /* DEBUG RELOAD empties the databases and loads the file in one batch:
     * kept on the graveyard until the load ends, the old dataset and the
     * new one had to fit in the heap together, and on a pool more than half
     * full the load failed half-way, its emptied databases committed: 11 122
     * of 32 000 keys lost for good (found by a review, session 36). Freed at
     * once, as Redis does, the load reuses their memory; the batch is a big
     * one either way. */
    if (mangoFreeingAtOnce()) return 0;
    uint64_t cap = 0;
    mango_batch_room(NULL, &cap);
    return cap > 0;
}

int mangoEmptyDb(redisDb *db)
{
    if (!mangoEnabled() || db < server.db || db >= server.db + server.dbnum || !releasing_in_steps()) return 0;
    mangoWriteBegin();
    grave_push(NULL, db->dict, db->expires);
    db->dict = dictCreate(&dbDictType);
    db->expires = dictCreate(&dbExpiresDictType);
    mangoWriteEnd();
    return 1;
}

int mangoFreeLater(robj *o)
{
    if (!mangoEnabled() || !mangoInWriteSection() || o->refcount != 1 || mangoFreeingAtOnce()) return 0;
    if (!steppable(o) || !in_durable_heap(o)) return 0;
    size_t effort = lazyfreeGetFreeEffort(NULL, o, 0);
    if (effort < GRAVE_SMALL_EFFORT) return 0;
    uint64_t used = 0, cap = 0; /* bytes of 32-byte blocks */
    mango_batch_room(&used, &cap);
    if (cap == 0 || used + (uint64_t)effort * FREE_BLOCKS_PER_ELEMENT * 32 <= cap / 4) return 0;
    grave_push(o, NULL, NULL); /* a graveyard node costs a few blocks */
    return 1;
}

int mangoFreeAsync(robj *o)
{
    if (!mangoEnabled() || !mangoInWriteSection() || o->refcount != 1 || !in_durable_heap(o)) return 0;
    decrRefCount(o); /* at once, or onto the graveyard if big */
    return 1;
}

int mangoReleaseStep(void)
{
    if (!graves_head) return 0;
    if (test_per_pass < 0) {
        const char *e = getenv("MANGO_REDIS_TEST_RELEASE_PER_PASS");
        test_per_pass = e && *e ? atol(e) : 0;
    }
    if (test_per_pass > 0) {
        if (now_ns() - test_last_step_ns < 20000000ull) return 0;
        test_last_step_ns = now_ns();
    }
    /* The room is counted from the batch's size when the step begins: the
     * pass's commands may have filled it past room already (up to a quarter
     * of a batch before mangoCallEnd() submits early), and a step measured
     * against the whole batch then freed nothing while large writes kept
     * coming (found by a review, session 35). */
    uint64_t used0 = 0, cap = 0;
    mango_batch_room(&used0, &cap);
    step_budget b = {.deadline_ns = now_ns() + RELEASE_STEP_NS, .used0 = used0, .room = cap / RELEASE_ROOM_DIVISOR,
                     .max = test_per_pass > 0 ? (unsigned long)test_per_pass : ~0ul};
    mangoDeletionsBegin(); /* what it frees no key reaches: no read waits for it */
    while (graves_head && !b.out) {
        grave *g = graves_head;
        size_t before = zmalloc_used_memory();
        int done = g->obj ? release_object_step(g, &b) : release_db_step(g, &b);
        grave_freed(g, before);
        if (!done) break;
        graves_bytes -= g->bytes; /* (what the estimate had beyond what was freed) */
        graves_head = g->next;
        if (!graves_head) graves_tail = NULL;
        zfree(g);
    }
    mangoDeletionsEnd();
    return graves_head != NULL && test_per_pass <= 0;
}

unsigned long mangoGravesPending(void)
{
    unsigned long n = 0;
    for (grave *g = graves_head; g; g = g->next) n++;
    return n;
}
