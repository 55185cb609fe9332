/* mango_capture_inline.h -- the inline fast path of write capture.
 *
 * mango-cc force-includes this header (-include) into every C/C++ translation
 * unit it compiles against the real runtime, and so does the mango_instrument()
 * CMake function. The MangoCapture plugin then emits, in the cold block of a
 * capture check (mango_capture_active set), for each captured range of
 * constant length 1..32 bytes:
 *
 *     if (!mango_capture_try_fast(p, len))
 *         mango_capture(p, len);            // the full slow path
 *
 * and inlines mango_capture_try_fast() itself (the inliner has already run at
 * the plugin's extension point; at -O0 it never runs). Without this header in
 * the translation unit the plugin emits only the mango_capture() calls.
 *
 * The fast path is the paper's Figure 3 hash-set insert for the common case: a
 * store inside the durable heap, or inside the executable's durable .data/.bss
 * (the statistics and counters an application bumps on every request), that
 * does not cross a 32-byte block. It
 * computes the block and the byte mask, hashes the block and probes up to
 * MANGO_CAPTURE_PROBES slots of the combiner's primary dedup set: a slot
 * holding the block gets the mask ORed in; an empty slot below the load limit
 * receives the block. A store outside both ranges is transient memory when
 * the runtime says they are all the durable memory there is (covers_all): 1,
 * nothing to record. Everything else (a store crossing a block, outside the
 * two ranges while other durable regions exist, a longer probe chain) returns
 * 0 and the caller takes the slow path, which probes further and spills
 * exactly as before. Both paths probe the same table
 * the same way, so the set's contents do not depend on which path ran.
 *
 * The runtime (src/capture/capture.c) defines mango_capture_fastpath and keeps
 * it valid while mango_capture_active is set on the combiner thread (the only
 * reader). heap_size == 0 sends every store to the slow path: the runtime does
 * that with MANGO_DEDUP=0 and MANGO_CAPTURE_FASTPATH=0. The set's layout is
 * defined by src/capture/dedup_set.h; the mirror below is checked against it
 * (static assertions in capture.c).
 *
 * Nothing here needs a system header: the header must be harmless in any
 * translation unit it is forced into.
 */
#ifndef MANGO_CAPTURE_INLINE_H
#define MANGO_CAPTURE_INLINE_H
#ifndef __ASSEMBLER__

#define MANGO_CAPTURE_BLOCK 32u
#define MANGO_CAPTURE_SLOTS 4096u
#define MANGO_CAPTURE_MAX_LOAD (MANGO_CAPTURE_SLOTS * 6 / 10)
#define MANGO_CAPTURE_PROBES 4u
/* Slot of a (32-byte aligned) block address. */
#define MANGO_CAPTURE_HASH(block)                                                                  \
    ((__UINT32_TYPE__)(((__UINT64_TYPE__)(block) >> 5) * 0x9E3779B1u) & (MANGO_CAPTURE_SLOTS - 1))

#ifdef __cplusplus
extern "C" {
#endif

/* Mirror of the head of dedup_set (src/capture/dedup_set.h). */
struct __attribute__((may_alias)) mango_capture_set_view {
    __UINT64_TYPE__ key[MANGO_CAPTURE_SLOTS]; /* block address, 0 = empty */
    __UINT32_TYPE__ mask[MANGO_CAPTURE_SLOTS];
    __UINT32_TYPE__ used_slot[MANGO_CAPTURE_MAX_LOAD];
    __UINT32_TYPE__ count;
};

struct mango_capture_fastpath {
    __UINTPTR_TYPE__ heap_lo;   /* 32-byte aligned */
    __UINTPTR_TYPE__ heap_size; /* multiple of 32; 0: no fast path */
    struct mango_capture_set_view *set;
    __UINTPTR_TYPE__ data_lo;   /* the first durable data region, the same way */
    __UINTPTR_TYPE__ data_size; /* 0: none (or no fast path) */
    /* 1: the two ranges above are every durable byte there is (no other
     * region, no partial block at their edges), so a store outside both
     * (transient memory) has nothing to record: the fast path says so itself
     * instead of calling mango_capture(). 0 with the fast path off. */
    __UINTPTR_TYPE__ covers_all;
};
extern struct mango_capture_fastpath mango_capture_fastpath;
/* Out of line: add a heap block known not to be in the full primary set to
 * the spill set (what mango_capture would end up doing). */
void mango_capture_spill(__UINTPTR_TYPE__ block, __UINT32_TYPE__ mask);

/* 1: [addr, addr+len) is recorded; 0: call mango_capture(addr, len). Only
 * while mango_capture_active is set. `used`: emitted even when unreferenced,
 * for the plugin to find (it deletes it after inlining). */
static __inline__ __attribute__((always_inline, used, unused)) int
mango_capture_try_fast(const void *addr, __SIZE_TYPE__ len)
{
    __UINTPTR_TYPE__ a = (__UINTPTR_TYPE__)addr;
    __UINTPTR_TYPE__ off = a & (MANGO_CAPTURE_BLOCK - 1);
    if (__builtin_expect(len - 1 >= MANGO_CAPTURE_BLOCK || off + len > MANGO_CAPTURE_BLOCK, 0))
        return 0; /* empty, or crosses a block */
    if (__builtin_expect(a - mango_capture_fastpath.heap_lo >= mango_capture_fastpath.heap_size, 0) &&
        a - mango_capture_fastpath.data_lo >= mango_capture_fastpath.data_size)
        return (int)mango_capture_fastpath.covers_all; /* neither the durable heap nor .data/.bss */
    __UINT64_TYPE__ block = a - off;
    __UINT32_TYPE__ m = (__UINT32_TYPE__)((((__UINT64_TYPE__)1 << len) - 1) << off);
    struct mango_capture_set_view *s = mango_capture_fastpath.set;
    __UINT32_TYPE__ i = MANGO_CAPTURE_HASH(block);
#ifdef __clang__
#pragma clang loop unroll(full)
#endif
    for (unsigned p = 0; p < MANGO_CAPTURE_PROBES; p++) {
        __UINT64_TYPE__ k = s->key[i];
        if (__builtin_expect(k == block, 1)) {
            s->mask[i] |= m;
            return 1;
        }
        if (k == 0) {
            __UINT32_TYPE__ c = s->count;
            if (__builtin_expect(c >= MANGO_CAPTURE_MAX_LOAD, 0)) {
                mango_capture_spill(block, m); /* not in the full primary set */
                return 1;
            }
            s->key[i] = block;
            s->mask[i] = m;
            s->used_slot[c] = i;
            s->count = c + 1;
            return 1;
        }
        i = (i + 1) & (MANGO_CAPTURE_SLOTS - 1);
    }
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif /* __ASSEMBLER__ */
#endif
