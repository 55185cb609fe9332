/* split_alloc.c -- split allocation: the malloc family, routed (see split_alloc.h).
 *
 * These definitions live in the executable (the runtime is a static library),
 * so they take precedence over glibc's for the program and for glibc itself
 * (strdup, fopen, ... call malloc through the PLT). Routing:
 *
 *   allocation (malloc, calloc, memalign & co):
 *     read-write thread and durable heap attached -> dheap_*
 *     otherwise                                   -> glibc (__libc_*)
 *   free / realloc / malloc_usable_size: by address (dheap_contains):
 *     durable pointer, read-write thread  -> dheap_*
 *     durable pointer, any other thread   -> free: queued for the combiner;
 *                                            realloc: moved to glibc memory,
 *                                            the durable block queued
 *                                            (dropped once the queue is
 *                                            closed: after mango_shutdown,
 *                                            in a fork child)
 *     transient pointer, read-write thread, realloc -> moved into the durable
 *                                            heap (the copy is captured)
 *     transient pointer otherwise          -> glibc
 *
 * Nothing here may call malloc/free (that would recurse); the deferred queue
 * grows with __libc_realloc.
 */
#define _GNU_SOURCE
#include "alloc/split_alloc.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "mango.h"

__thread bool split_alloc_rw_thread __attribute__((tls_model("initial-exec")));

/* glibc's allocator under its exported internal names (glibc 2.36). */
extern void *__libc_malloc(size_t n);
extern void __libc_free(void *p);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);

/* From durable_heap.c, for this file only. */

/* Our own definitions, declared here so the file does not depend on
 * <malloc.h> being included. */
void *memalign(size_t align, size_t n);
void *valloc(size_t n);
void *pvalloc(size_t n);
size_t malloc_usable_size(void *p);

void split_alloc_link_anchor(void) {}

static inline bool use_durable(void)
{
    return split_alloc_rw_thread && dheap_attached();
}

/* ---- glibc's malloc_usable_size ----------------------------------------
 * glibc 2.36 exports it only under its public name, which we override, so
 * look the original up. Resolved at startup (before any read-write command);
 * a late resolution runs with the read-write flag cleared so whatever the
 * dynamic linker allocates is transient. */

static size_t (*libc_usable_size)(void *);

static void resolve_libc_usable_size(void)
{
    bool rw = split_alloc_rw_thread;
    split_alloc_rw_thread = false;
    void *f = dlsym(RTLD_NEXT, "malloc_usable_size");
    if (!f || f == (void *)malloc_usable_size) {
        void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            f = dlsym(h, "malloc_usable_size");
            dlclose(h);
        }
    }
    if (f && f != (void *)malloc_usable_size)
        __atomic_store_n(&libc_usable_size, (size_t(*)(void *))f, __ATOMIC_RELEASE);
    split_alloc_rw_thread = rw;
}

static void defer_fork_child(void);

__attribute__((constructor)) static void split_alloc_init(void)
{
    resolve_libc_usable_size();
    /* Registered here, not by mango_init: a child forked with no runtime up
     * (a heap still attached after mango_shutdown) needs it too. */
    if (pthread_atfork(NULL, NULL, defer_fork_child) != 0) {
        static const char msg[] = "mangosteen: pthread_atfork failed: a fork() child's durable frees may hang\n";
        (void)!write(2, msg, sizeof msg - 1);
    }
}

static size_t transient_usable_size(void *p)
{
    size_t (*f)(void *) = __atomic_load_n(&libc_usable_size, __ATOMIC_ACQUIRE);
    if (!f) {
        resolve_libc_usable_size();
        f = __atomic_load_n(&libc_usable_size, __ATOMIC_ACQUIRE);
    }
    if (f)
        return f(p);
    /* Last resort: glibc's chunk header (size word before the block, flag
     * bits in the low 3 bits, bit 1 = mmapped). */
    size_t sz = ((size_t *)p)[-1];
    return (sz & ~(size_t)7) - ((sz & 2) ? 2 : 1) * sizeof(size_t);
}

/* ---- deferred frees ------------------------------------------------------
 *
 * A durable object freed by a thread outside a read-write command is queued
 * here and freed by a batch (split_alloc_drain_deferred, when one begins and
 * before it ends). The queue
 * belongs to one attachment of the heap (defer_epoch against dheap_epoch()):
 * once the heap is detached or attached again the queued pointers are
 * dropped, never freed, so they cannot free objects of the next heap
 * attached in this process. (Found by a review: a free made after
 * mango_shutdown was applied by the next mango_init's first batch, to a live
 * recovered object of the same pool, or, on a new pool, to a pointer its
 * heap never handed out: abort.)
 *
 * Closed (split_alloc_deferred_close, called by mango_shutdown once its
 * last batch has drained the queue, and in a fork() child): no batch will
 * run against this attachment any more, so such a free does nothing; the
 * object stays allocated in the pool, which is closed (or, in a child, the
 * parent's). A new attachment opens the queue again. */

static pthread_mutex_t defer_lock = PTHREAD_MUTEX_INITIALIZER;
/* This thread holds defer_lock across a snapshot's drain and fork
 * (split_alloc_deferred_hold): its own queue operations then do not take
 * it again. */
static __thread bool defer_held_here;
static void **defer_q;
static size_t defer_n, defer_cap;
static uint64_t defer_epoch; /* the attachment the queue belongs to */
static bool defer_closed;

static void defer_lock_take(void)
{
    if (!defer_held_here)
        pthread_mutex_lock(&defer_lock);
}

static void defer_lock_give(void)
{
    if (!defer_held_here)
        pthread_mutex_unlock(&defer_lock);
}

/* Under defer_lock: forget the queue of an earlier attachment. */
static void defer_sync_epoch(void)
{
    uint64_t e = dheap_epoch();
    if (e != defer_epoch) {
        defer_epoch = e;
        defer_closed = false;
        __atomic_store_n(&defer_n, 0, __ATOMIC_RELEASE);
    }
}

static void defer_free(void *p)
{
    defer_lock_take();
    defer_sync_epoch();
    if (defer_closed) {
        defer_lock_give();
        return;
    }
    if (defer_n == defer_cap) {
        size_t cap = defer_cap ? defer_cap * 2 : 64;
        void **q = __libc_realloc(defer_q, cap * sizeof *q);
        if (!q) {
            /* Out of transient memory: leak the durable block rather than
             * free it outside the combiner. */
            defer_lock_give();
            return;
        }
        defer_q = q;
        defer_cap = cap;
    }
    defer_q[defer_n] = p;
    __atomic_store_n(&defer_n, defer_n + 1, __ATOMIC_RELEASE);
    defer_lock_give();
}

bool split_alloc_deferred_pending(void)
{
    if (__atomic_load_n(&defer_n, __ATOMIC_ACQUIRE) == 0)
        return false;
    defer_lock_take();
    defer_sync_epoch();
    bool pending = defer_n != 0;
    defer_lock_give();
    return pending;
}

void split_alloc_drain_deferred(void)
{
    if (__atomic_load_n(&defer_n, __ATOMIC_ACQUIRE) == 0 || !dheap_attached())
        return;
    defer_lock_take();
    defer_sync_epoch();
    for (size_t i = 0; i < defer_n; i++)
        dheap_free(defer_q[i]);
    __atomic_store_n(&defer_n, 0, __ATOMIC_RELEASE);
    defer_lock_give();
}

void split_alloc_deferred_close(void)
{
    defer_lock_take();
    defer_sync_epoch();
    __atomic_store_n(&defer_n, 0, __ATOMIC_RELEASE);
    defer_closed = true;
    defer_lock_give();
}

void split_alloc_deferred_hold(void)
{
    pthread_mutex_lock(&defer_lock);
    defer_held_here = true;
}

void split_alloc_deferred_release(void)
{
    defer_held_here = false;
    pthread_mutex_unlock(&defer_lock);
}

/* fork() child: another thread of the parent may have held defer_lock at
 * the fork, and it does not exist here, so the lock is made anew (a child's
 * first durable free hung on it: found by a review). The child never writes
 * the parent's pool (runtime.c, "fork() children"), so its queue is closed:
 * what it frees of the durable heap stays the parent's. */
static void defer_fork_child(void)
{
    pthread_mutex_init(&defer_lock, NULL);
    defer_held_here = false; /* (a snapshot's fork: the lock is made anew) */
    defer_epoch = dheap_epoch();
    defer_n = 0;
    defer_closed = true;
}

/* ---- the malloc family ---------------------------------------------------- */

void *malloc(size_t n)
{
    return use_durable() ? dheap_malloc(n) : __libc_malloc(n);
}

void free(void *p)
{
    if (!p)
        return;
    if (!dheap_contains(p))
        __libc_free(p);
    else if (split_alloc_rw_thread)
        dheap_free(p);
    else
        defer_free(p);
}

void *calloc(size_t n, size_t size)
{
    return use_durable() ? dheap_calloc(n, size) : __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (dheap_contains(p)) {
        if (split_alloc_rw_thread)
            return dheap_realloc(p, n);
        /* Durable block resized outside a read-write command: the new block
         * is transient; the old one is freed by the next combiner. */
        if (n == 0) {
            defer_free(p);
            return NULL;
        }
        void *q = __libc_malloc(n);
        if (!q)
            return NULL;
        size_t old = dheap_usable_size(p);
        memcpy(q, p, old < n ? old : n);
        defer_free(p);
        return q;
    }
    if (!use_durable())
        return __libc_realloc(p, n);
    /* Transient block resized inside a read-write command: it becomes
     * durable state, so move it into the durable heap and capture the copy. */
    if (n == 0) {
        __libc_free(p);
        return NULL;
    }
    void *q = dheap_malloc(n);
    if (!q)
        return NULL;
    size_t old = transient_usable_size(p);
    size_t copy = old < n ? old : n;
    memcpy(q, p, copy);
    dheap_capture(q, copy);
    __libc_free(p);
    return q;
}

static void *route_memalign(size_t align, size_t n)
{
    return use_durable() ? dheap_memalign(align, n) : __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n)
{
    return route_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    if (align == 0 || (align & (align - 1)) || align % sizeof(void *))
        return EINVAL;
    int saved = errno;
    void *p = route_memalign(align, n);
    errno = saved;
    if (!p)
        return ENOMEM;
    *out = p;
    /* The runtime is not instrumented: this store into the caller's
     * (possibly durable) pointer is reported here (found by a review,
     * session 36: a pointer set so was NULL after recovery). */
    if (mango_capture_active)
        mango_capture(out, sizeof *out);
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    if (align == 0 || (align & (align - 1))) {
        errno = EINVAL;
        return NULL;
    }
    return route_memalign(align, n);
}

static size_t page_size(void)
{
    static size_t ps;
    size_t v = __atomic_load_n(&ps, __ATOMIC_RELAXED);
    if (!v) {
        long r = sysconf(_SC_PAGESIZE);
        v = r > 0 ? (size_t)r : 4096;
        __atomic_store_n(&ps, v, __ATOMIC_RELAXED);
    }
    return v;
}

void *valloc(size_t n)
{
    return route_memalign(page_size(), n);
}

void *pvalloc(size_t n)
{
    size_t ps = page_size();
    if (n > SIZE_MAX - ps) {
        errno = ENOMEM;
        return NULL;
    }
    size_t rounded = (n + ps - 1) & ~(ps - 1);
    return route_memalign(ps, rounded ? rounded : ps);
}

size_t malloc_usable_size(void *p)
{
    if (!p)
        return 0;
    return dheap_contains(p) ? dheap_usable_size(p) : transient_usable_size(p);
}
