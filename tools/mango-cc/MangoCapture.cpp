// MangoCapture.cpp -- LLVM 16 new-pass-manager plugin that instruments every
// store to possibly-durable memory with a call to the Mangosteen runtime.
//
// For every function with a body (except the runtime's mango_capture and its
// inline fast path, naked functions and functions annotated
// "mango_no_capture"), the pass finds the
// instructions that write memory:
//
//   store                          (len = store size of the value type)
//   atomicrmw / cmpxchg            (len = store size of the value type)
//   llvm.mem{cpy,move,set}[.inline] and the element-wise atomic variants
//                                  (one capture of (dest, len), len may be a
//                                   runtime value)
//   llvm.masked.store / llvm.masked.compressstore
//                                  (the whole vector range, a superset)
//   llvm.masked.scatter            (one capture per lane, a superset)
//
// A target whose getUnderlyingObject() is an alloca or a byval argument
// (provably this frame's stack) or a thread-local global (never durable) is
// skipped, as are pointers outside address space 0.
//
// The emitted code is, after the last write of a "segment" (a run of writes
// in one basic block not separated by a call):
//
//     %f = load i8, ptr @mango_capture_active        ; initial-exec TLS
//     %c = icmp ne i8 %f, 0
//     br i1 %c, label %mango.capture, label %cont, !prof !{1, 2^20}
//   mango.capture:                                   ; cold
//     call void @mango_capture(ptr %p, i64 %len) ...  ; one per range
//     br label %cont
//
// When the module defines mango_capture_try_fast (include/mango_capture_inline.h,
// which mango-cc force-includes when it links the real runtime), each capture
// of a constant 1..32 bytes in the cold block first tries that inline fast
// path (the dedup-set insert for a store within one block of the durable
// heap) and calls mango_capture only when it returns 0:
//
//   mango.capture:
//     %ok = call i32 @mango_capture_try_fast(ptr %p, i64 8)  ; inlined below
//     %h = icmp ne i32 %ok, 0
//     br i1 %h, label %mango.next, label %mango.slow
//   mango.slow:
//     call void @mango_capture(ptr %p, i64 8)
//     br label %mango.next
//
// The pass inlines those calls itself (the inliner has run before
// OptimizerLastEP, and never runs at -O0), then deletes the helper. Only the
// flag test stays on the hot path.
//
// Inside a segment, writes with constant length through the same base
// pointer (after stripping constant offsets) are merged into one capture of
// the covering range when the gap between them is small. Capturing a superset
// of the written bytes is harmless: the runtime logs current contents.
//
// The pass then strips attributes that instrumentation made false (memory
// effects, nosync, and readonly/readnone/writeonly/nocapture on pointer
// parameters) from every function definition in the module and from every
// call site that calls a definition of this module or calls indirectly, so
// that a later (LTO) pipeline cannot reason with them.
//
// It is registered at OptimizerLastEP, which LLVM 16 runs at -O0 as well as
// -O1..-O3 (and in the LTO/ThinLTO pre-link pipelines), so stores to locals
// that SROA/mem2reg remove are never instrumented and nothing optimises the
// captures away. The pass is marked required so optnone functions (-O0) are
// instrumented too. A module flag makes it idempotent.
//
// Pipeline name for opt:  opt-16 -load-pass-plugin=MangoCapture.so
//                                -passes=mango-capture
// Environment: MANGO_CC_STATS=1 prints per-module counts to stderr.

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/TargetParser/Triple.h"
#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/DataLayout.h"
#include "llvm/IR/DebugInfoMetadata.h"
#include "llvm/IR/DerivedTypes.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/GlobalVariable.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/IntrinsicsX86.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/PassManager.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/PassPlugin.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Transforms/Utils/BasicBlockUtils.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/ModuleUtils.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

using namespace llvm;

namespace {

const char *const FlagName = "mango_capture_active";
const char *const CaptureName = "mango_capture";
const char *const FastName = "mango_capture_try_fast";
// Largest constant length handed to the fast path (one dedup block).
constexpr uint64_t MaxFastLen = 32;
const char *const NoCaptureAttr = "mango_no_capture";
const char *const DoneFlag = "mango.capture.instrumented";

// Two writes through the same base are merged into one capture when the hole
// between them is at most this many bytes, as long as the merged range stays
// below MaxMergedSpan. A merged range with holes is used only when it starts
// in the durable heap (checked at run time, mango_capture_fastpath): there
// every byte is durable, and a hole is logged with the value it has. In
// .data/.bss the log restores only the bytes written, so a transient field
// in a hole (a file descriptor, a pointer set at start-up) would come back
// from the crashed process: there the pieces are captured one by one (found
// by a review, session 38).
constexpr uint64_t MaxMergeGap = 64;
const char *const FastPathVarName = "mango_capture_fastpath";
constexpr uint64_t MaxMergedSpan = 4096;

struct Stats {
  unsigned Functions = 0, Stores = 0, Atomics = 0, MemIntrinsics = 0,
           Masked = 0, SkippedStack = 0, SkippedTLS = 0, SkippedAddrSpace = 0,
           Checks = 0, Calls = 0, FastPaths = 0, StrippedFns = 0,
           StrippedCalls = 0, GappyMerges = 0;
};

// One range to capture. Len == nullptr means ConstLen is the length.
// Lane >= 0: Ptr is a vector of pointers, capture its Lane-th element.
// SameAs != nullptr (memcpy/memmove): nothing is written when Ptr == SameAs,
// a copy onto itself (listpack's in-place replace memmoves its whole tail
// onto itself), so the captured length is 0 then.
struct Range {
  Value *Ptr;
  Value *Len;
  uint64_t ConstLen;
  int Lane;
  Value *SameAs = nullptr;
};

struct Site {
  Instruction *I;
  SmallVector<Range, 1> Ranges;
};

class MangoCapturePass : public PassInfoMixin<MangoCapturePass> {
public:
  PreservedAnalyses run(Module &M, ModuleAnalysisManager &);
  static bool isRequired() { return true; }

private:
  const DataLayout *DL = nullptr;
  uint64_t VaListBytes = 0;       // sizeof(va_list) on the target; 0: unknown
  StringSet<> Warned;             // intrinsics already warned about
  GlobalVariable *Flag = nullptr;
  FunctionCallee Capture;
  Function *Fast = nullptr;           // mango_capture_try_fast, if defined
  GlobalVariable *FastPathVar = nullptr; // mango_capture_fastpath, with Fast
  GlobalAlias *FastAlias = nullptr;   // C++: the extern "C" name is an alias
  SmallVector<CallInst *, 64> ToInline;
  Type *IntPtrTy = nullptr;
  Stats S;

  void collectAnnotated(Module &M, DenseSet<Function *> &Out);
  bool shouldInstrument(Function &F, const DenseSet<Function *> &Annotated);
  bool isDurableCandidate(Value *Ptr);
  bool classify(Instruction &I, Site &Out);
  bool mayChangeFlag(Instruction &I);
  void warnUncaptured(IntrinsicInst &II);
  bool instrumentFunction(Function &F);
  void emitSegment(ArrayRef<Site> Seg);
  void stripAttributes(Module &M);
  Function *findFastPath(Module &M);
  void inlineFastPaths(Module &M);
};


// getUnderlyingObject, looking through llvm.threadlocal.address (clang 16
// reaches every TLS variable through it) to the thread-local global.
const Value *underlying(const Value *Ptr) {
  const Value *U = getUnderlyingObject(Ptr);
  if (auto *II = dyn_cast<IntrinsicInst>(U))
    if (II->getIntrinsicID() == Intrinsic::threadlocal_address)
      return getUnderlyingObject(II->getArgOperand(0));
  return U;
}

void MangoCapturePass::collectAnnotated(Module &M,
                                        DenseSet<Function *> &Out) {
  GlobalVariable *GA = M.getNamedGlobal("llvm.global.annotations");
  if (!GA || !GA->hasInitializer())
    return;
  auto *Arr = dyn_cast<ConstantArray>(GA->getInitializer());
  if (!Arr)
    return;
  for (Value *Op : Arr->operands()) {
    auto *CS = dyn_cast<ConstantStruct>(Op);
    if (!CS || CS->getNumOperands() < 2)
      continue;
    auto *Fn = dyn_cast<Function>(CS->getOperand(0)->stripPointerCasts());
    auto *StrGV =
        dyn_cast<GlobalVariable>(CS->getOperand(1)->stripPointerCasts());
    if (!Fn || !StrGV || !StrGV->hasInitializer())
      continue;
    auto *Str = dyn_cast<ConstantDataSequential>(StrGV->getInitializer());
    if (Str && Str->isCString() && Str->getAsCString() == NoCaptureAttr)
      Out.insert(Fn);
  }
}

bool MangoCapturePass::shouldInstrument(
    Function &F, const DenseSet<Function *> &Annotated) {
  if (F.isDeclaration() || F.isIntrinsic())
    return false;
  // The runtime's own entry points, should a module define them. Before
  // session 38 every function named mango_* was skipped, and the stores of
  // helpers inlined into an application's mango_* function were lost at -O2
  // (found by a review).
  if (F.getName() == CaptureName || F.getName() == FastName)
    return false;
  if (&F == Fast) // C++ mangles its name (_ZL22mango_capture_try_fast...)
    return false;
  if (F.hasFnAttribute(Attribute::Naked) || F.hasFnAttribute(NoCaptureAttr) ||
      Annotated.count(&F))
    return false;
  return true;
}

// False when the target is provably not durable: this frame's stack, a
// thread-local variable, or a non-default address space.
bool MangoCapturePass::isDurableCandidate(Value *Ptr) {
  if (Ptr->getType()->isVectorTy()) // masked.scatter lanes: not analysed
    return true;
  if (Ptr->getType()->getPointerAddressSpace() != 0) {
    ++S.SkippedAddrSpace;
    return false;
  }
  const Value *U = underlying(Ptr);
  if (isa<AllocaInst>(U)) {
    ++S.SkippedStack;
    return false;
  }
  if (auto *A = dyn_cast<Argument>(U)) {
    if (A->hasByValAttr()) { // the callee's own copy, in its frame
      ++S.SkippedStack;
      return false;
    }
  }
  if (auto *GV = dyn_cast<GlobalVariable>(U)) {
    if (GV->isThreadLocal()) {
      ++S.SkippedTLS;
      return false;
    }
  }
  return true;
}

// Fills Out with the ranges I writes; false if I writes nothing we capture.
bool MangoCapturePass::classify(Instruction &I, Site &Out) {
  Out.I = &I;
  Out.Ranges.clear();
  auto addTyped = [&](Value *Ptr, Type *Ty) {
    TypeSize TS = DL->getTypeStoreSize(Ty);
    if (TS.isScalable()) {
      IRBuilder<> B(I.getNextNode());
      Value *Len = B.CreateVScale(
          ConstantInt::get(IntPtrTy, TS.getKnownMinValue()), "mango.len");
      Out.Ranges.push_back({Ptr, Len, 0, -1});
    } else if (TS.getFixedValue() != 0) {
      Out.Ranges.push_back({Ptr, nullptr, TS.getFixedValue(), -1});
    }
  };

  if (auto *SI = dyn_cast<StoreInst>(&I)) {
    if (!isDurableCandidate(SI->getPointerOperand()))
      return false;
    addTyped(SI->getPointerOperand(), SI->getValueOperand()->getType());
    if (!Out.Ranges.empty())
      ++S.Stores;
  } else if (auto *RMW = dyn_cast<AtomicRMWInst>(&I)) {
    if (!isDurableCandidate(RMW->getPointerOperand()))
      return false;
    addTyped(RMW->getPointerOperand(), RMW->getValOperand()->getType());
    ++S.Atomics;
  } else if (auto *CX = dyn_cast<AtomicCmpXchgInst>(&I)) {
    if (!isDurableCandidate(CX->getPointerOperand()))
      return false;
    addTyped(CX->getPointerOperand(), CX->getNewValOperand()->getType());
    ++S.Atomics;
  } else if (auto *MI = dyn_cast<AnyMemIntrinsic>(&I)) {
    // memcpy/memmove/memset, their .inline forms and the element-wise
    // unordered-atomic forms; length is in bytes for all of them.
    Value *Dst = MI->getRawDest();
    if (!isDurableCandidate(Dst))
      return false;
    Value *Len = MI->getLength();
    Value *Src = nullptr;
    if (auto *MT = dyn_cast<AnyMemTransferInst>(MI))
      Src = MT->getRawSource();
    if (auto *CI = dyn_cast<ConstantInt>(Len)) {
      if (CI->isZero())
        return false;
      // Long copies take the slow path anyway: test them for a self-copy.
      // Short ones keep the inline fast path (and merging).
      if (Src && CI->getZExtValue() > MaxFastLen)
        Out.Ranges.push_back({Dst, Len, 0, -1, Src});
      else
        Out.Ranges.push_back({Dst, nullptr, CI->getZExtValue(), -1});
    } else {
      Out.Ranges.push_back({Dst, Len, 0, -1, Src});
    }
    ++S.MemIntrinsics;
  } else if (auto *II = dyn_cast<IntrinsicInst>(&I)) {
    // A masked store of a whole vector (operand ValArg) at operand PtrArg:
    // the whole range, a superset.
    auto addMasked = [&](unsigned PtrArg, unsigned ValArg) {
      if (!isDurableCandidate(II->getArgOperand(PtrArg)))
        return false;
      addTyped(II->getArgOperand(PtrArg), II->getArgOperand(ValArg)->getType());
      ++S.Masked;
      return true;
    };
    switch (II->getIntrinsicID()) {
    case Intrinsic::masked_store:         // (val, ptr, align, mask)
    case Intrinsic::masked_compressstore: // (val, ptr, mask)
      return addMasked(1, 0);
    case Intrinsic::masked_scatter: { // (val, ptrs, align, mask)
      auto *VT = dyn_cast<FixedVectorType>(II->getArgOperand(0)->getType());
      if (!VT) {
        errs() << "mango-capture: warning: scalable masked.scatter in "
               << I.getFunction()->getName() << " is not captured\n";
        return false;
      }
      uint64_t ElemSize =
          DL->getTypeStoreSize(VT->getElementType()).getFixedValue();
      for (unsigned L = 0; L < VT->getNumElements(); ++L)
        Out.Ranges.push_back({II->getArgOperand(1), nullptr, ElemSize, (int)L});
      ++S.Masked;
      break;
    }
    // x86 masked stores written with intrinsics (_mm_maskmoveu_si128,
    // _mm256_maskstore_*): the generic llvm.masked.* forms above come from
    // the vectoriser, these from the source (found by a review, session 36).
    case Intrinsic::x86_sse2_maskmov_dqu: // (val, mask, ptr): 16 bytes
      return addMasked(2, 0);
    case Intrinsic::x86_avx_maskstore_pd:
    case Intrinsic::x86_avx_maskstore_pd_256:
    case Intrinsic::x86_avx_maskstore_ps:
    case Intrinsic::x86_avx_maskstore_ps_256:
    case Intrinsic::x86_avx2_maskstore_d:
    case Intrinsic::x86_avx2_maskstore_d_256:
    case Intrinsic::x86_avx2_maskstore_q:
    case Intrinsic::x86_avx2_maskstore_q_256: // (ptr, mask, val)
      return addMasked(0, 2);
    case Intrinsic::vastart: // (va_list *): va_start into durable memory
    case Intrinsic::vacopy:  // (va_list *dst, va_list *src)
      if (!VaListBytes || !isDurableCandidate(II->getArgOperand(0)))
        return false;
      Out.Ranges.push_back({II->getArgOperand(0), nullptr, VaListBytes, -1});
      break;
    default:
      warnUncaptured(*II);
      return false;
    }
  } else {
    return false;
  }
  return !Out.Ranges.empty();
}

// A target intrinsic that writes through a pointer the plugin cannot size
// (x86 scatters, fxsave/xsave, stmxcsr, movdir64b, AArch64's structured
// stores st2/st3/st4, ...): say so, once per intrinsic and module, when the
// pointer may be durable. Its stores are not captured (docs/capture.md).
// Until session 38 only x86's were named (a review found AArch64's silent).
void MangoCapturePass::warnUncaptured(IntrinsicInst &II) {
  Function *Callee = II.getCalledFunction();
  if (!Callee || !II.mayWriteToMemory() || !Callee->isTargetIntrinsic())
    return;
  bool Durable = false;
  for (Value *A : II.args())
    if (A->getType()->isPointerTy() && isDurableCandidate(A))
      Durable = true;
  if (!Durable || !Warned.insert(Callee->getName()).second)
    return;
  errs() << "mango-capture: warning: " << Callee->getName() << " in "
         << II.getFunction()->getName()
         << " writes memory the plugin cannot size: not captured (write "
            "durable memory with plain stores or memcpy instead)\n";
}

// Could I change this thread's mango_capture_active? Any real call could (the
// runtime flips the flag around a batch), and so could a direct store to it.
bool MangoCapturePass::mayChangeFlag(Instruction &I) {
  if (auto *CB = dyn_cast<CallBase>(&I)) {
    if (isa<DbgInfoIntrinsic>(CB))
      return false;
    if (auto *II = dyn_cast<IntrinsicInst>(CB)) {
      switch (II->getIntrinsicID()) {
      case Intrinsic::lifetime_start:
      case Intrinsic::lifetime_end:
      case Intrinsic::assume:
      case Intrinsic::threadlocal_address:
      case Intrinsic::masked_store:
      case Intrinsic::masked_compressstore:
      case Intrinsic::masked_scatter:
        return false;
      default:
        break;
      }
      if (isa<AnyMemIntrinsic>(II)) // could write the flag in theory...
        return underlying(cast<AnyMemIntrinsic>(II)->getRawDest()) == Flag;
      return !II->doesNotAccessMemory() && !II->onlyReadsMemory();
    }
    return true;
  }
  if (auto *SI = dyn_cast<StoreInst>(&I))
    return underlying(SI->getPointerOperand()) == Flag;
  return false;
}

Value *laneOrPtr(IRBuilder<> &B, const Range &R) {
  if (R.Lane < 0)
    return R.Ptr;
  return B.CreateExtractElement(R.Ptr, B.getInt32(R.Lane));
}

void MangoCapturePass::emitSegment(ArrayRef<Site> Seg) {
  Instruction *Last = Seg.back().I;
  Instruction *After = Last->getNextNode();
  IRBuilder<> B(After);
  B.SetCurrentDebugLocation(Last->getDebugLoc());
  LoadInst *F = B.CreateLoad(B.getInt8Ty(), Flag, "mango.active");
  Value *On = B.CreateICmpNE(F, B.getInt8(0), "mango.on");
  MDNode *Weights =
      MDBuilder(Last->getContext()).createBranchWeights(1, 1u << 20);
  Instruction *ThenTerm =
      SplitBlockAndInsertIfThen(On, After, /*Unreachable=*/false, Weights);
  ThenTerm->getParent()->setName("mango.capture");
  ++S.Checks;

  // Merge constant-length ranges through the same base pointer.
  struct Piece {
    Value *Base;
    int64_t Off;
    uint64_t Len;
    DebugLoc DLoc;
  };
  SmallVector<Piece, 8> Pieces;
  IRBuilder<> CB(ThenTerm);
  auto call = [&](Value *Ptr, Value *Len, const DebugLoc &DLoc) {
    CB.SetCurrentDebugLocation(DLoc);
    Value *L = CB.CreateZExtOrTrunc(Len, IntPtrTy);
    auto *CL = dyn_cast<ConstantInt>(L);
    if (Fast && CL && CL->getZExtValue() >= 1 &&
        CL->getZExtValue() <= MaxFastLen) {
      // if (!mango_capture_try_fast(p, len)) mango_capture(p, len);
      CallInst *Ok = CB.CreateCall(Fast, {Ptr, L}, "mango.fast");
      Ok->setDoesNotThrow();
      // Inlining needs a location in this function's subprogram when it has
      // one (else the helper's own locations would land here un-inlined).
      if (!Ok->getDebugLoc())
        if (DISubprogram *SP = Ok->getFunction()->getSubprogram())
          Ok->setDebugLoc(DILocation::get(SP->getContext(), 0, 0, SP));
      ToInline.push_back(Ok);
      Value *Miss = CB.CreateICmpEQ(
          Ok, ConstantInt::get(Ok->getType(), 0), "mango.miss");
      // Split before the cold block's terminator, which moves to the
      // continuation; CB goes on inserting before it there.
      Instruction *Term = &*CB.GetInsertPoint();
      Instruction *SlowTerm =
          SplitBlockAndInsertIfThen(Miss, Term, /*Unreachable=*/false);
      CB.SetInsertPoint(Term);
      SlowTerm->getParent()->setName("mango.slow");
      SlowTerm->getParent()->getSingleSuccessor()->setName("mango.next");
      IRBuilder<> SB(SlowTerm);
      SB.SetCurrentDebugLocation(DLoc);
      CallInst *C = SB.CreateCall(Capture, {Ptr, L});
      C->setDoesNotThrow();
      ++S.FastPaths;
      ++S.Calls;
      return;
    }
    CallInst *C = CB.CreateCall(Capture, {Ptr, L});
    C->setDoesNotThrow();
    ++S.Calls;
  };
  for (const Site &St : Seg) {
    for (const Range &R : St.Ranges) {
      if (R.SameAs) {
        // A copy onto itself changes nothing: capture 0 bytes (a variable
        // length, so it takes the mango_capture() call, which returns at
        // once for 0).
        CB.SetCurrentDebugLocation(St.I->getDebugLoc());
        Value *Self = CB.CreateICmpEQ(R.Ptr, R.SameAs, "mango.selfcopy");
        Value *L = CB.CreateZExtOrTrunc(R.Len, IntPtrTy);
        Value *Len = CB.CreateSelect(Self, ConstantInt::get(IntPtrTy, 0), L,
                                     "mango.len");
        call(R.Ptr, Len, St.I->getDebugLoc());
        continue;
      }
      if (R.Len || R.Lane >= 0) {
        Value *P = laneOrPtr(CB, R);
        call(P, R.Len ? R.Len : ConstantInt::get(IntPtrTy, R.ConstLen),
             St.I->getDebugLoc());
        continue;
      }
      APInt Off(DL->getIndexTypeSizeInBits(R.Ptr->getType()), 0);
      Value *Base = R.Ptr->stripAndAccumulateConstantOffsets(
          *DL, Off, /*AllowNonInbounds=*/true);
      Pieces.push_back(
          {Base, Off.getSExtValue(), R.ConstLen, St.I->getDebugLoc()});
    }
  }
  // Group by base, preserving first-appearance order for determinism.
  SmallVector<Value *, 8> Bases;
  for (const Piece &P : Pieces)
    if (std::find(Bases.begin(), Bases.end(), P.Base) == Bases.end())
      Bases.push_back(P.Base);
  for (Value *Base : Bases) {
    SmallVector<Piece, 8> G;
    for (const Piece &P : Pieces)
      if (P.Base == Base)
        G.push_back(P);
    std::stable_sort(G.begin(), G.end(), [](const Piece &A, const Piece &Bp) {
      return A.Off < Bp.Off;
    });
    auto at = [&](int64_t Off) -> Value * {
      if (Off == 0)
        return Base;
      return CB.CreateGEP(CB.getInt8Ty(), Base, CB.getInt64(Off), "mango.ptr");
    };
    // G[From, To) without holes: touching or overlapping pieces joined.
    auto capturePieces = [&](size_t From, size_t To) {
      size_t K = From;
      while (K < To) {
        int64_t S0 = G[K].Off, E0 = S0 + (int64_t)G[K].Len;
        DebugLoc DLoc = G[K].DLoc;
        size_t L = K + 1;
        while (L < To && G[L].Off <= E0) {
          E0 = std::max(E0, G[L].Off + (int64_t)G[L].Len);
          ++L;
        }
        call(at(S0), ConstantInt::get(IntPtrTy, (uint64_t)(E0 - S0)), DLoc);
        K = L;
      }
    };
    size_t I = 0;
    while (I < G.size()) {
      int64_t Start = G[I].Off;
      int64_t End = Start + (int64_t)G[I].Len;
      DebugLoc DLoc = G[I].DLoc;
      bool Holes = false;
      size_t J = I + 1;
      while (J < G.size() && G[J].Off <= End + (int64_t)MaxMergeGap &&
             (uint64_t)(std::max(End, G[J].Off + (int64_t)G[J].Len) - Start) <=
                 MaxMergedSpan) {
        Holes |= G[J].Off > End;
        End = std::max(End, G[J].Off + (int64_t)G[J].Len);
        ++J;
      }
      Value *Ptr = at(Start);
      Value *Len = ConstantInt::get(IntPtrTy, (uint64_t)(End - Start));
      if (!Holes) {
        call(Ptr, Len, DLoc);
      } else if (!FastPathVar || isa<GlobalVariable>(Base)) {
        capturePieces(I, J); // a global is never in the heap
      } else {
        // if ((uintptr_t)ptr - heap_lo < heap_size) capture(merged);
        // else capture each piece.
        CB.SetCurrentDebugLocation(DLoc);
        Value *Lo = CB.CreateLoad(IntPtrTy, FastPathVar, "mango.heap_lo");
        Value *SizeAt = CB.CreateConstGEP1_64(
            CB.getInt8Ty(), FastPathVar, DL->getTypeAllocSize(IntPtrTy));
        Value *Size = CB.CreateLoad(IntPtrTy, SizeAt, "mango.heap_size");
        Value *Rel = CB.CreateSub(CB.CreatePtrToInt(Ptr, IntPtrTy), Lo);
        Value *InHeap = CB.CreateICmpULT(Rel, Size, "mango.in_heap");
        Instruction *Term = &*CB.GetInsertPoint();
        Instruction *ThenT = nullptr, *ElseT = nullptr;
        SplitBlockAndInsertIfThenElse(InHeap, Term, &ThenT, &ElseT);
        ThenT->getParent()->setName("mango.merged");
        ElseT->getParent()->setName("mango.pieces");
        CB.SetInsertPoint(ThenT);
        call(Ptr, Len, DLoc);
        CB.SetInsertPoint(ElseT);
        capturePieces(I, J);
        CB.SetInsertPoint(Term);
        ++S.GappyMerges;
      }
      I = J;
    }
  }
}

bool MangoCapturePass::instrumentFunction(Function &F) {
  // Collect segments first: splitting blocks keeps instruction pointers.
  SmallVector<SmallVector<Site, 4>, 16> Segments;
  for (BasicBlock &BB : F) {
    SmallVector<Site, 4> Cur;
    for (Instruction &I : BB) {
      Site St;
      if (classify(I, St)) {
        Cur.push_back(std::move(St));
        continue;
      }
      if (!Cur.empty() && mayChangeFlag(I)) {
        Segments.push_back(std::move(Cur));
        Cur.clear();
      }
    }
    if (!Cur.empty())
      Segments.push_back(std::move(Cur));
  }
  if (Segments.empty())
    return false;
  for (auto &Seg : Segments)
    emitSegment(Seg);
  ++S.Functions;
  return true;
}

// The helper of include/mango_capture_inline.h, if this module defines it
// with the expected type: i32 (ptr, iN) with iN the pointer-sized integer.
// (C++ mangles the static function and makes its extern "C" name an alias.)
Function *MangoCapturePass::findFastPath(Module &M) {
  FastAlias = nullptr;
  Function *F = M.getFunction(FastName);
  if (!F) {
    if (GlobalAlias *GA = M.getNamedAlias(FastName)) {
      F = dyn_cast<Function>(GA->getAliasee()->stripPointerCasts());
      if (F)
        FastAlias = GA;
    }
  }
  if (!F || F->isDeclaration())
    return nullptr;
  FunctionType *FT = F->getFunctionType();
  if (FT->getNumParams() != 2 || !FT->getReturnType()->isIntegerTy() ||
      !FT->getParamType(0)->isPointerTy() || FT->getParamType(1) != IntPtrTy ||
      F->isVarArg()) {
    errs() << "mango-capture: warning: " << FastName
           << " has an unexpected type; fast path not used\n";
    return nullptr;
  }
  return F;
}

// Inline every call the pass made to the helper, then delete the helper (its
// `used` attribute only kept it alive for us).
void MangoCapturePass::inlineFastPaths(Module &M) {
  if (!Fast)
    return;
  for (CallInst *C : ToInline) {
    InlineFunctionInfo IFI;
    InlineResult R = InlineFunction(*C, IFI);
    if (!R.isSuccess())
      errs() << "mango-capture: warning: could not inline " << FastName
             << " into " << C->getFunction()->getName() << ": "
             << R.getFailureReason() << "\n";
    // A call left in place still works: the helper then stays defined.
  }
  ToInline.clear();
  removeFromUsedLists(M, [&](Constant *C) {
    Constant *S = C->stripPointerCasts();
    return S == Fast || (FastAlias && S == FastAlias);
  });
  if (FastAlias) {
    FastAlias->removeDeadConstantUsers(); // the old used-list array
    if (FastAlias->use_empty() && FastAlias->hasLocalLinkage())
      FastAlias->eraseFromParent();
    else if (FastAlias->hasLocalLinkage())
      appendToCompilerUsed(M, {FastAlias});
    FastAlias = nullptr;
  }
  Fast->removeDeadConstantUsers(); // the old used-list array
  if (Fast->use_empty() && Fast->hasLocalLinkage())
    Fast->eraseFromParent();
  else if (Fast->hasLocalLinkage())
    appendToCompilerUsed(M, {Fast}); // still called: keep it alive
  Fast = nullptr;
}

void stripFnAttrs(AttributeList &AL, LLVMContext &C, unsigned NumParams,
                  ArrayRef<Type *> ParamTys, bool &Changed) {
  const Attribute::AttrKind FnKinds[] = {Attribute::Memory, Attribute::NoSync};
  const Attribute::AttrKind ParamKinds[] = {
      Attribute::ReadOnly, Attribute::ReadNone, Attribute::WriteOnly,
      Attribute::NoCapture};
  for (auto K : FnKinds)
    if (AL.hasFnAttr(K)) {
      AL = AL.removeFnAttribute(C, K);
      Changed = true;
    }
  for (unsigned A = 0; A < NumParams; ++A) {
    if (A < ParamTys.size() && !ParamTys[A]->isPtrOrPtrVectorTy())
      continue;
    for (auto K : ParamKinds)
      if (AL.hasParamAttr(A, K)) {
        AL = AL.removeParamAttribute(C, A, K);
        Changed = true;
      }
  }
}

void MangoCapturePass::stripAttributes(Module &M) {
  LLVMContext &C = M.getContext();
  for (Function &F : M) {
    if (F.isDeclaration())
      continue;
    AttributeList AL = F.getAttributes();
    SmallVector<Type *, 8> Tys(F.getFunctionType()->params());
    bool Changed = false;
    stripFnAttrs(AL, C, F.arg_size(), Tys, Changed);
    if (Changed) {
      F.setAttributes(AL);
      ++S.StrippedFns;
    }
  }
  for (Function &F : M) {
    for (Instruction &I : instructions(F)) {
      auto *CB = dyn_cast<CallBase>(&I);
      if (!CB)
        continue;
      Function *Callee = CB->getCalledFunction();
      if (Callee && (Callee->isDeclaration() || Callee->isIntrinsic()))
        continue; // external or intrinsic: its attributes are its own
      AttributeList AL = CB->getAttributes();
      SmallVector<Type *, 8> Tys;
      for (Value *A : CB->args())
        Tys.push_back(A->getType());
      bool Changed = false;
      stripFnAttrs(AL, C, CB->arg_size(), Tys, Changed);
      if (Changed) {
        CB->setAttributes(AL);
        ++S.StrippedCalls;
      }
    }
  }
}

PreservedAnalyses MangoCapturePass::run(Module &M, ModuleAnalysisManager &) {
  if (M.getModuleFlag(DoneFlag))
    return PreservedAnalyses::all();
  S = Stats();
  DL = &M.getDataLayout();
  {
    Triple T(M.getTargetTriple());
    VaListBytes = T.getArch() == Triple::x86_64 ? 24 : T.getArch() == Triple::aarch64 ? 32 : 0;
  }
  LLVMContext &C = M.getContext();
  IntPtrTy = DL->getIntPtrType(C);

  DenseSet<Function *> Annotated;
  collectAnnotated(M, Annotated);

  Flag = M.getNamedGlobal(FlagName);
  if (!Flag) {
    Flag = new GlobalVariable(M, Type::getInt8Ty(C), /*isConstant=*/false,
                              GlobalValue::ExternalLinkage, nullptr, FlagName,
                              nullptr, GlobalValue::InitialExecTLSModel);
  }
  Capture = M.getOrInsertFunction(
      CaptureName, FunctionType::get(Type::getVoidTy(C),
                                     {PointerType::get(C, 0), IntPtrTy},
                                     false));

  Fast = findFastPath(M);
  FastPathVar = Fast ? M.getNamedGlobal(FastPathVarName) : nullptr;
  ToInline.clear();

  for (Function &F : M)
    if (shouldInstrument(F, Annotated))
      instrumentFunction(F);
  inlineFastPaths(M);
  stripAttributes(M);
  M.addModuleFlag(Module::Warning, DoneFlag, 1);

  if (const char *E = std::getenv("MANGO_CC_STATS"); E && *E && *E != '0') {
    errs() << "mango-capture: " << M.getSourceFileName()
           << ": functions=" << S.Functions << " stores=" << S.Stores
           << " atomics=" << S.Atomics << " memintrinsics=" << S.MemIntrinsics
           << " masked=" << S.Masked << " checks=" << S.Checks
           << " calls=" << S.Calls << " fast_paths=" << S.FastPaths
           << " skipped_stack=" << S.SkippedStack
           << " skipped_tls=" << S.SkippedTLS
           << " skipped_addrspace=" << S.SkippedAddrSpace
           << " stripped_fns=" << S.StrippedFns
           << " stripped_calls=" << S.StrippedCalls
           << " merges_with_holes=" << S.GappyMerges << "\n";
  }
  return PreservedAnalyses::none();
}

} // namespace

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "MangoCapture", "0.1",
          [](PassBuilder &PB) {
            PB.registerOptimizerLastEPCallback(
                [](ModulePassManager &MPM, OptimizationLevel) {
                  MPM.addPass(MangoCapturePass());
                });
            PB.registerPipelineParsingCallback(
                [](StringRef Name, ModulePassManager &MPM,
                   ArrayRef<PassBuilder::PipelineElement>) {
                  if (Name != "mango-capture")
                    return false;
                  MPM.addPass(MangoCapturePass());
                  return true;
                });
          }};
}
