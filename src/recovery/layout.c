/* layout.c -- re-exec without ASLR, executable data segments, layout fingerprint. */
#define _GNU_SOURCE
#include "recovery/layout.h"

#include <elf.h>
#include <stdarg.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <unistd.h>

#include "mango.h"
#include "recovery/trace.h"
#include "runtime/error.h"

__attribute__((constructor(101))) static void reexec_without_aslr(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)envp;
    int pers = personality(0xffffffff);
    if (pers == -1 || (pers & ADDR_NO_RANDOMIZE)) {
        recovery_trace("constructor (ASLR off)");
        return;
    }
    const char *skip = getenv("MANGO_NO_REEXEC");
    if (skip && *skip && strcmp(skip, "0") != 0)
        return;
    if (personality((unsigned long)pers | ADDR_NO_RANDOMIZE) == -1)
        return;
    recovery_trace("constructor: re-exec without ASLR");
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with ASLR; recovery will refuse a layout change. */
    personality((unsigned long)pers);
}

int layout_aslr_disabled(void)
{
    int pers = personality(0xffffffff);
    return pers != -1 && (pers & ADDR_NO_RANDOMIZE);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

typedef struct walk {
    process_layout *out;
    size_t text_len;
    int index;
} walk;

static void append(walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(walk *w, const char *fmt, ...)
{
    size_t cap = sizeof w->out->text;
    if (w->text_len >= cap - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->out->text + w->text_len, cap - w->text_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->text_len += (size_t)n < cap - w->text_len ? (size_t)n : cap - 1 - w->text_len;
}

/* The executable's lazy-binding GOT (.got.plt), [*lo, *hi), or 0s without
 * one: DT_PLTGOT, its three reserved words, and a word per PLT relocation
 * (DT_PLTRELSZ). ld.so has usually made DT_PLTGOT absolute in memory; a
 * value below the load address is taken as not yet relocated. */
static void lazy_got(const struct dl_phdr_info *info, uintptr_t *lo, uintptr_t *hi)
{
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    uintptr_t got = 0, relsz = 0, relent = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_PLTGOT)
            got = dyn->d_un.d_ptr;
        else if (dyn->d_tag == DT_PLTRELSZ)
            relsz = dyn->d_un.d_val;
        else if (dyn->d_tag == DT_PLTREL)
            relent = dyn->d_un.d_val == DT_RELA ? sizeof(ElfW(Rela)) : sizeof(ElfW(Rel));
    }
    if (!got || !relent)
        return;
    if (got < info->dlpi_addr)
        got += info->dlpi_addr;
    *lo = got;
    *hi = got + (3 + relsz / relent) * sizeof(void *);
}

static int visit(struct dl_phdr_info *info, size_t size, void *arg)
{
    walk *w = arg;
    process_layout *out = w->out;
    int idx = w->index++;
    const char *name = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : NULL;
    if (idx == 0 && !name) {
        static char exe[1024];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = 0;
        name = exe;
    }
    if (!name || strstr(name, "linux-vdso"))
        return 0; /* the vDSO changes with the kernel; nothing durable points into it */
    unsigned char build_id[64];
    size_t id_len = 0;
    uintptr_t relro_lo = 0, relro_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = info->dlpi_addr + ph->p_vaddr;
            relro_hi = relro_lo + ph->p_memsz;
        }
        if (ph->p_type != PT_NOTE || id_len)
            continue;
        const char *p = (const char *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
            const char *nm = p + sizeof *nh;
            const unsigned char *desc = (const unsigned char *)nm + ((nh->n_namesz + 3) & ~3u);
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(nm, "GNU", 4) == 0) {
                id_len = nh->n_descsz < sizeof build_id ? nh->n_descsz : sizeof build_id;
                memcpy(build_id, desc, id_len);
                break;
            }
            p = (const char *)desc + ((nh->n_descsz + 3) & ~3u);
        }
    }
    out->fingerprint = fnv(out->fingerprint, name, strlen(name));
    out->fingerprint = fnv(out->fingerprint, &info->dlpi_addr, sizeof info->dlpi_addr);
    out->fingerprint = fnv(out->fingerprint, build_id, id_len);
    append(w, "%s%s@%#lx id=", idx ? "; " : "", name, (unsigned long)info->dlpi_addr);
    for (size_t i = 0; i < id_len; i++)
        append(w, "%02x", build_id[i]);
    if (idx != 0)
        return 0;
    uintptr_t got_lo = 0, got_hi = 0;
    lazy_got(info, &got_lo, &got_hi);
    /* The executable: its writable PT_LOAD segments, minus the RELRO part. */
    for (int i = 0; i < info->dlpi_phnum && out->n_data < LAYOUT_MAX_DATA; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W))
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (relro_lo <= lo && relro_hi > lo)
            lo = relro_hi;
        if (lo >= hi)
            continue;
        /* (The region keeps its bounds, which pools record; the GOT at its
         * start is only marked as the loader's.) */
        uintptr_t start = got_lo <= lo && got_hi > lo ? (got_hi < hi ? got_hi : hi) : lo;
        out->data_lo[out->n_data] = lo & ~(uintptr_t)31;
        out->data_hi[out->n_data] = (hi + 31) & ~(uintptr_t)31;
        out->data_start[out->n_data] = start;
        out->n_data++;
    }
    return 0;
}

int layout_read(process_layout *out, uintptr_t heap_base, size_t heap_capacity)
{
    memset(out, 0, sizeof *out);
    out->fingerprint = 0xcbf29ce484222325ull;
    walk w = {.out = out};
    dl_iterate_phdr(visit, &w);
    out->fingerprint = fnv(out->fingerprint, &heap_base, sizeof heap_base);
    append(&w, "; heap@%#lx", (unsigned long)heap_base);
    (void)heap_capacity;
    if (out->n_data == 0)
        return mango_error(MANGO_EINVAL, "cannot find the executable's data segment");
    return MANGO_OK;
}
