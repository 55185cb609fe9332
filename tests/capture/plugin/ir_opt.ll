; ir_opt.ll -- IR-level cases of the MangoCapture pass that C does not reach
; easily. Run twice through the pass (it must be idempotent):
;   opt-16 -load-pass-plugin=MangoCapture.so -passes=mango-capture,mango-capture -S
;     | FileCheck ir_opt.ll
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

@g = global [64 x i8] zeroinitializer

; Aggregate and vector stores: the store size of the value type.
; CHECK-LABEL: define void @aggregate(
; CHECK: store { i32, i64 }
; CHECK: store <8 x i16>
; CHECK: load i8, ptr @mango_capture_active
; CHECK: call void @mango_capture(ptr %p, i64 16)
; CHECK: call void @mango_capture(ptr %q, i64 16)
; CHECK-NOT: @mango_capture(
; CHECK: ret void
define void @aggregate(ptr %p, ptr %q, { i32, i64 } %v, <8 x i16> %w) {
  store { i32, i64 } %v, ptr %p
  store <8 x i16> %w, ptr %q
  ret void
}

; Neighbouring stores through one base share one flag check and one capture.
; CHECK-LABEL: define void @merged(
; CHECK: load i8, ptr @mango_capture_active
; CHECK-NOT: load i8, ptr @mango_capture_active
; CHECK: call void @mango_capture(ptr %p, i64 24)
; CHECK-NOT: @mango_capture(
; CHECK: ret void
define void @merged(ptr %p) {
  store i64 1, ptr %p
  %a = getelementptr i8, ptr %p, i64 8
  store i64 2, ptr %a
  %b = getelementptr i8, ptr %p, i64 16
  store i64 3, ptr %b
  ret void
}

; With a hole between them (bytes 12..15), and no fast path in the module to
; tell the heap at run time, each piece is captured: in .data/.bss the log
; restores only captured bytes, and the hole may be a transient field.
; CHECK-LABEL: define void @holes(
; CHECK: load i8, ptr @mango_capture_active
; CHECK-NOT: load i8, ptr @mango_capture_active
; CHECK: call void @mango_capture(ptr %p, i64 12)
; CHECK: call void @mango_capture(ptr %mango.ptr, i64 8)
; CHECK-NOT: @mango_capture(
; CHECK: ret void
define void @holes(ptr %p) {
  store i64 1, ptr %p
  %a = getelementptr i8, ptr %p, i64 8
  store i32 2, ptr %a
  %b = getelementptr i8, ptr %p, i64 16
  store i64 3, ptr %b
  ret void
}

; A call in between ends the segment: two checks.
; CHECK-LABEL: define void @split_by_call(
; CHECK: store i64 1
; CHECK: load i8, ptr @mango_capture_active
; CHECK: call void @mango_capture(ptr %p, i64 8)
; CHECK: call void @ext()
; CHECK: store i64 2
; CHECK: load i8, ptr @mango_capture_active
; CHECK: call void @mango_capture(ptr %p, i64 8)
define void @split_by_call(ptr %p) {
  store i64 1, ptr %p
  call void @ext()
  store i64 2, ptr %p
  ret void
}

; memset.inline, element-wise atomic memcpy (runtime i32 length; 0 bytes when
; it copies onto itself), masked store.
; CHECK-LABEL: define void @intrinsics(
; CHECK: load i8, ptr @mango_capture_active
; CHECK-DAG: [[SELF:%.*]] = icmp eq ptr %q, %src
; CHECK-DAG: [[L:%.*]] = zext i32 %n to i64
; CHECK-DAG: [[LEN:%.*]] = select i1 [[SELF]], i64 0, i64 [[L]]
; CHECK-DAG: call void @mango_capture(ptr %q, i64 [[LEN]])
; CHECK-DAG: call void @mango_capture(ptr %p, i64 32)
; CHECK-DAG: call void @mango_capture(ptr %r, i64 16)
; CHECK: ret void
define void @intrinsics(ptr %p, ptr %q, ptr %src, i32 %n, ptr %r, <4 x i32> %v, <4 x i1> %m) {
  call void @llvm.memset.inline.p0.i64(ptr %p, i8 0, i64 32, i1 false)
  call void @llvm.memcpy.element.unordered.atomic.p0.p0.i32(ptr align 4 %q, ptr align 4 %src, i32 %n, i32 4)
  call void @llvm.masked.store.v4i32.p0(<4 x i32> %v, ptr %r, i32 4, <4 x i1> %m)
  ret void
}

; A copy onto itself writes nothing (Redis's listpack memmoves its tail onto
; itself to replace an element in place): copies longer than the fast path's
; 32 bytes capture 0 bytes then; short ones keep their constant length.
; CHECK-LABEL: define void @self_copy(
; CHECK-DAG: [[SELF:%.*]] = icmp eq ptr %p, %s
; CHECK-DAG: [[LEN:%.*]] = select i1 [[SELF]], i64 0, i64 100
; CHECK-DAG: call void @mango_capture(ptr %p, i64 [[LEN]])
; CHECK-DAG: call void @mango_capture(ptr %r, i64 16)
; CHECK: ret void
define void @self_copy(ptr %p, ptr %s, ptr %r, ptr %t) {
  call void @llvm.memmove.p0.p0.i64(ptr %p, ptr %s, i64 100, i1 false)
  call void @llvm.memcpy.p0.p0.i64(ptr %r, ptr %t, i64 16, i1 false)
  ret void
}

; Stack and thread-local targets are skipped.
@t = thread_local global i32 0
; CHECK-LABEL: define void @skipped(
; CHECK-NOT: @mango_capture
; CHECK: ret void
define void @skipped(i32 %v) {
  %a = alloca [4 x i32]
  %e = getelementptr [4 x i32], ptr %a, i64 0, i64 2
  store i32 %v, ptr %e
  call void @ext_ptr(ptr %a)
  %tp = call ptr @llvm.threadlocal.address.p0(ptr @t)
  store i32 %v, ptr %tp
  ret void
}

; optnone (what -O0 produces) is instrumented too.
; CHECK-LABEL: define void @at_o0(
; CHECK: call void @mango_capture(ptr @g, i64 1)
define void @at_o0() noinline optnone {
  store i8 1, ptr @g
  ret void
}

; The IR-level opt-out attribute.
; CHECK-LABEL: define void @opted_out(
; CHECK-NOT: @mango_capture
; CHECK: ret void
define void @opted_out() "mango_no_capture" {
  store i8 1, ptr @g
  ret void
}

; Stale attributes go from the definition and from call sites calling it;
; a call to an external declaration keeps its own.
; CHECK: define void @callee(ptr %p) #[[CALLEE:[0-9]+]]
define void @callee(ptr nocapture writeonly %p) #0 {
  store i8 1, ptr %p
  ret void
}
; CHECK-LABEL: define void @calls(
; CHECK: call void @callee(ptr %p) #[[CALLEE]]{{$}}
; CHECK: call void @ext_ptr(ptr nocapture writeonly %p) #[[EXT:[0-9]+]]
define void @calls(ptr %p) {
  call void @callee(ptr nocapture writeonly %p) #0
  call void @ext_ptr(ptr nocapture writeonly %p) #0
  ret void
}

declare void @ext()
declare void @ext_ptr(ptr)
declare void @llvm.memset.inline.p0.i64(ptr, i8, i64, i1)
declare void @llvm.memmove.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memcpy.element.unordered.atomic.p0.p0.i32(ptr, ptr, i32, i32)
declare void @llvm.masked.store.v4i32.p0(<4 x i32>, ptr, i32, <4 x i1>)
declare ptr @llvm.threadlocal.address.p0(ptr)

attributes #0 = { nosync nounwind memory(argmem: write) }
; CHECK: attributes #[[CALLEE]] = { nounwind }
; CHECK: attributes #[[EXT]] = { nosync nounwind memory(argmem: write) }
; CHECK: !{{[0-9]+}} = !{i32 2, !"mango.capture.instrumented", i32 1}
