/* futex_wait.h -- spin-then-sleep waiting on a 32-bit atomic word.
 *
 * Owns the blocking primitive used by the concurrency layer. A waiter spins a
 * bounded number of pause iterations, then announces itself in a per-word
 * waiter counter and sleeps in FUTEX_WAIT. A waker changes the word with a
 * seq_cst store/RMW and then calls fw_wake(), which issues FUTEX_WAKE only when
 * the counter says someone is (or is about to be) asleep, so the uncontended
 * path never enters the kernel.
 *
 * Why no wake-up is lost: the waiter does
 *     waiters++ (seq_cst RMW);  re-load word (seq_cst);  FUTEX_WAIT(word, v)
 * and the waker does
 *     word = new (seq_cst);     load waiters (seq_cst);  wake if non-zero.
 * Under seq_cst, at least one side sees the other's write: either the waker
 * sees waiters != 0 and wakes, or the waiter sees the new value and does not
 * sleep. The kernel re-checks word == v atomically against concurrent wakes,
 * which closes the window between the waiter's re-load and its sleep.
 *
 * All words are process-private, so the *_PRIVATE futex ops are used.
 */
#ifndef MANGO_FUTEX_WAIT_H
#define MANGO_FUTEX_WAIT_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Pause iterations before falling back to the kernel. Short on purpose: the
 * target machines have few cores and often more runnable threads than cores,
 * so a long spin only steals time from the thread we are waiting for. */
#ifndef FW_SPIN_ITERS
#define FW_SPIN_ITERS 150
#endif

static inline void fw_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static inline void fw_futex_wait(_Atomic uint32_t *word, uint32_t expected)
{
    /* EINTR / EAGAIN / spurious returns are all fine: callers loop. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL,
            NULL, 0);
}

static inline void fw_futex_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Spin at most `iters` pauses while *word == v. Returns true if the word
 * changed (acquire ordering on the load that saw the change). */
static inline bool fw_spin_while_eq(_Atomic uint32_t *word, uint32_t v,
                                    unsigned iters)
{
    for (unsigned i = 0; i < iters; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != v)
            return true;
        fw_pause();
    }
    return atomic_load_explicit(word, memory_order_acquire) != v;
}

/* Sleep (no spinning) until *word != v. `waiters` counts sleepers on `word`. */
static inline void fw_sleep_while_eq(_Atomic uint32_t *word,
                                     _Atomic uint32_t *waiters, uint32_t v)
{
    atomic_fetch_add_explicit(waiters, 1, memory_order_seq_cst);
    while (atomic_load_explicit(word, memory_order_seq_cst) == v)
        fw_futex_wait(word, v);
    atomic_fetch_sub_explicit(waiters, 1, memory_order_relaxed);
}

/* Sleep once (no spinning) while *word == v: returns after one wake-up (or at
 * once if *word already differs), so the caller can recheck other state that
 * the waker changed before it changed *word. */
static inline void fw_sleep_once_if_eq(_Atomic uint32_t *word,
                                       _Atomic uint32_t *waiters, uint32_t v)
{
    atomic_fetch_add_explicit(waiters, 1, memory_order_seq_cst);
    if (atomic_load_explicit(word, memory_order_seq_cst) == v)
        fw_futex_wait(word, v);
    atomic_fetch_sub_explicit(waiters, 1, memory_order_relaxed);
}

/* Wait until *word != v: bounded spin, then futex sleep. */
static inline void fw_wait_while_eq(_Atomic uint32_t *word,
                                    _Atomic uint32_t *waiters, uint32_t v)
{
    if (fw_spin_while_eq(word, v, FW_SPIN_ITERS))
        return;
    fw_sleep_while_eq(word, waiters, v);
}

/* Call right after changing *word with a seq_cst store or RMW. Wakes all
 * sleepers on `word`, but only enters the kernel if there are any. */
static inline void fw_wake(_Atomic uint32_t *word, _Atomic uint32_t *waiters)
{
    if (atomic_load_explicit(waiters, memory_order_seq_cst) != 0)
        fw_futex_wake(word, INT_MAX);
}

#endif
