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
 * payload, len), mango_client_cmd(ctx) (returns once the command is durable,
 * or, for a read, once what it read is), get_response(ctx), then sends the
 * response frame. A client may send several requests without waiting
 * (pipelining); responses come back in request order.
 *
 * Responses go to a per-connection output buffer and are sent without
 * blocking. A client that stops reading them has its connection watched for
 * output only: its further requests wait in the socket, unread and not run,
 * while the worker serves its other connections.
 *
 * Bad input closes only its own connection: a frame longer than
 * max_request, a client that leaves responses unread for 10 s
 * (MANGO_RPC_SEND_TIMEOUT_MS in the environment), or a command the runtime refused (then nothing
 * of it may be acknowledged). The counters in mango_rpc_stats say why.
 */
#define _GNU_SOURCE
#include "rpc/rpc_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/error.h"

#define RPC_SEND_TIMEOUT_MS 10000 /* default of MANGO_RPC_SEND_TIMEOUT_MS */
#define RPC_MAX_THREADS 256
#define RPC_DEFAULT_THREADS 8
#define RPC_DEFAULT_MAX_REQUEST (1u << 20)
#define RPC_READ_CHUNK 65536

typedef struct conn {
    int fd;
    void *ctx;
    uint8_t *buf; /* bytes received, not yet processed */
    size_t len, cap;
    uint8_t *out; /* responses not yet sent: out[out_off..out_len) */
    size_t out_off, out_len, out_cap;
    bool blocked;          /* responses wait for the client: watched for output only */
    uint64_t out_since_ms; /* while blocked: when the client last took some */
    struct conn *prev, *next; /* the worker's list */
} conn;

typedef struct worker {
    pthread_t thread;
    int epfd;
    int wake_fd;              /* eventfd: new connections or stop */
    pthread_mutex_t mu;       /* guards incoming */
    int *incoming;            /* accepted fds, not yet taken by the worker */
    size_t n_incoming, cap_incoming;
    conn *conns;              /* owned by the worker thread only */
    unsigned n_blocked;       /* conns with unsent responses (waiting for EPOLLOUT) */
    struct rpc_server *srv;
} worker;

struct rpc_server {
    mango_rpc_config cfg;
    const mango_callbacks *cb;
    int listen_fd;
    int port;
    pthread_t acceptor;
    _Atomic bool stop;
    uint64_t send_timeout_ms;
    _Atomic uint64_t next_client_id;
    worker *workers;
    unsigned n_workers;
    /* mango_rpc_stats */
    _Atomic uint64_t accepted, closed, requests, bad_frames, send_timeouts, refused;
};

/* ---- connections (worker thread only) --------------------------------- */

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
    if (c->blocked)
        w->n_blocked--;
    free(c->buf);
    free(c->out);
    free(c);
    atomic_fetch_add(&w->srv->closed, 1);
}

static void conn_open(worker *w, int fd)
{
    rpc_server *s = w->srv;
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->fd = fd;
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
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Watch the socket for input (the client takes its responses) or only for
 * output (responses wait: no more requests are read or run until they left,
 * so a client that does not read cannot make the server buffer without
 * bound, and the worker's other connections go on meanwhile). */
static bool watch(worker *w, conn *c, bool blocked)
{
    if (blocked == c->blocked)
        return true;
    /* Blocked: EPOLLOUT only. EPOLLRDHUP is level-triggered, and a client that
     * half-closed while not reading would make every epoll_wait return at
     * once (EPOLLHUP and EPOLLERR are reported anyway). */
    struct epoll_event ev = {.events = blocked ? EPOLLOUT : EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev) != 0)
        return false;
    c->blocked = blocked;
    if (blocked) {
        c->out_since_ms = now_ms();
        w->n_blocked++;
    } else {
        w->n_blocked--;
    }
    return true;
}

/* Sends what the socket takes now. Returns false if the connection must be
 * closed; *done says whether every response left. */
static bool flush_out(conn *c, bool *done)
{
    while (c->out_off < c->out_len) {
        ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
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
    c->out_off = c->out_len = 0;
    *done = true;
    return true;
}

/* Appends a response frame to the output. */
static bool queue_response(conn *c, mango_response r)
{
    if (r.size > UINT32_MAX)
        return false;
    size_t need = c->out_len + 4 + r.size;
    if (need > c->out_cap) {
        if (c->out_off > 0) { /* reuse the space already sent */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
            need = c->out_len + 4 + r.size;
        }
        if (need > c->out_cap) {
            size_t cap = c->out_cap ? c->out_cap * 2 : 4096;
            while (cap < need)
                cap *= 2;
            uint8_t *b = realloc(c->out, cap);
            if (!b)
                return false;
            c->out = b;
            c->out_cap = cap;
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
    return true;
}

static uint32_t frame_len(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Runs every complete request in c->buf. Returns false to close. */
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
        if (mango_client_cmd(c->ctx) != MANGO_OK) {
            atomic_fetch_add(&s->refused, 1); /* nothing of it may be acknowledged */
            return false;
        }
        bool sent;
        if (!queue_response(c, s->cb->get_response(c->ctx)) || !flush_out(c, &sent))
            return false;
        if (!sent) { /* the client is not reading: wait for it before running more */
            if (!watch(w, c, true))
                return false;
            break;
        }
    }
    if (off > 0) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    return true;
}

/* Reads once from the socket and runs the complete requests. One read per
 * readable event: a client that keeps its socket full must not hold the
 * worker (epoll is level-triggered, so what is left comes back at once, after
 * the worker's other connections and a look at the stop flag). Returns false
 * to close. */
static bool conn_readable(worker *w, conn *c)
{
    size_t limit = (size_t)w->srv->cfg.max_request + 4;
    for (;;) {
        if (c->cap - c->len < RPC_READ_CHUNK && c->cap < limit) {
            size_t want = c->cap ? c->cap * 2 : RPC_READ_CHUNK;
            if (want < c->len + RPC_READ_CHUNK)
                want = c->len + RPC_READ_CHUNK;
            if (want > limit)
                want = limit;
            uint8_t *b = realloc(c->buf, want);
            if (!b)
                return false;
            c->buf = b;
            c->cap = want;
        }
        if (c->len == c->cap) {
            /* A full buffer holds no complete frame: it cannot be valid. */
            atomic_fetch_add(&w->srv->bad_frames, 1);
            return false;
        }
        ssize_t k = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (k > 0) {
            c->len += (size_t)k;
            return run_requests(w, c);
        }
        if (k == 0)
            return false; /* the client closed */
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
    bool sent;
    size_t before = c->out_off;
    if (!flush_out(c, &sent))
        return false;
    if (!sent) {
        if (c->out_off != before) /* it reads, slowly: the timeout counts from here */
            c->out_since_ms = now_ms();
        return true;
    }
    return watch(w, c, false) && run_requests(w, c);
}

/* Closes the connections whose client left responses unread for the send
 * timeout. */
static void close_stalled(worker *w)
{
    uint64_t now = now_ms();
    for (conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (c->blocked && now - c->out_since_ms >= w->srv->send_timeout_ms) {
            atomic_fetch_add(&w->srv->send_timeouts, 1);
            conn_close(w, c);
        }
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&w->srv->stop)) {
        int n = epoll_wait(w->epfd, evs, 64, w->n_blocked ? 100 : -1);
        if (n < 0)
            continue; /* EINTR (nothing else can fail on a valid epoll fd) */
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                take_incoming(w);
                continue;
            }
            conn *c = evs[i].data.ptr;
            bool ok = c->blocked ? conn_writable(w, c) : conn_readable(w, c);
            if (!ok || (evs[i].events & (EPOLLHUP | EPOLLERR)))
                conn_close(w, c);
        }
        if (w->n_blocked)
            close_stalled(w);
    }
    while (w->conns)
        conn_close(w, w->conns);
    return NULL;
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

static int open_listener(rpc_server *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(s->cfg.port)};
    const char *host = s->cfg.host ? s->cfg.host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return mango_error(MANGO_EINVAL, "mango_rpc_start: host \"%s\" is not an IPv4 address", host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mango_error(MANGO_EIO, "mango_rpc_start: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 512) != 0) {
        int e = errno;
        close(fd);
        return mango_error(e == EADDRINUSE ? MANGO_EEXIST : MANGO_EIO, "mango_rpc_start: %s:%u: %s",
                           host, (unsigned)s->cfg.port, strerror(e));
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.sin_port);
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
        pthread_mutex_destroy(&w->mu);
    }
    free(s->workers);
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
    s->listen_fd = -1;
    if (s->cfg.threads == 0) /* a worker waits for each of its commands to be durable */
        s->cfg.threads = RPC_DEFAULT_THREADS;
    if (s->cfg.max_request == 0)
        s->cfg.max_request = RPC_DEFAULT_MAX_REQUEST;
    if (s->cfg.threads > RPC_MAX_THREADS || s->cfg.threads >= max_threads) {
        unsigned limit = max_threads - 1 < RPC_MAX_THREADS ? max_threads - 1 : RPC_MAX_THREADS;
        free(s);
        return mango_error(MANGO_EINVAL, "mango_rpc_start: %u worker threads; at most %u "
                           "(mango_config.max_threads - 1, and %u)", cfg->threads, limit, RPC_MAX_THREADS);
    }
    s->send_timeout_ms = RPC_SEND_TIMEOUT_MS;
    const char *to = getenv("MANGO_RPC_SEND_TIMEOUT_MS");
    if (to && *to) {
        char *end;
        unsigned long long v = strtoull(to, &end, 10);
        if (*end || v < 100 || v > 3600000) {
            free(s);
            return mango_error(MANGO_EINVAL, "MANGO_RPC_SEND_TIMEOUT_MS=%s: expected milliseconds, "
                               "100 to 3600000", to);
        }
        s->send_timeout_ms = v;
    }
    if (s->cfg.max_request > (1u << 30)) {
        free(s);
        return mango_error(MANGO_EINVAL, "mango_rpc_start: max_request %u is over 1 GiB", cfg->max_request);
    }
    int rc = open_listener(s);
    if (rc != MANGO_OK) {
        free(s);
        return rc;
    }
    s->n_workers = s->cfg.threads;
    s->workers = calloc(s->n_workers, sizeof *s->workers);
    if (!s->workers) {
        close(s->listen_fd);
        free(s);
        return mango_error(MANGO_ENOMEM, "mango_rpc_start: out of memory");
    }
    for (unsigned i = 0; i < s->n_workers; i++) { /* first, so free_workers may run */
        s->workers[i].srv = s;
        s->workers[i].epfd = s->workers[i].wake_fd = -1;
        pthread_mutex_init(&s->workers[i].mu, NULL);
    }
    for (unsigned i = 0; i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        if (w->epfd < 0 || w->wake_fd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wake_fd, &ev) != 0) {
            rc = mango_error(MANGO_EIO, "mango_rpc_start: epoll/eventfd: %s", strerror(errno));
            break;
        }
    }
    unsigned started = 0;
    for (; rc == MANGO_OK && started < s->n_workers; started++)
        if (pthread_create(&s->workers[started].thread, NULL, worker_main, &s->workers[started]) != 0)
            rc = mango_error(MANGO_ENOMEM, "mango_rpc_start: cannot start worker thread %u", started);
    if (rc == MANGO_OK && pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0)
        rc = mango_error(MANGO_ENOMEM, "mango_rpc_start: cannot start the acceptor thread");
    if (rc != MANGO_OK) {
        stop_workers(s, started);
        close(s->listen_fd);
        free_workers(s);
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
}

void rpc_server_stop(rpc_server *s)
{
    atomic_store(&s->stop, true);
    shutdown(s->listen_fd, SHUT_RDWR); /* wakes accept() */
    pthread_join(s->acceptor, NULL);
    close(s->listen_fd);
    stop_workers(s, s->n_workers);
    free_workers(s);
    free(s);
}
