/* corpus_c.c -- C store shapes inside read-write commands, plugin-built with no
 * capture calls; the verifier must find every changed durable byte captured. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "corpus_harness.h"

typedef struct rec {
    int a;
    double b;
    char name[24];
    unsigned flag : 1, kind : 3, level : 12;
} rec;

typedef long v4 __attribute__((vector_size(32)));

static rec *recs;              /* durable heap */
static v4 *vecs;
static char *big;
static _Atomic long *counters;
static long globals[64];       /* .bss */
static rec global_rec = {1, 2.0, "data", 1, 2, 3}; /* .data */
static void (*hook)(long);     /* .bss function pointer */
static volatile int sink;

static void alloc_all(void)
{
    recs = malloc(64 * sizeof *recs);
    vecs = aligned_alloc(32, 16 * sizeof *vecs);
    big = malloc(1 << 20);
    counters = calloc(8, sizeof *counters);
    memset(recs, 0, 64 * sizeof *recs);
    memset(vecs, 0, 16 * sizeof *vecs);
    memset(big, 0, 1 << 20);
}

static void scalars(void)
{
    for (int i = 0; i < 64; i++)
        globals[i] = i * 3 + sink;
    recs[3].a = 42;
    recs[5].b = 2.5;
}

static void vectors(void)
{
    for (int i = 0; i < 16; i++)
        vecs[i] = (v4){i, i + 1, i + 2, i + 3 + sink};
}

static void structs(void)
{
    rec r = {7, 7.5, "seven", 1, 5, 77};
    recs[7] = r;
    global_rec = r;
    strcpy(recs[8].name, "copied by strcpy");
}

static void bitfields(void)
{
    for (int i = 0; i < 64; i++) {
        recs[i].flag = (unsigned)i & 1;
        recs[i].kind = (unsigned)i & 7;
        recs[i].level = (unsigned)i * 5;
    }
}

static void big_memcpy(void)
{
    char *src = malloc(1 << 20); /* durable too: inside the command */
    for (int i = 0; i < (1 << 20); i += 4096)
        src[i] = (char)i;
    memcpy(big, src, 1 << 20);
    memmove(big + 100, big, 5000);
    free(src);
}

static void atomics(void)
{
    atomic_fetch_add(&counters[0], 5);
    long expected = 0;
    atomic_compare_exchange_strong(&counters[1], &expected, 9);
    atomic_exchange(&counters[2], 11);
    atomic_store(&counters[3], 13);
    __sync_fetch_and_or((long *)&counters[4], 0x10);
}

static void store_va(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        globals[i] = va_arg(ap, long);
    va_end(ap);
}

static void varargs(void) { store_va(5, 10L, 20L, 30L, 40L, 50L + sink); }

static void via_hook(long v) { recs[10].a = (int)v; }

static void function_pointers(void)
{
    hook = via_hook;
    void (*volatile h)(long) = hook;
    h(99);
}

/* The jmp_buf lives on the stack, as it normally does: it holds stack
 * addresses, never durable state (libc's setjmp writes it uncaptured). */
static void deep(jmp_buf *env, int n)
{
    recs[20 + n].a = n;
    if (n == 5)
        longjmp(*env, 1);
    deep(env, n + 1);
}

static void setjmp_longjmp(void)
{
    jmp_buf env;
    if (setjmp(env) == 0)
        deep(&env, 0);
    recs[30].a = 1; /* after the longjmp */
}

int main(void)
{
    corpus_start("c");
    corpus_expect("allocate (malloc, aligned_alloc, calloc)", alloc_all, false);
    corpus_expect("scalar stores (.bss and heap)", scalars, false);
    corpus_expect("vector stores", vectors, false);
    corpus_expect("struct copies (.data and heap)", structs, false);
    corpus_expect("bitfields", bitfields, false);
    corpus_expect("memcpy/memmove of 1 MiB", big_memcpy, false);
    corpus_expect("atomics (rmw, cmpxchg, xchg, store)", atomics, false);
    corpus_expect("varargs", varargs, false);
    corpus_expect("function pointers", function_pointers, false);
    corpus_expect("setjmp/longjmp", setjmp_longjmp, false);
    return corpus_finish("corpus_c");
}
