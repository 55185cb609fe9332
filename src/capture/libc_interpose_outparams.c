/* libc_interpose_outparams.c -- capture what libc functions write through
 * small out-parameters: a socket's address (accept, accept4, getsockname,
 * getpeername), a symbolic link's target (readlink, readlinkat), random bytes
 * (getrandom), a parsed address (inet_pton, inet_aton), rand_r's seed, the
 * text of ctime_r/asctime_r, strxfrm's output, and libm's integer or
 * fractional parts (modf, modff, frexp, frexpf).
 *
 * The same mechanism as libc_interpose.c (see there): these definitions in
 * the executable take precedence over glibc's for calls made through the
 * PLT (also readlink's and readlinkat's fortified forms); each calls the
 * real function and, while a read-write command runs
 * (mango_capture_active), reports the bytes it wrote. A review found them
 * all missed (session 38). docs/capture.md lists what is still not
 * captured (sscanf's targets, swprintf, fmemopen's FILE, ...).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "capture/interpose_capture.h"

/* glibc's fortified entry points (declared by no public header). */
extern ssize_t __readlink_chk(const char *path, char *buf, size_t n, size_t buflen);
extern ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t n, size_t buflen);

/* Resolved up front by the constructor below, so that a first call from a
 * signal handler never runs dlsym (accept, getsockname, getpeername,
 * readlink(at) are async-signal-safe). */
DECLARE_REAL(accept);
DECLARE_REAL(accept4);
DECLARE_REAL(getsockname);
DECLARE_REAL(getpeername);
DECLARE_REAL(readlink);
DECLARE_REAL(readlinkat);
DECLARE_REAL(__readlink_chk);
DECLARE_REAL(__readlinkat_chk);
DECLARE_REAL(getrandom);
DECLARE_REAL(inet_pton);
DECLARE_REAL(inet_aton);
DECLARE_REAL(rand_r);
DECLARE_REAL(ctime_r);
DECLARE_REAL(asctime_r);
DECLARE_REAL(strxfrm);
DECLARE_REAL(modf);
DECLARE_REAL(modff);
DECLARE_REAL(frexp);
DECLARE_REAL(frexpf);

__attribute__((constructor)) static void outparams_init(void)
{
#define R(name) (void)REAL_OR_NULL(name)
    R(accept); R(accept4); R(getsockname); R(getpeername);
    R(readlink); R(readlinkat); R(__readlink_chk); R(__readlinkat_chk); R(getrandom);
    R(inet_pton); R(inet_aton); R(rand_r); R(ctime_r); R(asctime_r); R(strxfrm);
    R(modf); R(modff); R(frexp); R(frexpf);
#undef R
}

/* ---- sockets: the peer's or own address ---- */

/* *alen on return is the address's full size, which may exceed the room
 * the caller gave (then only `room` bytes were written). */
static void capture_address(struct sockaddr *addr, socklen_t *alen, socklen_t room)
{
    if (!alen)
        return;
    mango_capture(alen, sizeof *alen);
    if (addr)
        mango_capture(addr, *alen < room ? *alen : room);
}

int accept(int fd, struct sockaddr *restrict addr, socklen_t *restrict alen)
{
    socklen_t room = alen ? *alen : 0;
    int r = REAL(accept)(fd, addr, alen);
    if (unlikely(mango_capture_active) && r >= 0)
        capture_address(addr, alen, room);
    return r;
}

int accept4(int fd, struct sockaddr *restrict addr, socklen_t *restrict alen, int flags)
{
    socklen_t room = alen ? *alen : 0;
    int r = REAL(accept4)(fd, addr, alen, flags);
    if (unlikely(mango_capture_active) && r >= 0)
        capture_address(addr, alen, room);
    return r;
}

/* getsockname, getpeername: the address, when they return 0. */
#define ADDRESS_QUERY(name)                                                      \
    int name(int fd, struct sockaddr *restrict addr, socklen_t *restrict alen)   \
    {                                                                            \
        socklen_t room = alen ? *alen : 0;                                       \
        int r = REAL(name)(fd, addr, alen);                                      \
        if (unlikely(mango_capture_active) && r == 0)                            \
            capture_address(addr, alen, room);                                   \
        return r;                                                                \
    }
ADDRESS_QUERY(getsockname)
ADDRESS_QUERY(getpeername)

/* ---- file names, random bytes, addresses ---- */

ssize_t readlink(const char *restrict path, char *restrict buf, size_t n)
{
    ssize_t r = REAL(readlink)(path, buf, n);
    if (r > 0)
        CAPTURE(buf, (size_t)r);
    return r;
}

ssize_t readlinkat(int dirfd, const char *restrict path, char *restrict buf, size_t n)
{
    ssize_t r = REAL(readlinkat)(dirfd, path, buf, n);
    if (r > 0)
        CAPTURE(buf, (size_t)r);
    return r;
}

/* The fortified forms (_FORTIFY_SOURCE, when the buffer's size is known). */
ssize_t __readlink_chk(const char *path, char *buf, size_t n, size_t buflen)
{
    ssize_t r = REAL(__readlink_chk)(path, buf, n, buflen);
    if (r > 0)
        CAPTURE(buf, (size_t)r);
    return r;
}

ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t n, size_t buflen)
{
    ssize_t r = REAL(__readlinkat_chk)(dirfd, path, buf, n, buflen);
    if (r > 0)
        CAPTURE(buf, (size_t)r);
    return r;
}

ssize_t getrandom(void *buf, size_t n, unsigned int flags)
{
    ssize_t r = REAL(getrandom)(buf, n, flags);
    if (r > 0)
        CAPTURE(buf, (size_t)r);
    return r;
}

int inet_pton(int af, const char *restrict src, void *restrict dst)
{
    int r = REAL(inet_pton)(af, src, dst);
    if (r == 1)
        CAPTURE(dst, af == AF_INET6 ? sizeof(struct in6_addr) : sizeof(struct in_addr));
    return r;
}

int inet_aton(const char *src, struct in_addr *dst)
{
    int r = REAL(inet_aton)(src, dst);
    if (r != 0 && dst)
        CAPTURE(dst, sizeof *dst);
    return r;
}

/* ---- rand_r's seed, time as text, collation ---- */

int rand_r(unsigned int *seed)
{
    int r = REAL(rand_r)(seed);
    CAPTURE(seed, sizeof *seed);
    return r;
}

char *ctime_r(const time_t *restrict t, char *restrict buf)
{
    char *r = REAL(ctime_r)(t, buf);
    if (r)
        CAPTURE(buf, strlen(buf) + 1);
    return r;
}

char *asctime_r(const struct tm *restrict tm, char *restrict buf)
{
    char *r = REAL(asctime_r)(tm, buf);
    if (r)
        CAPTURE(buf, strlen(buf) + 1);
    return r;
}

/* The transformed string and its NUL when it fits (return < n); when it does
 * not, the contents are unspecified: all n bytes. */
size_t strxfrm(char *restrict dest, const char *restrict src, size_t n)
{
    size_t r = REAL(strxfrm)(dest, src, n);
    if (n)
        CAPTURE(dest, r < n ? r + 1 : n);
    return r;
}

/* ---- libm's second results ---- */

/* ret name(ret x, out_t *out): the result, and a second one through out. */
#define SECOND_RESULT(ret, name, out_t)                                          \
    ret name(ret x, out_t *out)                                                  \
    {                                                                            \
        ret r = REAL(name)(x, out);                                              \
        CAPTURE(out, sizeof *out);                                               \
        return r;                                                                \
    }
SECOND_RESULT(double, modf, double)
SECOND_RESULT(float, modff, float)
SECOND_RESULT(double, frexp, int)
SECOND_RESULT(float, frexpf, int)

/* Referenced by mango_init so this file is always linked in. */
void libc_interpose_outparams_link_anchor(void) {}
