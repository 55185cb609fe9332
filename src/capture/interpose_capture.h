/* interpose_capture.h -- what the libc interposers share (libc_interpose.c,
 * libc_interpose_outparams.c): finding the real function a wrapper calls
 * (DECLARE_REAL, REAL), and reporting what it wrote (CAPTURE). Private to
 * src/capture. */
#ifndef MANGO_INTERPOSE_CAPTURE_H
#define MANGO_INTERPOSE_CAPTURE_H

#include "capture/capture.h"
#include "mango.h"

#define unlikely(x) __builtin_expect(!!(x), 0)

#define CAPTURE(p, n)                                                            \
    do {                                                                         \
        if (unlikely(mango_capture_active))                                      \
            mango_capture((const void *)(p), (size_t)(n));                       \
    } while (0)

/* Look name up in the objects after the executable (libc, then libm);
 * store it in *slot. NULL if it is not found, or if this thread is already
 * inside a lookup (dlsym may call malloc and memcpy: the caller then uses
 * its fallback). In libc_interpose.c. */
void *interpose_resolve(void **slot, const char *name, void *self);
/* Says which real function is missing, and aborts. */
__attribute__((noreturn)) void interpose_die(const char *what);

/* DECLARE_REAL(name): the slot of name's real function. REAL_OR_NULL(name):
 * the real function, resolving it on first use; NULL only while this thread
 * is inside dlsym (callers with a fallback check for it). REAL(name): the
 * same, never NULL. */
#define DECLARE_REAL(name) static typeof(name) *real_##name
#define REAL_OR_NULL(name)                                                       \
    ({                                                                           \
        typeof(name) *f_ = __atomic_load_n(&real_##name, __ATOMIC_RELAXED);      \
        if (unlikely(!f_))                                                       \
            f_ = (typeof(name) *)interpose_resolve((void **)&real_##name, #name, (void *)name); \
        f_;                                                                      \
    })
#define REAL(name)                                                               \
    ({                                                                           \
        typeof(name) *g_ = REAL_OR_NULL(name);                                   \
        if (unlikely(!g_))                                                       \
            interpose_die(#name);                                                \
        g_;                                                                      \
    })

#endif
