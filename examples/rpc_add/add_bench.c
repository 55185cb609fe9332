/* add_bench.c -- closed-loop load generator for add_server (RPC mode).
 *
 * --clients connections, one thread each; every client sends one request,
 * waits for its response, and sends the next (no pipelining). A request is an
 * ADD of 1 to a random counter with probability --update-pct, else a GET of
 * one. Prints one line of key=value results: ops, ops_per_sec, p50_us,
 * p99_us, p999_us, max_us (latency from send to full response). Latencies go
 * in bench/ycsb's log-bucket histogram (ycsb_hist.h: under 0.8 % error, no
 * ceiling short of hours), so a slow run's percentiles are its own, not a cap.
 * A run in which no request completed prints no line: it says so and exits 1
 * (an empty histogram has no percentiles). Numeric options are checked whole
 * (digits only, in range; --seconds finite): a bad one exits 2 naming it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../common/parse_num.h"
#include "ycsb_hist.h"

#define N_COUNTERS 4096

static struct {
    const char *host;
    const char *unix_path; /* --unix: a Unix-domain socket instead of TCP */
    int port;
    unsigned clients;
    double seconds;
    unsigned update_pct;
} O = {"127.0.0.1", NULL, 0, 8, 5.0, 50};

static atomic_bool stop_flag;

typedef struct client {
    pthread_t th;
    unsigned id;
    uint64_t ops;
    hist_t hist; /* latency in nanoseconds */
    char error[256]; /* why the client stopped early, or "" */
} client;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sends (out) or receives all n bytes; -1 if the connection failed, with
 * c->error saying why (a recv's end of stream sets no errno: the server
 * closed the connection). */
static int transfer(client *c, int fd, void *b, size_t n, bool out)
{
    char *p = b;
    while (n > 0) {
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                snprintf(c->error, sizeof c->error, "the server closed the connection");
            else
                snprintf(c->error, sizeof c->error, "%s: %s", out ? "send" : "recv", strerror(errno));
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* A connected socket to O.host:O.port (its first address that accepts);
 * -1 with c->error set if none does. */
static int connect_tcp(client *c)
{
    char port[8];
    snprintf(port, sizeof port, "%d", O.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(O.host, port, &hints, &res);
    if (g != 0) {
        snprintf(c->error, sizeof c->error, "host \"%s\": %s", O.host,
                 g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0)
            e = errno;
        else if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(c->error, sizeof c->error, "connect to %s port %d: %s", O.host, O.port, strerror(e));
    return fd;
}

static int connect_unix(client *c)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(O.unix_path) >= sizeof a.sun_path) {
        snprintf(c->error, sizeof c->error, "connect to %s: %s", O.unix_path, strerror(ENAMETOOLONG));
        return -1;
    }
    strcpy(a.sun_path, O.unix_path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(c->error, sizeof c->error, "connect to %s: %s", O.unix_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    return fd;
}

static void *client_main(void *arg)
{
    client *c = arg;
    int fd = O.unix_path ? connect_unix(c) : connect_tcp(c);
    if (fd < 0)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t rng = 0x9e3779b97f4a7c15ull * (c->id + 1);
    uint8_t req[4 + 13], resp[64];
    while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t idx = (uint32_t)(rng >> 20) % N_COUNTERS;
        bool add = (rng % 100) < O.update_pct;
        uint32_t len = add ? 13 : 5;
        memcpy(req, &len, 4); /* little-endian machine (x86-64, arm64) */
        req[4] = add ? 'A' : 'G';
        memcpy(req + 5, &idx, 4);
        int64_t one64 = 1;
        if (add)
            memcpy(req + 9, &one64, 8);
        uint64_t t0 = now_ns();
        uint32_t rlen = 0;
        if (transfer(c, fd, req, 4 + len, true) || transfer(c, fd, &rlen, 4, false))
            break;
        if (rlen != 8) { /* (an 'E' reply, or not add_server) */
            snprintf(c->error, sizeof c->error, "a response of %" PRIu32 " bytes (expected 8)", rlen);
            break;
        }
        if (transfer(c, fd, resp, rlen, false))
            break;
        hist_record(&c->hist, now_ns() - t0);
        c->ops++;
    }
    close(fd);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
"usage: add_bench --port N [--host ADDR] [--clients N] [--seconds S] [--update-pct P]\n"
"       add_bench --unix PATH [--clients N] [--seconds S] [--update-pct P]\n"
"\n"
"Closed-loop load for add_server: N connections, one thread each, one request\n"
"in flight per connection; ADD of 1 with probability P %% (default 50), else GET,\n"
"on a random counter of 4096. Runs S seconds (default 5; 8 clients by default)\n"
"and prints: clients= update_pct= seconds= ops= ops_per_sec= p50_us= p99_us= p999_us=\n"
"max_us= (latencies to within 1 %%, however long).\n"
"Ranges: --clients 1-1024, --seconds 0.001-1000000, --update-pct 0-100, --port 1-65535.\n"
"Exit status: 0; 1 if a connection failed or no request completed (no line is\n"
"printed then); 2 for bad options.\n");
}

/* --seconds: a finite decimal number in 0.001..1e6 (strtod takes inf and nan,
 * which nanosleep cannot). Else exits 2. */
static double parse_seconds(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= 0.001 && v <= 1e6)) {
        fprintf(stderr, "add_bench: --seconds must be a number in [0.001, 1000000], not '%s'\n", s);
        fprintf(stderr, "Try 'add_bench --help'.\n");
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"host", required_argument, 0, 'H'},
                                         {"unix", required_argument, 0, 'U'},
                                         {"port", required_argument, 0, 'p'},
                                         {"clients", required_argument, 0, 'c'},
                                         {"seconds", required_argument, 0, 's'},
                                         {"update-pct", required_argument, 0, 'u'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'H': O.host = optarg; break;
        case 'U': O.unix_path = optarg; break;
        case 'p': O.port = (int)parse_num("add_bench", optarg, "--port", 1, 65535, false); break;
        case 'c': O.clients = (unsigned)parse_num("add_bench", optarg, "--clients", 1, 1024, false); break;
        case 's': O.seconds = parse_seconds(optarg); break;
        case 'u': O.update_pct = (unsigned)parse_num("add_bench", optarg, "--update-pct", 0, 100, false); break;
        case 'h': usage(stdout); return 0;
        default: goto bad;
        }
    }
    const char *why = optind < argc ? "unexpected argument"
                      : O.port && O.unix_path ? "give --port or --unix, not both"
                      : !O.port && !O.unix_path ? "give the server: --port N (TCP) or --unix PATH"
                      : NULL;
    if (why) {
        fprintf(stderr, "add_bench: %s%s%s\n", why, optind < argc ? " " : "", optind < argc ? argv[optind] : "");
        goto bad;
    }
    client *cs = calloc(O.clients, sizeof *cs);
    if (!cs) {
        fprintf(stderr, "add_bench: out of memory for %u clients\n", O.clients);
        return 1;
    }
    for (unsigned i = 0; i < O.clients; i++) {
        cs[i].id = i;
        hist_init(&cs[i].hist);
        int e = pthread_create(&cs[i].th, NULL, client_main, &cs[i]);
        if (e != 0) { /* (it joined threads it never started, and blamed the server) */
            fprintf(stderr, "add_bench: cannot start client %u of %u: %s\n", i + 1, O.clients, strerror(e));
            atomic_store(&stop_flag, true);
            for (unsigned k = 0; k < i; k++)
                pthread_join(cs[k].th, NULL);
            return 1;
        }
    }
    uint64_t t0 = now_ns();
    struct timespec d = {(time_t)O.seconds, (long)((O.seconds - (time_t)O.seconds) * 1e9)};
    nanosleep(&d, NULL);
    atomic_store(&stop_flag, true);
    hist_t h;
    hist_init(&h);
    uint64_t ops = 0;
    const client *failed = NULL;
    for (unsigned i = 0; i < O.clients; i++) {
        pthread_join(cs[i].th, NULL);
        ops += cs[i].ops;
        hist_merge(&h, &cs[i].hist);
        if (cs[i].error[0])
            failed = &cs[i];
    }
    double el = (double)(now_ns() - t0) / 1e9;
    if (failed) {
        fprintf(stderr, "add_bench: client %u failed after %" PRIu64 " requests: %s\n", failed->id,
                failed->ops, failed->error);
        return 1;
    }
    if (ops == 0) {
        fprintf(stderr, "add_bench: no request completed in %.3f s (%u clients): no results\n", el, O.clients);
        return 1;
    }
    printf("clients=%u update_pct=%u seconds=%.2f ops=%" PRIu64 " ops_per_sec=%.0f p50_us=%.0f p99_us=%.0f"
           " p999_us=%.0f max_us=%.0f\n", O.clients, O.update_pct, el, ops, ops / el, hist_pct_us(&h, 50),
           hist_pct_us(&h, 99), hist_pct_us(&h, 99.9), hist_max_us(&h));
    return 0;
bad:
    usage(stderr);
    return 2;
}
