/* bench_store_cost.c -- cost per store of the MangoCapture instrumentation.
 *
 * Build the same file twice and compare:
 *   mango-cc --mango-no-runtime -O2 bench_store_cost.c -o bench_instr
 *   mango-cc --mango-no-runtime --mango-no-plugin -O2 bench_store_cost.c -o bench_plain
 * (or `cmake --build <build> --target mango-cc-bench`). The program defines its
 * own mango_capture_active / mango_capture (a counter), finds out whether it
 * was instrumented, and reports ns per store for
 *   scalar:  10^8 one-store iterations to a global int array (vectorization
 *            off: one flag check per store when instrumented)
 *   vector:  the same loop, vectorized as -O2 likes (one check per vector
 *            store), in ns per element
 *   active:  the scalar loop with the flag set (instrumented build only): the
 *            slow path calling a counting mango_capture().
 * Each figure is the best of REPS runs. Optional argv[1]: iterations. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__thread bool mango_capture_active __attribute__((tls_model("initial-exec")));
static volatile uint64_t mango_capture_calls;

void mango_capture(const void *addr, size_t len)
{
    (void)addr;
    (void)len;
    mango_capture_calls = mango_capture_calls + 1;
}

#define N 4096 /* 16 KiB: stays in L1 */
#define REPS 5
int arr[N];

__attribute__((noinline)) void set_active(bool on) { mango_capture_active = on; }

__attribute__((noinline)) void loop_scalar(long iters)
{
#pragma clang loop vectorize(disable) interleave(disable) unroll(disable)
    for (long i = 0; i < iters; i++)
        arr[i & (N - 1)] = (int)i;
}

__attribute__((noinline)) void loop_vector(long iters)
{
    for (long r = 0; r < iters / N; r++)
        for (int i = 0; i < N; i++)
            arr[i] = i + (int)r;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double best_ns(void (*fn)(long), long iters)
{
    double best = 1e30;
    for (int k = 0; k < REPS; k++) {
        double t0 = now();
        fn(iters);
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    return best * 1e9 / (double)iters;
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 100000000L;

    set_active(true);
    arr[1] = 1;
    loop_scalar(4);
    set_active(false);
    bool instrumented = mango_capture_calls != 0;

    loop_scalar(iters / 10); /* warm up */
    double scalar = best_ns(loop_scalar, iters);
    double vector = best_ns(loop_vector, iters);
    printf("%-13s scalar %.3f ns/store  vector %.3f ns/store", 
           instrumented ? "instrumented" : "plain", scalar, vector);
    if (instrumented) {
        set_active(true);
        mango_capture_calls = 0;
        double active = best_ns(loop_scalar, iters / 10);
        set_active(false);
        printf("  active(counting call) %.3f ns/store (%llu calls)", active,
               (unsigned long long)mango_capture_calls);
    }
    printf("\n");
    return 0;
}
