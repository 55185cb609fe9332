/* corpus_hidden.c -- proves the verifier can fail: stores in a function the
 * plugin is told to skip must be reported as missed. */
#include "corpus_harness.h"

static long *data;
long corpus_plain_global; /* extern: the store cannot be optimised away */

static void alloc(void)
{
    data = malloc(4096);
    memset(data, 0, 4096);
}

__attribute__((noinline, annotate("mango_no_capture"))) static void hidden_heap(void)
{
    for (int i = 0; i < 64; i++)
        data[i * 8] = i + 1;
}

__attribute__((noinline, annotate("mango_no_capture"))) static void hidden_global(void)
{
    corpus_plain_global = 12345;
}

static void visible(void) { data[3] = 7; }

int main(void)
{
    corpus_start("hidden");
    corpus_expect("allocate", alloc, false);
    corpus_expect("hidden heap stores are reported", hidden_heap, true);
    corpus_expect("hidden .bss store is reported", hidden_global, true);
    corpus_expect("visible store is not", visible, false);
    return corpus_finish("corpus_hidden");
}
