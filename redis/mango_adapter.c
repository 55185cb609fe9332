/* mango_adapter.c -- Mangosteen integration for Redis 7.0.15.
 *
 * Compiled into redis-server (copied into redis/src by redis/build.sh; the
 * patch adds it to REDIS_SERVER_OBJ). See mango_adapter.h and docs/redis.md.
 *
 * Durable state:
 *   - server.db (the redisDb array) and each db's dict and expires (and
 *     everything reachable from them), created in the initial batch;
 *   - the shared objects (struct sharedObjectsStruct shared): the keyspace
 *     stores pointers to them (e.g. shared.integers for small integer values);
 *   - dict.c's hash seed (the db dicts' buckets depend on it);
 *   - every .data/.bss byte a write section writes (counters, cursors).
 * Transient: everything else initServer() builds (sockets, event loop,
 * clients, scripting, config) and the per-db blocking/ready/watched key
 * dicts, which point at clients.
 *
 * Reply dependencies (pipelined group commit): a reply may leave only when
 * the batches whose effects it can report are durable. Its ticket is
 *   - the open batch's, for replies added inside a write section (write
 *     commands, served blocked clients) or by a command that opened one
 *     (e.g. a GET that deleted an expired key);
 *   - for a read command, the largest ticket among the batches that last
 *     wrote one of its keys (key_slots) and global_ticket (batches whose
 *     effects are not tied to known keys: key-less writes such as FLUSHALL or
 *     SWAPDB, MOVE/COPY, write sections outside commands such as expiry and
 *     eviction); a read command with no keys (DBSIZE, SCAN, ...) depends on
 *     everything submitted;
 *   - everything submitted, for replies added outside commands.
 * A client's ticket only grows while it has unsent output. Keys are stamped
 * before a write command runs (the ticket is known once its batch is open),
 * which is conservative. key_slots is a fixed table of tickets indexed by a
 * hash of (db, key): a write raises its key's slot to its ticket, a read
 * takes the slot's value. Keys sharing a slot only make a read wait for an
 * unrelated, later batch (never for less than its own key's), and a slot
 * whose ticket is durable holds nothing back, so the table never needs
 * clearing: a write or a read costs a hash and an array access per key.
 *
 * Gathering under load (mangoCommit): a pass's batch is normally submitted at
 * the pass's end. When the server is busy (on average at least
 * GATHER_MIN_CMDS commands per pass), no sync is in flight and requests are
 * already waiting on the event loop, the batch stays open into the next
 * pass, for at most MANGO_REDIS_GATHER_US microseconds (default 250; 0 turns
 * it off) after it opened. The waiting requests join it and one sync covers
 * them all. Without this, an idle sync thread started a sync for the first
 * pass's one or two updates, and the syncs, ~40 us of CPU each on the VMs
 * measured, took the CPU the loop needed. While a sync is in flight nothing
 * is held: the batch is sealed and goes with the next sync anyway. With
 * nothing waiting, epoll_wait would sleep, so nothing is held either.
 *
 * Syncing on the loop when it would only wait (commit_choice): under the same
 * load, while writes are at least 30 % of the commands, a batch that is not
 * held, with no sync in flight and no request waiting, is committed by the
 * loop itself (mango_batch_end), as AOF-always does, instead of going to the
 * sync thread: the loop would sleep until that sync anyway, and handing it
 * over costs two wake-ups and, where the clients share the CPUs, the sync
 * thread's wait for one. MANGO_REDIS_INLINE_IDLE=0 turns it off.
 */
#include "server.h"
#include "mango_adapter.h"
#include "script.h" /* scriptIsTimedout: replies served while a script yields */
#include "mango.h"

#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <time.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Defined in server.c without a declaration in server.h. */
void createSharedObjects(void);
/* Added to zmalloc.c by the patch (recovery sets the restored counter). */
void zmalloc_set_used_memory(size_t um);
extern dictType keylistDictType;

/* The adapter's bookkeeping of the event loop's thread is thread-local
 * (__thread) wherever a write section can store it: nested sections (an
 * expired key's deletion inside a SET, FLUSHALL's graveyard), calls nested in
 * EXEC or scripts, the import. A .bss word stored while the batch captures is
 * logged and comes back after a restart with the value it had at the commit,
 * and a commit can come inside a command (mangoSyncAll from SHUTDOWN or a
 * replica's SYNC): a call_depth or write_depth restored at 1 would have made
 * every later command look nested (no batch, no stamp), a cached durable
 * ticket released replies early (session 34). Thread-locals are never
 * logged. */
static int mango_on;        /* mango_init succeeded */
static int pipelined;       /* batches may be in flight: track reply dependencies */
static __thread int call_depth;       /* nesting of call() */
#define CALL_DEPTH_TRACKED 16
static __thread client *calling[CALL_DEPTH_TRACKED]; /* calling[d]: the client of call() at depth d + 1 */
/* The outermost command may write from inside (EXEC of writes, a script):
 * messages its inner commands send other clients wait for its batch. */
static __thread int outer_may_write;
/* DEBUG RELOAD runs: what it empties is freed at once (mango_release.c). */
static __thread int freeing_at_once;
static __thread uint64_t cmd_dep;     /* the outermost command's dependencies so far */
static uint64_t global_ticket;
#define KEY_SLOTS (1u << 14) /* 128 KiB; with ~40 writes in flight a read
                              * meets an unrelated one about once in 400 */
static uint64_t *key_slots;   /* hash(db, key) -> ticket of its last writer */
/* Thread-local (the event loop's): read in write sections too (the eviction
 * loop's flushSlavesOutputBuffers()), where a store to a .bss word is logged,
 * and restored after a restart, where tickets count from 1 again, it released
 * replies before their batches were durable. */
static __thread uint64_t durable_seen; /* last durable ticket read from Mangosteen */
static int durable_fd = -1;  /* Mangosteen's eventfd, in the event loop */
static int mango_recovered; /* the pool held a state */
/* zmalloc's used_memory just before and just after mango_init (which may
 * restore it from the pool); see recount_used_memory(). */
static size_t used_memory_before_init, used_memory_restored;
static __thread int write_depth;     /* nesting of write sections */
static __thread int keyed_section; /* the outermost write section stamps the keys it changes (deletion sections,
                          * serving blocked clients, the graveyard's steps): no global ticket */
/* mangoNoteReply runs once per addReply* (21 times for an HGETALL of 10
 * fields), and within one command its answer does not change. note_epoch is
 * bumped wherever it could (a command or a write section begins or ends, a
 * reply is checked for writing); a call for the client noted last, in the
 * same epoch, inside a command, with its write still queued, returns at once. */
/* Thread-locals (the event loop's only): the capture plugin never logs
 * them, and mangoNoteReply writes them inside write sections, which would
 * log a block of them with every batch. */
static __thread uint64_t note_epoch = 1;
static __thread client *noted_client;
static __thread uint64_t noted_epoch;
static uintptr_t heap_lo, heap_hi;
static char init_msg[1024];  /* logged once logging is configured */
/* Test hook (redis/tests): MANGO_REDIS_TEST_COPYING_COMMAND=NAME lists one
 * more command as copying its arguments, so a test can list one that keeps
 * them (SET) and see the check stop the server (copies_argument_bytes). */
static const char *test_copying_command;
/* Test hook (redis/tests): MANGO_REDIS_TEST_READS_IGNORE_KEYS=1 is a mutant
 * that breaks the reply-dependency rule on purpose: keyed reads stop waiting
 * for the batches that last wrote their keys (read_dependency() skips
 * key_slots), so a read can report a write that is not durable yet. The
 * functional test runs its ordering check against it and expects it to fail,
 * which shows that the check can fail. Logged as a warning when set. */
static int test_reads_ignore_keys;

/* Gathering under load (see the top of the file). */
#define GATHER_DEFAULT_US 250
#define GATHER_MIN_CMDS 8 /* commands per pass, on average, before a batch may be held */
static uint64_t gather_ns;         /* 0: off */
static unsigned gather_min_cmds;   /* MANGO_REDIS_TEST_GATHER_MIN_CMDS overrides it (tests) */
static int inline_when_idle = 1;   /* MANGO_REDIS_INLINE_IDLE=0 turns it off */
static uint64_t inline_commits;    /* passes that synced their batch themselves */
static uint64_t batch_opened_ns;   /* when the open batch began */
static __thread uint64_t cmds_this_pass;
static uint64_t cmds_per_pass_x16; /* moving average of commands per pass (1/16 weight), times 16 */
static __thread uint64_t writes_this_pass;
static uint64_t writes_per_pass_x16; /* the same for write commands */
static uint64_t gather_holds;      /* passes that kept their batch open (MANGO_STATS) */
/* An import of an RDB file serves clients between two reads of the file
 * (serve_during_import): their replies (LOADING errors, INFO) depend on no
 * batch, so they leave at once, as with stock Redis's loading. */
static int import_serving;
static __thread int importing; /* an import is loading the RDB file (see "importing" below) */
/* DEBUG RELOAD serves clients between two reads of the file too
 * (mangoProcessEventsWhileLoading), with its write section's batch paused:
 * their replies wait for what was submitted before that batch. */
static int reload_serving;

/* Durable: written in the initial batch, restored by recovery. */
static int durable_dbnum;
static uint64_t durable_magic;
#define MANGO_REDIS_MAGIC 0x6d616e676f726473ull /* "mangords" */

static bool dummy_ro(void *ctx) { (void)ctx; return false; }
static void dummy_process(void *ctx) { (void)ctx; }

/* ---- settings ----------------------------------------------------------- *
 * Each setting comes from redis.conf or the command line (mango-pool, ...) or
 * from the environment (MANGO_POOL, ...); both at once must agree. Redis
 * registers the options in config.c (immutable strings stored in the
 * mango_conf_* variables), so it accepts them, CONFIG GET shows them and
 * CONFIG REWRITE keeps them. But the pool must be open before Redis creates
 * its first dict, which is before it reads its configuration, so
 * mangoRedisInit() reads them itself, from the main config file, the files
 * it includes and the command line (read_settings); mangoCreateDatabases()
 * then checks that Redis read the same values, which catches an option given
 * on stdin (config "-"), the one place read_settings cannot look at. */
char *mango_conf_pool, *mango_conf_mode, *mango_conf_pool_size, *mango_conf_log_size;

typedef struct mango_setting {
    const char *option;     /* redis.conf name */
    const char *env;        /* environment variable */
    char **loaded;          /* what Redis's config loading stored */
    char *config;           /* what read_settings found (NULL: not given) */
    const char *config_from; /* where: the config file's path or "the command line" */
    const char *value;      /* the value used: config or environment */
} mango_setting;

static mango_setting settings[] = {
    {"mango-pool", "MANGO_POOL", &mango_conf_pool},
    {"mango-mode", "MANGO_MODE", &mango_conf_mode},
    {"mango-pool-size", "MANGO_POOL_SIZE", &mango_conf_pool_size},
    {"mango-log-size", "MANGO_LOG_SIZE", &mango_conf_log_size},
};
#define N_SETTINGS (sizeof settings / sizeof settings[0])

static mango_setting *setting_named(const char *option)
{
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (!strcasecmp(option, settings[i].option)) return &settings[i];
    return NULL;
}

/* daemonize and supervised, as read_settings finds them (the last occurrence
 * wins, as in Redis): see start_in_background(). */
static char *seen_daemonize, *seen_supervised;

static void redis_option_seen(const char *option, const char *value)
{
    char **slot = !strcasecmp(option, "daemonize") ? &seen_daemonize
                : !strcasecmp(option, "supervised") ? &seen_supervised : NULL;
    if (!slot) return;
    zfree(*slot);
    *slot = zstrdup(value);
}

static void setting_found(const char *option, const char *value, const char *from)
{
    mango_setting *st = setting_named(option);
    if (!st) return;
    zfree(st->config); /* the last occurrence wins, as in Redis */
    st->config = *value ? zstrdup(value) : NULL; /* "" means unset, as Redis stores it */
    st->config_from = from;
}

/* The mango-* lines of a config file and of the files it includes (glob
 * patterns, as Redis expands them). Lines are read whole, of any length, as
 * Redis reads them: with a 4096-byte buffer the rest of a longer line (a long
 * comment) was read as a line of its own, so "mango-pool PATH" there opened,
 * or created, a pool that Redis's configuration does not name. */
static void read_settings_file(const char *path, int depth)
{
    FILE *f = fopen(path, "r");
    if (!f) return; /* Redis's own loading reports a file it cannot read */
    const char *from = NULL; /* path, kept for messages once a setting is found here */
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        int n = 0;
        sds *a = sdssplitargs(line, &n);
        if (a && n == 2 && !strcasecmp(a[0], "include") && depth < 16) {
            glob_t g;
            if (glob(a[1], 0, NULL, &g) == 0) {
                for (size_t i = 0; i < g.gl_pathc; i++) read_settings_file(g.gl_pathv[i], depth + 1);
                globfree(&g);
            }
        } else if (a && n == 2) {
            if (setting_named(a[0])) setting_found(a[0], a[1], from ? from : (from = zstrdup(path)));
            else redis_option_seen(a[0], a[1]);
        } else if (a && n > 0 && setting_named(a[0])) {
            fprintf(stderr, "Mangosteen: %s: '%s' takes exactly one value\n", path, a[0]);
            exit(1);
        }
        sdsfreesplitres(a, n);
    }
    free(line);
    fclose(f);
}

/* The mango-* options of the main config file (the first argument, unless it
 * starts with '-', as in Redis's main()) and --mango-* VALUE arguments, then
 * the environment. */
static void read_settings(int argc, char **argv)
{
    int j = 1;
    if (argc >= 2 && argv[1][0] != '-') {
        j = 2;
        read_settings_file(argv[1], 0);
    }
    int from_stdin = 0;
    for (; j < argc; j++) {
        if (!strcmp(argv[j], "-") && (j == 1 || j == argc - 1)) from_stdin = 1; /* as Redis decides */
        if (!strncmp(argv[j], "--", 2) && !setting_named(argv[j] + 2) && j + 1 < argc &&
            strncmp(argv[j + 1], "--", 2) != 0)
            redis_option_seen(argv[j] + 2, argv[j + 1]);
        if (strncmp(argv[j], "--", 2) != 0 || !setting_named(argv[j] + 2)) continue;
        if (j + 1 >= argc || !strncmp(argv[j + 1], "--", 2)) {
            fprintf(stderr, "Mangosteen: %s needs a value\n", argv[j]);
            exit(1);
        }
        setting_found(argv[j] + 2, argv[j + 1], "the command line");
        j++;
    }
    for (size_t i = 0; i < N_SETTINGS; i++) {
        mango_setting *st = &settings[i];
        const char *e = getenv(st->env);
        if (e && !*e) e = NULL;
        if (e && st->config && strcmp(e, st->config) != 0) {
            fprintf(stderr, "Mangosteen: %s=%s and %s %s (%s) disagree: set only one of them\n", st->env, e,
                    st->option, st->config, st->config_from);
            exit(1);
        }
        st->value = st->config ? st->config : e;
    }
    if (from_stdin && !setting_named("mango-pool")->value) {
        /* Options on stdin are read too late (see above): rather than open
         * the default pool and find out afterwards, ask for the path. */
        fprintf(stderr, "Mangosteen: with the configuration on stdin, give the pool as --mango-pool PATH or "
                "MANGO_POOL=PATH (mango-* options on stdin are read too late)\n");
        exit(1);
    }
}

/* ---- daemonize ----------------------------------------------------------
 * Redis forks into the background (daemonize yes) after loading its
 * configuration, long after mangoRedisInit() opened the pool, and a fork()
 * child may not write the pool (the runtime's threads stay in the parent).
 * So when Redis is going to daemonize, the adapter forks first, before the
 * pool opens, and Redis's own fork is skipped (mangoDaemonize). Until that
 * point the parent waits and relays the child's stderr, then exits with the
 * child's status: a pool that cannot be opened or a bad directive is still
 * reported on the terminal with a non-zero exit, as stock Redis reports a bad
 * directive. The prediction follows redisIsSupervised(): supervised upstart
 * or systemd (or auto) only counts when its environment variable is set;
 * a supervisor that then does not answer makes Redis want to daemonize after
 * all, which mangoDaemonize() refuses with an explanation. */
void daemonize(void); /* server.c's (not in server.h) */
static int started_in_background;
static int background_ready = -1; /* the pipe that tells the waiting parent to exit 0 */

static int redis_will_daemonize(void)
{
    if (!seen_daemonize || strcasecmp(seen_daemonize, "yes") != 0) return 0;
    const char *sup = seen_supervised ? seen_supervised : "no";
    int upstart = getenv("UPSTART_JOB") != NULL, systemd = getenv("NOTIFY_SOCKET") != NULL;
    if (!strcasecmp(sup, "upstart")) return !upstart;
    if (!strcasecmp(sup, "systemd")) return !systemd;
    if (!strcasecmp(sup, "auto")) return !upstart && !systemd;
    return 1;
}

static void start_in_background(void)
{
    int err[2], ready[2];
    if (pipe(err) != 0 || pipe(ready) != 0) {
        fprintf(stderr, "Mangosteen: daemonize yes: pipe: %s\n", strerror(errno));
        exit(1);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "Mangosteen: daemonize yes: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (pid > 0) { /* the parent: relay until the child is in the background or gone */
        close(err[1]);
        close(ready[1]);
        char buf[4096];
        for (;;) {
            ssize_t n = read(err[0], buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(STDERR_FILENO, buf + off, (size_t)(n - off));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) break;
                off += w;
            }
        }
        char ok = 0;
        while (read(ready[0], &ok, 1) < 0 && errno == EINTR) {}
        if (ok == 'R') _exit(0);
        int status = 0; /* the child is on its way out: its exit status */
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
    }
    close(err[0]);
    close(ready[0]);
    setsid(); /* as Redis's daemonize() */
    if (dup2(err[1], STDERR_FILENO) < 0) exit(1);
    close(err[1]);
    background_ready = ready[1];
    started_in_background = 1;
}

void mangoDaemonize(int background)
{
    if (!started_in_background) {
        if (!background) return;
        if (!mango_on) {
            daemonize();
            return;
        }
        fprintf(stderr, "Mangosteen: Redis is to go into the background (daemonize yes), which the adapter did not "
                "foresee when it opened the pool (daemonize given on stdin, or a supervisor named by 'supervised' "
                "that did not answer); a process that forks after opening the pool cannot write it. Give "
                "daemonize in the config file or on the command line, or set daemonize no\n");
        exit(1);
    }
    if (!background)
        serverLog(LL_WARNING, "Mangosteen: started in the background (daemonize yes), though Redis's configuration "
                  "in the end says not to (daemonize no on stdin?); staying in the background");
    ssize_t w;
    do w = write(background_ready, "R", 1); while (w < 0 && errno == EINTR);
    close(background_ready);
    background_ready = -1;
    int fd = open("/dev/null", O_RDWR, 0); /* as Redis's daemonize(): every output goes to /dev/null */
    if (fd != -1) {
        dup2(fd, STDIN_FILENO);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO); /* closes the parent's pipe: it exits 0 */
        if (fd > STDERR_FILENO) close(fd);
    }
}

/* Digits, with an optional k, m or g suffix (KiB, MiB, GiB) where suffixes
 * are allowed, at most max: 1 and *out, or 0 for anything else. */
static int parse_number(const char *v, int suffixes, unsigned long long max, unsigned long long *out)
{
    if (!isdigit((unsigned char)v[0])) return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    int shift = 0;
    if (suffixes && (*end == 'k' || *end == 'K')) shift = 10, end++;
    else if (suffixes && (*end == 'm' || *end == 'M')) shift = 20, end++;
    else if (suffixes && (*end == 'g' || *end == 'G')) shift = 30, end++;
    if (*end || errno || n > (max >> shift)) return 0;
    *out = n << shift;
    return 1;
}

/* A number from the environment (digits, at most max), or the server stops
 * saying what was expected. */
static unsigned long long env_number_or_stop(const char *name, const char *v, unsigned long long max,
                                             const char *expected)
{
    unsigned long long n = 0;
    if (!parse_number(v, 0, max, &n)) {
        fprintf(stderr, "Mangosteen: %s '%s': expected %s\n", name, v, expected);
        exit(1);
    }
    return n;
}

/* A size setting; 0 if it is not given. Anything else stops the server. */
static size_t setting_size(const mango_setting *st)
{
    unsigned long long n = 0;
    if (!st->value)
        return 0;
    const char *name = st->config ? st->option : st->env;
    if (!parse_number(st->value, 1, SIZE_MAX, &n)) {
        fprintf(stderr, "Mangosteen: %s '%s' is not a size (a number of bytes, or with a k, m or g "
                "suffix)\n", name, st->value);
        exit(1);
    }
    if (n == 0) { /* (it was the runtime's default, silently) */
        fprintf(stderr, "Mangosteen: %s '%s': a pool or log of no bytes (leave the setting out for the "
                "default)\n", name, st->value);
        exit(1);
    }
    return (size_t)n;
}

/* After Redis loaded its configuration: it must have read the mango-*
 * options read_settings read. */
static void check_settings_loaded(void)
{
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const mango_setting *st = &settings[i];
        const char *loaded = *st->loaded;
        if (loaded && !*loaded) loaded = NULL;
        if ((loaded == NULL) != (st->config == NULL) || (loaded && strcmp(loaded, st->config) != 0)) {
            serverLog(LL_WARNING, "Mangosteen: Redis's configuration sets %s to '%s', but the pool was opened "
                      "with '%s': give the mango-* options in a config file or on the command line, not on "
                      "stdin", st->option, loaded ? loaded : "",
                      st->value ? st->value : "(default)");
            exit(1);
        }
    }
}

static void die(const char *what, int rc)
{
    serverLog(LL_WARNING, "Mangosteen: %s: %s (%s)", what, mango_strerror(rc), mango_last_error());
    /* Nothing of the open batch may be acknowledged: leave at once, without
     * running exit handlers that could write replies or files. */
    _exit(1);
}

static void mango_atexit(void)
{
    if (!mango_on) return;
    if (mango_batch_open()) {
        /* An exit with a command unfinished: SHUTDOWN NOSAVE during a busy
         * script, or inside a write command (a SHUTDOWN NOSAVE served while
         * DEBUG RELOAD loads, after it emptied the databases: committing
         * that emptied the pool). Its changes so far are dropped.
         * An import that stops (a damaged file, SIGTERM while it loads) drops
         * its batch too: the pool keeps the RUNNING mark committed before the
         * first key, so it is refused as an unfinished import
         * (mangoLoadDataFromDisk) either way, and committing a bulk import's
         * batch first logged the whole loaded heap for nothing. */
        if (importing) {
            serverLog(LL_WARNING, "Mangosteen: exiting during the import: what it loaded since its last commit is "
                      "dropped, as after a crash");
            if (mango_capture_active) mango_batch_pause();
        } else if (mangoCommandUnfinished()) {
            serverLog(LL_WARNING, "Mangosteen: exiting while a command is still running: its changes so far "
                      "are dropped, as after a crash (their replies were never sent)");
            if (mango_capture_active) mango_batch_pause(); /* no store is captured past here */
        } else
            mango_batch_end();
    }
    const char *st = getenv("MANGO_STATS");
    if (st && *st && strcmp(st, "0") != 0) {
        mango_stats s;
        mango_get_stats(&s);
        fprintf(stderr, "Mangosteen stats: batches=%llu rw_commands=%llu log_blocks=%llu log_bytes=%llu "
                "frontend_syncs=%llu backend_syncs=%llu pipelined_batches=%llu pipeline_syncs=%llu "
                "log_full_waits=%llu backend_lowered=%llu backend_boosts=%llu gather_holds=%llu "
                "heap_chunks=%llu heap_payload_bytes=%llu graves_pending=%lu log_zero_ranges=%llu\n",
                (unsigned long long)s.batches, (unsigned long long)s.rw_commands,
                (unsigned long long)s.log_blocks, (unsigned long long)s.log_bytes,
                (unsigned long long)s.frontend_syncs, (unsigned long long)s.backend_syncs,
                (unsigned long long)s.pipelined_batches, (unsigned long long)s.pipeline_syncs,
                (unsigned long long)s.log_full_waits, (unsigned long long)s.backend_lowered,
                (unsigned long long)s.backend_boosts, (unsigned long long)gather_holds,
                (unsigned long long)s.heap_chunks, (unsigned long long)s.heap_payload_bytes, mangoGravesPending(),
                (unsigned long long)s.log_zero_ranges);
    }
    mangoSnapshotCancel();
    mango_shutdown();
    mango_on = 0;
}

/* The modes of main() that print or check something and exit before any
 * dataset exists (--version, --help, --test-memory, --check-system, and the
 * redis-check-rdb/-aof programs, chosen by the executable's name), and
 * Sentinel, which keeps no dataset: they get no pool. Opening one would
 * create a 1 GiB pool file for nothing, or fail on the pool a running server
 * holds ("redis-server-durable --version" then stopped with "cannot open the
 * pool"). */
static int needs_no_pool(int argc, char **argv)
{
    const char *exec_name = strrchr(argv[0], '/');
    exec_name = exec_name ? exec_name + 1 : argv[0];
    if (strstr(exec_name, "redis-check-rdb") || strstr(exec_name, "redis-check-aof") ||
        strstr(exec_name, "redis-sentinel"))
        return 1;
    for (int j = 1; j < argc; j++)
        if (!strcmp(argv[j], "--sentinel")) return 1; /* as checkForSentinelMode() */
    if (argc < 2) return 0;
    const char *a = argv[1]; /* where main() looks for them */
    return !strcmp(a, "-v") || !strcmp(a, "--version") || !strcmp(a, "-h") || !strcmp(a, "--help") ||
           !strcmp(a, "--test-memory") || !strcmp(a, "--check-system");
}

/* --help: the Mangosteen options, before Redis's own usage. */
static void mango_usage(void)
{
    fprintf(stderr,
            "redis-server-durable: Redis 7.0.15 made durable by Mangosteen: every write is in the pool before\n"
            "its reply is sent, and a restart (after a crash too) recovers the pool's datasets (docs/redis.md).\n"
            "\n"
            "Mangosteen options, as redis.conf lines, --options or environment variables (not on stdin):\n"
            "  mango-pool PATH       MANGO_POOL       the pool file; made at the first start\n"
            "                                         (default /dev/shm/mango-redis-server-durable.pool)\n"
            "  mango-mode MODE       MANGO_MODE       emulated (default: memory only, survives process crashes),\n"
            "                                         fs (a disk file, synced; survives power loss), pmem (DAX),\n"
            "                                         auto (picked from the file system), sim, none (tests)\n"
            "  mango-pool-size SIZE  MANGO_POOL_SIZE  a new pool's size, bytes or with k/m/g (default 1g)\n"
            "  mango-log-size SIZE   MANGO_LOG_SIZE   a new pool's log (default 64m; 256m for a pool of 1g or\n"
            "                                         more on a disk)\n"
            "Refused with a pool: replicaof (a durable server does serve replicas), cluster-enabled yes,\n"
            "appendonly yes. A new pool imports dump.rdb from --dir if there is one.\n"
            "Example: redis-server-durable --mango-pool /var/lib/redis/redis.pool --mango-mode fs --save \"\"\n"
            "\n");
}

void redisOutOfMemoryHandler(size_t allocation_size); /* server.c */

/* A durable allocation that failed (a command the heap check let through:
 * docs/redis.md, "A full pool"): Redis's handler logs, writes a bug report
 * and aborts, and its own allocations came from the full heap too, so it
 * recursed until a SIGSEGV and the log held no OUT OF MEMORY line (found by
 * a review, session 36). With the batch paused they come from glibc. The
 * open batch is never committed: a restart recovers what was acknowledged. */
static void out_of_durable_memory(size_t allocation_size)
{
    if (mango_capture_active) mango_batch_pause();
    serverLog(LL_WARNING, "Mangosteen: the pool's durable heap is full: an allocation of %zu bytes failed inside "
              "a command the heap check let through; the open batch is dropped (nothing it did was acknowledged)",
              allocation_size);
    redisOutOfMemoryHandler(allocation_size);
}

void mangoRedisInit(int argc, char **argv)
{
    if (needs_no_pool(argc, argv)) {
        if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) mango_usage();
        return; /* mango_on stays 0: no pool */
    }
    mango_config cfg;
    mango_config_default(&cfg);
    test_copying_command = getenv("MANGO_REDIS_TEST_COPYING_COMMAND");
    const char *gather = getenv("MANGO_REDIS_GATHER_US");
    gather_ns = (uint64_t)GATHER_DEFAULT_US * 1000;
    if (gather && *gather)
        gather_ns = env_number_or_stop("MANGO_REDIS_GATHER_US", gather, 1000000, "microseconds, 0 to 1000000") * 1000;
    const char *inl = getenv("MANGO_REDIS_INLINE_IDLE");
    if (inl && *inl) inline_when_idle = strcmp(inl, "0") != 0;
    const char *min_cmds = getenv("MANGO_REDIS_TEST_GATHER_MIN_CMDS");
    gather_min_cmds = min_cmds && *min_cmds
                          ? (unsigned)env_number_or_stop("test hook MANGO_REDIS_TEST_GATHER_MIN_CMDS", min_cmds,
                                                         1000000, "commands per pass, 0 to 1000000")
                          : GATHER_MIN_CMDS;
    const char *ignore = getenv("MANGO_REDIS_TEST_READS_IGNORE_KEYS");
    test_reads_ignore_keys = ignore && *ignore && strcmp(ignore, "0") != 0;
    read_settings(argc, argv);
    const char *mode = setting_named("mango-mode")->value;
    if (!mode || !strcasecmp(mode, "emulated")) cfg.mode = MANGO_PERSIST_EMULATED;
    else if (!strcasecmp(mode, "auto")) cfg.mode = MANGO_PERSIST_AUTO;
    else if (!strcasecmp(mode, "fs")) cfg.mode = MANGO_PERSIST_FS;
    else if (!strcasecmp(mode, "pmem")) cfg.mode = MANGO_PERSIST_PMEM;
    else if (!strcasecmp(mode, "sim")) cfg.mode = MANGO_PERSIST_SIM;
    else if (!strcasecmp(mode, "none")) cfg.mode = MANGO_PERSIST_NONE;
    else {
        const mango_setting *st = setting_named("mango-mode");
        fprintf(stderr, "Mangosteen: unknown %s '%s' (emulated|fs|pmem|sim|none|auto)\n",
                st->config ? st->option : st->env, mode);
        exit(1);
    }
    cfg.pool_size = setting_size(setting_named("mango-pool-size"));
    cfg.log_size = setting_size(setting_named("mango-log-size"));
    cfg.pool_path = setting_named("mango-pool")->value; /* NULL: the runtime's default */
    cfg.max_threads = 4; /* the main thread; bio threads only free (deferred) */
    mango_callbacks cb = {.is_read_only = dummy_ro, .process_request = dummy_process};
    if (redis_will_daemonize()) start_in_background();
    used_memory_before_init = zmalloc_used_memory();
    int rc = mango_init(&cfg, &cb);
    used_memory_restored = zmalloc_used_memory();
    if (rc < 0) {
        fprintf(stderr, "Mangosteen: cannot open the pool: %s\n", mango_last_error());
        if (rc == MANGO_ELAYOUT)
            fprintf(stderr, "Mangosteen: only the build that wrote a pool can recover it (a rebuild or an upgrade "
                    "of redis-server changes it). To move the data to this build: start the old one on the "
                    "pool, run SAVE, then start this one on a new pool with that dump.rdb in its --dir: a new "
                    "pool imports it (docs/redis.md, \"Moving a dataset in\")\n");
        exit(1);
    }
    mango_on = 1;
    zmalloc_set_oom_handler(out_of_durable_memory);
    pipelined = mango_commit_is_pipelined();
    mango_recovered = rc == MANGO_RECOVERED;
    heap_lo = cfg.heap_base ? cfg.heap_base : (uintptr_t)0x600000000000ull;
    const char *pool = cfg.pool_path;
    struct stat st;
    size_t span = (pool && stat(pool, &st) == 0) ? (size_t)st.st_size : ((size_t)1 << 40);
    heap_hi = heap_lo + span;
    atexit(mango_atexit);
    char replayed[160] = "";
    if (mango_recovered) {
        mango_stats rs;
        mango_get_stats(&rs);
        snprintf(replayed, sizeof replayed, " (%llu committed batch%s replayed from the log%s)",
                 (unsigned long long)rs.recovery_frames_replayed, rs.recovery_frames_replayed == 1 ? "" : "es",
                 rs.recovery_torn_tail ? "; an incomplete last one, never acknowledged, discarded" : "");
    }
    /* The pool and mode in effect (the settings may name none, "auto" or
     * another case of a mode's name). */
    const char *in_effect = *mango_pool_path() ? mango_pool_path() : pool ? pool : "(default)";
    snprintf(init_msg, sizeof init_msg, "Mangosteen: pool %s, mode %s: %s%s%s", in_effect,
             mango_mode_name(), mango_recovered ? "RECOVERED" : "FRESH", replayed,
             test_reads_ignore_keys ? " (TEST MUTANT MANGO_REDIS_TEST_READS_IGNORE_KEYS: reads do not "
                                      "wait for the writes they observe; never use it in production)" : "");
    if (mango_recovered && durable_magic != MANGO_REDIS_MAGIC) {
        uint64_t allocated = 1;
        mango_heap_room(&allocated, NULL);
        if (durable_magic != 0 || allocated != 0) {
            fprintf(stderr, "Mangosteen: the pool holds no Redis state (was it created by another program?)\n");
            exit(1);
        }
        /* Made by this same build (mango_init checked the layout) at a start
         * that stopped before the batch that creates the databases (a port in
         * use, a refused setting): nothing was ever stored in it. Start it as
         * a new pool instead of refusing it for good. */
        mango_recovered = 0;
        snprintf(init_msg, sizeof init_msg, "Mangosteen: pool %s, mode %s: FRESH (made by an earlier start "
                 "that stopped before it held any data)", in_effect, mango_mode_name());
    }
}

/* ---- write sections ------------------------------------------------------ */

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* How mangoCommit() ends a pass's open batch. */
enum { COMMIT_SUBMIT, COMMIT_HOLD, COMMIT_HERE };

/* Under load (at least gather_min_cmds commands per pass on average) and
 * with no sync in flight, one look at the event loop decides:
 *   - requests wait: hold the batch open into the next pass (gathering), for
 *     at most gather_ns after it opened;
 *   - nothing waits, and writes are at least 30 % of the commands: sync it on
 *     the loop itself, as AOF-always does. The loop would only sleep until
 *     the sync thread is done; syncing here saves the two thread wake-ups
 *     and, on a busy machine, the sync thread's wait for a CPU. Not with few
 *     clients (8 YCSB clients lost 10-20 %: a loop blocked in a sync cannot
 *     take the next request) nor with mostly reads (reads arriving during the
 *     sync wait for it: YCSB U10, 32 clients, 91 k against 105 k).
 * Otherwise the batch goes to the sync thread. */
static int commit_choice(void)
{
    if (!pipelined || cmds_per_pass_x16 < (uint64_t)gather_min_cmds * 16) return COMMIT_SUBMIT;
    uint64_t durable = 0;
    if (mango_durable_ticket(&durable) != MANGO_OK) return COMMIT_SUBMIT; /* let the submit report it */
    if (durable + 1 < mango_reply_ticket()) return COMMIT_SUBMIT;        /* a sync is in flight */
    struct pollfd p = {.fd = aeGetPollFd(server.el), .events = POLLIN};
    if (poll(&p, 1, 0) > 0) /* an epoll fd is readable while any of its events is ready */
        return gather_ns && monotonic_ns() - batch_opened_ns < gather_ns ? COMMIT_HOLD : COMMIT_SUBMIT;
    return inline_when_idle && writes_per_pass_x16 * 10 >= cmds_per_pass_x16 * 3 ? COMMIT_HERE : COMMIT_SUBMIT;
}

/* The adapter's globals live in the executable's .bss, which is durable:
 * an outermost section writes them (batch_opened_ns, write_depth) before it
 * starts capturing and after it pauses; note_epoch is thread-local. A store
 * of theirs while capturing would be logged with every batch, and it made a batch whose code changed nothing (the fast expire
 * cycle of a pass with nothing to expire) cost a log sync, whose
 * completion woke the loop for another pass: an idle server with one key
 * with a TTL synced ~10 k times a second. */
/* Opens the pass's batch (capturing). */
static void open_batch(void)
{
    if (gather_ns) batch_opened_ns = monotonic_ns();
    int rc = mango_batch_begin();
    if (rc != MANGO_OK) die("mango_batch_begin", rc);
}

void mangoWriteBegin(void)
{
    if (!mango_on) return;
    note_epoch++;
    if (write_depth++ > 0) return; /* nested: the batch already captures */
    if (!mango_batch_open())
        open_batch();
    else
        mango_batch_resume();
    mangoReplPositionCheck(); /* a write with no backlog: forget the stream's position */
}

void mangoWriteEnd(void)
{
    if (!mango_on) return;
    note_epoch++;
    if (write_depth > 1) {
        write_depth--;
        return;
    }
    /* Pause: the batch stays open until beforeSleep(). */
    mango_batch_pause();
    write_depth = 0;
    uint64_t t = mango_reply_ticket(); /* the open batch's */
    if (call_depth > 0) {
        if (t > cmd_dep) cmd_dep = t;
    } else if (!keyed_section && t > global_ticket) {
        global_ticket = t; /* outside commands, keys unknown */
    }
}

/* Keyed sections: write sections outside commands whose every change a
 * client can see is to keys they stamp themselves, so they do not raise the
 * global ticket (a plain write section outside a command makes every read
 * wait for its batch, as with AOF-always). Keyless reads (INFO's counters,
 * DBSIZE, SCAN) wait for everything submitted, as before.
 *
 * Deletion sections (mango_adapter.h): serverCron's databasesCron() (active
 * expiry, dict resizing and rehashing, defragmentation: only the deletions
 * are visible), the fast expire cycle that beforeSleep() runs every pass
 * while any key has a TTL, performEvictions(), which processCommand() runs
 * before every command while maxmemory is set, and the deletion of an
 * expired key a lookup finds. As plain write sections they made every read
 * wait for the latest batch while the dataset had TTLs or maxmemory was
 * set. Each expired or evicted key is stamped (mangoKeyDeleted). The stamp
 * is needed: an evicted key would come back with a lost batch, and a
 * command that names an expired key can see its deletion without checking
 * the TTL (MEMORY USAGE answers nil for a deleted key, the key's size for
 * one a crash brought back past its TTL).
 *
 * Serving blocked clients (handleClientsBlockedOnKeys, after every command
 * that readies a key someone blocks on, and in beforeSleep): each key served
 * is stamped as its turn comes (mangoKeyServed), and so is a BLMOVE's
 * destination; keys readied while serving (a BLMOVE pushing to a key another
 * client blocks on) come to their turn in the same loop. The served clients'
 * replies are added inside the section: they wait for its batch. While any
 * client is blocked by a module, which may change any key, every served key
 * raises the global ticket instead. Before, a queue served by BLPOP workers
 * made every read wait for the latest batch.
 *
 * The graveyard's steps (mango_release.c) free values no key reaches any
 * more: nothing a keyed read can see. */
static void keyed_section_begin(void)
{
    if (mango_on && write_depth == 0) keyed_section = 1;
    mangoWriteBegin();
}

static void keyed_section_end(void)
{
    mangoWriteEnd();
    if (write_depth == 0) keyed_section = 0;
}

void mangoDeletionsBegin(void) { keyed_section_begin(); }
void mangoDeletionsEnd(void) { keyed_section_end(); }
void mangoServeBlockedBegin(void) { keyed_section_begin(); }
void mangoServeBlockedEnd(void) { keyed_section_end(); }
/* Bookkeeping sections change durable memory that no client reads, no key
 * (the replication stream's position, mango_replication.c). */
void mangoBookkeepingBegin(void) { keyed_section_begin(); }
void mangoBookkeepingEnd(void) { keyed_section_end(); }

/* Ends the open batch and waits until it is durable. */
static void commit_sync(void)
{
    if (!mango_on || !mango_batch_open()) return;
    serverAssert(write_depth == 0);
    int rc = mango_batch_end();
    if (rc != MANGO_OK) die("mango_batch_end (commit)", rc);
}

/* The durable ticket advanced: the read wakes the loop, whose beforeSleep()
 * then writes the replies that were waiting. */
static void durable_event(aeEventLoop *el, int fd, void *data, int mask)
{
    UNUSED(el); UNUSED(data); UNUSED(mask);
    uint64_t v;
    while (read(fd, &v, sizeof v) == sizeof v) {}
}

void mangoCommit(void)
{
    if (!mango_on) return;
    /* Only a pipelined commit becomes durable later, on the sync thread: its
     * eventfd wakes the loop to send the replies that waited. An inline commit
     * is durable when mango_batch_submit returns, before this beforeSleep()
     * writes the replies; watching the eventfd there would only cost a write,
     * two reads and an extra loop iteration per batch. */
    if (pipelined && durable_fd < 0 && server.el) {
        durable_fd = mango_durable_fd();
        if (durable_fd < 0) die("mango_durable_fd", durable_fd);
        if (aeCreateFileEvent(server.el, durable_fd, AE_READABLE, durable_event, NULL) == AE_ERR) {
            serverLog(LL_WARNING, "Mangosteen: cannot watch the durability eventfd");
            _exit(1);
        }
    }
    cmds_per_pass_x16 += cmds_this_pass - cmds_per_pass_x16 / 16;
    cmds_this_pass = 0;
    writes_per_pass_x16 += writes_this_pass - writes_per_pass_x16 / 16;
    writes_this_pass = 0;
    /* Big objects freed by this pass's commands (or earlier ones) are
     * released a step at a time, in this pass's batch (mango_release.c). */
    if (mangoReleaseStep()) aeSetDontWait(server.el, 1);
    if (mango_batch_open()) {
        serverAssert(write_depth == 0);
        int how = commit_choice();
        if (how == COMMIT_HOLD) {
            gather_holds++;
            return;
        }
        if (how == COMMIT_HERE) {
            inline_commits++;
            int rc = mango_batch_end();
            if (rc != MANGO_OK) die("mango_batch_end (inline commit)", rc);
            mangoSnapshotStep();
            return;
        }
        int rc = mango_batch_submit(NULL);
        if (rc != MANGO_OK) die("mango_batch_submit (commit)", rc);
    }
    mangoSnapshotStep(); /* between batches: MANGOSNAPSHOT */
}

extern int ProcessingEventsWhileBlocked; /* networking.c */

/* The last ticket submitted before the open batch (everything submitted,
 * when none is open). */
static uint64_t ticket_before_open_batch(void)
{
    return mango_reply_ticket() - (mango_batch_open() ? 1 : 0);
}

/* Is the current client's command running (inside call()), rather than
 * refused before it (a LOADING or BUSY error)? */
static int current_command_running(void)
{
    client *cur = server.current_client;
    return cur && call_depth > 0 && call_depth <= CALL_DEPTH_TRACKED && calling[call_depth - 1] == cur;
}

/* Is the reply being made for another client's command, served while a
 * script yields past busy-reply-threshold (a BUSY error, SCRIPT KILL,
 * SHUTDOWN's refusal, WATCH)? Nothing such a command tells reads the
 * script's writes or the rest of the pass's open batch, so its reply waits
 * only for what was submitted before that batch; with the batch's ticket a
 * BUSY error waited for the script's end (session 35). Not for what the
 * script itself sends other clients (keyspace notifications, PUBLISH: made
 * while the script runs, not while the loop serves others; the first
 * version, which looked only at the current client, released them before
 * the script's batch was durable), nor for module or write commands
 * allowed while busy (they may write into or read from the open batch),
 * nor FUNCTION STATS (it counts libraries a FUNCTION LOAD of the open batch
 * made; found by a review). */
static int answered_beside_a_busy_script(void)
{
    client *cur = server.current_client;
    if (!ProcessingEventsWhileBlocked || !scriptIsTimedout() || !cur || cur == scriptGetCaller()) return 0;
    if (!current_command_running()) return 1; /* refused before call(): BUSY, an unknown command, a bad argument count */
    return !((cur->cmd->flags & (CMD_WRITE | CMD_MODULE)) || cur->cmd->proc == functionStatsCommand);
}

/* The open batch's ticket, opening one (paused) if none is: a message an
 * inner command of an EXEC or a script sends another client before the
 * command's first write (MULTI; PUBLISH; SET; EXEC) must wait for that
 * write's batch, which does not exist yet. With the last submitted ticket
 * the subscriber got the message at once, and a crash before the SET's
 * batch was durable left it holding part of a transaction that never
 * happened (found by a review, session 36). */
static uint64_t open_batch_ticket(void)
{
    if (!mango_batch_open()) {
        open_batch();
        mango_batch_pause();
    }
    return mango_reply_ticket();
}

void mangoNoteReply(client *c)
{
    if (!mango_on) return;
    if (c == noted_client && noted_epoch == note_epoch && call_depth > 0 &&
        (c->flags & CLIENT_PENDING_WRITE))
        return; /* noted already in this command: the same ticket */
    /* Inline commits with no batch open: everything submitted is durable, so
     * nothing can hold this reply, nor the client's earlier output. Ticket 0
     * says so (the field is not initialised by createClient: always set it).
     * Called once per addReply*: an HGETALL of 10 fields calls it 21 times. */
    /* A message an inner command of a transaction or script that may write
     * sends another client (open_batch_ticket). Also with inline commits: a
     * script that publishes, then yields past busy-reply-threshold, had its
     * message written out while it ran (found by a review, session 36). */
    int inner_message = outer_may_write && call_depth >= 2 && c != calling[0];
    if (!inner_message && ((!pipelined && !mango_batch_open()) || (import_serving && write_depth == 0))) {
        c->mango_ticket = 0;
        noted_client = c;
        noted_epoch = note_epoch;
        return;
    }
    /* prepareClientToWrite() is about to queue c in clients_pending_write;
     * inside a write section the list node would come from the durable heap
     * (captured, then freed in beforeSleep through the deferred queue). Queue
     * it here with the batch paused, so the node is transient; Redis's own
     * call then finds CLIENT_PENDING_WRITE set and does nothing. */
    if (mango_capture_active && !clientHasPendingReplies(c) && io_threads_op == IO_THREADS_OP_IDLE) {
        mango_batch_pause();
        putClientInPendingWriteQueue(c);
        mango_batch_resume();
    }
    uint64_t t;
    if (answered_beside_a_busy_script())
        t = ticket_before_open_batch();
    else if (reload_serving && write_depth == 0)
        /* Served while DEBUG RELOAD loads: a refusal (LOADING) reads nothing
         * of its batch; a command that runs (INFO's key counts, an EXEC
         * aborted by a WATCHed key the reload emptied) may report it. */
        t = current_command_running() ? mango_reply_ticket() : ticket_before_open_batch();
    else if (inner_message)
        t = open_batch_ticket();
    else if (write_depth > 0 || call_depth == 0 || !pipelined)
        t = mango_reply_ticket(); /* the open batch, or everything submitted */
    else
        t = cmd_dep;
    /* Unsent output may depend on a later batch than this reply does. */
    if (clientHasPendingReplies(c) && c->mango_ticket > t) t = c->mango_ticket;
    c->mango_ticket = t;
    noted_client = c;
    noted_epoch = note_epoch;
}

int mangoReplyHeld(client *c)
{
    note_epoch++; /* c's output may be written now */
    if (!mango_on) return 0;
    if (getClientType(c) == CLIENT_TYPE_SLAVE) return mangoReplicaHeld(c); /* by offset: mango_replication.c */
    if (c->mango_ticket <= durable_seen) return 0;
    return c->mango_ticket > mangoDurableTicket();
}

int mangoEnabled(void) { return mango_on; }

/* Reads the durable ticket from Mangosteen (and caches it in durable_seen). */
uint64_t mangoDurableTicket(void)
{
    uint64_t d;
    int rc = mango_durable_ticket(&d);
    if (rc != MANGO_OK) die("pipelined commit: a log sync failed", rc);
    return durable_seen = d;
}

/* A command is still running: inside a write section (DEBUG RESTART), or a
 * script or module command past busy-reply-threshold that lets the loop
 * serve SHUTDOWN NOSAVE and replicas' REPLCONF between its calls. The open
 * batch holds part of its changes: committing it would make half a script
 * durable, and a replica that then continued from the recorded position
 * would never get that half (found by a review, session 35). */
int mangoCommandUnfinished(void)
{
    return mango_on && (write_depth > 0 || reload_serving || isInsideYieldingLongCommand());
}

/* Ends the open batch, if any, and waits until everything submitted is
 * durable: a fork for a replica's full sync then snapshots only durable
 * writes; a shutdown leaves replicas with the whole durable stream. With a
 * command unfinished, only what was submitted before the open batch: the
 * batch stays open and is dropped at the exit, as in a crash (its replies
 * were never sent). */
void mangoSyncAll(void)
{
    if (!mango_on || import_serving) return;
    if (mango_batch_open() && !mangoCommandUnfinished()) {
        commit_sync();
    } else {
        int rc = mango_wait_durable(ticket_before_open_batch());
        if (rc != MANGO_OK) die("mango_wait_durable", rc);
    }
}

char *mangoInfo(char *info, int after_section)
{
    if (after_section) info = sdscat(info, "\r\n");
    info = sdscat(info, "# Mangosteen\r\n");
    if (!mango_on) return sdscat(info, "mango_enabled:0\r\n");
    mango_stats s;
    mango_get_stats(&s);
    uint64_t batch_capacity = 0;
    mango_batch_room(NULL, &batch_capacity);
    typedef unsigned long long ull;
    info = sdscatprintf(info,
        "mango_enabled:1\r\n"
        "mango_mode:%s\r\n"
        "mango_pool:%s\r\n"
        "mango_pool_state:%s\r\n"
        "mango_pipelined_commit:%d\r\n"
        "mango_batches:%llu\r\n"
        "mango_batches_in_flight:%llu\r\n"
        "mango_log_syncs:%llu\r\n"
        "mango_log_bytes:%llu\r\n"
        "mango_log_blocks:%llu\r\n"
        "mango_log_zero_ranges:%llu\r\n"
        "mango_log_data_ranges:%llu\r\n"
        "mango_log_data_bytes:%llu\r\n"
        "mango_log_capacity:%llu\r\n"
        "mango_log_unapplied_bytes:%llu\r\n"
        "mango_log_full_waits:%llu\r\n"
        "mango_batch_capacity_bytes:%llu\r\n"
        "mango_big_batches:%llu\r\n"
        "mango_big_batch_bytes:%llu\r\n"
        "mango_backend_syncs:%llu\r\n"
        "mango_heap_allocations:%llu\r\n"
        "mango_heap_payload_bytes:%llu\r\n"
        "mango_heap_allocated_bytes:%llu\r\n"
        "mango_heap_carved_bytes:%llu\r\n"
        "mango_heap_capacity_bytes:%llu\r\n"
        "mango_heap_reclaims:%llu\r\n"
        "mango_objects_being_released:%lu\r\n"
        "mango_bytes_being_released:%zu\r\n"
        "mango_function_libraries_saved:%lu\r\n"
        "mango_gather_holds:%llu\r\n"
        "mango_inline_commits:%llu\r\n"
        "mango_scratch_blocks_dropped:%llu\r\n"
        "mango_scratch_batches:%llu\r\n",
        mango_mode_name(), mango_pool_path(), mango_recovered ? "recovered" : "fresh", pipelined,
        (ull)s.batches, (ull)s.batches_in_flight, (ull)s.frontend_syncs, (ull)s.log_bytes, (ull)s.log_blocks,
        (ull)s.log_zero_ranges, (ull)s.log_data_ranges, (ull)s.log_data_bytes, (ull)s.log_capacity, (ull)s.log_unapplied_bytes, (ull)s.log_full_waits,
        (ull)batch_capacity, (ull)s.big_batches, (ull)s.big_batch_bytes, (ull)s.backend_syncs, (ull)s.heap_chunks, (ull)s.heap_payload_bytes,
        (ull)s.heap_allocated_bytes, (ull)s.heap_carved_bytes, (ull)s.heap_capacity, (ull)s.heap_reclaims, mangoGravesPending(), mangoGravesBytes(), mangoFunctionsSaved(), (ull)gather_holds,
        (ull)inline_commits, (ull)s.scratch_blocks_dropped, (ull)s.scratch_batches);
    return mangoSnapshotInfo(info);
}

int mangoInWriteSection(void) { return write_depth > 0; }

static int stats_paused; /* written only while paused: never logged */
static void free_durable_arguments(robj ***vector, int argc, int len);

void mangoStatsBegin(void)
{
    if (!mango_on || write_depth == 0 || !mango_capture_active) return;
    client *c = call_depth > 0 && call_depth <= CALL_DEPTH_TRACKED ? calling[call_depth - 1] : NULL;
    if (c != NULL && c->original_argv != NULL) /* call() frees it in this section */
        free_durable_arguments(&c->original_argv, c->original_argc, c->original_argc);
    mango_batch_pause();
    stats_paused = 1;
}

void mangoStatsEnd(void)
{
    if (!stats_paused) return;
    stats_paused = 0;
    mango_batch_resume();
}

int mangoTransientBegin(void)
{
    if (!mango_on || write_depth == 0 || !mango_capture_active) return 0;
    mango_batch_pause();
    return 1;
}

void mangoTransientEnd(int paused)
{
    if (paused) mango_batch_resume();
}

void mangoHeapRange(uintptr_t *lo, uintptr_t *hi)
{
    *lo = heap_lo;
    *hi = heap_hi;
}

static void stamp_key(int dbid, robj *key, uint64_t t);

/* A keyed section changed key (any_key: maybe any key): reads of it wait
 * for the open batch. */
static void stamp_section_key(redisDb *db, robj *key, int any_key)
{
    if (!mango_on || !pipelined || write_depth == 0) return;
    int paused = mangoTransientBegin(); /* bookkeeping: not logged */
    stamp_key(any_key ? -1 : db->id, key, mango_reply_ticket());
    mangoTransientEnd(paused);
}

void mangoKeyDeleted(redisDb *db, robj *key) { stamp_section_key(db, key, 0); }

/* While a module's client is blocked, serving may change any key. */
void mangoKeyServed(redisDb *db, robj *key)
{
    stamp_section_key(db, key, server.blocked_clients_by_type[BLOCKED_MODULE] != 0);
}

int mangoAnyVolatileKeys(void)
{
    for (int j = 0; j < server.dbnum; j++)
        if (dictSize(server.db[j].expires) > 0)
            return 1;
    return 0;
}

/* Replies may be written from processEventsWhileBlocked() (a script or
 * module command past busy-reply-threshold, DEBUG RELOAD's or an import's
 * loading) unless the open batch captures: writing a client's output frees
 * and allocates, which would then come from the durable heap. A yielding
 * script's batch is paused between its calls, so the BUSY errors and SCRIPT
 * KILL's reply go out at once (each held by its ticket, like any reply);
 * until session 35 they waited for the script's end. */
int mangoMayWriteWhileBlocked(void)
{
    return !mango_on || !mango_batch_open() || import_serving || !mango_capture_active;
}

int mangoDictMayRehash(const void *d)
{
    if (!mango_on || mango_capture_active) return 1;
    uintptr_t p = (uintptr_t)d;
    return p < heap_lo || p >= heap_hi; /* transient dicts rehash any time */
}

/* ---- arguments of write commands -----------------------------------------
 *
 * A write command may keep an argument object in the keyspace (SET stores
 * argv[2] itself), so by default every transient argument of a write command
 * is copied into the durable heap before it runs (durable_argv): a durable
 * allocation, a captured copy and, after the command, a captured free per
 * argument. The commands below only ever copy their arguments' bytes (HSET's
 * HASH_SET_COPY, dbAdd's sdsdup of the key, quicklist, listpack, intset and
 * skiplist inserts) and never rewrite their argument vector, so their
 * arguments stay transient. Every such command is checked when it ends
 * (check_transient_argv): the vector, its objects and their reference counts
 * must be unchanged, or a durable structure could point at memory a crash
 * loses, and the server stops before the batch commits. Where references
 * legitimately outlive the command every argument is made durable as before:
 * with AOF or replication on (propagation), while clients are blocked (a push
 * to a key they wait on queues the key object in server.ready_keys), and for
 * commands inside EXEC or scripts (client tracking queues invalidated key
 * objects until the outermost call() ends). */
static __thread struct {
    robj **argv;
    int argc;
    uint64_t sum; /* position-weighted sum of the transient argument pointers */
} transient_argv;

static int copies_argument_bytes(const struct redisCommand *cmd)
{
    if (test_copying_command && !strcasecmp(cmd->fullname, test_copying_command)) return 1;
    redisCommandProc *p = cmd->proc;
    return p == hsetCommand || p == hsetnxCommand || p == hincrbyCommand || p == hdelCommand ||
           p == lpushCommand || p == rpushCommand || p == lpushxCommand || p == rpushxCommand ||
           p == saddCommand || p == sremCommand || p == zaddCommand || p == zremCommand ||
           p == incrCommand || p == decrCommand || p == incrbyCommand || p == decrbyCommand ||
           p == delCommand || p == unlinkCommand ||
           /* Since session 38 (each copies the bytes it keeps, quicklist,
            * set, skiplist or string, or keeps none; none rewrites its
            * vector): a 1 MB argument was copied, logged and freed for
            * nothing. */
           p == lremCommand || p == linsertCommand || p == lsetCommand || p == setrangeCommand ||
           p == smoveCommand || p == zincrbyCommand || p == pfaddCommand || p == setbitCommand ||
           /* The engine keeps an sdsdup of the code (engineLibraryCreate), the
            * pool a copy of its own (mangoFunctionsSave): the durable copy of a
            * 1 MB library's argument was freed after the command, outside a
            * batch, and a kill before the next batch left it in the heap for
            * good (found by a review, session 37). */
           p == functionLoadCommand;
}

/* APPEND to a key that exists and has no TTL: it appends the argument's
 * bytes (sdscatlen) and keeps nothing. To a new key it stores the argument
 * object itself, so that case copies as before; a key with a TTL too (it
 * may expire between this check and the command's own lookup, which would
 * then create the key from the argument). Since session 38: a 1 MB APPEND
 * logged its argument's durable copy besides the appended bytes. */
static int appends_to_existing_key(const client *c)
{
    if (c->cmd->proc != appendCommand || c->argc != 3 || !sdsEncodedObject(c->argv[1])) return 0;
    return dictFind(c->db->dict, c->argv[1]->ptr) != NULL && getExpire(c->db, c->argv[1]) == -1;
}

/* Commands that keep only their value arguments: setKey()/dbAdd() store the
 * value object itself but copy the key (sdsdup). 1: argument j is such a
 * value (made durable before the command runs); 0: it may stay transient
 * (checked when the command ends, as for copies_argument_bytes); -1: not
 * such a command. An MSET of 10 keys copied 20 arguments into the durable
 * heap and freed them after, for 10 that it keeps. Not SETEX, PSETEX, nor SET
 * with options: a relative expiry makes them rewrite their argument vector
 * for propagation (SET key value PXAT ms), which the end-of-command check
 * cannot tell from a kept argument. */
static int value_argument(const client *c, int j)
{
    redisCommandProc *p = c->cmd->proc;
    if ((p == setCommand && c->argc == 3) || p == setnxCommand || p == getsetCommand) return j == 2;
    if (p == msetCommand || p == msetnxCommand) return j % 2 == 0;
    return -1;
}

static int is_durable_ptr(const void *o)
{
    uintptr_t p = (uintptr_t)o;
    return p >= heap_lo && p < heap_hi;
}

/* The transient arguments' fingerprint (value arguments, which are made
 * durable, left out); -1 if one is shared (refcount != 1). */
static int transient_argv_sum(client *c, uint64_t *sum)
{
    uint64_t s = 0;
    for (int j = 1; j < c->argc; j++) {
        robj *o = c->argv[j];
        if (is_durable_ptr(o) || value_argument(c, j) == 1) continue;
        if (o->refcount != 1) return -1;
        s += (uint64_t)(uintptr_t)o * (uint64_t)(2 * j + 1);
    }
    *sum = s;
    return 0;
}

/* 1: c's arguments may stay transient (recorded for check_transient_argv). */
static int keep_transient_argv(client *c)
{
    /* Only a top-level command: inside EXEC or a script, references taken by
     * an inner command (client tracking's pending invalidations, propagation)
     * are released when the outer call() ends, after the inner check. */
    if (call_depth != 1 ||
        !(copies_argument_bytes(c->cmd) || value_argument(c, 1) >= 0 || appends_to_existing_key(c)))
        return 0;
    /* Replication is no reason to copy: alsoPropagate()'s references are
     * released by propagatePendingCommands() in afterCommand(), before
     * mangoCallEnd() checks (replicationFeedSlaves copies the bytes). AOF,
     * refused at start-up, would be checked the same way; kept out anyway. */
    if (server.aof_state != AOF_OFF)
        return 0;
    if (server.blocked_clients != 0)
        return 0; /* signalKeyAsReady() keeps the key object until the blocked clients are served */
    uint64_t sum;
    if (transient_argv_sum(c, &sum) != 0) return 0;
    transient_argv.argv = c->argv;
    transient_argv.argc = c->argc;
    transient_argv.sum = sum;
    return 1;
}

static void check_transient_argv(client *c)
{
    uint64_t sum = 0;
    if (c->argv == transient_argv.argv && c->argc == transient_argv.argc && transient_argv_sum(c, &sum) == 0 &&
        sum == transient_argv.sum)
        return;
    serverLog(LL_WARNING, "Mangosteen: %s kept or replaced a transient argument; the durable state could "
              "point at memory a crash loses. Stopping before the batch commits (a bug in the "
              "adapter's list of commands that copy their arguments).", c->cmd->fullname);
    _exit(1);
}

/* values_only: only the value arguments of a value_argument() command. */
static void durable_argv(client *c, int values_only)
{
    for (int j = 1; j < c->argc; j++) { /* argv[0], the command name, is never stored */
        robj *o = c->argv[j];
        if (is_durable_ptr(o)) continue; /* already durable */
        if (o->type != OBJ_STRING) continue;
        if (values_only && value_argument(c, j) != 1) continue;
        c->argv[j] = dupStringObject(o);
        decrRefCount(o);
    }
}

/* ---- argument copies freed by their own batch ------------------------------
 *
 * The copies durable_argv made that the command did not keep (an APPEND's or
 * an LREM's argument, a refused SET NX's value, XADD's fields), and the
 * vectors a rewrite allocated inside the write section (XADD's "*" becomes
 * the entry's ID, EXPIRE becomes PEXPIREAT), used to be freed by
 * freeClientArgv() after the command, outside any batch: the free waited for
 * the next batch, and a kill -9 before it left them in the durable heap for
 * good (+1 MB a crash for a 1 MB argument; found by a review, session 37).
 * So while the command's write section still captures, every durable
 * argument that only its vector holds (refcount 1: nothing else can reach
 * it, and the vector would free it next) is replaced by a transient copy of
 * itself and freed in this batch, and a durable vector is moved to transient
 * memory. Arguments something else keeps (SET's stored value, a blocked
 * client's keys, propagation's references) have a higher count and stay.
 * The original vector of a rewritten command is done the same way when its
 * statistics begin (call() frees it there, after the slowlog).
 * What only the end of an outer call() releases (an EXEC's or a script's
 * inner commands while propagation or client tracking hold their
 * arguments) is freed outside any write section, queued, and freed by the
 * pass's batch when it ends (the runtime drains the queue then too). */
static void free_durable_arguments(robj ***vector, int argc, int len)
{
    robj **argv = *vector;
    if (argv == NULL || !mango_capture_active) return;
    for (int j = 0; j < argc; j++) {
        robj *o = argv[j];
        if (o == NULL || !is_durable_ptr(o) || o->refcount != 1 || o->type != OBJ_STRING) continue;
        mango_batch_pause();
        argv[j] = dupStringObject(o); /* transient: the batch is paused */
        mango_batch_resume();
        decrRefCount(o); /* captured: freed by this batch */
    }
    if (is_durable_ptr(argv)) {
        mango_batch_pause();
        robj **moved = zmalloc(sizeof(robj *) * (len > argc ? len : argc));
        mango_batch_resume();
        memcpy(moved, argv, sizeof(robj *) * argc);
        zfree(argv);
        *vector = moved;
    }
}

/* ---- reply dependencies (see the top of this file) ----------------------- */

/* The slot of (db, key); -1 if the argument is not a string. */
static long key_slot(int dbid, robj *key)
{
    char buf[LONG_STR_SIZE];
    const char *p;
    size_t len;
    if (sdsEncodedObject(key)) {
        p = key->ptr;
        len = sdslen(key->ptr);
    } else if (key->encoding == OBJ_ENCODING_INT) {
        len = ll2string(buf, sizeof buf, (long)key->ptr);
        p = buf;
    } else {
        return -1;
    }
    uint64_t h = dictGenHashFunction(p, len) ^ ((uint64_t)(unsigned)dbid * 0x9e3779b97f4a7c15ull);
    return (long)((h ^ (h >> 32)) & (KEY_SLOTS - 1));
}

/* The keys of c's command: >0 keys in *r (free with getKeysFreeResult),
 * 0 none, -1 unknown. */
static int command_keys(client *c, getKeysResult *r)
{
    int n = getKeysFromCommandWithSpecs(c->cmd, c->argv, c->argc, GET_KEYSPEC_DEFAULT, r);
    return n < 0 ? -1 : n;
}

/* Raise the slot of (dbid, key) to ticket t (a key that has no slot, or
 * dbid -1: the global ticket). The table is transient: the caller has the
 * batch paused. */
static void stamp_key(int dbid, robj *key, uint64_t t)
{
    if (!key_slots) key_slots = zcalloc(KEY_SLOTS * sizeof *key_slots);
    long s = dbid < 0 ? -1 : key_slot(dbid, key);
    if (s < 0) {
        if (t > global_ticket) global_ticket = t;
    } else if (t > key_slots[s]) {
        key_slots[s] = t;
    }
}

/* Does Redis find cmd's keys by searching its arguments (for a keyword, or
 * with the command's own getkeys function): MIGRATE, SORT, SORT_RO,
 * GEORADIUS, GEORADIUSBYMEMBER, XREAD, XREADGROUP in 7.0? That search and
 * the command's own parser can disagree: GEORADIUS ... STORE a STORE b
 * writes b (the parser keeps the last STORE, the search finds the first),
 * SORT l STORE by STORE x writes x (sortGetKeys skips the word after BY),
 * XREADGROUP COUNT 1 GROUP g streams STREAMS s > changes s (the search
 * takes the consumer's name for the keyword). The key list then named
 * another key, and a read of the changed one was answered 0.56 s before
 * the write was durable (found by a review, session 36). Every argument of
 * such a command is taken for a key as well: a word that is no key only
 * stamps, or waits for, a slot more. */
static int keys_found_by_search(const struct redisCommand *cmd)
{
    for (int i = 0; i < cmd->key_specs_num; i++) {
        const keySpec *ks = &cmd->key_specs[i];
        if (ks->begin_search_type != KSPEC_BS_INDEX || ks->find_keys_type == KSPEC_FK_UNKNOWN ||
            (ks->flags & CMD_KEY_INCOMPLETE))
            return 1;
    }
    return 0;
}

static void stamp_write_keys(client *c, uint64_t t)
{
    const char *name = c->cmd->fullname;
    getKeysResult r = GETKEYS_RESULT_INIT;
    int n = command_keys(c, &r);
    /* MOVE/COPY ... DB write a key of another database. */
    if (n <= 0 || !strcasecmp(name, "move") || !strcasecmp(name, "copy")) {
        stamp_key(-1, NULL, t);
    } else {
        for (int i = 0; i < n; i++) stamp_key(c->db->id, c->argv[r.keys[i].pos], t);
        if (keys_found_by_search(c->cmd))
            for (int j = 1; j < c->argc; j++) stamp_key(c->db->id, c->argv[j], t);
    }
    getKeysFreeResult(&r);
}

/* SORT_RO ... BY pattern / GET pattern reads keys that the key list Redis
 * gives for it does not name (sortROGetKeys: the sorted key only): the
 * keys its patterns make of each element. (SORT is a write command: its
 * reply waits for its own batch, after every earlier one.) */
static int sort_reads_patterns(client *c)
{
    if (c->cmd->proc != sortroCommand) return 0;
    for (int j = 2; j < c->argc; j++)
        if (sdsEncodedObject(c->argv[j]) && (!strcasecmp(c->argv[j]->ptr, "by") || !strcasecmp(c->argv[j]->ptr, "get")))
            return 1;
    return 0;
}

static uint64_t read_dependency(client *c)
{
    getKeysResult r = GETKEYS_RESULT_INIT;
    int n = command_keys(c, &r);
    uint64_t dep = global_ticket;
    if (n <= 0 || sort_reads_patterns(c)) {
        dep = mango_reply_ticket(); /* keyspace-wide or unknown: everything */
    } else if (!test_reads_ignore_keys) {
        int search = keys_found_by_search(c->cmd); /* every argument, as for writes */
        int m = search ? c->argc - 1 : n;
        for (int i = 0; i < m; i++) {
            long s = key_slot(c->db->id, c->argv[search ? i + 1 : r.keys[i].pos]);
            if (s < 0) { dep = mango_reply_ticket(); break; }
            if (key_slots && key_slots[s] > dep) dep = key_slots[s];
        }
    }
    getKeysFreeResult(&r);
    return dep;
}

/* Commands that change the keyspace: Redis's write commands, and DEBUG,
 * which has no write flag but whose POPULATE, RELOAD and LOADAOF rebuild
 * keys. Outside a write section its stores would not be logged, and the
 * next logged batch could make durable a dict pointing at them: a pool that
 * crashes the server after recovery (seen with DEBUG POPULATE). It has no
 * key specs, so every read then depends on its batch. */
static int changes_keyspace(const struct redisCommand *cmd)
{
    return (cmd->flags & CMD_WRITE) != 0 || cmd->proc == debugCommand;
}

static int is_debug_reload(const client *c)
{
    return c->cmd->proc == debugCommand && c->argc >= 2 && sdsEncodedObject(c->argv[1]) &&
           !strcasecmp(c->argv[1]->ptr, "reload");
}

int mangoFreeingAtOnce(void) { return freeing_at_once > 0; }

int mangoCallBegin(client *c)
{
    int write = changes_keyspace(c->cmd);
    if (!mango_on) return write;
    note_epoch++;
    call_depth++;
    if (call_depth <= CALL_DEPTH_TRACKED) calling[call_depth - 1] = c;
    if (call_depth == 1) {
        cmds_this_pass++;
        if (write) writes_this_pass++;
        outer_may_write = write || (c->cmd->flags & CMD_MAY_REPLICATE) ||
                          (c->cmd->proc == execCommand && (c->mstate.cmd_flags & (CMD_WRITE | CMD_MAY_REPLICATE)));
    }
    if (is_debug_reload(c)) freeing_at_once++;
    if (write) {
        /* Decided before the write section opens: its record is not logged. */
        int keep = keep_transient_argv(c);
        mangoWriteBegin();
        if (keep) {
            write = 2; /* checked in mangoCallEnd */
            if (value_argument(c, 1) >= 0) durable_argv(c, 1); /* the values it keeps */
        } else {
            durable_argv(c, 0);
        }
        /* cmd_dep takes this batch's ticket in mangoWriteEnd (paused); inside
         * the write section replies use the open batch's ticket directly. */
        uint64_t t = mango_reply_ticket(); /* the open batch's */
        if (pipelined) {
            mango_batch_pause(); /* the key table is transient */
            stamp_write_keys(c, t);
            mango_batch_resume();
        }
        /* FUNCTION LOAD/DELETE/FLUSH/RESTORE: the engine's state is
         * transient; their batch saves the libraries' source at the end
         * (mango_functions.c). */
        if (mangoFunctionsWrite(c->cmd)) mango_batch_pause();
    } else if (pipelined) {
        int paused = mango_capture_active; /* a read nested in a write section */
        if (paused) mango_batch_pause();
        uint64_t d = read_dependency(c);
        if (d > cmd_dep) cmd_dep = d;
        if (paused) mango_batch_resume();
    }
    return write;
}

void mangoCallEnd(client *c, int write)
{
    if (!mango_on) return;
    if (write == 2) check_transient_argv(c);
    if (write && mangoFunctionsWrite(c->cmd)) {
        mango_batch_resume();
        mangoFunctionsSave();
    } else if (write && is_debug_reload(c)) {
        mangoFunctionsSave(); /* the file's libraries replaced the engine's */
    }
    if (is_debug_reload(c)) freeing_at_once--;
    if (write) free_durable_arguments(&c->argv, c->argc, c->argv_len);
    if (write) mangoWriteEnd();
    note_epoch++;
    if (--call_depth == 0) {
        cmd_dep = 0;
        outer_may_write = 0;
    }
    /* Between two outermost commands the pass's batch may end early: a pass
     * of many large writes (ten clients each SETting 10 MB) would otherwise
     * outgrow what a log frame holds, and a batch that does is committed
     * through the big-batch file, synchronously (slower). Replies keep the
     * ticket of the batch they were made in. */
    if (write && call_depth == 0 && write_depth == 0 && mango_batch_open()) {
        uint64_t used, cap;
        mango_batch_room(&used, &cap);
        if (used > cap / 4) {
            int rc = mango_batch_submit(NULL);
            if (rc != MANGO_OK) die("mango_batch_submit (a large batch)", rc);
        }
    }
}

/* An EXEC that queued a command changing the keyspace. */
static int exec_changes_keyspace(client *c)
{
    if (c->cmd->proc != execCommand || !(c->flags & CLIENT_MULTI)) return 0;
    for (int j = 0; j < c->mstate.count; j++)
        if (changes_keyspace(c->mstate.commands[j].cmd)) return 1;
    return 0;
}

int mangoRefuseCommand(client *c)
{
    if (!mango_on) return 0;
    /* DEBUG passes Redis's loading check (CMD_LOADING), but during an import
     * its writes would join the import's batches and its reply could leave
     * before the import is DONE, so be lost with the pool if it stops. */
    if (import_serving && changes_keyspace(c->cmd)) {
        rejectCommandFormat(c, "-LOADING Redis is loading the dataset in memory (Mangosteen: importing %s)",
                            server.rdb_filename);
        return 1;
    }
    /* The same while DEBUG RELOAD loads: its open batch holds the emptied,
     * half-loaded databases (stock Redis would run a DEBUG POPULATE into
     * them). An EXEC passes Redis's loading check when everything it queued
     * may run while loading (DEBUG does): refused too if any of that
     * changes the keyspace (a queued DEBUG RELOAD nested in the first one
     * ended the loading state; found by a review). */
    if ((reload_serving || import_serving) && exec_changes_keyspace(c)) {
        rejectCommandFormat(c, "-LOADING Redis is loading the dataset in memory (Mangosteen: %s)",
                            import_serving ? "importing" : "DEBUG RELOAD");
        return 1;
    }
    if (reload_serving && changes_keyspace(c->cmd)) {
        rejectCommandFormat(c, "-LOADING Redis is loading the dataset in memory (Mangosteen: DEBUG RELOAD)");
        return 1;
    }
    /* The Lua debugger writes its replies (the script's commands and their
     * results) straight to the socket, past the hold on replies: a
     * `redis GET x` in it showed a value 0.5 s before its write was durable
     * (found by a review, session 36). Its forked mode debugs a snapshot
     * that holds batches not yet durable. */
    if (c->cmd->proc == scriptCommand && c->argc >= 3 && sdsEncodedObject(c->argv[1]) &&
        !strcasecmp(c->argv[1]->ptr, "debug") && sdsEncodedObject(c->argv[2]) &&
        strcasecmp(c->argv[2]->ptr, "no")) {
        rejectCommandFormat(c, "Mangosteen: SCRIPT DEBUG is not supported with a pool: the debugger sends "
                            "what a script reads before it is durable");
        return 1;
    }
    /* The pool's durable heap has a fixed size, and Redis aborts on an
     * allocation that fails: a command that may grow memory is refused with
     * an OOM error while the heap has no room for what it may make
     * (mango_heap_check.c). */
    sds why = mangoHeapRefusal(c); /* mango_heap_check.c */
    if (why) {
        rejectCommandFormat(c, "%s", why);
        sdsfree(why);
        return 1;
    }
    if (c->cmd->proc == configSetCommand) {
        /* CONFIG SET name value [name value ...]: turning the AOF on would
         * fork a rewrite and, once saved by CONFIG REWRITE, stop the next
         * start-up (appendonly yes is refused there). */
        for (int j = 2; j + 1 < c->argc; j += 2) {
            if (!sdsEncodedObject(c->argv[j]) || !sdsEncodedObject(c->argv[j + 1])) continue;
            if (!strcasecmp(c->argv[j]->ptr, "appendonly") && !strcasecmp(c->argv[j + 1]->ptr, "yes")) {
                rejectCommandFormat(c, "Mangosteen: appendonly yes is not supported with a pool: "
                                    "the pool is the durable copy");
                return 1;
            }
        }
        return 0;
    }
    if (c->cmd->proc == debugCommand && c->argc >= 2 && sdsEncodedObject(c->argv[1]) &&
        !strcasecmp(c->argv[1]->ptr, "loadaof")) {
        /* It empties the databases, then exits for want of an AOF file. */
        rejectCommandFormat(c, "Mangosteen: DEBUG LOADAOF is not supported with a pool: there is no AOF, "
                            "the pool is the durable copy");
        return 1;
    }
    if (c->cmd->proc == failoverCommand &&
        !(c->argc == 2 && sdsEncodedObject(c->argv[1]) && !strcasecmp(c->argv[1]->ptr, "abort"))) {
        /* FAILOVER makes this master a replica of one of its replicas
         * (FAILOVER ABORT can start none: Redis answers it). */
        rejectCommandFormat(c, "Mangosteen: FAILOVER is not supported with a pool: this server would become a "
                            "replica, whose full sync loads the new master's data outside any write section");
        return 1;
    }
    if (c->cmd->proc != replicaofCommand) return 0;
    if (c->argc == 3 && sdsEncodedObject(c->argv[1]) && sdsEncodedObject(c->argv[2]) &&
        !strcasecmp(c->argv[1]->ptr, "no") && !strcasecmp(c->argv[2]->ptr, "one"))
        return 0; /* already a master: a no-op */
    rejectCommandFormat(c, "Mangosteen: %s is not supported with a pool: a replica's full sync would load "
                        "the master's data outside any write section", c->cmd->fullname);
    return 1;
}

/* ---- databases ------------------------------------------------------------ */

/* zmalloc's used_memory is a .bss counter: the pool restores it as the last
 * batch recorded it, transient memory of the crashed process included (reply
 * buffers, query buffers), which no one will ever free. Recount it as this
 * process sees it: the durable heap's bytes in use, which is the dataset
 * (and any garbage the crashed process left there), plus what this process
 * allocated before and after the restore. */
static void recount_used_memory(void)
{
    mango_stats s;
    mango_get_stats(&s);
    size_t recorded = used_memory_restored;
    long long own = (long long)zmalloc_used_memory() - (long long)used_memory_restored +
                    (long long)used_memory_before_init;
    size_t um = (size_t)s.heap_payload_bytes + (size_t)(own > 0 ? own : 0);
    zmalloc_set_used_memory(um);
    serverLog(LL_NOTICE, "Mangosteen: used_memory %zu after recovery (durable heap %llu in %llu allocations, "
              "this process %lld; the pool had recorded %zu)", um, (unsigned long long)s.heap_payload_bytes,
              (unsigned long long)s.heap_chunks, own, recorded);
}

/* ---- scratch: durable memory recovery does not need ---------------------- *
 * Every pass's batch, and serverCron's ten a second on an idle server, write
 * some durable memory whose value no restart uses: statistics, call()'s
 * bookkeeping, the cached clock, the expire cycle's per-db estimate and
 * cursor, and (MANGO_SCRATCH in the patch) the cron's cursors over the
 * databases. Marked scratch, a block that only they wrote is not logged, and
 * a batch that wrote nothing else makes no sync (mango.h): an idle server
 * stays off the disk. What a restart finds in them is unspecified: initServer()
 * sets the server fields again after recovery, the two db fields are reset
 * here, and the cursors hold values they held (.data/.bss scratch): in
 * range, since a pool's number of databases never changes (current_db and
 * resize_db are taken modulo it anyway; rehash_db is not).
 * Not marked: server.db and everything else recovery restores. */
#define SERVER_SPAN(first, last) \
    { &server.first, (size_t)((char *)(&server.last + 1) - (char *)&server.first), #first ".." #last }
#define SERVER_FIELD(f) { &server.f, sizeof server.f, #f }
static void mark_scratch(void)
{
    struct { const void *p; size_t n; const char *what; } r[] = {
        /* INFO's statistics (initServer()/resetServerStats() set them) */
        SERVER_SPAN(stat_starttime, stat_sync_partial_err),
        SERVER_SPAN(cron_malloc_stats, stat_reply_buffer_expands),
        /* call()'s bookkeeping, set before it is read */
        SERVER_FIELD(core_propagates), SERVER_FIELD(propagate_no_multi),
        SERVER_FIELD(fixed_time_expire), SERVER_FIELD(in_nested_call),
        /* changes since the last save (save points, INFO) */
        SERVER_FIELD(dirty),
        /* the cached clock (updateCachedTime()) */
        SERVER_SPAN(unixtime, ustime),
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (mango_scratch(r[i].p, r[i].n) != MANGO_OK) die(r[i].what, MANGO_EINVAL);
    for (int j = 0; j < server.dbnum; j++) {
        redisDb *db = &server.db[j];
        if (mango_recovered) { /* a transient store: scratch needs no batch */
            db->avg_ttl = 0;
            db->expires_cursor = 0;
        }
        if (mango_scratch(&db->avg_ttl, sizeof db->avg_ttl) != MANGO_OK ||
            mango_scratch(&db->expires_cursor, sizeof db->expires_cursor) != MANGO_OK)
            die("a database's avg_ttl and expires_cursor", MANGO_EINVAL);
    }
}

/* ---- importing an RDB file into a new pool -------------------------------- *
 * A new pool next to an RDB file (a dump.rdb from stock Redis, or from SAVE)
 * imports it at the first start, before the first client: the way to move an
 * existing dataset in. The keys are loaded by Redis's own rdbLoad() inside a
 * write section, as a bulk load (mango_batch_bulk_begin): the heap's stores
 * are not captured one by one, and at the end the heap is logged in pieces
 * of a quarter of the log, then the batch. With MANGO_REDIS_IMPORT_BULK=0
 * every store is captured instead, and the write section is committed every
 * time its batch holds a quarter of what a log frame can take
 * (rdbLoadProgressCallback calls mangoLoadingProgress). Either way neither
 * the dedup set nor a big-batch file grows with the file. The pool records
 * the import's state durably:
 *   - RUNNING, committed before the first key: a start that stops in the
 *     middle (killed, out of memory, a damaged file) leaves a pool holding a
 *     part of the file; every later start refuses it with a message, never
 *     serves it as if it were the dataset;
 *   - DONE, committed with the last key: the start then serves, and later
 *     starts recover the pool and skip the file, as for any pool.
 * A recovered pool never imports: its dataset may have changed since the
 * file was written. */
enum { IMPORT_NONE = 0, IMPORT_RUNNING = 1, IMPORT_DONE = 2 };
#define IMPORT_CHECK_BYTES (256u << 10) /* look at the batch's size every 256 KiB of the file */
#define IMPORT_REPORT_NS (5000000000ull)
#define IMPORT_MIN_ROOM (8u << 20) /* stop with less room than this (or 1/32 of the heap) left */
/* Durable: written in write sections. */
static int durable_import_state;
static long long durable_import_file_bytes;
/* Transient (thread-locals: written inside the import's write section too). */
static __thread int import_bulk; /* the default; MANGO_REDIS_IMPORT_BULK=0: chunked */
static __thread size_t import_next_check, import_next_events;
static __thread long long import_events_interval; /* loading-process-events-interval-bytes, taken over */
static __thread uint64_t import_batches, import_t0, import_last_report;
/* Test hook (redis/tests): MANGO_REDIS_TEST_IMPORT_KILL_AFTER=N sends the
 * server SIGKILL right after the chunked import's N-th intermediate batch, as
 * a kill at that moment would (a bulk import: MANGO_TEST_BULK_KILL_AFTER, the
 * runtime's, after its N-th piece). */
static long test_import_kill_after = -1;

/* What rdbLoadProgressCallback does every loading-process-events-interval-
 * bytes, with the batch paused: clients connect, get LOADING errors, run INFO
 * (with the loading progress), as while stock Redis loads. Outside the write
 * section their allocations are transient, and their replies leave at once.
 * DEBUG, the one command that would open a write section here, is refused
 * with LOADING (mangoRefuseCommand). */
static void serve_paused(int *serving)
{
    int depth = write_depth;
    /* Already paused inside a function library's load (mangoRdbFunctionLoad):
     * it stays paused. */
    int was_capturing = mango_capture_active;
    if (was_capturing) mango_batch_pause();
    int was_serving = *serving;
    write_depth = 0;
    note_epoch++;
    *serving = 1;
    processEventsWhileBlocked();
    note_epoch++;
    write_depth = depth; /* before the flag: an exit in between still finds the command unfinished */
    *serving = was_serving;
    if (was_capturing) mango_batch_resume();
}

static void serve_during_import(size_t processed_bytes)
{
    loadingAbsProgress((off_t)processed_bytes);
    serve_paused(&import_serving);
}

/* rdbLoadProgressCallback() serves clients every loading-process-events-
 * interval-bytes (an import takes that over: serve_during_import). Inside
 * a write section (DEBUG RELOAD, which empties the databases and loads the
 * file in one) the loop would otherwise run with the batch capturing: the
 * clients that connect, their query buffers and replies would come from the
 * durable heap and leak there at the next crash, and an exit served there
 * (SHUTDOWN NOSAVE, SIGTERM) counts as one inside the command
 * (mangoCommandUnfinished), so the half-loaded batch is dropped. */
void mangoProcessEventsWhileLoading(void)
{
    if (!mango_on || write_depth == 0 || !mango_batch_open()) {
        processEventsWhileBlocked();
        return;
    }
    serve_paused(&reload_serving);
}

void mangoLoadingProgress(size_t processed_bytes)
{
    if (!importing || processed_bytes < import_next_check) return;
    import_next_check = processed_bytes + IMPORT_CHECK_BYTES;
    /* Stop while the heap still has room: past it Redis would report a
     * damaged file, then crash running its RDB check in a full heap. */
    uint64_t allocated = 0, capacity = 0;
    mango_heap_room(&allocated, &capacity);
    uint64_t margin = capacity / 32 > IMPORT_MIN_ROOM ? capacity / 32 : IMPORT_MIN_ROOM;
    if (allocated + margin > capacity) {
        serverLog(LL_WARNING, "Mangosteen: importing %s: the pool's durable heap is full (%llu of %llu bytes in use) "
                  "after %zu of %lld bytes of the file; the pool %s keeps the unfinished import and will refuse to "
                  "start: remove it and make a larger one (mango-pool-size) to import the file",
                  server.rdb_filename, (unsigned long long)allocated, (unsigned long long)capacity, processed_bytes,
                  durable_import_file_bytes, mango_pool_path());
        exit(1);
    }
    uint64_t used = 0, cap = 0; /* a bulk import commits nothing before its end */
    /* Not inside a function library's load (paused: mangoRdbFunctionLoad),
     * whose next batch would capture the rest of it. */
    if (!import_bulk && mango_capture_active) mango_batch_room(&used, &cap);
    if (used > cap / 4) {
        /* The load may stop anywhere, even inside a key: nothing of this
         * batch is served before the import's last batch marks it DONE. */
        int rc = pipelined ? mango_batch_submit(NULL) : mango_batch_end();
        if (rc != MANGO_OK) die("importing the RDB file: committing a batch", rc);
        import_batches++;
        if (test_import_kill_after >= 0 && import_batches >= (uint64_t)test_import_kill_after) {
            uint64_t d = 0;
            while (pipelined && mango_durable_ticket(&d) == MANGO_OK && d + 1 < mango_reply_ticket())
                usleep(1000);
            serverLog(LL_WARNING, "Mangosteen: TEST HOOK MANGO_REDIS_TEST_IMPORT_KILL_AFTER: SIGKILL after "
                      "%llu batches of the import", (unsigned long long)import_batches);
            raise(SIGKILL);
        }
        rc = mango_batch_begin();
        if (rc != MANGO_OK) die("importing the RDB file: mango_batch_begin", rc);
    }
    if (import_events_interval > 0 && processed_bytes >= import_next_events) {
        import_next_events = processed_bytes + (size_t)import_events_interval;
        serve_during_import(processed_bytes);
    }
    uint64_t now = monotonic_ns();
    if (now - import_last_report >= IMPORT_REPORT_NS) {
        import_last_report = now;
        serverLog(LL_NOTICE, "Mangosteen: importing %s: %zu of %lld bytes read (%.0f%%), %llu batches, %.1f s",
                  server.rdb_filename, processed_bytes, durable_import_file_bytes,
                  durable_import_file_bytes ? 100.0 * (double)processed_bytes / (double)durable_import_file_bytes : 100.0,
                  (unsigned long long)import_batches, (double)(now - import_t0) / 1e9);
    }
}

/* mango_set_bulk_progress's hook while the loaded heap is logged (a piece of
 * a quarter of the log at a time: seconds for a large dataset in fs mode):
 * clients keep getting LOADING, and the log says where it stands. */
static void import_bulk_progress(void *arg, uint64_t done, uint64_t total)
{
    UNUSED(arg);
    serve_during_import((size_t)durable_import_file_bytes); /* the file is read: INFO says 100 % loaded */
    uint64_t now = monotonic_ns();
    if (now - import_last_report >= IMPORT_REPORT_NS) {
        import_last_report = now;
        serverLog(LL_NOTICE, "Mangosteen: importing %s: logging the loaded heap: %llu of %llu MB (%.0f%%), %.1f s",
                  server.rdb_filename, (unsigned long long)(done >> 20), (unsigned long long)(total >> 20),
                  total ? 100.0 * (double)done / (double)total : 100.0, (double)(now - import_t0) / 1e9);
    }
}

/* The new pool takes the RDB file's keys (see above); exits on failure. */
static void import_rdb_file(const struct stat *st)
{
    uint64_t allocated = 0, capacity = 0;
    mango_heap_room(&allocated, &capacity);
    const char *hook = getenv("MANGO_REDIS_TEST_IMPORT_KILL_AFTER");
    if (hook && *hook) {
        unsigned long long n;
        if (!parse_number(hook, 0, LONG_MAX, &n)) {
            serverLog(LL_WARNING, "Mangosteen: test hook MANGO_REDIS_TEST_IMPORT_KILL_AFTER '%s': expected a number "
                      "of batches", hook);
            exit(1);
        }
        test_import_kill_after = (long)n;
    }
    serverLog(LL_NOTICE, "Mangosteen: the pool is new: importing %s (%lld bytes) into it before serving",
              server.rdb_filename, (long long)st->st_size);
    if ((uint64_t)st->st_size > capacity - allocated)
        serverLog(LL_WARNING, "Mangosteen: %s (%lld bytes) is larger than the room left in the pool's durable heap "
                  "(%llu bytes): its keys will probably not fit (the import then stops with out of memory). "
                  "Make a larger pool with mango-pool-size", server.rdb_filename, (long long)st->st_size,
                  (unsigned long long)(capacity - allocated));
    mangoWriteBegin();
    durable_import_state = IMPORT_RUNNING;
    durable_import_file_bytes = (long long)st->st_size;
    mangoWriteEnd();
    commit_sync(); /* RUNNING is durable before any key is */
    importing = 1;
    import_t0 = import_last_report = monotonic_ns();
    import_next_check = IMPORT_CHECK_BYTES;
    /* Serving clients while the file loads is done here, batch paused
     * (serve_during_import), not by rdbLoadProgressCallback in the write
     * section. */
    import_events_interval = server.loading_process_events_interval_bytes;
    import_next_events = (size_t)import_events_interval;
    server.loading_process_events_interval_bytes = 0;
    mangoWriteBegin();
    const char *bulk_env = getenv("MANGO_REDIS_IMPORT_BULK");
    import_bulk = !(bulk_env && strcmp(bulk_env, "0") == 0);
    if (import_bulk) {
        int rc = mango_batch_bulk_begin();
        if (rc != MANGO_OK) die("importing the RDB file: mango_batch_bulk_begin", rc);
    }
    rdbSaveInfo rsi = RDB_SAVE_INFO_INIT;
    errno = 0;
    /* Not loadDataFromDisk(): it would make a replication backlog (transient
     * state) inside the write section and feed it the expired keys. */
    if (rdbLoad(server.rdb_filename, &rsi, RDBFLAGS_NONE) != C_OK) {
        serverLog(LL_WARNING, "Mangosteen: importing %s failed (%s); the pool %s keeps the unfinished import and "
                  "will refuse to start: remove it to import again", server.rdb_filename,
                  errno ? strerror(errno) : "see above", mango_pool_path());
        exit(1);
    }
    importing = 0;
    server.loading_process_events_interval_bytes = import_events_interval;
    if (import_bulk) {
        uint64_t t_bulk = monotonic_ns();
        uint64_t allocated = 0;
        mango_heap_room(&allocated, NULL);
        serverLog(LL_NOTICE, "Mangosteen: importing %s: the file is read; logging the loaded heap (%llu MB) to the pool",
                  server.rdb_filename, (unsigned long long)(allocated >> 20));
        /* rdbLoad() has ended Redis's loading state: take it up again while
         * the heap is logged, or the clients served between pieces would run
         * commands (a write would join the import's batch and be answered
         * before the import is DONE; whileBlockedCron() asserts on it). */
        server.loading = 1;
        blockingOperationStarts();
        mango_set_bulk_progress(import_bulk_progress, NULL);
        int rc = mango_batch_bulk_end();
        mango_set_bulk_progress(NULL, NULL);
        blockingOperationEnds();
        server.loading = 0;
        if (rc != MANGO_OK) die("importing the RDB file: logging the loaded heap (mango_batch_bulk_end)", rc);
        serverLog(LL_NOTICE, "Mangosteen: importing %s: the file is loaded (%.2f s); its heap was logged in %.2f s",
                  server.rdb_filename, (double)(t_bulk - import_t0) / 1e9, (double)(monotonic_ns() - t_bulk) / 1e9);
    }
    /* Function libraries in the file were loaded into the engine: keep their
     * source in the pool, as FUNCTION LOAD does. */
    mangoFunctionsSave();
    durable_import_state = IMPORT_DONE;
    mangoWriteEnd();
    commit_sync();
    long long keys = 0;
    for (int j = 0; j < server.dbnum; j++) keys += dictSize(server.db[j].dict);
    char how[48];
    if (import_bulk) snprintf(how, sizeof how, "a bulk load");
    else snprintf(how, sizeof how, "%llu batches", (unsigned long long)import_batches + 1);
    serverLog(LL_NOTICE, "Mangosteen: imported %s into the pool: %lld keys, %s, %.2f s; the pool is the "
              "dataset from now on (the file is no longer read)", server.rdb_filename, keys, how,
              (double)(monotonic_ns() - import_t0) / 1e9);
}

int mangoLoadDataFromDisk(void)
{
    if (!mango_on) return 1;
    if (mango_recovered && durable_import_state == IMPORT_RUNNING) {
        serverLog(LL_WARNING, "Mangosteen: the pool %s holds an unfinished import of an RDB file (%lld bytes): "
                  "the start that imported it stopped before the end (killed, out of memory or a damaged file: "
                  "see that start's log). It holds nothing else; remove it and start again to import the file anew",
                  mango_pool_path(), durable_import_file_bytes);
        exit(1);
    }
    mangoReplPositionRestore(mango_recovered); /* replicas may continue where they were */
    if (mango_recovered) mangoFunctionsReload(); /* before the first client */
    struct stat st;
    if (stat(server.rdb_filename, &st) != 0) return 0; /* nothing to load */
    if (mango_recovered) {
        serverLog(LL_WARNING, "Mangosteen: %s not loaded: the pool holds the dataset (%s)", server.rdb_filename,
                  durable_import_state == IMPORT_DONE ? "it imported the file at its first start"
                                                      : "an RDB file here is only a copy, e.g. from SAVE");
        return 0;
    }
    import_rdb_file(&st);
    return 0;
}

void mangoCreateDatabases(void)
{
    int j;
    if (mango_on) serverLog(test_reads_ignore_keys ? LL_WARNING : LL_NOTICE, "%s", init_msg);
    if (mango_on) check_settings_loaded();
    if (mango_on) {
        uint64_t allocated, capacity;
        mango_heap_room(&allocated, &capacity);
        if (!server.maxmemory || server.maxmemory > capacity)
            serverLog(LL_NOTICE, "Mangosteen: the pool's durable heap holds %llu bytes (%llu in use); writes "
                      "are refused with OOM when it is nearly full. Set maxmemory below it (e.g. %llu) to have "
                      "Redis evict or refuse first", (unsigned long long)capacity, (unsigned long long)allocated,
                      (unsigned long long)(capacity / 10 * 9));
    }
    if (mango_on && server.memcheck_enabled) {
        /* The crash report's memory test rewrites every anonymous mapping:
         * the durable heap (slow at a pool's size) and the runtime's own
         * tables, which its instrumented stores then consult (the report
         * ended in a second SIGSEGV, inside mango_capture). */
        server.memcheck_enabled = 0;
        serverLog(LL_NOTICE, "Mangosteen: crash-memcheck-enabled is off with a pool (a crash report's memory "
                  "test would rewrite the durable heap and the runtime's state)");
    }
    if (mango_on && server.io_threads_num > 1) {
        /* Threaded writes bypass the per-client durability check. */
        serverLog(LL_WARNING, "Mangosteen: io-threads > 1 is not supported; set io-threads 1");
        exit(1);
    }
    if (mango_on && server.aof_state != AOF_OFF) {
        /* Loading the AOF would replay its commands over the pool's dataset
         * (INCRs applied twice, deleted keys back). */
        serverLog(LL_WARNING, "Mangosteen: appendonly yes is not supported with a pool (the AOF would be "
                  "replayed over the recovered dataset); start with --appendonly no");
        exit(1);
    }
    if (mango_on && server.cluster_enabled) {
        serverLog(LL_WARNING, "Mangosteen: cluster mode is not supported with a pool; start with cluster-enabled no");
        exit(1);
    }
    if (mango_on && server.masterhost) {
        serverLog(LL_WARNING, "Mangosteen: replicaof is not supported with a pool (a full sync would load the "
                  "master's data outside any write section); remove it from the configuration");
        exit(1);
    }
    if (mango_on && server.saveparamslen > 0)
        serverLog(LL_NOTICE, "Mangosteen: RDB snapshots (save) are redundant with the pool; "
                  "%s is never loaded while the pool holds the data (--save \"\" turns them off)",
                  server.rdb_filename);
    if (!mango_on || !mango_recovered) {
        mangoWriteBegin();
        createSharedObjects();
        server.db = zmalloc(sizeof(redisDb) * server.dbnum);
        for (j = 0; j < server.dbnum; j++) {
            server.db[j].dict = dictCreate(&dbDictType);
            server.db[j].expires = dictCreate(&dbExpiresDictType);
            server.db[j].expires_cursor = 0;
            server.db[j].id = j;
            server.db[j].avg_ttl = 0;
            server.db[j].defrag_later = listCreate();
            listSetFreeMethod(server.db[j].defrag_later, (void (*)(void *))sdsfree);
        }
        /* Rewrite the (random) dict hash seed inside the batch so that it is
         * durable: the db dicts' buckets depend on it. */
        uint8_t seed[16];
        memcpy(seed, dictGetHashFunctionSeed(), sizeof seed);
        dictSetHashFunctionSeed(seed);
        durable_dbnum = server.dbnum;
        durable_magic = MANGO_REDIS_MAGIC;
        mangoWriteEnd();
        commit_sync(); /* durable before the server accepts anything */
    } else if (durable_dbnum != server.dbnum) {
        serverLog(LL_WARNING, "Mangosteen: the pool has %d databases, the configuration %d: refusing to start",
                  durable_dbnum, server.dbnum);
        exit(1);
    } else {
        long long keys = 0;
        for (j = 0; j < server.dbnum; j++) keys += dictSize(server.db[j].dict);
        serverLog(LL_NOTICE, "Mangosteen: %d databases restored, %lld keys, no replay", server.dbnum, keys);
        recount_used_memory();
        unsigned long graves = mangoGravesPending();
        if (graves)
            serverLog(LL_NOTICE, "Mangosteen: %lu flushed databases or deleted big objects were still being "
                      "freed; the release goes on in steps", graves);
    }
    /* Transient per-db bookkeeping (points at clients). */
    for (j = 0; j < server.dbnum; j++) {
        server.db[j].blocking_keys = dictCreate(&keylistDictType);
        server.db[j].ready_keys = dictCreate(&objectKeyPointerValueDictType);
        server.db[j].watched_keys = dictCreate(&keylistDictType);
        server.db[j].slots_to_keys = NULL; /* cluster mode is not supported */
    }
    if (mango_on) mark_scratch();
}
