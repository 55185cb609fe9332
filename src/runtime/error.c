/* error.c -- the thread-local last-error message, the process-wide message
 * of the error that stopped the runtime, and code names. */
#include "runtime/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static __thread char last_error[1024];
/* The first fatal error's message: set by the thread that hit it (a
 * combiner, the backend, the sync thread), adopted by the threads whose
 * commands fail because of it, so each of them can say why. */
static char fatal_error[1024];
static pthread_mutex_t fatal_mu = PTHREAD_MUTEX_INITIALIZER;

void mango_error_publish_fatal(void)
{
    pthread_mutex_lock(&fatal_mu);
    if (!fatal_error[0] && last_error[0])
        snprintf(fatal_error, sizeof fatal_error, "%s", last_error);
    pthread_mutex_unlock(&fatal_mu);
}

void mango_error_adopt_fatal(void)
{
    pthread_mutex_lock(&fatal_mu);
    if (fatal_error[0])
        snprintf(last_error, sizeof last_error, "%s", fatal_error);
    pthread_mutex_unlock(&fatal_mu);
}

bool mango_error_await_fatal(unsigned ms)
{
    for (unsigned waited_us = 0;; waited_us += 200) {
        pthread_mutex_lock(&fatal_mu);
        bool published = fatal_error[0] != 0;
        pthread_mutex_unlock(&fatal_mu);
        if (published || waited_us >= ms * 1000u)
            return published;
        nanosleep(&(struct timespec){.tv_nsec = 200 * 1000}, NULL);
    }
}

int mango_error_stopped(void)
{
    char why[sizeof fatal_error];
    pthread_mutex_lock(&fatal_mu);
    snprintf(why, sizeof why, "%s", fatal_error);
    pthread_mutex_unlock(&fatal_mu);
    if (why[0])
        return mango_error(MANGO_EFAILED, "the runtime stopped accepting writes after an error: %s", why);
    return mango_error(MANGO_EFAILED, "the runtime stopped accepting writes after an error");
}

void mango_error_reset_fatal(void)
{
    pthread_mutex_lock(&fatal_mu);
    fatal_error[0] = 0;
    pthread_mutex_unlock(&fatal_mu);
}

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
    case MANGO_EAGAIN: return "not finished yet";
    }
    return "unknown error";
}
