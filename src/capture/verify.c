/* verify.c -- the capture verifier (see verify.h). Owns: the shadow snapshot
 * of durable memory taken at batch begin, the diff against it at batch end,
 * the lookup of captured masks, the symbol table that names missed addresses
 * and tells the runtime's own globals apart, the miss report and its counters,
 * and (MANGO_VERIFY_PAUSED=ignore) the copy of .data/.bss taken when a batch
 * pauses, whose changed bytes are taken into the snapshot when it resumes.
 *
 * Everything here gets its memory from mmap: the runtime interposes malloc,
 * and on the combiner thread malloc is the durable heap. Reports are formatted
 * on the stack and written with write(2).
 */
#define _GNU_SOURCE
#include "capture/verify.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "capture/capture.h"
#include "mango.h"
#include "runtime/env_number.h"
#include "runtime/error.h"

#define PAGE 4096u

typedef struct vrange {
    uintptr_t lo, hi;
    unsigned char *shadow; /* copy of [lo, lo + snap) taken at batch begin */
    size_t snap;
    bool heap;
} vrange;

typedef struct vsym {
    uintptr_t lo, hi;
    const char *name, *file; /* point into the mapped executable */
    bool internal;           /* the runtime's own (or a library's copy-relocated) global */
} vsym;

static struct {
    bool enabled, abort_on_miss, verbose;
    bool ignore_paused;   /* MANGO_VERIFY_PAUSED=ignore */
    bool in_batch, paused;
    unsigned char *pause_copy; /* the non-heap ranges at the last pause */
    size_t pause_copy_size;
    uint64_t paused_bytes; /* bytes of .data/.bss written while paused, not reported */
    int fd;
    bool own_fd;
    unsigned max_lines; /* miss lines per batch; 0 = all */
    unsigned n;
    vrange r[CAPTURE_MAX_RANGES];
    unsigned char *shadow;
    size_t shadow_size;
    uint64_t heap_hwm; /* highest carved top seen: beyond it the heap was never written */
    unsigned ncmds;
    uint64_t batches, missed;
    /* captured blocks of the current batch: open addressing, key 0 = empty */
    uint64_t *tkey;
    uint32_t *tmask;
    size_t tcap;
    /* symbols of the executable that lie in the data ranges, sorted by lo */
    vsym *syms;
    size_t nsyms, syms_bytes;
    void *elf;
    size_t elf_size;
} V = {.fd = 2};

/* The runtime's source files (src/<component>/<file>.c). Their globals live in
 * the executable's .bss next to the application's and change during batches
 * (counters, backend state, the deferred-free queue); they are not durable
 * state. test_capture_verify checks that this list covers src/. */
/* MANGO_VERIFY_IGNORE: comma-separated NAME or FILE:NAME of transient globals
 * that other threads write while a batch runs (stop flags, counters). */
static bool user_ignored(const char *name, const char *file)
{
    const char *list = getenv("MANGO_VERIFY_IGNORE");
    size_t nl = strlen(name);
    for (const char *t = list; t && *t;) {
        const char *e = strchr(t, ',');
        size_t tl = e ? (size_t)(e - t) : strlen(t);
        const char *colon = memchr(t, ':', tl);
        if (colon) {
            size_t fl = (size_t)(colon - t);
            if (file && strlen(file) == fl && memcmp(file, t, fl) == 0 &&
                tl - fl - 1 == nl && memcmp(colon + 1, name, nl) == 0)
                return true;
        } else if (tl == nl && memcmp(t, name, nl) == 0) {
            return true;
        }
        t = e ? e + 1 : NULL;
    }
    return false;
}

static const char *const runtime_files[] = {
    "backend.c",        "big_batch.c",    "capture.c",         "commit_pipeline.c", "crc32c.c",
    "dedup_set.c",      "disks.c",        "durable_heap.c", "error.c",           "flat_combining.c",  "heap_preview.c",
    "layout.c",         "libc_interpose.c", "libc_interpose_outparams.c", "persist.c",       "pool.c",
    "read_deps.c",      "recovery.c",     "redo_log.c",        "rpc_server.c",      "runtime.c",
    "scratch.c",        "signal_interpose.c", "snapshot.c",
    "split_alloc.c",
    "trace.c",          "verify.c",       "libstdcxx_interpose.cpp", "string_instantiation.cpp",
};

#define N_RUNTIME_FILES (sizeof runtime_files / sizeof runtime_files[0])

/* Index of `name`'s base name in runtime_files; -1 if it is not one. */
static int runtime_file_index(const char *name)
{
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    for (size_t i = 0; i < N_RUNTIME_FILES; i++)
        if (strcmp(b, runtime_files[i]) == 0)
            return (int)i;
    return -1;
}

bool capture_verify_is_runtime_file(const char *name) { return runtime_file_index(name) >= 0; }

bool capture_verify_enabled(void) { return V.enabled; }

void capture_verify_stats(uint64_t *batches, uint64_t *missed_blocks)
{
    *batches = V.batches;
    *missed_blocks = V.missed;
}

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    for (int off = 0; off < n;) {
        ssize_t w = write(V.fd, buf + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        off += (int)w;
    }
}

static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- symbols ---------------------------------------------------------- */

static int main_bias_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    *(uintptr_t *)arg = (uintptr_t)info->dlpi_addr;
    return 1; /* the first object is the executable */
}

static bool in_ranges(uintptr_t lo, uintptr_t hi)
{
    for (unsigned i = 0; i < V.n; i++)
        if (!V.r[i].heap && lo < V.r[i].hi && hi > V.r[i].lo)
            return true;
    return false;
}

static int sym_cmp(const void *a, const void *b)
{
    const vsym *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void unload_symbols(void)
{
    if (V.syms)
        munmap(V.syms, V.syms_bytes);
    if (V.elf)
        munmap(V.elf, V.elf_size);
    V.syms = NULL;
    V.elf = NULL;
    V.nsyms = 0;
}

/* Read the executable's .symtab: every object symbol inside a data range.
 * Local symbols follow the STT_FILE symbol of their source file. */
static void load_symbols(void)
{
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        close(fd);
        return;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return;
    V.elf = map;
    V.elf_size = (size_t)st.st_size;
    const unsigned char *base = map;
    const Elf64_Ehdr *eh = map;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shoff == 0 || eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > V.elf_size)
        goto none;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(base + eh->e_shoff);
    const Elf64_Shdr *symtab = NULL;
    for (unsigned i = 0; i < eh->e_shnum; i++)
        if (sh[i].sh_type == SHT_SYMTAB)
            symtab = &sh[i];
    const char *shstr = NULL;
    if (eh->e_shstrndx < eh->e_shnum && sh[eh->e_shstrndx].sh_offset + sh[eh->e_shstrndx].sh_size <= V.elf_size)
        shstr = (const char *)(base + sh[eh->e_shstrndx].sh_offset);
    const Elf64_Sym *sym = NULL;
    size_t nsym = 0;
    const char *str = NULL;
    size_t strsz = 0;
    if (symtab && symtab->sh_link < eh->e_shnum) {
        const Elf64_Shdr *strsh = &sh[symtab->sh_link];
        if (symtab->sh_offset + symtab->sh_size <= V.elf_size &&
            strsh->sh_offset + strsh->sh_size <= V.elf_size) {
            sym = (const Elf64_Sym *)(base + symtab->sh_offset);
            nsym = symtab->sh_size / sizeof(Elf64_Sym);
            str = (const char *)(base + strsh->sh_offset);
            strsz = strsh->sh_size;
        }
    }
    uintptr_t bias = 0;
    dl_iterate_phdr(main_bias_cb, &bias);

    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0;
        /* The dynamic linker's tables in the writable segment (.got.plt is
         * written by lazy binding on a function's first call, .got/.dynamic
         * at load): pseudo-symbols, never application state. */
        for (unsigned i = 0; shstr && i < eh->e_shnum; i++) {
            const char *name = shstr + sh[i].sh_name;
            if (!(sh[i].sh_flags & SHF_ALLOC) || sh[i].sh_size == 0 ||
                (strncmp(name, ".got", 4) != 0 && strcmp(name, ".dynamic") != 0))
                continue;
            uintptr_t lo = bias + sh[i].sh_addr, hi = lo + sh[i].sh_size;
            if (!in_ranges(lo, hi))
                continue;
            if (pass == 1)
                V.syms[k] = (vsym){.lo = lo, .hi = hi, .name = name, .file = "dynamic linker", .internal = true};
            k++;
        }
        /* An application file may share a runtime file's base name (its
         * own pool.c): STT_FILE holds base names only, and matching them
         * alone left that file's static globals unverified (found by a
         * review, session 38). The runtime archive is linked after the
         * program's objects (mango-cc, CMake), so of several STT_FILE
         * entries with one name the runtime's is the last. */
        size_t last_of[N_RUNTIME_FILES];
        for (size_t r = 0; r < N_RUNTIME_FILES; r++)
            last_of[r] = SIZE_MAX;
        for (size_t i = 0; i < nsym; i++)
            if (ELF64_ST_TYPE(sym[i].st_info) == STT_FILE && sym[i].st_name < strsz) {
                int r = runtime_file_index(str + sym[i].st_name);
                if (r >= 0)
                    last_of[r] = i;
            }
        const char *file = NULL;
        bool runtime_file = false;
        for (size_t i = 0; i < nsym; i++) {
            const Elf64_Sym *s = &sym[i];
            if (s->st_name >= strsz)
                continue;
            const char *name = str + s->st_name;
            int type = ELF64_ST_TYPE(s->st_info);
            if (type == STT_FILE) {
                file = name;
                int r = runtime_file_index(name);
                runtime_file = r >= 0 && last_of[r] == i;
                continue;
            }
            if (ELF64_ST_BIND(s->st_info) != STB_LOCAL) {
                file = NULL; /* globals are not grouped by file */
                runtime_file = false;
            }
            if ((type != STT_OBJECT && type != STT_NOTYPE) || s->st_size == 0 ||
                s->st_shndx == SHN_UNDEF || s->st_shndx >= SHN_LORESERVE)
                continue;
            uintptr_t lo = bias + s->st_value, hi = lo + s->st_size;
            if (!in_ranges(lo, hi))
                continue;
            if (pass == 1) {
                vsym *v = &V.syms[k];
                v->lo = lo;
                v->hi = hi;
                v->name = name;
                v->file = file;
                /* name@VERSION: a library global copy-relocated into the
                 * executable (stdout, optind, environ): not application state. */
                v->internal = runtime_file || strchr(name, '@') ||
                              user_ignored(name, file);
            }
            k++;
        }
        if (pass == 0) {
            if (k == 0)
                break;
            V.syms_bytes = (k * sizeof(vsym) + PAGE - 1) & ~(size_t)(PAGE - 1);
            V.syms = mmap(NULL, V.syms_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (V.syms == MAP_FAILED) {
                V.syms = NULL;
                goto none;
            }
        } else {
            V.nsyms = k;
        }
    }
    /* Not in a batch: qsort's scratch memory, if any, is transient. */
    if (V.syms)
        qsort(V.syms, V.nsyms, sizeof(vsym), sym_cmp);
    if (nsym)
        return;
none:
    if (!V.syms)
        unload_symbols();
    report("mango-verify: note: no symbol table in /proc/self/exe; the runtime's own "
           "globals in .data/.bss cannot be told apart and may be reported as misses\n");
}

/* First symbol with hi > addr (symbols do not overlap in practice). */
static size_t sym_first_after(uintptr_t addr)
{
    size_t a = 0, b = V.nsyms;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (V.syms[m].hi <= addr)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* Bytes of the block that belong to the runtime's own globals. */
static uint32_t internal_mask(uintptr_t block)
{
    uint32_t m = 0;
    for (size_t i = sym_first_after(block); i < V.nsyms && V.syms[i].lo < block + DEDUP_BLOCK; i++) {
        if (!V.syms[i].internal)
            continue;
        uintptr_t a = V.syms[i].lo > block ? V.syms[i].lo - block : 0;
        uintptr_t b = V.syms[i].hi < block + DEDUP_BLOCK ? V.syms[i].hi - block : DEDUP_BLOCK;
        m |= (uint32_t)(((1ull << b) - 1) & ~((1ull << a) - 1));
    }
    return m;
}

static const vsym *sym_at(uintptr_t addr)
{
    size_t i = sym_first_after(addr);
    return i < V.nsyms && V.syms[i].lo <= addr ? &V.syms[i] : NULL;
}

/* ---- the heap ---------------------------------------------------------- */

static const vrange *heap_range(void)
{
    for (unsigned i = 0; i < V.n; i++)
        if (V.r[i].heap)
            return &V.r[i];
    return NULL;
}

/* The carved extent (bytes from the heap base); 0 before the root exists. */
static uint64_t heap_top(const vrange *h)
{
    const dheap_root *root = (const dheap_root *)h->lo;
    uint64_t top = __atomic_load_n(&root->top, __ATOMIC_RELAXED);
    uint64_t cap = h->hi - h->lo;
    return top > cap ? cap : top;
}

static void describe_heap(char *out, size_t len, const vrange *h, uintptr_t addr)
{
    uint64_t off = addr - h->lo;
    static const struct {
        size_t off, size;
        const char *name;
    } fields[] = {
        {offsetof(dheap_root, magic), 8, "magic"},
        {offsetof(dheap_root, version), 8, "version"},
        {offsetof(dheap_root, capacity), 8, "capacity"},
        {offsetof(dheap_root, top), 8, "top"},
        {offsetof(dheap_root, allocated), 8, "allocated"},
        {offsetof(dheap_root, large_free), 8, "large_free"},
        {offsetof(dheap_root, inuse_chunks), 8, "inuse_chunks"},
        {offsetof(dheap_root, hwm), 8, "hwm"},
        {offsetof(dheap_root, slab_map), 8, "slab_map"},
        {offsetof(dheap_root, slab_objects), 8, "slab_objects"},
        {offsetof(dheap_root, hole), 8, "hole"},
    };
    if (off < sizeof(dheap_root)) {
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            if (off >= fields[i].off && off < fields[i].off + fields[i].size) {
                snprintf(out, len, "durable heap +%#llx (allocator root: dheap_root.%s)",
                         (unsigned long long)off, fields[i].name);
                return;
            }
        static const struct {
            size_t off, size;
            const char *name;
        } arrays[] = {
            {offsetof(dheap_root, small_free), sizeof((dheap_root *)0)->small_free, "small_free"},
            {offsetof(dheap_root, slab_free), sizeof((dheap_root *)0)->slab_free, "slab_free"},
            {offsetof(dheap_root, slab_next), sizeof((dheap_root *)0)->slab_next, "slab_next"},
        };
        for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
            if (off >= arrays[i].off && off < arrays[i].off + arrays[i].size) {
                snprintf(out, len, "durable heap +%#llx (allocator root: dheap_root.%s[%llu])",
                         (unsigned long long)off, arrays[i].name,
                         (unsigned long long)((off - arrays[i].off) / 8));
                return;
            }
    }
    snprintf(out, len, "durable heap +%#llx", (unsigned long long)off);
}

static void describe_data(char *out, size_t len, uintptr_t addr)
{
    const vsym *s = V.syms ? sym_at(addr) : NULL;
    if (s)
        snprintf(out, len, ".data/.bss: %s+%llu (%s)", s->name, (unsigned long long)(addr - s->lo),
                 s->file ? s->file : "global");
    else
        snprintf(out, len, ".data/.bss (no symbol)");
}

/* ---- setup / shutdown -------------------------------------------------- */

int capture_verify_setup(bool want, uintptr_t heap_lo, uintptr_t heap_hi)
{
    capture_verify_shutdown();
    V.batches = V.missed = V.paused_bytes = 0;
    V.in_batch = V.paused = false;
    V.enabled = want || env_on("MANGO_VERIFY_CAPTURE");
    if (!V.enabled)
        return MANGO_OK;
    const char *pz = getenv("MANGO_VERIFY_PAUSED");
    if (pz && *pz && strcmp(pz, "ignore") != 0 && strcmp(pz, "report") != 0) {
        V.enabled = false;
        return mango_error(MANGO_EINVAL, "MANGO_VERIFY_PAUSED=%s: expected \"report\" (the default) or \"ignore\"", pz);
    }
    V.ignore_paused = pz && strcmp(pz, "ignore") == 0;
    V.abort_on_miss = env_on("MANGO_VERIFY_ABORT");
    V.verbose = env_on("MANGO_VERIFY_VERBOSE");
    /* (strtoul alone made "abc" 0, every block listed, and "-1" 4294967295) */
    const char *ml = getenv("MANGO_VERIFY_MAX_REPORT");
    V.max_lines = 256;
    if (ml && *ml) {
        unsigned long long v = 0;
        if (!env_decimal(ml, &v) || v > UINT_MAX) {
            V.enabled = false;
            return mango_error(MANGO_EINVAL, "MANGO_VERIFY_MAX_REPORT=%s: expected the missed blocks listed per "
                               "batch, decimal digits, 0 (all) to %u", ml, UINT_MAX);
        }
        V.max_lines = (unsigned)v;
    }
    V.fd = 2;
    V.own_fd = false;
    const char *path = getenv("MANGO_VERIFY_REPORT");
    if (path && *path) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) {
            V.enabled = false;
            return mango_error(MANGO_EINVAL, "MANGO_VERIFY_REPORT=%s: %s", path, strerror(errno));
        }
        V.fd = fd;
        V.own_fd = true;
    }
    uintptr_t lo[CAPTURE_MAX_RANGES], hi[CAPTURE_MAX_RANGES];
    V.n = capture_get_ranges(lo, hi, CAPTURE_MAX_RANGES);
    size_t total = 0;
    for (unsigned i = 0; i < V.n; i++) {
        V.r[i] = (vrange){.lo = lo[i], .hi = hi[i], .heap = lo[i] == heap_lo && hi[i] == heap_hi};
        total += (hi[i] - lo[i] + PAGE - 1) & ~(size_t)(PAGE - 1);
    }
    /* Virtual only: pages are committed as the snapshot touches them. */
    V.shadow_size = total ? total : PAGE;
    V.shadow = mmap(NULL, V.shadow_size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (V.shadow == MAP_FAILED) {
        V.shadow = NULL;
        V.enabled = false;
        return mango_error(MANGO_ENOMEM, "capture verifier: cannot map a %zu-byte shadow", V.shadow_size);
    }
    unsigned char *p = V.shadow;
    size_t data_total = 0;
    for (unsigned i = 0; i < V.n; i++) {
        V.r[i].shadow = p;
        p += (V.r[i].hi - V.r[i].lo + PAGE - 1) & ~(size_t)(PAGE - 1);
        if (!V.r[i].heap)
            data_total += V.r[i].hi - V.r[i].lo;
    }
    if (V.ignore_paused) {
        V.pause_copy_size = data_total ? data_total : PAGE;
        V.pause_copy = mmap(NULL, V.pause_copy_size, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (V.pause_copy == MAP_FAILED) {
            V.pause_copy = NULL;
            munmap(V.shadow, V.shadow_size);
            V.shadow = NULL;
            V.enabled = false;
            return mango_error(MANGO_ENOMEM, "capture verifier: cannot map a %zu-byte pause copy", V.pause_copy_size);
        }
    }
    const vrange *h = heap_range();
    V.heap_hwm = h ? heap_top(h) : 0;
    load_symbols();
    report("mango-verify: on: %u durable range(s), %zu symbol(s)%s%s\n", V.n, V.nsyms,
           V.abort_on_miss ? ", abort on first miss" : "",
           V.ignore_paused ? ", .data/.bss stores made while a batch is paused not reported" : "");
    return MANGO_OK;
}

void capture_verify_shutdown(void)
{
    if (!V.enabled)
        return;
    if (V.ignore_paused)
        report("mango-verify: total: %llu batch(es) verified, %llu missed block(s), %llu byte(s) of "
               ".data/.bss written while paused (MANGO_VERIFY_PAUSED=ignore)\n",
               (unsigned long long)V.batches, (unsigned long long)V.missed,
               (unsigned long long)V.paused_bytes);
    else
        report("mango-verify: total: %llu batch(es) verified, %llu missed block(s)\n",
               (unsigned long long)V.batches, (unsigned long long)V.missed);
    if (V.shadow)
        munmap(V.shadow, V.shadow_size);
    V.shadow = NULL;
    if (V.pause_copy)
        munmap(V.pause_copy, V.pause_copy_size);
    V.pause_copy = NULL;
    V.ignore_paused = false;
    if (V.tkey) {
        munmap(V.tkey, V.tcap * sizeof *V.tkey);
        munmap(V.tmask, V.tcap * sizeof *V.tmask);
    }
    V.tkey = NULL;
    V.tmask = NULL;
    V.tcap = 0;
    unload_symbols();
    if (V.own_fd)
        close(V.fd);
    V.fd = 2;
    V.own_fd = false;
    V.enabled = false;
}

/* ---- the captured-block table ----------------------------------------- */

static inline size_t thash(uint64_t block, size_t cap)
{
    return (size_t)(((block >> 5) * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static void table_put(void *arg, uintptr_t block, uint32_t mask)
{
    (void)arg;
    size_t i = thash(block, V.tcap);
    while (V.tkey[i] && V.tkey[i] != block)
        i = (i + 1) & (V.tcap - 1);
    V.tkey[i] = block;
    V.tmask[i] |= mask;
}

static uint32_t table_get(uintptr_t block)
{
    size_t i = thash(block, V.tcap);
    while (V.tkey[i]) {
        if (V.tkey[i] == block)
            return V.tmask[i];
        i = (i + 1) & (V.tcap - 1);
    }
    return 0;
}

static bool table_fill(const dedup_set *set)
{
    uint64_t n = dedup_size(set);
    size_t want = 8192;
    while (want < 2 * n)
        want *= 2;
    if (want > V.tcap) {
        if (V.tkey) {
            munmap(V.tkey, V.tcap * sizeof *V.tkey);
            munmap(V.tmask, V.tcap * sizeof *V.tmask);
        }
        V.tkey = mmap(NULL, want * sizeof *V.tkey, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        V.tmask = mmap(NULL, want * sizeof *V.tmask, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (V.tkey == MAP_FAILED || V.tmask == MAP_FAILED) {
            V.tkey = NULL;
            V.tmask = NULL;
            V.tcap = 0;
            return false;
        }
        V.tcap = want;
    } else {
        memset(V.tkey, 0, V.tcap * sizeof *V.tkey);
        memset(V.tmask, 0, V.tcap * sizeof *V.tmask);
    }
    dedup_for_each(set, table_put, NULL);
    return true;
}

/* ---- the batch hooks -------------------------------------------------- */

void capture_verify_begin(unsigned n_commands)
{
    V.ncmds = n_commands;
    V.in_batch = true;
    V.paused = false;
    for (unsigned i = 0; i < V.n; i++) {
        vrange *r = &V.r[i];
        if (r->heap) {
            uint64_t top = heap_top(r);
            if (top > V.heap_hwm)
                V.heap_hwm = top;
            r->snap = V.heap_hwm;
        } else {
            r->snap = r->hi - r->lo;
        }
        memcpy(r->shadow, (const void *)r->lo, r->snap);
    }
}

typedef struct batch_tally {
    uint64_t changed, missed;
    unsigned lines;
} batch_tally;

static void check_block(const vrange *r, uintptr_t block, uint32_t changed, batch_tally *t)
{
    if (!r->heap && V.syms)
        changed &= ~internal_mask(block);
    if (!changed)
        return;
    t->changed++;
    uint32_t missing = changed & ~table_get(block);
    if (!missing)
        return;
    t->missed++;
    V.missed++;
    if (V.max_lines && t->lines >= V.max_lines && !V.abort_on_miss)
        return;
    t->lines++;
    unsigned a = (unsigned)__builtin_ctz(missing), b = 31u - (unsigned)__builtin_clz(missing);
    char where[200];
    if (r->heap)
        describe_heap(where, sizeof where, r, block + a);
    else
        describe_data(where, sizeof where, block + a);
    report("mango-verify: batch %llu: missed store at %#lx (bytes %u..%u of block %#lx, "
           "%d byte(s) not captured) in %s; batch of %u command(s)\n",
           (unsigned long long)V.batches, (unsigned long)(block + a), a, b, (unsigned long)block,
           __builtin_popcount(missing), where, V.ncmds);
    if (V.abort_on_miss) {
        report("mango-verify: MANGO_VERIFY_ABORT=1: aborting\n");
        abort();
    }
}

/* Diff [r->lo, r->lo + len) against the shadow (bytes past r->snap were zero). */
static void diff_range(const vrange *r, size_t len, batch_tally *t)
{
    static const unsigned char zero[PAGE];
    const unsigned char *cur = (const unsigned char *)r->lo;
    for (size_t off = 0; off < len;) {
        size_t end = (off / PAGE + 1) * PAGE; /* lo is 32-byte aligned; chunks end on page offsets */
        if (end > len)
            end = len;
        size_t n = end - off;
        const unsigned char *old = off + n <= r->snap ? r->shadow + off : NULL;
        bool same = old ? memcmp(cur + off, old, n) == 0
                        : (off >= r->snap && memcmp(cur + off, zero, n) == 0);
        if (!same) {
            for (size_t b = off & ~(size_t)(DEDUP_BLOCK - 1); b < end; b += DEDUP_BLOCK) {
                uint32_t changed = 0;
                for (unsigned k = 0; k < DEDUP_BLOCK; k++) {
                    size_t o = b + k;
                    if (o < off || o >= end)
                        continue;
                    unsigned char was = o < r->snap ? r->shadow[o] : 0;
                    if (cur[o] != was)
                        changed |= 1u << k;
                }
                if (changed)
                    check_block(r, r->lo + b, changed, t);
            }
        }
        off = end;
    }
}

/* ---- pauses (MANGO_VERIFY_PAUSED=ignore) --------------------------------
 * The runtime calls these when an open batch stops and starts capturing
 * (mango_batch_pause / _resume). Stores to .data/.bss made in between are the
 * application's transient bookkeeping by its own declaration, so the bytes
 * they change are copied into the snapshot, as if the batch had begun with
 * them. A byte written both while capturing (uncaptured) and while paused is
 * then missed by the check. Stores to the durable heap while paused are
 * still reported: nothing logs them. */
void capture_verify_pause(void)
{
    if (!V.enabled || !V.ignore_paused || !V.in_batch || V.paused)
        return;
    unsigned char *p = V.pause_copy;
    for (unsigned i = 0; i < V.n; i++) {
        const vrange *r = &V.r[i];
        if (r->heap)
            continue;
        memcpy(p, (const void *)r->lo, r->hi - r->lo);
        p += r->hi - r->lo;
    }
    V.paused = true;
}

void capture_verify_resume(void)
{
    if (!V.paused)
        return;
    V.paused = false;
    const unsigned char *p = V.pause_copy;
    for (unsigned i = 0; i < V.n; i++) {
        const vrange *r = &V.r[i];
        if (r->heap)
            continue;
        const unsigned char *cur = (const unsigned char *)r->lo;
        size_t len = r->hi - r->lo;
        for (size_t off = 0; off < len; off += PAGE) {
            size_t n = len - off < PAGE ? len - off : PAGE;
            if (memcmp(cur + off, p + off, n) == 0)
                continue;
            for (size_t o = off; o < off + n; o++)
                if (cur[o] != p[o]) {
                    r->shadow[o] = cur[o];
                    V.paused_bytes++;
                }
        }
        p += len;
    }
}

void capture_verify_end(const dedup_set *set)
{
    capture_verify_resume(); /* a batch ended while paused */
    V.in_batch = false;
    V.batches++;
    if (!table_fill(set)) {
        report("mango-verify: batch %llu: out of memory for the captured-block table; not verified\n",
               (unsigned long long)V.batches);
        return;
    }
    batch_tally t = {0};
    for (unsigned i = 0; i < V.n; i++) {
        const vrange *r = &V.r[i];
        size_t len = r->hi - r->lo;
        if (r->heap) {
            uint64_t top = heap_top(r);
            if (top > V.heap_hwm)
                V.heap_hwm = top;
            len = r->snap > top ? r->snap : top;
        }
        diff_range(r, len, &t);
    }
    if (t.missed && V.max_lines && t.lines < t.missed)
        report("mango-verify: batch %llu: %llu more missed block(s) not listed "
               "(MANGO_VERIFY_MAX_REPORT=0 lists all)\n",
               (unsigned long long)V.batches, (unsigned long long)(t.missed - t.lines));
    if (t.missed || V.verbose)
        report("mango-verify: batch %llu: %u command(s), %llu changed block(s), %llu captured, "
               "%llu MISSED\n",
               (unsigned long long)V.batches, V.ncmds, (unsigned long long)t.changed,
               (unsigned long long)dedup_size(set), (unsigned long long)t.missed);
}
