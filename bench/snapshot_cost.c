/* snapshot_cost.c -- what an online snapshot (mango_snapshot) costs the
 * writers, against the offline alternative (stop, `mango copy`, start).
 *
 *   snapshot_cost run MODE POOL SNAP HEAP_MB SECONDS
 *
 * Fills the durable heap with HEAP_MB of 64 KiB chunks, then runs one
 * writer thread (closed loop: an 8-byte update of a random chunk, each
 * acknowledged) for SECONDS; a third of the way in the main thread takes a
 * snapshot to SNAP. Prints one line of key=value: the snapshot's pause
 * (write side held) and duration, the writer's throughput before, during
 * and after it, its slowest update during it and before it, and the time a
 * fresh process takes to open the snapshot (`snapshot_cost open MODE SNAP`:
 * RECOVERED, every chunk's first word checked).
 * bench/snapshot_bench.py runs it over sizes and modes.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mango.h"

#define CHUNK (64u << 10)
#define MAX_CHUNKS (1u << 16) /* 4 GiB */

static uint64_t *chunks[MAX_CHUNKS];
static uint64_t nchunks;

typedef struct req {
    int kind; /* 0: fill one chunk, 1: update */
    uint64_t r;
} req;

static void init_state(void *arg)
{
    (void)arg;
    nchunks = 0;
    mango_capture(&nchunks, sizeof nchunks);
}
static bool is_ro(void *c) { (void)c; return false; }
static void process(void *c)
{
    req *q = c;
    if (q->kind == 0) {
        uint64_t *p = malloc(CHUNK);
        if (!p)
            abort();
        for (size_t i = 0; i < CHUNK / 8; i++)
            p[i] = nchunks * 1000003u + i;
        mango_capture(p, CHUNK);
        chunks[nchunks] = p;
        mango_capture(&chunks[nchunks], sizeof chunks[0]);
        nchunks++;
        mango_capture(&nchunks, sizeof nchunks);
        return;
    }
    uint64_t *p = chunks[q->r % nchunks];
    size_t i = 1 + (q->r >> 20) % (CHUNK / 8 - 1); /* word 0 stays the chunk's check value */
    p[i]++;
    mango_capture(&p[i], sizeof p[i]);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* fs or emulated; anything else is a usage error (it ran as emulated). */
static mango_persist_mode mode_named(const char *m)
{
    if (strcmp(m, "fs") == 0)
        return MANGO_PERSIST_FS;
    if (strcmp(m, "emulated") == 0)
        return MANGO_PERSIST_EMULATED;
    fprintf(stderr, "snapshot_cost: MODE is fs or emulated, not '%s'\n", m);
    exit(2);
}

static int start(const char *pool, const char *mode, uint64_t heap_mb)
{
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = pool;
    cfg.mode = mode_named(mode);
    cfg.pool_size = (heap_mb + heap_mb / 4 + 128) << 20;
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process, .init_state = init_state};
    return mango_init(&cfg, &cb);
}

/* The writer: closed-loop updates; ops and the slowest one per phase
 * (0 before the snapshot, 1 during, 2 after). */
static _Atomic int phase;
static _Atomic bool stop;
static uint64_t ops[3];
static double slowest[3];

static void *writer(void *arg)
{
    (void)arg;
    uint64_t x = 88172645463325252ull;
    while (!atomic_load(&stop)) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        req q = {.kind = 1, .r = x};
        int ph = atomic_load(&phase);
        double t0 = now();
        if (mango_client_cmd(&q) != 0) {
            fprintf(stderr, "snapshot_cost: update: %s\n", mango_last_error());
            exit(1);
        }
        double dt = now() - t0;
        int ph2 = atomic_load(&phase);
        ph = ph2 > ph ? 1 : ph; /* an update that overlapped the snapshot counts in it */
        ops[ph]++;
        if (dt > slowest[ph])
            slowest[ph] = dt;
    }
    return NULL;
}

static int open_snapshot(const char *mode, const char *snap, uint64_t heap_mb)
{
    double t0 = now();
    int rc = start(snap, mode, heap_mb);
    double dt = now() - t0;
    if (rc != MANGO_RECOVERED) {
        fprintf(stderr, "snapshot_cost: opening %s: %d %s\n", snap, rc, mango_last_error());
        return 1;
    }
    /* The run filled heap_mb * 16 chunks before the snapshot: all must be
     * there (only those the snapshot listed were checked). */
    if (nchunks != heap_mb * 16) {
        fprintf(stderr, "snapshot_cost: the snapshot holds %llu chunks, the run made %llu\n",
                (unsigned long long)nchunks, (unsigned long long)(heap_mb * 16));
        return 1;
    }
    for (uint64_t i = 0; i < nchunks; i++)
        if (chunks[i][0] != i * 1000003u) {
            fprintf(stderr, "snapshot_cost: chunk %llu is wrong in the snapshot\n", (unsigned long long)i);
            return 1;
        }
    printf("%.4f %llu\n", dt, (unsigned long long)nchunks);
    return mango_shutdown() == MANGO_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "open") == 0)
        return open_snapshot(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    if (argc != 7 || strcmp(argv[1], "run") != 0) {
        fprintf(stderr, "usage: snapshot_cost run MODE POOL SNAP HEAP_MB SECONDS\n"
                        "       snapshot_cost open MODE SNAP HEAP_MB\n");
        return 2;
    }
    const char *mode = argv[2], *pool = argv[3], *snap = argv[4];
    (void)mode_named(mode); /* before anything is removed or made */
    uint64_t heap_mb = strtoull(argv[5], NULL, 10);
    double seconds = atof(argv[6]);
    if (heap_mb == 0 || heap_mb * 16 > MAX_CHUNKS || seconds <= 0) {
        fprintf(stderr, "snapshot_cost: HEAP_MB 1..4096, SECONDS > 0\n");
        return 2;
    }
    unlink(pool);
    unlink(snap);
    if (start(pool, mode, heap_mb) != MANGO_FRESH) {
        fprintf(stderr, "snapshot_cost: %s\n", mango_last_error());
        return 1;
    }
    double tf = now();
    for (uint64_t i = 0; i < heap_mb * 16; i++) {
        req q = {.kind = 0};
        if (mango_client_cmd(&q) != 0) {
            fprintf(stderr, "snapshot_cost: fill: %s\n", mango_last_error());
            return 1;
        }
    }
    double fill_s = now() - tf;
    pthread_t th;
    pthread_create(&th, NULL, writer, NULL);
    double t0 = now();
    usleep((useconds_t)(seconds / 3 * 1e6));
    double ts = now();
    atomic_store(&phase, 1);
    mango_snapshot_info info;
    int rc = mango_snapshot(snap, &info);
    atomic_store(&phase, 2);
    double te = now();
    if (rc != MANGO_OK) {
        fprintf(stderr, "snapshot_cost: snapshot: %s\n", mango_last_error());
        return 1;
    }
    double left = seconds - (te - t0);
    if (left < seconds / 3)
        left = seconds / 3;
    usleep((useconds_t)(left * 1e6));
    atomic_store(&stop, true);
    pthread_join(th, NULL);
    double tend = now();
    if (mango_shutdown() != MANGO_OK)
        return 1;
    /* A fresh process opens the snapshot. */
    char cmd[4096 + 256];
    snprintf(cmd, sizeof cmd, "/proc/%d/exe", (int)getpid());
    char self[4096];
    ssize_t n = readlink(cmd, self, sizeof self - 1);
    if (n <= 0)
        return 1;
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "'%s' open %s '%s' %llu", self, mode, snap, (unsigned long long)heap_mb);
    FILE *f = popen(cmd, "r");
    double open_s = -1;
    unsigned long long opened_chunks = 0;
    if (!f || fscanf(f, "%lf %llu", &open_s, &opened_chunks) != 2 || pclose(f) != 0) {
        fprintf(stderr, "snapshot_cost: opening the snapshot failed\n");
        return 1;
    }
    printf("mode=%s heap_mb=%llu fill_s=%.3f heap_bytes=%llu pause_ms=%.3f snapshot_s=%.3f "
           "before_ops_s=%.0f during_ops_s=%.0f after_ops_s=%.0f slowest_before_ms=%.3f slowest_during_ms=%.3f "
           "open_s=%.4f chunks=%llu\n",
           mode, (unsigned long long)heap_mb, fill_s, (unsigned long long)info.heap_bytes, info.pause_seconds * 1e3,
           info.seconds, ops[0] / (ts - t0), ops[1] / (te - ts), ops[2] / (tend - te), slowest[0] * 1e3,
           slowest[1] * 1e3, open_s, opened_chunks);
    return 0;
}
