/* kv_history.c -- kill -9 torture that records a client history for a
 * linearizability checker (tests/linearizability, Porcupine).
 *
 *   kvstore history-worker  N clients race PUT/GET on a few keys, logging every
 *                           invocation and return; runs until killed (or for
 *                           --seconds, then exits cleanly)
 *   kvstore history-test    --rounds times: start a history-worker, SIGKILL it
 *                           at a random moment; then one worker that exits
 *                           cleanly, so the last crash's effects are observed
 *
 * Log format, one file per client thread and process (DIR/client-<pid>-<t>.log),
 * one line per event, each written with a single write(2) (O_APPEND); a kill
 * can cut only a file's last line short (where it crosses a page), and the
 * checker leaves such a line out:
 *
 *   I <opid> <client> <key> <PUT|GET> <value-id> <t_ns>    before mango_client_cmd
 *   R <opid> <result> <t_ns>                              after it returned
 *
 * t_ns is CLOCK_MONOTONIC, one clock for every process on the machine. The
 * call time is read before the I line is written and the return time after
 * the command returned, so each logged interval contains the real one. A PUT's
 * value-id is unique in the whole history (epoch, client, counter); a GET logs
 * 0 as value-id and its result is the id read back (0: never written, "torn":
 * bytes that no PUT wrote). An I line without its R line is an operation cut
 * off by the crash: it may or may not have taken effect.
 *
 * Each worker starts, after recovery, with client 0 reading every key once,
 * so what a crash lost is observed before new writes can cover it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv_fixed.h"
#include "kv_workload.h"
#include "kvstore_driver.h"
#include "mango.h"

#define HIST_TORN UINT64_MAX

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void hist_die(const char *what, const char *arg)
{
    fprintf(stderr, "kvstore: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    exit(2);
}

/* ---- history-worker ---- */

typedef struct hclient {
    pthread_t th;
    uint32_t id;
    int fd;
    uint64_t opid;   /* per log file */
    uint64_t seq;    /* kv_fixed's per-client request number (durable) */
    uint64_t nputs;  /* this process's PUTs: part of the value id */
    uint64_t rng;
    char *val, *out;
} hclient;

static uint64_t hist_epoch;
static _Atomic int hist_stop;
static _Atomic int hist_burst; /* SIGUSR1 seen: the kill is imminent, stop pausing */

static void log_line(hclient *c, const char *line, int len)
{
    ssize_t n = write(c->fd, line, (size_t)len);
    if (n != len)
        hist_die("history log write", NULL);
}

/* The id a GET read: 0 for never written, HIST_TORN for bytes no PUT wrote. */
static uint64_t read_id(const char *v, uint32_t key)
{
    uint64_t hdr[2];
    memcpy(hdr, v, 16);
    bool zero = true;
    for (uint32_t i = 0; i < O.value_size && zero; i++)
        zero = v[i] == 0;
    if (zero)
        return 0;
    uint32_t t = (uint32_t)(hdr[0] >> 32);
    if ((uint32_t)hdr[0] != key || t >= KV_MAX_CLIENTS || hdr[1] == 0)
        return HIST_TORN;
    char *want = alloca(O.value_size);
    kvw_value(want, O.value_size, t, hdr[1], key);
    return memcmp(want, v, O.value_size) == 0 ? hdr[1] : HIST_TORN;
}

static void do_op(hclient *c, bool put, uint32_t key)
{
    char line[160];
    uint64_t id = 0, op = ++c->opid;
    kv_fixed_cmd cmd = {.index = key, .client = c->id};
    if (put) {
        /* Unique across the history: the epoch numbers worker processes. */
        id = (hist_epoch << 40) | ((uint64_t)c->id << 32) | (++c->nputs & 0xffffffffu);
        kvw_value(c->val, O.value_size, c->id, id, key);
        cmd.op = KV_PUT;
        cmd.seq = ++c->seq;
        cmd.value = c->val;
    } else {
        cmd.op = KV_GET;
        cmd.out = c->out;
    }
    uint64_t t0 = now_ns();
    int n = snprintf(line, sizeof line, "I %" PRIu64 " %u %u %s %" PRIu64 " %" PRIu64 "\n", op, c->id,
                     key, put ? "PUT" : "GET", id, t0);
    log_line(c, line, n);
    int rc = mango_client_cmd(&cmd);
    uint64_t t1 = now_ns();
    if (rc) {
        fprintf(stderr, "kvstore history-worker: command failed: %s: %s\n", mango_strerror(rc),
                mango_last_error());
        _exit(2); /* no R line: the op stays "unknown", which is what it is */
    }
    if (cmd.status) { /* ran, but the store refused it (it said "success: no error") */
        fprintf(stderr, "kvstore history-worker: %s of key %u refused by the store (status %d)\n",
                put ? "PUT" : "GET", key, cmd.status);
        _exit(2); /* no R line: the op stays "unknown", which is what it is */
    }
    if (put) {
        n = snprintf(line, sizeof line, "R %" PRIu64 " 0 %" PRIu64 "\n", op, t1);
    } else {
        uint64_t r = read_id(c->out, key);
        if (r == HIST_TORN) {
            fprintf(stderr, "kvstore history-worker: client %u: GET of key %u read a torn value\n",
                    c->id, key);
            n = snprintf(line, sizeof line, "R %" PRIu64 " torn %" PRIu64 "\n", op, t1);
        } else {
            n = snprintf(line, sizeof line, "R %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", op, r, t1);
        }
    }
    log_line(c, line, n);
}

static void *hclient_main(void *arg)
{
    hclient *c = arg;
    while (!atomic_load_explicit(&hist_stop, memory_order_relaxed)) {
        c->rng = kvw_mix(c->rng + 1);
        bool put = (c->rng % 100) < O.update_pct;
        do_op(c, put, (uint32_t)((c->rng >> 8) % O.keys));
        if (O.think_us && !atomic_load_explicit(&hist_burst, memory_order_relaxed)) {
            uint64_t us = (c->rng >> 32) % (2ull * O.think_us + 1);
            struct timespec d = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
            nanosleep(&d, NULL);
        }
    }
    return NULL;
}

static void read_all(hclient *c)
{
    for (uint32_t k = 0; k < O.keys; k++)
        do_op(c, false, k);
}

static void need_history_opts(const char *cmd)
{
    if (!O.pool || !O.history) {
        fprintf(stderr, "kvstore: %s needs --pool and --history\n", cmd);
        exit(2);
    }
    if (O.keys == 0)
        O.keys = 8;
    O.values = O.keys; /* one value per key: n_values = K */
}

/* Number the worker processes of a history: read, bump and rewrite DIR/epoch. */
static uint64_t next_epoch(void)
{
    char path[4096], buf[32] = {0};
    snprintf(path, sizeof path, "%s/epoch", O.history);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        hist_die("cannot open", path);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    uint64_t e = (n > 0 ? strtoull(buf, NULL, 10) : 0) + 1;
    int len = snprintf(buf, sizeof buf, "%" PRIu64 "\n", e);
    if (pwrite(fd, buf, (size_t)len, 0) != len)
        hist_die("cannot write", path);
    close(fd);
    if (e >= (1ull << 24)) {
        fprintf(stderr, "kvstore: %s: too many worker epochs\n", path);
        exit(2);
    }
    return e;
}

int run_history_worker(void)
{
    need_history_opts("history-worker");
    /* SIGUSR1 (from history-test, a few ms before its SIGKILL) is taken by
     * sigwait in the main thread only: blocked before any thread exists, so
     * no runtime or client thread is ever interrupted by it. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    hist_epoch = next_epoch();
    start_fixed();
    hclient *c = calloc(O.threads, sizeof *c);
    for (uint32_t t = 0; t < O.threads; t++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/client-%d-%u.log", O.history, (int)getpid(), t);
        c[t].id = t;
        c[t].fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (c[t].fd < 0)
            hist_die("cannot open", path);
        c[t].seq = kv_fixed_client_seq(t);
        c[t].rng = kvw_mix(O.seed * 31 + t);
        c[t].val = malloc(O.value_size);
        c[t].out = malloc(O.value_size);
    }
    read_all(&c[0]); /* observe what the last crash kept, before anything new */
    for (uint32_t t = 0; t < O.threads; t++)
        pthread_create(&c[t].th, NULL, hclient_main, &c[t]);
    if (!O.seconds_set)
        for (;;) { /* until killed */
            int sig;
            if (sigwait(&usr1, &sig) == 0)
                atomic_store(&hist_burst, 1); /* full speed into the crash */
        }
    struct timespec d = {(time_t)O.seconds, (long)((O.seconds - (time_t)O.seconds) * 1e9)};
    nanosleep(&d, NULL);
    atomic_store(&hist_stop, 1);
    uint64_t ops = 0;
    for (uint32_t t = 0; t < O.threads; t++) {
        pthread_join(c[t].th, NULL);
    }
    read_all(&c[0]);
    for (uint32_t t = 0; t < O.threads; t++) {
        ops += c[t].opid;
        close(c[t].fd);
    }
    if (mango_shutdown()) {
        fprintf(stderr, "kvstore: shutdown: %s\n", mango_last_error());
        return 2;
    }
    if (!O.quiet)
        printf("history-worker: epoch %" PRIu64 ": %" PRIu64 " operations, clean exit\n", hist_epoch, ops);
    return 0;
}

/* ---- history-test ---- */

static pid_t spawn_history_worker(double seconds)
{
    char threads[16], keys[16], vsize[16], upd[16], seed[32], psize[32], lsize[32], secs[32], think[16];
    snprintf(threads, sizeof threads, "%u", O.threads);
    snprintf(keys, sizeof keys, "%u", O.keys);
    snprintf(vsize, sizeof vsize, "%u", O.value_size);
    snprintf(upd, sizeof upd, "%u", O.update_pct);
    snprintf(seed, sizeof seed, "%" PRIu64, kvw_mix(O.seed++));
    snprintf(psize, sizeof psize, "%zu", O.pool_size);
    snprintf(lsize, sizeof lsize, "%zu", O.log_size);
    snprintf(secs, sizeof secs, "%.3f", seconds);
    snprintf(think, sizeof think, "%u", O.think_us);
    const char *mode = kv_mode_name(O.mode);
    pid_t pid = fork();
    if (pid == 0) {
        if (seconds > 0)
            execl(O.self, O.self, "history-worker", "--pool", O.pool, "--history", O.history, "--mode",
                  mode, "--threads", threads, "--keys", keys, "--value-size", vsize, "--update-pct", upd,
                  "--seed", seed, "--pool-size", psize, "--log-size", lsize, "--think-us", think,
                  "--seconds", secs, "--read-keys", O.read_keys, "--quiet", (char *)NULL);
        else
            execl(O.self, O.self, "history-worker", "--pool", O.pool, "--history", O.history, "--mode",
                  mode, "--threads", threads, "--keys", keys, "--value-size", vsize, "--update-pct", upd,
                  "--seed", seed, "--pool-size", psize, "--log-size", lsize, "--think-us", think,
                  "--read-keys", O.read_keys, "--quiet", (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        hist_die("fork", NULL);
    return pid;
}

/* Start a history from scratch: remove the pool and the old logs. */
static void clean_history_dir(void)
{
    if (mkdir(O.history, 0755) != 0 && errno != EEXIST)
        hist_die("cannot create", O.history);
    DIR *d = opendir(O.history);
    if (!d)
        hist_die("cannot open", O.history);
    struct dirent *e;
    while ((e = readdir(d))) {
        if ((!strncmp(e->d_name, "client-", 7) && strstr(e->d_name, ".log")) ||
            !strcmp(e->d_name, "epoch") || !strcmp(e->d_name, "viz.html")) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", O.history, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

int run_history_test(void)
{
    need_history_opts("history-test");
    kv_refuse_mode_none("history-test");
    unlink(O.pool);
    clean_history_dir();
    srand((unsigned)O.seed);
    unsigned early_kills = 0;
    uint64_t t0 = now_ns();
    for (unsigned r = 0; r < O.rounds; r++) {
        pid_t w = spawn_history_worker(0);
        /* One round in five is killed within 5 ms: during recovery or the
         * first read-all, so recovery itself gets crashed too. The others
         * run min..max ms; 1..5 ms before the kill, SIGUSR1 tells the
         * clients to stop pausing (--think-us), so the crash lands in a
         * burst with commands in flight while the history stays small. */
        if (r > 0 && rand() % 5 == 0) {
            usleep((unsigned)rand() % 5000);
            early_kills++;
        } else {
            unsigned delay_us = (O.min_ms + (unsigned)rand() % (O.max_ms - O.min_ms + 1)) * 1000u;
            unsigned burst_us = 1000u + (unsigned)rand() % 4001u;
            if (burst_us > delay_us)
                burst_us = delay_us;
            usleep(delay_us - burst_us);
            kill(w, SIGUSR1);
            usleep(burst_us);
        }
        kill(w, SIGKILL);
        int ws;
        waitpid(w, &ws, 0);
        /* SIGUSR1 before the worker blocked it kills it just as well. */
        if (!(WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGKILL || WTERMSIG(ws) == SIGUSR1))) {
            fprintf(stderr, "history-test: round %u: worker exited by itself (status %d)\n", r,
                    WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
            return 2;
        }
        if (!O.quiet && (r + 1) % 10 == 0)
            fprintf(stderr, "history-test: %u/%u rounds\n", r + 1, O.rounds);
    }
    /* A last worker that exits cleanly: its first and last read-all observe
     * what the final crash kept. */
    pid_t w = spawn_history_worker(O.seconds_set ? O.seconds : 0.2);
    int ws;
    waitpid(w, &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        fprintf(stderr, "history-test: the final worker failed (status %d)\n",
                WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        return 2;
    }
    printf("history-test: rounds=%u early_kills=%u seconds=%.1f history=%s\n", O.rounds, early_kills,
           (double)(now_ns() - t0) * 1e-9, O.history);
    return 0;
}
