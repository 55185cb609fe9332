/* kv_powerfail.c -- `kvstore powerfail`: simulated power failures.
 *
 * An observer on the persistence module (src/persist) follows every store the
 * runtime makes to the pool, every flush and every fence/sync, at 8-byte word
 * granularity, under the x86 persistency model:
 *   - a word written and not yet covered by a completed fence/sync is PENDING
 *     (flushed or not: either may or may not have reached the media);
 *   - a fence/sync makes every FLUSHED pending word PERSISTED.
 * At ordering points of the workload (the log frame written, flushed,
 * committed; mirror blocks applied, the mirror synced; the head written,
 * synced) it cuts a crash image: every persisted word, plus each pending word
 * with probability 1/2. It records what had been acknowledged at that instant,
 * and a fresh `kvstore verify` process recovers the image and checks that the
 * state is a prefix of the history containing every acknowledged PUT.
 *
 * With --recovery-crashes, one image in four is not verified directly: its
 * recovery is itself cut at a random ordering point (a crash during recovery),
 * and that second image is recovered and verified.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_workload.h"
#include "kvstore_driver.h"
#include "persist/persist.h"

extern char **environ;

/* ---- the persistency model ---- */

typedef struct word_state {
    uint64_t off;  /* pool offset, 8-aligned; UINT64_MAX = empty slot */
    uint64_t val;
    int flushed;
} word_state;

#define PEND_CAP (1u << 21)

typedef struct sim {
    pthread_mutex_t mu;
    const persist_domain *d;
    char *persisted; /* the media: what a power failure certainly leaves */
    size_t size;
    word_state *pend; /* open addressing on off */
    uint32_t *pend_list;
    uint32_t n_pend;
    uint64_t rng;
    /* sampling */
    char labels[32][48];
    uint64_t label_events[32], label_images[32];
    unsigned n_labels;
    unsigned images, target;
    unsigned violations;
    char first_violation[160];
    /* where images go */
    char img_path[4096], ack_path[4096];
    ack_file *live_ack; /* the running workload's acknowledgements */
    bool recovery_crashes;
    /* recovery-crash mode (inside verify): cut one image at event number cut_at */
    uint64_t events, cut_at;
    bool cut_done;
} sim;

static sim S;

static uint64_t rnd(void)
{
    S.rng = kvw_mix(S.rng + 0x9e3779b97f4a7c15ull);
    return S.rng;
}

static word_state *pend_slot(uint64_t off)
{
    uint32_t i = (uint32_t)(kvw_mix(off) & (PEND_CAP - 1));
    while (S.pend[i].off != UINT64_MAX && S.pend[i].off != off)
        i = (i + 1) & (PEND_CAP - 1);
    return &S.pend[i];
}

static void note_store(uint64_t off, size_t len)
{
    uint64_t a = off & ~7ull, end = (off + len + 7) & ~7ull;
    for (; a < end; a += 8) {
        word_state *w = pend_slot(a);
        if (w->off == UINT64_MAX) {
            if (S.n_pend >= PEND_CAP / 2) {
                fprintf(stderr, "powerfail: too many pending words\n");
                abort();
            }
            w->off = a;
            S.pend_list[S.n_pend++] = (uint32_t)(w - S.pend);
        }
        memcpy(&w->val, S.d->base + a, 8);
        w->flushed = 0;
    }
}

static void note_flush(uint64_t off, size_t len)
{
    uint64_t a = off & ~63ull, end = (off + len + 63) & ~63ull;
    for (; a < end; a += 8) {
        word_state *w = pend_slot(a);
        if (w->off == a)
            w->flushed = 1;
    }
}

/* A completed fence or sync: flushed pending words inside [lo, hi) become
 * persisted (pmem: the whole pool -- an sfence covers every earlier clwb;
 * fs/sim: only the ranges the msync/pwrite covered). */
static void rebuild_pending(uint64_t lo, uint64_t hi)
{
    /* Drop persisted words from the table and rebuild it (open addressing). */
    uint32_t keep = 0;
    word_state *tmp = malloc(sizeof *tmp * (S.n_pend ? S.n_pend : 1));
    for (uint32_t k = 0; k < S.n_pend; k++) {
        word_state *w = &S.pend[S.pend_list[k]];
        if (w->flushed && w->off >= lo && w->off < hi)
            memcpy(S.persisted + w->off, &w->val, 8);
        else
            tmp[keep++] = *w;
        w->off = UINT64_MAX;
    }
    S.n_pend = 0;
    for (uint32_t k = 0; k < keep; k++) {
        word_state *w = pend_slot(tmp[k].off);
        *w = tmp[k];
        S.pend_list[S.n_pend++] = (uint32_t)(w - S.pend);
    }
    free(tmp);
}

static int write_image(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    char *img = mmap(NULL, S.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(img, S.persisted, S.size);
    for (uint32_t k = 0; k < S.n_pend; k++) {
        const word_state *w = &S.pend[S.pend_list[k]];
        if (rnd() & 1)
            memcpy(img + w->off, &w->val, 8);
    }
    size_t done = 0;
    while (done < S.size) {
        ssize_t n = write(fd, img + done, S.size - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    munmap(img, S.size);
    close(fd);
    return done == S.size ? 0 : -1;
}

static unsigned label_index(const char *what)
{
    for (unsigned i = 0; i < S.n_labels; i++)
        if (!strcmp(S.labels[i], what))
            return i;
    if (S.n_labels == 32)
        return 31;
    snprintf(S.labels[S.n_labels], sizeof S.labels[0], "%s", what);
    return S.n_labels++;
}

/* How many images to cut at the k-th event of a label: three for k = 1..10,
 * then one every 10th up to 100, then every 100th: every ordering point gets
 * images, the busy ones no more than their share. */
static unsigned sample(unsigned li)
{
    uint64_t k = ++S.label_events[li];
    if (k <= 10)
        return 3; /* rare points (head writes, PAD frames): several images each */
    return (k <= 100 && k % 10 == 0) || k % 100 == 0;
}

static int spawn_wait(char *const argv[])
{
    pid_t pid;
    if (posix_spawn(&pid, O.self, NULL, NULL, argv, environ) != 0)
        return -1;
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void verify_image(const char *label, const char *stage)
{
    char threads[16], values[16], vsize[16], seed[32];
    snprintf(threads, sizeof threads, "%u", O.threads);
    snprintf(values, sizeof values, "%u", O.values);
    snprintf(vsize, sizeof vsize, "%u", O.value_size);
    snprintf(seed, sizeof seed, "%" PRIu64, rnd());
    bool nested = S.recovery_crashes && rnd() % 4 == 0;
    char *argv[32];
    int n = 0;
    argv[n++] = O.self;
    argv[n++] = "verify";
    argv[n++] = "--pool";
    argv[n++] = S.img_path;
    argv[n++] = "--ack";
    argv[n++] = S.ack_path;
    argv[n++] = "--mode";
    argv[n++] = "sim";
    argv[n++] = "--threads";
    argv[n++] = threads;
    argv[n++] = "--values";
    argv[n++] = values;
    argv[n++] = "--value-size";
    argv[n++] = vsize;
    argv[n++] = "--quiet";
    argv[n++] = "--seed";
    argv[n++] = seed;
    if (nested)
        argv[n++] = "--cut-recovery"; /* verify cuts an image inside its recovery */
    argv[n] = NULL;
    int rc = spawn_wait(argv);
    if (nested && rc == 3) {
        /* The recovery was cut: its image replaced the pool file. Recover it. */
        argv[n - 1] = NULL;
        rc = spawn_wait(argv);
        stage = "inside recovery";
    }
    if (rc != 0) {
        S.violations++;
        if (!S.first_violation[0])
            snprintf(S.first_violation, sizeof S.first_violation, "crash point '%s' (%s): verify exit %d",
                     label, stage, rc);
        fprintf(stderr, "powerfail: VIOLATION at crash point '%s' (%s): verify exit %d\n", label,
                stage, rc);
    }
}

static void cut_image(const char *label, const char *stage)
{
    /* The acknowledgements at this instant: acked and in-flight per client. */
    ack_file *a = open_ack_at(S.ack_path);
    for (unsigned t = 0; t < O.threads; t++) {
        atomic_store(&a->slot[t].acked, atomic_load(&S.live_ack->slot[t].acked));
        atomic_store(&a->slot[t].inflight, atomic_load(&S.live_ack->slot[t].inflight));
    }
    munmap(a, sizeof *a);
    if (write_image(S.img_path) != 0) {
        fprintf(stderr, "powerfail: cannot write %s: %s\n", S.img_path, strerror(errno));
        exit(2);
    }
    S.images++;
    verify_image(label, stage);
    unlink(S.img_path);
}

static void observer(persist_event ev, const void *addr, size_t len, const char *where)
{
    pthread_mutex_lock(&S.mu);
    if (ev == PERSIST_EV_STORE || ev == PERSIST_EV_FLUSH) {
        if (!S.d || (const char *)addr < S.d->base || (const char *)addr >= S.d->base + S.d->len) {
            pthread_mutex_unlock(&S.mu);
            return;
        }
        uint64_t off = (uint64_t)((const char *)addr - S.d->base);
        if (ev == PERSIST_EV_STORE)
            note_store(off, len);
        else
            note_flush(off, len);
    } else if (ev == PERSIST_EV_SYNC_RANGE) {
        if (S.d && (const char *)addr >= S.d->base && (const char *)addr < S.d->base + S.d->len) {
            uint64_t off = (uint64_t)((const char *)addr - S.d->base);
            rebuild_pending(off, off + len);
        }
        pthread_mutex_unlock(&S.mu);
        return; /* the crash point is the sync's end, reported next */
    } else if (S.d->mode != PERSIST_FS && S.d->mode != PERSIST_SIM) {
        rebuild_pending(0, UINT64_MAX);
    }
    char label[48];
    snprintf(label, sizeof label, "%s %s",
             ev == PERSIST_EV_STORE ? "after store" : ev == PERSIST_EV_FLUSH ? "after flush"
                                                                            : "after sync",
             where);
    if (S.cut_at) { /* inside verify: cut once, at the chosen event */
        if (!S.cut_done && ++S.events == S.cut_at) {
            S.cut_done = true;
            if (write_image(S.img_path) == 0) {
                if (!O.quiet)
                    fprintf(stderr, "powerfail: recovery cut at '%s'\n", label);
                _exit(3);
            }
        }
        pthread_mutex_unlock(&S.mu);
        return;
    }
    unsigned li = label_index(label);
    for (unsigned n = S.images < S.target ? sample(li) : 0; n > 0 && S.images < S.target; n--) {
        S.label_images[li]++;
        cut_image(label, "workload");
    }
    pthread_mutex_unlock(&S.mu);
}

static int sim_attach(const char *pool_path)
{
    /* Find the pool's mapping through the persistence module's registry: any
     * address inside it will do, so look the path up in /proc/self/maps. */
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4608];
    uintptr_t lo = 0;
    char real[4096];
    if (!realpath(pool_path, real))
        snprintf(real, sizeof real, "%s", pool_path);
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, real)) {
            lo = (uintptr_t)strtoull(line, NULL, 16);
            break;
        }
    }
    if (f)
        fclose(f);
    S.d = lo ? persist_domain_of((void *)lo) : NULL;
    if (!S.d) {
        fprintf(stderr, "powerfail: cannot find the pool mapping of %s\n", pool_path);
        return -1;
    }
    S.size = S.d->len;
    S.persisted = mmap(NULL, S.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    S.pend = mmap(NULL, sizeof *S.pend * PEND_CAP, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    S.pend_list = mmap(NULL, sizeof *S.pend_list * PEND_CAP, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (uint32_t i = 0; i < PEND_CAP; i++)
        S.pend[i].off = UINT64_MAX;
    /* In sim mode the file holds exactly what was synced: the media. */
    int fd = open(pool_path, O_RDONLY);
    size_t done = 0;
    while (fd >= 0 && done < S.size) {
        ssize_t n = pread(fd, S.persisted + done, S.size - done, (off_t)done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    if (fd >= 0)
        close(fd);
    return done == S.size ? 0 : -1;
}

/* Called by `verify --cut-recovery` before it opens the pool. The observer
 * must be in place before recovery runs, but the mapping exists only once the
 * pool is open: the first event attaches. */
static const char *cut_pool_path;
static void cut_observer(persist_event ev, const void *addr, size_t len, const char *where)
{
    if (!S.d) {
        pthread_mutex_lock(&S.mu);
        if (!S.d && sim_attach(cut_pool_path) != 0) {
            pthread_mutex_unlock(&S.mu);
            return;
        }
        pthread_mutex_unlock(&S.mu);
    }
    observer(ev, addr, len, where);
}

void powerfail_cut_recovery(const char *pool_path, uint64_t seed)
{
    pthread_mutex_init(&S.mu, NULL);
    S.rng = seed;
    /* Recovery makes from a handful to thousands of ordering events (one per
     * replayed block): cut at a point drawn log-uniformly, so the head writes
     * at its end are hit as well as the block applies at its start. */
    S.cut_at = 1 + rnd() % (2ull << (rnd() % 13));
    snprintf(S.img_path, sizeof S.img_path, "%s", pool_path);
    cut_pool_path = pool_path;
    persist_set_observer(cut_observer);
}

/* ---- the workload ---- */

typedef struct pf_thread {
    pthread_t th;
    uint32_t id;
} pf_thread;

static _Atomic int pf_stop;

static void *pf_main(void *arg)
{
    pf_thread *w = arg;
    ack_slot *a = &S.live_ack->slot[w->id];
    uint64_t rng = kvw_mix(O.seed * 131 + w->id);
    char *val = malloc(O.value_size), *out = malloc(O.value_size);
    uint64_t s = kv_fixed_client_seq(w->id);
    while (!atomic_load(&pf_stop)) {
        rng = kvw_mix(rng + 1);
        if ((rng % 100) < O.update_pct) {
            if (kv_acked_put(w->id, &s, a, val) != 0)
                break;
        } else {
            kv_fixed_cmd c = {.op = KV_GET, .index = (uint32_t)((rng >> 8) % O.values), .client = w->id,
                              .out = out};
            if (mango_client_cmd(&c) != 0)
                break;
        }
    }
    free(val);
    free(out);
    return NULL;
}

int run_powerfail(void)
{
    if (!O.pool)
        die_usage_msg("powerfail needs --pool (a fresh file is created)");
    if (O.mode != MANGO_PERSIST_SIM && O.mode != MANGO_PERSIST_AUTO) {
        fprintf(stderr, "kvstore: powerfail runs in sim mode only\n");
        return 2;
    }
    O.mode = MANGO_PERSIST_SIM;
    unlink(O.pool);
    pthread_mutex_init(&S.mu, NULL);
    S.rng = O.seed;
    S.target = O.images;
    S.recovery_crashes = O.recovery_crashes;
    snprintf(S.img_path, sizeof S.img_path, "%s.img", O.pool);
    snprintf(S.ack_path, sizeof S.ack_path, "%s.img.ack", O.pool);
    char live_ack_path[4096];
    snprintf(live_ack_path, sizeof live_ack_path, "%s.ack", O.pool);
    unlink(live_ack_path);
    S.live_ack = open_ack_at(live_ack_path);
    start_fixed();
    if (sim_attach(O.pool) != 0)
        return 2;
    persist_set_observer(observer);
    pf_thread *w = calloc(O.threads, sizeof *w);
    for (unsigned i = 0; i < O.threads; i++) {
        w[i].id = i;
        pthread_create(&w[i].th, NULL, pf_main, &w[i]);
    }
    unsigned last = 0;
    while (S.images < S.target) {
        usleep(20000);
        if (!O.quiet && S.images / 50 != last / 50) {
            fprintf(stderr, "powerfail: %u/%u images, %u violations\n", S.images, S.target,
                    S.violations);
        }
        last = S.images;
    }
    atomic_store(&pf_stop, 1);
    for (unsigned i = 0; i < O.threads; i++)
        pthread_join(w[i].th, NULL);
    persist_set_observer(NULL);
    printf("powerfail: crash points and images:\n");
    for (unsigned i = 0; i < S.n_labels; i++)
        printf("  %-34s events=%-8" PRIu64 " images=%" PRIu64 "\n", S.labels[i], S.label_events[i],
               S.label_images[i]);
    if (S.violations)
        printf("powerfail: first violation: %s\n", S.first_violation);
    printf("images=%u violations=%u\n", S.images, S.violations);
    mango_shutdown();
    unlink(live_ack_path);
    unlink(S.ack_path);
    unlink(O.pool);
    return S.violations ? 1 : 0;
}
