/* corpus_signal.c -- a signal handler built through the plugin that stores
 * into durable memory while read-write commands run (a timer every 50
 * microseconds; the handler bumps one of 64 .bss counters, a 32-byte block
 * each). Before session 38 such a handler recorded its stores into the dedup
 * set re-entrantly, in the middle of the command's own inserts: blocks were
 * lost from the set's list of used slots and every later store to them was
 * dropped for the rest of the process (45-62 of 64 counter blocks missed after
 * the timer stopped). Handlers now run with capture off
 * (src/capture/signal_interpose.c), so their stores are never part of a
 * batch: while the timer runs the verifier reports the counters' blocks as
 * changed and not captured, as it would any store outside a command, and
 * nothing else; after it, commands that write the counters and the
 * command's own buffer are captured in full. */
#include <signal.h>
#include <sys/time.h>

#include "corpus_harness.h"

struct counter {
    long value;
    char pad[24];
};
static struct counter counters[64] __attribute__((aligned(32)));
static volatile unsigned signals_seen;
static char *buffer;
enum { BLOCKS = 2000 };

static void on_timer(int sig)
{
    (void)sig;
    counters[signals_seen++ & 63].value++;
}

static void allocate(void)
{
    buffer = malloc(BLOCKS * 32);
    memset(buffer, 0, BLOCKS * 32);
}

static void write_buffer(void)
{
    for (int i = 0; i < BLOCKS; i++)
        ((volatile char *)buffer)[i * 32] = (char)(i + signals_seen);
}

static void write_counters(void)
{
    for (int k = 0; k < 64; k++)
        counters[k].value += 1000;
}

int main(void)
{
    setenv("MANGO_VERIFY_REPORT", "/dev/null", 1); /* the handler's blocks are reported in every batch */
    corpus_start("signal");
    corpus_expect("allocate", allocate, false);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_timer;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &every, NULL);
    uint64_t missed = 0, most = 0;
    for (int b = 0; b < 3000; b++) {
        uint64_t m = corpus_run(write_buffer);
        missed += m;
        most = m > most ? m : most;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_IGN); /* a signal still pending is dropped, not run in the checks below */
    usleep(10000);
    /* Only the handler's blocks may have been missed: at most the 64
     * counters and signals_seen's block in one batch. */
    printf("%u signals; %llu blocks changed by the handler during the commands, at most %llu in one\n",
           signals_seen, (unsigned long long)missed, (unsigned long long)most);
    bool bounded = most <= 65;
    printf("%s %-40s\n", bounded ? "ok  " : "FAIL", "only handler blocks uncaptured");
    bounded ? corpus_passed++ : corpus_failed++;
    bool signalled = signals_seen > 100;
    printf("%s %-40s\n", signalled ? "ok  " : "FAIL", "the timer interrupted the commands");
    signalled ? corpus_passed++ : corpus_failed++;
    corpus_expect("the counters, after the timer", write_counters, false);
    corpus_expect("the counters again", write_counters, false);
    corpus_expect("the buffer, after the timer", write_buffer, false);
    return corpus_finish("signal");
}
