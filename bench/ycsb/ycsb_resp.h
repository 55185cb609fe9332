/* ycsb_resp.h: a minimal incremental RESP2 reply parser.
 *
 * resp_parse() looks at the bytes received so far and returns the length of
 * the first complete reply (filling *r with slices that point into buf), 0
 * if the reply is not complete yet (read more and call again), or -1 on a
 * protocol error. Handles simple strings (+), errors (-), integers (:), bulk
 * strings ($, including null), and arrays (*, including null and nested
 * arrays; the top-level array's first RESP_MAX_ELEMS elements are kept as
 * slices, nested arrays are validated and skipped). */
#ifndef YCSB_RESP_H
#define YCSB_RESP_H

#include <stddef.h>
#include <string.h>

#define RESP_MAX_ELEMS 130
#define RESP_MAX_DEPTH 8

typedef struct {
    const char *p; /* NULL for a null bulk string or a nested array */
    size_t len;
} resp_slice_t;

typedef struct {
    char type;          /* '+', '-', ':', '$' or '*' */
    int isnull;         /* $-1 or *-1 */
    long long ival;     /* ':' */
    resp_slice_t str;   /* '+', '-', '$' */
    size_t nelem;       /* '*': number of elements (may exceed RESP_MAX_ELEMS) */
    resp_slice_t elem[RESP_MAX_ELEMS];
} resp_reply_t;

/* one CRLF-terminated line starting at *pos */
static inline int resp_line_(const char *buf, size_t len, size_t *pos, const char **s, size_t *slen)
{
    const char *start = buf + *pos;
    const char *cr = memchr(start, '\r', len - *pos);
    if (!cr || cr + 1 >= buf + len) return 0;
    if (cr[1] != '\n') return -1;
    *s = start;
    *slen = (size_t)(cr - start);
    *pos = (size_t)(cr + 2 - buf);
    return 1;
}

static inline int resp_int_(const char *s, size_t n, long long *out)
{
    size_t i = 0;
    int neg = 0;
    long long v = 0;
    if (n > 0 && s[0] == '-') { neg = 1; i = 1; }
    if (i == n || n - i > 18) return -1;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

static inline int resp_value_(const char *buf, size_t len, size_t *pos, int depth, resp_reply_t *r,
                              resp_slice_t *out)
{
    if (*pos >= len) return 0;
    char t = buf[*pos];
    size_t p = *pos + 1;
    const char *s;
    size_t sl;
    long long n;
    int rc = resp_line_(buf, len, &p, &s, &sl);
    if (rc <= 0) return rc;
    if (r) r->type = t;
    if (out) { out->p = NULL; out->len = 0; }
    switch (t) {
    case '+':
    case '-':
        if (out) { out->p = s; out->len = sl; }
        if (r) { r->str.p = s; r->str.len = sl; }
        break;
    case ':':
        if (resp_int_(s, sl, &n)) return -1;
        if (r) r->ival = n;
        if (out) { out->p = s; out->len = sl; }
        break;
    case '$':
        if (resp_int_(s, sl, &n) || n < -1) return -1;
        if (n == -1) {
            if (r) r->isnull = 1;
            break;
        }
        if (len - p < (size_t)n + 2) return 0;
        if (buf[p + (size_t)n] != '\r' || buf[p + (size_t)n + 1] != '\n') return -1;
        if (out) { out->p = buf + p; out->len = (size_t)n; }
        if (r) { r->str.p = buf + p; r->str.len = (size_t)n; }
        p += (size_t)n + 2;
        break;
    case '*':
        if (resp_int_(s, sl, &n) || n < -1) return -1;
        if (n == -1) {
            if (r) r->isnull = 1;
            break;
        }
        if (depth >= RESP_MAX_DEPTH) return -1;
        for (long long i = 0; i < n; i++) {
            resp_slice_t *e = r && i < RESP_MAX_ELEMS ? &r->elem[i] : NULL;
            rc = resp_value_(buf, len, &p, depth + 1, NULL, e);
            if (rc <= 0) return rc;
        }
        if (r) r->nelem = (size_t)n;
        break;
    default:
        return -1;
    }
    *pos = p;
    return 1;
}

static inline long resp_parse(const char *buf, size_t len, resp_reply_t *r)
{
    size_t pos = 0;
    r->type = 0;
    r->isnull = 0;
    r->ival = 0;
    r->str.p = NULL;
    r->str.len = 0;
    r->nelem = 0;
    int rc = resp_value_(buf, len, &pos, 0, r, NULL);
    return rc <= 0 ? rc : (long)pos;
}

#endif
