/* test_persist_fs_unmap.c -- fs mode's sync of a large range (persist.c,
 * sync_fs): the range's pages are unmapped from the process before writeback
 * (so that writeback need not write-protect them one TLB shootdown at a
 * time), and nothing written is lost by it.
 *
 *   - a 4 MiB range written through the shared mapping and synced: every
 *     page's data is in the file (pread) and still reads back through the
 *     mapping, and /proc/self/pagemap shows the pages no longer mapped;
 *   - a small range (one page) stays mapped: the unmapping is for the
 *     backend's rounds only, not for every sync;
 *   - stores after the sync fault the pages back in and reach the file at
 *     the next sync.
 * The file lives in $TMPDIR or /var/tmp (a disk: the page cache path of fs
 * mode; tmpfs would do too, but that is not what it is for). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "persist/persist.h"

#include "check.h"

#define POOL (8u << 20)
#define BIG (4u << 20)

static long page_size;

/* Pages of [addr, addr + len) mapped in this process (pagemap bit 63). */
static long mapped_pages(const char *addr, size_t len)
{
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0)
        return -1;
    long n = 0;
    for (size_t off = 0; off < len; off += (size_t)page_size) {
        uint64_t e = 0;
        off_t at = (off_t)(((uintptr_t)addr + off) / (uintptr_t)page_size * sizeof e);
        if (pread(fd, &e, sizeof e, at) != (ssize_t)sizeof e) {
            n = -1;
            break;
        }
        n += (long)(e >> 63);
    }
    close(fd);
    return n;
}

static void fill(char *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i += 64)
        memset(p + i, (int)((seed + i / (size_t)page_size) & 0xff), 64);
}

static int file_matches(int fd, const char *want, off_t off, size_t len)
{
    char *got = malloc(len);
    if (!got)
        return 0;
    int ok = pread(fd, got, len, off) == (ssize_t)len && memcmp(got, want, len) == 0;
    free(got);
    return ok;
}

int main(void)
{
    page_size = sysconf(_SC_PAGESIZE);
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/mango-test-fs-unmap-XXXXXX", dir && *dir ? dir : "/var/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "cannot create %s: %s (set TMPDIR to a writable directory)\n", path, strerror(errno));
        return 1;
    }
    CHECK(ftruncate(fd, POOL) == 0);
    char *base = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        fprintf(stderr, "cannot map %s: %s\n", path, strerror(errno));
        unlink(path);
        return 1;
    }
    persist_domain dom = {.mode = PERSIST_FS, .base = base, .len = POOL, .fd = fd};

    /* A large range: written, synced, in the file, unmapped, still readable. */
    char *want = malloc(BIG);
    CHECK(want != NULL);
    char *big = base + (1u << 20);
    fill(big, BIG, 7);
    memcpy(want, big, BIG);
    CHECK(mapped_pages(big, BIG) == (long)(BIG / (size_t)page_size));
    persist_ranges r = {0};
    persist_flush(&dom, &r, big, BIG, "test.flush");
    CHECK(persist_sync(&dom, &r, "test.sync") == 0);
    CHECK(file_matches(fd, want, (off_t)(big - base), BIG));
    long left = mapped_pages(big, BIG);
    printf("after the sync of %u KiB: %ld of %ld pages still mapped\n", BIG >> 10, left,
           (long)(BIG / (size_t)page_size));
    CHECK(left == 0);
    CHECK(memcmp(big, want, BIG) == 0); /* faults them back in, unchanged */

    /* A one-page range stays mapped. */
    char *small = base;
    fill(small, (size_t)page_size, 3);
    persist_flush(&dom, &r, small, (size_t)page_size, "test.flush");
    CHECK(persist_sync(&dom, &r, "test.sync") == 0);
    CHECK(mapped_pages(small, (size_t)page_size) == 1);
    CHECK(file_matches(fd, small, 0, (size_t)page_size));

    /* Stores after the unmapping reach the file at the next sync. */
    fill(big, BIG, 11);
    memcpy(want, big, BIG);
    persist_flush(&dom, &r, big, BIG, "test.flush");
    CHECK(persist_sync(&dom, &r, "test.sync") == 0);
    CHECK(file_matches(fd, want, (off_t)(big - base), BIG));
    CHECK(memcmp(big, want, BIG) == 0);

    free(want);
    munmap(base, POOL);
    close(fd);
    unlink(path);
    return check_report("test_persist_fs_unmap");
}
