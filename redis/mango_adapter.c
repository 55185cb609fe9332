/* mango_adapter.c -- Mangosteen integration for Redis 7.0.15.
 *
 * Compiled into redis-server (copied into redis/src by redis/build.sh; the
 * patch adds it to REDIS_SERVER_OBJ). See mango_adapter.h and docs/redis.md.
 *
 * Durable state:
 *   - server.db (the redisDb array) and each db's dict and expires (and
 *     everything reachable from them), created in the initial batch;
 *   - the shared objects (struct sharedObjectsStruct shared): the keyspace
 *     stores pointers to them (e.g. shared.integers for small integer values);
 *   - dict.c's hash seed (the db dicts' buckets depend on it);
 *   - every .data/.bss byte a write section writes (counters, cursors).
 * Transient: everything else initServer() builds (sockets, event loop,
 * clients, scripting, config) and the per-db blocking/ready/watched key
 * dicts, which point at clients.
 */
#include "server.h"
#include "mango_adapter.h"
#include "mango.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Defined in server.c without a declaration in server.h. */
void createSharedObjects(void);
extern dictType keylistDictType;

static int mango_on;        /* mango_init succeeded */
static uint64_t durable_seen; /* last durable ticket read from Mangosteen */
static int durable_fd = -1;  /* Mangosteen's eventfd, in the event loop */
static int mango_recovered; /* the pool held a state */
static int write_depth;     /* nesting of write sections */
static uintptr_t heap_lo, heap_hi;
static char init_msg[512];  /* logged once logging is configured */

/* Durable: written in the initial batch, restored by recovery. */
static int durable_dbnum;
static uint64_t durable_magic;
#define MANGO_REDIS_MAGIC 0x6d616e676f726473ull /* "mangords" */

static bool dummy_ro(void *ctx) { (void)ctx; return false; }
static void dummy_process(void *ctx) { (void)ctx; }

static size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end == 'k' || *end == 'K') n <<= 10;
    else if (*end == 'm' || *end == 'M') n <<= 20;
    else if (*end == 'g' || *end == 'G') n <<= 30;
    return (size_t)n;
}

static void die(const char *what, int rc)
{
    serverLog(LL_WARNING, "Mangosteen: %s: %s (%s)", what, mango_strerror(rc), mango_last_error());
    /* Nothing of the open batch may be acknowledged: leave at once, without
     * running exit handlers that could write replies or files. */
    _exit(1);
}

static void mango_atexit(void)
{
    if (!mango_on) return;
    if (mango_batch_open())
        mango_batch_end();
    mango_shutdown();
    mango_on = 0;
}

void mangoRedisInit(void)
{
    mango_config cfg;
    mango_config_default(&cfg);
    const char *mode = getenv("MANGO_MODE");
    if (!mode || !*mode || !strcasecmp(mode, "emulated")) cfg.mode = MANGO_PERSIST_EMULATED;
    else if (!strcasecmp(mode, "auto")) cfg.mode = MANGO_PERSIST_AUTO;
    else if (!strcasecmp(mode, "fs")) cfg.mode = MANGO_PERSIST_FS;
    else if (!strcasecmp(mode, "pmem")) cfg.mode = MANGO_PERSIST_PMEM;
    else if (!strcasecmp(mode, "sim")) cfg.mode = MANGO_PERSIST_SIM;
    else if (!strcasecmp(mode, "none")) cfg.mode = MANGO_PERSIST_NONE;
    else {
        fprintf(stderr, "Mangosteen: unknown MANGO_MODE '%s' (emulated|fs|pmem|sim|none|auto)\n", mode);
        exit(1);
    }
    cfg.pool_size = env_size("MANGO_POOL_SIZE", 0);
    cfg.log_size = env_size("MANGO_LOG_SIZE", 0);
    cfg.max_threads = 4; /* the main thread; bio threads only free (deferred) */
    mango_callbacks cb = {.is_read_only = dummy_ro, .process_request = dummy_process};
    int rc = mango_init(&cfg, &cb);
    if (rc < 0) {
        fprintf(stderr, "Mangosteen: cannot open the pool: %s\n", mango_last_error());
        exit(1);
    }
    mango_on = 1;
    mango_recovered = rc == MANGO_RECOVERED;
    heap_lo = cfg.heap_base ? cfg.heap_base : (uintptr_t)0x600000000000ull;
    const char *pool = cfg.pool_path ? cfg.pool_path : getenv("MANGO_POOL");
    struct stat st;
    size_t span = (pool && stat(pool, &st) == 0) ? (size_t)st.st_size : ((size_t)1 << 40);
    heap_hi = heap_lo + span;
    atexit(mango_atexit);
    snprintf(init_msg, sizeof init_msg, "Mangosteen: pool %s, mode %s: %s", pool ? pool : "(default)",
             mode && *mode ? mode : "emulated", mango_recovered ? "RECOVERED" : "FRESH");
    if (mango_recovered && durable_magic != MANGO_REDIS_MAGIC) {
        fprintf(stderr, "Mangosteen: the pool holds no Redis state (was it created by another program?)\n");
        exit(1);
    }
}

/* ---- write sections ------------------------------------------------------ */

void mangoWriteBegin(void)
{
    if (!mango_on) return;
    if (write_depth++ > 0) return;
    if (!mango_batch_open()) {
        int rc = mango_batch_begin();
        if (rc != MANGO_OK) die("mango_batch_begin", rc);
    } else {
        mango_batch_resume();
    }
}

void mangoWriteEnd(void)
{
    if (!mango_on) return;
    if (--write_depth > 0) return;
    /* Pause: the batch stays open until beforeSleep(). */
    mango_batch_pause();
}

/* Ends the open batch and waits until it is durable. */
static void commit_sync(void)
{
    if (!mango_on || !mango_batch_open()) return;
    serverAssert(write_depth == 0);
    int rc = mango_batch_end();
    if (rc != MANGO_OK) die("mango_batch_end (commit)", rc);
}

/* The durable ticket advanced: the read wakes the loop, whose beforeSleep()
 * then writes the replies that were waiting. */
static void durable_event(aeEventLoop *el, int fd, void *data, int mask)
{
    UNUSED(el); UNUSED(data); UNUSED(mask);
    uint64_t v;
    while (read(fd, &v, sizeof v) == sizeof v) {}
}

void mangoCommit(void)
{
    if (!mango_on) return;
    if (durable_fd < 0 && server.el) {
        durable_fd = mango_durable_fd();
        if (durable_fd < 0) die("mango_durable_fd", durable_fd);
        if (aeCreateFileEvent(server.el, durable_fd, AE_READABLE, durable_event, NULL) == AE_ERR) {
            serverLog(LL_WARNING, "Mangosteen: cannot watch the durability eventfd");
            _exit(1);
        }
    }
    if (!mango_batch_open()) return;
    serverAssert(write_depth == 0);
    int rc = mango_batch_submit(NULL);
    if (rc != MANGO_OK) die("mango_batch_submit (commit)", rc);
}

void mangoNoteReply(client *c)
{
    c->mango_ticket = mango_on ? mango_reply_ticket() : 0;
}

int mangoReplyHeld(client *c)
{
    if (!mango_on || c->mango_ticket <= durable_seen) return 0;
    uint64_t d;
    int rc = mango_durable_ticket(&d);
    if (rc != MANGO_OK) die("pipelined commit: a log sync failed", rc);
    durable_seen = d;
    return c->mango_ticket > d;
}

int mangoEnabled(void) { return mango_on; }

int mangoAnyVolatileKeys(void)
{
    for (int j = 0; j < server.dbnum; j++)
        if (dictSize(server.db[j].expires) > 0)
            return 1;
    return 0;
}

int mangoBatchOpen(void) { return mango_on && mango_batch_open(); }

int mangoDictMayRehash(const void *d)
{
    if (!mango_on || mango_capture_active) return 1;
    uintptr_t p = (uintptr_t)d;
    return p < heap_lo || p >= heap_hi; /* transient dicts rehash any time */
}

void mangoDurableArgv(client *c)
{
    if (!mango_on) return;
    for (int j = 0; j < c->argc; j++) {
        robj *o = c->argv[j];
        uintptr_t p = (uintptr_t)o;
        if (p >= heap_lo && p < heap_hi) continue; /* already durable */
        if (o->type != OBJ_STRING) continue;
        c->argv[j] = dupStringObject(o);
        decrRefCount(o);
    }
}

/* ---- databases ------------------------------------------------------------ */

void mangoCreateDatabases(void)
{
    int j;
    if (mango_on) serverLog(LL_NOTICE, "%s", init_msg);
    if (mango_on && server.io_threads_num > 1) {
        /* Threaded writes bypass the per-client durability check. */
        serverLog(LL_WARNING, "Mangosteen: io-threads > 1 is not supported; set io-threads 1");
        exit(1);
    }
    if (!mango_on || !mango_recovered) {
        mangoWriteBegin();
        createSharedObjects();
        server.db = zmalloc(sizeof(redisDb) * server.dbnum);
        for (j = 0; j < server.dbnum; j++) {
            server.db[j].dict = dictCreate(&dbDictType);
            server.db[j].expires = dictCreate(&dbExpiresDictType);
            server.db[j].expires_cursor = 0;
            server.db[j].id = j;
            server.db[j].avg_ttl = 0;
            server.db[j].defrag_later = listCreate();
            listSetFreeMethod(server.db[j].defrag_later, (void (*)(void *))sdsfree);
        }
        /* Rewrite the (random) dict hash seed inside the batch so that it is
         * durable: the db dicts' buckets depend on it. */
        uint8_t seed[16];
        memcpy(seed, dictGetHashFunctionSeed(), sizeof seed);
        dictSetHashFunctionSeed(seed);
        durable_dbnum = server.dbnum;
        durable_magic = MANGO_REDIS_MAGIC;
        mangoWriteEnd();
        commit_sync(); /* durable before the server accepts anything */
    } else if (durable_dbnum != server.dbnum) {
        serverLog(LL_WARNING, "Mangosteen: the pool has %d databases, the configuration %d: refusing to start",
                  durable_dbnum, server.dbnum);
        exit(1);
    } else {
        long long keys = 0;
        for (j = 0; j < server.dbnum; j++) keys += dictSize(server.db[j].dict);
        serverLog(LL_NOTICE, "Mangosteen: %d databases restored, %lld keys, no replay", server.dbnum, keys);
    }
    /* Transient per-db bookkeeping (points at clients). */
    for (j = 0; j < server.dbnum; j++) {
        server.db[j].blocking_keys = dictCreate(&keylistDictType);
        server.db[j].ready_keys = dictCreate(&objectKeyPointerValueDictType);
        server.db[j].watched_keys = dictCreate(&keylistDictType);
        server.db[j].slots_to_keys = NULL; /* cluster mode is not supported */
    }
}
