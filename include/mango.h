/* mango.h -- the public API of Mangosteen.
 *
 * Mangosteen makes an in-memory, linearizable application durable. The
 * application keeps its state in DRAM and hands request handling to the
 * runtime through the callbacks below. Read-only requests run in parallel;
 * read-write requests are batched by flat combining, every store they make to
 * durable memory is captured, deduplicated into 32-byte blocks and appended to
 * a persistent redo log, and a request is acknowledged (mango_client_cmd
 * returns) only once the log holding it is durable.
 *
 * Durable memory is (1) the durable heap: everything malloc'd inside a
 * read-write command, and (2) the bytes of the executable's own .data/.bss
 * that read-write commands write. After a crash, mango_init() restores both at
 * the same virtual addresses and reports MANGO_RECOVERED.
 *
 * Errors are returned, never printed; mango_strerror()/mango_last_error() give
 * the message.
 */
#ifndef MANGO_H
#define MANGO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MANGO_VERSION_MAJOR 0
#define MANGO_VERSION_MINOR 1

/* ---- callbacks (the paper's six) ------------------------------------- */

typedef struct mango_response {
    const void *data;
    size_t size;
} mango_response;

/* What init_client gets in RPC mode. */
typedef struct mango_client_params {
    uint64_t client_id; /* 1, 2, 3, ... per connection, unique in the process */
} mango_client_params;

typedef struct mango_callbacks {
    /* RPC mode only: create/destroy the per-client context. init_client gets
     * a const mango_client_params *; returning NULL refuses the connection. */
    void *(*init_client)(void *params);
    void (*destroy_client)(void *ctx);
    /* RPC mode only: parse request bytes into ctx. */
    void (*deserialize_request)(void *ctx, const void *req, size_t len);
    /* Required: does the request held in ctx leave the state unchanged? */
    bool (*is_read_only)(void *ctx);
    /* Required: execute the request held in ctx. */
    void (*process_request)(void *ctx);
    /* RPC mode only: the response for the request just processed. */
    mango_response (*get_response)(void *ctx);
    /* Optional: build the initial application state. Runs once, as a
     * read-write command, when the pool is FRESH; skipped on RECOVERED. */
    void (*init_state)(void *arg);
    void *init_state_arg;
    /* Optional: the keys of the request held in ctx (docs/architecture.md,
     * "Reads wait only for their keys"). With it, in fs and sim modes, a
     * read-only request waits only for the batches that wrote its keys to be
     * durable, instead of every batch still in flight.
     *
     * Store at most max (MANGO_MAX_KEYS) application-chosen 64-bit key ids in
     * keys[] and return how many; or return -1 (any negative value, or more
     * than max, counts as -1) when the request is not confined to keys: such
     * a read waits for every batch in flight, and such a write makes every
     * later read wait for it. Returning 0 means: a read that depends on no
     * written state (it still waits for writes without keys), a write that
     * changes nothing any read reports.
     *
     * The contract, which decides correctness:
     *   - a read-only request's response may depend only on what read-write
     *     requests naming one of its keys (or -1) wrote; a write that creates
     *     or deletes an entry names its key ("not found" is a response too);
     *     writes to state no response depends on (a count inspected only
     *     after mango_init, where a hash map's nodes sit) need no key;
     *   - key ids are computed from the request alone, never from application
     *     state (not a bucket index that a resize changes): a writer and a
     *     later reader of the same data must name the same id. For a read it
     *     runs after the read lock is released, while writers may run.
     * It runs on the same ctx after process_request (which must leave the
     * key fields intact), on the thread that ran it; for a write, inside the
     * batch: it must not allocate or write application state. Exclusive
     * batches (mango_batch_begin/end/submit, init_state) count as writing
     * every key. A key named wrongly lets a read answer before what it read
     * is durable: a crash may then take back what it returned. */
    int (*request_keys)(void *ctx, uint64_t *keys, unsigned max);
} mango_callbacks;

#define MANGO_MAX_KEYS 16 /* keys one request may name (request_keys) */

/* ---- configuration --------------------------------------------------- */

typedef enum mango_persist_mode {
    MANGO_PERSIST_AUTO = 0, /* pmem if the pool is on DAX, emulated on tmpfs, else fs */
    MANGO_PERSIST_EMULATED, /* tmpfs: survives process crashes, not power loss */
    MANGO_PERSIST_FS,       /* any file system: msync at commit */
    MANGO_PERSIST_PMEM,     /* DAX + MAP_SYNC: clwb/sfence */
    MANGO_PERSIST_NONE,     /* durability off (benchmark baseline): nothing logged */
    MANGO_PERSIST_SIM,      /* test mode: bytes reach the pool file only at sync
                             * points, so killing the process acts like a power
                             * failure that drops everything not yet synced */
} mango_persist_mode;

/* Scheduling of the backend thread, which applies the log to the pool in the
 * background (docs/architecture.md, "Backend priority"). */
typedef enum mango_backend_priority {
    MANGO_BACKEND_PRIORITY_AUTO = 0, /* SCHED_IDLE, raised when the log fills, where the
                                      * process may raise it (root, CAP_SYS_NICE,
                                      * RLIMIT_NICE >= 20); else normal */
    MANGO_BACKEND_PRIORITY_IDLE,     /* the same, but mango_init fails where it may not */
    MANGO_BACKEND_PRIORITY_NORMAL,   /* always normal priority */
} mango_backend_priority;

typedef struct mango_config {
    const char *pool_path;   /* NULL: $MANGO_POOL, else /dev/shm/mango-<exe>.pool */
    size_t pool_size;        /* bytes for a new pool; 0: 1 GiB. Ignored on open. */
    size_t log_size;         /* redo log ring of a new pool; 0: 256 MiB on a disk
                              * file system if pool_size >= 1 GiB, else 64 MiB */
    mango_persist_mode mode;
    unsigned max_threads;    /* client threads that may call in; 0: 64; at most 65536. A
                              * thread keeps its slot until it exits; one past
                              * the limit gets MANGO_EINVAL from mango_client_cmd */
    uintptr_t heap_base;     /* durable heap reservation; 0: 0x600000000000 */
    bool create_if_missing;  /* default true via mango_config_default() */
    /* Test mode (default false; MANGO_VERIFY_CAPTURE=1 also turns it on):
     * snapshot durable memory before every read-write batch, diff it after,
     * and report each changed 32-byte block whose changed bytes were not all
     * captured ("mango-verify: ... missed store at 0x..."), to stderr or the
     * file named by MANGO_VERIFY_REPORT. MANGO_VERIFY_ABORT=1 aborts at the
     * first miss. Costs two passes over all durable bytes per batch. Counts
     * in mango_stats.verify_*. See docs/testing.md. */
    bool verify_capture;
    /* Default AUTO; MANGO_BACKEND_PRIORITY=auto|idle|normal overrides it. */
    mango_backend_priority backend_priority;
    /* (No field: a store of 4 KiB or more into the durable heap is logged as
     * a data range, its bytes once, instead of 32-byte blocks at 48 bytes of
     * log each; MANGO_DATA_RANGES=0 turns that off, =N sets the size, 256 to
     * 1 GiB; another value makes mango_init fail with MANGO_EINVAL.) */
} mango_config;

void mango_config_default(mango_config *cfg);

typedef enum mango_status {
    MANGO_FRESH = 1,     /* new pool; init_state ran */
    MANGO_RECOVERED = 2, /* state restored from the pool */
} mango_status;

/* Error codes (negative returns). */
enum {
    MANGO_OK = 0,
    MANGO_EINVAL = -1,      /* bad argument or configuration */
    MANGO_EIO = -2,         /* I/O error; writes are no longer accepted (from a snapshot:
                             * only the snapshot failed) */
    MANGO_EBADPOOL = -3,    /* pool corrupt, truncated or wrong version */
    MANGO_ELAYOUT = -4,     /* pool written by a different binary/layout */
    MANGO_EBUSY = -5,       /* pool in use by another process */
    MANGO_ENOMEM = -6,      /* out of memory / address space */
    MANGO_EFAILED = -7,     /* runtime has stopped after an earlier error */
    MANGO_EEXIST = -8,
    MANGO_ENOENT = -9,
    MANGO_EAGAIN = -10,     /* not finished yet (mango_snapshot_poll) */
};

/* Start the runtime: open (or create) the pool, recover or initialise the
 * state, start the backend. Returns MANGO_FRESH or MANGO_RECOVERED, or a
 * negative error code (message in mango_last_error()). A call that fails
 * after making a new pool and opening it removes it again (before
 * init_state runs); one that made it but could not open it (another process
 * took it first: MANGO_EBUSY) leaves it to that process.
 *
 * fork(): only the process that opened the pool writes it. In a child
 * forked while the runtime is up (a snapshot writer, say), every call that
 * would write the pool or wait for it (batches, commands, submits, waits,
 * bulk loads, mango_rpc_start, mango_shutdown) fails with MANGO_EINVAL and
 * leaves it alone, even the end of a batch the parent had open; the child's
 * stores stay in its own memory, its allocations come from the glibc
 * heap, and its free() of a durable object does nothing (the object is the
 * parent's). The parent is unaffected. */
int mango_init(const mango_config *cfg, const mango_callbacks *cb);

/* Stop the runtime: drain the log into the mirror, close the pool. Frees
 * of durable objects made outside read-write commands and still queued for
 * the next batch are done first, in a last batch of their own. The durable
 * heap stays mapped, so its objects can still be read, but from here on a
 * free() (or realloc()) of a durable object frees nothing: the pool is
 * closed, and a later mango_init, on this pool or another, never applies it.
 * No other thread may be inside a mango_* call (mango_client_cmd,
 * mango_client_submit, mango_wait_durable, a batch, ...) or make one
 * meanwhile: stop and join the application's client threads first (in RPC
 * mode, mango_rpc_stop first; it lets the commands in progress finish).
 * Called with commands still running it frees what they use: a review
 * (session 36) saw crashes and heap corruption in 11 of 12 runs with four
 * threads in mango_client_cmd. Returns 0 when the pool was drained and
 * marked clean; MANGO_EFAILED (with the stopping error's message) when the
 * runtime had stopped after an earlier failure, whose pool is left as a
 * crash leaves it (the next start recovers it); or the error of the final
 * drain. */
int mango_shutdown(void);

/* Local mode: run one client command whose request is already in ctx.
 * Returns 0 once the command ran and, if read-write, is durable; a read-only
 * command returns once every write it may have seen is durable (with
 * request_keys: every write to its keys, and every write without keys). A negative
 * error code if the runtime has failed (the command did not run, or a log
 * sync failed: then it must not be acknowledged). In fs and sim modes the
 * sync of one batch overlaps the next batch: the calling thread waits for
 * its batch after the lock is released (MANGO_PIPELINE=0: under the lock).
 * Commands and batches do not nest: called from inside a command (read-only
 * or read-write) or while a batch is open on this thread, mango_client_cmd,
 * mango_client_submit and mango_batch_begin return MANGO_EINVAL (they would
 * wait for the write side their own thread holds back). */
int mango_client_cmd(void *ctx);

/* Local mode without the wait: runs the command like mango_client_cmd but
 * returns once it ran, and stores in *ticket what its response depends on:
 * send the response only once mango_durable_ticket() reports a durable
 * ticket >= *ticket (0: at once). So one thread can serve many clients,
 * holding each response rather than waiting (RPC mode does this). In modes
 * without pipelined commits (mango_commit_is_pipelined() false) the ticket
 * is always 0. If mango_durable_ticket() reports an error (MANGO_EIO,
 * MANGO_EFAILED), responses whose ticket is past *durable must never be sent. Errors as mango_client_cmd. */
int mango_client_submit(void *ctx, uint64_t *ticket);

/* RPC mode: Mangosteen owns the sockets (docs/rpc.md). A TCP listener and
 * `threads` worker threads, each with its own event loop; a connection stays
 * on one worker. Every request and response is a frame: a 4-byte
 * little-endian payload length, then the payload. For each request the
 * worker calls deserialize_request(ctx, payload, len), runs the command
 * (batched), calls get_response(ctx), and sends that response frame once the
 * command is durable (or, for a read, once what it read is). With pipelined
 * commits (fs, sim) the worker does not wait for that: it holds the response
 * and serves its other connections meanwhile. Requests of one connection run
 * in order; a client may send several before reading (pipelining).
 * A frame longer than max_request, a client that leaves its responses
 * unread for 10 s or a request frame incomplete for 10 s, an idle
 * connection past idle_timeout_ms, or a command the runtime refuses closes
 * that connection only. A connection over max_connections, or one that
 * arrives while the process is out of descriptors, is accepted and closed
 * at once. Call after mango_init; one server per process. */
typedef struct mango_rpc_config {
    const char *host;     /* address to listen on: IPv4, IPv6 or a name (its first address
                           * that binds); NULL: 127.0.0.1 */
    uint16_t port;        /* 0: any free port (mango_rpc_port tells which) */
    unsigned threads;     /* worker threads; 0: 8; at most 256 and less than
                           * mango_config.max_threads (else MANGO_EINVAL) */
    uint32_t max_request; /* largest request payload in bytes; 0: 1 MiB; at most 1 GiB */
    const char *unix_path; /* non-NULL: listen on this Unix-domain socket instead of TCP (host
                            * and port unused; mango_rpc_port() is 0). A socket left there by a
                            * server that is gone is replaced; a live server's socket, or
                            * anything else, is refused (MANGO_EEXIST). Removed at stop if the
                            * path still names it. */
    uint32_t max_connections; /* connections open at a time; 0: 1024; at most 1048576.
                               * Past it a new one is accepted and closed at once
                               * (mango_rpc_stats.rejected). With max_request it bounds
                               * the memory incomplete request frames may take. */
    uint32_t idle_timeout_ms; /* close a connection that has sent nothing for this long
                               * while nothing of it is in progress (no partial frame,
                               * no response unsent or held); 0: never; else 100 to
                               * 86400000 (MANGO_EINVAL otherwise) */
} mango_rpc_config;

typedef struct mango_rpc_stats {
    uint64_t accepted;      /* connections accepted */
    uint64_t closed;        /* connections closed (by either side, or refused) */
    uint64_t requests;      /* requests run */
    uint64_t bad_frames;    /* connections closed for a frame over max_request */
    uint64_t send_timeouts; /* connections closed for not reading their responses */
    uint64_t refused;       /* connections closed because the runtime refused a command,
                             * or because a sync its held responses waited for failed */
    uint64_t held;          /* responses held until their command was durable, while
                             * the worker served other requests (fs, sim modes) */
    uint64_t frame_timeouts; /* connections closed for leaving a request frame incomplete
                              * for 10 s (MANGO_RPC_FRAME_TIMEOUT_MS) */
    uint64_t rejected;      /* connections closed on arrival: max_connections were open,
                             * or the process was out of descriptors (not in accepted) */
    uint64_t idle_timeouts; /* connections closed after idle_timeout_ms with nothing sent */
} mango_rpc_stats;

/* Returns once the server listens: 0, or MANGO_EINVAL (bad configuration,
 * missing callbacks, not initialised, already serving), MANGO_EEXIST (the
 * port is taken, or a server listens on unix_path), MANGO_EIO. */
int mango_rpc_start(const mango_rpc_config *cfg);
/* The port it listens on, or a negative error if it does not. */
int mango_rpc_port(void);
/* The running server's counters (zeros if none). This and mango_rpc_port
 * may be called from any thread, also during mango_rpc_stop. */
void mango_rpc_get_stats(mango_rpc_stats *out);
/* Stops accepting, closes every connection, joins the threads. Commands in
 * progress finish first. Call before mango_shutdown. */
int mango_rpc_stop(void);

/* Event-loop mode, for single-threaded servers (e.g. Redis) that execute
 * commands themselves and want every read-write command of one loop pass in
 * one batch: mango_batch_begin() takes the write side (waiting for other
 * threads' commands to drain) and starts capture; the caller executes any
 * number of commands; mango_batch_end() commits them with one sync and
 * returns 0 once they are durable: only then may their replies be sent.
 * On error (MANGO_EIO, MANGO_EFAILED) nothing of the batch may be
 * acknowledged and the runtime accepts no more writes. Do not call
 * mango_client_cmd from inside a batch. */
int mango_batch_begin(void);
int mango_batch_end(void);
bool mango_batch_open(void);

/* Pipelined group commit, for event loops that can hold replies back (e.g.
 * Redis): mango_batch_submit() ends the open batch like mango_batch_end() but
 * does not wait for it to be durable. In fs and sim modes the frame is sealed
 * and a sync thread makes it durable (one sync covers every batch submitted
 * meanwhile) while the caller runs the next batch; in the other modes (or
 * with MANGO_PERSIST_NONE, or MANGO_PIPELINE=0 in the environment) the batch
 * is durable when submit returns. Every ended batch gets a *ticket*
 * (1, 2, 3, ... in order; empty batches too); a ticket is durable once it and
 * every earlier one are.
 *
 * The promise stays that of mango_batch_end: a reply may be released only
 * when the batches it depends on are durable. A reply produced now depends on
 * mango_reply_ticket(): the open batch's future ticket if one is open on this
 * thread (the reply may report its writes), else the last ticket handed out
 * (a read may have observed a batch still in flight). Release the reply once
 * mango_durable_ticket() reaches that value. mango_durable_fd() is an eventfd
 * (non-blocking) that becomes readable whenever a sync in the background
 * advances the durable ticket, or fails: poll it in the event loop and read 8
 * bytes to clear it. A ticket that is durable when handed out (submit or end
 * synced it inline) does not make it readable: the caller knows already.
 *
 * mango_durable_ticket() returns MANGO_EIO once a deferred sync has failed,
 * and MANGO_EFAILED once the runtime stopped after any other error (a batch
 * whose inline commit failed gets no ticket, so the one its replies were
 * to wait for never comes): tickets past *durable are then never durable,
 * their replies must not be sent, and the runtime accepts no more writes.
 * mango_wait_durable(ticket) blocks until the ticket is durable: 0, or
 * MANGO_EIO after a failed deferred sync, or MANGO_EFAILED at once for a
 * ticket the stopped runtime never handed out (until session 39 it waited
 * for that one for good). Single event-loop thread: do
 * not mix with mango_client_cmd from other threads (mango_batch_end and
 * mango_client_cmd still work and wait for everything in flight). */
int mango_batch_submit(uint64_t *ticket);
/* Does mango_batch_submit leave batches in flight (fs and sim modes, unless
 * MANGO_PIPELINE=0)? If not, every ticket is durable when handed out and an
 * application can skip tracking reply dependencies. */
bool mango_commit_is_pipelined(void);
uint64_t mango_reply_ticket(void);
int mango_durable_ticket(uint64_t *durable);
int mango_wait_durable(uint64_t ticket);
int mango_durable_fd(void);
/* Inside an open batch: pause capture and durable allocation on this thread
 * (e.g. while an event loop parses the next request), and resume them. The
 * batch stays open; mango_batch_end may be called paused or not. */
int mango_batch_pause(void);
int mango_batch_resume(void);
/* Log room, in bytes of captured data (32-byte blocks): *used by the batch
 * open on this thread (0 if none; distinct blocks, so a block written twice
 * counts once; a store of 4 KiB or more into the durable heap is a data range
 * and counts 32 per log entry it takes, about 2/3 of its length) and
 * *capacity, the most one batch may hold in the log ring (half the log, less
 * its framing, divided by the per-block overhead). A
 * batch above capacity is committed through the pool's big-batch file
 * instead (docs/pool-format.md): synchronously, after the batches before it,
 * and at most one such batch at a time, so slower. An event loop can end a
 * batch early between two commands once *used grows large. */
void mango_batch_room(uint64_t *used, uint64_t *capacity);
/* Bulk loading, for filling a state fast (an import into a new pool):
 * between mango_batch_bulk_begin() and mango_batch_bulk_end(), inside one
 * open batch, stores into the durable heap are not captured one by one
 * (allocation stays durable; stores into .data/.bss still are). Instead
 * mango_batch_bulk_end() logs the heap as it then is: the part carved during
 * the bulk in pieces of up to a quarter of the log, each its own frame,
 * synced at once; the part that existed before it with the batch itself.
 * The batch's log costs about the heap's size, not its stores: worth it when
 * the bulk writes most of the heap (a new pool), not for a few keys in a
 * large one.
 *
 * Atomic like any batch: recovery after a crash anywhere before the batch
 * is durable finds the state as it was at mango_batch_bulk_begin() (the
 * pieces lie above the heap's top of then, where that state has nothing;
 * the first one also tells it that the space is no longer zero). There is
 * no second copy of the data (a batch larger than the log, by contrast,
 * goes through the pool's big-batch file).
 *
 * mango_batch_bulk_begin() first commits, synchronously, what the batch
 * wrote before it (its replies' ticket is then durable). A batch that ends
 * (or is submitted) in bulk ends the bulk first. The batch may be paused
 * during the bulk (heap stores made while paused are logged too: the heap is
 * logged as it is). In mode none, or under the capture verifier
 * (verify_capture, MANGO_VERIFY_CAPTURE=1), the pair is
 * accepted and changes nothing (every store is captured as usual).
 * MANGO_EINVAL: no batch open on this thread, begin twice, end without
 * begin, or begin on a paused batch. Test hook: MANGO_TEST_BULK_KILL_AFTER=N
 * in the environment sends the process SIGKILL right after the N-th piece is
 * durable (0: after the commit of mango_batch_bulk_begin()). */
int mango_batch_bulk_begin(void);
int mango_batch_bulk_end(void);
/* Called by mango_batch_bulk_end() (or the batch end that ends a bulk) on
 * its thread after each piece is durable, with the bytes of pieces written
 * so far and their total: for progress reports and for an event loop that
 * must keep answering while a large heap is logged (many seconds for
 * gigabytes in fs mode). The batch is open and may be paused and resumed
 * inside; the hook must not write durable state. NULL (the default): none. */
void mango_set_bulk_progress(void (*fn)(void *arg, uint64_t done, uint64_t total), void *arg);
/* The durable heap: *allocated bytes (allocations with their headers) and
 * its *capacity (fixed when the pool was made); 0 and 0 without a durable
 * mode. An allocation the heap cannot hold fails (malloc returns NULL), so an
 * application can refuse work that would grow its state while the room left,
 * capacity - allocated (less any fragmentation), is short. */
void mango_heap_room(uint64_t *allocated, uint64_t *capacity);
/* Would one allocation of `bytes` find room in the durable heap? Free space
 * can lie in pieces between live objects, so room by mango_heap_room is no
 * promise for a large value. If not, and it is called inside a read-write
 * command (capture active), it reclaims space that only some requests could
 * use (freed small objects), as a failing malloc would, and looks again
 * (a walk of the heap, done only if something was freed since the last
 * reclaim); elsewhere it only looks: from a thread outside the runtime's
 * sections it looks holding the write side (it waits for a batch in
 * progress, as a read-write command would), since the walk may not race
 * with a batch that changes the heap; inside a read-only command or a
 * paused batch it looks at once. true without a durable mode. */
bool mango_heap_fits(size_t bytes);

/* Explicit capture: tell the runtime that [addr, addr+len) is about to be
 * (or was just) written by the current read-write command. A no-op outside
 * read-write commands. The compiler plugin emits these automatically. */
void mango_capture(const void *addr, size_t len);

/* Scratch memory: durable bytes whose value recovery does not need, such as
 * statistics, cached clocks, and cursors any value of which is valid. Stores
 * to them are captured as always, but at the end of a batch a 32-byte block
 * whose written bytes are all scratch is left out of the log, and a batch
 * left with nothing to log commits nothing: it costs no sync, and its ticket
 * is durable once the batches before it are. (A block that also holds a written byte that is
 * not scratch is logged whole, scratch bytes included.) This keeps the
 * periodic bookkeeping of an idle server off the disk.
 *
 * After recovery a scratch byte's value is unspecified: in the executable's
 * data it is one the byte held at some time (its initial value, or one a
 * batch logged with a neighbour), in the durable heap it may be anything.
 * Reset scratch memory at start-up, or use it only where any value is
 * valid. Memory stays scratch until mango_shutdown, or, in the durable
 * heap, until it is freed (the allocator's own writes there are logged, and
 * an object allocated there later is not scratch).
 *
 * mango_scratch marks [addr, addr+len), which must lie in durable memory
 * (the durable heap or the executable's data): MANGO_EINVAL otherwise, or
 * when more than 64 KiB (2048 blocks) would be scratch. A no-op without a
 * durable mode. Call it after mango_init: inside a read-write command or
 * batch, or outside any (it then waits for the write side, as a read-write
 * command does); from a read-only command it is refused with MANGO_EINVAL
 * (the write side would wait for that command's own read).
 *
 * MANGO_SCRATCH on a writable global or static of the executable (a static
 * local too) marks it at mango_init (in a shared library it marks nothing:
 * only the executable's data is durable):
 *     static unsigned next_db MANGO_SCRATCH = 0;
 */
int mango_scratch(const void *addr, size_t len);
#define MANGO_SCRATCH __attribute__((section("mango_scratch_globals"), used))

/* Snapshot: an online backup. Writes a new pool at path holding the durable
 * state as it is at one point between batches, while the application goes
 * on: the write side is held only to wait until every batch so far is
 * durable, and to fork() a writer process; the
 * writer copies the durable heap (up to the allocator's top) and the
 * executable's durable data from its copy-on-write image, syncs the new
 * pool and only then gives it its name (a crash or a killed writer leaves
 * nothing at path). The call returns when the snapshot is durable.
 *
 * The snapshot has the pool's size, log size, heap address and layout
 * fingerprint; mango_init with it as the pool path recovers it
 * (MANGO_RECOVERED) as if the process had been shut down cleanly at that
 * point. Copy it as any file; it is not in use. Like a fork-based save, it
 * holds the memory as it is, so a store made outside batches to durable
 * memory (which recovery from the pool would not see) is in it.
 *
 * Errors: MANGO_EEXIST if path exists (nothing is ever replaced);
 * MANGO_EINVAL if path names one of the pool's own files (below), before
 * mango_init, without a durable mode, inside a batch or a command,
 * read-write or read-only (call it outside any: it waits for the write side
 * as a read-write command does, which a read-only command's own read would
 * hold back for good), or in a
 * fork() child; MANGO_EFAILED once the runtime has stopped after an error,
 * also when a batch that held the write side while the call waited for it
 * failed to commit (its stores, answered with an error, are never in a
 * snapshot); MANGO_EIO/MANGO_ENOMEM if the writer cannot be started or
 * fails (its message says why; nothing is left at path). info (may be
 * NULL) gets the heap bytes copied, how long the write side was held and
 * the whole call's time. The heap's bytes are also written to disk once,
 * so leave room for a pool's size at path. The snapshot is a sparse file
 * (its log ring is all holes): the first mango_init that opens it for
 * writing reserves all of its blocks and writes its ring (a 256 MiB ring:
 * about 0.3 s), and fails with MANGO_EIO, the file unchanged (its disk
 * space too), when the disk lacks room for the pool's full size. */
/* Pacing. MANGO_SNAPSHOT_SHARE=P: the writer keeps the disk busy P % of
 * the time at most (after each 2 MiB piece it idles (100 - P) / P of the
 * time the piece's writeback took), so that the application's log syncs
 * meet an idle disk the rest of the time; 1..100, 100: not paced. Default:
 * 25 in fs mode (the application's syncs go to a disk) when path may be
 * on one of the pool's disks, 100 otherwise: on another disk (its block
 * devices followed through partitions, loop devices and device-mapper or md
 * slaves in /sys; a file system without a block device of its own, such as
 * btrfs or NFS, counts as the same disk), in memory (tmpfs), or another mode.
 * MANGO_SNAPSHOT_MBPS=N instead paces the copy to N MB/s (0: not paced by
 * rate; when N > 0 the share is not used). A value out of range fails the
 * call with MANGO_EINVAL. */
typedef struct mango_snapshot_info {
    uint64_t heap_bytes;  /* the durable heap's extent copied */
    double pause_seconds; /* the write side held: wait for durability, fork */
    double seconds;       /* the whole call */
    unsigned share;       /* the pace used: MANGO_SNAPSHOT_SHARE's percent (100: not paced by share) */
    double mbps;          /* or MANGO_SNAPSHOT_MBPS (0: not paced by rate) */
    double paced_seconds; /* of seconds, what the writer spent idle to leave the disk to the application */
    bool shares_disk;     /* fs mode: path may be on one of the pool's disks (the default share is
                           * 25 only then); false in the other modes */
} mango_snapshot_info;
int mango_snapshot(const char *path, mango_snapshot_info *info);
/* The same in two steps, for a caller that must not block (an event loop):
 * mango_snapshot_start returns once the writer runs (the write side is
 * released; errors as above, and then *job is NULL); mango_snapshot_poll
 * then returns MANGO_EAGAIN while it works (wait false), or its result,
 * which ends the job (info as above). mango_snapshot_cancel stops a writer
 * (SIGKILL), removes its temporary file and ends the job; call it before
 * exiting with a snapshot running (a writer whose process is gone is
 * stopped, but its temporary file stays until the next snapshot to that
 * path). The writer is a child process: a SIGCHLD handler or a waitpid(-1)
 * of the application may reap it, which the result does not depend on. */
typedef struct mango_snapshot_job mango_snapshot_job;
int mango_snapshot_start(const char *path, mango_snapshot_job **job);
/* The path checks mango_snapshot_start makes first, for a caller that
 * answers before it starts: MANGO_EEXIST if path exists, MANGO_EINVAL if
 * it is a name the pool gives its own files (<pool>.bigbatch, which a clean
 * shutdown and recovery remove and big batches write, or <pool>.tmp.*,
 * which a pool creation removes), or ends like a file of any pool does
 * (.bigbatch, .tmp.<pid>, .copying-<pid>), or there is no pool; else
 * MANGO_OK. */
int mango_snapshot_check_path(const char *path);
int mango_snapshot_poll(mango_snapshot_job *job, bool wait, mango_snapshot_info *info);
void mango_snapshot_cancel(mango_snapshot_job *job);
/* (The writer stops by itself once the process that started it is gone.
 * In a fork() child, poll is refused and cancel does nothing: the writer
 * is the parent's.) */

/* ABI for the mango-cc compiler plugin: true on a thread while it runs a
 * read-write batch. Instrumented stores test it inline and call
 * mango_capture() only when it is set. */
extern __thread bool mango_capture_active __attribute__((tls_model("initial-exec")));

/* True while the calling thread executes read-write commands. */
bool mango_in_rw_command(void);

const char *mango_strerror(int code);
const char *mango_last_error(void);

/* Counters for benchmarks and tests. Those of the backend and the sync
 * thread are read atomically; those the frontend keeps under the write side
 * (batches, commands, log bytes, ...) are read without taking it: exact when
 * no command runs (e.g. after the client threads were joined), while
 * commands run a snapshot that may lag, the fields not taken at one moment. */
typedef struct mango_stats {
    uint64_t batches;        /* committed read-write batches */
    uint64_t rw_commands;    /* read-write commands executed */
    uint64_t log_blocks;     /* entries written to the log: 32-byte blocks, zero ranges,
                              * data ranges (a header and one entry per 48 bytes) */
    uint64_t log_bytes;      /* bytes appended to the log (frames incl. headers) */
    uint64_t frontend_syncs; /* ordering points that waited for the medium (commit) */
    uint64_t backend_syncs;
    uint64_t overflow_blocks;/* distinct blocks past the dedup set's load limit (spill set) */
    uint64_t log_full_waits; /* times the combiner waited for log space */
    uint64_t commit_ns_total;/* time writing + syncing frames (inline commits sampled: 1 in 16,
                              * scaled; the sync thread's syncs all timed) */
    uint64_t verify_batches; /* batches checked by the capture verifier */
    uint64_t verify_missed_blocks; /* changed durable blocks it found not captured */
    uint64_t pipelined_batches; /* batches sealed and synced later by the sync thread
                                 * (mango_batch_submit, and combined batches in fs/sim) */
    uint64_t pipeline_syncs;    /* syncs of the pipeline's sync thread (in frontend_syncs) */
    uint64_t backend_lowered;   /* 1: the backend runs SCHED_IDLE between boosts */
    uint64_t backend_boosts;    /* times the frontend raised it because the log filled */
    /* The durable heap's allocations in use (O(1); right after recovery too).
     * Exact when read by the thread that runs read-write commands or while
     * no batch runs. */
    uint64_t heap_chunks;        /* allocations */
    uint64_t heap_payload_bytes; /* their bytes, as malloc_usable_size counts them
                                  * (memalign's blocks are counted whole) */
    uint64_t heap_allocated_bytes; /* the same with the allocator's 8-byte chunk headers
                                    * (objects of up to 128 bytes have none) */
    uint64_t log_zero_ranges;    /* zero-range entries logged (callocs of reused heap memory) */
    uint64_t log_capacity;       /* bytes of the redo log ring */
    uint64_t log_unapplied_bytes;/* committed log the backend has not applied to the mirror yet */
    uint64_t batches_in_flight;  /* submitted batches whose log sync has not completed */
    uint64_t big_batches;        /* batches too large for a log frame, committed through the big-batch file */
    uint64_t big_batch_bytes;    /* bytes written to that file (headers and entries; in log_bytes too) */
    uint64_t heap_capacity;      /* bytes the durable heap may grow to (mango_heap_room) */
    uint64_t recovery_frames_replayed; /* committed batches this process's start replayed from the log */
    uint64_t recovery_blocks_replayed; /* their entries (a big batch's from its file) */
    uint64_t recovery_torn_tail;       /* 1: that start discarded an incomplete last frame (a batch
                                        * whose commit a crash cut short: never acknowledged) */
    uint64_t log_data_ranges;    /* data-range entries logged (stores of 4 KiB or more into the heap) */
    uint64_t log_data_bytes;     /* the bytes they carried */
    uint64_t reads_waited;       /* read-only commands that waited for a sync (fs, sim): with
                                  * request_keys, only those whose keys were in flight */
    uint64_t heap_carved_bytes;  /* the durable heap's extent, from its start to its top: what
                                  * it occupies (allocations, free space, allocator metadata)
                                  * and what recovery copies */
    uint64_t heap_reclaims;      /* times a request that found no room turned free space only
                                  * some requests could use (emptied slabs, free small chunks)
                                  * into general space, since this process attached the heap */
    uint64_t scratch_blocks_dropped; /* written blocks left out of the log: all their written
                                      * bytes were scratch (mango_scratch) */
    uint64_t scratch_batches;    /* batches that logged nothing because they wrote only scratch */
} mango_stats;

void mango_get_stats(mango_stats *out);

/* The persistence mode in effect ("emulated", "fs", "pmem", "sim", "none";
 * "auto" resolved) and the pool's path ("" in mode none, which opens no
 * pool); both "" before mango_init. */
const char *mango_mode_name(void);
const char *mango_pool_path(void);

#ifdef __cplusplus
}
#endif
#endif
