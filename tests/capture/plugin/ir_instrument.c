/* ir_instrument.c -- FileCheck test of the code mango-cc emits, run at -O0
 * and at -O2 (same checks):
 *   mango-cc -O{0,2} -S -emit-llvm ir_instrument.c -o - | FileCheck ir_instrument.c
 */
#include <string.h>

int g[64];
__thread int tls_var;
void opaque(void *);

// The flag is an external initial-exec TLS byte.
// CHECK: @mango_capture_active = external thread_local(initialexec) global i8

/* A store to a global: flag load, unlikely branch, capture of 4 bytes. */
// CHECK-LABEL: define {{.*}}void @store_global(
// CHECK: store i32 {{.*}}, ptr {{.*}}@g
// CHECK: [[F:%.*]] = load i8, ptr @mango_capture_active
// CHECK: [[C:%.*]] = icmp ne i8 [[F]], 0
// CHECK: br i1 [[C]], label {{.*}}, !prof [[PROF:![0-9]+]]
// CHECK: call void @mango_capture(ptr {{.*}}@g{{.*}}, i64 4)
// CHECK: ret void
void store_global(int v) { g[3] = v; }

/* A store through a pointer argument (heap or global: unknown). */
// CHECK-LABEL: define {{.*}}void @store_ptr(
// CHECK: store i64
// CHECK: load i8, ptr @mango_capture_active
// CHECK: call void @mango_capture(ptr {{.*}}, i64 8)
void store_ptr(long *p, long v) { *p = v; }

/* Stores to an escaping local array and to a TLS variable: not captured. */
// CHECK-LABEL: define {{.*}}void @store_local_and_tls(
// CHECK-NOT: @mango_capture
// CHECK: ret void
void store_local_and_tls(int v)
{
    int local[16];
    for (int i = 0; i < 16; i++)
        local[i] = v + i;
    opaque(local);
    tls_var = v;
}

/* memcpy with a runtime length: one capture of (dst, n). */
// CHECK-LABEL: define {{.*}}void @copy_n(
// CHECK: call void @llvm.memcpy
// CHECK: load i8, ptr @mango_capture_active
// CHECK: call void @mango_capture(ptr [[DST:%.*]], i64 [[N:%.*]])
// CHECK-NOT: @mango_capture(
// CHECK: ret void
void copy_n(void *dst, const void *src, unsigned long n) { memcpy(dst, src, n); }

/* Atomic RMW and cmpxchg (no call between them: one shared flag check). */
// CHECK-LABEL: define {{.*}}@atomics(
// CHECK: atomicrmw add ptr
// CHECK: cmpxchg ptr
// CHECK: call void @mango_capture(ptr {{.*}}, i64 8)
// CHECK: call void @mango_capture(ptr {{.*}}, i64 8)
long atomics(long *p, long *q)
{
    long old = __atomic_fetch_add(p, 1, __ATOMIC_SEQ_CST);
    long e = 0;
    __atomic_compare_exchange_n(q, &e, old, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return e;
}

/* mango_no_capture: left alone. */
// CHECK-LABEL: define {{.*}}void @hidden(
// CHECK-NOT: @mango_capture
// CHECK: ret void
__attribute__((annotate("mango_no_capture"), noinline)) void hidden(int v) { g[5] = v; }

/* An application's function named mango_* is instrumented like any other
 * (until session 38 the name alone left it out). */
// CHECK-LABEL: define {{.*}}void @mango_helper(
// CHECK: load i8, ptr @mango_capture_active
// CHECK: call void @mango_capture(ptr {{.*}}, i64 4)
// CHECK: ret void
void mango_helper(int v) { g[6] = v; }

// CHECK: [[PROF]] = !{!"branch_weights", i32 1, i32 1048576}
