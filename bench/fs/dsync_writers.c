/* dsync_writers.c -- how many O_DSYNC writes per second a file system takes
 * from 1, 2, 4 ... concurrent writers, with the CPUs idle or kept busy.
 *
 * The question behind it (docs/redis.md, "Next steps"): would a commit
 * pipeline with two syncs in flight complete more syncs per second than one
 * with a single sync thread? Each writer rewrites its own 8 KiB slots of one
 * file opened O_DSYNC (a write and a device flush per call, as the fs-mode log
 * does); spinner threads at normal priority stand in for a busy server.
 *
 *   dsync_writers [--dir DIR] [--writers LIST] [--spinners LIST] [--seconds S]
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
#include <time.h>
#include <unistd.h>

#define SLOT 8192
#define SLOTS_PER_WRITER 512
#define MAX_THREADS 16

static int fd;
static atomic_bool stop;
static uint64_t done[MAX_THREADS];
static int failed_errno;

static void *writer_main(void *arg)
{
    long w = (long)arg;
    char *buf = aligned_alloc(4096, SLOT);
    if (!buf)
        return NULL;
    memset(buf, (int)w + 1, SLOT);
    uint64_t n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        off_t off = ((off_t)w * SLOTS_PER_WRITER + (off_t)(n % SLOTS_PER_WRITER)) * SLOT;
        if (pwrite(fd, buf, SLOT, off) != SLOT) {
            failed_errno = errno ? errno : EIO;
            break;
        }
        n++;
    }
    done[w] = n;
    free(buf);
    return NULL;
}

static void *spinner_main(void *arg)
{
    (void)arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        x++;
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
            "per writer). The file (DIR/dsync_writers.<pid>) is removed at the end.\n");
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
            for (long i = 0; i < spinners[a]; i++)
                pthread_create(&t[MAX_THREADS + i], NULL, spinner_main, NULL);
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
            for (int i = 0; i < spinners[a]; i++)
                pthread_join(t[MAX_THREADS + i], NULL);
            if (failed_errno) {
                fprintf(stderr, "dsync_writers: write: %s\n", strerror(failed_errno));
                rc = 1;
                break;
            }
            double per_s = (double)total / seconds;
            printf("writers=%d spinners=%d syncs_per_s=%.0f mean_us=%.0f\n", writers[b], spinners[a], per_s,
                   per_s > 0 ? 1e6 * writers[b] / per_s : 0.0);
            fflush(stdout);
        }
    close(fd);
    unlink(path);
    return rc;
}
