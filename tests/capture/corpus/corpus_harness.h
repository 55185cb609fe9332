/* corpus_harness.h -- run one read-write command under the capture verifier
 * and report how many durable blocks it changed without capturing them. */
#ifndef CORPUS_HARNESS_H
#define CORPUS_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mango.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*corpus_fn)(void);
static corpus_fn corpus_next;
static bool corpus_is_ro(void *c) { (void)c; return false; }
static void corpus_process(void *c) { (void)c; corpus_next(); }

static int corpus_passed, corpus_failed;
static char corpus_pool[128];

static void corpus_start(const char *name)
{
    snprintf(corpus_pool, sizeof corpus_pool, "/dev/shm/mango-corpus-%s-%d.pool", name, (int)getpid());
    unlink(corpus_pool);
    mango_config cfg;
    mango_config_default(&cfg);
    cfg.pool_path = corpus_pool;
    cfg.mode = MANGO_PERSIST_EMULATED;
    cfg.pool_size = 64u << 20;
    cfg.log_size = 16u << 20;
    cfg.verify_capture = true;
    mango_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.is_read_only = corpus_is_ro;
    cb.process_request = corpus_process;
    if (mango_init(&cfg, &cb) < 0) {
        fprintf(stderr, "corpus: %s\n", mango_last_error());
        exit(2);
    }
}

/* Run fn as one read-write command; return the blocks the verifier found
 * changed but not captured. */
static uint64_t corpus_run(corpus_fn fn)
{
    mango_stats a, b;
    mango_get_stats(&a);
    corpus_next = fn;
    int x = 0;
    if (mango_client_cmd(&x) != 0) {
        fprintf(stderr, "corpus: command failed: %s\n", mango_last_error());
        exit(2);
    }
    mango_get_stats(&b);
    return b.verify_missed_blocks - a.verify_missed_blocks;
}

static void corpus_expect(const char *what, corpus_fn fn, bool expect_misses)
{
    uint64_t missed = corpus_run(fn);
    bool ok = expect_misses ? missed > 0 : missed == 0;
    printf("%s %-40s missed=%llu\n", ok ? "ok  " : "FAIL", what, (unsigned long long)missed);
    if (ok)
        corpus_passed++;
    else
        corpus_failed++;
}

static int corpus_finish(const char *name)
{
    mango_shutdown();
    unlink(corpus_pool);
    printf("%s: %d passed, %d failed\n", name, corpus_passed, corpus_failed);
    return corpus_failed ? 1 : 0;
}

#ifdef __cplusplus
}
#endif
#endif
