/* test_capture_verify.c -- the capture verifier (src/capture/verify.h).
 *
 * One runtime (mango_init once: the durable heap stays mapped after
 * mango_shutdown, so a second init in the same process cannot reserve it),
 * local-mode commands, each its own batch. Checks that
 *   1. commands that capture every store they make (malloc, realloc, calloc,
 *      free, deferred free, a batch large enough to spill into the dedup
 *      overflow) report no miss;
 *   2. an uncaptured write to a durable heap buffer is reported once per
 *      32-byte block, at the right address;
 *   3. an uncaptured write to a .bss global is reported, named by symbol;
 *   4. writes to transient memory (glibc heap, stack) and writes to globals
 *      outside commands are not reported;
 *   5. a block captured only in part (bytes 0..3 of 0..7) is reported;
 *   6. the runtime's own globals are never reported (its source list covers
 *      every file in src/), while a static global of an application file
 *      with a runtime file's name (capture_verify_app/pool.c) is;
 *   7. MANGO_VERIFY_ABORT=1 aborts at the first miss (in a forked child);
 *   8. a .bss store made while the batch is paused is reported by default;
 *      with MANGO_VERIFY_PAUSED=ignore (in a forked child) it is not, while
 *      a paused store to the durable heap, and an uncaptured .bss store made
 *      before the pause in the same block, still are, a batch may end while
 *      paused, and a bad value of the variable fails mango_init, as does a
 *      MANGO_VERIFY_MAX_REPORT that is not a number of 0 to 2^32 - 1.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture/verify.h"
#include "mango.h"

#include "check.h"

/* ---- commands ---- */

typedef struct cmd {
    void (*fn)(void *arg);
    void *arg;
} cmd;

static bool is_ro(void *ctx) { (void)ctx; return false; }
static void process(void *ctx) { cmd *c = ctx; c->fn(c->arg); }

static char report_path[256], pool_path[256];
static off_t report_off;
static char report_buf[1 << 16];

/* Text appended to the report since the last call. */
static const char *report_new(void)
{
    int fd = open(report_path, O_RDONLY);
    size_t n = 0;
    if (fd >= 0) {
        ssize_t r = pread(fd, report_buf, sizeof report_buf - 1, report_off);
        if (r > 0) {
            n = (size_t)r;
            report_off += r;
        }
        close(fd);
    }
    report_buf[n] = 0;
    return report_buf;
}

typedef struct outcome {
    uint64_t batches, missed;
    const char *text;
} outcome;

static outcome run(void (*fn)(void *), void *arg)
{
    mango_stats a, b;
    report_new();
    mango_get_stats(&a);
    cmd c = {fn, arg};
    int rc = mango_client_cmd(&c);
    CHECK(rc == 0);
    mango_get_stats(&b);
    return (outcome){b.verify_batches - a.verify_batches, b.verify_missed_blocks - a.verify_missed_blocks,
                     report_new()};
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed + i * 13 + 1);
}

/* Durable state of the tests. */
static unsigned char *g_buf; /* 256 durable bytes */
static unsigned char *g_big;
static void *g_keep[8];
static unsigned char g_bss[128] __attribute__((aligned(32)));
static unsigned char *g_transient; /* glibc memory, malloc'd outside commands */
static int g_outside;

/* 1: everything captured. */
static void c_alloc(void *arg)
{
    (void)arg;
    unsigned char *p = malloc(256);
    fill(p, 256, 1);
    mango_capture(p, 256);
    g_buf = p;
    mango_capture(&g_buf, sizeof g_buf);
    for (int i = 0; i < 8; i++) {
        g_keep[i] = i & 1 ? calloc(1, 100 + 700 * i) : malloc(40 + 3000 * i);
        if (!(i & 1)) {
            fill(g_keep[i], 40 + 3000 * i, i);
            mango_capture(g_keep[i], 40 + 3000 * i);
        }
    }
    mango_capture(g_keep, sizeof g_keep);
}

static void c_realloc_free(void *arg)
{
    (void)arg;
    g_keep[0] = realloc(g_keep[0], 20000);
    fill((unsigned char *)g_keep[0] + 40, 20000 - 40, 7);
    mango_capture((unsigned char *)g_keep[0] + 40, 20000 - 40);
    free(g_keep[3]);
    g_keep[3] = NULL;
    mango_capture(g_keep, sizeof g_keep);
}

static void c_big(void *arg)
{
    (void)arg;
    /* 3000 blocks: past the dedup set's 60 % load, into the overflow. */
    g_big = malloc(3000 * 32);
    fill(g_big, 3000 * 32, 3);
    mango_capture(g_big, 3000 * 32);
    mango_capture(&g_big, sizeof g_big);
}

static void c_nothing(void *arg) { (void)arg; }

/* 2: an uncaptured write to the durable heap. */
static void c_heap_uncaptured(void *arg)
{
    (void)arg;
    fill(g_buf + 40, 100, 99);
}

/* 3: an uncaptured write to a .bss global. */
static void c_bss_uncaptured(void *arg)
{
    (void)arg;
    for (int i = 40; i < 48; i++)
        g_bss[i] = (unsigned char)(0xA0 + i);
}

/* 6b: a static global in an application file named like a runtime file
 * (capture_verify_app/pool.c). */
void app_pool_touch(unsigned char v);
static void c_app_pool_uncaptured(void *arg)
{
    (void)arg;
    app_pool_touch(0x5A);
}

static void c_bss_captured(void *arg)
{
    (void)arg;
    for (int i = 0; i < 8; i++)
        g_bss[i] = (unsigned char)(0x50 + i);
    mango_capture(g_bss, 8);
}

/* 4: transient memory. */
static void c_transient(void *arg)
{
    (void)arg;
    volatile unsigned char stack[512];
    for (int i = 0; i < 512; i++)
        stack[i] = (unsigned char)i;
    fill(g_transient, 4096, 5);
    (void)stack[100];
}

/* 5: bytes 0..7 written, 0..3 captured. */
static void c_partial(void *arg)
{
    (void)arg;
    for (int i = 0; i < 8; i++)
        g_buf[i] = (unsigned char)~g_buf[i];
    mango_capture(g_buf, 4);
}

/* 8: stores while the batch is paused. */
static void c_bss_paused(void *arg)
{
    (void)arg;
    mango_batch_pause();
    for (int i = 64; i < 72; i++)
        g_bss[i] = (unsigned char)(g_bss[i] + 1);
    mango_batch_pause(); /* again: no effect */
    mango_batch_resume();
    g_bss[0] = (unsigned char)(g_bss[0] + 1); /* captured, after the resume */
    mango_capture(g_bss, 1);
}

static void c_heap_paused(void *arg)
{
    (void)arg;
    mango_batch_pause();
    g_buf[200] = (unsigned char)(g_buf[200] + 1);
    mango_batch_resume();
}

static void c_bss_active_then_paused(void *arg)
{
    (void)arg;
    for (int i = 96; i < 100; i++) /* capturing, not captured */
        g_bss[i] = (unsigned char)(g_bss[i] + 1);
    mango_batch_pause();
    for (int i = 104; i < 108; i++)
        g_bss[i] = (unsigned char)(g_bss[i] + 1);
    mango_batch_resume();
}

static void c_ends_paused(void *arg)
{
    (void)arg;
    mango_batch_pause();
    g_bss[80] = (unsigned char)(g_bss[80] + 1);
}

static void config(mango_config *cfg)
{
    mango_config_default(cfg);
    cfg->pool_path = pool_path;
    cfg->pool_size = 64ull << 20;
    cfg->log_size = 4ull << 20;
    cfg->mode = MANGO_PERSIST_EMULATED;
    cfg->verify_capture = true;
}

static bool has(const char *text, const char *needle)
{
    if (strstr(text, needle))
        return true;
    fprintf(stderr, "  report lacks \"%s\"; it has:\n%s", needle, text);
    return false;
}

/* 6: every runtime source file is known to the verifier. */
static void check_runtime_files(void)
{
    char src[512];
    snprintf(src, sizeof src, "%s", __FILE__);
    char *t = strstr(src, "/tests/unit/");
    if (!t) {
        fprintf(stderr, "  (cannot locate src/ from %s; skipped)\n", __FILE__);
        return;
    }
    strcpy(t, "/src");
    DIR *d = opendir(src);
    if (!d) {
        fprintf(stderr, "  (no %s; skipped)\n", src);
        return;
    }
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", src, e->d_name);
        DIR *s = opendir(sub);
        if (!s)
            continue;
        struct dirent *f;
        while ((f = readdir(s))) {
            size_t n = strlen(f->d_name);
            if ((n > 2 && strcmp(f->d_name + n - 2, ".c") == 0) ||
                (n > 4 && strcmp(f->d_name + n - 4, ".cpp") == 0)) {
                files++;
                if (!capture_verify_is_runtime_file(f->d_name))
                    fprintf(stderr, "  src/%s/%s is missing from verify.c's runtime_files\n",
                            e->d_name, f->d_name);
                CHECK(capture_verify_is_runtime_file(f->d_name));
            }
        }
        closedir(s);
    }
    closedir(d);
    CHECK(files > 10);
    CHECK(!capture_verify_is_runtime_file("test_capture_verify.c"));
}

static mango_callbacks callbacks = {.is_read_only = is_ro, .process_request = process};

/* A child's own pool and report paths (256 bytes each), removed. */
static void child_files(const char *tag, char *cpool, char *creport)
{
    snprintf(cpool, 256, "/dev/shm/test_capture_verify.%d.%s.pool", (int)getpid(), tag);
    snprintf(creport, 256, "/dev/shm/test_capture_verify.%d.%s.report", (int)getpid(), tag);
    unlink(cpool);
    unlink(creport);
}

/* 7: in a child, before the parent starts the runtime. */
static void check_abort(void)
{
    char cpool[256], creport[256];
    child_files("child", cpool, creport);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        setenv("MANGO_VERIFY_ABORT", "1", 1);
        setenv("MANGO_VERIFY_REPORT", creport, 1);
        mango_config cfg;
        config(&cfg);
        cfg.pool_path = cpool;
        if (mango_init(&cfg, &callbacks) != MANGO_FRESH)
            _exit(3);
        cmd c = {c_bss_uncaptured, NULL};
        mango_client_cmd(&c);
        _exit(0); /* not reached if the verifier aborts */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    char buf[4096] = {0};
    int fd = open(creport, O_RDONLY);
    if (fd >= 0) {
        ssize_t r = read(fd, buf, sizeof buf - 1);
        (void)r;
        close(fd);
    }
    CHECK(has(buf, "g_bss+40"));
    CHECK(has(buf, "aborting"));
    unlink(cpool);
    unlink(creport);
    for (int i = 40; i < 48; i++) /* the child's write did not reach us */
        CHECK(g_bss[i] == 0);
}

static outcome run(void (*fn)(void *), void *arg);

/* fn as an explicit batch of this thread (mango_batch_begin/_end), the kind
 * that can pause. */
static outcome run_batch(void (*fn)(void *), void *arg)
{
    mango_stats a, b;
    report_new();
    mango_get_stats(&a);
    int rb = mango_batch_begin(); /* no CHECK inside: its counter is in .bss */
    fn(arg);
    int re = mango_batch_end();
    CHECK(rb == 0 && re == 0);
    mango_get_stats(&b);
    return (outcome){b.verify_batches - a.verify_batches, b.verify_missed_blocks - a.verify_missed_blocks,
                     report_new()};
}

/* 8, MANGO_VERIFY_PAUSED=ignore: in a child with its own runtime. */
static void check_paused_ignored(void)
{
    char cpool[256], creport[256];
    child_files("paused", cpool, creport);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MANGO_VERIFY_REPORT", creport, 1);
        snprintf(report_path, sizeof report_path, "%s", creport);
        mango_config cfg;
        config(&cfg);
        cfg.pool_path = cpool;
        /* MANGO_VERIFY_MAX_REPORT: a number or refused ("abc" listed every
         * block, "-1" 4294967295 of them) */
        static const char *bad_max[] = {"abc", "-1", " 5", "5x", "4294967296"};
        for (unsigned i = 0; i < sizeof bad_max / sizeof *bad_max; i++) {
            setenv("MANGO_VERIFY_MAX_REPORT", bad_max[i], 1);
            int rc = mango_init(&cfg, &callbacks);
            CHECK(rc == MANGO_EINVAL && strstr(mango_last_error(), "MANGO_VERIFY_MAX_REPORT"));
            if (rc >= 0)
                mango_shutdown();
            unlink(cpool);
        }
        unsetenv("MANGO_VERIFY_MAX_REPORT");
        setenv("MANGO_VERIFY_PAUSED", "sometimes", 1);
        int rc = mango_init(&cfg, &callbacks);
        CHECK(rc == MANGO_EINVAL && strstr(mango_last_error(), "MANGO_VERIFY_PAUSED=sometimes"));
        unlink(cpool);
        setenv("MANGO_VERIFY_PAUSED", "ignore", 1);
        if (mango_init(&cfg, &callbacks) != MANGO_FRESH)
            _exit(3);
        cmd c = {c_alloc, NULL}; /* g_buf, durable */
        CHECK(mango_client_cmd(&c) == 0);
        outcome o = run_batch(c_bss_paused, NULL);
        CHECK(o.batches == 1 && o.missed == 0);
        o = run_batch(c_heap_paused, NULL);
        CHECK(o.missed == 1 && has(o.text, "in durable heap"));
        o = run_batch(c_bss_active_then_paused, NULL);
        char needle[160];
        snprintf(needle, sizeof needle, "missed store at %#lx (bytes 0..3 of block %#lx",
                 (unsigned long)(uintptr_t)&g_bss[96], (unsigned long)(uintptr_t)&g_bss[96]);
        CHECK(o.missed == 1 && has(o.text, needle));
        o = run_batch(c_ends_paused, NULL);
        CHECK(o.batches == 1 && o.missed == 0);
        CHECK(mango_shutdown() == 0);
        o.text = report_new();
        /* 13 bytes by the commands (8 + 4 + 1), and whatever the runtime's own
         * threads wrote to its globals meanwhile */
        const char *tot = strstr(o.text, "mango-verify: total:");
        unsigned long long nb = 0, np = 0, nm = 0;
        CHECK(tot && sscanf(tot, "mango-verify: total: %llu batch(es) verified, %llu missed block(s), %llu byte(s) of "
                                 ".data/.bss written while paused", &nb, &nm, &np) == 3);
        CHECK(nm == 2 && np >= 13);
        unlink(cpool);
        _exit(check_failed ? 1 : 0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(cpool);
    unlink(creport);
}

int main(void)
{
    snprintf(pool_path, sizeof pool_path, "/dev/shm/test_capture_verify.%d.pool", (int)getpid());
    snprintf(report_path, sizeof report_path, "/dev/shm/test_capture_verify.%d.report", (int)getpid());
    unlink(pool_path);
    unlink(report_path);

    check_runtime_files();
    check_abort();
    check_paused_ignored();

    setenv("MANGO_VERIFY_REPORT", report_path, 1);
    unsetenv("MANGO_VERIFY_ABORT");
    mango_config cfg;
    config(&cfg);
    int rc = mango_init(&cfg, &callbacks);
    CHECK(rc == MANGO_FRESH);
    if (rc != MANGO_FRESH) {
        fprintf(stderr, "mango_init: %s\n", mango_last_error());
        return 1;
    }
    mango_stats st;
    mango_get_stats(&st);
    CHECK(st.verify_batches >= 1); /* the (empty) init_state batch */
    CHECK(st.verify_missed_blocks == 0);
    const char *t = report_new();
    CHECK(has(t, "mango-verify: on:"));

    /* 1 */
    outcome o = run(c_alloc, NULL);
    CHECK(o.batches == 1 && o.missed == 0);
    o = run(c_realloc_free, NULL);
    CHECK(o.batches == 1 && o.missed == 0);
    o = run(c_big, NULL);
    CHECK(o.batches == 1 && o.missed == 0);
    free(g_keep[2]); /* outside a command: deferred, freed by the next batch */
    g_keep[2] = NULL;  /* (a transient write to a durable global: not a command's) */
    o = run(c_nothing, NULL);
    CHECK(o.batches == 1 && o.missed == 0);
    CHECK(!strstr(o.text, "missed"));

    /* 2 */
    uintptr_t lo = (uintptr_t)(g_buf + 40), hi = lo + 100;
    uint64_t want = ((hi - 1) >> 5) - (lo >> 5) + 1;
    o = run(c_heap_uncaptured, NULL);
    CHECK(o.batches == 1);
    CHECK(o.missed == want);
    char needle[128];
    snprintf(needle, sizeof needle, "missed store at %#lx (bytes %u..", (unsigned long)lo, (unsigned)(lo & 31));
    CHECK(has(o.text, needle));
    snprintf(needle, sizeof needle, "in durable heap +%#lx", (unsigned long)(lo - 0x600000000000ull));
    CHECK(has(o.text, needle));
    snprintf(needle, sizeof needle, "%llu MISSED", (unsigned long long)want);
    CHECK(has(o.text, needle));

    /* 3 */
    o = run(c_bss_uncaptured, NULL);
    CHECK(o.missed == 1);
    snprintf(needle, sizeof needle, "missed store at %#lx (bytes 8..15 of block %#lx",
             (unsigned long)(uintptr_t)&g_bss[40], (unsigned long)(uintptr_t)&g_bss[32]);
    CHECK(has(o.text, needle));
    CHECK(has(o.text, ".data/.bss: g_bss+40 (test_capture_verify.c)"));
    o = run(c_app_pool_uncaptured, NULL);
    CHECK(o.missed == 1);
    CHECK(has(o.text, "app_pool_state+3 (pool.c)"));
    o = run(c_bss_captured, NULL);
    CHECK(o.missed == 0);

    /* 4 */
    g_transient = malloc(4096); /* glibc: not in a command */
    CHECK(g_transient && (uintptr_t)g_transient < 0x600000000000ull);
    g_outside = 42; /* a global written between batches */
    o = run(c_transient, NULL);
    CHECK(o.batches == 1 && o.missed == 0);
    free(g_transient);

    /* 5 */
    unsigned off = (unsigned)((uintptr_t)g_buf & 31);
    o = run(c_partial, NULL);
    CHECK(o.missed == 1);
    snprintf(needle, sizeof needle, "missed store at %#lx (bytes %u..%u of block %#lx, 4 byte(s) not captured)",
             (unsigned long)(uintptr_t)(g_buf + 4), off + 4, off + 7,
             (unsigned long)((uintptr_t)g_buf & ~(uintptr_t)31));
    CHECK(has(o.text, needle));

    /* 8, by default */
    o = run_batch(c_bss_paused, NULL);
    CHECK(o.missed == 1);
    snprintf(needle, sizeof needle, "missed store at %#lx (bytes 0..7 of block %#lx",
             (unsigned long)(uintptr_t)&g_bss[64], (unsigned long)(uintptr_t)&g_bss[64]);
    CHECK(has(o.text, needle));

    mango_get_stats(&st);
    uint64_t total_missed = st.verify_missed_blocks;
    CHECK(total_missed == want + 4);
    CHECK(mango_shutdown() == 0);
    t = report_new();
    snprintf(needle, sizeof needle, "%llu missed block(s)", (unsigned long long)total_missed);
    CHECK(has(t, "mango-verify: total:"));
    CHECK(has(t, needle));

    unlink(pool_path);
    unlink(report_path);
    return check_report("test_capture_verify");
}
