/* layout_regions_prog.c -- a tiny durable program built twice (VARIANT 1 and
 * 2) without a GNU build-id, for test_layout_regions.py. Run at the same path,
 * both builds have the same layout fingerprint (path, load address, no
 * build-id), but variant 2 has a larger .bss: its pool's data regions differ.
 *
 *   layout_regions_prog POOL   prints "FRESH counter=N" or "RECOVERED
 *                              counter=N", adds 3 to the counter durably, exits
 *   exit 2 and the runtime's message on stderr when mango_init fails. */
#include <stdio.h>
#include <stdlib.h>

#include "mango.h"

#ifndef VARIANT
#define VARIANT 1
#endif

long counter; /* durable: .bss */
#if VARIANT == 2
char grown[8192]; /* variant 2: a new global grows .bss */
#endif

static bool ro(void *c) { (void)c; return false; }

static void proc(void *c)
{
    (void)c;
    mango_capture(&counter, sizeof counter); /* (built without the capture plugin) */
    counter++;
#if VARIANT == 2
    mango_capture(grown, 1);
    grown[0]++;
#endif
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s POOL\n", argv[0]);
        return 2;
    }
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = argv[1];
    cfg.pool_size = 16u << 20;
    cfg.log_size = 1u << 20;
    cfg.mode = MANGO_PERSIST_EMULATED;
    mango_callbacks cb = {.is_read_only = ro, .process_request = proc};
    int st = mango_init(&cfg, &cb);
    if (st < 0) {
        fprintf(stderr, "init: %s\n", mango_last_error());
        return 2;
    }
    printf("%s counter=%ld\n", st == MANGO_RECOVERED ? "RECOVERED" : "FRESH", counter);
    fflush(stdout);
    int x = 0;
    for (int i = 0; i < 3; i++)
        mango_client_cmd(&x);
    mango_shutdown();
    return 0;
}
