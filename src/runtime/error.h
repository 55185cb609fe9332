/* error.h -- error reporting: every internal failure becomes a MANGO_E* code
 * plus a message in a thread-local buffer (mango_last_error()). Nothing in the
 * library prints or exits. */
#ifndef MANGO_ERROR_H
#define MANGO_ERROR_H
#include "mango.h"
/* Record the message and return code (so: `return mango_error(MANGO_EINVAL, ...)`). */
int mango_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The runtime stopped on this thread's last error: keep its message for
 * the other threads (first one wins until reset). */
void mango_error_publish_fatal(void);
/* This thread's command failed because the runtime stopped: make the
 * stopping error's message this thread's last error. */
void mango_error_adopt_fatal(void);
/* Wait up to `ms` milliseconds for a stopping error's message to be
 * published; whether one is. For a thread that finds the pool marked failed
 * (persist.c marks it as a sync fails) before the thread whose sync failed
 * has said why. */
bool mango_error_await_fatal(unsigned ms);
void mango_error_reset_fatal(void); /* mango_init */
/* A call made after the runtime stopped: MANGO_EFAILED, with the stopping
 * error's message appended so that every later failure still says why. */
int mango_error_stopped(void);
#endif
