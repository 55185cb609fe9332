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
 *
 * The observer is installed before mango_init opens the pool, so the model
 * follows the pool from its first store (images are cut only once mango_init
 * has returned), and after the final shutdown the model must equal the file
 * word for word; a difference is reported as MODEL DRIFT (exit 2).
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
#include "pool/pool_format.h"

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
    /* Images of the busy points per backend round (head.sync ends one): at
     * most round_cap, so the first round -- the initial state, thousands of
     * blocks -- cannot take most of the budget from the steady state. */
    unsigned round_images, round_cap, rounds, first_round_images;
    unsigned violations;
    char first_violation[160];
    /* where images go */
    char img_path[4096], ack_path[4096];
    ack_file *live_ack; /* the running workload's acknowledgements */
    bool recovery_crashes;
    /* recovery-crash mode (inside verify): cut one image at event number cut_at */
    uint64_t events, cut_at;
    bool cut_done;
    /* attaching the model at the observer's first event */
    const char *attach_path;
    bool attach_failed;
    bool armed; /* workload: mango_init returned, images may be cut */
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
 * images, the busy ones no more than their share. The busy ones' images (past
 * their first ten events) also count against the round's cap; the first ten
 * of every point always get theirs, however busy the round. */
static unsigned sample(unsigned li)
{
    uint64_t k = ++S.label_events[li];
    if (k <= 10)
        return 3; /* rare points (head writes, PAD frames): several images each */
    unsigned n = (k <= 100 && k % 10 == 0) || k % 100 == 0;
    if (n && S.round_images >= S.round_cap)
        return 0;
    S.round_images += n;
    return n;
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

static int sim_attach(const char *pool_path);

/* The observer is installed before mango_init opens (or creates) the pool,
 * and the model is attached at its first event: the pool's mapping exists
 * only once the pool is open, and until the runtime first reports a store to
 * it, every byte of the file is exactly what the runtime wrote and synced
 * (sim mode writes the file only in syncs, and every sync reports its
 * ranges). Attaching later, e.g. after mango_init returned, would race with
 * the backend's first round over the initial batch: stores made before the
 * observer exists are never seen, and reading the file while that round
 * syncs gives the model media the runtime never had or misses what it
 * wrote (the model then drifts from the file for the rest of the run). */
static void observer(persist_event ev, const void *addr, size_t len, const char *where)
{
    pthread_mutex_lock(&S.mu);
    if (!S.d) {
        if (S.attach_failed || sim_attach(S.attach_path) != 0) {
            S.attach_failed = true; /* the workload fails at arming; verify is not cut */
            pthread_mutex_unlock(&S.mu);
            return;
        }
    }
    if (ev == PERSIST_EV_STORE || ev == PERSIST_EV_FLUSH) {
        if ((const char *)addr < S.d->base || (const char *)addr >= S.d->base + S.d->len) {
            pthread_mutex_unlock(&S.mu);
            return;
        }
        uint64_t off = (uint64_t)((const char *)addr - S.d->base);
        if (ev == PERSIST_EV_STORE)
            note_store(off, len);
        else
            note_flush(off, len);
    } else if (ev == PERSIST_EV_SYNC_RANGE) {
        if ((const char *)addr >= S.d->base && (const char *)addr < S.d->base + S.d->len) {
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
    /* The workload: images only once mango_init has returned (the initial
     * state is acknowledged), and only until the target is reached. */
    if (!S.armed || S.images >= S.target) {
        pthread_mutex_unlock(&S.mu);
        return;
    }
    unsigned li = label_index(label);
    if (ev == PERSIST_EV_SYNC && !strcmp(where, "head.sync")) {
        S.rounds++; /* a backend round ends (or the clean head at shutdown) */
        S.round_images = 0;
    }
    for (unsigned n = sample(li); n > 0 && S.images < S.target; n--) {
        S.label_images[li]++;
        if (S.rounds == 0)
            S.first_round_images++;
        cut_image(label, "workload");
    }
    pthread_mutex_unlock(&S.mu);
}

/* Attach the model to the pool at pool_path (called with S.mu held, at the
 * observer's first event): find its mapping, read the file as the media. */
static int sim_attach(const char *pool_path)
{
    /* Find the pool's mapping through the persistence module's registry: any
     * address inside it will do, so look the path up in /proc/self/maps. */
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4608];
    uintptr_t lo = 0;
    char real[4096];
    if (!pool_path || !realpath(pool_path, real))
        snprintf(real, sizeof real, "%s", pool_path ? pool_path : "(none)");
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, real)) {
            lo = (uintptr_t)strtoull(line, NULL, 16);
            break;
        }
    }
    if (f)
        fclose(f);
    const persist_domain *d = lo ? persist_domain_of((void *)lo) : NULL;
    if (!d) {
        fprintf(stderr, "powerfail: cannot find the pool mapping of %s\n", real);
        return -1;
    }
    S.size = d->len;
    S.persisted = mmap(NULL, S.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    S.pend = mmap(NULL, sizeof *S.pend * PEND_CAP, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    S.pend_list = mmap(NULL, sizeof *S.pend_list * PEND_CAP, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (S.persisted == MAP_FAILED || S.pend == MAP_FAILED || S.pend_list == MAP_FAILED) {
        fprintf(stderr, "powerfail: cannot allocate the model of %s\n", real);
        return -1;
    }
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
    if (done != S.size) {
        fprintf(stderr, "powerfail: cannot read %s\n", real);
        return -1;
    }
    S.d = d;
    return 0;
}

/* Called by `verify --cut-recovery` before it opens the pool: the observer
 * is in place before recovery runs and attaches at its first event. */
void powerfail_cut_recovery(const char *pool_path, uint64_t seed)
{
    pthread_mutex_init(&S.mu, NULL);
    S.rng = seed;
    /* Recovery makes from a handful to thousands of ordering events (one per
     * replayed block): cut at a point drawn log-uniformly, so the head writes
     * at its end are hit as well as the block applies at its start. */
    S.cut_at = 1 + rnd() % (2ull << (rnd() % 13));
    snprintf(S.img_path, sizeof S.img_path, "%s", pool_path);
    S.attach_path = pool_path;
    persist_set_observer(observer);
}

/* Which part of the pool a file offset lies in (for the drift report). */
static const char *pool_area(uint64_t off)
{
    pool_header h;
    memcpy(&h, S.persisted, sizeof h);
    if (off < POOL_HEAD_OFFSET)
        return "pool header";
    if (off < POOL_REGIONS_OFFSET)
        return "head slots";
    if (off < POOL_REGIONS_OFFSET + 4096)
        return "region table";
    if (off >= h.log_offset && off - h.log_offset < h.log_size)
        return "redo log ring";
    for (uint32_t i = 0; i < h.region_count && i < POOL_MAX_REGIONS; i++) {
        pool_region r;
        memcpy(&r, S.persisted + POOL_REGIONS_OFFSET + i * sizeof r, sizeof r);
        if (off >= r.mirror_offset && off - r.mirror_offset < r.size)
            return r.kind == POOL_REGION_HEAP ? "durable heap mirror" : ".data/.bss mirror";
        if (r.kind == POOL_REGION_DATA && off >= r.bitmap_offset &&
            off - r.bitmap_offset < (r.size + 7) / 8)
            return ".data/.bss written-bytes bitmap";
    }
    return "unused space";
}

/* After a clean shutdown every word the runtime stored to the pool has been
 * synced, and in sim mode the file is exactly what the syncs wrote, so the
 * model's media must equal the file word for word. A difference means the
 * model missed stores or syncs: every image cut from it may be wrong in
 * either direction (false violations, or real losses hidden). Returns the
 * number of differing words and reports the first. */
static uint64_t check_model(const char *pool_path)
{
    int fd = open(pool_path, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "powerfail: MODEL DRIFT check: cannot open %s: %s\n", pool_path,
                strerror(errno));
        return 1;
    }
    static char buf[1 << 16];
    uint64_t differ = 0, first = 0, file_word = 0, model_word = 0;
    for (uint64_t at = 0; at < S.size;) {
        ssize_t n = pread(fd, buf, sizeof buf, (off_t)at);
        if (n <= 0 || n % 8) {
            fprintf(stderr, "powerfail: MODEL DRIFT check: cannot read %s\n", pool_path);
            close(fd);
            return differ + 1;
        }
        for (uint64_t k = 0; k < (uint64_t)n; k += 8) {
            if (memcmp(buf + k, S.persisted + at + k, 8) == 0)
                continue;
            const word_state *w = pend_slot(at + k);
            if (w->off == at + k && memcmp(buf + k, &w->val, 8) == 0)
                continue; /* pending: the file may hold either value */
            if (differ++ == 0) {
                first = at + k;
                memcpy(&file_word, buf + k, 8);
                memcpy(&model_word, S.persisted + at + k, 8);
            }
        }
        at += (uint64_t)n;
    }
    close(fd);
    if (differ)
        fprintf(stderr,
                "powerfail: MODEL DRIFT: after shutdown the simulator's media differs from the pool "
                "file in %" PRIu64 " words; first at offset %#" PRIx64 " (%s): file 0x%016" PRIx64
                ", model 0x%016" PRIx64 ". The simulator missed stores or syncs, so its images do "
                "not show what the runtime wrote.\n",
                differ, first, pool_area(first), file_word, model_word);
    return differ;
}

/* ---- the workload ---- */

typedef struct pf_thread {
    pthread_t th;
    uint32_t id;
} pf_thread;

static _Atomic int pf_stop;
static _Atomic unsigned pf_running; /* client threads still issuing commands */

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
            if (kv_acked_put(w->id, &s, a, val) != 0) {
                fprintf(stderr, "powerfail: client %u: put failed: %s\n", w->id, mango_last_error());
                break;
            }
        } else {
            kv_fixed_cmd c = {.op = KV_GET, .index = (uint32_t)((rng >> 8) % O.values), .client = w->id,
                              .out = out};
            if (mango_client_cmd(&c) != 0) {
                fprintf(stderr, "powerfail: client %u: get failed: %s\n", w->id, mango_last_error());
                break;
            }
        }
    }
    free(val);
    free(out);
    atomic_fetch_sub(&pf_running, 1);
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
    S.round_cap = O.images / 10 > 10 ? O.images / 10 : 10;
    S.recovery_crashes = O.recovery_crashes;
    snprintf(S.img_path, sizeof S.img_path, "%s.img", O.pool);
    snprintf(S.ack_path, sizeof S.ack_path, "%s.img.ack", O.pool);
    char live_ack_path[4096];
    snprintf(live_ack_path, sizeof live_ack_path, "%s.ack", O.pool);
    unlink(live_ack_path);
    S.live_ack = open_ack_at(live_ack_path);
    /* Follow the pool from its first store on (see observer()). */
    S.attach_path = O.pool;
    persist_set_observer(observer);
    start_fixed();
    pthread_mutex_lock(&S.mu);
    bool attached = S.d != NULL;
    S.armed = attached;
    pthread_mutex_unlock(&S.mu);
    if (!attached) {
        fprintf(stderr, "powerfail: the simulator never attached to %s\n", O.pool);
        return 2;
    }
    pf_thread *w = calloc(O.threads, sizeof *w);
    atomic_store(&pf_running, O.threads);
    for (unsigned i = 0; i < O.threads; i++) {
        w[i].id = i;
        pthread_create(&w[i].th, NULL, pf_main, &w[i]);
    }
    unsigned last = 0;
    bool clients_failed = false;
    for (;;) {
        pthread_mutex_lock(&S.mu);
        unsigned images = S.images, violations = S.violations;
        pthread_mutex_unlock(&S.mu);
        if (images >= S.target)
            break;
        if (atomic_load(&pf_running) == 0) { /* every client stopped on an error: no more images */
            fprintf(stderr, "powerfail: every client stopped on an error after %u of %u images\n",
                    images, S.target);
            clients_failed = true;
            break;
        }
        usleep(20000);
        if (!O.quiet && images / 50 != last / 50)
            fprintf(stderr, "powerfail: %u/%u images, %u violations\n", images, S.target, violations);
        last = images;
    }
    atomic_store(&pf_stop, 1);
    for (unsigned i = 0; i < O.threads; i++)
        pthread_join(w[i].th, NULL);
    if (clients_failed) {
        persist_set_observer(NULL);
        unlink(live_ack_path);
        unlink(S.ack_path);
        unlink(S.img_path);
        unlink(O.pool);
        return 2;
    }
    /* Shut down with the observer still on: the backend's last round and the
     * clean head are followed too, so the model ends where the file ends. */
    int down = mango_shutdown();
    persist_set_observer(NULL);
    printf("powerfail: crash points and images:\n");
    for (unsigned i = 0; i < S.n_labels; i++)
        printf("  %-34s events=%-8" PRIu64 " images=%" PRIu64 "\n", S.labels[i], S.label_events[i],
               S.label_images[i]);
    if (S.violations)
        printf("powerfail: first violation: %s\n", S.first_violation);
    uint64_t drift = down == 0 ? check_model(O.pool) : 0;
    printf("backend rounds seen: %u; images before the first round ended: %u (busy points' images "
           "capped at %u per round)\n", S.rounds, S.first_round_images, S.round_cap);
    printf("images=%u violations=%u\n", S.images, S.violations);
    unlink(live_ack_path);
    unlink(S.ack_path);
    unlink(O.pool);
    if (down != 0) {
        fprintf(stderr, "powerfail: shutdown: %s\n", mango_last_error());
        return 2;
    }
    if (drift)
        return 2; /* the images were not cut from what the runtime wrote */
    return S.violations ? 1 : 0;
}
