/* test_libc_interpose.c -- libc calls inside read-write commands are captured.
 *
 * Runs the real runtime (emulated mode, pool in /dev/shm). Each read-write
 * command calls one intercepted libc function on durable memory (malloc'd
 * inside the command, so in the durable heap; one case writes a .bss global)
 * WITHOUT any explicit mango_capture. Two independent proofs:
 *
 *   1. the capture verifier (verify_capture) diffs durable memory around each
 *      batch: no command may leave a changed block uncaptured;
 *   2. recovery: after mango_shutdown the test re-executes itself
 *      (`--verify POOL RECORDS`); the child recovers the pool at the same
 *      addresses and compares every region the parent snapshotted after its
 *      command. Only captured bytes survive recovery.
 *
 * A control command writes durable memory with volatile stores (which no
 * wrapper sees): the verifier must report it and recovery must lose it, or
 * the two proofs prove nothing.
 *
 * GCC expands memcpy(d, s, 64) and friends inline when it knows the size, and
 * rewrites strcpy/sprintf with constant arguments (it even folds
 * __strcpy_chk(d, "literal", 300) into inline moves); the test calls every
 * function through VF() (a pointer the compiler cannot see through) with
 * sizes it cannot see (L()), as real code with runtime sizes would.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "mango.h"

#define DURABLE_BASE 0x600000000000ULL

#include "check.h"

/* Opaque to the optimiser: no builtin expansion, no constant sizes. */
static void *launder(void *p)
{
    __asm__ volatile("" : "+r"(p));
    return p;
}
#define VF(f) ((typeof(&f))launder((void *)&f))
static size_t L(size_t x)
{
    __asm__ volatile("" : "+r"(x));
    return x;
}

/* glibc's fortified entry points (normally reached via _FORTIFY_SOURCE). */
extern void *__memcpy_chk(void *d, const void *s, size_t n, size_t dl);
extern void *__memmove_chk(void *d, const void *s, size_t n, size_t dl);
extern void *__memset_chk(void *d, int c, size_t n, size_t dl);
extern void *__mempcpy_chk(void *d, const void *s, size_t n, size_t dl);
extern char *__strcpy_chk(char *d, const char *s, size_t dl);
extern char *__stpcpy_chk(char *d, const char *s, size_t dl);
extern char *__strncpy_chk(char *d, const char *s, size_t n, size_t dl);
extern char *__strcat_chk(char *d, const char *s, size_t dl);
extern wchar_t *__wmemcpy_chk(wchar_t *d, const wchar_t *s, size_t n, size_t dl);
extern void __explicit_bzero_chk(void *d, size_t n, size_t dl);
extern int __sprintf_chk(char *s, int flag, size_t sl, const char *fmt, ...);
extern int __snprintf_chk(char *s, size_t n, int flag, size_t sl, const char *fmt, ...);
extern int __asprintf_chk(char **p, int flag, const char *fmt, ...);
extern ssize_t __read_chk(int fd, void *buf, size_t n, size_t bl);
extern ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t bl);
extern ssize_t __recv_chk(int fd, void *buf, size_t n, size_t bl, int flags);
extern size_t __fread_chk(void *p, size_t pl, size_t size, size_t n, FILE *fp);
extern char *__fgets_chk(char *s, size_t sl, int n, FILE *fp);
extern char *__realpath_chk(const char *path, char *resolved, size_t rl);
extern char *__getcwd_chk(char *buf, size_t n, size_t bl);
extern int __xpg_strerror_r(int err, char *buf, size_t n);

/* ---- records: what the parent expects the child to find ---------------- */

typedef struct rec {
    char name[48];
    uint64_t addr;
    uint32_t len;
    uint32_t control;
} rec;

#define MAX_REGS 16
typedef struct cmd {
    int op;
    bool ok;            /* functional result as expected, buffers durable */
    int nreg;
    struct {
        const char *name;
        void *p;
        size_t n;
        int control;
    } reg[MAX_REGS];
    void *prep[4];      /* buffers prepared by an earlier command */
} cmd;

static FILE *g_recs;
static unsigned g_nrecs;

/* Inputs prepared outside commands (transient). */
static int pipe_fd[2], stream_sv[2], dgram_sv[2], unix_sv[2];
static int data_fd;
static FILE *data_fp;
static char data_path[128], pool_path[128], recs_path[128], report_path[128];
static char g_bss_target[200]; /* written by one command: .bss is durable */

static const char text[] =
    "The quick brown fox jumps over the lazy dog; pack my box with five dozen "
    "liquor jugs. Sphinx of black quartz, judge my vow! 0123456789\n";

static void add(cmd *c, const char *name, void *p, size_t n)
{
    if (c->nreg < MAX_REGS) {
        c->reg[c->nreg].name = name;
        c->reg[c->nreg].p = p;
        c->reg[c->nreg].n = n;
        c->reg[c->nreg].control = 0;
        c->nreg++;
    } else {
        fprintf(stderr, "op %d: more than %d regions (%s not checked)\n", c->op, MAX_REGS, name);
        c->ok = false;
    }
}

static bool durable(const void *p) { return (uintptr_t)p >= DURABLE_BASE; }

/* A fresh durable buffer; the target starts 64 bytes in, away from the
 * allocator's header block. */
static char *dbuf(cmd *c, size_t n)
{
    char *p = malloc(n + 128);
    if (!p || !durable(p)) {
        c->ok = false;
        return NULL;
    }
    return p + 64;
}

static int icmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int icmp_r(const void *a, const void *b, void *arg)
{
    return *(int *)arg * icmp(a, b);
}

static int call_vsnprintf(char *s, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = VF(vsnprintf)(s, n, fmt, ap);
    va_end(ap);
    return r;
}

static int call_vsprintf(char *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = VF(vsprintf)(s, fmt, ap);
    va_end(ap);
    return r;
}

static int call_vasprintf(char **p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = VF(vasprintf)(p, fmt, ap);
    va_end(ap);
    return r;
}

#define EXPECT(cond)                                                             \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "op %d: %s failed\n", c->op, #cond);                 \
            c->ok = false;                                                       \
        }                                                                        \
    } while (0)

/* ---- the commands --------------------------------------------------------- */

enum {
    OP_MEM, OP_PREP_ZERO, OP_ZERO, OP_STR, OP_PREP_TOK, OP_TOK, OP_WIDE,
    OP_PRINTF, OP_ASPRINTF, OP_READ, OP_RECV, OP_RECVMSG, OP_STDIO, OP_GETLINE,
    OP_QSORT, OP_DUP, OP_PATH, OP_TIME, OP_CHK1, OP_CHK2, OP_CHK_IO, OP_BSS,
    OP_OUTPARAMS, OP_CONTROL, OP_COUNT
};

static const char *op_name[OP_COUNT] = {
    "mem", "prep_zero", "zero", "str", "prep_tok", "tok", "wide", "printf",
    "asprintf", "read", "recv", "recvmsg", "stdio", "getline", "qsort", "dup",
    "path", "time", "chk1", "chk2", "chk_io", "bss", "outparams", "control",
};

static void op_mem(cmd *c)
{
    char src[300];
    for (int i = 0; i < 300; i++)
        src[i] = (char)(i * 7 + 1);
    char *d;
    if ((d = dbuf(c, 300))) { VF(memcpy)(d, src, L(300)); add(c, "memcpy", d, 300); }
    if ((d = dbuf(c, 300))) { VF(memmove)(d, src + 3, L(280)); add(c, "memmove", d, 280); }
    if ((d = dbuf(c, 300))) { VF(memset)(d, 0x5a, L(250)); add(c, "memset", d, 250); }
    if ((d = dbuf(c, 300))) {
        char *e = VF(mempcpy)(d, src, L(200));
        EXPECT(e == d + 200);
        add(c, "mempcpy", d, 200);
    }
    if ((d = dbuf(c, 300))) { VF(bcopy)(src, d, L(190)); add(c, "bcopy", d, 190); }
    if ((d = dbuf(c, 300))) {
        void *e = VF(memccpy)(d, text, ';', L(sizeof text));
        EXPECT(e && ((char *)e)[-1] == ';');
        add(c, "memccpy", d, (size_t)((char *)e - d));
    }
}

/* Zeroing is only visible against non-zero contents written by an earlier
 * (captured) batch: fresh durable memory is already zero. */
static void op_prep_zero(cmd *c)
{
    for (int i = 0; i < 4; i++) {
        char *d = dbuf(c, 300);
        if (d)
            VF(memset)(d, 0xee, L(300));
        c->prep[i] = d;
    }
}

static void op_zero(cmd *c)
{
    if (!c->prep[0])
        return;
    VF(bzero)(c->prep[0], L(260)); add(c, "bzero", c->prep[0], 260);
    VF(explicit_bzero)(c->prep[1], L(270)); add(c, "explicit_bzero", c->prep[1], 270);
    VF(__explicit_bzero_chk)(c->prep[2], L(250), 300); add(c, "__explicit_bzero_chk", c->prep[2], 250);
    /* strncpy pads with NULs up to n */
    VF(strncpy)(c->prep[3], "short", L(240)); add(c, "strncpy(pad)", c->prep[3], 240);
}

static void op_str(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 300))) { VF(strcpy)(d, text); EXPECT(!strcmp(d, text)); add(c, "strcpy", d, sizeof text); }
    if ((d = dbuf(c, 300))) {
        char *e = VF(stpcpy)(d, text);
        EXPECT(e == d + sizeof text - 1);
        add(c, "stpcpy", d, sizeof text);
    }
    if ((d = dbuf(c, 300))) { VF(strncpy)(d, text, L(100)); add(c, "strncpy", d, 100); }
    if ((d = dbuf(c, 300))) { VF(stpncpy)(d, text, L(150)); add(c, "stpncpy", d, 150); }
    if ((d = dbuf(c, 400))) {
        /* strcat: the first half by memcpy, the appended half by strcat */
        VF(memcpy)(d, text, L(40));
        d[40] = 0; /* d[40] is 0 already (fresh heap): no uncaptured change */
        VF(strcat)(d, text);
        EXPECT(strlen(d) == 40 + sizeof text - 1);
        add(c, "strcat", d, 40 + sizeof text);
    }
    if ((d = dbuf(c, 400))) {
        VF(memcpy)(d, text, L(30));
        VF(strncat)(d, text + 10, L(100));
        EXPECT(strlen(d) == 130);
        add(c, "strncat", d, 131);
    }
}

static char tokbuf_src[] = "alpha beta,gamma delta,epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma";

static void op_prep_tok(cmd *c)
{
    for (int i = 0; i < 2; i++) {
        char *d = dbuf(c, 200);
        if (d)
            VF(strcpy)(d, tokbuf_src);
        c->prep[i] = d;
    }
    c->prep[2] = calloc(2, sizeof(char *)); /* durable save pointers */
}

static void op_tok(cmd *c)
{
    char **sv = c->prep[2];
    if (!sv || !c->prep[0])
        return;
    char *d = c->prep[0];
    int n = 0;
    for (char *t = VF(strtok_r)(d, " ,", &sv[0]); t; t = VF(strtok_r)(NULL, " ,", &sv[0]))
        n++;
    EXPECT(n == 18);
    add(c, "strtok_r", d, sizeof tokbuf_src);
    d = c->prep[1];
    sv[1] = NULL; /* already NULL (calloc): no change */
    VF(memcpy)(&sv[1], &d, L(sizeof d));
    n = 0;
    while (VF(strsep)(&sv[1], " ,"))
        n++;
    EXPECT(n == 18);
    add(c, "strsep", d, sizeof tokbuf_src);
    add(c, "strtok_r/strsep save", sv, 2 * sizeof(char *));
}

static void op_wide(cmd *c)
{
    wchar_t src[100];
    for (int i = 0; i < 100; i++)
        src[i] = L'A' + i % 26;
    src[99] = 0;
    wchar_t *d;
    if ((d = (wchar_t *)dbuf(c, 400))) { VF(wmemcpy)(d, src, L(90)); add(c, "wmemcpy", d, 90 * sizeof(wchar_t)); }
    if ((d = (wchar_t *)dbuf(c, 400))) { VF(wmemmove)(d, src + 1, L(80)); add(c, "wmemmove", d, 80 * sizeof(wchar_t)); }
    if ((d = (wchar_t *)dbuf(c, 400))) { VF(wmemset)(d, L'z', L(70)); add(c, "wmemset", d, 70 * sizeof(wchar_t)); }
    if ((d = (wchar_t *)dbuf(c, (99 + 49 + 1) * sizeof(wchar_t)))) {
        VF(wcscpy)(d, src);
        VF(wcscat)(d, src + 50);
        EXPECT(wcslen(d) == 99 + 49);
        add(c, "wcscpy+wcscat", d, (99 + 49 + 1) * sizeof(wchar_t));
    }
    if ((d = (wchar_t *)dbuf(c, 400))) {
        VF(__wmemcpy_chk)(d, src, L(60), 100);
        add(c, "__wmemcpy_chk", d, 60 * sizeof(wchar_t));
    }
}

static void op_printf(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 300))) {
        int r = VF(sprintf)(d, "%s|%d|%s", "sprintf", 12345, text);
        EXPECT(r > 100 && (size_t)r == strlen(d));
        add(c, "sprintf", d, (size_t)r + 1);
    }
    if ((d = dbuf(c, 300))) {
        int r = VF(snprintf)(d, L(90), "%s%s", text, text);
        EXPECT(r == 2 * (int)(sizeof text - 1) && strlen(d) == 89);
        add(c, "snprintf(truncated)", d, 90);
    }
    if ((d = dbuf(c, 300))) {
        int r = call_vsnprintf(d, L(300), "v:%s:%x", text, 0xbeef);
        add(c, "vsnprintf", d, (size_t)r + 1);
    }
    if ((d = dbuf(c, 300))) {
        int r = call_vsprintf(d, "vs:%s:%ld", text, 77L);
        add(c, "vsprintf", d, (size_t)r + 1);
    }
}

static void op_asprintf(cmd *c)
{
    char **pp = calloc(2, sizeof(char *));
    if (!pp || !durable(pp)) {
        c->ok = false;
        return;
    }
    int r = VF(asprintf)(&pp[0], "asprintf %s %d", text, 42);
    EXPECT(r > 0 && durable(pp[0]));
    add(c, "asprintf ptr", pp, 2 * sizeof(char *));
    add(c, "asprintf", pp[0], (size_t)r + 1);
    r = call_vasprintf(&pp[1], "vasprintf %s %s", text, text);
    EXPECT(r > 0 && durable(pp[1]));
    add(c, "vasprintf", pp[1], (size_t)r + 1);
}

static void op_read(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(read)(pipe_fd[0], d, L(100));
        EXPECT(r == 100);
        add(c, "read", d, 100);
    }
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(pread)(data_fd, d, L(150), 5);
        EXPECT(r == 150 && !memcmp(d, text + 5, 100));
        add(c, "pread", d, 150);
    }
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(pread64)(data_fd, d, L(120), 17);
        EXPECT(r == 120);
        add(c, "pread64", d, 120);
    }
    char *a = dbuf(c, 200), *b = dbuf(c, 200);
    if (a && b) {
        struct iovec iov[2] = {{a, 70}, {b, 90}};
        ssize_t r = VF(readv)(pipe_fd[0], iov, 2);
        EXPECT(r == 160);
        add(c, "readv[0]", a, 70);
        add(c, "readv[1]", b, 90);
    }
    a = dbuf(c, 200);
    b = dbuf(c, 200);
    if (a && b) {
        struct iovec iov[2] = {{a, 50}, {b, 100}};
        ssize_t r = VF(preadv)(data_fd, iov, 2, 3);
        EXPECT(r == 150);
        add(c, "preadv[0]", a, 50);
        add(c, "preadv[1]", b, 100);
    }
}

static void op_recv(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(recv)(stream_sv[0], d, L(110), 0);
        EXPECT(r == 110);
        add(c, "recv", d, 110);
    }
    d = dbuf(c, 300);
    struct sockaddr_storage *sa = calloc(1, sizeof *sa + sizeof(socklen_t));
    if (d && sa && durable(sa)) {
        socklen_t *len = (socklen_t *)(sa + 1);
        socklen_t room = sizeof *sa;
        VF(memcpy)(len, &room, L(sizeof room));
        ssize_t r = VF(recvfrom)(dgram_sv[0], d, L(300), 0, (struct sockaddr *)sa, len);
        EXPECT(r == 130);
        EXPECT(*len < sizeof *sa);
        add(c, "recvfrom", d, 130);
        add(c, "recvfrom addr", sa, *len);
        add(c, "recvfrom addrlen", len, sizeof *len);
    }
}

static void op_recvmsg(cmd *c)
{
    char *a = dbuf(c, 200), *b = dbuf(c, 200), *ctl = dbuf(c, 200);
    struct msghdr *m = (struct msghdr *)dbuf(c, sizeof(struct msghdr) + 2 * sizeof(struct iovec));
    if (!a || !b || !ctl || !m)
        return;
    struct iovec *iov = (struct iovec *)(m + 1);
    struct iovec iv[2] = {{a, 60}, {b, 100}};
    VF(memcpy)(iov, iv, L(sizeof iv));
    struct msghdr h = {0};
    h.msg_iov = iov;
    h.msg_iovlen = 2;
    h.msg_control = ctl;
    h.msg_controllen = 200;
    VF(memcpy)(m, &h, L(sizeof h));
    ssize_t r = VF(recvmsg)(unix_sv[0], m, 0);
    EXPECT(r == 140);
    EXPECT(m->msg_controllen >= CMSG_LEN(sizeof(int)));
    struct cmsghdr *cm = CMSG_FIRSTHDR(m);
    EXPECT(cm && cm->cmsg_type == SCM_RIGHTS);
    if (cm && cm->cmsg_type == SCM_RIGHTS) {
        int fd;
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
        close(fd);
    }
    add(c, "recvmsg iov[0]", a, 60);
    add(c, "recvmsg iov[1]", b, 80);
    add(c, "recvmsg control", ctl, m->msg_controllen);
    add(c, "recvmsg msghdr", m, sizeof *m);
}

static void op_stdio(cmd *c)
{
    char *d;
    rewind(data_fp);
    if ((d = dbuf(c, 300))) {
        size_t r = VF(fread)(d, 10, L(15), data_fp);
        EXPECT(r == 15 && !memcmp(d, text, sizeof text - 1));
        add(c, "fread", d, 150);
    }
    rewind(data_fp);
    if ((d = dbuf(c, 300))) {
        char *r = VF(fgets)(d, (int)L(300), data_fp);
        EXPECT(r == d && !strcmp(d, text));
        add(c, "fgets", d, sizeof text);
    }
    if ((d = dbuf(c, 300))) {
        char *r = VF(fgets)(d, (int)L(60), data_fp); /* no newline: truncated */
        EXPECT(r == d && strlen(d) == 59);
        add(c, "fgets(partial)", d, 60);
    }
}

static void op_getline(cmd *c)
{
    rewind(data_fp);
    struct { char *p; size_t n; char *q; size_t m; } *v = calloc(1, sizeof *v);
    if (!v || !durable(v)) {
        c->ok = false;
        return;
    }
    ssize_t r = VF(getline)(&v->p, &v->n, data_fp);
    EXPECT(r == (ssize_t)sizeof text - 1 && durable(v->p) && !strcmp(v->p, text));
    add(c, "getline", v->p, (size_t)r + 1);
    r = VF(getdelim)(&v->q, &v->m, ',', data_fp);
    EXPECT(r > 0 && durable(v->q));
    add(c, "getdelim", v->q, (size_t)r + 1);
    add(c, "getline vars", v, sizeof *v);
}

static void op_qsort(cmd *c)
{
    /* Filled with volatile stores (not captured), then sorted: the wrapper
     * captures the whole array. Under 1 KiB, glibc sorts with a stack temp. */
    int *a = (int *)dbuf(c, 200 * sizeof(int));
    int *b = (int *)dbuf(c, 200 * sizeof(int));
    if (!a || !b)
        return;
    volatile int *va = a, *vb = b;
    for (int i = 0; i < 200; i++) {
        va[i] = (i * 7919) % 200 + 1;
        vb[i] = (i * 104729) % 200 + 1;
    }
    VF(qsort)(a, L(200), sizeof(int), icmp);
    int desc = -1;
    VF(qsort_r)(b, L(200), sizeof(int), icmp_r, &desc);
    EXPECT(a[0] <= a[1] && a[198] <= a[199] && b[0] >= b[1]);
    add(c, "qsort", a, 200 * sizeof(int));
    add(c, "qsort_r", b, 200 * sizeof(int));
}

static void op_dup(cmd *c)
{
    char *s = VF(strdup)(text);
    EXPECT(s && durable(s) && !strcmp(s, text));
    if (s)
        add(c, "strdup", s, sizeof text);
    char *t = VF(strndup)(text, L(77));
    EXPECT(t && durable(t) && strlen(t) == 77);
    if (t)
        add(c, "strndup", t, 78);
    wchar_t w[60];
    for (int i = 0; i < 59; i++)
        w[i] = L'a' + i % 26;
    w[59] = 0;
    wchar_t *u = VF(wcsdup)(w);
    EXPECT(u && durable(u));
    if (u)
        add(c, "wcsdup", u, 60 * sizeof(wchar_t));
}

static void op_path(cmd *c)
{
    char *d;
    if ((d = dbuf(c, PATH_MAX))) {
        char *r = VF(realpath)(data_path, d);
        EXPECT(r == d);
        add(c, "realpath(buf)", d, strlen(d) + 1);
    }
    char *r = VF(realpath)("/dev/shm/../shm/.", NULL);
    EXPECT(r && durable(r));
    if (r)
        add(c, "realpath(NULL)", r, strlen(r) + 1);
    if ((d = dbuf(c, PATH_MAX))) {
        char *g = VF(getcwd)(d, L(PATH_MAX));
        EXPECT(g == d);
        add(c, "getcwd", d, strlen(d) + 1);
    }
    if ((d = dbuf(c, 200))) {
        char *e = VF(strerror_r)(123456, d, L(200)); /* unknown: written to d */
        EXPECT(e == d);
        add(c, "strerror_r", d, strlen(d) + 1);
    }
    if ((d = dbuf(c, 200))) {
        int e = VF(__xpg_strerror_r)(EINVAL, d, L(200));
        EXPECT(e == 0 && strlen(d) > 5);
        add(c, "__xpg_strerror_r", d, strlen(d) + 1);
    }
}

static void op_time(cmd *c)
{
    struct { struct timespec ts; struct timeval tv; struct tm a, b; time_t t; } *v = calloc(1, sizeof *v);
    if (!v || !durable(v)) {
        c->ok = false;
        return;
    }
    VF(clock_gettime)(CLOCK_REALTIME, &v->ts);
    VF(gettimeofday)(&v->tv, NULL);
    VF(gmtime_r)(&v->ts.tv_sec, &v->a);
    VF(localtime_r)(&v->ts.tv_sec, &v->b);
    VF(time)(&v->t);
    EXPECT(v->ts.tv_sec > 1600000000 && v->a.tm_year > 100);
    add(c, "time functions", v, sizeof *v);
}

/* Out-parameters (libc_interpose_outparams.c, session 38). */
static void op_outparams(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(readlink)("/proc/self/exe", d, L(300));
        EXPECT(r > 0 && r < 300);
        if (r > 0)
            add(c, "readlink", d, (size_t)r);
    }
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(readlinkat)(AT_FDCWD, "/proc/self/exe", d, L(300));
        EXPECT(r > 0 && r < 300);
        if (r > 0)
            add(c, "readlinkat", d, (size_t)r);
    }
    if ((d = dbuf(c, 300))) {
        EXPECT(VF(getrandom)(d, L(64), 0) == 64);
        add(c, "getrandom", d, 64);
    }
    if ((d = dbuf(c, 300))) {
        EXPECT(VF(inet_pton)(AF_INET6, "2001:db8::7", d) == 1);
        add(c, "inet_pton", d, 16);
    }
    if ((d = dbuf(c, 300))) {
        EXPECT(VF(inet_aton)("10.1.2.3", (struct in_addr *)d) != 0);
        add(c, "inet_aton", d, 4);
    }
    unsigned *seed = (unsigned *)dbuf(c, 64);
    if (seed) {
        unsigned s0 = 12345;
        VF(memcpy)(seed, &s0, L(sizeof s0));
        VF(rand_r)(seed);
        EXPECT(*seed != 12345);
        add(c, "rand_r", seed, sizeof *seed);
    }
    time_t t = 1700000000 + c->op;
    if ((d = dbuf(c, 300))) {
        EXPECT(VF(ctime_r)(&t, d) == d);
        add(c, "ctime_r", d, strlen(d) + 1);
    }
    struct tm tm;
    gmtime_r(&t, &tm);
    if ((d = dbuf(c, 300))) {
        EXPECT(VF(asctime_r)(&tm, d) == d);
        add(c, "asctime_r", d, strlen(d) + 1);
    }
    if ((d = dbuf(c, 300))) {
        size_t n = VF(strxfrm)(d, text, L(300));
        EXPECT(n < 300);
        add(c, "strxfrm", d, n + 1);
    }
    double *ip = (double *)dbuf(c, 64);
    if (ip) {
        EXPECT(VF(modf)(3.75, ip) == 0.75 && *ip == 3.0);
        add(c, "modf", ip, sizeof *ip);
    }
    float *fp = (float *)dbuf(c, 64);
    if (fp) {
        EXPECT(VF(modff)(2.5f, fp) == 0.5f && *fp == 2.0f);
        add(c, "modff", fp, sizeof *fp);
    }
    int *e = (int *)dbuf(c, 64);
    if (e) {
        VF(frexp)(48.0, e);
        EXPECT(*e == 6);
        add(c, "frexp", e, sizeof *e);
    }
    int *ef = (int *)dbuf(c, 64);
    if (ef) {
        VF(frexpf)(0.75f, ef);
        EXPECT(*ef == 0);
        add(c, "frexpf", ef, sizeof *ef);
    }
    struct sockaddr_storage *sa = (struct sockaddr_storage *)dbuf(c, sizeof *sa + sizeof(socklen_t));
    if (sa) {
        socklen_t *len = (socklen_t *)(sa + 1);
        socklen_t room = sizeof *sa;
        VF(memcpy)(len, &room, L(sizeof room));
        EXPECT(VF(getsockname)(unix_sv[0], (struct sockaddr *)sa, len) == 0);
        EXPECT(*len >= sizeof(sa_family_t) && sa->ss_family == AF_UNIX);
        add(c, "getsockname addr", sa, *len);
        add(c, "getsockname addrlen", len, sizeof *len);
    }
}

static void op_chk1(cmd *c)
{
    char src[300];
    for (int i = 0; i < 300; i++)
        src[i] = (char)(i * 3 + 2);
    char *d;
    if ((d = dbuf(c, 300))) { VF(__memcpy_chk)(d, src, L(210), 300); add(c, "__memcpy_chk", d, 210); }
    if ((d = dbuf(c, 300))) { VF(__memmove_chk)(d, src, L(220), 300); add(c, "__memmove_chk", d, 220); }
    if ((d = dbuf(c, 300))) { VF(__memset_chk)(d, 0x33, L(230), 300); add(c, "__memset_chk", d, 230); }
    if ((d = dbuf(c, 300))) { VF(__mempcpy_chk)(d, src, L(240), 300); add(c, "__mempcpy_chk", d, 240); }
    if ((d = dbuf(c, 300))) { VF(__strcpy_chk)(d, text, 300); add(c, "__strcpy_chk", d, sizeof text); }
    if ((d = dbuf(c, 300))) { VF(__stpcpy_chk)(d, text, 300); add(c, "__stpcpy_chk", d, sizeof text); }
    if ((d = dbuf(c, 300))) { VF(__strncpy_chk)(d, text, L(140), 300); add(c, "__strncpy_chk", d, 140); }
}

static void op_chk2(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 400))) {
        VF(__memcpy_chk)(d, text, L(45), 400);
        VF(__strcat_chk)(d, text, 400);
        add(c, "__strcat_chk", d, 45 + sizeof text);
    }
    if ((d = dbuf(c, 300))) {
        int r = VF(__sprintf_chk)(d, 1, 300, "chk %s %d", text, 9);
        add(c, "__sprintf_chk", d, (size_t)r + 1);
    }
    if ((d = dbuf(c, 300))) {
        VF(__snprintf_chk)(d, L(120), 1, 300, "%s%s", text, text);
        add(c, "__snprintf_chk", d, 120);
    }
    char **pp = calloc(1, sizeof(char *));
    if (pp && durable(pp)) {
        int r = VF(__asprintf_chk)(pp, 1, "chk asprintf %s", text);
        EXPECT(r > 0 && durable(*pp));
        add(c, "__asprintf_chk ptr", pp, sizeof *pp);
        add(c, "__asprintf_chk", *pp, (size_t)r + 1);
    }
    if ((d = dbuf(c, PATH_MAX))) {
        VF(__realpath_chk)(data_path, d, PATH_MAX);
        add(c, "__realpath_chk", d, strlen(d) + 1);
    }
    if ((d = dbuf(c, PATH_MAX))) {
        VF(__getcwd_chk)(d, L(PATH_MAX), PATH_MAX);
        add(c, "__getcwd_chk", d, strlen(d) + 1);
    }
}

static void op_chk_io(cmd *c)
{
    char *d;
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(__read_chk)(pipe_fd[0], d, L(100), 300);
        EXPECT(r == 100);
        add(c, "__read_chk", d, 100);
    }
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(__pread_chk)(data_fd, d, L(111), 9, 300);
        EXPECT(r == 111);
        add(c, "__pread_chk", d, 111);
    }
    if ((d = dbuf(c, 300))) {
        ssize_t r = VF(__recv_chk)(stream_sv[0], d, L(90), 300, 0);
        EXPECT(r == 90);
        add(c, "__recv_chk", d, 90);
    }
    rewind(data_fp);
    if ((d = dbuf(c, 300))) {
        size_t r = VF(__fread_chk)(d, 300, 1, L(133), data_fp);
        EXPECT(r == 133);
        add(c, "__fread_chk", d, 133);
    }
    rewind(data_fp);
    if ((d = dbuf(c, 300))) {
        char *r = VF(__fgets_chk)(d, 300, (int)L(300), data_fp);
        EXPECT(r == d);
        add(c, "__fgets_chk", d, sizeof text);
    }
}

static void op_bss(cmd *c)
{
    int r = VF(snprintf)(g_bss_target, L(sizeof g_bss_target), "bss:%s", text);
    add(c, "snprintf into .bss", g_bss_target, (size_t)r + 1 < sizeof g_bss_target ? (size_t)r + 1 : sizeof g_bss_target);
}

static void op_control(cmd *c)
{
    char *d = dbuf(c, 256);
    if (!d)
        return;
    volatile char *v = d;
    for (int i = 0; i < 256; i++)
        v[i] = (char)0xa5;
    add(c, "control (volatile stores)", d, 256);
    c->reg[c->nreg - 1].control = 1;
}

static void (*const ops[OP_COUNT])(cmd *) = {
    op_mem, op_prep_zero, op_zero, op_str, op_prep_tok, op_tok, op_wide,
    op_printf, op_asprintf, op_read, op_recv, op_recvmsg, op_stdio, op_getline,
    op_qsort, op_dup, op_path, op_time, op_chk1, op_chk2, op_chk_io, op_bss,
    op_outparams, op_control,
};

static bool is_read_only(void *ctx) { return false; }
static void process_request(void *ctx)
{
    cmd *c = ctx;
    ops[c->op](c);
}

static void config(mango_config *cfg)
{
    mango_config_default(cfg);
    cfg->pool_path = pool_path;
    cfg->pool_size = 64u << 20;
    cfg->log_size = 4u << 20;
    cfg->mode = MANGO_PERSIST_EMULATED;
}

/* ---- verify (the re-executed child) ------------------------------------- */

static int verify_child(void)
{
    mango_config cfg;
    config(&cfg);
    cfg.create_if_missing = false;
    mango_callbacks cb = {.is_read_only = is_read_only, .process_request = process_request};
    int st = mango_init(&cfg, &cb);
    if (st != MANGO_RECOVERED) {
        fprintf(stderr, "verify: mango_init returned %d (%s)\n", st, mango_last_error());
        return 100;
    }
    FILE *f = fopen(recs_path, "rb");
    if (!f)
        return 101;
    int bad = 0, n = 0;
    rec r;
    static unsigned char want[PATH_MAX + 1024];
    while (fread(&r, sizeof r, 1, f) == 1 && r.len <= sizeof want &&
           fread(want, 1, r.len, f) == r.len) {
        n++;
        const unsigned char *got = (const unsigned char *)(uintptr_t)r.addr;
        size_t diff = 0;
        for (size_t i = 0; i < r.len; i++)
            diff += got[i] != want[i];
        if (r.control) {
            /* Must be lost: otherwise the check cannot see a missed store. */
            if (diff < r.len / 2) {
                fprintf(stderr, "verify: control %s survived recovery (%zu/%u bytes differ)\n",
                        r.name, diff, r.len);
                bad++;
            } else {
                printf("verify: control lost as expected (%zu/%u bytes differ)\n", diff, r.len);
            }
        } else if (diff) {
            fprintf(stderr, "verify: %s at %#llx: %zu of %u bytes differ after recovery\n",
                    r.name, (unsigned long long)r.addr, diff, r.len);
            bad++;
        }
    }
    fclose(f);
    mango_shutdown();
    printf("verify: %d regions checked after recovery, %d bad\n", n, bad);
    return bad > 99 ? 99 : bad;
}

/* ---- main ----------------------------------------------------------------- */

static void write_all(int fd, const void *p, size_t n)
{
    const char *s = p;
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            abort();
        s += w;
        n -= (size_t)w;
    }
}

static void setup_inputs(void)
{
    snprintf(data_path, sizeof data_path, "/dev/shm/mango-test-interpose-%d.data", (int)getpid());
    data_fd = open(data_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    for (int i = 0; i < 4; i++)
        write_all(data_fd, text, sizeof text - 1);
    data_fp = fdopen(dup(data_fd), "r");
    /* A small transient buffer, so fread/fgets go through glibc's internal
     * copies; given now, because glibc would otherwise allocate it on the
     * first read -- inside a command, from the durable heap. */
    setvbuf(data_fp, malloc(64), _IOFBF, 64);
    tzset(); /* likewise: localtime_r's lazily loaded zone data */
    if (pipe(pipe_fd) || socketpair(AF_UNIX, SOCK_STREAM, 0, stream_sv) ||
        socketpair(AF_UNIX, SOCK_DGRAM, 0, dgram_sv) || socketpair(AF_UNIX, SOCK_STREAM, 0, unix_sv))
        abort();
    char big[1024];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)('a' + i % 23);
    write_all(pipe_fd[1], big, 100 + 160 + 100); /* read, readv, __read_chk */
    write_all(stream_sv[1], big + 5, 110 + 90);   /* recv, __recv_chk */
    write_all(dgram_sv[1], big + 9, 130);         /* recvfrom: one datagram */
    /* recvmsg: 140 bytes with an fd attached */
    struct iovec iov = {big + 11, 140};
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    int fd = data_fd;
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    if (sendmsg(unix_sv[1], &m, 0) != 140)
        abort();
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--verify")) {
        snprintf(pool_path, sizeof pool_path, "%s", argv[2]);
        snprintf(recs_path, sizeof recs_path, "%s", argv[3]);
        return verify_child();
    }

    /* Outside commands the wrappers are plain libc. */
    {
        char a[64], b[64];
        size_t n = L(40);
        memset(a, 'x', n);
        memcpy(b, a, n);
        CHECK(!mango_in_rw_command() && !memcmp(a, b, n));
        char *s = strdup("transient");
        CHECK(s && (uintptr_t)s < DURABLE_BASE);
        free(s);
    }

    int pid = (int)getpid();
    snprintf(pool_path, sizeof pool_path, "/dev/shm/mango-test-interpose-%d.pool", pid);
    snprintf(recs_path, sizeof recs_path, "/dev/shm/mango-test-interpose-%d.recs", pid);
    snprintf(report_path, sizeof report_path, "/dev/shm/mango-test-interpose-%d.verify", pid);
    unlink(pool_path);
    setenv("MANGO_VERIFY_REPORT", report_path, 1);
    setup_inputs();

    mango_config cfg;
    config(&cfg);
    cfg.verify_capture = true;
    mango_callbacks cb = {.is_read_only = is_read_only, .process_request = process_request};
    int st = mango_init(&cfg, &cb);
    CHECK(st == MANGO_FRESH);
    if (st != MANGO_FRESH) {
        fprintf(stderr, "mango_init: %d %s\n", st, mango_last_error());
        return 1;
    }
    g_recs = fopen(recs_path, "wb");
    CHECK(g_recs != NULL);

    void *prep[4] = {0};
    for (int op = 0; op < OP_COUNT; op++) {
        cmd c = {.op = op, .ok = true};
        memcpy(c.prep, prep, sizeof prep);
        mango_stats s0, s1;
        mango_get_stats(&s0);
        int rc = mango_client_cmd(&c);
        mango_get_stats(&s1);
        memcpy(prep, c.prep, sizeof prep);
        uint64_t missed = s1.verify_missed_blocks - s0.verify_missed_blocks;
        bool control = op == OP_CONTROL;
        if (rc != 0 || !c.ok || (control ? missed == 0 : missed != 0) ||
            (!control && op != OP_PREP_ZERO && op != OP_PREP_TOK && c.nreg == 0)) {
            check_failed++;
            fprintf(stderr, "FAIL op %s: rc=%d ok=%d missed_blocks=%llu regions=%d\n", op_name[op], rc,
                    c.ok, (unsigned long long)missed, c.nreg);
        } else {
            check_passed++;
        }
        CHECK(s1.verify_batches > s0.verify_batches);
        for (int i = 0; i < c.nreg; i++) {
            rec r = {0};
            snprintf(r.name, sizeof r.name, "%s", c.reg[i].name);
            r.addr = (uint64_t)(uintptr_t)c.reg[i].p;
            r.len = (uint32_t)c.reg[i].n;
            r.control = (uint32_t)c.reg[i].control;
            fwrite(&r, sizeof r, 1, g_recs);
            fwrite(c.reg[i].p, 1, r.len, g_recs);
            g_nrecs++;
        }
    }
    fclose(g_recs);
    CHECK(mango_shutdown() == 0);

    /* Recovery in a fresh process (same binary, ASLR already off: same
     * addresses). Its exit status is the number of bad regions. */
    pid_t child = fork();
    if (child == 0) {
        char *args[] = {"test_libc_interpose", "--verify", pool_path, recs_path, NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int ws = 0;
    waitpid(child, &ws, 0);
    int bad = WIFEXITED(ws) ? WEXITSTATUS(ws) : 200;
    if (bad) {
        fprintf(stderr, "FAIL recovery check: child status %d\n", bad);
        check_failed++;
    } else {
        check_passed += (int)g_nrecs; /* each region survived (or, the control, was lost) */
    }

    unlink(pool_path);
    unlink(recs_path);
    unlink(data_path);
    if (!check_failed)
        unlink(report_path);
    else
        fprintf(stderr, "verifier report kept in %s\n", report_path);
    return check_report("test_libc_interpose");
}
