/* mango_adapter.h -- Mangosteen integration for Redis 7.0.15 (see docs/redis.md).
 *
 * Redis runs in Mangosteen's event-loop mode: every piece of code that may
 * change the datasets runs inside a "write section" (mangoWriteBegin/End).
 * The first write section of an event-loop pass opens a batch; later ones
 * resume it; mangoCommit() in beforeSleep() ends it. Between write sections
 * of the same pass the batch stays open but capture and durable allocation
 * are paused, so reading and parsing other clients' requests stays transient.
 *
 * Replies wait for durability per client (pipelined group commit): every
 * reply added to a client records the Mangosteen ticket it depends on
 * (mangoNoteReply, from prepareClientToWrite); the client's output is written
 * only once that ticket is durable (mangoReplyHeld). In fs mode the pass's
 * batch is synced by Mangosteen's sync thread while the loop runs the next
 * pass; an eventfd wakes the loop when a sync completes. A read of keys no
 * batch in flight has written does not wait at all.
 */
#ifndef MANGO_ADAPTER_H
#define MANGO_ADAPTER_H

#include <stdint.h>

#include "mango.h" /* MANGO_SCRATCH, on the cursors of expire.c and server.c's databasesCron() */

/* Called in main() right after the dict hash seed is set and before any dict
 * exists or the config is loaded (recovery restores the pool's hash seed and
 * the config then overrides any other restored global): opens or creates the
 * pool. Settings: mango-pool, mango-mode, mango-pool-size, mango-log-size in
 * the main config file or as --mango-* arguments, or the environment
 * (MANGO_POOL, MANGO_MODE, MANGO_POOL_SIZE, MANGO_LOG_SIZE); see docs/redis.md. */
void mangoRedisInit(int argc, char **argv);
/* main(), instead of "if (background) daemonize();": when Redis was going to
 * daemonize, mangoRedisInit() forked before opening the pool (a fork() child
 * may not write it) and this finishes the job (stdio to /dev/null, the
 * waiting parent exits 0); exit 1 with an explanation if Redis wants the
 * background after all (daemonize given on stdin, a silent supervisor). */
void mangoDaemonize(int background);
/* The mango-* options as Redis's config loading stores them (config.c). */
extern char *mango_conf_pool, *mango_conf_mode, *mango_conf_pool_size, *mango_conf_log_size;
/* Replaces initServer()'s database creation and createSharedObjects(): on a
 * fresh pool both are created inside a batch (durable); on a recovered pool
 * they were restored by mango_init. Per-db client bookkeeping dicts
 * (blocking_keys, ready_keys, watched_keys) are always created transient. */
void mangoCreateDatabases(void);
/* main(), instead of calling loadDataFromDisk() unconditionally: may Redis
 * load dump.rdb or the AOF? Always without Mangosteen. With it the pool is
 * the dataset: a dump.rdb is skipped (with a warning) when the pool was
 * recovered; a new pool imports it here, in batches, before the first client
 * (exit 1 if that fails; a pool whose import did not finish is refused at
 * every later start). (appendonly yes is refused at start-up.) */
int mangoLoadDataFromDisk(void);
/* rdbLoadProgressCallback(): the import of an RDB file into a new pool ends
 * its batch here once it is large (a no-op otherwise). */
void mangoLoadingProgress(size_t processed_bytes);
/* rdbLoadProgressCallback(), instead of processEventsWhileBlocked(): inside a
 * write section (DEBUG RELOAD) the clients are served with its batch paused,
 * and an exit served there drops that batch. */
void mangoProcessEventsWhileLoading(void);
/* Enter/leave a write section (nestable). */
void mangoWriteBegin(void);
void mangoWriteEnd(void);
/* The same around serverCron's databasesCron(), the fast expire cycle,
 * performEvictions(), expireIfNeeded()'s deletion and the graveyard's steps:
 * a write section whose only change a client can see is the deletion of
 * expired or evicted keys, each stamped by mangoKeyDeleted(), so reads of
 * other keys need not wait for its batch (a plain write section outside a
 * command makes every read wait for it). */
void mangoDeletionsBegin(void);
void mangoDeletionsEnd(void);
/* deleteExpiredKeyAndPropagate(), performEvictions(): reads of key wait for
 * the open batch. */
struct redisDb;
struct redisObject;
void mangoKeyDeleted(struct redisDb *db, struct redisObject *key);
/* The same around handleClientsBlockedOnKeys(): the served clients change
 * only the keys they are served from and BLMOVE's destinations, each stamped
 * by mangoKeyServed() (from handleClientsBlockedOnKeys()'s loop and
 * serveClientsBlockedOnListKey()). Their replies wait for the open batch. */
void mangoServeBlockedBegin(void);
void mangoServeBlockedEnd(void);
void mangoKeyServed(struct redisDb *db, struct redisObject *key);
struct client;
/* processCommand(), before running c's command: refuse it (reply sent, 1)?
 * REPLICAOF host port is (a replica's full sync loads the master's data
 * outside any write section), and so is CONFIG SET appendonly yes (the pool
 * is the durable copy), and so is a command that may grow memory while the
 * pool's durable heap has no room for what it makes (an OOM error). (replicaof and appendonly yes in the configuration
 * are refused at start-up.) Commands of any size run: a batch larger than the
 * log goes through the pool's big-batch file (docs/pool-format.md). */
int mangoRefuseCommand(struct client *c);
/* scriptCall(), for a command a script calls: refuse it with *err (an sds)
 * when the pool's durable heap has no room for it, as mangoRefuseCommand
 * does for clients' commands? (A failed allocation aborts Redis.) */
int mangoRefuseScriptCommand(struct client *c, char **err);
/* mango_heap_check.c: NULL if the durable heap has room for what c's command
 * (an EXEC: the commands it queued) may make, else the OOM error to answer
 * (an sds; the caller frees it). */
char *mangoHeapRefusal(struct client *c);
/* call(): every command, outermost or nested (MULTI/EXEC, scripts). A
 * CMD_WRITE command runs in a write section, its arguments made durable
 * copies (Redis stores them in the keyspace as they are, e.g. SET's value),
 * and its keys stamped with the open batch's ticket. A read command's replies
 * depend only on the batches that last wrote its keys (see the .c file).
 * Returns nonzero for a write command (pass it to mangoCallEnd). */
int mangoCallBegin(struct client *c);
/* Ends the pass's batch early once it fills a quarter of a batch's room. */
void mangoCallEnd(struct client *c, int write);
/* End the pass's batch, if one is open, without waiting for it to be
 * durable (replies wait instead: mangoReplyHeld). */
void mangoCommit(void);
/* prepareClientToWrite: c's pending output now depends on the open batch (if
 * a write section ran in this pass) or on the last batch ended. */
void mangoNoteReply(struct client *c);
/* Must c's pending output still wait (its batch is not durable yet)? Exits
 * the server if a sync failed (nothing after it may be acknowledged). */
int mangoReplyHeld(struct client *c);
/* call(): around its statistics, slowlog and MONITOR feed. Pauses the batch
 * if a write section is open, so what they allocate (a command's first
 * latency histogram, 24 KB; slowlog entries) is transient: made durable,
 * it was lost at every restart, and its counters were logged. */
void mangoStatsBegin(void);
void mangoStatsEnd(void);
/* networking.c: around the allocation of a client's reply blocks. A write
 * command's big reply (SET ... GET of an 8 MB value, SPOP with a count)
 * overflows the client's static buffer into reply blocks, which were made
 * in the durable heap (a transient block realloc'd there, too), so logged,
 * and freed again once sent. Begin pauses the batch if a write section has
 * capture on and returns whether it did; End resumes it then. Nestable. */
/* mango_replication.c: the replication stream is transient, its position
 * durable (replicationFeedSlaves() brackets its feeding with these). */
int mangoReplFeedBegin(void);
void mangoReplFeedEnd(int how);
void mangoReplPositionCheck(void);
void mangoReplPositionRestore(int recovered);
struct replBufBlock;
size_t mangoReplSendableEnd(const struct replBufBlock *o);
int mangoReplicaHeld(struct client *c);
uint64_t mangoDurableTicket(void);
void mangoSyncAll(void);
int mangoCommandUnfinished(void);
void mangoBookkeepingBegin(void);
void mangoBookkeepingEnd(void);
int mangoTransientBegin(void);
void mangoTransientEnd(int paused);
/* Is durability on? (replies then use the AE write barrier, like
 * appendfsync always, so a reply is never sent in the pass that made it) */
int mangoEnabled(void);
/* mango_snapshot.c: MANGOSNAPSHOT path (a backup as a pool); mangoCommit
 * starts and polls it between batches; INFO's fields; stopped at exit. */
void mangoSnapshotCommand(struct client *c);
void mangoSnapshotStep(void);
void mangoSnapshotCancel(void);
sds mangoSnapshotInfo(sds info);
/* May processEventsWhileBlocked() write replies (no batch captures)? */
int mangoMayWriteWhileBlocked(void);
/* Does any database hold keys with a TTL? (the fast expire cycle runs, in a
 * write section, only then: otherwise every pass would commit the cycle's
 * bookkeeping stores and sync for nothing) */
int mangoAnyVolatileKeys(void);
/* Used by dict.c: may this dict take an incremental rehash step now? */
int mangoDictMayRehash(const void *d);
/* Is the event loop inside a write section (stores are being logged)? */
int mangoInWriteSection(void);
/* The durable heap's address range. */
void mangoHeapRange(uintptr_t *lo, uintptr_t *hi);

/* mango_release.c: big durable objects are released in steps. */
struct redisDb;
struct redisObject;
/* db.c emptyDbStructure(): put db's dicts on the graveyard and give it empty
 * ones (1), or leave the flush to Redis (0: durability off, not server.db). */
int mangoEmptyDb(struct redisDb *db);
/* object.c decrRefCount(): o, losing its last reference in a write section,
 * is big enough to be released in steps: it is on the graveyard now (1), or
 * free it as usual (0). */
int mangoFreeLater(struct redisObject *o);
/* lazyfree.c freeObjAsync(): a durable o is freed now or put on the
 * graveyard, never handed to the lazyfree thread (1); 0: as usual. */
int mangoFreeAsync(struct redisObject *o);
/* End of a pass (mangoCommit): release some of the graveyard in the pass's
 * batch; 1 if anything is left (the loop should not sleep). */
int mangoReleaseStep(void);
/* Objects and databases waiting on the graveyard (walks it). */
unsigned long mangoGravesPending(void);
/* What the graveyard still holds of used_memory (an estimate): left out of
 * what maxmemory eviction counts (evict.c). */
size_t mangoGravesBytes(void);
/* DEBUG RELOAD runs: what it empties is freed at once, not in steps. */
int mangoFreeingAtOnce(void);

/* server.c genRedisInfoString(): append the "# Mangosteen" section of INFO
 * (an sds; a blank line first if sections came before). */
char *mangoInfo(char *info, int after_section);

/* mango_functions.c: function libraries survive restarts. */
struct redisCommand;
/* FUNCTION LOAD, DELETE, FLUSH or RESTORE: run paused in a write section. */
int mangoFunctionsWrite(const struct redisCommand *cmd);
/* At the end of such a command, in its write section: save every loaded
 * library's source in the pool. */
void mangoFunctionsSave(void);
/* After recovery, before the first client: load the saved libraries again
 * (exits with the reason if one does not load). */
void mangoFunctionsReload(void);
/* Libraries whose source the pool holds. */
unsigned long mangoFunctionsSaved(void);
/* rdbLoadRio(), instead of rdbFunctionLoad(): the same, with the engine's
 * allocations kept transient inside a write section. */
struct functionsLibCtx;
int mangoRdbFunctionLoad(struct _rio *rdb, int ver, struct functionsLibCtx *lib_ctx, int type, int rdbflags,
                         char **err);

#endif
