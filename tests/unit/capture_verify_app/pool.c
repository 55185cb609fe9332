/* pool.c -- an application source file that shares its base name with a
 * runtime file (src/pool/pool.c), linked into unit.test_capture_verify: its
 * static global must be verified like any other application global (the
 * verifier once exempted every file named like a runtime file). */
#include <stdint.h>

static volatile unsigned char app_pool_state[64] __attribute__((aligned(32)));

/* An uncaptured store (this file is not instrumented). */
void app_pool_touch(unsigned char v)
{
    app_pool_state[3] = v;
}
