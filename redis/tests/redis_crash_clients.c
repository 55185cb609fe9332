/* redis_crash_clients -- concurrent Redis clients for the crash test
 * (redis/tests/crash_test.py, docs/redis.md).
 *
 *   redis_crash_clients run  --port P --epoch E --dir D [options]
 *   redis_crash_clients dump --port P --epoch E --dir D [options]
 *
 * run: N threads, one connection each, race on a small shared key set:
 *   - string registers k0..k<K-1>: SET, GET, DEL/UNLINK;
 *   - hash-field registers f0..f<F-1> of hashes h0..h<H-1>: HSET, HGET, HDEL;
 *   - counters c0..c<C-1>: INCR;
 *   - transaction pairs 0..P-1 (string ta<i> and field t<i> of hash th), one
 *     register each: MULTI SET ta<i> v; HSET th t<i> v; EXEC (write),
 *     MULTI DEL ta<i>; HDEL th t<i>; EXEC (delete), MULTI GET; HGET; EXEC
 *     (read: both nil, or both the same value, else "torn");
 *   - TTL registers x0..x<X-1>: SET x v PX <long> (--long-px, 1 h), plain SET
 *     (no TTL), GET, DEL;
 *   - short-TTL keys s0..s<S-1>: SET s v PX 1..M ms (--short-px-max) or
 *     MULTI SET s v; PEXPIRE s 1..M; EXEC; GET (a value must not be torn);
 *   - lists l0..l<L-1>: RPUSH of a unique value;
 *   - job queues, each served while blocked (handleClientsBlockedOnKeys):
 *     lists q0..q<Q-1> (RPUSH of a unique value, or BLMOVE q<j> qd<j> LEFT
 *     RIGHT), sorted sets zq<j> (ZADD, or BZPOPMIN) and streams sq<j> with
 *     consumer group g (XADD, or XREADGROUP COUNT 1 ... >, which adds the
 *     entry to the group's pending list), all with a 20 ms timeout, so a
 *     thread often waits blocked and another thread's push serves it.
 *   MULTI/EXEC commands are sent in one write (pipelined). A thread stops at
 *   the first connection error (the server was killed), at an error or
 *   unexpected reply, or after --seconds. Each thread writes:
 *   - D/client-<E>-<i>.log: the history in the format of the Porcupine checker
 *     (tests/linearizability): "I <opid> <client> <key> <PUT|GET> <value-id>
 *     <t_ns>" before the command is sent, "R <opid> <value-id|0|torn> <t_ns>"
 *     after its reply; CLOCK_MONOTONIC. A command whose connection broke
 *     before the reply has no R line (outcome unknown). Every string key,
 *     hash field, transaction pair and TTL register is one register (history
 *     key: k<n> n, h<h>.f<f> 1000+100h+f, pair i 20000+i, x<i> 30000+i); a
 *     delete is a PUT of 0 (nil). INCR, short-TTL keys and lists are not in
 *     the history (checked by the driver from the ack log). File name: the
 *     checker's "process" is the server epoch E (the clients outlive the
 *     server they talk to).
 *   - D/ack-<E>-<i>.log: lines written before a command is sent:
 *     "N INCR <counter>", "X <hkey> <value-id> <px> <wall_ms>" (a write of a
 *     TTL register, px 0: no TTL; CLOCK_REALTIME ms before sending),
 *     "P <list> <value-id> <t_ns>" (an RPUSH), "Q <queue> <value-id> <t_ns>"
 *     (a push to a queue), "Z <zq> <value-id> <t_ns>" (a ZADD), "Y <zq>" (a
 *     BZPOPMIN; "T <zq>" after it if it timed out), "S <sq> <value-id>
 *     <t_ns>" (an XADD); and one line per acknowledged
 *     write: "A SET <key> <value-id>", "A HSET <hash> <field> <value-id>",
 *     "A DEL <key>", "A HDEL <hash> <field>", "A MULTI <pair> <value-id>",
 *     "A MULTIDEL <pair>", "A SETX <hkey> <value-id> <wall_ms>" (after the
 *     reply), "A SETS <key> <value-id>", "A INCR <counter> <result>",
 *     "A RPUSH <list> <value-id> <length> <t_ns>", "A QPUSH <queue> <value-id>",
 *     "A QMOVE <queue> <value-id>" (a BLMOVE that moved that element to
 *     qd<j>), "A ZPUSH <zq> <value-id>", "A ZPOP <zq> <value-id>",
 *     "A XADD <sq> <value-id> <entry-id>", "A XREAD <sq> <entry-id>
 *     <value-id>" (an entry delivered to the group).
 * dump: one connection reads every register (logged as history, client index
 *   999, epoch E), counter, short-TTL key and list, and prints on stdout:
 *   "reg <hkey> <value-id|0|torn> [detail]", "ttl <hkey> <pexpiretime>",
 *   "ctr <name> <value>", "short <name> <value-id|0|torn> <pttl>",
 *   "list <name> <n> <value-id|torn>...", "queue <q> <n> <value-id|torn>..."
 *   and "moved <q> <n> <value-id|torn>..." (the queue q<j> and its
 *   destination qd<j>), "zset <zq> <n> <value-id|torn>...", "stream <sq> <n>
 *   <entry-id>:<value-id|torn>...", "group <sq> <last-delivered-id|none>",
 *   "pending <sq> <n> <entry-id>...", "keys <name>..." (KEYS *, after
 *   the short-TTL keys were read) and "dbsize <n>".
 *
 * Value ids are E<<40 | client<<32 | n (unique; 0 is "never written"); the
 * stored value is "<id>-" followed by id%61 bytes of 'a'+id%26, so that a
 * value no SET wrote (torn, mixed) is recognised.
 *
 * Options: --clients N (4) --keys K (8) --hashes H (2) --fields F (4)
 *   --counters C (2) --pairs P (4) --ttl-keys X (4) --short-keys S (16)
 *   --lists L (2) --queues Q (1) --long-px MS (3600000) --short-px-max MS (50)
 *   --seconds S (30) --think-us U (100: random pause 0..2U between commands)
 *   --seed X. Exit status: 0, 1 on an error reply or bad reply, 2 usage or
 *   setup error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int opt_port, opt_epoch = -1, opt_clients = 4, opt_keys = 8, opt_hashes = 2, opt_fields = 4,
           opt_counters = 2, opt_pairs = 4, opt_ttl_keys = 4, opt_short_keys = 16, opt_lists = 2, opt_queues = 1,
           opt_think_us = 100;
static long long opt_long_px = 3600000, opt_short_px_max = 50;
static double opt_seconds = 30;
static const char *opt_dir;
static uint64_t opt_seed;
static atomic_int bad_replies;

#define HKEY_HASH_BASE 1000 /* history key of field f of hash h: 1000 + 100*h + f */
#define HKEY_PAIR_BASE 20000
#define HKEY_TTL_BASE 30000
#define DUMP_CLIENT 999
#define TORN UINT64_MAX

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Wall clock in ms, as Redis's mstime(); round up for an upper bound. */
static long long wall_ms(int round_up) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + (round_up && ts.tv_nsec % 1000000 ? 1 : 0);
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- minimal RESP client ---- */

typedef struct {
    int fd;
    char buf[65536];
    size_t len, pos;
} conn_t;

static int conn_open(conn_t *c) {
    c->len = c->pos = 0;
    for (int attempt = 0; attempt < 40; attempt++) { /* up to ~2 s */
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (c->fd < 0)
            return -1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)opt_port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(c->fd, (struct sockaddr *)&a, sizeof a) == 0) {
            int one = 1;
            setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            struct timeval tv = {.tv_sec = 10}; /* a hung server: treat as broken */
            setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            return 0;
        }
        close(c->fd);
        c->fd = -1;
        usleep(50000);
    }
    return -1;
}

/* Commands to send in one write (a MULTI ... EXEC block is pipelined). */
typedef struct {
    char out[8192];
    size_t n;
    int count;
} cmdbuf_t;

/* Appends one command; its arguments are NUL-terminated strings. */
static void cmd_add(cmdbuf_t *b, int argc, const char **argv) {
    b->n += (size_t)snprintf(b->out + b->n, sizeof b->out - b->n, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        b->n += (size_t)snprintf(b->out + b->n, sizeof b->out - b->n, "$%zu\r\n", len);
        if (b->n + len + 2 >= sizeof b->out) {
            fprintf(stderr, "command too long\n");
            exit(2);
        }
        memcpy(b->out + b->n, argv[i], len);
        b->n += len;
        b->out[b->n++] = '\r';
        b->out[b->n++] = '\n';
    }
    b->count++;
}

#define CMD(b, ...)                                                                                        \
    do {                                                                                                   \
        const char *argv_[] = {__VA_ARGS__};                                                               \
        cmd_add((b), (int)(sizeof argv_ / sizeof argv_[0]), argv_);                                        \
    } while (0)

/* Sends the buffered commands and empties the buffer. 0 ok, -1 connection error. */
static int cmd_send(conn_t *c, cmdbuf_t *b) {
    for (size_t off = 0; off < b->n;) {
        ssize_t w = send(c->fd, b->out + off, b->n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    b->n = 0;
    b->count = 0;
    return 0;
}

static int fill(conn_t *c) {
    if (c->pos > 0) {
        memmove(c->buf, c->buf + c->pos, c->len - c->pos);
        c->len -= c->pos;
        c->pos = 0;
    }
    if (c->len == sizeof c->buf)
        return -1;
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c->len += (size_t)r;
        return 0;
    }
}

/* Reads one line (without CRLF) into *line; -1 on connection error. */
static int read_line(conn_t *c, char **line, size_t *n) {
    for (;;) {
        char *p = memchr(c->buf + c->pos, '\n', c->len - c->pos);
        if (p && p > c->buf + c->pos && p[-1] == '\r') {
            *line = c->buf + c->pos;
            *n = (size_t)(p - 1 - (c->buf + c->pos));
            p[-1] = 0;
            c->pos = (size_t)(p + 1 - c->buf);
            return 0;
        }
        if (fill(c) < 0)
            return -1;
    }
}

enum { REP_STATUS, REP_ERROR, REP_INT, REP_BULK, REP_NIL, REP_ARRAY };
typedef struct {
    int type;
    long long integer; /* REP_INT; REP_ARRAY: the element count (-1: nil array) */
    char str[2048];    /* status, error or bulk (truncated past the end: then 'bad') */
    size_t len;
    int bad;
} reply_t;

/* Reads one reply; of an array only the header (the elements follow as
 * replies of their own). -1 on connection error. */
static int read_reply(conn_t *c, reply_t *r) {
    char *line;
    size_t n;
    r->bad = 0;
    r->len = 0;
    r->str[0] = 0;
    if (read_line(c, &line, &n) < 0)
        return -1;
    switch (line[0]) {
    case '+':
    case '-':
        r->type = line[0] == '+' ? REP_STATUS : REP_ERROR;
        r->len = n - 1 < sizeof r->str - 1 ? n - 1 : sizeof r->str - 1;
        memcpy(r->str, line + 1, r->len);
        r->str[r->len] = 0;
        return 0;
    case ':':
        r->type = REP_INT;
        r->integer = strtoll(line + 1, NULL, 10);
        return 0;
    case '*':
        r->type = REP_ARRAY;
        r->integer = strtoll(line + 1, NULL, 10);
        return 0;
    case '$': {
        long long blen = strtoll(line + 1, NULL, 10);
        if (blen < 0) {
            r->type = REP_NIL;
            return 0;
        }
        r->type = REP_BULK;
        size_t need = (size_t)blen + 2;
        while (c->len - c->pos < need) {
            if (need > sizeof c->buf)
                return -1;
            if (fill(c) < 0)
                return -1;
        }
        if ((size_t)blen >= sizeof r->str)
            r->bad = 1;
        r->len = (size_t)blen < sizeof r->str - 1 ? (size_t)blen : sizeof r->str - 1;
        memcpy(r->str, c->buf + c->pos, r->len);
        r->str[r->len] = 0;
        c->pos += need;
        return 0;
    }
    default:
        r->type = REP_ERROR;
        snprintf(r->str, sizeof r->str, "unexpected reply type '%c'", line[0]);
        r->len = strlen(r->str);
        return 0;
    }
}

/* ---- values ---- */

static size_t make_value(uint64_t id, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "%" PRIu64 "-", id);
    size_t pad = (size_t)(id % 61);
    memset(out + n, 'a' + (int)(id % 26), pad);
    n += pad;
    out[n] = 0;
    return n;
}

/* Value id of a GET/HGET reply: 0 nil, TORN not a value any SET wrote. */
static uint64_t parse_value(const reply_t *r) {
    if (r->type == REP_NIL)
        return 0;
    if (r->type != REP_BULK || r->bad)
        return TORN;
    char *end;
    errno = 0;
    uint64_t id = strtoull(r->str, &end, 10);
    if (errno || end == r->str || *end != '-' || id == 0)
        return TORN;
    char expect[256];
    size_t n = make_value(id, expect, sizeof expect);
    if (n != r->len || memcmp(expect, r->str, n) != 0)
        return TORN;
    return id;
}

static void log_result(FILE *h, uint64_t opid, uint64_t v, uint64_t t) {
    if (v == TORN)
        fprintf(h, "R %" PRIu64 " torn %" PRIu64 "\n", opid, t);
    else
        fprintf(h, "R %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", opid, v, t);
}

static void print_value(FILE *f, uint64_t v) {
    if (v == TORN)
        fputs("torn", f);
    else
        fprintf(f, "%" PRIu64, v);
}

static FILE *open_log(const char *kind, int idx) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%d-%d.log", opt_dir, kind, opt_epoch, idx);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    setvbuf(f, NULL, _IOFBF, 1 << 16); /* the clients are not killed: flushed at exit */
    return f;
}

/* ---- run ---- */

typedef struct {
    int idx;
    pthread_t tid;
    uint64_t ops, acked, broken;
} worker_t;

/* One client thread's state. */
typedef struct {
    worker_t *w;
    FILE *h, *ack;
    conn_t *c;
    reply_t *r;
    cmdbuf_t b;
    uint64_t client, opid, seq, rng;
    const char *what; /* the command, for messages */
} ctx_t;

enum { OP_OK = 0, OP_BROKEN = -1, OP_BAD = 1 };

static uint64_t new_vid(ctx_t *x) {
    return ((uint64_t)opt_epoch << 40) | ((uint64_t)(x->w->idx & 0xff) << 32) | ++x->seq;
}

static uint64_t hist_inv(ctx_t *x, uint64_t hkey, int put, uint64_t vid) {
    uint64_t my = ++x->opid;
    fprintf(x->h, "I %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %" PRIu64 " %" PRIu64 "\n", my, x->client, hkey,
            put ? "PUT" : "GET", vid, now_ns());
    return my;
}

static int bad(ctx_t *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "client %d: %s: ", x->w->idx, x->what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    atomic_fetch_add(&bad_replies, 1);
    return OP_BAD;
}

/* Sends the buffered commands; OP_BROKEN if the connection broke. */
static int send_buf(ctx_t *x) {
    x->w->ops++;
    return cmd_send(x->c, &x->b) < 0 ? OP_BROKEN : OP_OK;
}

/* Reads one reply of the given type (REP_STATUS: "OK" or "QUEUED" as
 * status; -1: any). An error reply or another type is OP_BAD (treated as of
 * unknown outcome: no R line). */
static int expect(ctx_t *x, int type, const char *status) {
    if (read_reply(x->c, x->r) < 0)
        return OP_BROKEN;
    if (x->r->type == REP_ERROR)
        return bad(x, "error reply: %s", x->r->str);
    if (type >= 0 && x->r->type != type)
        return bad(x, "unexpected reply type %d (want %d)", x->r->type, type);
    if (status && strcmp(x->r->str, status) != 0)
        return bad(x, "unexpected status %s (want %s)", x->r->str, status);
    return OP_OK;
}

/* Reads the replies of MULTI, n queued commands and the header of EXEC's
 * array of n replies. */
static int expect_exec(ctx_t *x, int n) {
    int rc = expect(x, REP_STATUS, "OK");
    for (int i = 0; i < n && rc == OP_OK; i++)
        rc = expect(x, REP_STATUS, "QUEUED");
    if (rc == OP_OK)
        rc = expect(x, REP_ARRAY, NULL);
    if (rc == OP_OK && x->r->integer != n)
        return bad(x, "EXEC returned %lld replies, want %d", x->r->integer, n);
    return rc;
}

/* A value reply (bulk or nil) into *v (TORN: not a value any write wrote). */
static int expect_value(ctx_t *x, uint64_t *v) {
    int rc = expect(x, -1, NULL);
    if (rc != OP_OK)
        return rc;
    if (x->r->type != REP_BULK && x->r->type != REP_NIL)
        return bad(x, "not a bulk reply");
    *v = parse_value(x->r);
    return OP_OK;
}

static unsigned pick100(ctx_t *x) { return (unsigned)(rng_next(&x->rng) % 100); }

/* String register k<n>: SET 45 %, GET 45 %, DEL 5 %, UNLINK 5 %. */
/* Send the command in x->b and read one reply of the expected type. */
static int roundtrip(ctx_t *x, int type, const char *status) {
    int rc = send_buf(x);
    return rc == OP_OK ? expect(x, type, status) : rc;
}

static int op_string(ctx_t *x) {
    char k[32], v[256];
    int n = (int)(rng_next(&x->rng) % (uint64_t)opt_keys);
    unsigned p = pick100(x);
    snprintf(k, sizeof k, "k%d", n);
    if (p < 45) {
        uint64_t vid = new_vid(x);
        make_value(vid, v, sizeof v);
        x->what = "SET";
        uint64_t my = hist_inv(x, (uint64_t)n, 1, vid);
        CMD(&x->b, "SET", k, v);
        int rc = roundtrip(x, REP_STATUS, "OK");
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A SET %s %" PRIu64 "\n", k, vid);
    } else if (p < 90) {
        x->what = "GET";
        uint64_t my = hist_inv(x, (uint64_t)n, 0, 0), got = 0;
        CMD(&x->b, "GET", k);
        int rc = send_buf(x);
        if (rc == OP_OK)
            rc = expect_value(x, &got);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, got, now_ns());
        return OP_OK;
    } else {
        x->what = p < 95 ? "DEL" : "UNLINK";
        uint64_t my = hist_inv(x, (uint64_t)n, 1, 0);
        CMD(&x->b, x->what, k);
        int rc = roundtrip(x, REP_INT, NULL);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A DEL %s\n", k);
    }
    x->w->acked++;
    return OP_OK;
}

/* Hash-field register h<i>.f<j>: HSET 45 %, HGET 45 %, HDEL 10 %. */
static int op_hash(ctx_t *x) {
    char k[32], f[32], v[256];
    int hh = (int)(rng_next(&x->rng) % (uint64_t)opt_hashes);
    int ff = (int)(rng_next(&x->rng) % (uint64_t)opt_fields);
    unsigned p = pick100(x);
    uint64_t hkey = HKEY_HASH_BASE + 100 * (uint64_t)hh + (uint64_t)ff;
    snprintf(k, sizeof k, "h%d", hh);
    snprintf(f, sizeof f, "f%d", ff);
    if (p < 45) {
        uint64_t vid = new_vid(x);
        make_value(vid, v, sizeof v);
        x->what = "HSET";
        uint64_t my = hist_inv(x, hkey, 1, vid);
        CMD(&x->b, "HSET", k, f, v);
        int rc = roundtrip(x, REP_INT, NULL);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A HSET %s %s %" PRIu64 "\n", k, f, vid);
    } else if (p < 90) {
        x->what = "HGET";
        uint64_t my = hist_inv(x, hkey, 0, 0), got = 0;
        CMD(&x->b, "HGET", k, f);
        int rc = send_buf(x);
        if (rc == OP_OK)
            rc = expect_value(x, &got);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, got, now_ns());
        return OP_OK;
    } else {
        x->what = "HDEL";
        uint64_t my = hist_inv(x, hkey, 1, 0);
        CMD(&x->b, "HDEL", k, f);
        int rc = roundtrip(x, REP_INT, NULL);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A HDEL %s %s\n", k, f);
    }
    x->w->acked++;
    return OP_OK;
}

static int op_incr(ctx_t *x) {
    char k[32];
    snprintf(k, sizeof k, "c%d", (int)(rng_next(&x->rng) % (uint64_t)opt_counters));
    x->what = "INCR";
    fprintf(x->ack, "N INCR %s\n", k);
    CMD(&x->b, "INCR", k);
    int rc = roundtrip(x, REP_INT, NULL);
    if (rc != OP_OK)
        return rc;
    fprintf(x->ack, "A INCR %s %lld\n", k, x->r->integer);
    x->w->acked++;
    return OP_OK;
}

/* Transaction pair i (string ta<i>, field t<i> of hash th), one register:
 * MULTI write 45 %, MULTI read 45 %, MULTI delete 10 %. */
static int op_pair(ctx_t *x) {
    char ka[32], f[32], v[256];
    int i = (int)(rng_next(&x->rng) % (uint64_t)opt_pairs);
    unsigned p = pick100(x);
    uint64_t hkey = HKEY_PAIR_BASE + (uint64_t)i;
    snprintf(ka, sizeof ka, "ta%d", i);
    snprintf(f, sizeof f, "t%d", i);
    if (p < 45) {
        uint64_t vid = new_vid(x);
        make_value(vid, v, sizeof v);
        x->what = "MULTI SET HSET";
        uint64_t my = hist_inv(x, hkey, 1, vid);
        CMD(&x->b, "MULTI");
        CMD(&x->b, "SET", ka, v);
        CMD(&x->b, "HSET", "th", f, v);
        CMD(&x->b, "EXEC");
        int rc = send_buf(x);
        if (rc == OP_OK)
            rc = expect_exec(x, 2);
        if (rc == OP_OK)
            rc = expect(x, REP_STATUS, "OK");
        if (rc == OP_OK)
            rc = expect(x, REP_INT, NULL);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A MULTI %d %" PRIu64 "\n", i, vid);
    } else if (p < 90) {
        x->what = "MULTI GET HGET";
        uint64_t my = hist_inv(x, hkey, 0, 0), a = 0, b = 0;
        CMD(&x->b, "MULTI");
        CMD(&x->b, "GET", ka);
        CMD(&x->b, "HGET", "th", f);
        CMD(&x->b, "EXEC");
        int rc = send_buf(x);
        if (rc == OP_OK)
            rc = expect_exec(x, 2);
        if (rc == OP_OK)
            rc = expect_value(x, &a);
        if (rc == OP_OK)
            rc = expect_value(x, &b);
        if (rc != OP_OK)
            return rc;
        uint64_t t = now_ns();
        if (a != b) {
            fprintf(stderr, "client %d: MULTI read of pair %d: %s = ", x->w->idx, i, ka);
            print_value(stderr, a);
            fprintf(stderr, ", th.%s = ", f);
            print_value(stderr, b);
            fprintf(stderr, " (not atomic)\n");
        }
        log_result(x->h, my, a == b ? a : TORN, t);
        return OP_OK;
    } else {
        x->what = "MULTI DEL HDEL";
        uint64_t my = hist_inv(x, hkey, 1, 0);
        CMD(&x->b, "MULTI");
        CMD(&x->b, "DEL", ka);
        CMD(&x->b, "HDEL", "th", f);
        CMD(&x->b, "EXEC");
        int rc = send_buf(x);
        if (rc == OP_OK)
            rc = expect_exec(x, 2);
        if (rc == OP_OK)
            rc = expect(x, REP_INT, NULL);
        if (rc == OP_OK)
            rc = expect(x, REP_INT, NULL);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A MULTIDEL %d\n", i);
    }
    x->w->acked++;
    return OP_OK;
}

/* TTL register x<i>: SET PX <long> 50 %, SET (no TTL) 15 %, GET 30 %, DEL 5 %. */
static int op_ttl(ctx_t *x) {
    char k[32], v[256], px[32];
    int i = (int)(rng_next(&x->rng) % (uint64_t)opt_ttl_keys);
    unsigned p = pick100(x);
    uint64_t hkey = HKEY_TTL_BASE + (uint64_t)i;
    snprintf(k, sizeof k, "x%d", i);
    if (p < 65) {
        long long ms = p < 50 ? opt_long_px : 0;
        uint64_t vid = new_vid(x);
        make_value(vid, v, sizeof v);
        snprintf(px, sizeof px, "%lld", ms);
        x->what = ms ? "SET PX" : "SET (TTL register)";
        fprintf(x->ack, "X %" PRIu64 " %" PRIu64 " %lld %lld\n", hkey, vid, ms, wall_ms(0));
        uint64_t my = hist_inv(x, hkey, 1, vid);
        if (ms)
            CMD(&x->b, "SET", k, v, "PX", px);
        else
            CMD(&x->b, "SET", k, v);
        int rc = roundtrip(x, REP_STATUS, "OK");
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A SETX %" PRIu64 " %" PRIu64 " %lld\n", hkey, vid, wall_ms(1));
    } else if (p < 95) {
        x->what = "GET (TTL register)";
        uint64_t my = hist_inv(x, hkey, 0, 0), got = 0;
        CMD(&x->b, "GET", k);
        int rc = send_buf(x);
        if (rc == OP_OK)
            rc = expect_value(x, &got);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, got, now_ns());
        return OP_OK;
    } else {
        x->what = "DEL (TTL register)";
        uint64_t my = hist_inv(x, hkey, 1, 0);
        CMD(&x->b, "DEL", k);
        int rc = roundtrip(x, REP_INT, NULL);
        if (rc != OP_OK)
            return rc;
        log_result(x->h, my, 0, now_ns());
        fprintf(x->ack, "A DEL %s\n", k);
    }
    x->w->acked++;
    return OP_OK;
}

/* Short-TTL key s<i>: SET PX 1..M 40 %, MULTI SET; PEXPIRE 1..M; EXEC 30 %,
 * GET 30 % (nil or an intact value). */
static int op_short(ctx_t *x) {
    char k[32], v[256], px[32];
    int i = (int)(rng_next(&x->rng) % (uint64_t)opt_short_keys);
    unsigned p = pick100(x);
    snprintf(k, sizeof k, "s%d", i);
    snprintf(px, sizeof px, "%lld", 1 + (long long)(rng_next(&x->rng) % (uint64_t)opt_short_px_max));
    if (p < 70) {
        uint64_t vid = new_vid(x);
        make_value(vid, v, sizeof v);
        int rc;
        if (p < 40) {
            x->what = "SET PX (short)";
            CMD(&x->b, "SET", k, v, "PX", px);
            rc = send_buf(x);
            if (rc == OP_OK)
                rc = expect(x, REP_STATUS, "OK");
        } else {
            x->what = "MULTI SET PEXPIRE (short)";
            CMD(&x->b, "MULTI");
            CMD(&x->b, "SET", k, v);
            CMD(&x->b, "PEXPIRE", k, px);
            CMD(&x->b, "EXEC");
            rc = send_buf(x);
            if (rc == OP_OK)
                rc = expect_exec(x, 2);
            if (rc == OP_OK)
                rc = expect(x, REP_STATUS, "OK");
            if (rc == OP_OK)
                rc = expect(x, REP_INT, NULL);
            if (rc == OP_OK && x->r->integer != 1)
                rc = bad(x, "PEXPIRE returned %lld", x->r->integer);
        }
        if (rc != OP_OK)
            return rc;
        fprintf(x->ack, "A SETS %s %" PRIu64 "\n", k, vid);
        x->w->acked++;
        return OP_OK;
    }
    x->what = "GET (short)";
    uint64_t got = 0;
    CMD(&x->b, "GET", k);
    int rc = send_buf(x);
    if (rc == OP_OK)
        rc = expect_value(x, &got);
    if (rc == OP_OK && got == TORN)
        rc = bad(x, "%s: a value no write wrote", k);
    return rc;
}

/* Adds a new unique value to key: "<cmd> <key> <pre>... <value>" (RPUSH;
 * ZADD with a score; XADD with "*" and a field name), logged first as
 * "<sent> <key> <vid> <t_ns>" in the ack log (P: a list, Q: a list queue, Z:
 * a sorted-set queue, S: a stream queue). Its reply, of reply_type, is in
 * x->r. */
static int push_unique(ctx_t *x, const char *cmd, const char *key, const char **pre, int npre, char sent,
                       int reply_type, uint64_t *vid) {
    char v[256];
    const char *argv[5] = {cmd, key};
    int argc = 2;
    for (int i = 0; i < npre && argc < 4; i++)
        argv[argc++] = pre[i];
    argv[argc++] = v;
    *vid = new_vid(x);
    make_value(*vid, v, sizeof v);
    fprintf(x->ack, "%c %s %" PRIu64 " %" PRIu64 "\n", sent, key, *vid, now_ns());
    x->what = cmd;
    cmd_add(&x->b, argc, argv);
    return roundtrip(x, reply_type, NULL);
}

static int op_list(ctx_t *x) {
    char k[32];
    uint64_t vid;
    snprintf(k, sizeof k, "l%d", (int)(rng_next(&x->rng) % (uint64_t)opt_lists));
    int rc = push_unique(x, "RPUSH", k, NULL, 0, 'P', REP_INT, &vid);
    if (rc != OP_OK)
        return rc;
    fprintf(x->ack, "A RPUSH %s %" PRIu64 " %lld %" PRIu64 "\n", k, vid, x->r->integer, now_ns());
    x->w->acked++;
    return OP_OK;
}

/* BLMOVE q qd LEFT RIGHT with a 20 ms timeout: waits blocked when q is
 * empty, and is often served by another client's push. */
static int queue_move(ctx_t *x, const char *q, const char *qd) {
    x->what = "BLMOVE";
    CMD(&x->b, "BLMOVE", q, qd, "LEFT", "RIGHT", "0.02");
    int rc = send_buf(x);
    if (rc != OP_OK)
        return rc;
    if (read_reply(x->c, x->r) < 0)
        return OP_BROKEN;
    if (x->r->type == REP_ARRAY && x->r->integer == -1)
        return OP_OK; /* timed out while blocked: a null array */
    if (x->r->type == REP_ERROR)
        return bad(x, "error reply: %s", x->r->str);
    if (x->r->type != REP_BULK && x->r->type != REP_NIL)
        return bad(x, "not a bulk reply");
    uint64_t got = parse_value(x->r);
    if (got == TORN)
        return bad(x, "%s: moved a value no push wrote", q);
    if (got) { /* nil: the queue was empty (not blocked: a BLMOVE in MULTI) */
        fprintf(x->ack, "A QMOVE %s %" PRIu64 "\n", q, got);
        x->w->acked++;
    }
    return OP_OK;
}

/* Sends a blocking command whose reply is an array: OP_OK with *timed_out
 * set when it timed out while blocked (a null array), else with x->r the
 * array's header. */
static int blocking_array(ctx_t *x, int *timed_out) {
    int rc = send_buf(x);
    if (rc == OP_OK)
        rc = expect(x, REP_ARRAY, NULL);
    *timed_out = rc == OP_OK && x->r->integer == -1;
    return rc;
}

/* Sorted-set job queue zq<j>: ZADD of a unique member (score: the time), or
 * BZPOPMIN with a 20 ms timeout (served while blocked by another client's
 * ZADD). Ack log: "Z <zq> <vid> <t_ns>" before a ZADD, "A ZPUSH <zq> <vid>"
 * after; "Y <zq>" before a BZPOPMIN, then "A ZPOP <zq> <vid>" or "T <zq>"
 * (timed out: nothing popped). */
static int op_zqueue(ctx_t *x, int j) {
    char q[32], score[32];
    snprintf(q, sizeof q, "zq%d", j);
    if (rng_next(&x->rng) % 2) {
        x->what = "BZPOPMIN";
        fprintf(x->ack, "Y %s\n", q);
        CMD(&x->b, "BZPOPMIN", q, "0.02");
        int timed_out, rc = blocking_array(x, &timed_out);
        if (rc != OP_OK)
            return rc;
        if (timed_out) {
            fprintf(x->ack, "T %s\n", q);
            return OP_OK;
        }
        if (x->r->integer != 3)
            return bad(x, "an array of %lld elements", x->r->integer);
        if ((rc = expect(x, REP_BULK, NULL)) != OP_OK)
            return rc;
        if (strcmp(x->r->str, q) != 0)
            return bad(x, "popped from %s", x->r->str);
        if ((rc = expect(x, -1, NULL)) != OP_OK)
            return rc;
        uint64_t got = parse_value(x->r);
        if ((rc = expect(x, REP_BULK, NULL)) != OP_OK) /* the score */
            return rc;
        if (got == 0 || got == TORN)
            return bad(x, "%s: popped a member no ZADD added", q);
        fprintf(x->ack, "A ZPOP %s %" PRIu64 "\n", q, got);
        x->w->acked++;
        return OP_OK;
    }
    uint64_t vid;
    snprintf(score, sizeof score, "%" PRIu64, now_ns() / 1000);
    const char *pre[] = {score};
    int rc = push_unique(x, "ZADD", q, pre, 1, 'Z', REP_INT, &vid);
    if (rc != OP_OK)
        return rc;
    if (x->r->integer != 1)
        return bad(x, "%s: ZADD of a new member added %lld", q, x->r->integer);
    fprintf(x->ack, "A ZPUSH %s %" PRIu64 "\n", q, vid);
    x->w->acked++;
    return OP_OK;
}

/* Stream job queue sq<j> with consumer group g (created by do_run): XADD of
 * a unique value, or XREADGROUP ... COUNT 1 BLOCK 20 ... > (served while
 * blocked by another client's XADD). Ack log: "S <sq> <vid> <t_ns>" before
 * an XADD, "A XADD <sq> <vid> <id>" after; "A XREAD <sq> <id> <vid>" for a
 * delivered entry. */
static int op_squeue(ctx_t *x, int j) {
    char q[32], me[32];
    snprintf(q, sizeof q, "sq%d", j);
    int rc;
    if (rng_next(&x->rng) % 2) {
        x->what = "XREADGROUP";
        snprintf(me, sizeof me, "c%d", x->w->idx);
        CMD(&x->b, "XREADGROUP", "GROUP", "g", me, "COUNT", "1", "BLOCK", "20", "STREAMS", q, ">");
        int timed_out;
        if ((rc = blocking_array(x, &timed_out)) != OP_OK || timed_out)
            return rc;
        /* [[q, [[id, ["v", value]]]]] */
        if (x->r->integer != 1 || (rc = expect(x, REP_ARRAY, NULL)) != OP_OK || x->r->integer != 2 ||
            (rc = expect(x, REP_BULK, NULL)) != OP_OK || strcmp(x->r->str, q) != 0 ||
            (rc = expect(x, REP_ARRAY, NULL)) != OP_OK || x->r->integer != 1 ||
            (rc = expect(x, REP_ARRAY, NULL)) != OP_OK || x->r->integer != 2)
            return rc != OP_OK ? rc : bad(x, "%s: not one entry of the stream", q);
        if ((rc = expect(x, REP_BULK, NULL)) != OP_OK)
            return rc;
        char id[64];
        snprintf(id, sizeof id, "%s", x->r->str);
        if ((rc = expect(x, REP_ARRAY, NULL)) != OP_OK || x->r->integer != 2 ||
            (rc = expect(x, REP_BULK, NULL)) != OP_OK || strcmp(x->r->str, "v") != 0 ||
            (rc = expect(x, -1, NULL)) != OP_OK)
            return rc != OP_OK ? rc : bad(x, "%s %s: not one field v", q, id);
        uint64_t got = parse_value(x->r);
        if (got == 0 || got == TORN)
            return bad(x, "%s %s: an entry no XADD added", q, id);
        fprintf(x->ack, "A XREAD %s %s %" PRIu64 "\n", q, id, got);
        x->w->acked++;
        return OP_OK;
    }
    uint64_t vid;
    const char *pre[] = {"*", "v"};
    if ((rc = push_unique(x, "XADD", q, pre, 2, 'S', REP_BULK, &vid)) != OP_OK)
        return rc;
    fprintf(x->ack, "A XADD %s %" PRIu64 " %s\n", q, vid, x->r->str);
    x->w->acked++;
    return OP_OK;
}

/* A job queue: a list (BLMOVE), a sorted set (BZPOPMIN) or a stream with a
 * consumer group (XREADGROUP), a third of the time each. */
static int op_queue(ctx_t *x) {
    char q[32], qd[32];
    int j = (int)(rng_next(&x->rng) % (uint64_t)opt_queues);
    unsigned kind = (unsigned)(rng_next(&x->rng) % 3);
    if (kind == 1)
        return op_zqueue(x, j);
    if (kind == 2)
        return op_squeue(x, j);
    snprintf(q, sizeof q, "q%d", j);
    snprintf(qd, sizeof qd, "qd%d", j);
    if (rng_next(&x->rng) % 2)
        return queue_move(x, q, qd);
    uint64_t vid;
    int rc = push_unique(x, "RPUSH", q, NULL, 0, 'Q', REP_INT, &vid);
    if (rc == OP_OK) {
        fprintf(x->ack, "A QPUSH %s %" PRIu64 "\n", q, vid);
        x->w->acked++;
    }
    return rc;
}

static void *worker(void *arg) {
    worker_t *w = arg;
    ctx_t *x = calloc(1, sizeof *x);
    x->w = w;
    x->rng = opt_seed ^ ((uint64_t)opt_epoch << 20) ^ (uint64_t)(w->idx + 1) * 0x1234567;
    x->h = open_log("client", w->idx);
    x->ack = open_log("ack", w->idx);
    x->c = calloc(1, sizeof *x->c);
    x->r = malloc(sizeof *x->r);
    x->client = (uint64_t)opt_epoch * 1000 + (uint64_t)w->idx;
    uint64_t deadline = now_ns() + (uint64_t)(opt_seconds * 1e9);
    if (conn_open(x->c) < 0) {
        fprintf(stderr, "client %d: cannot connect to port %d\n", w->idx, opt_port);
        w->broken = 1;
        goto out;
    }
    while (now_ns() < deadline) {
        if (opt_think_us > 0)
            usleep((useconds_t)(rng_next(&x->rng) % (uint64_t)(2 * opt_think_us + 1)));
        /* 35 % strings, 15 % hashes, 8 % counters, 12 % MULTI pairs, 12 % TTL
         * registers, 10 % short-TTL keys, 4 % lists, 4 % queues; a kind with
         * no keys falls back to strings. */
        unsigned pick = pick100(x);
        int rc;
        if (pick < 35)
            rc = op_string(x);
        else if (pick < 50 && opt_hashes > 0)
            rc = op_hash(x);
        else if (pick >= 50 && pick < 58 && opt_counters > 0)
            rc = op_incr(x);
        else if (pick >= 58 && pick < 70 && opt_pairs > 0)
            rc = op_pair(x);
        else if (pick >= 70 && pick < 82 && opt_ttl_keys > 0)
            rc = op_ttl(x);
        else if (pick >= 82 && pick < 92 && opt_short_keys > 0)
            rc = op_short(x);
        else if (pick >= 92 && pick < 96 && opt_lists > 0)
            rc = op_list(x);
        else if (pick >= 96 && opt_queues > 0)
            rc = op_queue(x);
        else
            rc = op_string(x);
        if (rc == OP_BROKEN)
            w->broken = 1; /* the server is gone: outcome unknown, no R line */
        if (rc != OP_OK)
            break;
    }
out:
    if (x->c->fd >= 0)
        close(x->c->fd);
    if (fclose(x->h) != 0 || fclose(x->ack) != 0) {
        perror("writing the logs");
        exit(2);
    }
    free(x->c);
    free(x->r);
    free(x);
    return NULL;
}

/* The consumer group g of each stream queue sq<j> (the stream made empty
 * if missing); BUSYGROUP after the first epoch. 0, 1 if the connection
 * broke (the server was killed: the run ends at once, as its clients
 * would), 2 on an error. A group acknowledged here and lost by a crash
 * makes the next epoch's XREADGROUPs fail with NOGROUP: bad replies. */
static int create_groups(void) {
    conn_t c;
    reply_t *r = malloc(sizeof *r);
    cmdbuf_t b = {0};
    int rc = conn_open(&c) < 0 ? 1 : 0;
    for (int j = 0; j < opt_queues && rc == 0; j++) {
        char q[32];
        snprintf(q, sizeof q, "sq%d", j);
        CMD(&b, "XGROUP", "CREATE", q, "g", "$", "MKSTREAM");
        if (cmd_send(&c, &b) < 0 || read_reply(&c, r) < 0) {
            rc = 1;
        } else if (!(r->type == REP_STATUS || (r->type == REP_ERROR && !strncmp(r->str, "BUSYGROUP", 9)))) {
            fprintf(stderr, "XGROUP CREATE %s: %s\n", q, r->str);
            rc = 2;
        }
    }
    if (c.fd >= 0)
        close(c.fd);
    free(r);
    return rc;
}

static int do_run(void) {
    int g = opt_queues > 0 ? create_groups() : 0;
    if (g == 1) {
        printf("epoch=%d clients=%d ops=0 acked_writes=0 broken=1 bad_replies=0\n", opt_epoch, opt_clients);
        return 0;
    }
    if (g != 0)
        return 2;
    worker_t *ws = calloc((size_t)opt_clients, sizeof *ws);
    for (int i = 0; i < opt_clients; i++) {
        ws[i].idx = i;
        if (pthread_create(&ws[i].tid, NULL, worker, &ws[i]) != 0) {
            perror("pthread_create");
            return 2;
        }
    }
    uint64_t ops = 0, acked = 0, broken = 0;
    for (int i = 0; i < opt_clients; i++) {
        pthread_join(ws[i].tid, NULL);
        ops += ws[i].ops;
        acked += ws[i].acked;
        broken += ws[i].broken;
    }
    printf("epoch=%d clients=%d ops=%" PRIu64 " acked_writes=%" PRIu64 " broken=%" PRIu64
           " bad_replies=%d\n",
           opt_epoch, opt_clients, ops, acked, broken, atomic_load(&bad_replies));
    free(ws);
    return atomic_load(&bad_replies) ? 1 : 0;
}

/* ---- dump ---- */

typedef struct {
    conn_t *c;
    reply_t *r;
    cmdbuf_t b;
    FILE *h;
    uint64_t client, opid;
} dump_t;

/* Sends the buffered commands and reads one reply; -1 on a connection error
 * or an error reply. */
static int dump_cmd(dump_t *d) {
    if (cmd_send(d->c, &d->b) < 0 || read_reply(d->c, d->r) < 0) {
        fprintf(stderr, "dump: connection error\n");
        return -1;
    }
    if (d->r->type == REP_ERROR) {
        fprintf(stderr, "dump: error reply: %s\n", d->r->str);
        return -1;
    }
    return 0;
}

static int dump_next(dump_t *d, int type) {
    if (read_reply(d->c, d->r) < 0) {
        fprintf(stderr, "dump: connection error\n");
        return -1;
    }
    if (d->r->type == REP_ERROR || (type >= 0 && d->r->type != type)) {
        fprintf(stderr, "dump: unexpected reply (%d) %s\n", d->r->type, d->r->str);
        return -1;
    }
    return 0;
}

/* Reads one register with the command in d->b (a value reply). */
static int dump_reg(dump_t *d, uint64_t hkey) {
    uint64_t my = ++d->opid;
    fprintf(d->h, "I %" PRIu64 " %" PRIu64 " %" PRIu64 " GET 0 %" PRIu64 "\n", my, d->client, hkey, now_ns());
    if (dump_cmd(d) < 0)
        return -1;
    uint64_t t = now_ns();
    uint64_t v = parse_value(d->r);
    log_result(d->h, my, v, t);
    printf("reg %" PRIu64 " ", hkey);
    print_value(stdout, v);
    putchar('\n');
    return 0;
}

static int dump_pair(dump_t *d, int i) {
    char ka[32], f[32];
    snprintf(ka, sizeof ka, "ta%d", i);
    snprintf(f, sizeof f, "t%d", i);
    uint64_t hkey = HKEY_PAIR_BASE + (uint64_t)i, my = ++d->opid;
    fprintf(d->h, "I %" PRIu64 " %" PRIu64 " %" PRIu64 " GET 0 %" PRIu64 "\n", my, d->client, hkey, now_ns());
    CMD(&d->b, "MULTI");
    CMD(&d->b, "GET", ka);
    CMD(&d->b, "HGET", "th", f);
    CMD(&d->b, "EXEC");
    if (dump_cmd(d) < 0 || dump_next(d, REP_STATUS) < 0 || dump_next(d, REP_STATUS) < 0 ||
        dump_next(d, REP_ARRAY) < 0 || d->r->integer != 2 || dump_next(d, -1) < 0)
        return -1;
    uint64_t a = parse_value(d->r);
    if (dump_next(d, -1) < 0)
        return -1;
    uint64_t b = parse_value(d->r), t = now_ns();
    log_result(d->h, my, a == b ? a : TORN, t);
    printf("reg %" PRIu64 " ", hkey);
    if (a == b) {
        print_value(stdout, a);
    } else {
        printf("torn %s=", ka);
        print_value(stdout, a);
        printf(",th.%s=", f);
        print_value(stdout, b);
    }
    putchar('\n');
    return 0;
}

/* Prints "<tag> <name> <n> <value-id|torn>..." for the list (LRANGE) or
 * sorted set (ZRANGE) at key. */
static int dump_range(dump_t *d, const char *range_cmd, const char *tag, const char *name, const char *key) {
    CMD(&d->b, range_cmd, key, "0", "-1");
    int rc = dump_cmd(d);
    if (rc < 0 || d->r->type != REP_ARRAY)
        return -1;
    long long n = d->r->integer;
    printf("%s %s %lld", tag, name, n);
    for (long long j = 0; j < n && rc == 0; j++) {
        if ((rc = dump_next(d, -1)) == 0) {
            putchar(' ');
            print_value(stdout, d->r->type == REP_NIL ? TORN : parse_value(d->r));
        }
    }
    putchar('\n');
    return rc;
}

/* Prints, for stream queue sq<j>: "stream <sq> <n> <id>:<value-id|torn>..."
 * (XRANGE - +), "group <sq> <last-delivered-id|none>" (XINFO GROUPS) and
 * "pending <sq> <n> <id>..." (XPENDING of group g). */
static int dump_stream(dump_t *d, const char *key) {
    CMD(&d->b, "XRANGE", key, "-", "+");
    int rc = dump_cmd(d);
    if (rc < 0 || d->r->type != REP_ARRAY)
        return -1;
    long long n = d->r->integer;
    printf("stream %s %lld", key, n);
    for (long long j = 0; j < n && rc == 0; j++) {
        char id[64] = "";
        if ((rc = dump_next(d, REP_ARRAY)) == 0 && (rc = dump_next(d, REP_BULK)) == 0) {
            snprintf(id, sizeof id, "%s", d->r->str);
            rc = dump_next(d, REP_ARRAY);
        }
        long long nf = rc == 0 ? d->r->integer : 0;
        uint64_t v = TORN; /* unless its one field is v */
        int named_v = 0;
        for (long long f = 0; f < nf && rc == 0; f++) {
            if ((rc = dump_next(d, -1)) != 0 || nf != 2)
                continue;
            if (f == 0)
                named_v = d->r->type == REP_BULK && !strcmp(d->r->str, "v");
            else if (named_v)
                v = parse_value(d->r);
        }
        if (rc == 0) {
            printf(" %s:", id);
            print_value(stdout, v == 0 ? TORN : v);
        }
    }
    putchar('\n');
    if (rc < 0)
        return rc;
    if (n == 0) { /* XINFO GROUPS fails on a missing key */
        CMD(&d->b, "EXISTS", key);
        if ((rc = dump_cmd(d)) < 0 || d->r->type != REP_INT)
            return -1;
        if (d->r->integer == 0) {
            printf("group %s none\n", key);
            return 0;
        }
    }
    CMD(&d->b, "XINFO", "GROUPS", key);
    if ((rc = dump_cmd(d)) < 0 || d->r->type != REP_ARRAY)
        return -1;
    long long ng = d->r->integer;
    char last[64] = "none";
    for (long long g = 0; g < ng && rc == 0; g++) {
        if ((rc = dump_next(d, REP_ARRAY)) < 0)
            break;
        long long nf = d->r->integer;
        int is_g = 0, want_last = 0;
        for (long long f = 0; f < nf && rc == 0; f++) {
            if ((rc = dump_next(d, -1)) < 0)
                break;
            if (f % 2 == 0) {
                want_last = !strcmp(d->r->str, "last-delivered-id");
                if (!strcmp(d->r->str, "name"))
                    is_g = -1; /* the value follows */
            } else {
                if (is_g == -1)
                    is_g = !strcmp(d->r->str, "g");
                else if (want_last && is_g == 1)
                    snprintf(last, sizeof last, "%s", d->r->str);
            }
        }
    }
    printf("group %s %s\n", key, last);
    if (rc < 0 || !strcmp(last, "none"))
        return rc;
    CMD(&d->b, "XPENDING", key, "g", "-", "+", "1000000");
    if ((rc = dump_cmd(d)) < 0 || d->r->type != REP_ARRAY)
        return -1;
    long long np = d->r->integer;
    printf("pending %s %lld", key, np);
    for (long long j = 0; j < np && rc == 0; j++) {
        if ((rc = dump_next(d, REP_ARRAY)) < 0 || d->r->integer != 4 || (rc = dump_next(d, REP_BULK)) < 0) {
            rc = -1;
            break;
        }
        printf(" %s", d->r->str);
        for (int f = 0; f < 3 && rc == 0; f++)
            rc = dump_next(d, -1);
    }
    putchar('\n');
    return rc;
}

static int do_dump(void) {
    dump_t d = {0};
    d.h = open_log("client", DUMP_CLIENT);
    d.c = calloc(1, sizeof *d.c);
    d.r = malloc(sizeof *d.r);
    d.client = (uint64_t)opt_epoch * 1000 + DUMP_CLIENT;
    int rc = 0;
    if (conn_open(d.c) < 0) {
        fprintf(stderr, "dump: cannot connect to port %d\n", opt_port);
        return 2;
    }
    char k[32], f[32];
    for (int i = 0; i < opt_keys && rc == 0; i++) {
        snprintf(k, sizeof k, "k%d", i);
        CMD(&d.b, "GET", k);
        rc = dump_reg(&d, (uint64_t)i);
    }
    for (int i = 0; i < opt_hashes && rc == 0; i++)
        for (int j = 0; j < opt_fields && rc == 0; j++) {
            snprintf(k, sizeof k, "h%d", i);
            snprintf(f, sizeof f, "f%d", j);
            CMD(&d.b, "HGET", k, f);
            rc = dump_reg(&d, HKEY_HASH_BASE + 100 * (uint64_t)i + (uint64_t)j);
        }
    for (int i = 0; i < opt_pairs && rc == 0; i++)
        rc = dump_pair(&d, i);
    for (int i = 0; i < opt_ttl_keys && rc == 0; i++) {
        snprintf(k, sizeof k, "x%d", i);
        CMD(&d.b, "GET", k);
        rc = dump_reg(&d, HKEY_TTL_BASE + (uint64_t)i);
        if (rc == 0) {
            CMD(&d.b, "PEXPIRETIME", k);
            rc = dump_cmd(&d);
        }
        if (rc == 0 && d.r->type != REP_INT)
            rc = -1;
        if (rc == 0)
            printf("ttl %d %lld\n", HKEY_TTL_BASE + i, d.r->integer);
    }
    for (int i = 0; i < opt_counters && rc == 0; i++) {
        snprintf(k, sizeof k, "c%d", i);
        CMD(&d.b, "GET", k);
        if ((rc = dump_cmd(&d)) < 0)
            break;
        if (d.r->type == REP_NIL)
            printf("ctr %s 0\n", k);
        else if (d.r->type == REP_BULK && !d.r->bad)
            printf("ctr %s %s\n", k, d.r->str);
        else
            printf("ctr %s bad\n", k);
    }
    for (int i = 0; i < opt_short_keys && rc == 0; i++) {
        snprintf(k, sizeof k, "s%d", i);
        CMD(&d.b, "GET", k);
        if ((rc = dump_cmd(&d)) < 0)
            break;
        uint64_t v = parse_value(d.r);
        CMD(&d.b, "PTTL", k);
        if ((rc = dump_cmd(&d)) < 0 || d.r->type != REP_INT) {
            rc = -1;
            break;
        }
        printf("short %s ", k);
        print_value(stdout, v);
        printf(" %lld\n", d.r->integer);
    }
    for (int i = 0; i < opt_lists && rc == 0; i++) {
        snprintf(k, sizeof k, "l%d", i);
        rc = dump_range(&d, "LRANGE", "list", k, k);
    }
    for (int i = 0; i < opt_queues && rc == 0; i++) {
        char qd[32];
        snprintf(k, sizeof k, "q%d", i);
        snprintf(qd, sizeof qd, "qd%d", i);
        rc = dump_range(&d, "LRANGE", "queue", k, k);
        if (rc == 0)
            rc = dump_range(&d, "LRANGE", "moved", k, qd);
        snprintf(k, sizeof k, "zq%d", i);
        if (rc == 0)
            rc = dump_range(&d, "ZRANGE", "zset", k, k);
        snprintf(k, sizeof k, "sq%d", i);
        if (rc == 0)
            rc = dump_stream(&d, k);
    }
    if (rc == 0) {
        CMD(&d.b, "KEYS", "*");
        rc = dump_cmd(&d);
        if (rc == 0 && d.r->type != REP_ARRAY)
            rc = -1;
        long long n = rc == 0 ? d.r->integer : 0;
        printf("keys");
        for (long long j = 0; j < n && rc == 0; j++)
            if ((rc = dump_next(&d, REP_BULK)) == 0)
                printf(" %s", d.r->str);
        putchar('\n');
    }
    if (rc == 0) {
        CMD(&d.b, "DBSIZE");
        rc = dump_cmd(&d);
        if (rc == 0 && d.r->type != REP_INT)
            rc = -1;
        if (rc == 0)
            printf("dbsize %lld\n", d.r->integer);
    }
    close(d.c->fd);
    if (fclose(d.h) != 0) {
        perror("writing the dump log");
        return 2;
    }
    free(d.c);
    free(d.r);
    return rc ? 1 : 0;
}

static void usage(void) {
    fprintf(stderr, "usage: redis_crash_clients run|dump --port P --epoch E --dir D [--clients N] [--keys K]\n"
                    "       [--hashes H] [--fields F] [--counters C] [--pairs P] [--ttl-keys X]\n"
                    "       [--short-keys S] [--lists L] [--queues Q] [--long-px MS] [--short-px-max MS]\n"
                    "       [--seconds S] [--think-us U] [--seed X]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2)
        usage();
    const char *mode = argv[1];
    opt_seed = now_ns();
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        const char *o = argv[i], *v = argv[++i];
        if (!strcmp(o, "--port"))
            opt_port = atoi(v);
        else if (!strcmp(o, "--epoch"))
            opt_epoch = atoi(v);
        else if (!strcmp(o, "--dir"))
            opt_dir = v;
        else if (!strcmp(o, "--clients"))
            opt_clients = atoi(v);
        else if (!strcmp(o, "--keys"))
            opt_keys = atoi(v);
        else if (!strcmp(o, "--hashes"))
            opt_hashes = atoi(v);
        else if (!strcmp(o, "--fields"))
            opt_fields = atoi(v);
        else if (!strcmp(o, "--counters"))
            opt_counters = atoi(v);
        else if (!strcmp(o, "--pairs"))
            opt_pairs = atoi(v);
        else if (!strcmp(o, "--ttl-keys"))
            opt_ttl_keys = atoi(v);
        else if (!strcmp(o, "--short-keys"))
            opt_short_keys = atoi(v);
        else if (!strcmp(o, "--lists"))
            opt_lists = atoi(v);
        else if (!strcmp(o, "--queues"))
            opt_queues = atoi(v);
        else if (!strcmp(o, "--long-px"))
            opt_long_px = atoll(v);
        else if (!strcmp(o, "--short-px-max"))
            opt_short_px_max = atoll(v);
        else if (!strcmp(o, "--seconds"))
            opt_seconds = atof(v);
        else if (!strcmp(o, "--think-us"))
            opt_think_us = atoi(v);
        else if (!strcmp(o, "--seed"))
            opt_seed = strtoull(v, NULL, 0);
        else
            usage();
    }
    if (opt_port <= 0 || opt_epoch < 0 || opt_epoch > 0xffffff || !opt_dir || opt_clients < 1 ||
        opt_clients > 255 || opt_keys < 1 || opt_keys > 1000 || opt_hashes < 0 || opt_hashes > 100 ||
        opt_fields < 1 || opt_fields > 100 || opt_counters < 0 || opt_pairs < 0 || opt_pairs > 10000 ||
        opt_ttl_keys < 0 || opt_ttl_keys > 10000 || opt_short_keys < 0 || opt_lists < 0 || opt_queues < 0 || opt_queues > 100 ||
        opt_long_px < 1 ||
        opt_short_px_max < 1)
        usage();
    if (!strcmp(mode, "run"))
        return do_run();
    if (!strcmp(mode, "dump"))
        return do_dump();
    usage();
}
