/*
 * ycsb_redis: a YCSB-compatible closed-loop load generator for Redis.
 *
 * Plain C11 + POSIX sockets, no external dependencies: a minimal RESP2 client
 * (requests written as RESP arrays, replies parsed incrementally), T threads
 * each driving a share of the N client connections through epoll and
 * non-blocking sockets. Each connection has at most one request outstanding
 * (closed loop, no pipelining).
 *
 * Data model and key choice follow YCSB's CoreWorkload and its redis binding:
 * records are hashes "user<fnvhash64(n)>" with fields field0..field9 of 100
 * bytes; requests pick records with YCSB's scrambled Zipfian (constant 0.99)
 * or uniformly. Run `ycsb_redis --help` for the full description.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "ycsb_hist.h"
#include "ycsb_resp.h"

#define PROG "ycsb_redis"
#define MAX_FIELDS 64
#define MAX_CLIENTS 4096
#define MAX_THREADS 64

/* ------------------------------------------------------------------------ */
/* Configuration                                                              */

enum phase { PH_LOAD, PH_RUN, PH_BOTH, PH_PING };
enum dist { DIST_ZIPFIAN, DIST_UNIFORM };
enum op { OP_READ, OP_UPDATE, OP_RMW, OP_INSERT, OP_N };
static const char *const op_names[OP_N] = {"READ", "UPDATE", "READ-MODIFY-WRITE", "INSERT"};
static const char *const op_keys[OP_N] = {"read", "update", "rmw", "insert"};

static struct config {
    enum phase phase;
    const char *host;
    const char *port;
    const char *socket_path;
    const char *auth;
    int clients;
    int threads;
    char workload[16];
    double p_read, p_update, p_rmw; /* proportions, sum 1 */
    uint64_t recordcount;
    uint64_t insertstart;
    uint64_t operationcount; /* 0 = unlimited (then seconds > 0) */
    double seconds;          /* 0 = unlimited */
    double target;           /* run: total ops/s to pace at (YCSB -target); 0 = as fast as possible */
    enum dist dist;
    bool read_one;
    bool write_all;
    bool ordered;
    int fieldcount;
    int fieldlength;
    bool flush;
    bool check;
    uint64_t seed;
    double progress;
    double timeout;
    const char *json;
} cfg = {
    .host = "127.0.0.1",
    .port = "6379",
    .clients = 1,
    .threads = 2,
    .workload = "A",
    .p_read = 0.5,
    .p_update = 0.5,
    .recordcount = 1000,
    .dist = DIST_ZIPFIAN,
    .fieldcount = 10,
    .fieldlength = 100,
    .progress = 2.0,
    .timeout = 10.0,
};

/* ------------------------------------------------------------------------ */
/* Small utilities                                                            */

_Noreturn static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* xoshiro256** per thread */
typedef struct { uint64_t s[4]; } rng_t;
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}
static void rng_seed(rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}
static double rng_double(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }
static uint64_t rng_below(rng_t *r, uint64_t n) { return (uint64_t)(rng_double(r) * (double)n) % n; }

/* YCSB Utils.fnvhash64: FNV-1a over the 8 little-endian bytes, then Math.abs. */
static int64_t fnvhash64(int64_t val)
{
    uint64_t h = 0xCBF29CE484222325ull, v = (uint64_t)val;
    for (int i = 0; i < 8; i++) {
        h ^= v & 0xff;
        v >>= 8;
        h *= 1099511628211ull;
    }
    int64_t s = (int64_t)h;
    return s < 0 && s != INT64_MIN ? -s : s; /* Math.abs(Long.MIN_VALUE) stays negative */
}

/* YCSB CoreWorkload.buildKeyName (zeropadding=1) */
static int build_key(char *buf, uint64_t keynum)
{
    int64_t k = cfg.ordered ? (int64_t)keynum : fnvhash64((int64_t)keynum);
    return sprintf(buf, "user%" PRId64, k);
}

/* ------------------------------------------------------------------------ */
/* YCSB ScrambledZipfianGenerator (constant 0.99, 10^10 items, ZETAN given)  */

static struct {
    double theta, zetan, alpha, eta, items, half_pow_theta;
} zipf;

static void zipf_init(void)
{
    zipf.theta = 0.99;
    zipf.zetan = 26.46902820178302; /* ScrambledZipfianGenerator.ZETAN */
    zipf.items = 10000000001.0;     /* ZipfianGenerator(0, ITEM_COUNT): max-min+1 */
    double zeta2 = 1.0 + pow(0.5, zipf.theta);
    zipf.alpha = 1.0 / (1.0 - zipf.theta);
    zipf.eta = (1.0 - pow(2.0 / zipf.items, 1.0 - zipf.theta)) / (1.0 - zeta2 / zipf.zetan);
    zipf.half_pow_theta = pow(0.5, zipf.theta);
}

static uint64_t zipf_next_raw(rng_t *r)
{
    double u = rng_double(r), uz = u * zipf.zetan;
    if (uz < 1.0) return 0;
    if (uz < 1.0 + zipf.half_pow_theta) return 1;
    return (uint64_t)(zipf.items * pow(zipf.eta * u - zipf.eta + 1.0, zipf.alpha));
}

/* CoreWorkload.nextKeynum with a ScrambledZipfianGenerator over
 * [insertstart, insertstart+recordcount] (inclusive, as YCSB builds it for
 * workloads without inserts) and rejection of keys not yet inserted. */
static uint64_t next_keynum(rng_t *r)
{
    uint64_t n = cfg.recordcount;
    if (cfg.dist == DIST_UNIFORM) return cfg.insertstart + rng_below(r, n);
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t k = (uint64_t)fnvhash64((int64_t)zipf_next_raw(r)) % (n + 1);
        if (k < n) return cfg.insertstart + k;
    }
    return cfg.insertstart + rng_below(r, n); /* practically unreachable */
}

/* ------------------------------------------------------------------------ */
/* Field values: "K<keynum>.F<field>.V<version>." + filler derived from the  */
/* three numbers; a read can be checked to be a complete written value.      */

/* Versions: 0 for loaded values; an update takes the next value of a
 * process-wide counter, offset by a per-process random base so that runs of
 * separate processes write distinct versions. */
static _Atomic uint64_t g_version;

static void make_value(char *out, uint64_t key, int field, uint64_t version)
{
    static const char alphabet[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    char hdr[64];
    int h = snprintf(hdr, sizeof hdr, "K%" PRIu64 ".F%d.V%" PRIu64 ".", key, field, version);
    int len = cfg.fieldlength;
    int n = h < len ? h : len;
    memcpy(out, hdr, (size_t)n);
    uint64_t s = key * 0x9E3779B97F4A7C15ull ^ ((uint64_t)field << 48) ^ version * 0xD6E8FEB86659FD93ull;
    uint64_t w = 0;
    int bits = 0;
    for (int i = n; i < len; i++) {
        if (bits < 6) { w = splitmix64(&s); bits = 64; }
        out[i] = alphabet[w & 63];
        w >>= 6;
        bits -= 6;
    }
}

static bool parse_u64(const char **pp, const char *end, uint64_t *out)
{
    const char *p = *pp;
    uint64_t v = 0;
    if (p >= end || *p < '0' || *p > '9') return false;
    for (int i = 0; p < end && *p >= '0' && *p <= '9'; p++, i++) {
        if (i >= 20) return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *pp = p;
    *out = v;
    return true;
}

/* Returns NULL if the value is intact, else a short reason. */
static const char *verify_value(uint64_t key, int field, const char *v, size_t len)
{
    if (len != (size_t)cfg.fieldlength) return "wrong length";
    const char *p = v, *end = v + len;
    uint64_t k, f, ver;
    if (p >= end || *p++ != 'K' || !parse_u64(&p, end, &k) || p >= end || *p++ != '.') return "bad header";
    if (p >= end || *p++ != 'F' || !parse_u64(&p, end, &f) || p >= end || *p++ != '.') return "bad header";
    if (p >= end || *p++ != 'V' || !parse_u64(&p, end, &ver) || p >= end || *p++ != '.') return "bad header";
    if (k != key) return "value of another record";
    if (f != (uint64_t)field) return "value of another field";
    char want[4096];
    make_value(want, key, field, ver);
    if (memcmp(want, v, len) != 0) return "torn or corrupt value";
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Connections                                                                */

static int set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -1;
    return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

static char g_target[300];

/* Blocking connect; returns fd or -1 with a message in err. */
static int connect_server(char *err, size_t errlen)
{
    int fd = -1, e = 0;
    if (cfg.socket_path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(cfg.socket_path) >= sizeof sa.sun_path) {
            snprintf(err, errlen, "socket path too long");
            return -1;
        }
        strcpy(sa.sun_path, cfg.socket_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
        e = errno;
        if (fd >= 0) close(fd);
        snprintf(err, errlen, "cannot connect to %s: %s", g_target, strerror(e));
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int rc = getaddrinfo(cfg.host, cfg.port, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", g_target, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) { e = errno; continue; }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "cannot connect to %s: %s%s", g_target, strerror(e),
                 e == ECONNREFUSED ? " (is redis-server running on that port?)" : "");
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Append a RESP array command to a growable buffer. */
typedef struct { char *p; size_t len, cap; } buf_t;
static void buf_reserve(buf_t *b, size_t extra)
{
    if (b->len + extra <= b->cap) return;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + extra) nc *= 2;
    b->p = realloc(b->p, nc);
    if (!b->p) die(3, "out of memory");
    b->cap = nc;
}
static void buf_fmt(buf_t *b, const char *fmt, ...)
{
    va_list ap;
    buf_reserve(b, 32);
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if ((size_t)n >= b->cap - b->len) {
        buf_reserve(b, (size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}
static void cmd_begin(buf_t *b, int argc) { buf_fmt(b, "*%d\r\n", argc); }
static void cmd_arg(buf_t *b, const char *s, size_t len)
{
    buf_fmt(b, "$%zu\r\n", len);
    buf_reserve(b, len + 2);
    memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len++] = '\r';
    b->p[b->len++] = '\n';
}
static void cmd_arg_s(buf_t *b, const char *s) { cmd_arg(b, s, strlen(s)); }
/* a field value argument generated in place */
static void cmd_arg_value(buf_t *b, uint64_t key, int field, uint64_t version)
{
    size_t len = (size_t)cfg.fieldlength;
    buf_fmt(b, "$%zu\r\n", len);
    buf_reserve(b, len + 2);
    make_value(b->p + b->len, key, field, version);
    b->len += len;
    b->p[b->len++] = '\r';
    b->p[b->len++] = '\n';
}

/* Blocking request/reply (setup only: PING, AUTH, FLUSHALL). Returns 0 and
 * copies a one-line description of the reply, or -1. */
static int blocking_cmd(int fd, buf_t *req, char *desc, size_t desclen, double timeout_s)
{
    size_t off = 0;
    uint64_t deadline = now_ns() + (uint64_t)(timeout_s * 1e9);
    while (off < req->len) {
        ssize_t w = send(fd, req->p + off, req->len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) { snprintf(desc, desclen, "send: %s", strerror(errno)); return -1; }
        off += (size_t)w;
    }
    buf_t in = {0};
    resp_reply_t r;
    for (;;) {
        int64_t left_ms = ((int64_t)deadline - (int64_t)now_ns()) / 1000000;
        if (left_ms <= 0) { snprintf(desc, desclen, "timed out waiting for a reply"); free(in.p); return -1; }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
        if (pr < 0 && errno != EINTR) { snprintf(desc, desclen, "poll: %s", strerror(errno)); free(in.p); return -1; }
        if (pr <= 0) continue;
        buf_reserve(&in, 4096);
        ssize_t n = recv(fd, in.p + in.len, in.cap - in.len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {
            snprintf(desc, desclen, "connection closed by server%s%s", n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
            free(in.p);
            return -1;
        }
        in.len += (size_t)n;
        long c = resp_parse(in.p, in.len, &r);
        if (c < 0) { snprintf(desc, desclen, "protocol error in reply"); free(in.p); return -1; }
        if (c == 0) continue;
        int sl = (int)(r.str.len > 200 ? 200 : r.str.len);
        if (r.type == '-') { snprintf(desc, desclen, "%.*s", sl, r.str.p); free(in.p); return -1; }
        if (r.type == ':') snprintf(desc, desclen, "%lld", r.ival);
        else if (r.type == '*') snprintf(desc, desclen, "array of %zu", r.nelem);
        else snprintf(desc, desclen, "%.*s", sl, r.str.p ? r.str.p : "");
        free(in.p);
        return 0;
    }
}

static int setup_conn(char *err, size_t errlen)
{
    int fd = connect_server(err, errlen);
    if (fd < 0) return -1;
    if (cfg.auth) {
        buf_t b = {0};
        char d[256];
        cmd_begin(&b, 2);
        cmd_arg_s(&b, "AUTH");
        cmd_arg_s(&b, cfg.auth);
        int rc = blocking_cmd(fd, &b, d, sizeof d, cfg.timeout);
        free(b.p);
        if (rc != 0) {
            snprintf(err, errlen, "AUTH failed on %s: %.200s", g_target, d);
            close(fd);
            return -1;
        }
    }
    return fd;
}

/* ------------------------------------------------------------------------ */
/* Workers                                                                    */

/* C_WAIT: paced (--target), idle until its next operation's intended start. */
enum cstate { C_IDLE, C_BUSY, C_WAIT, C_DONE, C_DEAD };

typedef struct conn {
    int fd;
    enum cstate state;
    buf_t out;
    size_t outoff;
    buf_t in;
    enum op op;
    int step; /* RMW: 0 = read, 1 = write */
    uint64_t key;
    int field;
    char keystr[32];
    int keylen;
    uint64_t t_start, t_sent;
    uint64_t t_intended; /* --target: when its next operation is due */
    uint64_t t_due;      /* --target: when the current operation was due */
} conn_t;

typedef struct worker {
    int idx;
    pthread_t tid;
    conn_t *conns;
    int nconns;
    int epfd;                /* this thread's connections, by readiness */
    uint32_t *watching;      /* per connection: EPOLLIN, EPOLLOUT or 0 */
    rng_t rng;
    hist_t hist[OP_N];
    hist_t intended; /* --target: every operation, from its intended start */
    uint64_t unstarted; /* --target: operations due before the run ended that never started */
    uint64_t errors[OP_N];
    uint64_t notfound, check_failures, io_errors, timeouts;
    uint64_t t_end;
    /* /proc/thread-self/schedstat over the phase: CPU time, and time spent
     * runnable but waiting for a CPU (ns; sched_ok false where unreadable) */
    uint64_t sched_cpu_ns, sched_wait_ns;
    bool sched_ok;
    /* progress counters, read by the main thread */
    _Alignas(64) _Atomic uint64_t done_ops;
    _Atomic uint64_t err_ops;
    _Atomic int finished;
} worker_t;

static enum phase g_cur_phase;        /* PH_LOAD or PH_RUN while running */
static _Atomic uint64_t g_next_insert; /* next record to load */
static _Atomic uint64_t g_ops_claimed;
static uint64_t g_deadline;            /* 0 = none */
static uint64_t g_pace_interval_ns;    /* --target, run phase: between one connection's operations */
/* A paced connection starts an operation due within this much: one wake-up
 * serves the operations due close together, which keeps the generator's own
 * CPU per operation near the unpaced one. */
#define PACE_SLACK_NS 50000ull
static volatile sig_atomic_t g_stop;
static _Atomic int g_msgs;             /* error messages printed */
static char g_field_names[MAX_FIELDS][16];
static int g_field_name_len[MAX_FIELDS];

/* --target, run phase: the operations connection c was due to start before
 * the run ended at `end` and never started (it was still busy with earlier
 * ones) count in the intended-start histogram with end - their intended
 * start, the least they waited. Left out, a run that fell behind its
 * schedule near its end reported a lower intended-start p99 than it had. */
static void count_unstarted(worker_t *w, conn_t *c, uint64_t end)
{
    if (g_cur_phase != PH_RUN || !g_pace_interval_ns) return;
    if (g_deadline && g_deadline < end) end = g_deadline;
    if (c->t_intended >= end) return;
    uint64_t n = (end - c->t_intended + g_pace_interval_ns - 1) / g_pace_interval_ns;
    hist_record_series(&w->intended, end - c->t_intended, g_pace_interval_ns, n);
    w->unstarted += n;
    c->t_intended += n * g_pace_interval_ns;
}

static void report(const char *fmt, ...)
{
    int n = atomic_fetch_add(&g_msgs, 1);
    if (n > 10) return;
    char m[1024];
    if (n == 10) {
        snprintf(m, sizeof m, PROG ": (further error messages suppressed)\n");
    } else {
        va_list ap;
        va_start(ap, fmt);
        int k = snprintf(m, sizeof m, PROG ": ");
        vsnprintf(m + k, sizeof m - (size_t)k - 1, fmt, ap);
        va_end(ap);
        strcat(m, "\n");
    }
    fputs(m, stderr); /* one call: lines of two threads do not interleave */
}

static void conn_kill(worker_t *w, conn_t *c, const char *why)
{
    report("connection %d of thread %d: %s; connection dropped", (int)(c - w->conns), w->idx, why);
    close(c->fd);
    c->fd = -1;
    c->state = C_DEAD;
    w->errors[c->op]++;
    atomic_fetch_add_explicit(&w->err_ops, 1, memory_order_relaxed);
}

/* Send what is in c->out; returns -1 on a fatal error. */
static int conn_flush(worker_t *w, conn_t *c)
{
    while (c->outoff < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->outoff, c->out.len - c->outoff, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            char m[128];
            snprintf(m, sizeof m, "send: %s", strerror(errno));
            conn_kill(w, c, m);
            return -1;
        }
        c->outoff += (size_t)n;
    }
    return 0;
}

static void build_read(conn_t *c, rng_t *rng)
{
    c->out.len = 0;
    if (cfg.read_one) {
        c->field = (int)rng_below(rng, (uint64_t)cfg.fieldcount);
        cmd_begin(&c->out, 3);
        cmd_arg_s(&c->out, "HGET");
        cmd_arg(&c->out, c->keystr, (size_t)c->keylen);
        cmd_arg(&c->out, g_field_names[c->field], (size_t)g_field_name_len[c->field]);
    } else {
        cmd_begin(&c->out, 2);
        cmd_arg_s(&c->out, "HGETALL");
        cmd_arg(&c->out, c->keystr, (size_t)c->keylen);
    }
}

static void build_write(conn_t *c, rng_t *rng, bool all, uint64_t version)
{
    c->out.len = 0;
    if (all) {
        cmd_begin(&c->out, 2 + 2 * cfg.fieldcount);
        cmd_arg_s(&c->out, "HSET");
        cmd_arg(&c->out, c->keystr, (size_t)c->keylen);
        for (int f = 0; f < cfg.fieldcount; f++) {
            cmd_arg(&c->out, g_field_names[f], (size_t)g_field_name_len[f]);
            cmd_arg_value(&c->out, c->key, f, version);
        }
    } else {
        c->field = (int)rng_below(rng, (uint64_t)cfg.fieldcount);
        cmd_begin(&c->out, 4);
        cmd_arg_s(&c->out, "HSET");
        cmd_arg(&c->out, c->keystr, (size_t)c->keylen);
        cmd_arg(&c->out, g_field_names[c->field], (size_t)g_field_name_len[c->field]);
        cmd_arg_value(&c->out, c->key, c->field, version);
    }
}

static void conn_send(worker_t *w, conn_t *c, uint64_t t)
{
    c->outoff = 0;
    c->in.len = 0;
    c->t_sent = t;
    c->state = C_BUSY;
    conn_flush(w, c);
}

/* Start the next operation on an idle connection (or mark it done). */
static void conn_start(worker_t *w, conn_t *c, uint64_t t)
{
    if (g_stop) { count_unstarted(w, c, t); c->state = C_DONE; return; }
    if (g_cur_phase == PH_LOAD) {
        uint64_t rec = atomic_fetch_add_explicit(&g_next_insert, 1, memory_order_relaxed);
        if (rec >= cfg.recordcount) { c->state = C_DONE; return; }
        c->op = OP_INSERT;
        c->key = cfg.insertstart + rec;
        c->keylen = build_key(c->keystr, c->key);
        build_write(c, &w->rng, true, 0);
    } else {
        if (g_deadline && t >= g_deadline) { count_unstarted(w, c, t); c->state = C_DONE; return; }
        if (g_pace_interval_ns && t + PACE_SLACK_NS < c->t_intended) { c->state = C_WAIT; return; }
        if (cfg.operationcount &&
            atomic_fetch_add_explicit(&g_ops_claimed, 1, memory_order_relaxed) >= cfg.operationcount) {
            c->state = C_DONE;
            return;
        }
        double u = rng_double(&w->rng);
        c->op = u < cfg.p_read ? OP_READ : u < cfg.p_read + cfg.p_update ? OP_UPDATE : OP_RMW;
        if (cfg.p_rmw == 0 && c->op == OP_RMW) c->op = OP_UPDATE; /* rounding */
        c->key = next_keynum(&w->rng);
        c->keylen = build_key(c->keystr, c->key);
        c->step = 0;
        if (c->op == OP_UPDATE)
            build_write(c, &w->rng, cfg.write_all, atomic_fetch_add(&g_version, 1) + 1);
        else
            build_read(c, &w->rng);
    }
    c->t_start = t;
    if (g_cur_phase == PH_RUN && g_pace_interval_ns) {
        c->t_due = c->t_intended;
        c->t_intended += g_pace_interval_ns;
    }
    conn_send(w, c, t);
}

static void op_done(worker_t *w, conn_t *c, bool ok, uint64_t t)
{
    if (ok) {
        hist_record(&w->hist[c->op], t - c->t_start);
        if (g_cur_phase == PH_RUN && g_pace_interval_ns)
            hist_record(&w->intended, t > c->t_due ? t - c->t_due : 0);
        atomic_store_explicit(&w->done_ops, atomic_load_explicit(&w->done_ops, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    } else {
        w->errors[c->op]++;
        atomic_fetch_add_explicit(&w->err_ops, 1, memory_order_relaxed);
    }
    c->state = C_IDLE;
}

/* Check a read reply; returns true if it is acceptable. */
static bool check_read(worker_t *w, conn_t *c, const resp_reply_t *r)
{
    if (cfg.read_one) {
        if (r->type != '$') { report("HGET %s: unexpected reply type '%c'", c->keystr, r->type); return false; }
        if (r->isnull) { w->notfound++; report("HGET %s %s: record not found", c->keystr, g_field_names[c->field]); return false; }
        if (cfg.check) {
            const char *why = verify_value(c->key, c->field, r->str.p, r->str.len);
            if (why) {
                w->check_failures++;
                report("check: HGET %s %s: %s: \"%.*s\"", c->keystr, g_field_names[c->field], why,
                       (int)(r->str.len > 120 ? 120 : r->str.len), r->str.p);
                return false;
            }
        }
        return true;
    }
    if (r->type != '*') { report("HGETALL %s: unexpected reply type '%c'", c->keystr, r->type); return false; }
    if (r->nelem == 0) { w->notfound++; report("HGETALL %s: record not found", c->keystr); return false; }
    if (!cfg.check) return true;
    if (r->nelem != 2 * (size_t)cfg.fieldcount || r->nelem > RESP_MAX_ELEMS) {
        w->check_failures++;
        report("check: HGETALL %s: %zu elements, expected %d", c->keystr, r->nelem, 2 * cfg.fieldcount);
        return false;
    }
    uint64_t seen = 0;
    for (size_t i = 0; i + 1 < r->nelem; i += 2) {
        const resp_slice_t *name = &r->elem[i], *val = &r->elem[i + 1];
        int f = -1;
        if (name->len > 5 && memcmp(name->p, "field", 5) == 0) {
            const char *p = name->p + 5;
            uint64_t v;
            if (parse_u64(&p, name->p + name->len, &v) && p == name->p + name->len && v < (uint64_t)cfg.fieldcount)
                f = (int)v;
        }
        const char *why = f < 0 ? "unknown field name" : (seen >> f) & 1 ? "duplicate field"
                                                        : verify_value(c->key, f, val->p, val->len);
        if (why) {
            w->check_failures++;
            report("check: HGETALL %s field \"%.*s\": %s: \"%.*s\"", c->keystr, (int)(name->len > 20 ? 20 : name->len),
                   name->p, why, (int)(val->len > 120 ? 120 : val->len), val->p);
            return false;
        }
        seen |= 1ull << f;
    }
    return true;
}

static void conn_on_reply(worker_t *w, conn_t *c, const resp_reply_t *r, uint64_t t)
{
    if (r->type == '-') {
        report("%s on %s: server error: %.*s", op_names[c->op], c->keystr, (int)(r->str.len > 200 ? 200 : r->str.len),
               r->str.p);
        op_done(w, c, false, t);
        return;
    }
    bool is_read_step = c->op == OP_READ || (c->op == OP_RMW && c->step == 0);
    if (is_read_step) {
        if (!check_read(w, c, r)) { op_done(w, c, false, t); return; }
        if (c->op == OP_RMW) {
            c->step = 1;
            build_write(c, &w->rng, cfg.write_all, atomic_fetch_add(&g_version, 1) + 1);
            conn_send(w, c, t);
            return;
        }
        op_done(w, c, true, t);
        return;
    }
    /* a write: HSET answers with an integer */
    if (r->type != ':') {
        report("HSET %s: unexpected reply type '%c'", c->keystr, r->type);
        op_done(w, c, false, t);
        return;
    }
    op_done(w, c, true, t);
}

/* Data is readable on c. */
static void conn_on_input(worker_t *w, conn_t *c)
{
    for (int rounds = 0; rounds < 64; rounds++) {
        buf_reserve(&c->in, 4096);
        ssize_t n = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            char m[128];
            snprintf(m, sizeof m, "recv: %s", strerror(errno));
            conn_kill(w, c, m);
            return;
        }
        if (n == 0) { conn_kill(w, c, "connection closed by server"); return; }
        c->in.len += (size_t)n;
        if (c->state != C_BUSY) { conn_kill(w, c, "unexpected data from server"); return; }
        resp_reply_t r;
        long used = resp_parse(c->in.p, c->in.len, &r);
        if (used < 0) { conn_kill(w, c, "protocol error in reply"); return; }
        if (used == 0) continue; /* partial reply: read more */
        if ((size_t)used != c->in.len) { conn_kill(w, c, "more than one reply (server pipelining?)"); return; }
        /* The next operation starts after every ready reply of this wake-up
         * is read (worker_main): starting it here put this send() into the
         * measured latency of the replies read after it, which a server
         * that releases replies in bursts paid for (a benchmark audit,
         * session 37). */
        conn_on_reply(w, c, &r, now_ns());
        return;
    }
}

/* This thread's CPU time and run-queue wait so far (ns), from
 * /proc/thread-self/schedstat; false where that is not available. */
static bool thread_schedstat(uint64_t *cpu_ns, uint64_t *wait_ns)
{
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f)
        return false;
    unsigned long long c = 0, wt = 0;
    bool ok = fscanf(f, "%llu %llu", &c, &wt) == 2;
    fclose(f);
    *cpu_ns = c;
    *wait_ns = wt;
    return ok;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint64_t cpu0 = 0, wait0 = 0;
    w->sched_ok = thread_schedstat(&cpu0, &wait0);
    uint64_t timeout_ns = (uint64_t)(cfg.timeout * 1e9);
    uint64_t t = now_ns();
    /* Each start reads the clock itself: an operation's latency counts from
     * its own start, not from before the sends of the connections started
     * ahead of it. */
    for (int i = 0; i < w->nconns; i++)
        if (w->conns[i].state == C_IDLE) conn_start(w, &w->conns[i], now_ns());
    /* Each busy connection waits for one thing: room to send the rest of
     * its request, or its reply. epoll, not poll(): a closed loop of 16
     * connections per thread wakes up for about one reply at a time, and
     * poll() would register and unregister every socket at each wake-up.
     * The load generator shares the CPUs with the server it measures, so
     * its cost per operation is kept low. */
    uint64_t next_timeout_check = t + 10000000ull;
    for (;;) {
        int busy = 0;
        uint64_t next_due = UINT64_MAX; /* the earliest paced connection's intended start */
        /* --target: past the deadline, or after SIGINT/SIGTERM, a waiting
         * connection starts nothing more (conn_start), so it is done now,
         * not at its next intended start, up to one interval later, which
         * counted in the phase's seconds and lowered its ops/s (and held a
         * stopped run for that long). */
        uint64_t now = g_pace_interval_ns ? now_ns() : 0;
        bool no_more = g_pace_interval_ns && (g_stop || (g_deadline && now >= g_deadline));
        for (int i = 0; i < w->nconns; i++) {
            conn_t *c = &w->conns[i];
            if (c->state == C_WAIT && no_more) {
                count_unstarted(w, c, now);
                c->state = C_DONE;
            }
            /* A paced connection waiting for its next start stays watched for
             * input: no epoll_ctl per operation, and data or a close from
             * the server while it waits is seen (and drops it). */
            uint32_t want = c->state == C_WAIT ? EPOLLIN
                          : c->state != C_BUSY ? 0 : c->outoff < c->out.len ? EPOLLOUT : EPOLLIN;
            busy += c->state == C_BUSY || c->state == C_WAIT;
            if (c->state == C_WAIT && c->t_intended < next_due) next_due = c->t_intended;
            if (want == w->watching[i] || c->state == C_DEAD) continue;
            struct epoll_event ev = {.events = want, .data.u32 = (uint32_t)i};
            int op = !w->watching[i] ? EPOLL_CTL_ADD : !want ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
            if (epoll_ctl(w->epfd, op, c->fd, &ev) != 0) die(3, "epoll_ctl: %s", strerror(errno));
            w->watching[i] = want;
        }
        if (busy == 0) break;
        struct epoll_event evs[64];
        struct timespec wait = {0, 100000000}; /* 100 ms: time-outs and the deadline are checked */
        if (next_due != UINT64_MAX) {
            /* wake when the earliest start comes within the slack, or at
             * the deadline if that comes first */
            uint64_t now = now_ns(), wake = next_due > PACE_SLACK_NS ? next_due - PACE_SLACK_NS : 0;
            if (g_deadline && g_deadline < wake) wake = g_deadline;
            uint64_t d = wake > now ? wake - now : 0;
            if (d < 100000000ull) wait.tv_nsec = (long)d;
        }
        int pr = epoll_pwait2(w->epfd, evs, 64, &wait, NULL);
        if (pr < 0 && errno != EINTR) die(3, "epoll_pwait2: %s", strerror(errno));
        for (int k = 0; k < pr; k++) {
            uint32_t re = evs[k].events;
            conn_t *c = &w->conns[evs[k].data.u32];
            if (c->state == C_WAIT) {
                if (re & (EPOLLIN | EPOLLERR | EPOLLHUP)) conn_on_input(w, c); /* unexpected: dropped */
                continue;
            }
            if (c->state != C_BUSY) continue;
            if (c->outoff < c->out.len) {
                if (re & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                    conn_flush(w, c);
            } else if (re & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                conn_on_input(w, c);
            }
        }
        /* Replies read: start the next operation of each connection done. */
        for (int k = 0; k < pr; k++) {
            conn_t *c = &w->conns[evs[k].data.u32];
            if (c->state == C_IDLE) conn_start(w, c, now_ns());
        }
        t = now_ns();
        if (next_due <= t + PACE_SLACK_NS)
            for (int i = 0; i < w->nconns; i++)
                if (w->conns[i].state == C_WAIT && w->conns[i].t_intended <= t + PACE_SLACK_NS)
                    conn_start(w, &w->conns[i], now_ns()); /* as above: its own start time */
        if (t < next_timeout_check) continue;
        next_timeout_check = t + 10000000ull;
        for (int i = 0; i < w->nconns; i++) {
            conn_t *c = &w->conns[i];
            if (c->state == C_BUSY && t > c->t_sent + timeout_ns) { /* t_sent may be after t */
                w->timeouts++;
                conn_kill(w, c, "request timed out (see --timeout)");
            }
        }
    }
    w->t_end = now_ns();
    uint64_t cpu1 = 0, wait1 = 0;
    if (w->sched_ok && thread_schedstat(&cpu1, &wait1)) {
        w->sched_cpu_ns = cpu1 - cpu0;
        w->sched_wait_ns = wait1 - wait0;
    } else {
        w->sched_ok = false;
    }
    atomic_store(&w->finished, 1);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Running a phase and reporting                                              */

static FILE *g_out; /* the table and key=value line: stdout */

static void on_signal(int sig) { (void)sig; g_stop = 1; }

typedef struct {
    hist_t hist[OP_N], total;
    hist_t intended; /* --target: every operation, from its intended start */
    uint64_t unstarted; /* --target: of those, due before the end but never started */
    uint64_t errors[OP_N], errors_total, notfound, check_failures, timeouts;
    uint64_t ops;
    double seconds;
    bool sched_ok;                 /* every worker read its schedstat */
    uint64_t client_cpu_ns, client_wait_ns; /* summed over the workers */
} result_t;

static void usage_short(void)
{
    fprintf(stderr, "usage: " PROG " load|run|both|ping [options]   (" PROG " --help for details)\n");
}

/* The load generator's own scheduling over the phase: the share of its
 * threads' run time spent runnable but waiting for a CPU, and its CPU time
 * per operation. False where schedstat was not readable. */
static bool client_sched(const result_t *res, double *wait_pct, double *cpu_us_op)
{
    if (!res->sched_ok || res->seconds <= 0 || cfg.threads <= 0)
        return false;
    *wait_pct = 100.0 * (double)res->client_wait_ns / 1e9 / (res->seconds * cfg.threads);
    *cpu_us_op = res->ops ? (double)res->client_cpu_ns / 1e3 / (double)res->ops : 0.0;
    return true;
}

static void print_phase(const char *phase, const result_t *res)
{
    const char *dist = cfg.dist == DIST_ZIPFIAN ? "zipfian" : "uniform";
    bool is_load = strcmp(phase, "load") == 0;
    fprintf(g_out, "# %s %s: target=%s workload=%s records=%" PRIu64 " clients=%d threads=%d", PROG, phase, g_target,
           is_load ? "load" : cfg.workload, cfg.recordcount, cfg.clients, cfg.threads);
    if (!is_load)
        fprintf(g_out, " distribution=%s read=%s update=%s mix=read:%.0f%%,update:%.0f%%,rmw:%.0f%%", dist,
               cfg.read_one ? "hget-one" : "hgetall", cfg.write_all ? "hset-all" : "hset-one", cfg.p_read * 100,
               cfg.p_update * 100, cfg.p_rmw * 100);
    if (!is_load && cfg.target > 0)
        fprintf(g_out, " target=%.1fops/s", cfg.target);
    fprintf(g_out, " check=%s\n", cfg.check ? "on" : "off");
    fprintf(g_out, "%-18s %10s %11s %9s %9s %9s %9s %9s %9s %8s\n", "op", "count", "ops/s", "mean_us", "p50_us", "p95_us",
           "p99_us", "p99.9_us", "max_us", "errors");
    for (int o = 0; o <= OP_N; o++) {
        const hist_t *h = o < OP_N ? &res->hist[o] : &res->total;
        uint64_t e = o < OP_N ? res->errors[o] : res->errors_total;
        if (o < OP_N && h->count == 0 && e == 0) continue;
        fprintf(g_out, "%-18s %10" PRIu64 " %11.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %8" PRIu64 "\n",
               o < OP_N ? op_names[o] : "TOTAL", h->count, res->seconds > 0 ? (double)h->count / res->seconds : 0,
               hist_mean_us(h), hist_pct_us(h, 50), hist_pct_us(h, 95), hist_pct_us(h, 99), hist_pct_us(h, 99.9),
               hist_max_us(h), e);
    }
    if (res->notfound || res->check_failures || res->timeouts)
        fprintf(g_out, "# errors include: not_found=%" PRIu64 " check_failures=%" PRIu64 " timeouts=%" PRIu64 "\n",
               res->notfound, res->check_failures, res->timeouts);
    /* The load generator's own scheduling: on a machine it shares with the
     * server, a client thread that waits for a CPU delays the replies of all
     * its connections, and the wait counts in their latencies. */
    double wait_pct, cpu_us_op;
    bool have_sched = client_sched(res, &wait_pct, &cpu_us_op);
    if (have_sched) {
        fprintf(g_out, "# client threads: %.1f%% of the run runnable but waiting for a CPU; %.2f us of CPU per op\n",
                wait_pct, cpu_us_op);
    }
    const hist_t *t = &res->total;
    fprintf(g_out, "workload=%s clients=%d ops=%" PRIu64 " seconds=%.3f ops_per_sec=%.1f p50_us=%.1f p99_us=%.1f "
           "errors=%" PRIu64 " phase=%s threads=%d records=%" PRIu64 " distribution=%s mean_us=%.1f p95_us=%.1f "
           "p999_us=%.1f max_us=%.1f check=%s check_failures=%" PRIu64,
           is_load ? "load" : cfg.workload, cfg.clients, res->ops, res->seconds,
           res->seconds > 0 ? (double)res->ops / res->seconds : 0, hist_pct_us(t, 50), hist_pct_us(t, 99),
           res->errors_total, phase, cfg.threads, cfg.recordcount, is_load ? "-" : dist, hist_mean_us(t),
           hist_pct_us(t, 95), hist_pct_us(t, 99.9), hist_max_us(t), cfg.check ? "on" : "off", res->check_failures);
    for (int o = 0; o < OP_N; o++)
        if (res->hist[o].count || res->errors[o])
            fprintf(g_out, " %s_ops=%" PRIu64 " %s_p99_us=%.1f", op_keys[o], res->hist[o].count, op_keys[o],
                   hist_pct_us(&res->hist[o], 99));
    if (have_sched)
        fprintf(g_out, " client_wait_pct=%.2f client_cpu_us_per_op=%.2f", wait_pct, cpu_us_op);
    if (!is_load && cfg.target > 0)
        fprintf(g_out, " target_ops_per_sec=%.1f intended_p99_us=%.1f intended_p999_us=%.1f intended_ops=%" PRIu64
                " intended_unstarted=%" PRIu64, cfg.target, hist_pct_us(&res->intended, 99),
                hist_pct_us(&res->intended, 99.9), res->intended.count, res->unstarted);
    fprintf(g_out, "\n");
    fflush(g_out);
}

static void json_phase(FILE *f, const char *phase, const result_t *res, bool first)
{
    bool is_load = strcmp(phase, "load") == 0;
    fprintf(f, "%s{\"phase\":\"%s\",\"workload\":\"%s\",\"target\":\"%s\",\"clients\":%d,\"threads\":%d,"
               "\"records\":%" PRIu64 ",\"distribution\":\"%s\",\"read\":\"%s\",\"update\":\"%s\","
               "\"check\":%s,\"ops\":%" PRIu64 ",\"seconds\":%.6f,\"ops_per_sec\":%.3f,\"errors\":%" PRIu64
               ",\"not_found\":%" PRIu64 ",\"check_failures\":%" PRIu64 ",\"timeouts\":%" PRIu64 ",\"ops_by_type\":{",
            first ? "" : ",\n", phase, is_load ? "load" : cfg.workload, g_target, cfg.clients, cfg.threads,
            cfg.recordcount, cfg.dist == DIST_ZIPFIAN ? "zipfian" : "uniform", cfg.read_one ? "hget-one" : "hgetall",
            cfg.write_all ? "hset-all" : "hset-one", cfg.check ? "true" : "false", res->ops, res->seconds,
            res->seconds > 0 ? (double)res->ops / res->seconds : 0, res->errors_total, res->notfound,
            res->check_failures, res->timeouts);
    bool firstop = true;
    for (int o = 0; o <= OP_N; o++) {
        const hist_t *h = o < OP_N ? &res->hist[o] : &res->total;
        uint64_t e = o < OP_N ? res->errors[o] : res->errors_total;
        if (o < OP_N && h->count == 0 && e == 0) continue;
        fprintf(f, "%s\"%s\":{\"count\":%" PRIu64 ",\"ops_per_sec\":%.3f,\"mean_us\":%.3f,\"p50_us\":%.3f,"
                   "\"p95_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"max_us\":%.3f,\"errors\":%" PRIu64 "}",
                firstop ? "" : ",", o < OP_N ? op_keys[o] : "total", h->count,
                res->seconds > 0 ? (double)h->count / res->seconds : 0, hist_mean_us(h), hist_pct_us(h, 50),
                hist_pct_us(h, 95), hist_pct_us(h, 99), hist_pct_us(h, 99.9), hist_max_us(h), e);
        firstop = false;
    }
    fprintf(f, "}");
    double wait_pct, cpu_us_op;
    if (client_sched(res, &wait_pct, &cpu_us_op))
        fprintf(f, ",\"client_wait_pct\":%.3f,\"client_cpu_us_per_op\":%.3f", wait_pct, cpu_us_op);
    if (!is_load && cfg.target > 0)
        fprintf(f, ",\"target_ops_per_sec\":%.3f,\"intended_p99_us\":%.3f,\"intended_p999_us\":%.3f,"
                "\"intended_ops\":%" PRIu64 ",\"intended_unstarted\":%" PRIu64, cfg.target,
                hist_pct_us(&res->intended, 99), hist_pct_us(&res->intended, 99.9), res->intended.count,
                res->unstarted);
    fprintf(f, "}");
}

static int run_phase(enum phase ph, result_t *res)
{
    g_cur_phase = ph;
    atomic_store(&g_next_insert, 0);
    atomic_store(&g_ops_claimed, 0);
    memset(res, 0, sizeof *res);

    int nt = cfg.threads;
    worker_t *ws = calloc((size_t)nt, sizeof *ws);
    conn_t *conns = calloc((size_t)cfg.clients, sizeof *conns);
    if (!ws || !conns) die(3, "out of memory");
    char err[1024];
    for (int i = 0; i < cfg.clients; i++) {
        int fd = setup_conn(err, sizeof err);
        if (fd < 0) die(2, "%s", err);
        if (set_nonblock(fd, true) < 0) die(3, "fcntl: %s", strerror(errno));
        conns[i].fd = fd;
        conns[i].state = C_IDLE;
    }
    for (int i = 0; i < nt; i++) {
        worker_t *w = &ws[i];
        int lo = (int)((long)cfg.clients * i / nt), hi = (int)((long)cfg.clients * (i + 1) / nt);
        w->idx = i;
        w->conns = conns + lo;
        w->nconns = hi - lo;
        w->watching = calloc((size_t)w->nconns + 1, sizeof *w->watching);
        if (!w->watching) die(3, "out of memory");
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (w->epfd < 0) die(3, "epoll_create1: %s", strerror(errno));
        rng_seed(&w->rng, cfg.seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1 + (ph == PH_LOAD ? 1000 : 0))));
        for (int o = 0; o < OP_N; o++) hist_init(&w->hist[o]);
        hist_init(&w->intended);
    }
    uint64_t t0 = now_ns();
    g_deadline = ph == PH_RUN && cfg.seconds > 0 ? t0 + (uint64_t)(cfg.seconds * 1e9) : 0;
    /* --target: each connection does target/clients ops/s, their starts
     * spread evenly over one interval. */
    g_pace_interval_ns = ph == PH_RUN && cfg.target > 0 ? (uint64_t)(1e9 * cfg.clients / cfg.target) : 0;
    for (int i = 0; i < cfg.clients; i++)
        conns[i].t_intended = t0 + (g_pace_interval_ns ? g_pace_interval_ns * (uint64_t)i / (uint64_t)cfg.clients : 0);
    for (int i = 0; i < nt; i++) {
        int rc = pthread_create(&ws[i].tid, NULL, worker_main, &ws[i]);
        if (rc) die(3, "pthread_create: %s", strerror(rc));
    }
    /* progress */
    uint64_t next_prog = cfg.progress > 0 ? t0 + (uint64_t)(cfg.progress * 1e9) : UINT64_MAX, last_ops = 0,
             last_t = t0;
    for (;;) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
        int fin = 0;
        for (int i = 0; i < nt; i++) fin += atomic_load(&ws[i].finished);
        if (fin == nt) break;
        uint64_t t = now_ns();
        if (t >= next_prog) {
            uint64_t ops = 0, errs = 0;
            for (int i = 0; i < nt; i++) {
                ops += atomic_load_explicit(&ws[i].done_ops, memory_order_relaxed);
                errs += atomic_load_explicit(&ws[i].err_ops, memory_order_relaxed);
            }
            double el = (double)(t - t0) / 1e9;
            fprintf(stderr, "[%s %7.1f s] %" PRIu64 " ops, %.0f ops/s (last %.1f s: %.0f ops/s), %" PRIu64 " errors\n",
                    ph == PH_LOAD ? "load" : "run", el, ops, (double)ops / el, (double)(t - last_t) / 1e9,
                    (double)(ops - last_ops) * 1e9 / (double)(t - last_t), errs);
            last_ops = ops;
            last_t = t;
            next_prog += (uint64_t)(cfg.progress * 1e9);
        }
    }
    uint64_t t_end = t0;
    res->sched_ok = true;
    for (int i = 0; i < nt; i++) {
        worker_t *w = &ws[i];
        pthread_join(w->tid, NULL);
        if (w->t_end > t_end) t_end = w->t_end;
        if (!w->sched_ok) res->sched_ok = false;
    }
    hist_init(&res->total);
    hist_init(&res->intended);
    for (int o = 0; o < OP_N; o++) hist_init(&res->hist[o]);
    int dead = 0;
    for (int i = 0; i < nt; i++) {
        worker_t *w = &ws[i];
        for (int o = 0; o < OP_N; o++) {
            hist_merge(&res->hist[o], &w->hist[o]);
            hist_merge(&res->total, &w->hist[o]);
            res->errors[o] += w->errors[o];
            res->errors_total += w->errors[o];
            hist_free(&w->hist[o]);
        }
        hist_merge(&res->intended, &w->intended);
        hist_free(&w->intended);
        res->unstarted += w->unstarted;
        res->notfound += w->notfound;
        res->check_failures += w->check_failures;
        res->client_cpu_ns += w->sched_cpu_ns;
        res->client_wait_ns += w->sched_wait_ns;
        res->timeouts += w->timeouts;
        free(w->watching);
        close(w->epfd);
    }
    for (int i = 0; i < cfg.clients; i++) {
        if (conns[i].state == C_DEAD) dead++;
        else close(conns[i].fd);
        free(conns[i].out.p);
        free(conns[i].in.p);
    }
    res->ops = res->total.count;
    res->seconds = (double)(t_end - t0) / 1e9;
    if (dead) fprintf(stderr, PROG ": %d of %d connections were dropped\n", dead, cfg.clients);
    if (ph == PH_LOAD && !g_stop && atomic_load(&g_next_insert) < cfg.recordcount)
        fprintf(stderr, PROG ": load incomplete\n");
    free(ws);
    free(conns);
    return 0;
}

static void free_result(result_t *r)
{
    for (int o = 0; o < OP_N; o++) hist_free(&r->hist[o]);
    hist_free(&r->total);
    hist_free(&r->intended);
}

/* ------------------------------------------------------------------------ */
/* Command line                                                               */

static void help(void)
{
    printf(
"NAME\n"
"    " PROG " - YCSB-compatible closed-loop load generator for Redis\n"
"\n"
"SYNOPSIS\n"
"    " PROG " load [options]     insert --recordcount records\n"
"    " PROG " run  [options]     run a workload against loaded records\n"
"    " PROG " both [options]     load, then run\n"
"    " PROG " ping [options]     wait (up to --timeout) until the server answers PING\n"
"\n"
"DESCRIPTION\n"
"    Reproduces YCSB's CoreWorkload with YCSB's redis binding, written in C so\n"
"    that the client does not need a core of its own. Each record is a Redis\n"
"    hash named \"user\" + fnvhash64(n) (YCSB insertorder=hashed; n in\n"
"    [insertstart, insertstart+recordcount)) with fields field0..field<F-1>,\n"
"    each a value of --fieldlength bytes.\n"
"\n"
"    Each client is one TCP (or unix socket) connection with at most one\n"
"    request outstanding: closed loop, no pipelining. The clients are spread\n"
"    over --threads threads; each thread drives its connections through\n"
"    epoll and non-blocking sockets, so 64 clients need not be 64 threads.\n"
"\n"
"    load   HSET user<n> field0 v0 ... field<F-1> v<F-1> for every record\n"
"           (YCSB's binding uses the equivalent HMSET; it also keeps a sorted\n"
"           set \"_indices\" for scans, which is not done here).\n"
"    run    operations are drawn from the workload mix:\n"
"             read    HGETALL user<n>   (YCSB readallfields=true)\n"
"                     or HGET user<n> field<i> with --read-one\n"
"             update  HSET user<n> field<i> value (writeallfields=false)\n"
"                     or HSET of all fields with --write-all\n"
"             rmw     read, then update of the same record, timed as one op\n"
"           The record is chosen with YCSB's scrambled Zipfian generator\n"
"           (constant 0.99, FNV-scrambled) or uniformly; the field uniformly.\n"
"\n"
"WORKLOADS\n"
"    A  50%% read, 50%% update           B  95%% read, 5%% update\n"
"    C  100%% read                      F  50%% read, 50%% read-modify-write\n"
"    --update-pct P overrides the mix: (100-P)%% read, P%% update (name U<P>).\n"
"    Workloads D and E (inserts, scans) are not supported.\n"
"\n"
"OPTIONS\n"
"    --host HOST            server host (default 127.0.0.1)\n"
"    -p, --port PORT        server port (default 6379)\n"
"    --socket PATH          connect to a unix socket instead of TCP\n"
"    --auth PASSWORD        send AUTH after connecting\n"
"    -c, --clients N        client connections, 1..%d (default 1)\n"
"    -t, --threads T        threads driving the clients, 1..%d (default 2;\n"
"                           never more than --clients)\n"
"    -w, --workload W       A, B, C or F (default A)\n"
"    --update-pct P         custom mix: P%% updates, the rest reads (0..100)\n"
"    -r, --recordcount N    records (default 1000); run must use the value\n"
"                           given to load\n"
"    --insertstart N        first record number (default 0)\n"
"    -n, --operationcount N run: stop after N operations (default 1000 if\n"
"                           --seconds is not given, else unlimited)\n"
"    -s, --seconds S        run: stop after S seconds (may be fractional)\n"
"    --target OPS           run: pace the clients at OPS operations per second\n"
"                           in all (YCSB's -target): each connection starts\n"
"                           an operation every clients/OPS seconds, never\n"
"                           more than one at a time (one that falls behind\n"
"                           starts its next operations at once). Latencies\n"
"                           count from sending, as without --target (YCSB's\n"
"                           measurement.interval=op); the keys\n"
"                           intended_p99_us and intended_p999_us count from\n"
"                           each operation's intended start instead, so a\n"
"                           stall that delays later operations shows in\n"
"                           theirs too (measurement.interval=intended), and\n"
"                           so does the generator's own lateness. Operations\n"
"                           due before the run ended that never started\n"
"                           count there too, with the time from their\n"
"                           intended start to the end (the least they\n"
"                           waited); intended_ops counts every operation\n"
"                           in that histogram, intended_unstarted those.\n"
"    --distribution D       zipfian (default) or uniform\n"
"    --read-one             reads are HGET of one random field\n"
"    --write-all            updates write all fields\n"
"    --fieldcount F         fields per record, 1..%d (default 10)\n"
"    --fieldlength L        bytes per field value, 1..4000 (default 100)\n"
"    --insertorder O        hashed (default) or ordered (key user<n>)\n"
"    --flush                FLUSHALL before loading (erases the server!)\n"
"    --check                verify every value read: each value encodes its\n"
"                           record, field and version (\"K<n>.F<i>.V<v>.\" +\n"
"                           filler derived from them); a read must return,\n"
"                           for every field, a complete value that some\n"
"                           write produced. Needs --fieldlength >= 48.\n"
"                           Failures count as errors and are printed.\n"
"    --seed N               random seed (default: from the clock)\n"
"    --progress S           progress line to stderr every S s (default 2;\n"
"                           0 = none)\n"
"    --timeout S            per-request timeout in seconds (default 10); a\n"
"                           connection whose request times out is dropped\n"
"    --json FILE            also write the results as JSON to FILE (- for\n"
"                           stdout, which then gets only the JSON)\n"
"    --help                 this text\n"
"\n"
"OUTPUT\n"
"    For each phase, on stdout: a header line (#), a table with one row per\n"
"    operation type and a TOTAL row (count, throughput, latency mean, p50,\n"
"    p95, p99, p99.9 and max in microseconds, errors), then one line of\n"
"    key=value pairs for scripts, starting with\n"
"      workload= clients= ops= seconds= ops_per_sec= p50_us= p99_us= errors=\n"
"    followed by more keys (phase, threads, mean_us, p95_us, p999_us, max_us,\n"
"    check_failures, <op>_ops, <op>_p99_us). Latencies are from sending the\n"
"    request to parsing the whole reply, in a log-bucket histogram with under\n"
"    1%% relative error (percentiles report the bucket's upper bound). Only\n"
"    successful operations enter the latency figures and ops. An RMW counts\n"
"    as one operation (YCSB also counts its read and update under READ and\n"
"    UPDATE; this tool does not).\n"
"\n"
"    Where /proc/thread-self/schedstat is readable (Linux), a comment line\n"
"    and two more keys describe the generator's own threads over the phase:\n"
"      client_wait_pct      time its threads were runnable but waiting for a\n"
"                           CPU, as a percentage of (threads x run time)\n"
"      client_cpu_us_per_op CPU time of its threads per operation\n"
"    When the generator shares CPUs with the server, a thread that waits for\n"
"    a CPU holds back the replies of all its connections, and that wait is\n"
"    part of their measured latency: a high client_wait_pct says the tail\n"
"    latencies include the load generator's own queueing.\n"
"\n"
"EXIT STATUS\n"
"    0 success; 1 the phase completed with errors (failed operations, check\n"
"    failures, dropped connections); 2 cannot connect or the server refused\n"
"    setup; 64 bad arguments; 3 internal failure. SIGINT/SIGTERM stop the\n"
"    run early and still print results.\n"
"\n"
"EXAMPLES\n"
"    " PROG " load -r 100000 -c 8 --flush\n"
"    " PROG " run -r 100000 -w A -c 32 -s 30\n"
"    " PROG " both -r 1000 -w F -c 8 -s 2 --check\n"
"    " PROG " run -r 100000 --update-pct 10 --distribution uniform -c 16 -n 1000000\n",
        MAX_CLIENTS, MAX_THREADS, MAX_FIELDS);
}

static uint64_t arg_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') die(64, "%s: expected a number from %" PRIu64 " to %" PRIu64 ", got \"%s\"", opt, lo, hi, s ? s : "");
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        die(64, "%s: expected a number from %" PRIu64 " to %" PRIu64 ", got \"%s\"", opt, lo, hi, s);
    return v;
}

static double arg_double(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !*s || *end || !(v >= lo && v <= hi))
        die(64, "%s: expected a number from %g to %g, got \"%s\"", opt, lo, hi, s);
    return v;
}

static void parse_args(int argc, char **argv)
{
    enum {
        O_HOST = 256, O_SOCKET, O_AUTH, O_UPDPCT, O_INSSTART, O_DIST, O_READONE, O_WRITEALL, O_FCOUNT, O_FLEN,
        O_ORDER, O_FLUSH, O_CHECK, O_SEED, O_PROGRESS, O_TIMEOUT, O_JSON, O_TARGET, O_HELP
    };
    static const struct option lo[] = {
        {"host", required_argument, 0, O_HOST},         {"port", required_argument, 0, 'p'},
        {"socket", required_argument, 0, O_SOCKET},     {"auth", required_argument, 0, O_AUTH},
        {"clients", required_argument, 0, 'c'},         {"threads", required_argument, 0, 't'},
        {"workload", required_argument, 0, 'w'},        {"update-pct", required_argument, 0, O_UPDPCT},
        {"recordcount", required_argument, 0, 'r'},     {"insertstart", required_argument, 0, O_INSSTART},
        {"operationcount", required_argument, 0, 'n'},  {"seconds", required_argument, 0, 's'},
        {"distribution", required_argument, 0, O_DIST}, {"read-one", no_argument, 0, O_READONE},
        {"write-all", no_argument, 0, O_WRITEALL},      {"fieldcount", required_argument, 0, O_FCOUNT},
        {"fieldlength", required_argument, 0, O_FLEN},  {"insertorder", required_argument, 0, O_ORDER},
        {"flush", no_argument, 0, O_FLUSH},             {"check", no_argument, 0, O_CHECK},
        {"seed", required_argument, 0, O_SEED},         {"progress", required_argument, 0, O_PROGRESS},
        {"timeout", required_argument, 0, O_TIMEOUT},   {"json", required_argument, 0, O_JSON},
        {"target", required_argument, 0, O_TARGET},
        {"help", no_argument, 0, O_HELP},               {0, 0, 0, 0},
    };
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { help(); exit(0); }
    if (argc < 2 || argv[1][0] == '-') { usage_short(); die(64, "missing command (load, run, both or ping)"); }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "load")) cfg.phase = PH_LOAD;
    else if (!strcmp(cmd, "run")) cfg.phase = PH_RUN;
    else if (!strcmp(cmd, "both")) cfg.phase = PH_BOTH;
    else if (!strcmp(cmd, "ping")) cfg.phase = PH_PING;
    else { usage_short(); die(64, "unknown command \"%s\" (load, run, both or ping)", cmd); }

    bool have_ops = false, have_workload = false, have_seed = false;
    int updpct = -1;
    optind = 2;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, ":p:c:t:w:r:n:s:", lo, NULL)) != -1) {
        switch (o) {
        case O_HOST: cfg.host = optarg; break;
        case 'p': arg_u64("--port", optarg, 1, 65535); cfg.port = optarg; break;
        case O_SOCKET: cfg.socket_path = optarg; break;
        case O_AUTH: cfg.auth = optarg; break;
        case 'c': cfg.clients = (int)arg_u64("--clients", optarg, 1, MAX_CLIENTS); break;
        case 't': cfg.threads = (int)arg_u64("--threads", optarg, 1, MAX_THREADS); break;
        case 'w': {
            char w = (char)(optarg[0] & ~0x20);
            if (strlen(optarg) != 1 || !strchr("ABCF", w))
                die(64, "--workload: expected A, B, C or F, got \"%s\" (D and E are not supported)", optarg);
            cfg.workload[0] = w;
            cfg.workload[1] = 0;
            have_workload = true;
            break;
        }
        case O_UPDPCT: updpct = (int)arg_u64("--update-pct", optarg, 0, 100); break;
        case 'r': cfg.recordcount = arg_u64("--recordcount", optarg, 1, (uint64_t)1 << 40); break;
        case O_INSSTART: cfg.insertstart = arg_u64("--insertstart", optarg, 0, (uint64_t)1 << 50); break;
        case 'n': cfg.operationcount = arg_u64("--operationcount", optarg, 1, UINT64_MAX / 2); have_ops = true; break;
        case 's': cfg.seconds = arg_double("--seconds", optarg, 0.001, 1e7); break;
        case O_DIST:
            if (!strcmp(optarg, "zipfian")) cfg.dist = DIST_ZIPFIAN;
            else if (!strcmp(optarg, "uniform")) cfg.dist = DIST_UNIFORM;
            else die(64, "--distribution: expected zipfian or uniform, got \"%s\"", optarg);
            break;
        case O_READONE: cfg.read_one = true; break;
        case O_WRITEALL: cfg.write_all = true; break;
        case O_FCOUNT: cfg.fieldcount = (int)arg_u64("--fieldcount", optarg, 1, MAX_FIELDS); break;
        case O_FLEN: cfg.fieldlength = (int)arg_u64("--fieldlength", optarg, 1, 4000); break;
        case O_ORDER:
            if (!strcmp(optarg, "hashed")) cfg.ordered = false;
            else if (!strcmp(optarg, "ordered")) cfg.ordered = true;
            else die(64, "--insertorder: expected hashed or ordered, got \"%s\"", optarg);
            break;
        case O_FLUSH: cfg.flush = true; break;
        case O_CHECK: cfg.check = true; break;
        case O_SEED: cfg.seed = arg_u64("--seed", optarg, 0, UINT64_MAX); have_seed = true; break;
        case O_PROGRESS: cfg.progress = arg_double("--progress", optarg, 0, 1e6); break;
        case O_TIMEOUT: cfg.timeout = arg_double("--timeout", optarg, 0.01, 1e6); break;
        case O_TARGET: cfg.target = arg_double("--target", optarg, 1, 1e9); break;
        case O_JSON: cfg.json = optarg; break;
        case ':': usage_short(); die(64, "option %s needs a value", argv[optind - 1]);
        default: usage_short(); die(64, "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) { usage_short(); die(64, "unexpected argument \"%s\"", argv[optind]); }
    if (updpct >= 0 && have_workload) die(64, "give either --workload or --update-pct, not both");
    if (updpct >= 0) {
        snprintf(cfg.workload, sizeof cfg.workload, "U%d", updpct);
        cfg.p_update = updpct / 100.0;
        cfg.p_read = 1.0 - cfg.p_update;
        cfg.p_rmw = 0;
    } else {
        switch (cfg.workload[0]) {
        case 'A': cfg.p_read = 0.5; cfg.p_update = 0.5; cfg.p_rmw = 0; break;
        case 'B': cfg.p_read = 0.95; cfg.p_update = 0.05; cfg.p_rmw = 0; break;
        case 'C': cfg.p_read = 1.0; cfg.p_update = 0; cfg.p_rmw = 0; break;
        case 'F': cfg.p_read = 0.5; cfg.p_update = 0; cfg.p_rmw = 0.5; break;
        }
    }
    if (!have_ops && cfg.seconds == 0) cfg.operationcount = 1000;
    if (cfg.check && cfg.fieldlength < 48) die(64, "--check needs --fieldlength >= 48 (values carry a header)");
    if (cfg.socket_path && strcmp(cfg.host, "127.0.0.1") != 0) die(64, "give either --host or --socket, not both");
    if (cfg.threads > cfg.clients) cfg.threads = cfg.clients;
    if (!have_seed) cfg.seed = now_ns() ^ ((uint64_t)getpid() << 32);
    if (cfg.socket_path) snprintf(g_target, sizeof g_target, "unix:%s", cfg.socket_path);
    else if (strchr(cfg.host, ':')) snprintf(g_target, sizeof g_target, "[%s]:%s", cfg.host, cfg.port);
    else snprintf(g_target, sizeof g_target, "%s:%s", cfg.host, cfg.port);
}

static int do_ping(void)
{
    char err[1024], d[256];
    uint64_t deadline = now_ns() + (uint64_t)(cfg.timeout * 1e9);
    for (int tries = 0; tries < 1000000; tries++) {
        int fd = setup_conn(err, sizeof err);
        if (fd >= 0) {
            buf_t b = {0};
            cmd_begin(&b, 1);
            cmd_arg_s(&b, "PING");
            int rc = blocking_cmd(fd, &b, d, sizeof d, cfg.timeout);
            free(b.p);
            close(fd);
            if (rc == 0 && strcmp(d, "PONG") == 0) { printf("%s: PONG\n", g_target); return 0; }
            snprintf(err, sizeof err, "PING to %s: %.200s", g_target, rc == 0 ? "unexpected reply" : d);
            if (strstr(d, "LOADING") == NULL) break; /* server up but not answering as expected */
        }
        if (now_ns() >= deadline || g_stop) break;
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, PROG ": %s\n", err);
    return 2;
}

int main(int argc, char **argv)
{
    g_out = stdout;
    parse_args(argc, argv);
    for (int f = 0; f < cfg.fieldcount; f++)
        g_field_name_len[f] = snprintf(g_field_names[f], sizeof g_field_names[f], "field%d", f);
    zipf_init();
    {
        uint64_t vs = cfg.seed ^ 0x5DEECE66Dull;
        atomic_store(&g_version, (splitmix64(&vs) >> 24) << 20); /* random base < 2^60 */
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (cfg.phase == PH_PING) return do_ping();

    /* one setup connection: checks that a Redis answers, and --flush */
    {
        char err[1024], d[256];
        int fd = setup_conn(err, sizeof err);
        if (fd < 0) die(2, "%s", err);
        buf_t b = {0};
        cmd_begin(&b, 1);
        cmd_arg_s(&b, "PING");
        if (blocking_cmd(fd, &b, d, sizeof d, cfg.timeout) != 0 || strcmp(d, "PONG") != 0)
            die(2, "%s does not answer PING with PONG: %s", g_target, d);
        if (cfg.flush && cfg.phase != PH_RUN) {
            b.len = 0;
            cmd_begin(&b, 1);
            cmd_arg_s(&b, "FLUSHALL");
            if (blocking_cmd(fd, &b, d, sizeof d, cfg.timeout * 10 + 60) != 0) die(2, "FLUSHALL failed: %s", d);
        }
        free(b.p);
        close(fd);
    }

    FILE *jf = NULL;
    if (cfg.json) {
        if (strcmp(cfg.json, "-") == 0) {
            jf = stdout;
            g_out = stderr; /* stdout carries only the JSON */
        } else if (!(jf = fopen(cfg.json, "w"))) {
            die(64, "--json: cannot open %s: %s", cfg.json, strerror(errno));
        }
    }

    int status = 0;
    bool first = true;
    if (jf) fprintf(jf, "[");
    enum phase phases[2];
    int np = 0;
    if (cfg.phase == PH_LOAD || cfg.phase == PH_BOTH) phases[np++] = PH_LOAD;
    if (cfg.phase == PH_RUN || cfg.phase == PH_BOTH) phases[np++] = PH_RUN;
    for (int i = 0; i < np && !g_stop; i++) {
        result_t res;
        run_phase(phases[i], &res);
        const char *name = phases[i] == PH_LOAD ? "load" : "run";
        print_phase(name, &res);
        if (jf) json_phase(jf, name, &res, first);
        first = false;
        if (g_stop) fprintf(stderr, PROG ": interrupted; the results above cover the %.3f s before the signal\n", res.seconds);
        if (res.errors_total) status = 1;
        free_result(&res);
        if (phases[i] == PH_LOAD && res.errors_total) break;
    }
    if (jf) {
        fprintf(jf, "]\n");
        if (jf != stdout) fclose(jf);
    }
    return status;
}
