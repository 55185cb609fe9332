/* env_number.h -- a number from the environment: decimal digits only.
 * strtoull alone takes leading spaces and a sign, and wraps a negative
 * number around (" -18446744073709551104" was read as 512; found by
 * configuration fuzzing), so every MANGO_* number goes through this. */
#ifndef MANGO_ENV_NUMBER_H
#define MANGO_ENV_NUMBER_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Is v one or more decimal digits whose value fits? Then *out is it. */
static inline bool env_decimal(const char *v, unsigned long long *out)
{
    if (!*v || strspn(v, "0123456789") != strlen(v))
        return false;
    errno = 0;
    unsigned long long n = strtoull(v, NULL, 10);
    if (errno)
        return false;
    *out = n;
    return true;
}

#endif
