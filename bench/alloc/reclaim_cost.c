/* reclaim_cost.c -- what the durable heap's reclaim costs (bench/README.md,
 * "reclaim_cost").
 *
 * A request that finds no room in the durable heap first reclaims: it walks
 * the heap's chunks and the free lists of its small size classes, so its cost
 * grows with the heap. This fills a heap of the given size with objects of
 * one size, frees all of them (or all but one in N), and times the request
 * for a quarter of the heap that then has to reclaim: the time, the bytes the
 * reclaim reported for the log, and whether the request found room. The heap
 * is plain anonymous memory with a counting capture callback (no runtime, no
 * log), so this is the allocator's own cost.
 *
 *   build/bench/reclaim_cost [--heap-mib N] [--size B] [--keep-one-in N]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "alloc/durable_heap.h"

static size_t g_captured;
static void count_capture(const void *addr, size_t len)
{
    (void)addr;
    g_captured += len;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: reclaim_cost [--heap-mib N] [--size BYTES] [--keep-one-in N]\n"
               "  Fill a durable heap of N MiB (default 1024) with BYTES-byte objects\n"
               "  (default 24), free them all (or all but one in N), then time the\n"
               "  request for a quarter of the heap that reclaims the space.\n");
}

static unsigned long parse(const char *opt, const char *v, unsigned long lo, unsigned long hi)
{
    char *end;
    errno = 0;
    unsigned long x = v ? strtoul(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo || x > hi) {
        fprintf(stderr, "reclaim_cost: %s needs a number from %lu to %lu\n", opt, lo, hi);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    unsigned long heap_mib = 1024, size = 24, keep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--heap-mib"))
            heap_mib = parse(argv[i], argv[i + 1], 1, 1 << 16), i++;
        else if (!strcmp(argv[i], "--size"))
            size = parse(argv[i], argv[i + 1], 1, 1 << 20), i++;
        else if (!strcmp(argv[i], "--keep-one-in"))
            keep = parse(argv[i], argv[i + 1], 2, 1ul << 30), i++;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(stdout), 0;
        else
            return usage(stderr), 2;
    }
    size_t cap = (size_t)heap_mib << 20;
    char *base = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    size_t max = cap / (size < 8 ? 8 : size) + 1;
    void **objs = malloc(max * sizeof *objs);
    if (base == MAP_FAILED || !objs || dheap_attach(base, cap, true, count_capture) != 0) {
        fprintf(stderr, "reclaim_cost: no memory for a %lu MiB heap\n", heap_mib);
        return 1;
    }
    double t0 = now_s();
    size_t n = 0;
    while (n < max && (objs[n] = dheap_malloc(size)) != NULL)
        n++;
    double t1 = now_s();
    for (size_t i = 0; i < n; i++)
        if (!keep || i % keep)
            dheap_free(objs[i]);
    g_captured = 0;
    double t2 = now_s();
    void *big = dheap_malloc(cap / 4);
    double t3 = now_s();
    char freed[48] = "all";
    if (keep)
        snprintf(freed, sizeof freed, "all but 1 in %lu", keep);
    printf("| %lu MiB | %lu B | %zu | %s | %.1f ms | %zu | %s |\n", heap_mib, size, n, freed,
           (t3 - t2) * 1e3, g_captured, big ? "yes" : "no");
    fprintf(stderr, "(fill %.2f s, %llu reclaims)\n", t1 - t0, (unsigned long long)dheap_reclaims());
    if (dheap_check() != 0) {
        fprintf(stderr, "reclaim_cost: the heap is inconsistent after the reclaim\n");
        return 1;
    }
    return 0;
}
