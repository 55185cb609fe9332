/* libc_interpose.c -- capture the stores libc makes into caller memory.
 *
 * Code built with mango-cc reports its own stores; code that is not (glibc)
 * writes caller memory too: memcpy/strcpy/snprintf into a durable buffer,
 * read()/recv() into it, qsort() rearranging it, getline()/strdup() returning
 * memory they filled. While a read-write command runs (mango_capture_active),
 * each wrapper here reports exactly the bytes the libc function wrote.
 * docs/capture.md lists every wrapper and what is NOT captured.
 *
 * How it interposes: the runtime is a static library linked into the
 * executable, so these definitions win over glibc's for every call made
 * through the PLT -- by the program, by uninstrumented static code, and by
 * shared libraries. glibc's calls to itself use hidden aliases and are not
 * seen (an fread() that copies from its buffer with an internal memcpy is
 * captured by the fread wrapper, not by memcpy).
 *
 * How the real functions are found (no recursion, no malloc):
 *   - where glibc exports a second name for the same code that we do NOT
 *     define (__mempcpy, __stpcpy, __stpncpy, __bzero, __strdup, __strndup,
 *     __read, __pread64, __vsnprintf, __strerror_r, __strtok_r),
 *     we call that name directly: an ordinary PLT call, resolved by the
 *     dynamic linker, with no window where it is unknown;
 *   - everything else (memcpy, memmove, memset, the _chk variants, ...) has
 *     only the name we override, so it is looked up once with
 *     dlsym(RTLD_NEXT, name) -- in a constructor, and lazily on first use for
 *     calls made before it (other libraries' constructors run before the
 *     executable's). dlsym may call malloc/calloc: the split allocator
 *     routes those to glibc (no read-write command runs that early) and never
 *     calls back into memcpy. A thread-local guard covers the resolution
 *     window anyway: a memcpy/memmove/memset call made while this thread
 *     is inside dlsym uses the simple loops below instead of recursing.
 *
 * Cost when no read-write command runs: the real call through a function
 * pointer plus one initial-exec TLS load and a not-taken branch. Wrappers
 * whose written range is known from the arguments alone (memcpy, memset,
 * strncpy, ...) report it first and tail-call the real function; reporting
 * before the bytes are written is fine because the combiner reads the
 * captured blocks only when the batch ends. The others (read, strcpy,
 * snprintf, ...) call first and report what the result says was written.
 *
 * Sizes reported: exactly what the function wrote where that is known from
 * its arguments and result; where it is not (an error part-way through, a
 * short fread leaving a partial element, fgets data with embedded NUL
 * bytes), a conservative superset bounded by the caller's own buffer size.
 * Capturing unchanged bytes is harmless (they are logged with their current
 * contents); missing a changed byte is not.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "alloc/split_alloc.h"
#include "capture/capture.h"
#include "mango.h"

/* Some of these are also macros in glibc's headers (with optimisation). */
#undef fread_unlocked
#undef fgets_unlocked
#undef strdup
#undef strndup
#undef strtok_r
#undef strsep

/* CAPTURE(p, n): report [p, p+n) if this thread runs a read-write command. */
#include "capture/interpose_capture.h"

/* A copy onto itself (d == s) writes no new byte: Redis's listpack replaces
 * an element in place by memmoving the whole tail onto itself. */
#define CAPTURE_COPY(d, s, n)                                                    \
    do {                                                                         \
        if (unlikely(mango_capture_active) && (const void *)(d) != (const void *)(s)) \
            mango_capture((const void *)(d), (size_t)(n));                       \
    } while (0)

/* ---- glibc's second names (not overridden here, so they reach libc) ---- */

extern void *__mempcpy(void *d, const void *s, size_t n);
extern char *__stpcpy(char *d, const char *s);
extern char *__stpncpy(char *d, const char *s, size_t n);
extern void __bzero(void *s, size_t n);
extern char *__strdup(const char *s);
extern char *__strndup(const char *s, size_t n);
extern ssize_t __read(int fd, void *buf, size_t n);
extern ssize_t __pread64(int fd, void *buf, size_t n, off64_t off);
extern int __vsnprintf(char *s, size_t n, const char *fmt, va_list ap);
extern char *__strerror_r(int err, char *buf, size_t n);
extern char *__strtok_r(char *s, const char *delim, char **save);

/* ---- dlsym'd real functions (REAL() in interpose_capture.h) ------------ */

static __thread bool resolving __attribute__((tls_model("initial-exec")));

void interpose_die(const char *what)
{
    static const char pre[] = "mangosteen: libc_interpose: cannot find the real ";
    ssize_t r;
    r = syscall(SYS_write, 2, pre, sizeof pre - 1);
    r = syscall(SYS_write, 2, what, strlen(what));
    r = syscall(SYS_write, 2, "\n", 1);
    (void)r;
    abort();
}

void *interpose_resolve(void **slot, const char *name, void *self)
{
    if (resolving)
        return NULL;
    resolving = true;
    void *f = dlsym(RTLD_NEXT, name);
    static const char *const libs[] = {"libc.so.6", "libm.so.6"};
    for (unsigned i = 0; i < 2 && (!f || f == self); i++) {
        void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
        f = h ? dlsym(h, name) : NULL;
        if (h)
            dlclose(h);
    }
    if (f == self)
        f = NULL;
    resolving = false;
    if (f)
        __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    return f;
}

/* glibc's fortified entry points (declared by no public header). */
extern void *__memcpy_chk(void *d, const void *s, size_t n, size_t dl);
extern void *__memmove_chk(void *d, const void *s, size_t n, size_t dl);
extern void *__memset_chk(void *d, int c, size_t n, size_t dl);
extern void *__mempcpy_chk(void *d, const void *s, size_t n, size_t dl);
extern char *__strcpy_chk(char *d, const char *s, size_t dl);
extern char *__strncpy_chk(char *d, const char *s, size_t n, size_t dl);
extern char *__stpcpy_chk(char *d, const char *s, size_t dl);
extern char *__stpncpy_chk(char *d, const char *s, size_t n, size_t dl);
extern char *__strcat_chk(char *d, const char *s, size_t dl);
extern char *__strncat_chk(char *d, const char *s, size_t n, size_t dl);
extern wchar_t *__wmemcpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl);
extern wchar_t *__wmemmove_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl);
extern wchar_t *__wmempcpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl);
extern wchar_t *__wmemset_chk(wchar_t *d, wchar_t c, size_t n, size_t dl);
extern wchar_t *__wcscpy_chk(wchar_t *d, const wchar_t *s, size_t dl);
extern wchar_t *__wcsncpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl);
extern wchar_t *__wcscat_chk(wchar_t *d, const wchar_t *s, size_t dl);
extern wchar_t *__wcsncat_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl);
extern void __explicit_bzero_chk(void *d, size_t n, size_t dl);
extern int __sprintf_chk(char *s, int flag, size_t sl, const char *fmt, ...);
extern int __snprintf_chk(char *s, size_t n, int flag, size_t sl, const char *fmt, ...);
extern int __vsprintf_chk(char *s, int flag, size_t sl, const char *fmt, va_list ap);
extern int __vsnprintf_chk(char *s, size_t n, int flag, size_t sl, const char *fmt, va_list ap);
extern int __asprintf_chk(char **p, int flag, const char *fmt, ...);
extern int __vasprintf_chk(char **p, int flag, const char *fmt, va_list ap);
extern ssize_t __read_chk(int fd, void *buf, size_t n, size_t bl);
extern ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t bl);
extern ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t bl);
extern ssize_t __recv_chk(int fd, void *buf, size_t n, size_t bl, int flags);
extern ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t bl, int flags,
                              struct sockaddr *addr, socklen_t *alen);
extern size_t __fread_chk(void *p, size_t pl, size_t size, size_t n, FILE *fp);
extern size_t __fread_unlocked_chk(void *p, size_t pl, size_t size, size_t n, FILE *fp);
extern char *__fgets_chk(char *s, size_t sl, int n, FILE *fp);
extern char *__fgets_unlocked_chk(char *s, size_t sl, int n, FILE *fp);
extern char *__realpath_chk(const char *path, char *resolved, size_t rl);
extern char *__getcwd_chk(char *buf, size_t n, size_t bl);
extern int __xpg_strerror_r(int err, char *buf, size_t n);

DECLARE_REAL(memcpy);
DECLARE_REAL(memmove);
DECLARE_REAL(memset);
DECLARE_REAL(explicit_bzero);
DECLARE_REAL(strcpy);
DECLARE_REAL(strncpy);
DECLARE_REAL(strcat);
DECLARE_REAL(strncat);
DECLARE_REAL(memccpy);
DECLARE_REAL(memfrob);
DECLARE_REAL(strfry);
DECLARE_REAL(wmemcpy);
DECLARE_REAL(wmemmove);
DECLARE_REAL(wmempcpy);
DECLARE_REAL(wmemset);
DECLARE_REAL(wcscpy);
DECLARE_REAL(wcsncpy);
DECLARE_REAL(wcscat);
DECLARE_REAL(wcsncat);
DECLARE_REAL(wcsdup);
DECLARE_REAL(vsprintf);
DECLARE_REAL(readv);
DECLARE_REAL(preadv);
DECLARE_REAL(preadv64);
DECLARE_REAL(preadv2);
DECLARE_REAL(preadv64v2);
DECLARE_REAL(recv);
DECLARE_REAL(recvfrom);
DECLARE_REAL(recvmsg);
DECLARE_REAL(recvmmsg);
DECLARE_REAL(getdelim);
DECLARE_REAL(pthread_once);
DECLARE_REAL(fread);
DECLARE_REAL(fread_unlocked);
DECLARE_REAL(fgets);
DECLARE_REAL(fgets_unlocked);
DECLARE_REAL(qsort);
DECLARE_REAL(qsort_r);
DECLARE_REAL(realpath);
DECLARE_REAL(getcwd);
DECLARE_REAL(strtok);
DECLARE_REAL(strsep);
DECLARE_REAL(gmtime_r);
DECLARE_REAL(localtime_r);
DECLARE_REAL(clock_gettime);
DECLARE_REAL(gettimeofday);
DECLARE_REAL(time);
DECLARE_REAL(__xpg_strerror_r);
DECLARE_REAL(__memcpy_chk);
DECLARE_REAL(__memmove_chk);
DECLARE_REAL(__memset_chk);
DECLARE_REAL(__mempcpy_chk);
DECLARE_REAL(__strcpy_chk);
DECLARE_REAL(__strncpy_chk);
DECLARE_REAL(__stpcpy_chk);
DECLARE_REAL(__stpncpy_chk);
DECLARE_REAL(__strcat_chk);
DECLARE_REAL(__strncat_chk);
DECLARE_REAL(__wmemcpy_chk);
DECLARE_REAL(__wmemmove_chk);
DECLARE_REAL(__wmempcpy_chk);
DECLARE_REAL(__wmemset_chk);
DECLARE_REAL(__wcscpy_chk);
DECLARE_REAL(__wcsncpy_chk);
DECLARE_REAL(__wcscat_chk);
DECLARE_REAL(__wcsncat_chk);
DECLARE_REAL(__explicit_bzero_chk);
DECLARE_REAL(__vsprintf_chk);
DECLARE_REAL(__vsnprintf_chk);
DECLARE_REAL(__read_chk);
DECLARE_REAL(__pread_chk);
DECLARE_REAL(__pread64_chk);
DECLARE_REAL(__recv_chk);
DECLARE_REAL(__recvfrom_chk);
DECLARE_REAL(__fread_chk);
DECLARE_REAL(__fread_unlocked_chk);
DECLARE_REAL(__fgets_chk);
DECLARE_REAL(__fgets_unlocked_chk);
DECLARE_REAL(__realpath_chk);
DECLARE_REAL(__getcwd_chk);

/* Resolve everything up front so the hot paths never see a NULL slot. */
__attribute__((constructor)) static void libc_interpose_init(void)
{
#define R(name) (void)REAL_OR_NULL(name)
    R(memcpy); R(memmove); R(memset); R(explicit_bzero);
    R(strcpy); R(strncpy); R(strcat); R(strncat); R(memccpy); R(memfrob); R(strfry);
    R(wmemcpy); R(wmemmove); R(wmempcpy); R(wmemset);
    R(wcscpy); R(wcsncpy); R(wcscat); R(wcsncat); R(wcsdup);
    R(vsprintf);
    R(readv); R(preadv); R(preadv64); R(preadv2); R(preadv64v2);
    R(recv); R(recvfrom); R(recvmsg); R(recvmmsg);
    R(fread); R(fread_unlocked); R(fgets); R(fgets_unlocked); R(getdelim); R(pthread_once);
    R(qsort); R(qsort_r); R(realpath); R(getcwd); R(strtok); R(strsep);
    R(gmtime_r); R(localtime_r); R(clock_gettime); R(gettimeofday); R(time);
    R(__xpg_strerror_r);
    R(__memcpy_chk); R(__memmove_chk); R(__memset_chk); R(__mempcpy_chk);
    R(__strcpy_chk); R(__strncpy_chk); R(__stpcpy_chk); R(__stpncpy_chk);
    R(__strcat_chk); R(__strncat_chk);
    R(__wmemcpy_chk); R(__wmemmove_chk); R(__wmempcpy_chk); R(__wmemset_chk);
    R(__wcscpy_chk); R(__wcsncpy_chk); R(__wcscat_chk); R(__wcsncat_chk);
    R(__explicit_bzero_chk);
    R(__vsprintf_chk); R(__vsnprintf_chk);
    R(__read_chk); R(__pread_chk); R(__pread64_chk); R(__recv_chk); R(__recvfrom_chk);
    R(__fread_chk); R(__fread_unlocked_chk); R(__fgets_chk); R(__fgets_unlocked_chk);
    R(__realpath_chk); R(__getcwd_chk);
#undef R
}

/* Referenced by the runtime so the archive member is always linked. */
void libc_interpose_link_anchor(void) {}

/* ---- fallbacks for the resolution window ----------------------------------
 * Byte loops the compiler must not turn back into memcpy/memset calls: the
 * stores are volatile (GCC and clang leave those loops alone). */

#if defined(__clang__)
#define NO_LIBCALL __attribute__((noinline))
#else
#define NO_LIBCALL __attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
#endif

NO_LIBCALL static void *fb_memmove(void *d, const void *s, size_t n)
{
    volatile unsigned char *dd = d;
    const unsigned char *ss = s;
    if (dd < ss) {
        for (size_t i = 0; i < n; i++)
            dd[i] = ss[i];
    } else {
        for (size_t i = n; i > 0; i--)
            dd[i - 1] = ss[i - 1];
    }
    return d;
}

NO_LIBCALL static void *fb_memset(void *d, int c, size_t n)
{
    volatile unsigned char *dd = d;
    for (size_t i = 0; i < n; i++)
        dd[i] = (unsigned char)c;
    return d;
}

/* ---- helpers ---------------------------------------------------------- */

static void capture_iov(const struct iovec *iov, size_t cnt, size_t bytes)
{
    for (size_t i = 0; i < cnt && bytes > 0; i++) {
        size_t k = iov[i].iov_len < bytes ? iov[i].iov_len : bytes;
        mango_capture(iov[i].iov_base, k);
        bytes -= k;
    }
}

static size_t iov_total(const struct iovec *iov, size_t cnt)
{
    size_t t = 0;
    for (size_t i = 0; i < cnt; i++)
        t += iov[i].iov_len;
    return t;
}

/* After a successful recvmsg: the data (at most the buffers' room: with
 * MSG_TRUNC the result can exceed it), the address and control buffers as
 * their lengths were updated, and the msghdr whose length/flag fields the
 * kernel rewrote. name_room is msg_namelen before the call. */
static void capture_msghdr(struct msghdr *m, size_t bytes, socklen_t name_room)
{
    mango_capture(m, sizeof *m);
    size_t room = iov_total(m->msg_iov, m->msg_iovlen);
    capture_iov(m->msg_iov, m->msg_iovlen, bytes < room ? bytes : room);
    if (m->msg_name)
        mango_capture(m->msg_name, m->msg_namelen < name_room ? m->msg_namelen : name_room);
    if (m->msg_control)
        mango_capture(m->msg_control, m->msg_controllen);
}

/* fread returned r of n elements: a short read may also have stored part of
 * element r. */
static void capture_fread(void *p, size_t size, size_t n, size_t r)
{
    if (r < n)
        r++;
    mango_capture(p, r * size);
}

/* fgets succeeded: the data ends at the first '\n' (kept) and a NUL. With an
 * embedded NUL or no newline (EOF, full buffer), fall back to a superset. */
static void capture_fgets(char *s, int n)
{
    if (n <= 0)
        return;
    size_t l = strlen(s);
    if (l > 0 && s[l - 1] == '\n') {
        mango_capture(s, l + 1);
        return;
    }
    const char *nl = memchr(s, '\n', (size_t)n - 1);
    mango_capture(s, nl ? (size_t)(nl - s) + 2 : (size_t)n);
}

static void capture_str(const char *s)
{
    if (s)
        mango_capture(s, strlen(s) + 1);
}

static void capture_wcs(const wchar_t *s)
{
    if (s)
        mango_capture(s, (wcslen(s) + 1) * sizeof(wchar_t));
}

/* snprintf-style: r is the would-be length, n the buffer size. */
static void capture_snprintf(char *s, size_t n, int r)
{
    if (n == 0)
        return;
    if (r < 0)
        mango_capture(s, n);
    else
        mango_capture(s, ((size_t)r < n - 1 ? (size_t)r : n - 1) + 1);
}

/* sprintf-style: r >= 0 is the length written before the NUL. On an error
 * the buffer may hold a partial result; its extent is unknown (documented). */
static void capture_sprintf(char *s, int r)
{
    if (r >= 0)
        mango_capture(s, (size_t)r + 1);
    else
        capture_str(s);
}

static void capture_asprintf(char **p, int r)
{
    mango_capture(p, sizeof *p);
    if (r >= 0 && *p)
        mango_capture(*p, (size_t)r + 1);
}

/* ---- mem* -------------------------------------------------------------- */

void *memcpy(void *restrict d, const void *restrict s, size_t n)
{
    CAPTURE_COPY(d, s, n);
    typeof(memcpy) *f = REAL_OR_NULL(memcpy);
    if (unlikely(!f))
        return fb_memmove(d, s, n);
    return f(d, s, n);
}

void *memmove(void *d, const void *s, size_t n)
{
    CAPTURE_COPY(d, s, n);
    typeof(memmove) *f = REAL_OR_NULL(memmove);
    if (unlikely(!f))
        return fb_memmove(d, s, n);
    return f(d, s, n);
}

void *memset(void *d, int c, size_t n)
{
    CAPTURE(d, n);
    typeof(memset) *f = REAL_OR_NULL(memset);
    if (unlikely(!f))
        return fb_memset(d, c, n);
    return f(d, c, n);
}

void *mempcpy(void *restrict d, const void *restrict s, size_t n)
{
    CAPTURE(d, n);
    return __mempcpy(d, s, n);
}

void bcopy(const void *s, void *d, size_t n)
{
    memmove(d, s, n);
}

void bzero(void *d, size_t n)
{
    CAPTURE(d, n);
    __bzero(d, n);
}

void explicit_bzero(void *d, size_t n)
{
    REAL(explicit_bzero)(d, n);
    CAPTURE(d, n);
}

void *memccpy(void *restrict d, const void *restrict s, int c, size_t n)
{
    void *r = REAL(memccpy)(d, s, c, n);
    CAPTURE(d, r ? (size_t)((char *)r - (char *)d) : n);
    return r;
}

void *memfrob(void *s, size_t n)
{
    CAPTURE(s, n);
    return REAL(memfrob)(s, n);
}

/* ---- str* -------------------------------------------------------------- */

char *strcpy(char *restrict d, const char *restrict s)
{
    char *r = REAL(strcpy)(d, s);
    CAPTURE(d, strlen(d) + 1);
    return r;
}

char *stpcpy(char *restrict d, const char *restrict s)
{
    char *r = __stpcpy(d, s);
    CAPTURE(d, (size_t)(r - d) + 1);
    return r;
}

/* strncpy and stpncpy always write exactly n bytes (NUL padding). */
char *strncpy(char *restrict d, const char *restrict s, size_t n)
{
    CAPTURE(d, n);
    return REAL(strncpy)(d, s, n);
}

char *stpncpy(char *restrict d, const char *restrict s, size_t n)
{
    CAPTURE(d, n);
    return __stpncpy(d, s, n);
}

char *strcat(char *restrict d, const char *restrict s)
{
    bool on = mango_capture_active;
    size_t dl = on ? strlen(d) : 0;
    char *r = REAL(strcat)(d, s);
    if (unlikely(on))
        mango_capture(d + dl, strlen(d + dl) + 1);
    return r;
}

char *strncat(char *restrict d, const char *restrict s, size_t n)
{
    bool on = mango_capture_active;
    size_t dl = on ? strlen(d) : 0;
    char *r = REAL(strncat)(d, s, n);
    if (unlikely(on))
        mango_capture(d + dl, strlen(d + dl) + 1);
    return r;
}

char *strdup(const char *s)
{
    char *r = __strdup(s);
    if (unlikely(mango_capture_active))
        capture_str(r);
    return r;
}

char *strndup(const char *s, size_t n)
{
    char *r = __strndup(s, n);
    if (unlikely(mango_capture_active))
        capture_str(r);
    return r;
}

/* strtok/strtok_r/strsep write a NUL after the token (and the save pointer). */
char *strtok(char *restrict s, const char *restrict delim)
{
    char *r = REAL(strtok)(s, delim);
    if (unlikely(mango_capture_active))
        capture_str(r);
    return r;
}

char *strtok_r(char *restrict s, const char *restrict delim, char **restrict save)
{
    char *r = __strtok_r(s, delim, save);
    if (unlikely(mango_capture_active)) {
        mango_capture(save, sizeof *save);
        capture_str(r);
    }
    return r;
}

char *strsep(char **restrict sp, const char *restrict delim)
{
    char *r = REAL(strsep)(sp, delim);
    if (unlikely(mango_capture_active)) {
        mango_capture(sp, sizeof *sp);
        capture_str(r);
    }
    return r;
}

char *strfry(char *s)
{
    if (unlikely(mango_capture_active))
        mango_capture(s, strlen(s));
    return REAL(strfry)(s);
}

/* GNU strerror_r: writes buf only when it returns buf (unknown errors). */
char *strerror_r(int err, char *buf, size_t n)
{
    char *r = __strerror_r(err, buf, n);
    if (unlikely(mango_capture_active) && r == buf && n > 0)
        mango_capture(buf, strnlen(buf, n - 1) + 1);
    return r;
}

/* XSI strerror_r (what <string.h> selects without _GNU_SOURCE). */
int __xpg_strerror_r(int err, char *buf, size_t n)
{
    int r = REAL(__xpg_strerror_r)(err, buf, n);
    if (unlikely(mango_capture_active) && n > 0)
        mango_capture(buf, strnlen(buf, n - 1) + 1);
    return r;
}

/* ---- wide ------------------------------------------------------------- */

wchar_t *wmemcpy(wchar_t *restrict d, const wchar_t *restrict s, size_t n)
{
    CAPTURE_COPY(d, s, n * sizeof(wchar_t));
    return REAL(wmemcpy)(d, s, n);
}

wchar_t *wmemmove(wchar_t *d, const wchar_t *s, size_t n)
{
    CAPTURE_COPY(d, s, n * sizeof(wchar_t));
    return REAL(wmemmove)(d, s, n);
}

wchar_t *wmempcpy(wchar_t *restrict d, const wchar_t *restrict s, size_t n)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(wmempcpy)(d, s, n);
}

wchar_t *wmemset(wchar_t *d, wchar_t c, size_t n)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(wmemset)(d, c, n);
}

wchar_t *wcscpy(wchar_t *restrict d, const wchar_t *restrict s)
{
    wchar_t *r = REAL(wcscpy)(d, s);
    if (unlikely(mango_capture_active))
        capture_wcs(d);
    return r;
}

wchar_t *wcsncpy(wchar_t *restrict d, const wchar_t *restrict s, size_t n)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(wcsncpy)(d, s, n);
}

wchar_t *wcscat(wchar_t *restrict d, const wchar_t *restrict s)
{
    bool on = mango_capture_active;
    size_t dl = on ? wcslen(d) : 0;
    wchar_t *r = REAL(wcscat)(d, s);
    if (unlikely(on))
        capture_wcs(d + dl);
    return r;
}

wchar_t *wcsncat(wchar_t *restrict d, const wchar_t *restrict s, size_t n)
{
    bool on = mango_capture_active;
    size_t dl = on ? wcslen(d) : 0;
    wchar_t *r = REAL(wcsncat)(d, s, n);
    if (unlikely(on))
        capture_wcs(d + dl);
    return r;
}

wchar_t *wcsdup(const wchar_t *s)
{
    wchar_t *r = REAL(wcsdup)(s);
    if (unlikely(mango_capture_active))
        capture_wcs(r);
    return r;
}

/* ---- printf family ------------------------------------------------------ */

int vsprintf(char *restrict s, const char *restrict fmt, va_list ap)
{
    int r = REAL(vsprintf)(s, fmt, ap);
    if (unlikely(mango_capture_active))
        capture_sprintf(s, r);
    return r;
}

int sprintf(char *restrict s, const char *restrict fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = REAL(vsprintf)(s, fmt, ap);
    va_end(ap);
    if (unlikely(mango_capture_active))
        capture_sprintf(s, r);
    return r;
}

int vsnprintf(char *restrict s, size_t n, const char *restrict fmt, va_list ap)
{
    int r = __vsnprintf(s, n, fmt, ap);
    if (unlikely(mango_capture_active))
        capture_snprintf(s, n, r);
    return r;
}

int snprintf(char *restrict s, size_t n, const char *restrict fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = __vsnprintf(s, n, fmt, ap);
    va_end(ap);
    if (unlikely(mango_capture_active))
        capture_snprintf(s, n, r);
    return r;
}

/* asprintf is done here as measure + malloc + format: glibc 2.36's own
 * vasprintf grows an internal malloc'd buffer with internal copies and frees
 * it, which inside a command churns durable memory nobody captures (harmless
 * for recovery, but noise for the capture verifier). This way the result is
 * one allocation (durable inside a command) written by one captured call.
 * flag >= 0: the _chk variant (glibc's %n checks). */
static int format_alloc(char **p, int flag, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = flag < 0 ? __vsnprintf(NULL, 0, fmt, ap2)
                     : REAL(__vsnprintf_chk)(NULL, 0, flag, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return -1;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return -1;
    int m = flag < 0 ? __vsnprintf(s, (size_t)n + 1, fmt, ap)
                     : REAL(__vsnprintf_chk)(s, (size_t)n + 1, flag, (size_t)n + 1, fmt, ap);
    if (m < 0) {
        free(s);
        return -1;
    }
    *p = s;
    if (unlikely(mango_capture_active))
        capture_asprintf(p, m);
    return m;
}

int vasprintf(char **restrict p, const char *restrict fmt, va_list ap)
{
    return format_alloc(p, -1, fmt, ap);
}

int asprintf(char **restrict p, const char *restrict fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = format_alloc(p, -1, fmt, ap);
    va_end(ap);
    return r;
}

/* ---- read / recv ---------------------------------------------------------- */

ssize_t read(int fd, void *buf, size_t n)
{
    ssize_t r = __read(fd, buf, n);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r);
    return r;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    ssize_t r = __pread64(fd, buf, n, off);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r);
    return r;
}

ssize_t pread64(int fd, void *buf, size_t n, off64_t off)
{
    ssize_t r = __pread64(fd, buf, n, off);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r);
    return r;
}

ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
    ssize_t r = REAL(readv)(fd, iov, cnt);
    if (unlikely(mango_capture_active) && r > 0)
        capture_iov(iov, (size_t)cnt, (size_t)r);
    return r;
}

ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    ssize_t r = REAL(preadv)(fd, iov, cnt, off);
    if (unlikely(mango_capture_active) && r > 0)
        capture_iov(iov, (size_t)cnt, (size_t)r);
    return r;
}

ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    ssize_t r = REAL(preadv64)(fd, iov, cnt, off);
    if (unlikely(mango_capture_active) && r > 0)
        capture_iov(iov, (size_t)cnt, (size_t)r);
    return r;
}

ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    ssize_t r = REAL(preadv2)(fd, iov, cnt, off, flags);
    if (unlikely(mango_capture_active) && r > 0)
        capture_iov(iov, (size_t)cnt, (size_t)r);
    return r;
}

ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
    ssize_t r = REAL(preadv64v2)(fd, iov, cnt, off, flags);
    if (unlikely(mango_capture_active) && r > 0)
        capture_iov(iov, (size_t)cnt, (size_t)r);
    return r;
}

/* With MSG_TRUNC the result is the datagram's length, possibly more than n. */
ssize_t recv(int fd, void *buf, size_t n, int flags)
{
    ssize_t r = REAL(recv)(fd, buf, n, flags);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r < n ? (size_t)r : n);
    return r;
}

static void capture_from(struct sockaddr *addr, socklen_t *alen, socklen_t room)
{
    if (!alen)
        return;
    mango_capture(alen, sizeof *alen);
    if (addr)
        mango_capture(addr, *alen < room ? *alen : room);
}

ssize_t recvfrom(int fd, void *restrict buf, size_t n, int flags,
                 struct sockaddr *restrict addr, socklen_t *restrict alen)
{
    socklen_t room = alen ? *alen : 0;
    ssize_t r = REAL(recvfrom)(fd, buf, n, flags, addr, alen);
    if (unlikely(mango_capture_active) && r >= 0) {
        mango_capture(buf, (size_t)r < n ? (size_t)r : n);
        capture_from(addr, alen, room);
    }
    return r;
}

ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
    socklen_t room = m->msg_namelen;
    ssize_t r = REAL(recvmsg)(fd, m, flags);
    if (unlikely(mango_capture_active) && r >= 0)
        capture_msghdr(m, (size_t)r, room);
    return r;
}

int recvmmsg(int fd, struct mmsghdr *v, unsigned int vlen, int flags, struct timespec *timeout)
{
    /* msg_namelen of each entry before the call (bounded stack use). */
    socklen_t room[64];
    unsigned nr = vlen < 64 ? vlen : 64;
    for (unsigned i = 0; i < nr; i++)
        room[i] = v[i].msg_hdr.msg_namelen;
    int r = REAL(recvmmsg)(fd, v, vlen, flags, timeout);
    if (unlikely(mango_capture_active) && timeout)
        mango_capture(timeout, sizeof *timeout); /* the kernel writes the time left back */
    if (unlikely(mango_capture_active) && r > 0) {
        for (unsigned i = 0; i < (unsigned)r; i++) {
            mango_capture(&v[i], sizeof v[i]);
            capture_msghdr(&v[i].msg_hdr, v[i].msg_len,
                           i < nr ? room[i] : v[i].msg_hdr.msg_namelen);
        }
    }
    return r;
}

/* ---- stdio ---------------------------------------------------------------- */

size_t fread(void *restrict p, size_t size, size_t n, FILE *restrict fp)
{
    size_t r = REAL(fread)(p, size, n, fp);
    if (unlikely(mango_capture_active))
        capture_fread(p, size, n, r);
    return r;
}

size_t fread_unlocked(void *restrict p, size_t size, size_t n, FILE *restrict fp)
{
    size_t r = REAL(fread_unlocked)(p, size, n, fp);
    if (unlikely(mango_capture_active))
        capture_fread(p, size, n, r);
    return r;
}

char *fgets(char *restrict s, int n, FILE *restrict fp)
{
    char *r = REAL(fgets)(s, n, fp);
    if (unlikely(mango_capture_active)) {
        if (r)
            capture_fgets(s, n);
        else if (ferror(fp) && n > 0)
            mango_capture(s, (size_t)n); /* contents indeterminate */
    }
    return r;
}

char *fgets_unlocked(char *restrict s, int n, FILE *restrict fp)
{
    char *r = REAL(fgets_unlocked)(s, n, fp);
    if (unlikely(mango_capture_active)) {
        if (r)
            capture_fgets(s, n);
        else if (ferror(fp) && n > 0)
            mango_capture(s, (size_t)n);
    }
    return r;
}

/* The buffer may be (re)allocated: that goes through the split allocator
 * (durable inside a read-write command); the pointer and size variables are
 * written too. */
static ssize_t getdelim_captured(char **restrict lp, size_t *restrict n, int delim, FILE *restrict fp)
{
    ssize_t r = REAL(getdelim)(lp, n, delim, fp);
    if (unlikely(mango_capture_active)) {
        mango_capture(lp, sizeof *lp);
        mango_capture(n, sizeof *n);
        if (r > 0 && *lp)
            mango_capture(*lp, (size_t)r + 1);
        else if (*lp && *n > 0)
            mango_capture(*lp, 1); /* EOF/error may still store a NUL */
    }
    return r;
}

ssize_t getdelim(char **restrict lp, size_t *restrict n, int delim, FILE *restrict fp)
{
    return getdelim_captured(lp, n, delim, fp);
}

/* With optimisation on, <bits/stdio.h> defines getline() inline as a call
 * of __getdelim, which the program then calls directly: at -O1 and above a
 * getline() into durable memory was not captured (found by a review,
 * session 36). */
ssize_t __getdelim(char **restrict lp, size_t *restrict n, int delim, FILE *restrict fp)
{
    return getdelim_captured(lp, n, delim, fp);
}

ssize_t getline(char **restrict lp, size_t *restrict n, FILE *restrict fp)
{
    return getdelim_captured(lp, n, '\n', fp);
}

/* ---- pthread_once: the once flag, set by glibc ----------------------------- */

int pthread_once(pthread_once_t *once, void (*init)(void))
{
    int r = REAL(pthread_once)(once, init);
    if (unlikely(mango_capture_active))
        mango_capture(once, sizeof *once);
    return r;
}

/* ---- qsort: glibc's swaps are internal; capture the array afterwards ---- */

/* glibc sorts 1 KiB or more through a malloc'd buffer, which inside a
 * read-write command came from the durable heap: written uncaptured and
 * freed (the capture verifier counted 500 missed blocks for 16 000 bytes;
 * found by a review, session 36). It is the sort's own scratch: allocated
 * from glibc here, as outside a command. */
void qsort(void *base, size_t n, size_t size, __compar_fn_t cmp)
{
    bool durable = split_alloc_rw_thread;
    split_alloc_rw_thread = false;
    REAL(qsort)(base, n, size, cmp);
    split_alloc_rw_thread = durable;
    CAPTURE(base, n * size);
}

void qsort_r(void *base, size_t n, size_t size, __compar_d_fn_t cmp, void *arg)
{
    bool durable = split_alloc_rw_thread;
    split_alloc_rw_thread = false;
    REAL(qsort_r)(base, n, size, cmp, arg);
    split_alloc_rw_thread = durable;
    CAPTURE(base, n * size);
}

/* ---- paths ---------------------------------------------------------------- */

char *realpath(const char *restrict path, char *restrict resolved)
{
    char *r = REAL(realpath)(path, resolved);
    if (unlikely(mango_capture_active)) {
        if (r)
            capture_str(r);
        else if (resolved)
            mango_capture(resolved, PATH_MAX); /* may hold a partial path */
    }
    return r;
}

char *getcwd(char *buf, size_t n)
{
    char *r = REAL(getcwd)(buf, n);
    if (unlikely(mango_capture_active))
        capture_str(r);
    return r;
}

/* ---- time: results often go straight into durable records ---------------- */

struct tm *gmtime_r(const time_t *restrict t, struct tm *restrict tm)
{
    struct tm *r = REAL(gmtime_r)(t, tm);
    CAPTURE(tm, sizeof *tm);
    return r;
}

struct tm *localtime_r(const time_t *restrict t, struct tm *restrict tm)
{
    struct tm *r = REAL(localtime_r)(t, tm);
    CAPTURE(tm, sizeof *tm);
    return r;
}

int clock_gettime(clockid_t clk, struct timespec *ts)
{
    CAPTURE(ts, sizeof *ts);
    return REAL(clock_gettime)(clk, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    if (unlikely(mango_capture_active)) {
        mango_capture(tv, sizeof *tv); /* NULL is never durable: dropped */
        if (tz)
            mango_capture(tz, sizeof(struct timezone));
    }
    return REAL(gettimeofday)(tv, tz);
}

time_t time(time_t *t)
{
    if (t)
        CAPTURE(t, sizeof *t);
    return REAL(time)(t);
}

/* ---- _FORTIFY_SOURCE entry points: same captures, glibc does the check ---- */

void *__memcpy_chk(void *d, const void *s, size_t n, size_t dl)
{
    CAPTURE_COPY(d, s, n);
    return REAL(__memcpy_chk)(d, s, n, dl);
}

void *__memmove_chk(void *d, const void *s, size_t n, size_t dl)
{
    CAPTURE_COPY(d, s, n);
    return REAL(__memmove_chk)(d, s, n, dl);
}

void *__memset_chk(void *d, int c, size_t n, size_t dl)
{
    CAPTURE(d, n);
    return REAL(__memset_chk)(d, c, n, dl);
}

void *__mempcpy_chk(void *d, const void *s, size_t n, size_t dl)
{
    CAPTURE(d, n);
    return REAL(__mempcpy_chk)(d, s, n, dl);
}

char *__strcpy_chk(char *d, const char *s, size_t dl)
{
    char *r = REAL(__strcpy_chk)(d, s, dl);
    if (unlikely(mango_capture_active))
        capture_str(d);
    return r;
}

char *__stpcpy_chk(char *d, const char *s, size_t dl)
{
    char *r = REAL(__stpcpy_chk)(d, s, dl);
    CAPTURE(d, (size_t)(r - d) + 1);
    return r;
}

char *__strncpy_chk(char *d, const char *s, size_t n, size_t dl)
{
    CAPTURE(d, n);
    return REAL(__strncpy_chk)(d, s, n, dl);
}

char *__stpncpy_chk(char *d, const char *s, size_t n, size_t dl)
{
    CAPTURE(d, n);
    return REAL(__stpncpy_chk)(d, s, n, dl);
}

char *__strcat_chk(char *d, const char *s, size_t dl)
{
    bool on = mango_capture_active;
    size_t l = on ? strlen(d) : 0;
    char *r = REAL(__strcat_chk)(d, s, dl);
    if (unlikely(on))
        capture_str(d + l);
    return r;
}

char *__strncat_chk(char *d, const char *s, size_t n, size_t dl)
{
    bool on = mango_capture_active;
    size_t l = on ? strlen(d) : 0;
    char *r = REAL(__strncat_chk)(d, s, n, dl);
    if (unlikely(on))
        capture_str(d + l);
    return r;
}

wchar_t *__wmemcpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(__wmemcpy_chk)(d, s, n, dl);
}

wchar_t *__wmemmove_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(__wmemmove_chk)(d, s, n, dl);
}

wchar_t *__wmempcpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(__wmempcpy_chk)(d, s, n, dl);
}

wchar_t *__wmemset_chk(wchar_t *d, wchar_t c, size_t n, size_t dl)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(__wmemset_chk)(d, c, n, dl);
}

wchar_t *__wcscpy_chk(wchar_t *d, const wchar_t *s, size_t dl)
{
    wchar_t *r = REAL(__wcscpy_chk)(d, s, dl);
    if (unlikely(mango_capture_active))
        capture_wcs(d);
    return r;
}

wchar_t *__wcsncpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl)
{
    CAPTURE(d, n * sizeof(wchar_t));
    return REAL(__wcsncpy_chk)(d, s, n, dl);
}

wchar_t *__wcscat_chk(wchar_t *d, const wchar_t *s, size_t dl)
{
    bool on = mango_capture_active;
    size_t l = on ? wcslen(d) : 0;
    wchar_t *r = REAL(__wcscat_chk)(d, s, dl);
    if (unlikely(on))
        capture_wcs(d + l);
    return r;
}

wchar_t *__wcsncat_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl)
{
    bool on = mango_capture_active;
    size_t l = on ? wcslen(d) : 0;
    wchar_t *r = REAL(__wcsncat_chk)(d, s, n, dl);
    if (unlikely(on))
        capture_wcs(d + l);
    return r;
}

void __explicit_bzero_chk(void *d, size_t n, size_t dl)
{
    CAPTURE(d, n);
    REAL(__explicit_bzero_chk)(d, n, dl);
}

int __vsprintf_chk(char *s, int flag, size_t sl, const char *fmt, va_list ap)
{
    int r = REAL(__vsprintf_chk)(s, flag, sl, fmt, ap);
    if (unlikely(mango_capture_active))
        capture_sprintf(s, r);
    return r;
}

int __sprintf_chk(char *s, int flag, size_t sl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = REAL(__vsprintf_chk)(s, flag, sl, fmt, ap);
    va_end(ap);
    if (unlikely(mango_capture_active))
        capture_sprintf(s, r);
    return r;
}

int __vsnprintf_chk(char *s, size_t n, int flag, size_t sl, const char *fmt, va_list ap)
{
    int r = REAL(__vsnprintf_chk)(s, n, flag, sl, fmt, ap);
    if (unlikely(mango_capture_active))
        capture_snprintf(s, n, r);
    return r;
}

int __snprintf_chk(char *s, size_t n, int flag, size_t sl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = REAL(__vsnprintf_chk)(s, n, flag, sl, fmt, ap);
    va_end(ap);
    if (unlikely(mango_capture_active))
        capture_snprintf(s, n, r);
    return r;
}

int __vasprintf_chk(char **p, int flag, const char *fmt, va_list ap)
{
    return format_alloc(p, flag < 0 ? 0 : flag, fmt, ap);
}

int __asprintf_chk(char **p, int flag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = format_alloc(p, flag < 0 ? 0 : flag, fmt, ap);
    va_end(ap);
    return r;
}

ssize_t __read_chk(int fd, void *buf, size_t n, size_t bl)
{
    ssize_t r = REAL(__read_chk)(fd, buf, n, bl);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r);
    return r;
}

ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t bl)
{
    ssize_t r = REAL(__pread_chk)(fd, buf, n, off, bl);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r);
    return r;
}

ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t bl)
{
    ssize_t r = REAL(__pread64_chk)(fd, buf, n, off, bl);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r);
    return r;
}

ssize_t __recv_chk(int fd, void *buf, size_t n, size_t bl, int flags)
{
    ssize_t r = REAL(__recv_chk)(fd, buf, n, bl, flags);
    if (unlikely(mango_capture_active) && r > 0)
        mango_capture(buf, (size_t)r < n ? (size_t)r : n);
    return r;
}

ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t bl, int flags,
                       struct sockaddr *addr, socklen_t *alen)
{
    socklen_t room = alen ? *alen : 0;
    ssize_t r = REAL(__recvfrom_chk)(fd, buf, n, bl, flags, addr, alen);
    if (unlikely(mango_capture_active) && r >= 0) {
        mango_capture(buf, (size_t)r < n ? (size_t)r : n);
        capture_from(addr, alen, room);
    }
    return r;
}

size_t __fread_chk(void *p, size_t pl, size_t size, size_t n, FILE *fp)
{
    size_t r = REAL(__fread_chk)(p, pl, size, n, fp);
    if (unlikely(mango_capture_active))
        capture_fread(p, size, n, r);
    return r;
}

size_t __fread_unlocked_chk(void *p, size_t pl, size_t size, size_t n, FILE *fp)
{
    size_t r = REAL(__fread_unlocked_chk)(p, pl, size, n, fp);
    if (unlikely(mango_capture_active))
        capture_fread(p, size, n, r);
    return r;
}

char *__fgets_chk(char *s, size_t sl, int n, FILE *fp)
{
    char *r = REAL(__fgets_chk)(s, sl, n, fp);
    if (unlikely(mango_capture_active)) {
        if (r)
            capture_fgets(s, n);
        else if (ferror(fp) && n > 0)
            mango_capture(s, (size_t)n);
    }
    return r;
}

char *__fgets_unlocked_chk(char *s, size_t sl, int n, FILE *fp)
{
    char *r = REAL(__fgets_unlocked_chk)(s, sl, n, fp);
    if (unlikely(mango_capture_active)) {
        if (r)
            capture_fgets(s, n);
        else if (ferror(fp) && n > 0)
            mango_capture(s, (size_t)n);
    }
    return r;
}

char *__realpath_chk(const char *path, char *resolved, size_t rl)
{
    char *r = REAL(__realpath_chk)(path, resolved, rl);
    if (unlikely(mango_capture_active)) {
        if (r)
            capture_str(r);
        else if (resolved)
            mango_capture(resolved, rl < PATH_MAX ? rl : PATH_MAX);
    }
    return r;
}

char *__getcwd_chk(char *buf, size_t n, size_t bl)
{
    char *r = REAL(__getcwd_chk)(buf, n, bl);
    if (unlikely(mango_capture_active))
        capture_str(r);
    return r;
}
