/* rpc_server.c -- RPC mode: Mangosteen owns the sockets and a thread pool.
 *
 * Layout (paper, section 3.2): an acceptor thread takes TCP connections and
 * hands each to one worker thread, round robin. Every worker runs its own
 * epoll event loop over its connections; a connection stays on its worker
 * for its whole life, so its client context is only ever touched by that
 * thread (init_client, deserialize_request, the command, get_response,
 * destroy_client all run there).
 *
 * Wire format (docs/rpc.md): each request and each response is a frame, a
 * 4-byte little-endian payload length followed by the payload. A worker
 * reads whole frames, and for each one in order: deserialize_request(ctx,
 * payload, len), the command, get_response(ctx), then queues the response
 * frame. A client may send several requests without waiting (pipelining);
 * responses come back in request order.
 *
 * Held responses. Where commits are pipelined (fs, sim), the worker does not
 * wait while a command becomes durable: mango_client_submit runs it and
 * names the ticket its response depends on, the response is queued as held
 * behind that ticket, and the worker goes on with its other connections. The
 * pipeline's listener (durable_advanced, on the sync thread) writes the
 * worker's durable_fd when the durable ticket passes the one the worker
 * waits for; the worker then releases, in order, every response whose
 * ticket is durable. A response is never sent before its ticket is durable,
 * and a failed sync closes every connection with held responses. Elsewhere
 * (none, emulated, pmem, MANGO_PIPELINE=0) a command is durable when it
 * returns (mango_client_cmd) and nothing is held.
 *
 * Responses go to a per-connection output buffer and are sent without
 * blocking. A client that stops reading them has its connection watched for
 * output only (W_WRITE): its further requests wait in the socket, unread and
 * not run, while the worker serves its other connections. A connection with
 * RPC_MAX_HELD held responses (or RPC_MAX_HELD_BYTES of them) is watched for
 * nothing (W_NONE) until some are released.
 *
 * Bad input closes only its own connection: a frame longer than
 * max_request, a client that leaves responses unread for 10 s
 * (MANGO_RPC_SEND_TIMEOUT_MS in the environment), a request frame left
 * incomplete for 10 s (MANGO_RPC_FRAME_TIMEOUT_MS), or a command the runtime
 * refused (then nothing of it may be acknowledged). The counters in
 * mango_rpc_stats say why. With idle_timeout_ms set, a connection with
 * nothing in progress that sends nothing for that long is closed too.
 *
 * Admission: at most max_connections are open at a time (1024 by default);
 * the acceptor accepts one more and closes it at once, so its client sees
 * the close instead of waiting unanswered in the listen backlog. Out of
 * descriptors (EMFILE), it does the same with a descriptor it keeps spare
 * for that. Both count in rejected. So the memory that incomplete frames
 * may take is bounded by max_connections * max_request (found by a review,
 * session 40: connections were limited only by the descriptor limit, and
 * past it new clients hung in the backlog).
 */
#define _GNU_SOURCE
#include "rpc/rpc_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "runtime/env_number.h"
#include "runtime/error.h"
#include "runtime/submit.h"

#define RPC_SEND_TIMEOUT_MS 10000  /* default of MANGO_RPC_SEND_TIMEOUT_MS */
#define RPC_FRAME_TIMEOUT_MS 10000 /* default of MANGO_RPC_FRAME_TIMEOUT_MS */
#define RPC_MAX_THREADS 256
#define RPC_DEFAULT_THREADS 8
#define RPC_DEFAULT_MAX_REQUEST (1u << 20)
#define RPC_READ_CHUNK 65536             /* input buffer, and the usual read */
#define RPC_OUT_CHUNK 4096               /* output buffer to start with */
#define RPC_MAX_HELD 1024                /* held responses per connection before it stops reading */
#define RPC_MAX_HELD_BYTES (4u << 20)    /* or bytes of them */
#define RPC_DEFAULT_MAX_CONNECTIONS 1024
#define RPC_MAX_CONNECTIONS (1u << 20)
#define RPC_MAX_IDLE_TIMEOUT_MS 86400000u

enum watching { W_READ, W_WRITE, W_NONE };

/* A response queued behind a ticket that was not durable yet. */
typedef struct held_response {
    uint64_t ticket;
    uint64_t end; /* stream offset just past the response */
} held_response;

typedef struct conn {
    int fd;
    void *ctx;
    uint8_t *buf; /* bytes received, not yet processed */
    size_t len, cap;
    /* Responses not yet sent: out[out_off..out_len), of which
     * out[out_off..out_ready) may go now; the rest are held. out[0] is byte
     * out_base of the connection's output stream. */
    uint8_t *out;
    size_t out_off, out_ready, out_len, out_cap;
    uint64_t out_base;
    held_response *held; /* FIFO: held[held_head .. held_head + n_held) */
    size_t held_head, n_held, held_cap;
    enum watching watching;
    uint64_t out_since_ms;            /* while W_WRITE: when the client last took some */
    uint64_t frame_since_ms;          /* when the frame at the head of buf began to arrive */
    uint64_t input_since_ms;          /* with idle_timeout_ms: when it last sent something */
    bool partial;                     /* counted in n_partial: may hold an incomplete frame */
    struct conn *prev, *next;         /* the worker's list */
    struct conn *hprev, *hnext;       /* the worker's list of conns with held responses */
    bool in_held_list;
    bool eof; /* the client shut its side: answer what ran, then close */
} conn;

typedef struct worker {
    pthread_t thread;
    int epfd;
    int wake_fd;              /* eventfd: new connections or stop */
    int durable_fd;           /* eventfd: the durable ticket reached want (durable_advanced) */
    _Atomic uint64_t want;    /* 0, or the ticket whose durability wakes this worker */
    pthread_mutex_t mu;       /* guards incoming */
    int *incoming;            /* accepted fds, not yet taken by the worker */
    size_t n_incoming, cap_incoming;
    conn *conns;              /* owned by the worker thread only */
    unsigned n_conns;
    conn *held_conns;         /* conns with held responses */
    bool held_new;            /* responses were held since the last release pass */
    int events_left;          /* epoll events of this pass not yet handled */
    uint64_t seen_durable;    /* the durable ticket at the last release pass */
    unsigned n_blocked;       /* conns with unsent responses (waiting for EPOLLOUT) */
    unsigned n_partial;       /* conns marked partial (some may have completed since) */
    uint64_t last_scan_ms;    /* close_stalled's last pass */
    struct rpc_server *srv;
} worker;

struct rpc_server {
    mango_rpc_config cfg;
    const mango_callbacks *cb;
    int listen_fd;
    int port;
    bool unix_bound;        /* listening on unix_path: removed when the server stops */
    char unix_path[108];    /* (sizeof sockaddr_un.sun_path) */
    dev_t unix_dev;         /* the socket file bound there: removed only if the path */
    ino_t unix_ino;         /* still names it */
    pthread_t acceptor;
    _Atomic bool stop;
    uint64_t send_timeout_ms, frame_timeout_ms;
    _Atomic uint64_t next_client_id;
    worker *workers;
    unsigned n_workers;
    bool pipelined; /* commits are pipelined: responses are held, not waited for */
    int spare_fd;   /* /dev/null, given up to accept and close a client when out of descriptors */
    /* mango_rpc_stats (accepted - closed: the connections open) */
    _Atomic uint64_t accepted, closed, requests, bad_frames, send_timeouts, refused, held, frame_timeouts;
    _Atomic uint64_t rejected, idle_timeouts;
};

/* ---- connections (worker thread only) --------------------------------- */

/* Takes c off the worker's list of connections with held responses. */
static void held_list_remove(worker *w, conn *c)
{
    if (c->hprev)
        c->hprev->hnext = c->hnext;
    else
        w->held_conns = c->hnext;
    if (c->hnext)
        c->hnext->hprev = c->hprev;
    c->in_held_list = false;
}

static void conn_close(worker *w, conn *c)
{
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->ctx && w->srv->cb->destroy_client)
        w->srv->cb->destroy_client(c->ctx);
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    w->n_conns--;
    if (c->watching == W_WRITE)
        w->n_blocked--;
    if (c->partial)
        w->n_partial--;
    if (c->in_held_list)
        held_list_remove(w, c);
    free(c->buf);
    free(c->out);
    free(c->held);
    free(c);
    atomic_fetch_add(&w->srv->closed, 1);
}

static uint64_t now_ms(void);

static void conn_open(worker *w, int fd)
{
    rpc_server *s = w->srv;
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        atomic_fetch_add(&s->closed, 1); /* (accepted counted it: max_connections) */
        return;
    }
    c->fd = fd;
    if (s->cfg.idle_timeout_ms)
        c->input_since_ms = now_ms();
    mango_client_params params = {.client_id = atomic_fetch_add(&s->next_client_id, 1) + 1};
    c->ctx = s->cb->init_client(&params);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (!c->ctx || epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        if (c->ctx && s->cb->destroy_client)
            s->cb->destroy_client(c->ctx);
        close(fd);
        free(c);
        atomic_fetch_add(&s->closed, 1);
        return;
    }
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    w->n_conns++;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* What the socket is watched for: input (W_READ: the client takes its
 * responses, and its requests are read and run), output only (W_WRITE:
 * responses wait for the client; no more requests are read or run until they
 * left, so a client that does not read cannot make the server buffer without
 * bound, and the worker's other connections go on meanwhile), or nothing
 * (W_NONE: too many responses are held; hang-ups are still reported). */
static bool watch(worker *w, conn *c, enum watching want)
{
    if (want == c->watching)
        return true;
    /* W_WRITE: EPOLLOUT only. EPOLLRDHUP is level-triggered, and a client that
     * half-closed while not reading would make every epoll_wait return at
     * once (EPOLLHUP and EPOLLERR are reported anyway). */
    struct epoll_event ev = {.events = want == W_READ ? EPOLLIN | EPOLLRDHUP : want == W_WRITE ? EPOLLOUT : 0,
                             .data.ptr = c};
    if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev) != 0)
        return false;
    if (want == W_WRITE) {
        c->out_since_ms = now_ms();
        w->n_blocked++;
    } else if (c->watching == W_WRITE) {
        w->n_blocked--;
    }
    /* The frame timeout counts only time spent reading: a connection that
     * waited for its client to take responses (W_WRITE) or for held ones
     * (W_NONE) starts its frame's clock again (found by a final read,
     * session 37: it could be closed as stalled at once). */
    if (want == W_READ && c->len > 0)
        c->frame_since_ms = now_ms();
    c->watching = want;
    return true;
}

/* A buffer holding more than `above` bytes of room goes back to `to` bytes
 * (left as it is if realloc fails): connections that once took a large
 * request or many responses do not keep that memory while idle. */
static void shrink_buffer(uint8_t **buf, size_t *cap, size_t above, size_t to)
{
    if (*cap <= above)
        return;
    uint8_t *b = realloc(*buf, to);
    if (b) {
        *buf = b;
        *cap = to;
    }
}

/* Sends what may go now (out[out_off..out_ready)). Returns false if the
 * connection must be closed; *done says whether all of it left. */
static bool flush_out(conn *c, bool *done)
{
    while (c->out_off < c->out_ready) {
        ssize_t k = send(c->fd, c->out + c->out_off, c->out_ready - c->out_off, MSG_NOSIGNAL);
        if (k > 0) {
            c->out_off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *done = false;
            return true;
        }
        return false; /* peer gone */
    }
    if (c->out_off == c->out_len) { /* nothing held either: start over */
        c->out_base += c->out_len;
        c->out_off = c->out_ready = c->out_len = 0;
        shrink_buffer(&c->out, &c->out_cap, RPC_READ_CHUNK, RPC_OUT_CHUNK); /* (it held them: out_cap > 0) */
    }
    *done = true;
    return true;
}

static bool too_many_held(const conn *c)
{
    return c->n_held >= RPC_MAX_HELD || c->out_len - c->out_ready >= RPC_MAX_HELD_BYTES;
}

/* Appends a response frame to the output: ready to send if its ticket is 0
 * and nothing is held before it, else held behind the ticket. */
static bool queue_response(worker *w, conn *c, mango_response r, uint64_t ticket)
{
    if (r.size > UINT32_MAX)
        return false;
    size_t need = c->out_len + 4 + r.size;
    if (need > c->out_cap) {
        if (c->out_off > 0) { /* reuse the space already sent */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_base += c->out_off;
            c->out_ready -= c->out_off;
            c->out_len -= c->out_off;
            c->out_off = 0;
            need = c->out_len + 4 + r.size;
        }
        if (need > c->out_cap) {
            size_t cap = c->out_cap ? c->out_cap * 2 : RPC_OUT_CHUNK;
            while (cap < need)
                cap *= 2;
            uint8_t *b = realloc(c->out, cap);
            if (!b)
                return false;
            c->out = b;
            c->out_cap = cap;
        }
    }
    if ((ticket || c->n_held) && c->held_head + c->n_held == c->held_cap) {
        if (c->held_head > 0) {
            memmove(c->held, c->held + c->held_head, c->n_held * sizeof *c->held);
            c->held_head = 0;
        } else {
            size_t cap = c->held_cap ? c->held_cap * 2 : 16;
            held_response *h = realloc(c->held, cap * sizeof *h);
            if (!h)
                return false;
            c->held = h;
            c->held_cap = cap;
        }
    }
    uint8_t *p = c->out + c->out_len;
    p[0] = (uint8_t)r.size;
    p[1] = (uint8_t)(r.size >> 8);
    p[2] = (uint8_t)(r.size >> 16);
    p[3] = (uint8_t)(r.size >> 24);
    if (r.size)
        memcpy(p + 4, r.data, r.size);
    c->out_len += 4 + r.size;
    if (!ticket && !c->n_held) {
        c->out_ready = c->out_len;
        return true;
    }
    c->held[c->held_head + c->n_held++] = (held_response){.ticket = ticket, .end = c->out_base + c->out_len};
    atomic_fetch_add_explicit(&w->srv->held, 1, memory_order_relaxed);
    w->held_new = true;
    if (!c->in_held_list) {
        c->hprev = NULL;
        c->hnext = w->held_conns;
        if (w->held_conns)
            w->held_conns->hprev = c;
        w->held_conns = c;
        c->in_held_list = true;
    }
    return true;
}

static uint32_t frame_len(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bool run_requests(worker *w, conn *c);

/* A whole request frame waits in c->buf (or one too long: run_requests
 * refuses it). */
static bool frame_waits(const conn *c, uint32_t max_request)
{
    return c->len >= 4 && (c->len - 4 >= frame_len(c->buf) || frame_len(c->buf) > max_request);
}

/* The bytes the frame at the head of c->buf still needs: 0 if it is whole
 * (or too long), its length's missing bytes if even those are not in. */
static size_t frame_rest(const conn *c, uint32_t max_request)
{
    if (c->len < 4)
        return 4 - c->len;
    return frame_waits(c, max_request) ? 0 : 4 + (size_t)frame_len(c->buf) - c->len;
}

/* The input buffer's usual size: RPC_READ_CHUNK, or less if no frame can be
 * that long. */
static size_t input_base(const rpc_server *s)
{
    size_t limit = (size_t)s->cfg.max_request + 4;
    return limit < RPC_READ_CHUNK ? limit : RPC_READ_CHUNK;
}

/* After c's output or held responses changed: send what may go, and choose
 * what to watch. A connection that goes back to (or stays) reading runs the
 * complete requests that wait in its buffer. A client that shut its side
 * gets the answers to every request it sent (as before responses were
 * held), then the connection is closed. Returns false to close.
 *
 * A loop: run_requests stops when a send would block, with complete
 * requests left in c->buf. If the client drains its socket before the flush
 * here, everything is sent while the connection is still watched for input;
 * those requests must run now, since nothing more may arrive to make the
 * socket readable (a pipelining client used to wait forever). */
static bool settle(worker *w, conn *c)
{
    for (;;) {
        bool sent;
        if (!flush_out(c, &sent))
            return false;
        if (!sent)
            return watch(w, c, W_WRITE);
        if (too_many_held(c))
            return watch(w, c, W_NONE);
        bool more = frame_waits(c, w->srv->cfg.max_request) && !atomic_load(&w->srv->stop);
        if (c->eof) {
            if (!more)
                return c->n_held ? watch(w, c, W_NONE) : false;
        } else {
            if (!watch(w, c, W_READ))
                return false;
            if (!more) {
                if (c->len > 0 && !c->partial) { /* timed by close_stalled */
                    c->partial = true;
                    w->n_partial++;
                }
                /* Idle from now on: the idle timeout counts from the end of
                 * the last activity, a response sent or released included,
                 * not from the request (a response held through a slow sync
                 * closed its connection right after it left: found by a
                 * review). */
                if (w->srv->cfg.idle_timeout_ms && c->len == 0 && c->n_held == 0 && c->out_off == c->out_len)
                    c->input_since_ms = now_ms();
                return true;
            }
        }
        if (!run_requests(w, c))
            return false;
    }
}

/* Runs every complete request in c->buf, until the client stops taking its
 * responses or too many are held; settle() then chooses what to watch.
 * Returns false to close. */
static bool run_requests(worker *w, conn *c)
{
    rpc_server *s = w->srv;
    size_t off = 0;
    while (c->len - off >= 4 && !atomic_load(&s->stop)) {
        uint32_t n = frame_len(c->buf + off);
        if (n > s->cfg.max_request) {
            atomic_fetch_add(&s->bad_frames, 1);
            return false;
        }
        if (c->len - off - 4 < n)
            break;
        if (s->cb->deserialize_request)
            s->cb->deserialize_request(c->ctx, c->buf + off + 4, n);
        off += 4 + (size_t)n;
        atomic_fetch_add(&s->requests, 1);
        /* A worker with one connection and nothing else at hand (no response
         * held, no other request or event waiting) may as well wait for
         * this command: the combiner then syncs under the lock when nothing
         * is in flight, which saves two thread wake-ups (one client doing
         * ADDs: 9.1 k ops/s against 6.1 k when always handed over). With
         * other connections, a request of theirs could arrive during the
         * sync and wait for it. */
        bool may_wait = w->n_conns == 1 && !w->held_conns && w->events_left == 0 && c->len - off < 4;
        uint64_t ticket = 0;
        int rc = s->pipelined ? runtime_submit(c->ctx, &ticket, may_wait) : mango_client_cmd(c->ctx);
        if (rc != MANGO_OK) {
            atomic_fetch_add(&s->refused, 1); /* nothing of it may be acknowledged */
            return false;
        }
        bool sent;
        if (!queue_response(w, c, s->cb->get_response(c->ctx), ticket) || !flush_out(c, &sent))
            return false;
        if (!sent || too_many_held(c))
            break; /* settle() watches for the client, or for releases */
    }
    if (off > 0) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
        if (c->len > 0) /* the next frame's first bytes: its time starts now */
            c->frame_since_ms = now_ms();
    }
    /* A buffer grown for a large request goes back to its usual size once
     * that request ran (200 idle connections that had sent a 1 MiB request
     * each used to keep 204 MiB). */
    size_t keep = c->len + frame_rest(c, s->cfg.max_request);
    if (keep < input_base(s))
        keep = input_base(s);
    shrink_buffer(&c->buf, &c->cap, keep, keep);
    return true;
}

/* Releases, in order, the held responses whose tickets are durable, and
 * sends them. After a failed sync, the connections that still hold
 * responses are closed: those responses are never sent. */
static void release_held(worker *w)
{
    uint64_t durable = 0;
    bool failed = mango_durable_ticket(&durable) != MANGO_OK;
    if (durable == w->seen_durable && !w->held_new && !failed)
        return;
    w->seen_durable = durable;
    w->held_new = false;
    for (conn *c = w->held_conns, *next; c; c = next) {
        next = c->hnext;
        size_t before = c->out_ready;
        while (c->n_held && c->held[c->held_head].ticket <= durable) {
            c->out_ready = (size_t)(c->held[c->held_head].end - c->out_base);
            c->held_head++;
            c->n_held--;
        }
        if (!c->n_held) {
            c->held_head = 0;
            held_list_remove(w, c);
        }
        if (c->out_ready != before && !settle(w, c))
            conn_close(w, c);
    }
    if (failed)
        while (w->held_conns) {
            atomic_fetch_add(&w->srv->refused, 1);
            conn_close(w, w->held_conns);
        }
}

/* The pipeline's listener (sync thread, or a frontend committing inline):
 * wakes each worker whose awaited ticket became durable, or every waiting
 * worker after a failed sync. A worker stores want before it looks at the
 * durable ticket a last time and sleeps; here the durable ticket (or the
 * failure) was stored before want is read, with seq_cst fences on both
 * sides, so one of the two sees the other. */
void rpc_server_durable_advanced(void *arg, uint64_t durable, bool failed)
{
    rpc_server *s = arg;
    /* The pipeline publishes a failure with a release store only. */
    atomic_thread_fence(memory_order_seq_cst);
    for (unsigned i = 0; i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        uint64_t t = atomic_load(&w->want);
        if (t == 0 || (!failed && durable < t) || !atomic_compare_exchange_strong(&w->want, &t, 0))
            continue;
        uint64_t one = 1;
        ssize_t r = write(w->durable_fd, &one, sizeof one);
        (void)r;
    }
}

/* Reads once from the socket and runs the complete requests. One read per
 * readable event, of up to RPC_READ_CHUNK bytes, or of what the partial
 * frame at the head of the buffer still needs if that is more: a client
 * that keeps its socket full must not hold the worker (epoll is
 * level-triggered, so what is left comes back at once, after the worker's
 * other connections and a look at the stop flag). The buffer grows only for
 * a frame that does not fit; run_requests shrinks it back. Returns false
 * to close. */
static bool conn_readable(worker *w, conn *c)
{
    size_t rest = frame_rest(c, w->srv->cfg.max_request);
    size_t want = rest > RPC_READ_CHUNK ? rest : RPC_READ_CHUNK;
    if (c->cap == 0 || c->cap - c->len < rest) {
        /* (len + rest <= max_request + 4: a longer frame was refused) */
        size_t cap = c->len + rest > input_base(w->srv) ? c->len + rest : input_base(w->srv);
        uint8_t *b = realloc(c->buf, cap);
        if (!b)
            return false;
        c->buf = b;
        c->cap = cap;
    }
    if (c->len == c->cap) {
        /* A full buffer holds no complete frame: it cannot be valid. */
        atomic_fetch_add(&w->srv->bad_frames, 1);
        return false;
    }
    size_t room = c->cap - c->len < want ? c->cap - c->len : want;
    for (;;) {
        ssize_t k = recv(c->fd, c->buf + c->len, room, 0);
        if (k > 0) {
            if (c->len == 0 || w->srv->cfg.idle_timeout_ms) {
                uint64_t now = now_ms();
                if (c->len == 0) /* a new frame begins */
                    c->frame_since_ms = now;
                c->input_since_ms = now;
            }
            c->len += (size_t)k;
            return run_requests(w, c) && settle(w, c);
        }
        if (k == 0) { /* the client shut its side: answer what it sent first */
            c->eof = true;
            return settle(w, c);
        }
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
}

/* ---- threads ------------------------------------------------------------ */

static void take_incoming(worker *w)
{
    uint64_t v;
    while (read(w->wake_fd, &v, sizeof v) == sizeof v) {
    }
    pthread_mutex_lock(&w->mu);
    size_t n = w->n_incoming;
    int fds[64];
    size_t k = n < 64 ? n : 64;
    memcpy(fds, w->incoming, k * sizeof(int));
    memmove(w->incoming, w->incoming + k, (n - k) * sizeof(int));
    w->n_incoming -= k;
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < k; i++)
        conn_open(w, fds[i]);
    if (n > k) { /* more: come back at once */
        uint64_t one = 1;
        ssize_t r = write(w->wake_fd, &one, sizeof one);
        (void)r;
    }
}

/* The client took some output: send the rest; once all left, read again and
 * run the requests that waited in the buffer. Returns false to close. */
static bool conn_writable(worker *w, conn *c)
{
    size_t before = c->out_off;
    if (!settle(w, c))
        return false;
    if (c->watching == W_WRITE && c->out_off != before) /* it reads, slowly: the timeout counts from here */
        c->out_since_ms = now_ms();
    return true;
}

/* Closes the connections whose client left responses unread for the send
 * timeout, or left a request frame incomplete for the frame timeout (it
 * would keep up to max_request bytes of buffer), or, with idle_timeout_ms,
 * sent nothing for that long with nothing in progress. Looks every 100 ms
 * (the worker wakes at least once a second while an idle timeout is set). */
static void close_stalled(worker *w)
{
    uint64_t now = now_ms();
    if (now - w->last_scan_ms < 100)
        return;
    w->last_scan_ms = now;
    uint64_t idle_ms = w->srv->cfg.idle_timeout_ms;
    for (conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (idle_ms && c->watching == W_READ && c->len == 0 && c->n_held == 0 && c->out_off == c->out_len &&
            !c->eof && now - c->input_since_ms >= idle_ms) {
            atomic_fetch_add(&w->srv->idle_timeouts, 1);
            conn_close(w, c);
        } else if (c->watching == W_WRITE && now - c->out_since_ms >= w->srv->send_timeout_ms) {
            atomic_fetch_add(&w->srv->send_timeouts, 1);
            conn_close(w, c);
        } else if (c->partial) {
            /* Only while read: waiting for the client to take responses, or
             * for held ones, is timed (or not) elsewhere. */
            if (c->watching != W_READ || c->len == 0 || frame_waits(c, w->srv->cfg.max_request)) {
                c->partial = false;
                w->n_partial--;
            } else if (now - c->frame_since_ms >= w->srv->frame_timeout_ms) {
                atomic_fetch_add(&w->srv->frame_timeouts, 1);
                conn_close(w, c);
            }
        }
    }
}

/* Held responses: release what is durable, and ask the listener for a
 * wake-up at the next advance. Returns the epoll timeout to use: 0 if the
 * durable ticket moved meanwhile. */
static int await_durable(worker *w, int timeout)
{
    if (!w->held_conns)
        return timeout;
    release_held(w);
    if (!w->held_conns)
        return timeout;
    atomic_store(&w->want, w->seen_durable + 1);
    /* mango_durable_ticket loads with acquire only: keep it after the store
     * (rpc_server_durable_advanced). */
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t d = 0;
    if (mango_durable_ticket(&d) != MANGO_OK || d != w->seen_durable)
        return 0;
    return timeout;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&w->srv->stop)) {
        bool idle_timed = w->srv->cfg.idle_timeout_ms && w->n_conns;
        int timeout = await_durable(w, w->n_blocked || w->n_partial ? 100 : idle_timed ? 1000 : -1);
        int n = epoll_wait(w->epfd, evs, 64, timeout);
        if (n < 0)
            continue; /* EINTR (nothing else can fail on a valid epoll fd) */
        for (int i = 0; i < n; i++) {
            w->events_left = n - 1 - i;
            if (evs[i].data.ptr == NULL) {
                take_incoming(w);
                continue;
            }
            if (evs[i].data.ptr == &w->durable_fd) {
                uint64_t v;
                while (read(w->durable_fd, &v, sizeof v) == sizeof v) {
                }
                continue; /* released at the top of the loop */
            }
            conn *c = evs[i].data.ptr;
            /* (W_NONE: only a hang-up or an error is reported) */
            bool ok = c->watching == W_WRITE ? conn_writable(w, c) : c->watching == W_READ && conn_readable(w, c);
            if (!ok || (evs[i].events & (EPOLLHUP | EPOLLERR)))
                conn_close(w, c);
        }
        w->events_left = 0;
        if (w->n_blocked || w->n_partial || idle_timed)
            close_stalled(w);
    }
    /* Stopping: the commands that ran are answered once durable (one try to
     * send, without blocking), then every connection is closed. */
    uint64_t last = 0; /* (tickets in a connection's FIFO need not grow: a read's may be older) */
    for (conn *c = w->held_conns; c; c = c->hnext)
        for (size_t i = 0; i < c->n_held; i++)
            if (c->held[c->held_head + i].ticket > last)
                last = c->held[c->held_head + i].ticket;
    if (last)
        (void)mango_wait_durable(last);
    release_held(w);
    while (w->conns)
        conn_close(w, w->conns);
    return NULL;
}

/* Out of descriptors: gives up the spare one to take the waiting client and
 * close it at once (it would wait unanswered in the backlog), then takes the
 * spare back. Returns false if there was none to give (another thread took
 * the slot last time), or no client is waiting: then the caller waits and
 * retries. (Linux's accept reports EMFILE before it waits for a client, and
 * the listener blocks: taking the spare's slot with no client waiting
 * parked the acceptor in accept, so the first client after descriptors
 * were freed again was rejected too: found by a review.) */
static bool reject_with_spare(rpc_server *s)
{
    if (s->spare_fd < 0) {
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        return false;
    }
    struct pollfd pf = {.fd = s->listen_fd, .events = POLLIN};
    if (poll(&pf, 1, 10) <= 0 || !(pf.revents & POLLIN) || atomic_load(&s->stop))
        return false;
    close(s->spare_fd);
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        atomic_fetch_add(&s->rejected, 1);
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0;
}

static void *acceptor_main(void *arg)
{
    rpc_server *s = arg;
    unsigned next = 0;
    while (!atomic_load(&s->stop)) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (atomic_load(&s->stop))
                break; /* the listener was shut down */
            if ((errno == EMFILE || errno == ENFILE) && reject_with_spare(s))
                continue;
            /* Anything else is retried: accept() also reports a pending
             * network error of the connection it dropped (EPROTO, ENETDOWN,
             * ...); out of descriptors or memory, some may be freed soon. */
            if (errno != EINTR && errno != ECONNABORTED)
                usleep(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM ? 10000 : 1000);
            continue;
        }
        if (atomic_load(&s->stop)) {
            close(fd);
            break;
        }
        if (atomic_load(&s->accepted) - atomic_load(&s->closed) >= s->cfg.max_connections) {
            close(fd); /* (closed is counted once a worker has closed one) */
            atomic_fetch_add(&s->rejected, 1);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        worker *w = &s->workers[next++ % s->n_workers];
        pthread_mutex_lock(&w->mu);
        bool ok = true;
        if (w->n_incoming == w->cap_incoming) {
            size_t cap = w->cap_incoming ? w->cap_incoming * 2 : 16;
            int *b = realloc(w->incoming, cap * sizeof(int));
            if (b) {
                w->incoming = b;
                w->cap_incoming = cap;
            } else {
                ok = false;
            }
        }
        if (ok)
            w->incoming[w->n_incoming++] = fd;
        pthread_mutex_unlock(&w->mu);
        if (!ok) {
            close(fd);
            continue;
        }
        atomic_fetch_add(&s->accepted, 1);
        uint64_t v = 1;
        ssize_t r = write(w->wake_fd, &v, sizeof v);
        (void)r;
    }
    return NULL;
}

/* ---- start / stop ------------------------------------------------------- */

/* Closes the listener, and removes the Unix-domain socket if the path still
 * names the one this server bound: another server may have replaced it (by
 * hand, or once this one stopped listening at the shutdown in
 * rpc_server_stop). The check and the unlink are two steps; a replacement
 * made between them is not guarded against. */
static void close_listener(rpc_server *s)
{
    struct stat st;
    if (s->unix_bound && lstat(s->unix_path, &st) == 0 && st.st_dev == s->unix_dev && st.st_ino == s->unix_ino)
        unlink(s->unix_path);
    close(s->listen_fd);
}

/* A socket found at path may be replaced only if no server listens on it:
 * a connect() refused (ECONNREFUSED) means the server that bound it is gone.
 * One that answers, or whose backlog is full (EAGAIN), keeps it. */
static int unix_socket_is_stale(const struct sockaddr_un *a, const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mango_error(MANGO_EIO, "mango_rpc_start: socket: %s", strerror(errno));
    int r = connect(fd, (const struct sockaddr *)a, sizeof *a);
    int e = errno;
    close(fd);
    if (r != 0 && (e == ECONNREFUSED || e == ENOENT)) /* (ENOENT: removed meanwhile) */
        return MANGO_OK;
    if (r == 0 || e == EAGAIN || e == EINPROGRESS)
        return mango_error(MANGO_EEXIST, "mango_rpc_start: a server is listening on %s; not replaced", path);
    return mango_error(MANGO_EEXIST, "mango_rpc_start: %s: cannot tell whether a server listens there (%s); "
                       "not replaced", path, strerror(e));
}

/* Listens on a Unix-domain socket at cfg.unix_path. A socket left there by
 * a server that is gone is replaced; a live server's socket, or anything
 * else at the path, is refused and left alone. */
static int open_unix_listener(rpc_server *s)
{
    const char *path = s->cfg.unix_path;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (!*path || strlen(path) >= sizeof a.sun_path)
        return mango_error(MANGO_EINVAL, "mango_rpc_start: unix_path \"%s\": empty or longer than %zu bytes",
                           path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path) + 1);
    memcpy(s->unix_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return mango_error(MANGO_EEXIST, "mango_rpc_start: %s exists and is not a socket; not replaced", path);
        int rc = unix_socket_is_stale(&a, path);
        if (rc != MANGO_OK)
            return rc;
        if (unlink(path) != 0 && errno != ENOENT)
            return mango_error(MANGO_EIO, "mango_rpc_start: cannot replace the old socket %s: %s", path,
                               strerror(errno));
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mango_error(MANGO_EIO, "mango_rpc_start: socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 512) != 0 || lstat(path, &st) != 0) {
        int e = errno;
        close(fd);
        return mango_error(e == EADDRINUSE ? MANGO_EEXIST : MANGO_EIO, "mango_rpc_start: %s: %s", path,
                           strerror(e));
    }
    s->listen_fd = fd;
    s->unix_bound = true;
    s->unix_dev = st.st_dev;
    s->unix_ino = st.st_ino;
    s->port = 0;
    return MANGO_OK;
}

/* Listens on host (an IPv4 or IPv6 address, or a name: its first address
 * that binds) and port. */
static int open_listener(rpc_server *s)
{
    if (s->cfg.unix_path)
        return open_unix_listener(s);
    const char *host = s->cfg.host ? s->cfg.host : "127.0.0.1";
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)s->cfg.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0)
        return mango_error(MANGO_EINVAL, "mango_rpc_start: host \"%s\": %s", host,
                           g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    int e = 0, fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 512) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return mango_error(e == EADDRINUSE ? MANGO_EEXIST : MANGO_EIO, "mango_rpc_start: %s port %u: %s",
                           host, (unsigned)s->cfg.port, strerror(e));
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                            : ((struct sockaddr_in *)&a)->sin_port);
    s->listen_fd = fd;
    return MANGO_OK;
}

static void stop_workers(rpc_server *s, unsigned started)
{
    atomic_store(&s->stop, true);
    for (unsigned i = 0; i < started; i++) {
        uint64_t v = 1;
        ssize_t r = write(s->workers[i].wake_fd, &v, sizeof v);
        (void)r;
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(s->workers[i].thread, NULL);
}

static void free_workers(rpc_server *s)
{
    for (unsigned i = 0; i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        for (size_t k = 0; k < w->n_incoming; k++) {
            close(w->incoming[k]);
            atomic_fetch_add(&s->closed, 1);
        }
        free(w->incoming);
        if (w->epfd >= 0)
            close(w->epfd);
        if (w->wake_fd >= 0)
            close(w->wake_fd);
        if (w->durable_fd >= 0)
            close(w->durable_fd);
        pthread_mutex_destroy(&w->mu);
    }
    free(s->workers);
}

/* A timeout from the environment: name's value in milliseconds, 100 to
 * 3600000 (env_number.h: digits only), or def if unset or empty. */
static int env_ms(const char *name, uint64_t def, uint64_t *out)
{
    *out = def;
    const char *v = getenv(name);
    if (!v || !*v)
        return MANGO_OK;
    unsigned long long ms = 0;
    if (!env_decimal(v, &ms) || ms < 100 || ms > 3600000)
        return mango_error(MANGO_EINVAL, "%s=\"%s\": expected milliseconds, digits only, 100 to 3600000",
                           name, v);
    *out = ms;
    return MANGO_OK;
}

int rpc_server_start(rpc_server **out, const mango_rpc_config *cfg, const mango_callbacks *cb,
                     unsigned max_threads)
{
    *out = NULL;
    if (!cb->init_client || !cb->get_response)
        return mango_error(MANGO_EINVAL, "mango_rpc_start: RPC mode needs the init_client and "
                                         "get_response callbacks (deserialize_request and "
                                         "destroy_client are optional)");
    rpc_server *s = calloc(1, sizeof *s);
    if (!s)
        return mango_error(MANGO_ENOMEM, "mango_rpc_start: out of memory");
    s->cfg = *cfg;
    s->cb = cb;
    s->pipelined = mango_commit_is_pipelined();
    s->listen_fd = -1;
    if (s->cfg.threads == 0)
        s->cfg.threads = RPC_DEFAULT_THREADS;
    if (s->cfg.max_request == 0)
        s->cfg.max_request = RPC_DEFAULT_MAX_REQUEST;
    if (s->cfg.threads > RPC_MAX_THREADS || s->cfg.threads >= max_threads) {
        unsigned limit = max_threads - 1 < RPC_MAX_THREADS ? max_threads - 1 : RPC_MAX_THREADS;
        unsigned n = s->cfg.threads; /* the effective count: cfg->threads may be 0 */
        free(s);
        return mango_error(MANGO_EINVAL, "mango_rpc_start: %u worker threads%s; at most %u "
                           "(mango_config.max_threads - 1, and %u)", n,
                           cfg->threads ? "" : " (the default, for threads = 0)", limit,
                           RPC_MAX_THREADS);
    }
    if (env_ms("MANGO_RPC_SEND_TIMEOUT_MS", RPC_SEND_TIMEOUT_MS, &s->send_timeout_ms) != MANGO_OK ||
        env_ms("MANGO_RPC_FRAME_TIMEOUT_MS", RPC_FRAME_TIMEOUT_MS, &s->frame_timeout_ms) != MANGO_OK) {
        free(s);
        return MANGO_EINVAL;
    }
    if (s->cfg.max_request > (1u << 30)) {
        free(s);
        return mango_error(MANGO_EINVAL, "mango_rpc_start: max_request %u is over 1 GiB", cfg->max_request);
    }
    if (s->cfg.max_connections == 0)
        s->cfg.max_connections = RPC_DEFAULT_MAX_CONNECTIONS;
    if (s->cfg.max_connections > RPC_MAX_CONNECTIONS) {
        free(s);
        return mango_error(MANGO_EINVAL, "mango_rpc_start: max_connections %u is over %u", cfg->max_connections,
                           RPC_MAX_CONNECTIONS);
    }
    if (s->cfg.idle_timeout_ms && (s->cfg.idle_timeout_ms < 100 || s->cfg.idle_timeout_ms > RPC_MAX_IDLE_TIMEOUT_MS)) {
        free(s);
        return mango_error(MANGO_EINVAL, "mango_rpc_start: idle_timeout_ms %u: expected 0 (never) or 100 to %u",
                           cfg->idle_timeout_ms, RPC_MAX_IDLE_TIMEOUT_MS);
    }
    int rc = open_listener(s);
    if (rc != MANGO_OK) {
        free(s);
        return rc;
    }
    s->n_workers = s->cfg.threads;
    s->workers = calloc(s->n_workers, sizeof *s->workers);
    if (!s->workers) {
        close_listener(s);
        free(s);
        return mango_error(MANGO_ENOMEM, "mango_rpc_start: out of memory");
    }
    for (unsigned i = 0; i < s->n_workers; i++) { /* first, so free_workers may run */
        s->workers[i].srv = s;
        s->workers[i].epfd = s->workers[i].wake_fd = s->workers[i].durable_fd = -1;
        pthread_mutex_init(&s->workers[i].mu, NULL);
    }
    for (unsigned i = 0; i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        w->durable_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        struct epoll_event dev = {.events = EPOLLIN, .data.ptr = &w->durable_fd};
        if (w->epfd < 0 || w->wake_fd < 0 || w->durable_fd < 0 ||
            epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wake_fd, &ev) != 0 ||
            epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->durable_fd, &dev) != 0) {
            rc = mango_error(MANGO_EIO, "mango_rpc_start: epoll/eventfd: %s", strerror(errno));
            break;
        }
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* (-1: taken later, when it can be) */
    unsigned started = 0;
    for (; rc == MANGO_OK && started < s->n_workers; started++)
        if (pthread_create(&s->workers[started].thread, NULL, worker_main, &s->workers[started]) != 0)
            rc = mango_error(MANGO_ENOMEM, "mango_rpc_start: cannot start worker thread %u", started);
    if (rc == MANGO_OK && pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0)
        rc = mango_error(MANGO_ENOMEM, "mango_rpc_start: cannot start the acceptor thread");
    if (rc != MANGO_OK) {
        stop_workers(s, started);
        close_listener(s);
        free_workers(s);
        if (s->spare_fd >= 0)
            close(s->spare_fd);
        free(s);
        return rc;
    }
    *out = s;
    return MANGO_OK;
}

int rpc_server_port(const rpc_server *s) { return s->port; }

void rpc_server_stats(const rpc_server *s, mango_rpc_stats *out)
{
    out->accepted = atomic_load(&s->accepted);
    out->closed = atomic_load(&s->closed);
    out->requests = atomic_load(&s->requests);
    out->bad_frames = atomic_load(&s->bad_frames);
    out->send_timeouts = atomic_load(&s->send_timeouts);
    out->refused = atomic_load(&s->refused);
    out->held = atomic_load(&s->held);
    out->frame_timeouts = atomic_load(&s->frame_timeouts);
    out->rejected = atomic_load(&s->rejected);
    out->idle_timeouts = atomic_load(&s->idle_timeouts);
}

void rpc_server_stop(rpc_server *s)
{
    atomic_store(&s->stop, true);
    shutdown(s->listen_fd, SHUT_RDWR); /* wakes accept() */
    pthread_join(s->acceptor, NULL);
    close_listener(s);
    stop_workers(s, s->n_workers);
    free_workers(s);
    if (s->spare_fd >= 0)
        close(s->spare_fd);
    free(s);
}
