/* signal_interpose.c -- the application's signal handlers run outside capture.
 *
 * A signal handler may interrupt a thread anywhere, including a read-write
 * command in the middle of recording a store: the dedup set's insert
 * (mango_capture_inline.h, dedup_set.h) is several plain stores, and the
 * durable heap has no locks. A handler built with mango-cc that stored to
 * durable memory (a flag in .bss) inserted into the same set re-entrantly:
 * two blocks could take one entry of the set's list of used slots, one of
 * them was then never logged, and every later store to it in the process
 * was dropped as already recorded (found by a review, session 38: 64 of 64
 * blocks missed after a timer signal stored into them). A handler that
 * allocated could likewise enter the durable heap half-way through an
 * allocation.
 *
 * So every handler the program installs through sigaction() or signal()
 * (and its aliases bsd_signal, ssignal, sysv_signal) is run by a trampoline
 * that clears this thread's capture flag and its read-write allocation flag
 * for the handler and restores both when it returns: a handler's stores are
 * never part of a batch (like any store outside a read-write command), its
 * allocations are transient, and it never touches the set or the heap.
 * sigaction()'s old action reports the program's handler and flags, never
 * the trampoline. SIG_DFL and SIG_IGN are passed through. The trampoline
 * is installed with SA_SIGINFO and calls the handler with the three
 * arguments of one; a one-argument handler ignores the other two (as glibc
 * itself does on the ABIs it supports).
 *
 * A handler that does not return (siglongjmp out of it) leaves the flags
 * cleared, so the stores that follow in its command would be missed: the
 * trampoline counts the handlers running on the thread, and a batch that
 * ends with one still counted fails instead of committing
 * (signal_handlers_unreturned(), checked by the runtime). The count is reset
 * when a batch begins: leaving a handler that way between batches loses
 * nothing.
 *
 * Also interposed, so that the program's view stays glibc's: siginterrupt
 * (signal() leaves SA_RESTART off for the signals it names) and sigset (its
 * handlers are wrapped too). Calls glibc makes to itself (system(),
 * posix_spawn) use its internal sigaction and are not seen; they install no
 * application handler. A raw rt_sigaction system call is not seen either.
 *
 * Installations are serialised process-wide (a lock taken with every signal
 * blocked on the calling thread, so a handler that installs one cannot wait
 * for its own thread): two threads installing handlers for one signal at
 * the same moment left the kernel with one call's mask and flags and the
 * table with the other's handler (found by a review, session 38; fixed in
 * session 39).
 *
 * Not handled (documented in docs/capture.md): a vfork() child that
 * installs a handler writes the parent's table; and a handler left by
 * siglongjmp during a command stops the runtime's writes for good (the
 * batch cannot be committed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "alloc/split_alloc.h"
#include "capture/capture.h"

/* glibc's sigaction under its second exported name (not defined here). */
extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *oldact);

#ifndef _NSIG
#define _NSIG 65
#endif

/* The program's handler and flags for each signal (what sigaction reports);
 * the handler is read by the trampoline at any time, so it is stored before
 * the trampoline is installed and read atomically. */
static void *program_handler[_NSIG];
static int program_flags[_NSIG];

static __thread unsigned handlers_running __attribute__((tls_model("initial-exec")));

static void trampoline(int sig, siginfo_t *info, void *uctx)
{
    bool capturing = mango_capture_active, rw = split_alloc_rw_thread;
    mango_capture_active = false;
    split_alloc_rw_thread = false;
    handlers_running++;
    void *h = sig > 0 && sig < _NSIG ? __atomic_load_n(&program_handler[sig], __ATOMIC_ACQUIRE) : NULL;
    if (h != NULL)
        ((void (*)(int, siginfo_t *, void *))h)(sig, info, uctx);
    handlers_running--;
    split_alloc_rw_thread = rw;
    mango_capture_active = capturing;
}

unsigned signal_handlers_unreturned(void) { return handlers_running; }
void signal_handlers_reset(void) { handlers_running = 0; }

static bool wraps(void *h) { return h != (void *)SIG_DFL && h != (void *)SIG_IGN && h != (void *)SIG_ERR; }

static int install(int sig, const struct sigaction *act, struct sigaction *oldact);

/* One installation at a time (see the top of this file). */
static atomic_flag installing = ATOMIC_FLAG_INIT;

/* Every signal blocked on this thread (the old mask in *saved), then the
 * lock; unlock_installs gives both back. */
static void lock_installs(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, saved);
    while (atomic_flag_test_and_set_explicit(&installing, memory_order_acquire))
        sched_yield();
}

static void unlock_installs(const sigset_t *saved)
{
    atomic_flag_clear_explicit(&installing, memory_order_release);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* fork(): the lock is held across it, so that a child never inherits it
 * held by a thread that does not exist there (its first sigaction spun for
 * good with every signal blocked: mango's snapshot writer calls signal()
 * right after its fork; found by a review, session 39) nor a table half
 * updated. The forking thread's signals are blocked meanwhile. */
static __thread sigset_t fork_saved_mask;

static void before_fork(void) { lock_installs(&fork_saved_mask); }
static void after_fork(void) { unlock_installs(&fork_saved_mask); }

__attribute__((constructor)) static void signal_interpose_init(void)
{
    if (pthread_atfork(before_fork, after_fork, after_fork) != 0) {
        static const char msg[] = "mangosteen: pthread_atfork failed: a fork() during a sigaction may leave "
                                  "the child's sigaction waiting for good\n";
        (void)!write(2, msg, sizeof msg - 1);
    }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *oldact)
{
    if (sig <= 0 || sig >= _NSIG)
        return __sigaction(sig, act, oldact);
    sigset_t saved;
    lock_installs(&saved);
    int rc = install(sig, act, oldact);
    int e = errno;
    unlock_installs(&saved);
    errno = e;
    return rc;
}

/* The table and the kernel's action for sig, under the lock. */
static int install(int sig, const struct sigaction *act, struct sigaction *oldact)
{
    struct sigaction old;
    struct sigaction mine;
    const struct sigaction *use = act;
    bool table = false; /* the program's handler goes into the table */
    if (act != NULL) {
        void *h = (act->sa_flags & SA_SIGINFO) ? (void *)act->sa_sigaction : (void *)act->sa_handler;
        if (wraps(h)) {
            mine = *act;
            mine.sa_sigaction = trampoline;
            mine.sa_flags |= SA_SIGINFO;
            use = &mine;
            /* The trampoline itself, read back past this wrapper (a raw
             * rt_sigaction, glibc's internal calls): installed again as it
             * is, the table keeps the program's handler. Stored there, it
             * would call itself until the stack ran out (found by a
             * review, session 38). */
            table = h != (void *)trampoline;
        }
    }
    /* The old action first, then the table, then the kernel: a signal that
     * arrives in between runs the old handler or the new one, never none. */
    void *prev_h = __atomic_load_n(&program_handler[sig], __ATOMIC_ACQUIRE);
    int prev_flags = program_flags[sig];
    if (table) {
        __atomic_store_n(&program_handler[sig], (act->sa_flags & SA_SIGINFO) ? (void *)act->sa_sigaction
                                                                           : (void *)act->sa_handler,
                         __ATOMIC_RELEASE);
        program_flags[sig] = act->sa_flags;
    }
    int rc = __sigaction(sig, use, &old);
    if (rc != 0) {
        if (table) { /* refused: as it was */
            __atomic_store_n(&program_handler[sig], prev_h, __ATOMIC_RELEASE);
            program_flags[sig] = prev_flags;
        }
        return rc;
    }
    if (oldact != NULL) {
        *oldact = old;
        if (old.sa_sigaction == trampoline) { /* report the program's own */
            oldact->sa_flags = prev_flags;
            if (prev_flags & SA_SIGINFO)
                oldact->sa_sigaction = (void (*)(int, siginfo_t *, void *))prev_h;
            else
                oldact->sa_handler = (void (*)(int))prev_h;
        }
    }
    return 0;
}

/* Signals siginterrupt() asked to interrupt system calls: signal() then
 * installs them without SA_RESTART, as glibc's does. */
static sigset_t interrupting;

int siginterrupt(int sig, int flag)
{
    struct sigaction act;
    if (sig <= 0 || sig >= _NSIG || sigaction(sig, NULL, &act) != 0) {
        errno = EINVAL;
        return -1;
    }
    if (flag) {
        sigaddset(&interrupting, sig);
        act.sa_flags &= ~SA_RESTART;
    } else {
        sigdelset(&interrupting, sig);
        act.sa_flags |= SA_RESTART;
    }
    return sigaction(sig, &act, NULL);
}

/* signal() with BSD semantics (glibc's): restart (unless siginterrupt said
 * otherwise), the signal blocked in its handler. sysv_signal: reset to
 * SIG_DFL on delivery, not blocked. */
static sighandler_t set_handler(int sig, sighandler_t h, int flags, bool block_self)
{
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = h;
    act.sa_flags = flags;
    sigemptyset(&act.sa_mask);
    if (block_self && sig > 0 && sig < _NSIG && sigaddset(&act.sa_mask, sig) != 0)
        return SIG_ERR;
    if (h == SIG_ERR || sigaction(sig, &act, &old) != 0) {
        if (h == SIG_ERR)
            errno = EINVAL;
        return SIG_ERR;
    }
    return old.sa_handler;
}

static int bsd_flags(int sig)
{
    return sig > 0 && sig < _NSIG && sigismember(&interrupting, sig) == 1 ? 0 : SA_RESTART;
}

sighandler_t signal(int sig, sighandler_t h) { return set_handler(sig, h, bsd_flags(sig), true); }
sighandler_t bsd_signal(int sig, sighandler_t h) { return set_handler(sig, h, bsd_flags(sig), true); }
sighandler_t ssignal(int sig, sighandler_t h) { return set_handler(sig, h, bsd_flags(sig), true); }
sighandler_t sysv_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESETHAND | SA_NODEFER, false); }
sighandler_t __sysv_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESETHAND | SA_NODEFER, false); }

/* System V's sigset(): SIG_HOLD blocks the signal; anything else installs
 * the disposition (no flags, nothing blocked in the handler) and unblocks
 * it. Returns SIG_HOLD if the signal was blocked, else the old disposition.
 * glibc's calls its internal sigaction, which this file does not see. */
sighandler_t sigset(int sig, sighandler_t disp)
{
    sigset_t one, old_mask;
    sigemptyset(&one);
    if (sig <= 0 || sig >= _NSIG || sigaddset(&one, sig) != 0) {
        errno = EINVAL;
        return SIG_ERR;
    }
    struct sigaction act, old;
    if (disp == SIG_HOLD) {
        if (sigaction(sig, NULL, &old) != 0 || sigprocmask(SIG_BLOCK, &one, &old_mask) != 0)
            return SIG_ERR;
        return sigismember(&old_mask, sig) == 1 ? SIG_HOLD : old.sa_handler;
    }
    memset(&act, 0, sizeof act);
    act.sa_handler = disp;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0 || sigprocmask(SIG_UNBLOCK, &one, &old_mask) != 0)
        return SIG_ERR;
    return sigismember(&old_mask, sig) == 1 ? SIG_HOLD : old.sa_handler;
}

/* Referenced by mango_init so this file is always linked in. */
void signal_interpose_link_anchor(void) {}
