/* check.h -- the unit tests' assertion: count, report the failing line, and
 * finish with the 'N passed, N failed' line CTest's summary reads. */
#ifndef MANGO_TEST_CHECK_H
#define MANGO_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(c)                                                        \
    do {                                                                \
        if (c)                                                          \
            check_passed++;                                             \
        else {                                                          \
            check_failed++;                                             \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
        }                                                               \
    } while (0)

/* Print the summary line; the test's exit status. */
static inline int check_report(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
