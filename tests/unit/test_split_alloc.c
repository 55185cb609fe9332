/* test_split_alloc.c -- routing of the interposed malloc family.
 *
 * Attaches a durable heap by hand and flips split_alloc_rw_thread the way the
 * runtime does around a read-write batch, then checks where each call lands:
 * durable inside read-write, glibc outside, free/realloc by address, deferred
 * frees from other threads drained later, contents preserved when realloc
 * moves a block across the boundary, glibc's own internal allocations
 * (strdup, printf) still working; queued frees dropped when the heap is
 * detached or attached again, or the queue closed, and a fork() child whose
 * parent held the queue's lock not hanging in free().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "alloc/split_alloc.h"

#include "check.h"

static char *g_base;
static size_t g_cap;
static unsigned long captures, bad_captures;
/* The most recent capture that was not a small metadata write. */
static const char *last_big_addr;
static size_t last_big_len;

static void capture(const void *addr, size_t len)
{
    const char *p = addr;
    if (p < g_base || p + len > g_base + g_cap)
        bad_captures++;
    captures++;
    if (len > 16) {
        last_big_addr = p;
        last_big_len = len;
    }
}

static uint64_t allocated(void) { return ((dheap_root *)g_base)->allocated; }

static void fill(char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (char)(seed + i * 7);
}

static int same(const char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (char)(seed + i * 7))
            return 0;
    return 1;
}

enum { NTHREAD_FREES = 500 };
static void *thread_ptrs[NTHREAD_FREES];

static void *free_from_thread(void *arg)
{
    (void)arg;
    /* A background thread: not read-write; its frees of durable blocks are
     * deferred, and its own allocations are transient. */
    for (int i = 0; i < NTHREAD_FREES; i++)
        free(thread_ptrs[i]);
    void *t = malloc(64);
    int ok = t && !dheap_contains(t);
    free(t);
    return ok ? (void *)1 : NULL;
}

/* Takes and releases the deferred-free queue's lock over and over (it is
 * taken while a free is queued), so that forks land while it is held. */
static volatile int holder_stop;
static void *lock_holder(void *arg)
{
    (void)arg;
    while (!holder_stop)
        (void)split_alloc_deferred_pending();
    return NULL;
}

/* A child forked while another thread may hold the queue's lock: its free
 * of a durable object must return (it is dropped: the child never writes
 * the parent's heap) and leave nothing queued. Returns how many of `forks`
 * children failed (hung: killed by their alarm). */
static int fork_children_free(void *obj, int forks)
{
    int failed = 0;
    for (int i = 0; i < forks && !failed; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(2);
            free(obj);
            _exit(split_alloc_deferred_pending() ? 3 : 0);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "fork %d: child %s %d\n", i, WIFSIGNALED(st) ? "killed by signal" : "exited",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
            failed++;
        }
    }
    return failed;
}

int main(void)
{
    /* Outside the runtime everything is glibc's. */
    char *s = strdup("hello");
    CHECK(s && strcmp(s, "hello") == 0);
    printf("transient strdup: %s\n", s); /* stdout's buffer is allocated here, transiently */
    free(s);

    g_cap = 64 << 20;
    g_base = mmap(NULL, g_cap, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(g_base != MAP_FAILED);

    /* Read-write flag set but no heap attached: still glibc. */
    split_alloc_rw_thread = true;
    void *early = malloc(32);
    CHECK(early && !dheap_contains(early));
    split_alloc_rw_thread = false;
    free(early);

    CHECK(dheap_attach(g_base, g_cap, true, capture) == 0);

    /* Outside read-write: transient. */
    char *t = malloc(100);
    CHECK(t && !dheap_contains(t));
    CHECK(malloc_usable_size(t) >= 100);
    void *tc = calloc(10, 10);
    CHECK(tc && !dheap_contains(tc));
    void *ta = NULL;
    CHECK(posix_memalign(&ta, 256, 10) == 0 && ta && !dheap_contains(ta) && ((uintptr_t)ta & 255) == 0);
    free(ta);
    free(tc);

    /* Inside read-write: durable. */
    split_alloc_rw_thread = true;
    uint64_t a0 = allocated();
    char *d = malloc(100);
    CHECK(d && dheap_contains(d));
    CHECK(allocated() > a0);
    CHECK(malloc_usable_size(d) >= 100);
    unsigned char *dz = calloc(50, 20);
    int zero = dz != NULL;
    for (int i = 0; dz && i < 1000; i++)
        zero &= dz[i] == 0;
    CHECK(zero && dheap_contains(dz));
    void *m1 = memalign(4096, 10);
    CHECK(m1 && dheap_contains(m1) && ((uintptr_t)m1 & 4095) == 0);
    void *m2 = NULL;
    CHECK(posix_memalign(&m2, 64, 1000) == 0 && dheap_contains(m2) && ((uintptr_t)m2 & 63) == 0);
    CHECK(posix_memalign(&m2, 24, 10) == EINVAL);
    CHECK(posix_memalign(&m2, 4, 10) == EINVAL);
    void *m3 = aligned_alloc(128, 256);
    CHECK(m3 && dheap_contains(m3) && ((uintptr_t)m3 & 127) == 0);
    errno = 0;
    volatile size_t not_a_power_of_two = 3; /* (a constant draws clang's warning) */
    CHECK(aligned_alloc(not_a_power_of_two, 10) == NULL && errno == EINVAL);
    void *m4 = valloc(100);
    CHECK(m4 && dheap_contains(m4) && ((uintptr_t)m4 & 4095) == 0);
    void *m5 = pvalloc(5000);
    CHECK(m5 && dheap_contains(m5) && ((uintptr_t)m5 & 4095) == 0 && malloc_usable_size(m5) >= 8192);
    char *ds = strdup("durable string"); /* glibc's internal malloc call routes too */
    CHECK(ds && dheap_contains(ds) && strcmp(ds, "durable string") == 0);
    free(m1), free(m2), free(m3), free(m4), free(m5), free(dz);

    /* A transient block freed inside read-write goes back to glibc. */
    free(t);

    /* realloc of a transient block inside read-write: moves into the heap,
     * contents kept, the copy captured. */
    split_alloc_rw_thread = false;
    char *tr = malloc(3000);
    fill(tr, 3000, 11);
    split_alloc_rw_thread = true;
    last_big_addr = NULL;
    char *dr = realloc(tr, 5000);
    CHECK(dr && dheap_contains(dr) && same(dr, 3000, 11));
    CHECK(last_big_addr == dr && last_big_len >= 3000 && last_big_len <= 5000);
    /* ... and realloc of a durable block inside read-write stays durable. */
    char *dr2 = realloc(dr, 100000);
    CHECK(dr2 && dheap_contains(dr2) && same(dr2, 3000, 11));
    CHECK(dheap_check() == 0);

    /* Outside read-write: realloc of a durable block moves it out (contents
     * kept); the durable block is only queued, not freed. */
    split_alloc_rw_thread = false;
    uint64_t before = allocated();
    unsigned long caps_before = captures;
    char *back = realloc(dr2, 4000);
    CHECK(back && !dheap_contains(back) && same(back, 3000, 11));
    CHECK(allocated() == before);
    CHECK(captures == caps_before); /* nothing written to the heap outside read-write */
    free(ds); /* durable, freed outside read-write: deferred */
    CHECK(allocated() == before);
    CHECK(realloc(d, 0) == NULL); /* durable, size 0: deferred free */
    CHECK(allocated() == before);
    CHECK(captures == caps_before);
    free(back);

    /* Deferred frees from another thread, enough to grow the queue. */
    split_alloc_rw_thread = true;
    for (int i = 0; i < NTHREAD_FREES; i++) {
        thread_ptrs[i] = malloc(16 + (size_t)i * 3);
        CHECK(thread_ptrs[i] && dheap_contains(thread_ptrs[i]));
    }
    split_alloc_rw_thread = false;
    uint64_t with_thread = allocated();
    pthread_t th;
    void *ok = NULL;
    CHECK(pthread_create(&th, NULL, free_from_thread, NULL) == 0);
    CHECK(pthread_join(th, &ok) == 0 && ok == (void *)1);
    CHECK(allocated() == with_thread);

    /* The combiner drains the queue while capturing. */
    split_alloc_rw_thread = true;
    split_alloc_drain_deferred();
    split_alloc_rw_thread = false;
    CHECK(allocated() == a0);
    CHECK(dheap_check() == 0);
    split_alloc_drain_deferred(); /* empty: no-op */
    CHECK(allocated() == a0);

    /* A queued free belongs to its attachment of the heap: detached and
     * attached again (a new heap in the same range, as mango_init does after
     * mango_shutdown), it is dropped, not applied to the new heap (which
     * never handed the pointer out: "invalid pointer" abort). */
    split_alloc_rw_thread = true;
    void *old = malloc(200);
    split_alloc_rw_thread = false;
    CHECK(old && dheap_contains(old));
    free(old);
    CHECK(split_alloc_deferred_pending());
    dheap_detach();
    CHECK(!split_alloc_deferred_pending());
    CHECK(dheap_attach(g_base, g_cap, true, capture) == 0);
    uint64_t fresh = allocated();
    split_alloc_rw_thread = true;
    split_alloc_drain_deferred();
    split_alloc_rw_thread = false;
    CHECK(allocated() == fresh);
    CHECK(dheap_check() == 0);

    /* Closed (mango_shutdown): frees are dropped, not queued; the next
     * attach opens the queue again. */
    split_alloc_rw_thread = true;
    void *c1 = malloc(300), *c2 = malloc(300);
    split_alloc_rw_thread = false;
    split_alloc_deferred_close();
    free(c1);
    CHECK(!split_alloc_deferred_pending());
    CHECK(dheap_attach(g_base, g_cap, false, capture) == 0); /* the same heap, attached again */
    free(c2);
    CHECK(split_alloc_deferred_pending());
    split_alloc_rw_thread = true;
    split_alloc_drain_deferred();
    split_alloc_rw_thread = false;
    CHECK(allocated() == fresh + malloc_usable_size(c1) + 8); /* c1 stays allocated: dropped */
    CHECK(dheap_check() == 0);

    /* fork() while another thread holds the queue's lock: the child's
     * durable free neither hangs nor queues. */
    split_alloc_rw_thread = true;
    void *held = malloc(100), *in_child = malloc(100);
    split_alloc_rw_thread = false;
    free(held); /* something queued: the holder's calls then take the lock */
    pthread_t holder;
    CHECK(pthread_create(&holder, NULL, lock_holder, NULL) == 0);
    fflush(NULL);
    CHECK(fork_children_free(in_child, 200) == 0);
    holder_stop = 1;
    CHECK(pthread_join(holder, NULL) == 0);
    CHECK(split_alloc_deferred_pending()); /* the parent's queue is untouched */
    split_alloc_rw_thread = true;
    split_alloc_drain_deferred();
    free(in_child);
    split_alloc_rw_thread = false;
    CHECK(allocated() == fresh + malloc_usable_size(c1) + 8);
    CHECK(dheap_check() == 0);

    /* Plain libc use outside read-write still works after all this. */
    char buf[64];
    snprintf(buf, sizeof buf, "%d-%s", 42, "x");
    char *s2 = strdup(buf);
    CHECK(s2 && !dheap_contains(s2) && strcmp(s2, "42-x") == 0);
    free(s2);
    CHECK(bad_captures == 0);
    split_alloc_link_anchor();

    dheap_detach();
    munmap(g_base, g_cap);
    return check_report("test_split_alloc");
}
