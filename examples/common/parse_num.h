/* parse_num.h -- the examples' whole-number options (kvstore, add_server,
 * add_bench): decimal digits only, then (if suffixes) one of K M G (x1024),
 * checked for overflow, in lo..hi. Anything else (a sign, trailing text,
 * overflow, out of range) ends the program with exit status 2 and a message
 * naming the option and its range. */
#ifndef EXAMPLES_PARSE_NUM_H
#define EXAMPLES_PARSE_NUM_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline uint64_t parse_num(const char *prog, const char *s, const char *what, uint64_t lo, uint64_t hi,
                                 bool suffixes)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    bool ok = !errno && end != s && *s >= '0' && *s <= '9';
    unsigned shift = 0;
    if (ok && suffixes)
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        default: break;
        }
    if (ok && shift && v > (UINT64_MAX >> shift))
        ok = false;
    v <<= shift;
    if (!ok || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be a whole number in %" PRIu64 "..%" PRIu64 "%s, not '%s'\n", prog, what, lo,
                hi, suffixes ? " (suffixes K M G)" : "", s);
        fprintf(stderr, "Try '%s --help'.\n", prog);
        exit(2);
    }
    return v;
}

#endif
