/* mango_functions.c -- Redis Functions survive restarts (durable Redis).
 *
 * Compiled into redis-server next to mango_adapter.c (see docs/redis.md,
 * "Functions").
 *
 * A function library lives in the Lua engine: compiled code and a VM whose
 * state cannot be restored at the same addresses (initServer() builds a new
 * engine and an empty library context at every start). Stock Redis keeps the
 * libraries' source in its RDB and AOF and loads it again at start-up; so
 * does this file, with the pool in place of the files:
 *   - FUNCTION LOAD, DELETE, FLUSH and RESTORE (the write subcommands) run
 *     in a write section, so their replies wait for a durable batch, but
 *     paused: the engine's and the library context's allocations stay
 *     transient, as at start-up (they used to go to the durable heap and leak
 *     there at the next restart, the libraries themselves lost);
 *   - when such a command ends, inside its write section and captured, the
 *     source of every library now loaded is copied into a durable array
 *     (mangoFunctionsSave), replacing the previous copy: a few KB of log for
 *     the usual library, once per FUNCTION command;
 *   - libraries loaded from an RDB file (an import, DEBUG RELOAD) are
 *     loaded paused too (mangoRdbFunctionLoad), and those commands save the
 *     sources at their end as well;
 *   - after recovery, before the first client, each saved source is loaded
 *     again (mangoFunctionsReload). A library that no longer loads stops the
 *     start-up with the reason, as an AOF with such a library does: going on
 *     would drop it from the pool at the next FUNCTION command.
 * The EVAL script cache is not saved: stock Redis 7 does not persist it
 * either (EVALSHA after a restart answers NOSCRIPT there too).
 */
#include "server.h"
#include "functions.h"
#include "mango_adapter.h"
#include "mango.h"

/* Durable: written only inside write sections (restored by recovery). The
 * sources of the loaded libraries, in no particular order. */
static sds *saved_code;
static unsigned long saved_count;

int mangoFunctionsWrite(const struct redisCommand *cmd)
{
    redisCommandProc *p = cmd->proc;
    return p == functionLoadCommand || p == functionDeleteCommand || p == functionFlushCommand ||
           p == functionRestoreCommand;
}

void mangoFunctionsSave(void)
{
    serverAssert(mangoInWriteSection());
    for (unsigned long i = 0; i < saved_count; i++) sdsfree(saved_code[i]);
    zfree(saved_code);
    saved_code = NULL;
    saved_count = 0;
    dict *libs = functionsLibGet();
    unsigned long n = dictSize(libs);
    if (n == 0) return;
    sds *code = zmalloc(sizeof(sds) * n);
    unsigned long i = 0;
    dictIterator *it = dictGetIterator(libs);
    dictEntry *de;
    while ((de = dictNext(it)) && i < n) {
        functionLibInfo *li = dictGetVal(de);
        code[i++] = sdsdup(li->code);
    }
    dictReleaseIterator(it);
    saved_code = code;
    saved_count = i;
}

void mangoFunctionsReload(void)
{
    for (unsigned long i = 0; i < saved_count; i++) {
        sds err = NULL;
        sds name = functionsCreateWithLibraryCtx(saved_code[i], 0, &err, functionsLibCtxGetCurrent(), 0);
        if (!name) {
            serverLog(LL_WARNING, "Mangosteen: function library %lu of %lu in the pool does not load again: %s; "
                      "start a build with the same function engine", i + 1, saved_count, err ? err : "unknown error");
            exit(1);
        }
        sdsfree(name);
    }
    if (saved_count)
        serverLog(LL_NOTICE, "Mangosteen: %lu function librar%s loaded again from the pool", saved_count,
                  saved_count == 1 ? "y" : "ies");
}

/* rdbLoadRio()'s load of a library from an RDB file (an import, DEBUG
 * RELOAD), in a write section: the engine's and the library context's
 * allocations stay transient, as for FUNCTION LOAD; the caller's batch then
 * saves the source (mangoFunctionsSave). They came from the durable heap
 * before session 36 (a leak at the next restart). */
int mangoRdbFunctionLoad(rio *rdb, int ver, functionsLibCtx *lib_ctx, int type, int rdbflags, sds *err)
{
    int paused = mangoTransientBegin();
    int rc = rdbFunctionLoad(rdb, ver, lib_ctx, type, rdbflags, err);
    mangoTransientEnd(paused);
    return rc;
}

unsigned long mangoFunctionsSaved(void) { return saved_count; }
