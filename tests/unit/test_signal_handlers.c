/* test_signal_handlers.c -- the application's signal handlers run outside
 * capture (src/capture/signal_interpose.c).
 *
 *  1. sigaction() and signal() report the program's own handler and flags
 *     as the old action (never the trampoline that runs it), SIG_IGN and
 *     SIG_DFL pass through, a bad signal number fails as before; signal()
 *     honours siginterrupt() (no SA_RESTART), sigset() is wrapped too, and
 *     the trampoline read back with a raw rt_sigaction and installed again
 *     runs the program's handler once (it used to call itself);
 *  2. a handler raised inside a read-write command runs with the thread's
 *     capture flag and read-write allocation flag off (its malloc comes from
 *     glibc, not the durable heap), and both are on again when it returns;
 *     an SA_SIGINFO handler gets its siginfo (sigqueue's value);
 *  3. a handler that leaves by siglongjmp inside a command makes that batch
 *     fail instead of committing, with a message naming the cause, and the
 *     runtime refuses writes after it (in a forked child, each mode); one
 *     left that way outside any command loses nothing and fails nothing.
 *  4. four threads installing handlers for one signal at once, stopped
 *     together (200 rounds): afterwards the kernel's mask is the one that
 *     came with the handler the table runs (each thread's mask names it). Without the
 *     lock around an installation they disagreed (found by a review,
 *     session 38).
 *  5. while a thread keeps installing a handler, 200 fork() children each
 *     install one and exit: none may hang (the lock of 4, held by the
 *     installing thread at the fork, stayed held in the child, whose
 *     sigaction spun for good with every signal blocked: 74 of 200 children
 *     before the fork handlers; found by a review, session 39).
 * The plugin-built half (a timer signal storing into durable memory while
 * commands run, under the capture verifier) is capture.corpus_signal.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/durable_heap.h"
#include "alloc/split_alloc.h"
#include "capture/capture.h"
#include "mango.h"

#include "check.h"
#include "test_config.h"

/* siginterrupt and sigset are deprecated, and still what some programs call. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static char pool_path[128];

/* ---- 1. what sigaction and signal report ---- */

static void plain_handler(int sig) { (void)sig; }
static void other_handler(int sig) { (void)sig; }
static void info_handler(int sig, siginfo_t *si, void *uc) { (void)sig, (void)si, (void)uc; }

static void test_reported_actions(void)
{
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = plain_handler;
    act.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGUSR1, &act, NULL) == 0);
    memset(&old, 0, sizeof old);
    CHECK(sigaction(SIGUSR1, NULL, &old) == 0);
    CHECK(old.sa_handler == plain_handler && (old.sa_flags & SA_SIGINFO) == 0 && (old.sa_flags & SA_RESTART));

    memset(&act, 0, sizeof act);
    act.sa_sigaction = info_handler;
    act.sa_flags = SA_SIGINFO;
    CHECK(sigaction(SIGUSR1, &act, &old) == 0);
    CHECK(old.sa_handler == plain_handler && (old.sa_flags & SA_SIGINFO) == 0);
    CHECK(sigaction(SIGUSR1, NULL, &old) == 0);
    CHECK(old.sa_sigaction == info_handler && (old.sa_flags & SA_SIGINFO));

    CHECK((void *)signal(SIGUSR1, other_handler) == (void *)info_handler); /* the old one, an SA_SIGINFO function */
    CHECK(signal(SIGUSR1, SIG_IGN) == other_handler);
    CHECK(raise(SIGUSR1) == 0); /* ignored: the process lives */
    CHECK(signal(SIGUSR1, SIG_DFL) == SIG_IGN);
    CHECK(sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler == SIG_DFL);
    CHECK(sysv_signal(SIGUSR2, plain_handler) == SIG_DFL);
    CHECK(signal(SIGUSR2, SIG_DFL) == plain_handler);

    CHECK(sigaction(0, &act, NULL) == -1);
    CHECK(sigaction(SIGKILL, &act, NULL) == -1); /* refused by the kernel: the table keeps the old */
    CHECK(sigaction(SIGKILL, NULL, &old) == 0 && old.sa_handler == SIG_DFL);
    CHECK(signal(1000, plain_handler) == SIG_ERR);
}

/* ---- 1b. glibc's other ways in: siginterrupt, sigset, the trampoline read
 * back past the wrapper and installed again (found by a review) ---- */

struct kernel_action {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

/* What the kernel holds for sig (the trampoline, for a wrapped handler). */
static struct kernel_action kernel_action(int sig)
{
    struct kernel_action k;
    memset(&k, 0, sizeof k);
    syscall(SYS_rt_sigaction, sig, NULL, &k, sizeof k.mask);
    return k;
}

static volatile int counted;
static void counting_handler(int sig)
{
    (void)sig;
    counted++;
}

static void test_glibc_views(void)
{
    /* siginterrupt: signal() leaves SA_RESTART off, as glibc's does. */
    CHECK(siginterrupt(SIGUSR2, 1) == 0);
    CHECK(signal(SIGUSR2, counting_handler) != SIG_ERR);
    CHECK((kernel_action(SIGUSR2).flags & SA_RESTART) == 0);
    CHECK(siginterrupt(SIGUSR2, 0) == 0);
    CHECK((kernel_action(SIGUSR2).flags & SA_RESTART) != 0);
    struct sigaction old;
    CHECK(sigaction(SIGUSR2, NULL, &old) == 0 && old.sa_handler == counting_handler);

    /* The trampoline installed again: the program's handler runs once (it
     * called itself until the stack ran out). */
    void *tramp = kernel_action(SIGUSR2).handler;
    CHECK(tramp != NULL && tramp != (void *)counting_handler);
    CHECK(signal(SIGUSR2, (sighandler_t)tramp) == counting_handler);
    counted = 0;
    CHECK(raise(SIGUSR2) == 0);
    CHECK(counted == 1);

    /* sigset: wrapped like the others, SIG_HOLD blocks, a disposition
     * unblocks (the held signal arrives then). */
    CHECK(sigset(SIGUSR2, SIG_DFL) == counting_handler);
    CHECK(sigset(SIGUSR2, counting_handler) == SIG_DFL);
    CHECK(kernel_action(SIGUSR2).handler == tramp);
    CHECK(sigset(SIGUSR2, SIG_HOLD) == counting_handler);
    counted = 0;
    CHECK(raise(SIGUSR2) == 0);
    CHECK(counted == 0);
    CHECK(sigset(SIGUSR2, counting_handler) == SIG_HOLD);
    CHECK(counted == 1);
    CHECK(signal(SIGUSR2, SIG_DFL) == counting_handler);
}

/* ---- 2. a handler inside a read-write command ---- */

typedef struct seen {
    int calls;
    bool capturing, rw_alloc, malloc_durable;
    int value;
} seen;
static volatile seen in_handler;

static void probe_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    in_handler.calls++;
    in_handler.capturing = mango_capture_active;
    in_handler.rw_alloc = split_alloc_rw_thread;
    void *p = malloc(64);
    in_handler.malloc_durable = dheap_contains(p);
    free(p);
    in_handler.value = si && si->si_code == SI_QUEUE ? si->si_value.sival_int : -1;
}

typedef struct probe_cmd {
    bool before, after, after_rw;
} probe_cmd;

static bool never_ro(void *ctx) { (void)ctx; return false; }

static void (*command_body)(void *ctx);
static void process(void *ctx) { command_body(ctx); }

static void raise_inside(void *ctx)
{
    probe_cmd *c = ctx;
    c->before = mango_capture_active;
    union sigval v = {.sival_int = 4242};
    sigqueue(getpid(), SIGUSR1, v);
    c->after = mango_capture_active;
    c->after_rw = split_alloc_rw_thread;
}

static int start(mango_persist_mode mode)
{
    mango_config cfg;
    small_test_config(&cfg, pool_path, mode);
    mango_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.is_read_only = never_ro;
    cb.process_request = process;
    int rc = mango_init(&cfg, &cb);
    return rc >= 0 ? 0 : rc; /* MANGO_FRESH or MANGO_RECOVERED */
}

static void test_handler_inside_a_command(void)
{
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = probe_handler;
    act.sa_flags = SA_SIGINFO;
    CHECK(sigaction(SIGUSR1, &act, NULL) == 0);
    unlink(pool_path);
    CHECK(start(MANGO_PERSIST_EMULATED) == 0);
    command_body = raise_inside;
    probe_cmd c = {0};
    CHECK(mango_client_cmd(&c) == 0);
    CHECK(in_handler.calls == 1);
    CHECK(c.before && c.after && c.after_rw); /* the command captures before and after */
    CHECK(!in_handler.capturing && !in_handler.rw_alloc && !in_handler.malloc_durable);
    CHECK(in_handler.value == 4242);
    CHECK(mango_shutdown() == 0);
    signal(SIGUSR1, SIG_DFL);
    unlink(pool_path);
}

/* ---- 3. a handler left by siglongjmp ---- */

static sigjmp_buf jump_back;
static void jumping_handler(int sig)
{
    (void)sig;
    siglongjmp(jump_back, 1);
}

static void jump_inside(void *ctx)
{
    volatile int *jumped = ctx;
    if (sigsetjmp(jump_back, 1) == 0) {
        raise(SIGUSR2);
        *jumped = 2; /* not reached (and raise is no tail call: the frame must live) */
    } else {
        *jumped = 1;
    }
}

static void nothing(void *ctx) { (void)ctx; }

static int jump_child(const char *pool, mango_persist_mode mode)
{
    (void)pool;
    alarm(20);
    int failed_before = check_failed;
    signal(SIGUSR2, jumping_handler);
    /* Left between batches: nothing lost, nothing failed. */
    if (start(mode) != 0) {
        fprintf(stderr, "mango_init: %s\n", mango_last_error());
        return 1;
    }
    if (sigsetjmp(jump_back, 1) == 0)
        raise(SIGUSR2);
    command_body = nothing;
    CHECK(mango_client_cmd(NULL) == 0);
    /* Left inside a command: the batch fails. */
    command_body = jump_inside;
    int jumped = 0;
    int rc = mango_client_cmd(&jumped);
    CHECK(jumped == 1);
    CHECK(rc != 0 && strstr(mango_last_error(), "signal handler") != NULL);
    command_body = nothing;
    CHECK(mango_client_cmd(NULL) != 0); /* stopped */
    mango_shutdown();
    return check_failed != failed_before;
}

/* ---- 4. racing installers ---- */
#define RACERS 4
static void racer0(int sig) { (void)sig; }
static void racer1(int sig) { (void)sig; }
static void racer2(int sig) { (void)sig; }
static void racer3(int sig) { (void)sig; }
static void (*const racer_handler[RACERS])(int) = {racer0, racer1, racer2, racer3};

static int racers_stop;

static void *racer(void *arg)
{
    long i = (long)arg;
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = racer_handler[i];
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, SIGRTMIN + (int)i); /* this thread's mark */
    while (!__atomic_load_n(&racers_stop, __ATOMIC_RELAXED))
        sigaction(SIGUSR2, &act, NULL);
    return NULL;
}

static void test_racing_installers(void)
{
    int mismatches = 0;
    for (int round = 0; round < 200; round++) {
        pthread_t t[RACERS];
        __atomic_store_n(&racers_stop, 0, __ATOMIC_RELAXED);
        for (long i = 0; i < RACERS; i++)
            pthread_create(&t[i], NULL, racer, (void *)i);
        usleep(1000);
        __atomic_store_n(&racers_stop, 1, __ATOMIC_RELAXED); /* their last calls overlap */
        for (int i = 0; i < RACERS; i++)
            pthread_join(t[i], NULL);
        struct sigaction now;
        CHECK(sigaction(SIGUSR2, NULL, &now) == 0);
        struct kernel_action k = kernel_action(SIGUSR2);
        int table = -1, kernel = -1;
        for (int i = 0; i < RACERS; i++) {
            if (now.sa_handler == racer_handler[i])
                table = i;
            if (k.mask & (1ul << (SIGRTMIN + i - 1)))
                kernel = i;
        }
        mismatches += table != kernel;
    }
    printf("racing installers: %d of 200 rounds left the table's handler with another call's mask\n",
           mismatches);
    CHECK(mismatches == 0);
    signal(SIGUSR2, SIG_DFL);
}

/* ---- 5. fork while another thread installs ---- */
static void *installer(void *arg)
{
    (void)arg;
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = racer0;
    sigemptyset(&act.sa_mask);
    while (!__atomic_load_n(&racers_stop, __ATOMIC_RELAXED))
        sigaction(SIGUSR1, &act, NULL);
    return NULL;
}

static void test_fork_while_installing(void)
{
    __atomic_store_n(&racers_stop, 0, __ATOMIC_RELAXED);
    pthread_t t;
    pthread_create(&t, NULL, installer, NULL);
    int hung = 0, failed = 0;
    for (int i = 0; i < 200; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            struct sigaction act;
            memset(&act, 0, sizeof act);
            act.sa_handler = racer1;
            sigemptyset(&act.sa_mask);
            _exit(sigaction(SIGUSR2, &act, NULL) == 0 ? 0 : 1);
        }
        int status = 0, waited = 0;
        while (waitpid(pid, &status, WNOHANG) == 0 && waited < 2000) {
            usleep(1000);
            waited++;
        }
        if (waited >= 2000) { /* 2 s: hung */
            hung++;
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
        }
    }
    __atomic_store_n(&racers_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    printf("fork while another thread installs: %d of 200 children hung in sigaction, %d failed\n", hung,
           failed);
    CHECK(hung == 0 && failed == 0);
    signal(SIGUSR1, SIG_DFL);
}

int main(void)
{
    snprintf(pool_path, sizeof pool_path, "/dev/shm/mango-test-signal-%d.pool", (int)getpid());
    test_reported_actions();
    test_glibc_views();
    test_racing_installers();
    test_fork_while_installing();
    CHECK(each_mode_in_a_child(pool_path, jump_child) == 0); /* before this process maps a heap */
    test_handler_inside_a_command();
    unlink(pool_path);
    return check_report("test_signal_handlers");
}
