/* test_config.h -- the small runtime configuration most unit tests start
 * from: a 32 MiB pool with a 1 MiB log at pool_path, in the given mode (and
 * the mode a test's command line names).
 * Tests set anything else (log size, backend priority) afterwards. */
#ifndef MANGO_TEST_CONFIG_H
#define MANGO_TEST_CONFIG_H

#include <string.h>

#include "mango.h"

static inline void small_test_config(mango_config *cfg, const char *pool_path, mango_persist_mode mode)
{
    mango_config_default(cfg);
    cfg->pool_path = pool_path;
    cfg->mode = mode;
    cfg->pool_size = 32u << 20;
    cfg->log_size = 1u << 20;
}

/* A mode named on a test's command line: "fs", "sim", else emulated. */
static inline mango_persist_mode test_mode_named(const char *m)
{
    return strcmp(m, "fs") == 0 ? MANGO_PERSIST_FS : strcmp(m, "sim") == 0 ? MANGO_PERSIST_SIM : MANGO_PERSIST_EMULATED;
}

#endif
