/* corpus_c.c -- C store shapes inside read-write commands, plugin-built with no
 * capture calls; the verifier must find every changed durable byte captured. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

/* ---- escapes a review found (session 36), each captured now ---- */
static char *line;           /* .bss: getline's buffer pointer and size */
static size_t line_cap;
static FILE *line_file;      /* opened before the command: stdio's own state is not durable */
static void *aligned_block;  /* .bss: set by posix_memalign */
static _Atomic __int128 wide;/* 16 bytes: cmpxchg16b with -mcx16, libatomic without */
static va_list saved_ap;     /* .bss: va_copy's destination */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int sorted[4000];     /* 16 000 bytes: glibc's qsort takes a scratch buffer */
#if defined(__x86_64__)
static int masked[8] __attribute__((aligned(32)));
#endif

static void getline_durable(void) { (void)getline(&line, &line_cap, line_file); }

/* What <bits/stdio.h>'s inline getline() calls at -O1 and above (whether
 * it is inlined depends on the flags: called by name here). */
extern ssize_t __getdelim(char **lineptr, size_t *n, int delim, FILE *fp);
static void getdelim_durable(void) { (void)__getdelim(&line, &line_cap, '\n', line_file); }

static void memalign_durable(void) { (void)posix_memalign(&aligned_block, 64, 256); }

static void atomic_16_bytes(void) { atomic_store(&wide, (__int128)0x1234 * (sink + 1)); }

static void copy_va(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    va_copy(saved_ap, ap);
    va_end(ap);
}

static void va_copy_durable(void) { copy_va(2, 1L, 2L); }

static void once_init(void) { globals[40] = 40; }

static void once_durable(void) { (void)pthread_once(&once, once_init); }

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void large_qsort(void)
{
    for (int i = 0; i < 4000; i++)
        sorted[i] = (i * 7919) % 4000;
    qsort(sorted, 4000, sizeof sorted[0], cmp_int);
}

#if defined(__x86_64__)
static void sse2_maskmove(void)
{
    _mm_maskmoveu_si128(_mm_set1_epi8(7), _mm_set1_epi8((char)0x80), (char *)masked);
}

__attribute__((target("avx2"))) static void avx2_maskstore(void)
{
    _mm256_maskstore_epi32(masked, _mm256_set1_epi32(-1 - sink), _mm256_set1_epi32(77));
}
#endif

int main(void)
{
    /* The FILE and its buffer are transient (made before mango_init): stdio
     * would otherwise allocate the buffer at the first read, inside the
     * command, in the durable heap, and fill it uncaptured (docs/capture.md). */
    line_file = fopen("/proc/self/maps", "r");
    if (line_file)
        setvbuf(line_file, malloc(4096), _IOFBF, 4096);
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
    if (line_file) {
        corpus_expect("getline into a durable pointer", getline_durable, false);
        corpus_expect("__getdelim (the inline getline's call)", getdelim_durable, false);
    }
    corpus_expect("posix_memalign into a durable pointer", memalign_durable, false);
    corpus_expect("16-byte atomic store", atomic_16_bytes, false);
    corpus_expect("va_copy into a durable va_list", va_copy_durable, false);
    corpus_expect("pthread_once's flag", once_durable, false);
    corpus_expect("qsort of 16 000 bytes", large_qsort, false);
#if defined(__x86_64__)
    corpus_expect("_mm_maskmoveu_si128", sse2_maskmove, false);
    if (__builtin_cpu_supports("avx2"))
        corpus_expect("_mm256_maskstore_epi32", avx2_maskstore, false);
#endif
    return corpus_finish("corpus_c");
}
