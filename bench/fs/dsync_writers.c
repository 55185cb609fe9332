/* dsync_writers.c -- how many O_DSYNC writes per second a file system takes
 * from 1, 2, 4 ... concurrent writers, with the CPUs idle or kept busy.
 *
 * The question behind it (docs/redis.md, "Next steps"): would a commit
 * pipeline with two syncs in flight complete more syncs per second than one
 * with a single sync thread? Each writer rewrites its own 8 KiB slots of one
 * file opened O_DSYNC (a write and a device flush per call, as the fs-mode log
 * does); spinner threads at normal priority stand in for a busy server.
 *
 * It also answers a second question (docs/redis.md, "The sync tail on a busy
 * VM"): how the tail of one sync's latency grows when the CPUs are
 * busy, and whether the writer's priority (--writer-nice) protects it. Every
 * write's latency goes into a histogram of 1 us buckets (up to 100 ms; slower
 * writes count in the last bucket), from which the p50/p99/p99.9 are read.
 *
 *   dsync_writers [--dir DIR] [--writers LIST] [--spinners LIST] [--seconds S]
 *                 [--writer-nice N] [--spinners-yield-after US]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLOT 8192
#define SLOTS_PER_WRITER 512
#define MAX_THREADS 16

static int fd;
static atomic_bool stop;
static uint64_t done[MAX_THREADS];
static int failed_errno;
static int writer_nice;        /* --writer-nice: applied by each writer to itself */
static int writer_nice_errno;  /* setpriority's failure, reported once */
/* --spinners-yield-after US: a spinner that sees a write in flight for longer
 * than this sleeps until no write has been in flight that long (0: never).
 * Does idling a vCPU while a sync is slow let the host finish it sooner? */
static uint64_t yield_after_ns;
static _Atomic uint64_t write_started_ns[MAX_THREADS]; /* 0: not in a write */
static atomic_int writers_running;
static _Atomic uint64_t spinner_sleeps;

/* Per-write latency: 1 us buckets; the last one holds everything slower. */
#define HIST_BUCKETS 100000
static uint32_t *hist[MAX_THREADS];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *writer_main(void *arg)
{
    long w = (long)arg;
    char *buf = aligned_alloc(4096, SLOT);
    if (!buf)
        return NULL;
    memset(buf, (int)w + 1, SLOT);
    if (writer_nice && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), writer_nice) != 0)
        writer_nice_errno = errno;
    uint64_t n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        off_t off = ((off_t)w * SLOTS_PER_WRITER + (off_t)(n % SLOTS_PER_WRITER)) * SLOT;
        uint64_t t0 = now_ns();
        atomic_store_explicit(&write_started_ns[w], t0, memory_order_relaxed);
        if (pwrite(fd, buf, SLOT, off) != SLOT) {
            failed_errno = errno ? errno : EIO;
            break;
        }
        atomic_store_explicit(&write_started_ns[w], 0, memory_order_relaxed);
        uint64_t us = (now_ns() - t0) / 1000;
        hist[w][us < HIST_BUCKETS ? us : HIST_BUCKETS - 1]++;
        n++;
    }
    done[w] = n;
    free(buf);
    return NULL;
}

/* A write in flight for longer than yield_after_ns? */
static bool slow_write_in_flight(void)
{
    uint64_t now = now_ns();
    int n = atomic_load_explicit(&writers_running, memory_order_relaxed);
    for (int w = 0; w < n; w++) {
        uint64_t t = atomic_load_explicit(&write_started_ns[w], memory_order_relaxed);
        if (t && now - t > yield_after_ns)
            return true;
    }
    return false;
}

static void *spinner_main(void *arg)
{
    (void)arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        x++;
        if (yield_after_ns && (x & 255) == 0 && slow_write_in_flight()) {
            atomic_fetch_add_explicit(&spinner_sleeps, 1, memory_order_relaxed);
            do {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            } while (slow_write_in_flight() && !atomic_load_explicit(&stop, memory_order_relaxed));
        }
    }
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsync_writers [--dir DIR] [--writers LIST] [--spinners LIST] [--seconds S]\n"
            "\n"
            "Concurrent O_DSYNC 8 KiB writes to one file in DIR (default /var/tmp), for\n"
            "every combination of writer count (LIST, default 1,2,4) and busy spinner\n"
            "threads (default 0,2), S seconds each (default 3). Prints one line per\n"
            "combination: writers=N spinners=M syncs_per_s=X mean_us=Y (Y: per write,\n"
            "per writer), then the latency of one write over all writers: p50_us,\n"
            "p99_us, p999_us (a write slower than 100 ms counts as 100 ms in them),\n"
            "and over_1ms (writes slower than 1 ms). The file\n"
            "(DIR/dsync_writers.<pid>) is unlinked once open: nothing is left behind,\n"
            "even when the run is interrupted.\n"
            "\n"
            "  --writer-nice N   each writer sets its own nice value to N (-20..19;\n"
            "                    below 0 needs root or CAP_SYS_NICE), the spinners\n"
            "                    stay at the process's: does priority protect a sync?\n"
            "  --spinners-yield-after US\n"
            "                    a spinner that sees a write in flight for more than\n"
            "                    US microseconds sleeps (200 us naps) until none is:\n"
            "                    does letting a vCPU idle while a sync is slow help\n"
            "                    the host complete it? (default 0: never)\n");
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v < 0 || v > MAX_THREADS || n == max) {
            free(copy);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(copy);
    return n;
}

/* The smallest bucket (us) at or below which a fraction q of the writes of
 * the first nwriters writers fall. */
static uint64_t percentile_us(int nwriters, uint64_t total, double q)
{
    uint64_t want = (uint64_t)((double)total * q), seen = 0;
    for (uint64_t us = 0; us < HIST_BUCKETS; us++) {
        for (int w = 0; w < nwriters; w++)
            seen += hist[w][us];
        if (seen > want)
            return us;
    }
    return HIST_BUCKETS - 1;
}

static uint64_t count_over_us(int nwriters, uint64_t limit)
{
    uint64_t n = 0;
    for (int w = 0; w < nwriters; w++)
        for (uint64_t us = limit + 1; us < HIST_BUCKETS; us++)
            n += hist[w][us];
    return n;
}

int main(int argc, char **argv)
{
    const char *dir = "/var/tmp";
    int writers[8] = {1, 2, 4}, nw = 3, spinners[8] = {0, 2}, ns = 2;
    double seconds = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dir") && v) {
            dir = v, i++;
        } else if (!strcmp(a, "--writers") && v) {
            if ((nw = parse_list(v, writers, 8)) <= 0) {
                fprintf(stderr, "dsync_writers: --writers %s: expected a list of 1..%d\n", v, MAX_THREADS);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--spinners") && v) {
            if ((ns = parse_list(v, spinners, 8)) <= 0) {
                fprintf(stderr, "dsync_writers: --spinners %s: expected a list of 0..%d\n", v, MAX_THREADS);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--writer-nice") && v) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < -20 || n > 19) {
                fprintf(stderr, "dsync_writers: --writer-nice %s: expected -20..19\n", v);
                return 2;
            }
            writer_nice = (int)n;
            i++;
        } else if (!strcmp(a, "--spinners-yield-after") && v) {
            char *end;
            long us = strtol(v, &end, 10);
            if (*end || us < 0 || us > 1000000) {
                fprintf(stderr, "dsync_writers: --spinners-yield-after %s: expected 0..1000000 (us)\n", v);
                return 2;
            }
            yield_after_ns = (uint64_t)us * 1000;
            i++;
        } else if (!strcmp(a, "--seconds") && v) {
            seconds = strtod(v, NULL);
            if (!(seconds > 0 && seconds <= 3600)) {
                fprintf(stderr, "dsync_writers: --seconds %s: expected 0 < S <= 3600\n", v);
                return 2;
            }
            i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    for (int i = 0; i < nw; i++)
        if (writers[i] < 1) {
            fprintf(stderr, "dsync_writers: a writer count must be at least 1\n");
            return 2;
        }
    char path[4096];
    snprintf(path, sizeof path, "%s/dsync_writers.%d", dir, (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DSYNC, 0600);
    if (fd < 0) {
        fprintf(stderr, "dsync_writers: %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* The open descriptor keeps the file: unlinked now, it is gone however
     * the run ends (an interrupt, a closed pipe such as `| head`). */
    unlink(path);
    /* Allocate and write every slot once: no write below allocates blocks. */
    size_t bytes = (size_t)MAX_THREADS * SLOTS_PER_WRITER * SLOT;
    char *zero = calloc(1, 1 << 20);
    int rc = 0;
    for (size_t off = 0; zero && off < bytes; off += 1 << 20)
        if (pwrite(fd, zero, 1 << 20, (off_t)off) != 1 << 20) {
            fprintf(stderr, "dsync_writers: preparing %s: %s\n", path, strerror(errno));
            rc = 1;
            break;
        }
    free(zero);
    for (int a = 0; rc == 0 && a < ns; a++)
        for (int b = 0; rc == 0 && b < nw; b++) {
            pthread_t t[2 * MAX_THREADS];
            atomic_store(&stop, false);
            for (int i = 0; i < writers[b]; i++) {
                free(hist[i]);
                if (!(hist[i] = calloc(HIST_BUCKETS, sizeof *hist[i]))) {
                    fprintf(stderr, "dsync_writers: out of memory\n");
                    return 1;
                }
            }
            atomic_store(&writers_running, writers[b]);
            atomic_store(&spinner_sleeps, 0);
            for (int i = 0; i < writers[b]; i++)
                atomic_store(&write_started_ns[i], 0);
            for (long i = 0; i < spinners[a]; i++)
                pthread_create(&t[MAX_THREADS + i], NULL, spinner_main, NULL);
            uint64_t t0 = now_ns();
            for (long i = 0; i < writers[b]; i++)
                pthread_create(&t[i], NULL, writer_main, (void *)i);
            struct timespec d = {.tv_sec = (time_t)seconds,
                                 .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
            nanosleep(&d, NULL);
            atomic_store(&stop, true);
            uint64_t total = 0;
            for (int i = 0; i < writers[b]; i++) {
                pthread_join(t[i], NULL);
                total += done[i];
            }
            /* Over the time the writes took, the last one finishing after
             * the stop included (it divided by S). */
            double elapsed = (double)(now_ns() - t0) / 1e9;
            for (int i = 0; i < spinners[a]; i++)
                pthread_join(t[MAX_THREADS + i], NULL);
            if (failed_errno) {
                fprintf(stderr, "dsync_writers: write: %s\n", strerror(failed_errno));
                rc = 1;
                break;
            }
            if (writer_nice_errno) {
                fprintf(stderr, "dsync_writers: --writer-nice %d: %s\n", writer_nice, strerror(writer_nice_errno));
                rc = 1;
                break;
            }
            double per_s = (double)total / elapsed;
            printf("writers=%d spinners=%d syncs_per_s=%.0f mean_us=%.0f p50_us=%llu p99_us=%llu p999_us=%llu "
                   "over_1ms=%llu\n",
                   writers[b], spinners[a], per_s, per_s > 0 ? 1e6 * writers[b] / per_s : 0.0,
                   (unsigned long long)percentile_us(writers[b], total, 0.5),
                   (unsigned long long)percentile_us(writers[b], total, 0.99),
                   (unsigned long long)percentile_us(writers[b], total, 0.999),
                   (unsigned long long)count_over_us(writers[b], 1000));
            if (yield_after_ns)
                printf("    spinner_sleeps=%llu (a spinner slept while a write was in flight > %llu us)\n",
                       (unsigned long long)atomic_load(&spinner_sleeps),
                       (unsigned long long)(yield_after_ns / 1000));
            fflush(stdout);
        }
    for (int i = 0; i < MAX_THREADS; i++)
        free(hist[i]);
    close(fd);
    return rc;
}
