/* add_server.c -- the RPC-mode example: a durable array of counters served
 * over TCP by Mangosteen's own sockets and thread pool (docs/rpc.md).
 *
 * The application is plain in-memory C: a global array of 64-bit counters
 * and three commands. Mangosteen makes it durable: the array lives in .bss,
 * a read-write command's stores to it are captured (this file is built with
 * the mango-cc plugin) and logged, and a restart from the pool brings every
 * acknowledged ADD back.
 *
 * Requests (payload of one frame; integers little-endian):
 *   'A' u32 index  i64 delta   add delta to counters[index]; reply i64 new value
 *   'G' u32 index              reply i64 counters[index]
 *   'S'                        reply i64 sum of all counters
 * A malformed request gets 'E' and a message, and changes nothing. So does an
 * ADD whose result would not fit in a signed 64-bit counter, and a sum that
 * would not fit gets 'E' too: the arithmetic is checked, never undefined
 * (any client can send INT64_MAX).
 *
 * Numeric options are checked whole, as kvstore's are: decimal digits only
 * (no sign, no blank), a size's K/M/G suffix checked for overflow, each in its
 * range; a bad one exits 2 naming the option and the value.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "mango.h"
#include "../common/parse_num.h"

#define N_COUNTERS 4096

/* ---- the application: state and commands (knows nothing of Mangosteen) --- */

static int64_t counters[N_COUNTERS];

typedef struct client {
    uint64_t id;
    char op; /* 'A', 'G', 'S', or 0 for a malformed request */
    uint32_t index;
    int64_t delta;
    uint8_t reply[80];
    size_t reply_len;
} client;

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_i64(uint8_t *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(u >> (8 * i));
}

static void reply_error(client *c, const char *msg)
{
    c->reply[0] = 'E';
    size_t n = strlen(msg);
    if (n > sizeof c->reply - 1)
        n = sizeof c->reply - 1;
    memcpy(c->reply + 1, msg, n);
    c->reply_len = 1 + n;
}

static void reply_value(client *c, int64_t v)
{
    put_i64(c->reply, v);
    c->reply_len = 8;
}

static void parse_request(client *c, const uint8_t *p, size_t len)
{
    c->op = 0;
    if (len == 13 && p[0] == 'A') {
        c->op = 'A';
        c->index = get_u32(p + 1);
        uint64_t d = 0;
        for (int i = 0; i < 8; i++)
            d |= (uint64_t)p[5 + i] << (8 * i);
        c->delta = (int64_t)d;
    } else if (len == 5 && p[0] == 'G') {
        c->op = 'G';
        c->index = get_u32(p + 1);
    } else if (len == 1 && p[0] == 'S') {
        c->op = 'S';
    }
    if ((c->op == 'A' || c->op == 'G') && c->index >= N_COUNTERS)
        c->op = 0;
}

static void handle_request(client *c)
{
    switch (c->op) {
    case 'A': {
        int64_t v;
        if (__builtin_add_overflow(counters[c->index], c->delta, &v)) {
            reply_error(c, "overflow: the counter would leave the signed 64-bit range; unchanged");
            break;
        }
        counters[c->index] = v;
        reply_value(c, v);
        break;
    }
    case 'G':
        reply_value(c, counters[c->index]);
        break;
    case 'S': {
        /* 4096 counters each within 64 bits sum within 77: add in 128. */
        __int128 sum = 0;
        for (int i = 0; i < N_COUNTERS; i++)
            sum += counters[i];
        if (sum > INT64_MAX || sum < INT64_MIN)
            reply_error(c, "overflow: the sum leaves the signed 64-bit range");
        else
            reply_value(c, (int64_t)sum);
        break;
    }
    default:
        reply_error(c, "bad request: 'A' u32 i64, 'G' u32 or 'S'; index below 4096");
    }
}

/* ---- the Mangosteen callbacks: thin wrappers ---------------------------- */

static void *init_client(void *params)
{
    client *c = calloc(1, sizeof *c);
    if (c)
        c->id = ((const mango_client_params *)params)->client_id;
    return c;
}

static void destroy_client(void *ctx) { free(ctx); }

static void deserialize(void *ctx, const void *req, size_t len) { parse_request(ctx, req, len); }

static bool is_read_only(void *ctx) { return ((client *)ctx)->op != 'A'; }

static void process(void *ctx) { handle_request(ctx); }

/* An ADD or GET names its counter: a GET then waits only for ADDs to that
 * counter to be durable, not for every ADD in flight. A sum reads them all
 * (-1: it waits for everything before it); a malformed request reads nothing. */
static int request_keys(void *ctx, uint64_t *keys, unsigned max)
{
    client *c = ctx;
    if (c->op == 'S' || max < 1)
        return -1;
    if (c->op == 0)
        return 0;
    keys[0] = c->index;
    return 1;
}

static mango_response get_response(void *ctx)
{
    client *c = ctx;
    return (mango_response){.data = c->reply, .size = c->reply_len};
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
"usage: add_server [options]\n"
"\n"
"A durable array of 4096 64-bit counters served over TCP in Mangosteen's RPC\n"
"mode. Runs until SIGINT or SIGTERM, then closes its connections and the pool.\n"
"\n"
"Options:\n"
"  --pool PATH        pool file (default $MANGO_POOL, else /dev/shm/mango-add_server.pool)\n"
"  --mode MODE        auto|emulated|fs|pmem|sim|none (default auto)\n"
"  --pool-size BYTES  size of a new pool, 1M to 2^50 (default 128M; suffixes K M G)\n"
"  --log-size BYTES   redo log of a new pool, 64K to 2^50 (default 16M; K M G). The\n"
"                     pool refuses a log that does not fit in it or is not a\n"
"                     multiple of 4K (exit 1)\n"
"  --host ADDR        address to listen on: IPv4, IPv6 (::1) or a name (default 127.0.0.1)\n"
"  --port N           TCP port 0-65535 (default 0: any free port, printed at start)\n"
"  --unix PATH        listen on a Unix-domain socket at PATH (1 to 107 bytes)\n"
"                     instead of TCP (not with --host or --port; a socket left\n"
"                     by a server that is gone is replaced; a live server's\n"
"                     socket, or anything else, is refused)\n"
"  --threads N        worker threads, 1-256 (default 8). A worker holds its responses\n"
"                     while their commands become durable and serves its other\n"
"                     connections meanwhile (fs, sim modes), so one per CPU is\n"
"                     enough for many clients\n"
"  --max-connections N\n"
"                     connections open at a time, 1-1048576 (default 1024); one\n"
"                     more is accepted and closed at once\n"
"  --idle-timeout MS  close a connection that sent nothing for MS milliseconds with\n"
"                     nothing in progress, 100-86400000 (default: never)\n"
"  --unkeyed-reads    GETs do not name their counter (mango request_keys):\n"
"                     each waits for every ADD in flight (for comparison)\n"
"  --help             this text\n"
"\n"
"Protocol: frames of a 4-byte little-endian length and a payload (docs/rpc.md).\n"
"  'A' u32 index i64 delta   add; replies the new value (i64)\n"
"  'G' u32 index             get; replies the value (i64)\n"
"  'S'                       sum of all counters (i64)\n"
"A malformed request gets 'E' and a message. Counters are signed 64-bit: an add\n"
"whose result would leave -2^63..2^63-1 gets 'E' and changes nothing, and so\n"
"does a sum outside that range (nothing wraps).\n"
"\n"
"Connections: requests of one connection run in order, and a client may send\n"
"several before reading (pipelining); each response is sent once its command is\n"
"durable. A request frame longer than 1 MiB closes its connection at once; so\n"
"does a frame left incomplete for 10 s, responses left unread for 10 s, and with\n"
"--idle-timeout a connection that sent nothing that long. A client that shuts its\n"
"sending side still gets the answer to every whole request it sent, then the close.\n"
"\n"
"Environment:\n"
"  MANGO_POOL                   the pool when --pool is not given\n"
"  MANGO_RPC_FRAME_TIMEOUT_MS   the incomplete-frame time-out (default 10000)\n"
"  MANGO_RPC_SEND_TIMEOUT_MS    the unread-responses time-out (default 10000)\n"
"                               (milliseconds, digits only, 100-3600000; else exit 1)\n"
"\n"
"On start it prints one line: 'add_server: listening on ADDR:PORT status=FRESH|RECOVERED'\n"
"(an IPv6 ADDR in brackets, [::1]:PORT; with --unix: 'listening on unix:PATH').\n"
"On SIGINT or SIGTERM it answers the requests that ran once they are durable,\n"
"closes every connection and the pool, and prints\n"
"'add_server: stopped by signal N: connections=N requests=N ...' with\n"
"the server's counters (mango_rpc_stats, docs/rpc.md).\n"
"Exit status: 0 after a clean stop; 1 if the pool or the listener cannot be set\n"
"up, or the final drain or shutdown fails; 2 for bad options (a number is whole\n"
"decimal digits in its range).\n");
}

static int parse_mode(const char *s, mango_persist_mode *m)
{
    static const struct { const char *name; mango_persist_mode mode; } modes[] = {
        {"auto", MANGO_PERSIST_AUTO}, {"emulated", MANGO_PERSIST_EMULATED}, {"fs", MANGO_PERSIST_FS},
        {"pmem", MANGO_PERSIST_PMEM}, {"sim", MANGO_PERSIST_SIM}, {"none", MANGO_PERSIST_NONE}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(s, modes[i].name) == 0) {
            *m = modes[i].mode;
            return 0;
        }
    return -1;
}

int main(int argc, char **argv)
{
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_size = 128u << 20;
    cfg.log_size = 16u << 20;
    mango_rpc_config rc = {0};
    static const struct option opts[] = {
        {"pool", required_argument, 0, 'p'}, {"mode", required_argument, 0, 'm'},
        {"pool-size", required_argument, 0, 's'}, {"log-size", required_argument, 0, 'l'},
        {"host", required_argument, 0, 'H'}, {"unix", required_argument, 0, 'U'},
        {"port", required_argument, 0, 'P'}, {"threads", required_argument, 0, 't'},
        {"max-connections", required_argument, 0, 'c'}, {"idle-timeout", required_argument, 0, 'i'},
        {"unkeyed-reads", no_argument, 0, 'u'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    bool keyed_reads = true, port_given = false;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'p': cfg.pool_path = optarg; break;
        case 'm':
            if (parse_mode(optarg, &cfg.mode) != 0) {
                fprintf(stderr, "add_server: --mode %s: not one of auto, emulated, fs, pmem, sim, none\n", optarg);
                return 2;
            }
            break;
        case 's': cfg.pool_size = (size_t)parse_num("add_server", optarg, "--pool-size", 1u << 20, (uint64_t)1 << 50, true); break;
        case 'l': cfg.log_size = (size_t)parse_num("add_server", optarg, "--log-size", 64u << 10, (uint64_t)1 << 50, true); break;
        case 'H': rc.host = optarg; break;
        case 'U': rc.unix_path = optarg; break;
        case 'P':
            rc.port = (uint16_t)parse_num("add_server", optarg, "--port", 0, 65535, false);
            port_given = true;
            break;
        case 't': rc.threads = (unsigned)parse_num("add_server", optarg, "--threads", 1, 256, false); break;
        case 'c':
            rc.max_connections = (uint32_t)parse_num("add_server", optarg, "--max-connections", 1, 1u << 20, false);
            break;
        case 'i':
            rc.idle_timeout_ms = (uint32_t)parse_num("add_server", optarg, "--idle-timeout", 100, 86400000, false);
            break;
        case 'u': keyed_reads = false; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "add_server: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    /* (The runtime took an empty pool path for the default pool, and a Unix
     * socket over --host/--port, silently.) */
    const char *conflict = NULL;
    if (cfg.pool_path && !*cfg.pool_path)
        conflict = "--pool needs a path (leave it out for the default)";
    else if (rc.unix_path && (rc.host || port_given))
        conflict = "--unix names a Unix socket, --host and --port a TCP listener: give one of them";
    else if (rc.unix_path && (!*rc.unix_path || strlen(rc.unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)))
        conflict = "--unix needs a path of 1 to 107 bytes (a Unix socket's limit)";
    if (conflict) {
        fprintf(stderr, "add_server: %s\n", conflict);
        usage(stderr);
        return 2;
    }

    /* SIGINT/SIGTERM are taken by sigwait below, on this thread only. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    mango_callbacks cb = {.init_client = init_client, .destroy_client = destroy_client,
                          .deserialize_request = deserialize, .is_read_only = is_read_only,
                          .process_request = process, .get_response = get_response,
                          .request_keys = keyed_reads ? request_keys : NULL};
    if (rc.threads + 1 > cfg.max_threads) /* each worker takes one of the runtime's thread slots */
        cfg.max_threads = rc.threads + 1;
    int st = mango_init(&cfg, &cb);
    if (st < 0) {
        fprintf(stderr, "add_server: %s\n", mango_last_error());
        return 1;
    }
    if (mango_rpc_start(&rc) != MANGO_OK) {
        fprintf(stderr, "add_server: %s\n", mango_last_error());
        mango_shutdown();
        return 1;
    }
    if (rc.unix_path)
        printf("add_server: listening on unix:%s status=%s\n", rc.unix_path,
               st == MANGO_RECOVERED ? "RECOVERED" : "FRESH");
    else {
        const char *host = rc.host ? rc.host : "127.0.0.1";
        bool v6 = strchr(host, ':') != NULL; /* an IPv6 address: [::1]:PORT, as URLs write it */
        printf("add_server: listening on %s%s%s:%d status=%s\n", v6 ? "[" : "", host, v6 ? "]" : "",
               mango_rpc_port(), st == MANGO_RECOVERED ? "RECOVERED" : "FRESH");
    }
    fflush(stdout);

    int sig;
    sigwait(&stop, &sig);
    mango_rpc_stats rs;
    mango_rpc_get_stats(&rs);
    mango_rpc_stop();
    int rc_shut = mango_shutdown();
    printf("add_server: stopped by signal %d: connections=%" PRIu64 " requests=%" PRIu64
           " bad_frames=%" PRIu64 " send_timeouts=%" PRIu64 " refused=%" PRIu64 " held=%" PRIu64
           " frame_timeouts=%" PRIu64 " rejected=%" PRIu64 " idle_timeouts=%" PRIu64 "\n",
           sig, rs.accepted, rs.requests, rs.bad_frames, rs.send_timeouts, rs.refused, rs.held,
           rs.frame_timeouts, rs.rejected, rs.idle_timeouts);
    if (rc_shut != MANGO_OK) {
        fprintf(stderr, "add_server: shutdown: %s\n", mango_last_error());
        return 1;
    }
    return 0;
}
