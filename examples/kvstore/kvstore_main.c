/* kvstore_main.c -- the durable key-value store example and its drivers.
 *
 *   kvstore demo        a durable store that counts its own restarts
 *   kvstore run         multi-threaded PUT/GET load, prints throughput
 *   kvstore worker      crash-test load: records acknowledgements in a file
 *   kvstore verify      recover and check every acknowledged PUT is present
 *   kvstore crash-test  worker + SIGKILL + verify, N rounds
 *   kvstore hashmap     the hash-map variant: load, then consistency check
 *   kvstore history-test  kill -9 rounds recording a history for the
 *                       linearizability checker (kv_history.c)
 *
 * Run `kvstore --help` for the options.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/parse_num.h"
#include "kv_fixed.h"
#include "kv_hashmap.h"
#include "kv_workload.h"
#include "kvstore_driver.h"
#include "mango.h"

static const char *usage_text =
    "usage: kvstore COMMAND [options]\n"
    "\n"
    "A durable key-value store built on Mangosteen (the paper's Listing 2 store and a\n"
    "resizable hash map), with the drivers used by its tests and benchmarks.\n"
    "\n"
    "Commands:\n"
    "  demo         open (or create) the store, apply a few updates from 4 threads,\n"
    "               print what was recovered; run it twice to see state survive\n"
    "               (its store: 1000 values of 64 bytes unless --values/--value-size)\n"
    "  run          closed-loop load: --threads clients, --update-pct PUTs, the rest GETs\n"
    "  worker       crash-test load that records acknowledged PUTs in --ack FILE\n"
    "  verify       recover the pool and check it against --ack FILE\n"
    "  crash-test   --rounds times: start a worker, SIGKILL it at a random moment,\n"
    "               verify; prints 'rounds=N acked=M lost=L torn=T' last\n"
    "  hashmap      the hash-map variant: --ops random PUT/GET/DEL on --values keys,\n"
    "               then a check; a second run recovers and checks the map again\n"
    "               (with --ack FILE: also that every acknowledged PUT/DEL is there)\n"
    "  powerfail    simulated power failures: follow every store, flush and sync to\n"
    "               the pool, cut --images crash images at ordering points (unfenced\n"
    "               words kept at random), recover and verify each; prints\n"
    "               'images=N violations=V' last (exit 2 if the simulator's model\n"
    "               of the pool drifted from the file: MODEL DRIFT)\n"
    "  history-worker --threads clients race PUT/GET on --keys keys, logging every\n"
    "               invocation and return under --history DIR (until killed, or --seconds)\n"
    "  history-test --rounds times: start a history-worker, SIGKILL it at a random\n"
    "               moment; then one that exits cleanly; check the logs with the\n"
    "               Porcupine checker in tests/linearizability\n"
    "\n"
    "Options:\n"
    "  --pool PATH        pool file (default $MANGO_POOL, else /dev/shm/mango-kvstore.pool,\n"
    "                     hashmap /dev/shm/mango-kvstore-hashmap.pool). A pool holds the\n"
    "                     fixed-size store (every command but hashmap) or the hash map;\n"
    "                     a command refuses a pool holding the other one, or a\n"
    "                     fixed-size store of other --values/--value-size\n"
    "  --mode MODE        auto|emulated|fs|pmem|sim|none (default auto); sim makes a\n"
    "                     kill act like a power failure (test mode), none = durability off\n"
    "                     (refused by crash-test and history-test: nothing would survive)\n"
    "  --pool-size BYTES  size of a new pool (default 256M; suffixes K M G)\n"
    "  --log-size BYTES   redo log size (default 64M)\n"
    "  --threads N        client threads, 1-64 (default 4)\n"
    "  --values N         number of values, 1-4294967295 and at least --threads\n"
    "                     (default 100000; demo 1000; suffixes K M G)\n"
    "  --value-size N     bytes per value, 16-1G (default 64)\n"
    "  --update-pct P     percentage of PUTs, 0-100 (default 50)\n"
    "  --seconds S        run length for run/worker, 0-1e7, decimals allowed\n"
    "                     (default 2; worker: until killed)\n"
    "  --ops N            hashmap: operations (default 200000)\n"
    "  --ack FILE         worker/verify/hashmap: acknowledgement file (hashmap: made\n"
    "                     if missing, with every key absent, as a new pool has them)\n"
    "  --rounds N         crash-test rounds (default 50)\n"
    "  --min-ms/--max-ms  crash-test: kill between these delays, 0-3600000\n"
    "                     (default 30/400)\n"
    "  --zipf THETA       run: Zipfian keys with skew THETA in [0, 1), e.g. 0.99\n"
    "                     (default 0: uniform)\n"
    "  --seed N           random seed, 0-18446744073709551615 (default: time)\n"
    "  --images N         powerfail: crash images to check (default 500)\n"
    "  --recovery-crashes powerfail: also cut one image in four inside its recovery\n"
    "  --history DIR      history-worker/-test: folder of the client logs\n"
    "  --keys K           history-worker/-test: keys all clients share, >= 1 (default 8)\n"
    "  --think-us N       history-worker/-test: clients pause 0..2N us between ops,\n"
    "                     0-1000000 (default 0; bounds the history's size for the checker)\n"
    "  --read-keys MODE   on: GETs wait only for PUTs of their key to be durable\n"
    "                     (mango_callbacks.request_keys; default); off: for every PUT\n"
    "                     in flight; wrong: test only, name the wrong key (unsafe)\n"
    "  --quiet            less output\n"
    "\n"
    "Numbers are whole and decimal unless said; one out of its range, or not a\n"
    "number, is a usage error.\n"
    "\n"
    "Exit status: 0 success; 1 verification failure (lost or torn data); 2 usage or\n"
    "runtime error.\n";



opts O;

static void die_usage(const char *fmt, const char *arg);
void die_usage_msg(const char *msg) { die_usage("%s", msg); }

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "kvstore: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'kvstore --help'.\n");
    exit(2);
}

static size_t parse_size(const char *s, const char *what)
{
    return (size_t)parse_num("kvstore", s, what, 1, (uint64_t)1 << 50, true);
}

/* A decimal number of seconds in [lo, hi] (strtod, whole string). */
static double parse_real(const char *s, const char *what, double lo, double hi, bool hi_open)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo) || !(hi_open ? v < hi : v <= hi)) {
        fprintf(stderr, "kvstore: %s must be a number in [%g, %g%s, not '%s'\n", what, lo, hi,
                hi_open ? ")" : "]", s);
        fprintf(stderr, "Try 'kvstore --help'.\n");
        exit(2);
    }
    return v;
}

static mango_persist_mode parse_mode(const char *s)
{
    if (!strcmp(s, "auto")) return MANGO_PERSIST_AUTO;
    if (!strcmp(s, "emulated")) return MANGO_PERSIST_EMULATED;
    if (!strcmp(s, "fs")) return MANGO_PERSIST_FS;
    if (!strcmp(s, "pmem")) return MANGO_PERSIST_PMEM;
    if (!strcmp(s, "none")) return MANGO_PERSIST_NONE;
    if (!strcmp(s, "sim")) return MANGO_PERSIST_SIM;
    die_usage("unknown mode '%s' (auto, emulated, fs, pmem, sim, none)", s);
    return 0;
}

const char *kv_mode_name(mango_persist_mode m)
{
    switch (m) {
    case MANGO_PERSIST_EMULATED: return "emulated";
    case MANGO_PERSIST_FS: return "fs";
    case MANGO_PERSIST_PMEM: return "pmem";
    case MANGO_PERSIST_SIM: return "sim";
    case MANGO_PERSIST_NONE: return "none";
    default: return "auto";
    }
}

void kv_refuse_mode_none(const char *cmd)
{
    if (O.mode != MANGO_PERSIST_NONE)
        return;
    fprintf(stderr, "kvstore: %s checks what survives a kill, and --mode none keeps nothing: "
                    "use auto, emulated, fs, pmem or sim\nTry 'kvstore --help'.\n", cmd);
    exit(2);
}

static void parse(int argc, char **argv)
{
    static const struct option lo[] = {
        {"pool", 1, 0, 'p'}, {"mode", 1, 0, 'm'}, {"pool-size", 1, 0, 'S'}, {"log-size", 1, 0, 'L'},
        {"threads", 1, 0, 't'}, {"values", 1, 0, 'n'}, {"value-size", 1, 0, 'v'},
        {"update-pct", 1, 0, 'u'}, {"seconds", 1, 0, 's'}, {"ops", 1, 0, 'o'}, {"ack", 1, 0, 'a'},
        {"rounds", 1, 0, 'r'}, {"min-ms", 1, 0, 1}, {"max-ms", 1, 0, 2}, {"seed", 1, 0, 3},
        {"images", 1, 0, 4}, {"recovery-crashes", 0, 0, 5}, {"cut-recovery", 0, 0, 6},
        {"zipf", 1, 0, 10}, {"history", 1, 0, 7}, {"keys", 1, 0, 8}, {"think-us", 1, 0, 9},
        {"read-keys", 1, 0, 11},
        {"quiet", 0, 0, 'q'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    O.mode = MANGO_PERSIST_AUTO;
    O.pool_size = 256u << 20;
    O.log_size = 64u << 20;
    O.threads = 4;
    O.values = 100000;
    O.value_size = 64;
    O.update_pct = 50;
    O.seconds = 2;
    O.ops = 200000;
    O.rounds = 50;
    O.images = 500;
    O.min_ms = 30;
    O.max_ms = 400;
    O.seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    O.read_keys = "on";
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'p': O.pool = optarg; break;
        case 'm': O.mode = parse_mode(optarg); break;
        case 'S': O.pool_size = parse_size(optarg, "--pool-size"); break;
        case 'L': O.log_size = parse_size(optarg, "--log-size"); break;
        case 't': O.threads = (unsigned)parse_num("kvstore", optarg, "--threads", 1, KV_MAX_CLIENTS, false); break;
        case 'n': O.values = (uint32_t)parse_num("kvstore", optarg, "--values", 1, UINT32_MAX, true); O.values_set = true; break;
        case 'v': O.value_size = (uint32_t)parse_num("kvstore", optarg, "--value-size", 16, 1u << 30, true); O.value_size_set = true; break;
        case 'u': O.update_pct = (unsigned)parse_num("kvstore", optarg, "--update-pct", 0, 100, false); break;
        case 's': O.seconds = parse_real(optarg, "--seconds", 0, 1e7, false); O.seconds_set = true; break;
        case 'o': O.ops = parse_num("kvstore", optarg, "--ops", 0, UINT64_MAX, true); break;
        case 'a': O.ack = optarg; break;
        case 'r': O.rounds = (unsigned)parse_num("kvstore", optarg, "--rounds", 0, UINT32_MAX, false); break;
        case 1: O.min_ms = (unsigned)parse_num("kvstore", optarg, "--min-ms", 0, 3600000, false); break;
        case 2: O.max_ms = (unsigned)parse_num("kvstore", optarg, "--max-ms", 0, 3600000, false); break;
        case 3: O.seed = parse_num("kvstore", optarg, "--seed", 0, UINT64_MAX, false); break;
        case 4: O.images = (unsigned)parse_num("kvstore", optarg, "--images", 0, UINT32_MAX, false); break;
        case 5: O.recovery_crashes = true; break;
        case 6: O.cut_recovery = true; break;
        case 7: O.history = optarg; break;
        case 10:
            O.zipf = parse_real(optarg, "--zipf", 0, 1, true);
            break;
        case 8: O.keys = (uint32_t)parse_num("kvstore", optarg, "--keys", 1, UINT32_MAX, false); break;
        case 9: O.think_us = (unsigned)parse_num("kvstore", optarg, "--think-us", 0, 1000000, false); break;
        case 11:
            if (strcmp(optarg, "on") && strcmp(optarg, "off") && strcmp(optarg, "wrong"))
                die_usage("--read-keys must be on, off or wrong, not '%s'", optarg);
            O.read_keys = optarg;
            break;
        case 'q': O.quiet = true; break;
        case 'h': fputs(usage_text, stdout); exit(0);
        default: fputs("Try 'kvstore --help'.\n", stderr); exit(2);
        }
    }
    if (O.pool && !*O.pool) /* (an empty path silently meant the default pool) */
        die_usage("%s", "--pool needs a path (leave it out for the default)");
    if (optind >= argc)
        die_usage("%s", "missing COMMAND");
    O.cmd = argv[optind];
    if (optind + 1 < argc)
        die_usage("unexpected argument '%s'", argv[optind + 1]);
    if (O.values < O.threads && strcmp(O.cmd, "demo") != 0) /* (demo: its own threads, checked there) */
        die_usage("--values must be at least --threads%s", "");
    if (O.min_ms > O.max_ms)
        die_usage("--min-ms must not exceed --max-ms%s", "");
    ssize_t n = readlink("/proc/self/exe", O.self, sizeof O.self - 1);
    O.self[n > 0 ? n : 0] = 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *status_name(int st) { return st == MANGO_FRESH ? "FRESH" : "RECOVERED"; }

kv_keys_fn *kv_read_keys_callback(kv_keys_fn *keyed)
{
    return strcmp(O.read_keys, "off") ? keyed : NULL;
}

/* ---- which store a pool holds ----
 *
 * Every command but hashmap keeps the fixed-size store (kv_fixed.c); hashmap
 * keeps the hash map (kv_hashmap.c). Both are in this program, so a pool made
 * by one opens (RECOVERED) under the other with that store's globals empty:
 * hashmap on a demo pool followed a NULL map. init_state therefore records
 * a durable kind word and the command that made the pool (in .bss, like the
 * stores' own globals; mango_capture too, so the hand-annotated build in
 * bench/kv_explicit records it as well), and each command checks it after
 * mango_init. */
#define KV_KIND_FIXED 0x4445584946564b4dull   /* "MKVFIXED" */
#define KV_KIND_HASHMAP 0x50414d48564b4dull   /* "MKVHMAP" */
typedef struct kv_pool_kind {
    uint64_t magic; /* KV_KIND_*; 0 in a pool made before the word existed */
    char cmd[24];   /* the kvstore command that made the pool */
} kv_pool_kind;
static kv_pool_kind pool_kind;

static void record_pool_kind(uint64_t magic)
{
    kv_pool_kind k = {.magic = magic};
    snprintf(k.cmd, sizeof k.cmd, "%s", O.cmd);
    mango_capture(&pool_kind, sizeof pool_kind);
    pool_kind = k;
}

/* The pool a command opens: --pool, else $MANGO_POOL, else mango's default
 * /dev/shm/mango-<exe>.pool (hashmap: /dev/shm/mango-<exe>-hashmap.pool). */
static const char *pool_name(void)
{
    static char def[4200];
    if (O.pool)
        return O.pool;
    const char *e = getenv("MANGO_POOL");
    if (e && *e)
        return e;
    const char *base = strrchr(O.self, '/');
    snprintf(def, sizeof def, "/dev/shm/mango-%s.pool", base ? base + 1 : "kvstore");
    return def;
}

static const char *kind_name(uint64_t magic)
{
    return magic == KV_KIND_FIXED ? "the fixed-size store" : "the hash map";
}

/* Exit 2 after mango_init, closing the pool first (nothing was written). */
static void die_open(void)
{
    mango_shutdown();
    exit(2);
}

/* After mango_init: refuse a pool that holds the other store. A pool with
 * neither (its initial batch missing) is left to the caller. */
static void check_pool_kind(int st, uint64_t want)
{
    if (st != MANGO_RECOVERED)
        return;
    uint64_t have = pool_kind.magic;
    if (have == 0) /* a pool made before the kind word: look at the stores */
        have = kv_fixed_n_values() ? KV_KIND_FIXED : kvh_buckets() ? KV_KIND_HASHMAP : 0;
    if (have == 0 || have == want)
        return;
    const char *p = pool_name();
    fprintf(stderr, "kvstore: pool %s holds %s", p, kind_name(have));
    if (pool_kind.cmd[0])
        fprintf(stderr, " (made by 'kvstore %.*s')", (int)sizeof pool_kind.cmd, pool_kind.cmd);
    fprintf(stderr, "; 'kvstore %s' uses %s and cannot open it.\n", O.cmd, kind_name(want));
    if (want == KV_KIND_HASHMAP) {
        const char *base = strrchr(O.self, '/');
        fprintf(stderr, "Give it another pool (--pool PATH; with neither --pool nor $MANGO_POOL it uses "
                        "/dev/shm/mango-%s-hashmap.pool) or remove %s to start over.\n",
                base ? base + 1 : "kvstore", p);
    } else {
        fprintf(stderr, "Give it another pool (--pool PATH) or remove %s to start over.\n", p);
    }
    die_open();
}

/* init_state of the fixed-size store: a store the durable heap cannot hold
 * is not made (kv_fixed_init would abort()); start_fixed reports it. */
static void init_fixed(void *arg)
{
    const kv_fixed_params *p = arg;
    if (!mango_heap_fits((size_t)p->n_values * p->value_size))
        return;
    kv_fixed_init(arg);
    record_pool_kind(KV_KIND_FIXED);
}

static void init_hashmap(void *arg)
{
    kvh_init(arg);
    record_pool_kind(KV_KIND_HASHMAP);
}

/* Start the fixed-size store; exits with status 2 on error. */
int start_fixed(void)
{
    static kv_fixed_params params;
    params.n_values = O.values;
    params.value_size = O.value_size;
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = O.pool;
    cfg.mode = O.mode;
    cfg.pool_size = O.pool_size;
    cfg.log_size = O.log_size;
    mango_callbacks cb = {
        .is_read_only = kv_fixed_is_read_only,
        .process_request = kv_fixed_process,
        .request_keys = !strcmp(O.read_keys, "wrong") ? kv_fixed_request_wrong_keys
                                                      : kv_read_keys_callback(kv_fixed_request_keys),
        .init_state = init_fixed,
        .init_state_arg = &params,
    };
    int st = mango_init(&cfg, &cb);
    if (st < 0) {
        fprintf(stderr, "kvstore: %s: %s\n", mango_strerror(st), mango_last_error());
        exit(2);
    }
    check_pool_kind(st, KV_KIND_FIXED);
    if (st == MANGO_FRESH && kv_fixed_n_values() == 0) {
        /* init_fixed found no room: remove the pool just made, which holds
         * nothing, so a retry with a larger --pool-size makes a new one. */
        uint64_t used, cap;
        mango_heap_room(&used, &cap);
        const char *p = pool_name();
        fprintf(stderr, "kvstore: %u values of %u bytes (%.1f MiB) do not fit in the durable heap of "
                        "a %.1f MiB pool (%.1f MiB of heap): give a new pool a larger --pool-size, "
                        "or use fewer or smaller values\n",
                O.values, O.value_size, (double)O.values * O.value_size / 1048576.0,
                (double)O.pool_size / 1048576.0, (double)cap / 1048576.0);
        mango_shutdown();
        if (O.mode != MANGO_PERSIST_NONE) {
            char bb[4300];
            snprintf(bb, sizeof bb, "%s.bigbatch", p);
            unlink(p);
            unlink(bb);
        }
        exit(2);
    }
    if (kv_fixed_n_values() == 0 && st == MANGO_RECOVERED && O.tolerate_empty)
        return st; /* verify: a recovered pool without its store is data loss */
    if (kv_fixed_n_values() != O.values || kv_fixed_value_size() != O.value_size) {
        const char *p = pool_name();
        fprintf(stderr, "kvstore: pool %s holds %u values of %u bytes", p, kv_fixed_n_values(),
                kv_fixed_value_size());
        if (pool_kind.cmd[0])
            fprintf(stderr, " (made by 'kvstore %.*s')", (int)sizeof pool_kind.cmd, pool_kind.cmd);
        fprintf(stderr, "; options say %u of %u%s\n", O.values, O.value_size,
                !strcmp(O.cmd, "demo") && !O.values_set ? " (the demo's own store: 1000 values of 64 bytes)" : "");
        if (kv_fixed_n_values())
            fprintf(stderr, "Use this pool with --values %u --value-size %u, give another pool "
                            "(--pool PATH), or remove %s to start over.\n",
                    kv_fixed_n_values(), kv_fixed_value_size(), p);
        die_open();
    }
    return st;
}

static void shutdown_or_die(void)
{
    int rc = mango_shutdown();
    if (rc) {
        fprintf(stderr, "kvstore: shutdown: %s\n", mango_last_error());
        exit(2);
    }
}

static int cmd_or_die(void *c)
{
    int rc = mango_client_cmd(c);
    if (rc) {
        fprintf(stderr, "kvstore: command failed: %s: %s\n", mango_strerror(rc), mango_last_error());
        exit(2);
    }
    return rc;
}

/* ---- demo ---- */

static void *demo_thread(void *arg)
{
    uint32_t t = (uint32_t)(uintptr_t)arg;
    char *val = malloc(O.value_size);
    for (uint64_t s = kv_fixed_client_seq(t) + 1, end = s + 1000; s < end; s++) {
        uint32_t idx = kvw_index(t, s, 4, O.values);
        kvw_value(val, O.value_size, t, s, idx);
        kv_fixed_cmd c = {.op = KV_PUT, .index = idx, .client = t, .seq = s, .value = val};
        cmd_or_die(&c);
    }
    free(val);
    return NULL;
}

static int run_demo(void)
{
    /* The demo's own store: 1000 values of 64 bytes, unless the options say
     * otherwise (to open a pool another command made). */
    if (!O.value_size_set)
        O.value_size = 64;
    if (!O.values_set)
        O.values = 1000;
    if (O.values < 4)
        die_usage("%s", "demo: --values must be at least 4 (it runs 4 threads)");
    O.threads = 4;
    int st = start_fixed();
    uint64_t before = 0;
    for (uint32_t t = 0; t < 4; t++)
        before += kv_fixed_client_seq(t);
    printf("kvstore demo: pool %s: %s, %" PRIu64 " updates applied so far\n", pool_name(),
           status_name(st), before);
    if (st == MANGO_RECOVERED) {
        mango_stats r;
        mango_get_stats(&r);
        printf("kvstore demo: recovery replayed %" PRIu64 " committed batch%s from the log%s\n",
               r.recovery_frames_replayed, r.recovery_frames_replayed == 1 ? "" : "es",
               r.recovery_torn_tail ? " and discarded an incomplete last one (never acknowledged)" : "");
    }
    pthread_t th[4];
    for (uintptr_t t = 0; t < 4; t++)
        pthread_create(&th[t], NULL, demo_thread, (void *)t);
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    mango_stats s;
    mango_get_stats(&s);
    uint64_t after = 0;
    for (uint32_t t = 0; t < 4; t++)
        after += kv_fixed_client_seq(t);
    printf("kvstore demo: 4 threads applied 4000 durable PUTs in %" PRIu64
           " batches (%.1f per batch), %" PRIu64 " log blocks; %" PRIu64 " updates in total now\n",
           s.batches, s.batches ? (double)s.rw_commands / s.batches : 0.0, s.log_blocks, after);
    shutdown_or_die();
    printf("kvstore demo: run me again: the %" PRIu64 " updates will be RECOVERED\n", after);
    return 0;
}

/* ---- run: throughput ---- */

typedef struct run_thread {
    pthread_t th;
    uint32_t id;
    uint64_t ops, puts;
    char pad[64];
} run_thread;

static _Atomic int run_stop;

static kvw_zipf run_zipf;

static void *run_main(void *arg)
{
    run_thread *r = arg;
    uint64_t rng = kvw_mix(O.seed + r->id);
    char *val = malloc(O.value_size), *out = malloc(O.value_size);
    uint64_t s = kv_fixed_client_seq(r->id);
    while (!atomic_load_explicit(&run_stop, memory_order_relaxed)) {
        for (int k = 0; k < 64; k++) {
            rng = kvw_mix(rng + 1);
            bool put = (rng % 100) < O.update_pct;
            uint32_t idx = O.zipf > 0 ? (uint32_t)kvw_zipf_next(&run_zipf, kvw_mix(rng ^ 0xabcdef))
                                      : (uint32_t)((rng >> 8) % O.values);
            kv_fixed_cmd c = {.index = idx, .client = r->id};
            if (put) {
                c.op = KV_PUT;
                c.seq = ++s;
                memset(val, (int)(s & 0xff), O.value_size);
                c.value = val;
                r->puts++;
            } else {
                c.op = KV_GET;
                c.out = out;
            }
            cmd_or_die(&c);
            r->ops++;
        }
    }
    free(val);
    free(out);
    return NULL;
}

static int run_load(void)
{
    int st = start_fixed();
    if (O.zipf > 0)
        kvw_zipf_init(&run_zipf, O.values, O.zipf);
    /* Load phase (as YCSB's): write every value once in one bulk command, so
     * GETs read real memory in every mode (an untouched calloc'd store would
     * be served from the kernel's shared zero page). */
    char *fill = malloc(O.value_size);
    memset(fill, 0x5a, O.value_size);
    kv_fixed_cmd load = {.op = KV_FILL, .value = fill};
    cmd_or_die(&load);
    free(fill);
    run_thread *th = calloc(O.threads, sizeof *th);
    mango_stats s0, s1;
    mango_get_stats(&s0);
    double t0 = now_s();
    for (unsigned i = 0; i < O.threads; i++) {
        th[i].id = i;
        pthread_create(&th[i].th, NULL, run_main, &th[i]);
    }
    struct timespec d = {(time_t)O.seconds, (long)((O.seconds - (time_t)O.seconds) * 1e9)};
    nanosleep(&d, NULL);
    atomic_store(&run_stop, 1);
    uint64_t ops = 0, puts = 0;
    for (unsigned i = 0; i < O.threads; i++) {
        pthread_join(th[i].th, NULL);
        ops += th[i].ops;
        puts += th[i].puts;
    }
    double el = now_s() - t0;
    mango_get_stats(&s1);
    uint64_t b = s1.batches - s0.batches;
    printf("mode=%s status=%s threads=%u update_pct=%u zipf=%.2f seconds=%.2f ops=%" PRIu64
           " ops_per_sec=%.0f puts=%" PRIu64 " batches=%" PRIu64 " mean_batch=%.2f"
           " syncs_per_batch=%.3f log_bytes_per_update=%.1f log_full_waits=%" PRIu64
           " commit_us=%.1f\n",
           O.mode == MANGO_PERSIST_NONE ? "none" : "durable", status_name(st), O.threads,
           O.update_pct, O.zipf, el, ops, ops / el, puts, b, b ? (double)(s1.rw_commands - s0.rw_commands) / b : 0,
           b ? (double)(s1.frontend_syncs - s0.frontend_syncs) / b : 0,
           puts ? (double)(s1.log_bytes - s0.log_bytes) / puts : 0, s1.log_full_waits - s0.log_full_waits,
           b ? (double)(s1.commit_ns_total - s0.commit_ns_total) / b / 1000.0 : 0);
    free(th);
    shutdown_or_die();
    return 0;
}

/* ---- crash test: worker / verify / orchestrator ---- */



ack_file *open_ack_at(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        fprintf(stderr, "kvstore: cannot open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    if (ftruncate(fd, sizeof(ack_file)) != 0) {
        fprintf(stderr, "kvstore: cannot size %s: %s\n", path, strerror(errno));
        exit(2);
    }
    ack_file *a = mmap(NULL, sizeof *a, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (a == MAP_FAILED) {
        fprintf(stderr, "kvstore: cannot map %s\n", path);
        exit(2);
    }
    if (a->magic == 0) {
        a->magic = ACK_MAGIC;
        a->threads = O.threads;
        a->values = O.values;
        a->value_size = O.value_size;
    } else if (a->magic != ACK_MAGIC || a->threads != O.threads || a->values != O.values ||
               a->value_size != O.value_size) {
        fprintf(stderr, "kvstore: %s was written with other options\n", path);
        exit(2);
    }
    return a;
}

ack_file *open_ack(bool create)
{
    if (!O.ack)
        die_usage("%s", "--ack FILE is required");
    if (!create && access(O.ack, F_OK) != 0) {
        fprintf(stderr, "kvstore: %s does not exist\n", O.ack);
        exit(2);
    }
    return open_ack_at(O.ack);
}

typedef struct worker_thread {
    pthread_t th;
    uint32_t id;
    ack_file *ack;
} worker_thread;

int kv_acked_put(uint32_t client, uint64_t *seq, ack_slot *a, char *val)
{
    uint64_t next = *seq + 1;
    uint32_t idx = kvw_index(client, next, O.threads, O.values);
    kvw_value(val, O.value_size, client, next, idx);
    kv_fixed_cmd c = {.op = KV_PUT, .index = idx, .client = client, .seq = next, .value = val};
    atomic_store(&a->inflight, next);
    int rc = mango_client_cmd(&c);
    if (rc)
        return rc;
    atomic_store(&a->acked, next);
    *seq = next;
    return 0;
}

static _Atomic uint64_t bad_reads;

/* A GET must see zero bytes or a complete value written by the index's owner. */
static bool value_is_whole(const char *v, uint32_t idx)
{
    uint64_t hdr[2];
    memcpy(hdr, v, 16);
    if (hdr[0] == 0 && hdr[1] == 0) {
        for (uint32_t i = 16; i < O.value_size; i++)
            if (v[i])
                return false;
        return true;
    }
    uint32_t t = (uint32_t)(hdr[0] >> 32);
    if ((uint32_t)hdr[0] != idx || t >= O.threads)
        return false;
    char *want = alloca(O.value_size);
    kvw_value(want, O.value_size, t, hdr[1], idx);
    return memcmp(want, v, O.value_size) == 0;
}

static void *worker_main(void *arg)
{
    worker_thread *w = arg;
    ack_slot *a = &w->ack->slot[w->id];
    uint64_t rng = kvw_mix(O.seed * 31 + w->id);
    char *val = malloc(O.value_size), *out = malloc(O.value_size);
    uint64_t s = kv_fixed_client_seq(w->id);
    for (;;) {
        rng = kvw_mix(rng + 1);
        if ((rng % 100) < O.update_pct) {
            int rc = kv_acked_put(w->id, &s, a, val);
            if (rc) {
                fprintf(stderr, "kvstore: command failed: %s: %s\n", mango_strerror(rc),
                        mango_last_error());
                exit(2);
            }
            atomic_fetch_add(&w->ack->total_acked, 1);
        } else {
            uint32_t idx = (uint32_t)((rng >> 8) % O.values);
            kv_fixed_cmd c = {.op = KV_GET, .index = idx, .client = w->id, .out = out};
            cmd_or_die(&c);
            if (!value_is_whole(out, idx))
                atomic_fetch_add(&bad_reads, 1);
        }
    }
    return NULL;
}

static int run_worker(void)
{
    ack_file *ack = open_ack(true);
    start_fixed();
    for (uint32_t t = 0; t < O.threads; t++) {
        uint64_t s = kv_fixed_client_seq(t);
        if (s < atomic_load(&ack->slot[t].acked)) {
            fprintf(stderr, "kvstore worker: client %u: pool has seq %" PRIu64 " < acked %" PRIu64
                            " (run verify first)\n", t, s, atomic_load(&ack->slot[t].acked));
            exit(1);
        }
    }
    worker_thread *w = calloc(O.threads, sizeof *w);
    for (unsigned i = 0; i < O.threads; i++) {
        w[i].id = i;
        w[i].ack = ack;
        pthread_create(&w[i].th, NULL, worker_main, &w[i]);
    }
    double end = now_s() + (O.seconds_set ? O.seconds : 1e9);
    while (now_s() < end) {
        usleep(10000);
        if (atomic_load(&bad_reads)) {
            fprintf(stderr, "kvstore worker: a GET saw a torn value\n");
            _exit(1);
        }
    }
    _exit(0); /* the worker is meant to be killed; no clean shutdown */
}

/* Recover, compare against the ack file, then make the recovered state the new
 * baseline. Prints one line; returns 0 ok, 1 loss/tear. */
int run_verify(uint64_t *lost_out, uint64_t *torn_out)
{
    ack_file *ack = open_ack(false);
    if (O.cut_recovery)
        powerfail_cut_recovery(O.pool, O.seed);
    O.tolerate_empty = true;
    int st = start_fixed();
    if (kv_fixed_n_values() == 0) {
        uint64_t acked = 0;
        for (uint32_t t = 0; t < O.threads; t++)
            acked += atomic_load(&ack->slot[t].acked);
        fprintf(stderr, "verify: the pool recovered without the store itself (its initial batch "
                        "is missing): %" PRIu64 " acknowledged PUTs LOST\n", acked);
        atomic_fetch_add(&ack->total_lost, acked + 1);
        *lost_out = acked + 1;
        *torn_out = 0;
        printf("verify: %s acked_total=%" PRIu64 " lost=%" PRIu64 " torn=0\n", status_name(st),
               atomic_load(&ack->total_acked), acked + 1);
        return 1;
    }
    uint64_t lost = 0, torn = 0, beyond = 0;
    uint64_t *last = calloc(O.values, sizeof *last);
    char *want = malloc(O.value_size);
    for (uint32_t t = 0; t < O.threads; t++) {
        uint64_t s = kv_fixed_client_seq(t);
        uint64_t acked = atomic_load(&ack->slot[t].acked);
        uint64_t inflight = atomic_load(&ack->slot[t].inflight);
        if (s < acked) {
            lost += acked - s;
            fprintf(stderr, "verify: client %u: LOST acknowledged PUTs %" PRIu64 "..%" PRIu64 "\n", t,
                    s + 1, acked);
        }
        if (s > acked && s > inflight) {
            beyond++;
            fprintf(stderr, "verify: client %u: seq %" PRIu64 " was never issued (acked %" PRIu64
                            ", in flight %" PRIu64 ")\n", t, s, acked, inflight);
        }
        for (uint64_t q = 1; q <= s; q++)
            last[kvw_index(t, q, O.threads, O.values)] = q;
    }
    /* Across clients: a batch holding several clients' PUTs must be applied
     * whole, so the total count must match the per-client sequences. */
    uint64_t sum = 0;
    for (uint32_t t = 0; t < KV_MAX_CLIENTS; t++)
        sum += kv_fixed_client_seq(t);
    if (sum != kv_fixed_total_puts()) {
        beyond++;
        fprintf(stderr, "verify: total_puts %" PRIu64 " != sum of client sequences %" PRIu64
                        " (a batch was half-applied across clients)\n", kv_fixed_total_puts(), sum);
    }
    for (uint32_t i = 0; i < O.values; i++) {
        uint32_t t = i % O.threads;
        const char *v = kv_fixed_value(i);
        if (last[i] == 0 || i >= O.threads * (O.values / O.threads)) {
            for (uint32_t k = 0; k < O.value_size; k++)
                if (v[k]) {
                    torn++;
                    fprintf(stderr, "verify: index %u should be empty\n", i);
                    break;
                }
            continue;
        }
        kvw_value(want, O.value_size, t, last[i], i);
        if (memcmp(want, v, O.value_size) != 0) {
            torn++;
            if (torn < 10)
                fprintf(stderr, "verify: index %u does not hold client %u's write %" PRIu64
                                " (batch half-applied or torn)\n", i, t, last[i]);
        }
    }
    for (uint32_t t = 0; t < O.threads; t++) {
        uint64_t s = kv_fixed_client_seq(t);
        atomic_store(&ack->slot[t].acked, s);
        atomic_store(&ack->slot[t].inflight, s);
    }
    if (!O.quiet)
        printf("verify: %s acked_total=%" PRIu64 " lost=%" PRIu64 " torn=%" PRIu64 "\n",
               status_name(st), atomic_load(&ack->total_acked), lost, torn + beyond);
    shutdown_or_die();
    atomic_fetch_add(&ack->total_lost, lost);
    atomic_fetch_add(&ack->total_torn, torn + beyond);
    *lost_out = lost;
    *torn_out = torn + beyond;
    return lost || torn || beyond ? 1 : 0;
}

static pid_t spawn(const char *cmd)
{
    char threads[16], values[16], vsize[16], upd[16], seed[32], psize[32], lsize[32];
    snprintf(threads, sizeof threads, "%u", O.threads);
    snprintf(values, sizeof values, "%u", O.values);
    snprintf(vsize, sizeof vsize, "%u", O.value_size);
    snprintf(upd, sizeof upd, "%u", O.update_pct);
    snprintf(seed, sizeof seed, "%" PRIu64, kvw_mix(O.seed++));
    snprintf(psize, sizeof psize, "%zu", O.pool_size);
    snprintf(lsize, sizeof lsize, "%zu", O.log_size);
    const char *mode = kv_mode_name(O.mode);
    pid_t pid = fork();
    if (pid == 0) {
        execl(O.self, O.self, cmd, "--pool", O.pool, "--ack", O.ack, "--mode", mode, "--threads",
              threads, "--values", values, "--value-size", vsize, "--update-pct", upd, "--seed", seed,
              "--pool-size", psize, "--log-size", lsize, "--read-keys", O.read_keys, "--quiet", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int run_crash_test(void)
{
    kv_refuse_mode_none("crash-test");
    if (!O.pool || !O.ack)
        die_usage("%s", "crash-test needs --pool and --ack (fresh files are created)");
    unlink(O.pool);
    unlink(O.ack);
    srand((unsigned)O.seed);
    uint64_t failed_rounds = 0, recovery_kills = 0;
    unsigned rounds = 0;
    ack_file *ack = open_ack(true);
    for (unsigned r = 0; r < O.rounds; r++) {
        pid_t w = spawn("worker");
        unsigned delay = O.min_ms + (unsigned)rand() % (O.max_ms - O.min_ms + 1);
        usleep(delay * 1000u);
        kill(w, SIGKILL);
        int ws;
        waitpid(w, &ws, 0);
        if (!(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL)) {
            fprintf(stderr, "crash-test: round %u: worker exited by itself (status %d)\n", r,
                    WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
            failed_rounds += WIFEXITED(ws) && WEXITSTATUS(ws) == 1; /* torn GET, pool behind acks */
            if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 1))
                return 2;
        }
        /* One round in five also crashes the recovery itself. */
        if (rand() % 5 == 0) {
            pid_t v = spawn("verify");
            usleep((unsigned)rand() % 3000);
            kill(v, SIGKILL);
            waitpid(v, &ws, 0);
            if (WIFSIGNALED(ws))
                recovery_kills++;
            else if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0) {
                fprintf(stderr, "crash-test: round %u: verify failed (status %d)\n", r, WEXITSTATUS(ws));
                failed_rounds++;
            }
        }
        pid_t v = spawn("verify");
        waitpid(v, &ws, 0);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) == 2) {
            fprintf(stderr, "crash-test: round %u: verify could not run (status %d)\n", r, ws);
            return 2;
        }
        if (WEXITSTATUS(ws) == 1) {
            fprintf(stderr, "crash-test: round %u: verification FAILED; stopping\n", r);
            failed_rounds++; /* details were printed by verify */
            rounds++;
            break; /* the pool no longer matches the acknowledgements */
        }
        rounds++;
        if (!O.quiet && (r + 1) % 10 == 0)
            fprintf(stderr, "crash-test: %u/%u rounds, %" PRIu64 " acknowledged PUTs so far\n", r + 1,
                    O.rounds, atomic_load(&ack->total_acked));
    }
    uint64_t lost = atomic_load(&ack->total_lost), torn = atomic_load(&ack->total_torn);
    printf("crash-test: recovery itself was killed %" PRIu64 " times; %" PRIu64 " rounds failed\n",
           recovery_kills, failed_rounds);
    printf("rounds=%u acked=%" PRIu64 " lost=%" PRIu64 " torn=%" PRIu64 "\n", rounds,
           atomic_load(&ack->total_acked), lost, torn);
    return lost || torn || failed_rounds ? 1 : 0;
}

/* ---- hashmap ---- */

static int run_hashmap(void)
{
    /* Its own default pool: the other commands' default holds the
     * fixed-size store (check_pool_kind refuses one given explicitly). */
    static char def[4200];
    const char *env = getenv("MANGO_POOL");
    if (!O.pool && !(env && *env)) {
        const char *base = strrchr(O.self, '/');
        snprintf(def, sizeof def, "/dev/shm/mango-%s-hashmap.pool", base ? base + 1 : "kvstore");
        O.pool = def;
    }
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = O.pool;
    cfg.mode = O.mode;
    cfg.pool_size = O.pool_size;
    cfg.log_size = O.log_size;
    if (!strcmp(O.read_keys, "wrong"))
        die_usage("%s", "--read-keys wrong is a test of the fixed-size store's GETs; the hash map has no such mode");
    mango_callbacks cb = {.is_read_only = kvh_is_read_only, .process_request = kvh_process,
                          .init_state = init_hashmap, .request_keys = kv_read_keys_callback(kvh_request_keys)};
    hm_ack *ack = O.ack ? hm_ack_open(O.ack, O.values) : NULL; /* (a bad one: before the pool is opened) */
    int st = mango_init(&cfg, &cb);
    if (st < 0) {
        fprintf(stderr, "kvstore: %s: %s\n", mango_strerror(st), mango_last_error());
        return 2;
    }
    check_pool_kind(st, KV_KIND_HASHMAP);
    if (kvh_buckets() == 0) {
        fprintf(stderr, "hashmap: pool %s recovered without the hash map (its initial batch is missing)\n",
                pool_name());
        mango_shutdown();
        return 1;
    }
    int rc = kvh_check();
    printf("hashmap: %s with %" PRIu64 " keys in %" PRIu64 " buckets, check %s\n", status_name(st),
           kvh_count(), kvh_buckets(), rc ? "FAILED" : "ok");
    fflush(stdout); /* crash tests read this line from a process they kill */
    if (rc)
        return 1;
    /* Reference model in transient memory: key i -> value length or 0. */
    uint32_t nkeys = O.values;
    uint32_t *ref = calloc(nkeys, sizeof *ref);
    char key[32], *val = malloc(4096), *out = malloc(4096);
    for (uint32_t i = 0; i < nkeys; i++) { /* learn what survived */
        kvh_cmd g = {.op = KVH_GET, .key = key, .key_len = (size_t)snprintf(key, sizeof key, "key:%u", i),
                     .out = out, .out_cap = 4096};
        mango_client_cmd(&g);
        ref[i] = g.status == 0 ? (uint32_t)g.out_len : 0;
        if (g.status == 0)
            for (size_t k = 0; k < g.out_len; k++)
                if (out[k] != (char)(i + k)) {
                    printf("hashmap: key %u has a wrong value after recovery\n", i);
                    return 1;
                }
    }
    if (ack) {
        uint64_t lost = hm_ack_check(ack, ref);
        printf("hashmap: acknowledged %" PRIu64 " PUT/DEL so far, lost %" PRIu64 "\n", hm_ack_total(ack), lost);
        fflush(stdout);
        if (lost)
            return 1;
    }
    uint64_t no_room = 0;
    uint64_t rng = O.seed;
    for (uint64_t n = 0; n < O.ops; n++) {
        rng = kvw_mix(rng + 1);
        uint32_t i = (uint32_t)(rng % nkeys);
        kvh_cmd c = {.key = key, .key_len = (size_t)snprintf(key, sizeof key, "key:%u", i)};
        unsigned r = (rng >> 40) % 100;
        if (r < 45) {
            c.op = KVH_PUT;
            c.value_len = 1 + (rng >> 20) % 2000;
            for (size_t k = 0; k < c.value_len; k++)
                val[k] = (char)(i + k);
            c.value = val;
        } else if (r < 60) {
            c.op = KVH_DEL;
        } else {
            c.op = KVH_GET;
            c.out = out;
            c.out_cap = 4096;
        }
        uint32_t len = c.op == KVH_PUT ? (uint32_t)c.value_len : 0;
        if (ack && c.op != KVH_GET)
            hm_ack_begin(ack, i, len);
        if (mango_client_cmd(&c) != 0) {
            fprintf(stderr, "hashmap: %s\n", mango_last_error());
            return 2;
        }
        /* A PUT that found no memory in the durable heap left the map as
         * it was (counted, not a loss). */
        bool no_memory = c.op == KVH_PUT && c.status != 0;
        no_room += no_memory;
        if (ack && c.op != KVH_GET)
            hm_ack_end(ack, i, len, !no_memory);
        if (c.op == KVH_PUT) {
            if (!no_memory)
                ref[i] = len;
        } else if (c.op == KVH_DEL) {
            if ((c.status == 0) != (ref[i] != 0)) {
                printf("hashmap: DEL of key %u disagrees with the model\n", i);
                return 1;
            }
            ref[i] = 0;
        } else if ((c.status == 0) != (ref[i] != 0) || (c.status == 0 && c.out_len != ref[i])) {
            printf("hashmap: GET of key %u disagrees with the model\n", i);
            return 1;
        }
    }
    rc = kvh_check();
    printf("hashmap: after %" PRIu64 " ops: %" PRIu64 " keys in %" PRIu64 " buckets, check %s\n",
           O.ops, kvh_count(), kvh_buckets(), rc ? "FAILED" : "ok");
    if (no_room)
        printf("hashmap: %" PRIu64 " PUTs found the durable heap full and changed nothing (a larger "
               "--pool-size holds them)\n", no_room);
    shutdown_or_die();
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    parse(argc, argv);
    if (!strcmp(O.cmd, "demo"))
        return run_demo();
    if (!strcmp(O.cmd, "run"))
        return run_load();
    if (!strcmp(O.cmd, "worker"))
        return run_worker();
    if (!strcmp(O.cmd, "verify")) {
        uint64_t l, t;
        return run_verify(&l, &t);
    }
    if (!strcmp(O.cmd, "crash-test"))
        return run_crash_test();
    if (!strcmp(O.cmd, "hashmap"))
        return run_hashmap();
    if (!strcmp(O.cmd, "powerfail"))
        return run_powerfail();
    if (!strcmp(O.cmd, "history-worker"))
        return run_history_worker();
    if (!strcmp(O.cmd, "history-test"))
        return run_history_test();
    die_usage("unknown command '%s'", O.cmd);
    return 2;
}
