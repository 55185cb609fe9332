/* error.c -- the thread-local last-error message and code names. */
#include "runtime/error.h"

#include <stdarg.h>
#include <stdio.h>

static __thread char last_error[1024];

int mango_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *mango_last_error(void) { return last_error[0] ? last_error : "no error"; }

const char *mango_strerror(int code)
{
    switch (code) {
    case MANGO_OK: return "success";
    case MANGO_EINVAL: return "invalid argument or configuration";
    case MANGO_EIO: return "I/O error";
    case MANGO_EBADPOOL: return "pool is corrupt, truncated or of another version";
    case MANGO_ELAYOUT: return "pool was written by a different binary or layout";
    case MANGO_EBUSY: return "pool is in use by another process";
    case MANGO_ENOMEM: return "out of memory";
    case MANGO_EFAILED: return "runtime stopped after an earlier error";
    case MANGO_EEXIST: return "already exists";
    case MANGO_ENOENT: return "no such pool";
    }
    return "unknown error";
}
