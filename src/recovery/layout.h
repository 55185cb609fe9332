/* layout.h -- the process layout that same-address recovery depends on.
 *
 * A constructor re-executes the program once with ASLR off (ADDR_NO_RANDOMIZE)
 * so the executable, its libraries and its .data/.bss land at the same
 * addresses in every run. The fingerprint hashes what must not change between
 * the run that wrote a pool and the run that recovers it: each loaded object's
 * path, build-id and load address, and the durable heap's base.
 * Set MANGO_NO_REEXEC=1 to skip the re-exec (recovery then refuses pools whose
 * fingerprint differs).
 */
#ifndef MANGO_LAYOUT_H
#define MANGO_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define LAYOUT_MAX_DATA 4

typedef struct process_layout {
    unsigned n_data;                 /* writable segments of the executable */
    uintptr_t data_lo[LAYOUT_MAX_DATA], data_hi[LAYOUT_MAX_DATA]; /* 32-byte aligned */
    /* The segment's first byte that is the program's: below it, in
     * [data_lo, data_start), lie the end of RELRO and the lazy-binding GOT
     * (.got.plt), which only the dynamic loader writes. The program never
     * stores there, so no pool may restore or replay a byte there (a flipped
     * bitmap bit did: the next call through the table crashed, after
     * recovery had written the pool; found by a fuzzing review, session 40). */
    uintptr_t data_start[LAYOUT_MAX_DATA];
    uint64_t fingerprint;
    char text[2048];
} process_layout;

int layout_read(process_layout *out, uintptr_t heap_base, size_t heap_capacity);
/* Did the constructor manage to turn address randomisation off? */
int layout_aslr_disabled(void);

#endif
