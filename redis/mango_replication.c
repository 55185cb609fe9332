/* mango_replication.c -- the replication stream of a durable master: its
 * bytes transient, its position durable (durable Redis; docs/redis.md,
 * "Serving replicas").
 *
 * Compiled into redis-server next to mango_adapter.c. The patch brackets
 * the feeding part of replicationFeedSlaves() (every byte of the stream goes
 * through it: write commands' propagation, expiry and eviction DELs,
 * serverCron's PING, WAIT's REPLCONF GETACK) with mangoReplFeedBegin() and
 * mangoReplFeedEnd().
 *
 * The stream's bytes (the shared replication buffer's blocks: the backlog
 * and the replicas' output) are allocated and written with the batch paused:
 * transient, never logged. What is durable is the stream's position: the
 * replication ID and master_repl_offset after the last feed, stored inside
 * the batch that holds the writes the feed describes. A feed outside every
 * write section (PING, GETACK) opens one that changes no key, so its bytes
 * too belong to a batch. A replica is sent only bytes whose batch is
 * durable (below), so it never holds a byte past the position its master's
 * pool records.
 *
 * A replica is sent the stream up to the last byte whose batch is durable,
 * not the whole of its output: fed holds, for the batches in flight, the
 * offset at which each one's part of the stream ends, and _writeToClient()
 * stops a replica's write there (mangoReplSendableEnd). Holding a replica's
 * whole output until its newest byte was durable, as a client's reply is
 * held, left it a batch or more behind for as long as writes kept coming.
 * A full sync's fork waits until everything submitted is durable
 * (mangoSyncAll from startBgsaveForReplication), so the RDB file it sends
 * holds only durable writes; so does a shutdown before its last flush of the
 * replicas' output (finishShutdown), so they leave with the whole stream.
 *
 * After a restart (a crash included) the master gets a new replication ID,
 * as stock Redis restarted from an RDB file with replication information
 * does, keeps the recorded ID as its secondary one, valid up to the recorded
 * offset, and starts an empty backlog there. A replica that had the whole
 * stream up to that position continues with a partial resync (+CONTINUE)
 * instead of a full sync of the dataset; one that lagged behind it gets a
 * full sync, since the bytes it lacks were transient.
 *
 * The position is valid only while every change to the dataset is fed to the
 * stream. Without a backlog (none yet, or freed after repl-backlog-ttl
 * without replicas) Redis feeds nothing, so the first write section that
 * finds no backlog forgets the position, in its own batch
 * (mangoReplPositionCheck): a replica from before could otherwise continue
 * past writes it never received.
 */
#include "server.h" /* (first: its feature macros) */
#include "mango_adapter.h"
#include "mango.h"

/* Durable (.bss, written only while a batch captures). An empty ID: no
 * position, replicas resync in full. */
static char durable_replid[CONFIG_RUN_ID_SIZE + 1];
static long long durable_repl_offset;
/* Transient (written outside batches): the position check is on once
 * start-up has restored the position (or found none). */
static int position_checked;

/* The stream's batches in flight, oldest first: fed_end[i] is the offset at
 * which batch fed_ticket[i]'s part ends. Thread-locals (the event loop's):
 * the capture plugin never logs them, and they change with every feed. */
#define FED_MAX 256
static __thread uint64_t fed_ticket[FED_MAX];
static __thread long long fed_end[FED_MAX];
static __thread unsigned fed_head, fed_count;
static __thread long long durable_end; /* the stream up to here is durable */

/* The feed that just ended belongs to the open batch (ticket t). */
static void note_fed(uint64_t t)
{
    unsigned last = (fed_head + fed_count - 1) % FED_MAX;
    if (fed_count && fed_ticket[last] >= t) {
        fed_end[last] = server.master_repl_offset;
    } else if (fed_count == FED_MAX) {
        /* Merge into the newest: its bytes wait for t. Reached with a
         * backlog but no replica reading for 256 feeding batches (e.g.
         * after a restart; found by a review, session 37). */
        fed_ticket[last] = t;
        fed_end[last] = server.master_repl_offset;
    } else {
        unsigned i = (fed_head + fed_count++) % FED_MAX;
        fed_ticket[i] = t;
        fed_end[i] = server.master_repl_offset;
    }
}

/* The end of the durable part of the stream. */
static long long stream_durable_end(void)
{
    if (!fed_count) return server.master_repl_offset;
    uint64_t d = mangoDurableTicket();
    while (fed_count && fed_ticket[fed_head] <= d) {
        durable_end = fed_end[fed_head];
        fed_head = (fed_head + 1) % FED_MAX;
        fed_count--;
    }
    return fed_count ? durable_end : server.master_repl_offset;
}

size_t mangoReplSendableEnd(const replBufBlock *o)
{
    if (!mangoEnabled()) return o->used;
    long long end = stream_durable_end() - o->repl_offset + 1; /* block byte i has offset repl_offset + i */
    if (end < 0) return 0;
    return (size_t)end < o->used ? (size_t)end : o->used;
}

int mangoReplicaHeld(client *c)
{
    if (!c->ref_repl_buf_node || !clientHasPendingReplies(c)) return 0;
    const replBufBlock *o = listNodeValue(c->ref_repl_buf_node);
    return o->repl_offset + (long long)c->ref_block_pos > stream_durable_end();
}

/* What mangoReplFeedBegin did, for mangoReplFeedEnd. */
#define FEED_ON 1
#define FEED_OPENED_SECTION 2
#define FEED_PAUSED 4

/* Stores the stream's position; the caller's batch captures. */
static void record_position(void)
{
    if (durable_repl_offset != server.master_repl_offset)
        durable_repl_offset = server.master_repl_offset;
    if (memcmp(durable_replid, server.replid, sizeof durable_replid) != 0)
        memcpy(durable_replid, server.replid, sizeof durable_replid);
}

int mangoReplFeedBegin(void)
{
    if (!mangoEnabled()) return 0;
    int how = FEED_ON;
    if (!mangoInWriteSection()) {
        mangoBookkeepingBegin(); /* PING, GETACK, a read's propagated DEL */
        how |= FEED_OPENED_SECTION;
    }
    if (mango_capture_active) { /* not when the caller paused the batch itself */
        mango_batch_pause();
        how |= FEED_PAUSED;
    }
    return how;
}

void mangoReplFeedEnd(int how)
{
    if (!how) return;
    note_fed(mango_reply_ticket()); /* paused: the open batch's ticket */
    mango_batch_resume(); /* capture the position's stores */
    record_position();
    if (!(how & FEED_PAUSED)) mango_batch_pause(); /* as the caller had it */
    if (how & FEED_OPENED_SECTION) mangoBookkeepingEnd();
}

void mangoReplPositionCheck(void)
{
    /* No backlog, or a replica (refused, FAILOVER included; a safety net):
     * this server's changes are not on its own stream. */
    if (position_checked && durable_replid[0] && (server.repl_backlog == NULL || server.masterhost))
        durable_replid[0] = '\0'; /* in the caller's batch: see the top of the file */
}

void mangoReplPositionRestore(int recovered)
{
    position_checked = 1;
    if (!recovered || !durable_replid[0] || server.masterhost || server.repl_backlog) return;
    /* As loadDataFromDisk() does with an RDB file's replication information. */
    memcpy(server.replid2, durable_replid, sizeof server.replid2);
    server.second_replid_offset = durable_repl_offset + 1;
    server.master_repl_offset = durable_repl_offset;
    createReplicationBacklog(); /* empty, starting at durable_repl_offset + 1 */
    server.repl_no_slaves_since = time(NULL);
    serverLog(LL_NOTICE, "Mangosteen: the replication stream's position was restored from the pool (ID %s, offset "
              "%lld): a replica that had all of it continues with a partial resync; the new replication ID is %s",
              server.replid2, durable_repl_offset, server.replid);
}
