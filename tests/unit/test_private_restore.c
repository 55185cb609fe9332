/* test_private_restore.c -- the heap restored by mapping the pool file
 * copy-on-write (recovery.h), and the same checks with MANGO_RESTORE=copy.
 *
 * 1. Pages the process never writes keep the bytes they had at recovery,
 *    also after the backend applied batches that wrote neighbouring pages
 *    and batches that captured blocks on them without storing (a capture of
 *    bytes that were only read): pagemap shows those pages still backed by
 *    the file, and their bytes are unchanged.
 * 2. fork(): a child forked after recovery sees the heap as it was at the
 *    fork, although the parent then writes pages the child shares and its
 *    backend writes them into the pool file (this fails without the fork
 *    handler that makes the heap private first).
 * 3. While the restored heap is mapped (also after mango_shutdown) the pool
 *    stays locked; a later mango_init in this process recovers it again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mango.h"

#include "check.h"
#include "test_config.h"

#define NPAGES 64
#define PAGE 4096

static uint64_t *arr; /* .bss, durable: NPAGES pages in the durable heap */

static uint64_t pattern(unsigned page, unsigned word) { return 0x5eed000000000000ull ^ ((uint64_t)page << 20) ^ word; }

static void init_state(void *arg)
{
    (void)arg;
    arr = malloc((size_t)NPAGES * PAGE);
    for (unsigned p = 0; p < NPAGES; p++)
        for (unsigned w = 0; w < PAGE / 8; w++)
            arr[p * (PAGE / 8) + w] = pattern(p, w);
    mango_capture(&arr, sizeof arr);
    mango_capture(arr, (size_t)NPAGES * PAGE);
}

typedef struct cmd {
    unsigned page;
    uint64_t value;
    bool store; /* false: capture the word without storing it */
} cmd;

static bool is_ro(void *c) { (void)c; return false; }
static void process(void *c)
{
    cmd *k = c;
    uint64_t *w = &arr[k->page * (PAGE / 8) + 8];
    if (k->store)
        *w = k->value;
    mango_capture(w, sizeof *w);
}

static int start(const char *pool)
{
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_EMULATED);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = process, .init_state = init_state};
    int rc = mango_init(&cfg, &cb);
    if (rc < 0)
        fprintf(stderr, "mango_init: %s\n", mango_last_error());
    return rc;
}

/* Does the page at addr belong to the process alone (present, anonymous)?
 * A page of a private file mapping that was never written reads as a file
 * page (bit 61) or not present. */
static int page_private(const void *addr)
{
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0)
        return -1;
    uint64_t e = 0;
    ssize_t n = pread(fd, &e, sizeof e, (off_t)((uintptr_t)addr / PAGE * sizeof e));
    close(fd);
    if (n != sizeof e)
        return -1;
    bool present = e >> 63 & 1, file = e >> 61 & 1;
    return present && !file;
}

/* Page index p of arr, rounded into the array (arr is not page aligned). */
static const char *page_of(unsigned p)
{
    uintptr_t a = ((uintptr_t)arr + PAGE - 1) / PAGE * PAGE + (uintptr_t)p * PAGE;
    return (const char *)a;
}

static void round_trip(const char *pool, bool mapped)
{
    unlink(pool);
    CHECK(start(pool) == MANGO_FRESH);
    CHECK(mango_shutdown() == 0);

    /* ---- 1. untouched pages keep their bytes ---- */
    CHECK(start(pool) == MANGO_RECOVERED);
    bool ok = true;
    for (unsigned p = 0; p < NPAGES; p++)
        for (unsigned w = 0; w < PAGE / 8; w++)
            ok &= arr[p * (PAGE / 8) + w] == pattern(p, w);
    CHECK(ok);
    /* Array pages 1..NPAGES-2 are whole pages of arr; even ones are written,
     * odd ones only captured. */
    for (int round = 0; round < 20; round++)
        for (unsigned p = 1; p + 1 < NPAGES; p++) {
            cmd k = {.page = p, .value = 0xabc000 + round, .store = p % 2 == 0};
            CHECK(mango_client_cmd(&k) == 0);
        }
    CHECK(mango_shutdown() == 0); /* the backend applied everything */
    unsigned still_shared = 0;
    ok = true;
    for (unsigned p = 2; p + 2 < NPAGES; p++) {
        /* arr's page p spans page_of(p-1)..page_of(p); look at whole pages */
        const uint64_t *w = (const uint64_t *)page_of(p);
        unsigned idx0 = (unsigned)(((uintptr_t)w - (uintptr_t)arr) / 8);
        bool written_neighbour = false;
        for (unsigned i = 0; i < PAGE / 8; i++) {
            unsigned gi = idx0 + i, ap = gi / (PAGE / 8), aw = gi % (PAGE / 8);
            uint64_t want = (ap % 2 == 0 && aw == 8) ? 0xabc000 + 19 : pattern(ap, aw);
            written_neighbour |= ap % 2 == 0 && aw == 8;
            ok &= w[i] == want;
        }
        if (!written_neighbour) {
            int pr = page_private(w);
            if (mapped)
                still_shared += pr == 0;
            else
                still_shared += pr != 1;
        }
    }
    CHECK(ok);
    if (mapped)
        CHECK(still_shared > 0); /* the test saw pages backed by the pool file */
    else
        CHECK(still_shared == 0);
    fprintf(stderr, "%s: %u untouched whole pages %s\n", mapped ? "map" : "copy", still_shared,
            mapped ? "still backed by the pool file" : "not private (expected none)");

    /* ---- 3. the pool stays locked while the restored heap is mapped ---- */
    int fd = open(pool, O_RDWR);
    CHECK(fd >= 0);
    int lr = flock(fd, LOCK_EX | LOCK_NB);
    if (mapped)
        CHECK(lr != 0 && errno == EWOULDBLOCK);
    else
        CHECK(lr == 0);
    close(fd);

    /* ---- 2. fork ---- */
    CHECK(start(pool) == MANGO_RECOVERED);
    ok = true;
    for (unsigned p = 1; p + 1 < NPAGES; p++)
        ok &= arr[p * (PAGE / 8) + 8] == (p % 2 == 0 ? 0xabc000 + 19 : pattern(p, 8));
    CHECK(ok);
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1)
            _exit(3);
        /* The parent has written every page and its backend has applied it. */
        for (unsigned p = 1; p + 1 < NPAGES; p++) {
            uint64_t want = p % 2 == 0 ? 0xabc000 + 19 : pattern(p, 8);
            if (arr[p * (PAGE / 8) + 8] != want)
                _exit(1);
        }
        _exit(0);
    }
    close(go[0]);
    for (unsigned p = 1; p + 1 < NPAGES; p++) {
        cmd k = {.page = p, .value = 0xdef000, .store = true};
        CHECK(mango_client_cmd(&k) == 0);
    }
    CHECK(mango_shutdown() == 0); /* drains: the pool file has the new values */
    CHECK(write(go[1], "x", 1) == 1);
    close(go[1]);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        fprintf(stderr, "forked child saw the parent's later writes (status %#x)\n", st);

    CHECK(start(pool) == MANGO_RECOVERED);
    ok = true;
    for (unsigned p = 1; p + 1 < NPAGES; p++)
        ok &= arr[p * (PAGE / 8) + 8] == 0xdef000;
    CHECK(ok);
    CHECK(mango_shutdown() == 0);
}

int main(void)
{
    char pool[64];
    snprintf(pool, sizeof pool, "/dev/shm/mango-private-restore-%d.pool", (int)getpid());
    unsetenv("MANGO_RESTORE");
    round_trip(pool, true);
    setenv("MANGO_RESTORE", "copy", 1);
    round_trip(pool, false);
    unlink(pool);
    return check_report("test_private_restore");
}
