/* redis_crash_clients -- concurrent Redis clients for the crash test
 * (redis/tests/crash_test.py, docs/redis.md).
 *
 *   redis_crash_clients run  --port P --epoch E --dir D [options]
 *   redis_crash_clients dump --port P --epoch E --dir D [options]
 *
 * run: N threads, one connection each, race on a small shared key set:
 *   SET/GET on string keys k0..k<K-1>, HSET/HGET on fields f0..f<F-1> of
 *   hashes h0..h<H-1>, INCR on counters c0..c<C-1>. A thread stops at the
 *   first connection error (the server was killed), at an error reply, or
 *   after --seconds. Each thread writes:
 *   - D/client-<E>-<i>.log: the history in the format of the Porcupine checker
 *     (tests/linearizability): "I <opid> <client> <key> <PUT|GET> <value-id>
 *     <t_ns>" before the command is sent, "R <opid> <value-id|0|torn> <t_ns>"
 *     after its reply; CLOCK_MONOTONIC. A command whose connection broke
 *     before the reply has no R line (outcome unknown). Every string key and
 *     hash field is one register; INCR is not in the history (checked by the
 *     driver from the ack log). File name: the checker's "process" is the
 *     server epoch E (the clients outlive the server they talk to).
 *   - D/ack-<E>-<i>.log: "N INCR <counter>" before an INCR is sent, and one
 *     line per acknowledged write: "A SET <key> <value-id>",
 *     "A HSET <hash> <field> <value-id>", "A INCR <counter> <result>".
 * dump: one connection reads every register (logged as history, client index
 *   999, epoch E) and counter, and prints "reg <hkey> <value-id|0|torn>" and
 *   "ctr <name> <value>" lines on stdout.
 *
 * Value ids are E<<40 | client<<32 | n (unique; 0 is "never written"); the
 * stored value is "<id>-" followed by id%61 bytes of 'a'+id%26, so that a
 * value no SET wrote (torn, mixed) is recognised.
 *
 * Options: --clients N (4) --keys K (8) --hashes H (2) --fields F (4)
 *   --counters C (2) --seconds S (30) --think-us U (100: random pause 0..2U
 *   between commands) --seed X. Exit status: 0, 1 on an error reply or bad
 *   reply, 2 usage or setup error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
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
           opt_counters = 2, opt_think_us = 100;
static double opt_seconds = 30;
static const char *opt_dir;
static uint64_t opt_seed;
static atomic_int bad_replies;

#define HKEY_HASH_BASE 1000 /* history key of field f of hash h: 1000 + 100*h + f */
#define DUMP_CLIENT 999

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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

/* Sends one command (argv as bulk strings). 0 ok, -1 connection error. */
static int send_cmd(conn_t *c, int argc, const char **argv, const size_t *lens) {
    char out[4096];
    size_t n = (size_t)snprintf(out, sizeof out, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        n += (size_t)snprintf(out + n, sizeof out - n, "$%zu\r\n", lens[i]);
        if (n + lens[i] + 2 >= sizeof out)
            return -1;
        memcpy(out + n, argv[i], lens[i]);
        n += lens[i];
        out[n++] = '\r';
        out[n++] = '\n';
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = send(c->fd, out + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
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

enum { REP_STATUS, REP_ERROR, REP_INT, REP_BULK, REP_NIL };
typedef struct {
    int type;
    long long integer;
    char str[2048]; /* status, error or bulk (truncated past the end: then 'bad') */
    size_t len;
    int bad;
} reply_t;

/* Reads one non-aggregate reply; -1 on connection error. */
static int read_reply(conn_t *c, reply_t *r) {
    char *line;
    size_t n;
    r->bad = 0;
    r->len = 0;
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

/* Value id of a GET/HGET reply: 0 nil, UINT64_MAX not a value any SET wrote. */
static uint64_t parse_value(const reply_t *r) {
    if (r->type == REP_NIL)
        return 0;
    if (r->type != REP_BULK || r->bad)
        return UINT64_MAX;
    char *end;
    errno = 0;
    uint64_t id = strtoull(r->str, &end, 10);
    if (errno || end == r->str || *end != '-' || id == 0)
        return UINT64_MAX;
    char expect[256];
    size_t n = make_value(id, expect, sizeof expect);
    if (n != r->len || memcmp(expect, r->str, n) != 0)
        return UINT64_MAX;
    return id;
}

static void log_result(FILE *h, uint64_t opid, uint64_t v, uint64_t t) {
    if (v == UINT64_MAX)
        fprintf(h, "R %" PRIu64 " torn %" PRIu64 "\n", opid, t);
    else
        fprintf(h, "R %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", opid, v, t);
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

static void *worker(void *arg) {
    worker_t *w = arg;
    uint64_t rng = opt_seed ^ ((uint64_t)opt_epoch << 20) ^ (uint64_t)(w->idx + 1) * 0x1234567;
    FILE *h = open_log("client", w->idx), *ack = open_log("ack", w->idx);
    conn_t *c = calloc(1, sizeof *c);
    reply_t *r = malloc(sizeof *r);
    uint64_t client = (uint64_t)opt_epoch * 1000 + (uint64_t)w->idx;
    uint64_t opid = 0, seq = 0;
    uint64_t deadline = now_ns() + (uint64_t)(opt_seconds * 1e9);
    if (conn_open(c) < 0) {
        fprintf(stderr, "client %d: cannot connect to port %d\n", w->idx, opt_port);
        w->broken = 1;
        goto out;
    }
    while (now_ns() < deadline) {
        if (opt_think_us > 0)
            usleep((useconds_t)(rng_next(&rng) % (uint64_t)(2 * opt_think_us + 1)));
        unsigned pick = (unsigned)(rng_next(&rng) % 100);
        char kbuf[32], fbuf[32], vbuf[256];
        const char *argv[4];
        size_t lens[4];
        int argc;
        uint64_t hkey = 0, vid = 0;
        int is_put = 0, is_incr = 0, is_hash = 0;
        if (pick < 70 || opt_counters == 0) { /* string register */
            int k = (int)(rng_next(&rng) % (uint64_t)opt_keys);
            is_put = pick % 2 == 0;
            snprintf(kbuf, sizeof kbuf, "k%d", k);
            hkey = (uint64_t)k;
        } else if (pick < 90 && opt_hashes > 0) { /* hash field register */
            int hh = (int)(rng_next(&rng) % (uint64_t)opt_hashes);
            int f = (int)(rng_next(&rng) % (uint64_t)opt_fields);
            is_put = pick % 2 == 0;
            is_hash = 1;
            snprintf(kbuf, sizeof kbuf, "h%d", hh);
            snprintf(fbuf, sizeof fbuf, "f%d", f);
            hkey = HKEY_HASH_BASE + 100 * (uint64_t)hh + (uint64_t)f;
        } else { /* counter */
            int k = (int)(rng_next(&rng) % (uint64_t)opt_counters);
            is_incr = 1;
            snprintf(kbuf, sizeof kbuf, "c%d", k);
        }
        argc = 0;
        if (is_incr) {
            argv[argc++] = "INCR";
        } else if (is_hash) {
            argv[argc++] = is_put ? "HSET" : "HGET";
        } else {
            argv[argc++] = is_put ? "SET" : "GET";
        }
        argv[argc++] = kbuf;
        if (is_hash)
            argv[argc++] = fbuf;
        if (is_put) {
            vid = ((uint64_t)opt_epoch << 40) | ((uint64_t)(w->idx & 0xff) << 32) | ++seq;
            make_value(vid, vbuf, sizeof vbuf);
            argv[argc++] = vbuf;
        }
        for (int i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        uint64_t my = ++opid;
        if (is_incr) {
            fprintf(ack, "N INCR %s\n", kbuf);
        } else {
            fprintf(h, "I %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %" PRIu64 " %" PRIu64 "\n", my, client,
                    hkey, is_put ? "PUT" : "GET", vid, now_ns());
        }
        w->ops++;
        if (send_cmd(c, argc, argv, lens) < 0 || read_reply(c, r) < 0) {
            w->broken = 1;
            break; /* the server is gone: outcome unknown, no R line */
        }
        uint64_t t = now_ns();
        if (r->type == REP_ERROR) {
            fprintf(stderr, "client %d: %s %s: error reply: %s\n", w->idx, argv[0], kbuf, r->str);
            atomic_fetch_add(&bad_replies, 1);
            break; /* treated as unknown outcome */
        }
        if (is_incr) {
            if (r->type != REP_INT) {
                fprintf(stderr, "client %d: INCR %s: not an integer reply\n", w->idx, kbuf);
                atomic_fetch_add(&bad_replies, 1);
                break;
            }
            fprintf(ack, "A INCR %s %lld\n", kbuf, r->integer);
            w->acked++;
        } else if (is_put) {
            int ok = is_hash ? r->type == REP_INT : (r->type == REP_STATUS && strcmp(r->str, "OK") == 0);
            if (!ok) {
                fprintf(stderr, "client %d: %s %s: unexpected reply\n", w->idx, argv[0], kbuf);
                atomic_fetch_add(&bad_replies, 1);
                break;
            }
            fprintf(h, "R %" PRIu64 " 0 %" PRIu64 "\n", my, t);
            if (is_hash)
                fprintf(ack, "A HSET %s %s %" PRIu64 "\n", kbuf, fbuf, vid);
            else
                fprintf(ack, "A SET %s %" PRIu64 "\n", kbuf, vid);
            w->acked++;
        } else {
            log_result(h, my, parse_value(r), t);
        }
    }
out:
    if (c->fd >= 0)
        close(c->fd);
    if (fclose(h) != 0 || fclose(ack) != 0) {
        perror("writing the logs");
        exit(2);
    }
    free(c);
    free(r);
    return NULL;
}

static int do_run(void) {
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

static int dump_one(conn_t *c, reply_t *r, FILE *h, uint64_t client, uint64_t *opid, uint64_t hkey,
                    int argc, const char **argv) {
    size_t lens[4];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    uint64_t my = ++*opid;
    fprintf(h, "I %" PRIu64 " %" PRIu64 " %" PRIu64 " GET 0 %" PRIu64 "\n", my, client, hkey, now_ns());
    if (send_cmd(c, argc, argv, lens) < 0 || read_reply(c, r) < 0) {
        fprintf(stderr, "dump: connection error\n");
        return -1;
    }
    uint64_t t = now_ns();
    if (r->type == REP_ERROR) {
        fprintf(stderr, "dump: %s %s: %s\n", argv[0], argv[1], r->str);
        return -1;
    }
    uint64_t v = parse_value(r);
    log_result(h, my, v, t);
    if (v == UINT64_MAX)
        printf("reg %" PRIu64 " torn\n", hkey);
    else
        printf("reg %" PRIu64 " %" PRIu64 "\n", hkey, v);
    return 0;
}

static int do_dump(void) {
    FILE *h = open_log("client", DUMP_CLIENT);
    conn_t *c = calloc(1, sizeof *c);
    reply_t *r = malloc(sizeof *r);
    uint64_t client = (uint64_t)opt_epoch * 1000 + DUMP_CLIENT, opid = 0;
    int rc = 0;
    if (conn_open(c) < 0) {
        fprintf(stderr, "dump: cannot connect to port %d\n", opt_port);
        return 2;
    }
    char k[32], f[32];
    for (int i = 0; i < opt_keys && rc == 0; i++) {
        snprintf(k, sizeof k, "k%d", i);
        const char *argv[] = {"GET", k};
        rc = dump_one(c, r, h, client, &opid, (uint64_t)i, 2, argv);
    }
    for (int i = 0; i < opt_hashes && rc == 0; i++)
        for (int j = 0; j < opt_fields && rc == 0; j++) {
            snprintf(k, sizeof k, "h%d", i);
            snprintf(f, sizeof f, "f%d", j);
            const char *argv[] = {"HGET", k, f};
            rc = dump_one(c, r, h, client, &opid, HKEY_HASH_BASE + 100 * (uint64_t)i + (uint64_t)j, 3, argv);
        }
    for (int i = 0; i < opt_counters && rc == 0; i++) {
        snprintf(k, sizeof k, "c%d", i);
        const char *argv[] = {"GET", k};
        size_t lens[] = {3, strlen(k)};
        if (send_cmd(c, 2, argv, lens) < 0 || read_reply(c, r) < 0) {
            rc = -1;
            break;
        }
        if (r->type == REP_NIL)
            printf("ctr %s 0\n", k);
        else if (r->type == REP_BULK && !r->bad)
            printf("ctr %s %s\n", k, r->str);
        else
            printf("ctr %s bad\n", k);
    }
    close(c->fd);
    if (fclose(h) != 0) {
        perror("writing the dump log");
        return 2;
    }
    free(c);
    free(r);
    return rc ? 1 : 0;
}

static void usage(void) {
    fprintf(stderr, "usage: redis_crash_clients run|dump --port P --epoch E --dir D [--clients N] [--keys K]\n"
                    "       [--hashes H] [--fields F] [--counters C] [--seconds S] [--think-us U] [--seed X]\n");
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
        opt_fields < 1 || opt_fields > 100 || opt_counters < 0)
        usage();
    if (!strcmp(mode, "run"))
        return do_run();
    if (!strcmp(mode, "dump"))
        return do_dump();
    usage();
}
