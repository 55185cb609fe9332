// libstdcxx_interpose.cpp -- capture for non-template libstdc++ code that
// writes into the caller's (possibly durable) objects.
//
// (Also the guards of function-local statics, below.)
// std::unordered_map's rehash policy keeps a mutable _M_next_resize member
// that _Prime_rehash_policy::_M_need_rehash and _M_next_bkt (compiled into
// libstdc++.so) update. These definitions, linked into the executable,
// interpose the library's, call the real functions found with
// dlsym(RTLD_NEXT) and report the policy object while a read-write command
// runs. See docs/capture.md.
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstddef>
#include <unordered_map>
#include <utility>

#include "mango.h"

namespace {
using policy = std::__detail::_Prime_rehash_policy;
using need_rehash_fn = std::pair<bool, std::size_t> (*)(const policy *, std::size_t, std::size_t,
                                                        std::size_t);
using next_bkt_fn = std::size_t (*)(const policy *, std::size_t);

// Resolved before main, never lazily: a function-local static would be
// initialised (and its guard written, uncaptured) inside a read-write command.
need_rehash_fn real_need_rehash;
next_bkt_fn real_next_bkt;
using guard_fn = void (*)(__cxxabiv1::__guard *);
guard_fn real_guard_release, real_guard_abort;

__attribute__((constructor)) void resolve_real()
{
    real_need_rehash = reinterpret_cast<need_rehash_fn>(
        dlsym(RTLD_NEXT, "_ZNKSt8__detail20_Prime_rehash_policy14_M_need_rehashEmmm"));
    real_next_bkt = reinterpret_cast<next_bkt_fn>(
        dlsym(RTLD_NEXT, "_ZNKSt8__detail20_Prime_rehash_policy11_M_next_bktEm"));
    real_guard_release = reinterpret_cast<guard_fn>(dlsym(RTLD_NEXT, "__cxa_guard_release"));
    real_guard_abort = reinterpret_cast<guard_fn>(dlsym(RTLD_NEXT, "__cxa_guard_abort"));
}
} // namespace

// A function-local static's guard is set by libsupc++ when its constructor
// has run: without it, the static's contents were restored after a crash but
// its guard was not, so the constructor ran again over them (found by a
// review, session 36).
namespace __cxxabiv1 {
extern "C" void __cxa_guard_release(__guard *g) noexcept
{
    real_guard_release(g);
    if (mango_capture_active)
        mango_capture(g, sizeof *g);
}

extern "C" void __cxa_guard_abort(__guard *g) noexcept
{
    real_guard_abort(g);
    if (mango_capture_active)
        mango_capture(g, sizeof *g);
}
} // namespace __cxxabiv1

namespace std {
namespace __detail {

std::pair<bool, std::size_t> _Prime_rehash_policy::_M_need_rehash(std::size_t n_bkt,
                                                                  std::size_t n_elt,
                                                                  std::size_t n_ins) const
{
    std::pair<bool, std::size_t> r = real_need_rehash(this, n_bkt, n_elt, n_ins);
    if (mango_capture_active)
        mango_capture(this, sizeof *this);
    return r;
}

std::size_t _Prime_rehash_policy::_M_next_bkt(std::size_t n) const
{
    std::size_t r = real_next_bkt(this, n);
    if (mango_capture_active)
        mango_capture(this, sizeof *this);
    return r;
}

} // namespace __detail
} // namespace std
