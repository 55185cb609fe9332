/* mango_cli.c -- the `mango` command: inspect and check Mangosteen pools
 * (copy: mango_copy.c).
 *
 *   mango inspect [--json] POOL   print the header, head slots and log summary
 *   mango check [--quiet] [--no-heap-walk] POOL... validate a pool without modifying it
 *   mango copy [--quiet] [--no-check] POOL DEST     copy a pool no process has open
 *
 * Both open the pool read-only (pool_open with writable=false: a shared flock
 * and a PROT_READ mapping), so they never write to it and refuse a pool that a
 * running process holds. Run `mango --help` for the full usage text.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "alloc/durable_heap.h"
#include "backend/backend.h"
#include "log/big_batch.h"
#include "log/redo_log.h"
#include "mango.h"
#include "persist/persist.h"
#include "pool/crc32c.h"
#include "pool/pool.h"
#include "pool/pool_format.h"
#include "recovery/heap_preview.h"
#include "runtime/error.h"

#include "mango_cli.h"

/* ---- usage texts ---- */

static const char *main_usage =
    "NAME\n"
    "    mango - inspect, check and copy Mangosteen pool files\n"
    "\n"
    "SYNOPSIS\n"
    "    mango inspect [--json] POOL\n"
    "    mango check [--quiet] [--no-heap-walk] POOL...\n"
    "    mango copy [--quiet] [--no-check] POOL DEST\n"
    "    mango help [COMMAND]\n"
    "    mango --help | --version\n"
    "\n"
    "DESCRIPTION\n"
    "    A pool is the file in which the Mangosteen runtime keeps an application's\n"
    "    durable state: a checksummed header, two log head slots, a region table,\n"
    "    the redo log ring and a persistent mirror of every durable region.\n"
    "    A batch too large for the log keeps its entries in POOL.bigbatch beside\n"
    "    the pool until the mirror has them: copy both files when copying a pool\n"
    "    that was not shut down cleanly (mango copy does).\n"
    "\n"
    "    Every command opens the pool read-only with a shared lock: it never\n"
    "    modifies the file, and it refuses a pool that a running process has open.\n"
    "\n"
    "COMMANDS\n"
    "    inspect   print the header, both head slots and a summary of the redo log\n"
    "    check     validate a pool the way recovery would, without recovering it\n"
    "    copy      copy a pool no process has open (a backup), then check the copy\n"
    "    help      print this text, or the manual of COMMAND\n"
    "\n"
    "OPTIONS\n"
    "    -h, --help     print this text and exit\n"
    "    -V, --version  print the runtime version and exit\n"
    "\n"
    "EXIT STATUS\n"
    "    0  success (check: the pool is usable; copy: the copy is made and usable)\n"
    "    1  the pool is bad: truncated, corrupt, of another format version\n"
    "    2  usage error, or the pool could not be read or written (missing, in\n"
    "       use, an existing DEST, I/O error)\n"
    "\n"
    "Run 'mango COMMAND --help' for the options of a command.\n";

static const char *inspect_usage =
    "NAME\n"
    "    mango inspect - print the structure of a Mangosteen pool\n"
    "\n"
    "SYNOPSIS\n"
    "    mango inspect [--json] POOL\n"
    "\n"
    "DESCRIPTION\n"
    "    Validates POOL like `mango check` does (the header, its checksum and the\n"
    "    region table must be sound) and prints:\n"
    "      - the header: format version, pool size, creation mode and time, the\n"
    "        region table (kind, virtual address, size, mirror offset), the durable\n"
    "        heap's base and capacity, the log's offset and size, and the layout\n"
    "        fingerprint (hex and text) of the process that created the pool;\n"
    "      - both log head slots: checksum valid, advance, head_lsn, next_seq,\n"
    "        generation, clean flag; the newest valid slot is marked;\n"
    "      - the redo log from the newest head: committed frames still pending\n"
    "        replay, their entries, the end LSN, and whether an incomplete (torn)\n"
    "        last frame follows them, with the reason and the complete frames\n"
    "        after it that recovery drops with it (written before it was durable).\n"
    "    The pool is opened read-only and never modified.\n"
    "\n"
    "OPTIONS\n"
    "    --json      machine-readable output: one JSON object; the log summary\n"
    "                lists every pending frame with its LSN and file offset, and\n"
    "                whether its entries are in the big-batch file POOL.bigbatch,\n"
    "                and how many data ranges (large stores logged as their\n"
    "                bytes) it holds, with their bytes\n"
    "    -h, --help  print this text and exit\n"
    "\n"
    "EXIT STATUS\n"
    "    0  printed; 1  the header or region table is bad (nothing is printed)\n"
    "    or the log's frames are (the header and what could be read of the log\n"
    "    are still printed); 2  usage error, or POOL cannot be opened (missing,\n"
    "    in use). inspect reads the frames; it does not check where each entry\n"
    "    writes, nor the heap: `mango check` does, and may refuse a pool that\n"
    "    inspect printed with status 0.\n";

static const char *check_usage =
    "NAME\n"
    "    mango check - validate Mangosteen pools without modifying them\n"
    "\n"
    "SYNOPSIS\n"
    "    mango check [--quiet] [--no-heap-walk] POOL...\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs the checks recovery runs, on a read-only mapping:\n"
    "      - the file size, magic, format version, header checksum, and the\n"
    "        region table's checksum and bounds;\n"
    "      - both log head slots (one damaged slot is a warning: recovery uses\n"
    "        the other; two damaged slots are an error);\n"
    "      - every committed log frame from the head: checksums, LSN, sequence\n"
    "        and generation, and that each block address is 32-byte aligned and\n"
    "        inside a durable region; a frame that keeps its entries in the\n"
    "        big-batch file POOL.bigbatch is checked against that file whole;\n"
    "      - the durable heap's root in the mirror, as it will be after the\n"
    "        pending frames are replayed;\n"
    "      - the durable heap's metadata, walked on a private copy of the heap\n"
    "        with the pending frames replayed onto it: every chunk's header and\n"
    "        boundary tags, the free lists, the slabs and their map, the counters\n"
    "        in the root (what MANGO_CHECK_HEAP=1 checks at start-up; about\n"
    "        0.3 s per GiB of heap, on a copy-on-write mapping of the file).\n"
    "    An incomplete last frame (a torn tail: a batch whose commit did not\n"
    "    finish, so it was never acknowledged) is a warning; recovery discards it,\n"
    "    with any complete frames written after it before it was durable (the\n"
    "    warning counts them).\n"
    "    A bad frame followed by a committed frame is corruption: an error.\n"
    "    Prints 'POOL: ok (...)' for each good pool; problems go to stderr.\n"
    "\n"
    "OPTIONS\n"
    "    -q, --quiet         print nothing for good pools (warnings and errors still)\n"
    "    -n, --no-heap-walk  check the heap's root only, not its metadata (faster on\n"
    "                        large pools)\n"
    "    -h, --help          print this text and exit\n"
    "\n"
    "EXIT STATUS\n"
    "    0  every POOL is usable (possibly with warnings)\n"
    "    1  some POOL is bad: truncated, corrupt or of another format version\n"
    "    2  usage error, or some POOL could not be read (missing, in use by\n"
    "       another process, I/O error); the larger status wins\n";

/* ---- small helpers ---- */

/* getopt_long returned '?' (opterr 0): name what was wrong. Not
 * argv[optind - 1], which inside a cluster such as -xq is still the argument
 * before it (the command's name); optopt holds the short option. A known
 * long option given a value (--json=1) sets optopt to its val. */
static void bad_option(const char *cmd, char **argv, const struct option *lo)
{
    const char *arg = argv[optind - 1];
    if (optopt && arg && strncmp(arg, "--", 2) == 0 && strchr(arg, '=')) {
        size_t n = (size_t)(strchr(arg, '=') - arg - 2);
        for (const struct option *o = lo; o->name; o++)
            if (o->val == optopt && strlen(o->name) == n && strncmp(o->name, arg + 2, n) == 0)
                usage_error(cmd, "option '--%s' takes no value", o->name);
    }
    if (optopt)
        usage_error(cmd, "unknown option '-%c'", optopt);
    usage_error(cmd, "unknown option '%s'", arg);
}

void usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "mango%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'mango%s%s --help'.\n", cmd ? " " : "", cmd ? cmd : "");
    exit(EXIT_USAGE);
}

int exit_code_for(int rc)
{
    if (rc == MANGO_OK)
        return EXIT_OK;
    return rc == MANGO_EBADPOOL ? EXIT_BAD : EXIT_USAGE;
}

const char *human(uint64_t v, char *buf, size_t n)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    unsigned u = 0;
    while (d >= 1024 && u < 4) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%" PRIu64 " B", v);
    else
        snprintf(buf, n, "%.*f %s", d == (double)(uint64_t)d ? 0 : 1, d, unit[u]);
    return buf;
}

static const char *region_kind_name(uint32_t k)
{
    return k == POOL_REGION_HEAP ? "heap" : k == POOL_REGION_DATA ? "data" : "?";
}

/* The length of the well-formed UTF-8 sequence at s (at most max bytes),
 * or 0 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_len(const unsigned char *s, size_t max)
{
    unsigned c = s[0];
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
        (c == 0xf4 && s[1] > 0x8f))
        return 0;
    return n;
}

/* A JSON string: UTF-8 as it is (a path "pé" stays "pé"; escaping each byte
 * as \u00XX made it "p\u00c3\u00a9", two other characters), control
 * characters escaped, and a byte that is not part of well-formed UTF-8 (a
 * file name may hold any byte) as U+FFFD. */
static void json_str(FILE *o, const char *s, size_t max)
{
    fputc('"', o);
    size_t len = strnlen(s, max);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", o);
        else if (c == '\t')
            fputs("\\t", o);
        else if (c < 0x20 || c == 0x7f)
            fprintf(o, "\\u%04x", c);
        else if (c < 0x80)
            fputc(c, o);
        else {
            size_t n = utf8_len((const unsigned char *)s + i, len - i);
            if (n) {
                fwrite(s + i, 1, n, o);
                i += n - 1;
            } else {
                fputs("\\ufffd", o);
            }
        }
    }
    fputc('"', o);
}

/* ---- log scanning shared by inspect and check ---- */

typedef struct frame_info {
    uint64_t lsn, seq, entries, bytes;
    bool big; /* its entries are in the big-batch file */
    uint64_t data_ranges, data_bytes; /* its data-range entries and their bytes */
} frame_info;

/* Count a frame's data ranges (stepping over their bytes; stops at a
 * malformed one, which the check reports). */
static void count_data_ranges(const log_frame *f, const log_entry *e, frame_info *fi)
{
    for (uint64_t i = 0; i < f->n_entries;) {
        if (!log_entry_is_data(&e[i])) {
            i++;
            continue;
        }
        uint64_t slots = log_entry_slots(&e[i]);
        if (slots == 0 || slots > f->n_entries - i)
            return;
        fi->data_ranges++;
        fi->data_bytes += log_entry_data_len(&e[i]);
        i += slots;
    }
}

typedef struct scan_ctx {
    const pool *p;
    /* check: validate entries */
    bool check_entries;
    /* check: the heap root (and, if hp.copy, the whole heap) as it will be
     * after replay; hp.heap NULL: no heap to preview */
    heap_preview hp;
    /* inspect: remember frames */
    bool record;
    frame_info *frames;
    size_t nframes, capframes;
} scan_ctx;

static const pool_region *region_of(const pool *p, uint64_t addr)
{
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        if (addr >= r->vaddr && addr - r->vaddr < r->size)
            return r;
    }
    return NULL;
}

/* Replay a validated entry's bytes onto the heap preview, if any. */
static void preview(scan_ctx *c, uint64_t addr, uint64_t len, const char *src)
{
    if (c->hp.heap)
        heap_preview_bytes(&c->hp, addr, len, src);
}

static int scan_visit(void *arg, const log_frame *f, const log_entry *e)
{
    scan_ctx *c = arg;
    if (c->check_entries) {
        for (uint32_t i = 0; i < f->n_entries; i++) {
            uint64_t a = e[i].addr;
            if (log_entry_is_data(&e[i])) {
                /* A data range: inside the heap region, its bytes within the frame. */
                uint64_t da, n;
                if (!backend_data_range(c->p, &e[i], f->n_entries - i, &da, &n))
                    return mango_error(MANGO_EBADPOOL,
                                       "log frame at lsn %" PRIu64 " (seq %" PRIu64 ") entry %u: malformed "
                                       "data range at %#" PRIx64 " (%" PRIu64 " bytes)",
                                       f->lsn, f->seq, i, da, n);
                preview(c, da, n, (const char *)&e[i + 1]);
                i += (uint32_t)log_entry_slots(&e[i]) - 1;
                continue;
            }
            if (log_entry_is_zero(&e[i])) {
                /* A zero range: inside the heap region, 32-byte granular. */
                uint64_t za, n;
                if (!backend_zero_range(c->p, &e[i], &za, &n))
                    return mango_error(MANGO_EBADPOOL,
                                       "log frame at lsn %" PRIu64 " (seq %" PRIu64 ") entry %u: malformed "
                                       "zero range at %#" PRIx64 " (%" PRIu64 " bytes)",
                                       f->lsn, f->seq, i, za, n);
                preview(c, za, n, NULL);
                continue;
            }
            if (a % LOG_BLOCK_SIZE)
                return mango_error(MANGO_EBADPOOL,
                                   "log frame at lsn %" PRIu64 " (seq %" PRIu64 ") entry %u: block "
                                   "address %#" PRIx64 " is not %u-byte aligned",
                                   f->lsn, f->seq, i, a, LOG_BLOCK_SIZE);
            const pool_region *r = region_of(c->p, a);
            if (!r)
                return mango_error(MANGO_EBADPOOL,
                                   "log frame at lsn %" PRIu64 " (seq %" PRIu64 ") entry %u: block "
                                   "%#" PRIx64 " lies outside every durable region",
                                   f->lsn, f->seq, i, a);
            int lrc = backend_check_loader_bytes(c->p, r, &e[i], f->seq); /* (recovery's own check) */
            if (lrc != MANGO_OK)
                return lrc;
            /* Replay this block onto our copy of the heap root, and of the
             * heap if kept (heap blocks are copied whole by the backend). */
            preview(c, a, LOG_BLOCK_SIZE, (const char *)e[i].data);
        }
    }
    if (c->record) {
        if (c->nframes == c->capframes) {
            size_t n = c->capframes ? 2 * c->capframes : 256;
            frame_info *nf = realloc(c->frames, n * sizeof *nf);
            if (!nf)
                return mango_error(MANGO_ENOMEM, "out of memory listing log frames");
            c->frames = nf;
            c->capframes = n;
        }
        /* big_batch_visit passes a big batch's frame with the file's entry
         * count, more than the frame itself could hold */
        bool big = sizeof(log_frame) + (uint64_t)f->n_entries * sizeof(log_entry) > f->frame_bytes;
        frame_info *fi = &c->frames[c->nframes++];
        *fi = (frame_info){f->lsn, f->seq, f->n_entries, f->frame_bytes, big, 0, 0};
        count_data_ranges(f, e, fi);
    }
    return 0;
}

static int scan_log(const pool *p, scan_ctx *c, log_scan_result *res)
{
    big_batch_scan big = {.path = p->big_batch_path, .verify = true, .visit = scan_visit, .arg = c};
    int rc = redo_log_scan(pool_log(p), p->hdr->log_size, p->head.head_lsn, p->head.next_seq,
                           p->head.generation, UINT64_MAX, big_batch_visit, &big, res);
    res->entries += big.big_entries - big.big_frames; /* a big frame's one entry names its file */
    /* (Until session 37 a torn tail whose frame held another lap's valid
     * header was reported as none here. redo_log_scan calls such a stop torn
     * only when complete frames follow it that recovery drops with it
     * (dropped_after_torn), so the report must say so, as recovery does.) */
    return rc;
}

/* ---- inspect ---- */

static void print_text(const char *path, const pool *p, const log_scan_result *res, int scan_rc,
                       const char *scan_err, const scan_ctx *c)
{
    const pool_header *h = p->hdr;
    char b1[32], b2[32], tbuf[64];
    time_t ct = (time_t)h->create_time;
    struct tm tm;
    /* (A damaged value past year 9999 is shown as such, not as a made-up
     * date: "109626219-01-00" for 2^62, found by fuzzing.) */
    if (h->create_time > 253402300799u || !gmtime_r(&ct, &tm) ||
        !strftime(tbuf, sizeof tbuf, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(tbuf, sizeof tbuf, "not a date");
    printf("pool %s\n", path);
    printf("header:\n");
    printf("  format version   %u (header %u bytes)\n", h->version, h->header_size);
    printf("  pool size        %" PRIu64 " bytes (%s)\n", h->pool_size, human(h->pool_size, b1, sizeof b1));
    printf("  created mode     %s (%u)\n", persist_mode_name((persist_mode)h->created_mode), h->created_mode);
    printf("  creation time    %s (%" PRIu64 ")\n", tbuf, h->create_time);
    printf("  heap             base %#" PRIx64 ", capacity %" PRIu64 " bytes (%s)\n", h->heap_base,
           h->heap_capacity, human(h->heap_capacity, b1, sizeof b1));
    printf("  log              offset %#" PRIx64 ", size %" PRIu64 " bytes (%s)\n", h->log_offset,
           h->log_size, human(h->log_size, b2, sizeof b2));
    printf("  fingerprint      %016" PRIx64 "\n", h->fingerprint);
    printf("  fingerprint text ");
    const char *t = h->fingerprint_text;
    size_t tl = strnlen(t, POOL_FINGERPRINT_TEXT);
    for (size_t i = 0; i < tl; i++) {
        unsigned char ch = (unsigned char)t[i];
        /* (The pool's text, not ours: a carriage return or an escape
         * sequence in a crafted header would rewrite the terminal.) */
        if ((ch < 0x20 && ch != '\n') || ch == 0x7f)
            printf("\\x%02x", ch);
        else
            putchar(ch);
        if (ch == '\n' && i + 1 < tl)
            fputs("                   ", stdout);
    }
    if (tl == 0 || t[tl - 1] != '\n')
        putchar('\n');
    printf("regions: %u\n", p->nregions);
    printf("  #  kind  vaddr               size                mirror offset       bitmap offset       "
           "loader bytes\n");
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        char bm[24] = "-", lb[24] = "-";
        if (r->kind == POOL_REGION_DATA) {
            snprintf(bm, sizeof bm, "%#" PRIx64, r->bitmap_offset);
            if (r->loader_bytes) /* (0: not recorded, a pool made before session 41) */
                snprintf(lb, sizeof lb, "%" PRIu64, r->loader_bytes);
            else
                snprintf(lb, sizeof lb, "unrecorded");
        }
        printf("  %-2u %-5s %#-18" PRIx64 "  %-18" PRIu64 "  %#-18" PRIx64 "  %-18s  %s\n", i,
               region_kind_name(r->kind), r->vaddr, r->size, r->mirror_offset, bm, lb);
    }
    printf("head slots:\n");
    for (unsigned i = 0; i < 2; i++) {
        const pool_head_slot *s = &p->slots[i];
        bool ok = pool_slot_valid(s); /* (recovery's rule: checksum and an aligned head_lsn) */
        printf("  slot %u: %-7s advance %" PRIu64 " head_lsn %" PRIu64 " next_seq %" PRIu64
               " generation %" PRIu64 " clean %u%s\n",
               i, ok ? "valid" : "CORRUPT", s->advance, s->head_lsn, s->next_seq, s->generation,
               s->clean, i == p->head_slot ? "  <- newest" : "");
    }
    printf("log (from the newest head, lsn %" PRIu64 "):\n", p->head.head_lsn);
    printf("  committed frames pending replay  %" PRIu64 "\n", res->frames);
    printf("  entries in them                  %" PRIu64 "\n", res->entries);
    printf("  end lsn                          %" PRIu64 " (%" PRIu64 " bytes of log)\n", res->end_lsn,
           res->end_lsn - p->head.head_lsn);
    if (scan_rc == MANGO_OK) {
        if (res->torn_tail)
            printf("  torn tail                        yes, at lsn %" PRIu64 " (file offset %#" PRIx64
                   "): %s\n",
                   res->torn_lsn, h->log_offset + res->torn_lsn % h->log_size, res->torn_reason);
        if (res->torn_tail && res->dropped_after_torn)
            printf("  dropped after the torn frame     %" PRIu64 " complete frame%s, written before it was "
                   "durable (never acknowledged)\n",
                   res->dropped_after_torn, res->dropped_after_torn == 1 ? "" : "s");
        if (!res->torn_tail)
            printf("  torn tail                        no\n");
    } else {
        printf("  ERROR                            %s\n", scan_err);
    }
    size_t show = c->nframes < 8 ? c->nframes : 8;
    for (size_t i = 0; i < show; i++)
    {
        char ranges[96] = "";
        if (c->frames[i].data_ranges)
            snprintf(ranges, sizeof ranges, " (%" PRIu64 " data range%s, %" PRIu64 " bytes)",
                     c->frames[i].data_ranges, c->frames[i].data_ranges == 1 ? "" : "s",
                     c->frames[i].data_bytes);
        printf("  frame seq %" PRIu64 " lsn %" PRIu64 " file offset %#" PRIx64 ": %" PRIu64
               " entries%s, %" PRIu64 " bytes%s\n",
               c->frames[i].seq, c->frames[i].lsn, h->log_offset + c->frames[i].lsn % h->log_size,
               c->frames[i].entries, ranges, c->frames[i].bytes,
               c->frames[i].big ? " (the entries are in the big-batch file)" : "");
    }
    if (c->nframes > show)
        printf("  ... %zu more frames (--json lists all)\n", c->nframes - show);
}

static void print_json(const char *path, const pool *p, const log_scan_result *res, int scan_rc,
                       const char *scan_err, const scan_ctx *c)
{
    const pool_header *h = p->hdr;
    FILE *o = stdout;
    fprintf(o, "{\n  \"path\": ");
    json_str(o, path, SIZE_MAX);
    fprintf(o, ",\n  \"header\": {\n");
    fprintf(o, "    \"version\": %u,\n    \"header_size\": %u,\n", h->version, h->header_size);
    fprintf(o, "    \"pool_size\": %" PRIu64 ",\n", h->pool_size);
    fprintf(o, "    \"created_mode\": \"%s\",\n    \"created_mode_value\": %u,\n",
            persist_mode_name((persist_mode)h->created_mode), h->created_mode);
    fprintf(o, "    \"create_time\": %" PRIu64 ",\n", h->create_time);
    fprintf(o, "    \"region_count\": %u,\n", h->region_count);
    fprintf(o, "    \"heap_base\": %" PRIu64 ",\n    \"heap_capacity\": %" PRIu64 ",\n", h->heap_base,
            h->heap_capacity);
    fprintf(o, "    \"log_offset\": %" PRIu64 ",\n    \"log_size\": %" PRIu64 ",\n", h->log_offset,
            h->log_size);
    fprintf(o, "    \"fingerprint\": \"%016" PRIx64 "\",\n    \"fingerprint_text\": ", h->fingerprint);
    json_str(o, h->fingerprint_text, POOL_FINGERPRINT_TEXT);
    fprintf(o, ",\n    \"header_crc\": %u,\n    \"region_table_crc\": %u\n  },\n", h->header_crc,
            h->region_table_crc);
    fprintf(o, "  \"regions\": [");
    for (unsigned i = 0; i < p->nregions; i++) {
        const pool_region *r = &p->regions[i];
        fprintf(o, "%s\n    {\"index\": %u, \"kind\": \"%s\", \"vaddr\": %" PRIu64 ", \"size\": %" PRIu64
                   ", \"mirror_offset\": %" PRIu64 ", \"bitmap_offset\": %" PRIu64
                   ", \"loader_bytes\": %" PRIu64 "}",
                i ? "," : "", i, region_kind_name(r->kind), r->vaddr, r->size, r->mirror_offset,
                r->kind == POOL_REGION_DATA ? r->bitmap_offset : 0, r->loader_bytes);
    }
    fprintf(o, "\n  ],\n  \"head_slots\": [");
    for (unsigned i = 0; i < 2; i++) {
        const pool_head_slot *s = &p->slots[i];
        fprintf(o, "%s\n    {\"index\": %u, \"offset\": %u, \"valid\": %s, \"newest\": %s, \"advance\": %" PRIu64
                   ", \"head_lsn\": %" PRIu64 ", \"next_seq\": %" PRIu64 ", \"generation\": %" PRIu64
                   ", \"clean\": %u}",
                i ? "," : "", i, POOL_HEAD_OFFSET + i * (unsigned)sizeof *s,
                pool_slot_valid(s) ? "true" : "false", i == p->head_slot ? "true" : "false",
                s->advance, s->head_lsn, s->next_seq, s->generation, s->clean);
    }
    fprintf(o, "\n  ],\n  \"slot_damaged\": %s,\n", p->slot_damaged ? "true" : "false");
    fprintf(o, "  \"log\": {\n    \"head_lsn\": %" PRIu64 ",\n    \"head_seq\": %" PRIu64
               ",\n    \"generation\": %" PRIu64 ",\n",
            p->head.head_lsn, p->head.next_seq, p->head.generation);
    fprintf(o, "    \"committed_frames\": %" PRIu64 ",\n    \"blocks\": %" PRIu64 ",\n", res->frames,
            res->entries);
    fprintf(o, "    \"end_lsn\": %" PRIu64 ",\n    \"next_seq\": %" PRIu64 ",\n", res->end_lsn,
            res->next_seq);
    fprintf(o, "    \"torn_tail\": %s,\n", scan_rc == MANGO_OK && res->torn_tail ? "true" : "false");
    if (scan_rc == MANGO_OK && res->torn_tail) {
        fprintf(o, "    \"torn_lsn\": %" PRIu64 ",\n    \"torn_offset\": %" PRIu64 ",\n    \"torn_reason\": ",
                res->torn_lsn, h->log_offset + res->torn_lsn % h->log_size);
        json_str(o, res->torn_reason, sizeof res->torn_reason);
        fprintf(o, ",\n    \"dropped_after_torn\": %" PRIu64 ",\n", res->dropped_after_torn);
    }
    fprintf(o, "    \"corrupt\": %s,\n", scan_rc != MANGO_OK ? "true" : "false");
    if (scan_rc != MANGO_OK) {
        fprintf(o, "    \"error\": ");
        json_str(o, scan_err, SIZE_MAX);
        fprintf(o, ",\n");
    }
    fprintf(o, "    \"frames\": [");
    for (size_t i = 0; i < c->nframes; i++) {
        const frame_info *f = &c->frames[i];
        fprintf(o, "%s\n      {\"lsn\": %" PRIu64 ", \"offset\": %" PRIu64 ", \"seq\": %" PRIu64
                   ", \"entries\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"big_batch_file\": %s"
                   ", \"data_ranges\": %" PRIu64 ", \"data_range_bytes\": %" PRIu64 "}",
                i ? "," : "", f->lsn, h->log_offset + f->lsn % h->log_size, f->seq, f->entries, f->bytes,
                f->big ? "true" : "false", f->data_ranges, f->data_bytes);
    }
    fprintf(o, "%s]\n  }\n}\n", c->nframes ? "\n    " : "");
}

static int cmd_inspect(int argc, char **argv)
{
    static const struct option lo[] = {{"json", 0, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    bool json = false;
    int ch;
    opterr = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (ch) {
        case 'j': json = true; break;
        case 'h': fputs(inspect_usage, stdout); exit(EXIT_OK);
        default: bad_option("inspect", argv, lo);
        }
    }
    if (optind >= argc)
        usage_error("inspect", "missing POOL");
    if (optind + 1 < argc)
        usage_error("inspect", "unexpected argument '%s'", argv[optind + 1]);
    const char *path = argv[optind];

    pool p;
    int rc = pool_open(&p, path, 0, false);
    if (rc != MANGO_OK) {
        fprintf(stderr, "mango: %s\n", mango_last_error());
        return exit_code_for(rc);
    }
    scan_ctx c = {.p = &p, .record = true};
    log_scan_result res;
    int scan_rc = scan_log(&p, &c, &res);
    char scan_err[1024] = "";
    if (scan_rc != MANGO_OK)
        snprintf(scan_err, sizeof scan_err, "%s", mango_last_error());
    if (json)
        print_json(path, &p, &res, scan_rc, scan_err, &c);
    else
        print_text(path, &p, &res, scan_rc, scan_err, &c);
    fflush(stdout);
    if (scan_rc != MANGO_OK)
        fprintf(stderr, "mango: %s: %s\n", path, scan_err);
    free(c.frames);
    pool_close(&p);
    return exit_code_for(scan_rc);
}

/* ---- check ---- */

/* Walk the replayed heap's metadata as MANGO_CHECK_HEAP=1 does at start-up
 * (dheap_check prints what is wrong), on the preview's private copy of the
 * heap (heap_preview.h: the file itself is never written). */
static bool heap_consistent(scan_ctx *c)
{
    /* The copy's root was replayed like hp.root: they must agree. */
    if (memcmp(c->hp.copy, &c->hp.root, sizeof c->hp.root) != 0) {
        fprintf(stderr, "mango: internal error: the replayed copy of the heap disagrees with its root\n");
        return false;
    }
    int rc = heap_preview_walk(&c->hp);
    if (rc == -2)
        fprintf(stderr, "mango: the replayed heap's root is not one the allocator accepts\n");
    return rc == 0;
}

int check_one(const char *path, bool quiet, bool walk_heap)
{
    return check_one_as(path, path, quiet, walk_heap);
}

int check_one_as(const char *file, const char *path, bool quiet, bool walk_heap)
{
    pool p;
    int rc = pool_open(&p, file, 0, false);
    if (rc != MANGO_OK) {
        fprintf(stderr, "mango: %s\n", mango_last_error());
        return exit_code_for(rc);
    }
    if (p.slot_damaged)
        fprintf(stderr, "mango: warning: %s: log head slot %u is corrupt; recovery will use slot %u "
                        "(advance %" PRIu64 ")\n",
                path, 1 - p.head_slot, p.head_slot, p.head.advance);

    rc = pool_check_loader_bits(&p);
    if (rc != MANGO_OK) {
        fprintf(stderr, "mango: %s: %s\n", path, mango_last_error());
        pool_close(&p);
        return exit_code_for(rc);
    }
    scan_ctx c = {.p = &p, .check_entries = true};
    const pool_region *heap = pool_find_region(&p, POOL_REGION_HEAP);
    if (heap) /* (pool_open refused a heap too small for its root, as recovery's open does) */
        heap_preview_init(&c.hp, &p, heap);
    int e = c.hp.heap && walk_heap ? heap_preview_map(&c.hp, &p) : 0;
    if (e)
        fprintf(stderr, "mango: warning: %s: cannot map a private copy of the heap (%s); its metadata is "
                        "not walked\n", path, strerror(e));
    log_scan_result res;
    rc = scan_log(&p, &c, &res);
    if (rc != MANGO_OK) {
        fprintf(stderr, "mango: %s: %s\n", path, mango_last_error());
        heap_preview_unmap(&c.hp);
        pool_close(&p);
        return exit_code_for(rc);
    }
    if (res.torn_tail && res.dropped_after_torn)
        fprintf(stderr, "mango: warning: %s: torn tail at lsn %" PRIu64 " (%s): an unacknowledged "
                        "batch whose commit did not finish, followed by %" PRIu64 " complete frame%s "
                        "written before it was durable (never acknowledged either); recovery will "
                        "discard them all\n",
                path, res.torn_lsn, res.torn_reason, res.dropped_after_torn,
                res.dropped_after_torn == 1 ? "" : "s");
    else if (res.torn_tail)
        fprintf(stderr, "mango: warning: %s: torn tail at lsn %" PRIu64 " (%s): an unacknowledged "
                        "batch whose commit did not finish; recovery will discard it\n",
                path, res.torn_lsn, res.torn_reason);

    uint64_t extent = 0;
    if (c.hp.heap && c.hp.root.magic == DHEAP_MAGIC && c.hp.root.version != DHEAP_VERSION) {
        fprintf(stderr, "mango: %s: the durable heap has format version %" PRIu64 ", this build reads "
                        "version %u only\n", path, c.hp.root.version, (unsigned)DHEAP_VERSION);
        heap_preview_unmap(&c.hp);
        pool_close(&p);
        return EXIT_BAD;
    }
    if (c.hp.heap && c.hp.root.magic != 0) {
        extent = dheap_extent_of_root(&c.hp.root, c.hp.heap->size);
        if (extent == 0) {
            fprintf(stderr, "mango: %s: the durable heap root in the mirror (offset %#" PRIx64 ") is "
                            "invalid%s\n",
                    path, c.hp.heap->mirror_offset, res.frames ? " after replaying the pending log" : "");
            heap_preview_unmap(&c.hp);
            pool_close(&p);
            return EXIT_BAD;
        }
    }
    bool consistent = !c.hp.copy || !extent || heap_consistent(&c);
    heap_preview_unmap(&c.hp);
    if (!consistent) {
        fprintf(stderr, "mango: %s: the durable heap's metadata is inconsistent%s (see the line above); "
                        "recovery with MANGO_CHECK_HEAP=1 refuses it\n",
                path, res.frames ? " after replaying the pending log" : "");
        pool_close(&p);
        return EXIT_BAD;
    }
    if (!quiet) {
        char b1[32], b2[32], b3[32], b5[32], b4[96];
        snprintf(b4, sizeof b4, "%s carved, %s in %" PRIu64 " allocation%s", human(extent, b3, sizeof b3),
                 human(dheap_root_payload(&c.hp.root), b5, sizeof b5), c.hp.root.inuse_chunks,
                 c.hp.root.inuse_chunks == 1 ? "" : "s");
        printf("%s: ok (format %u, %s, %u regions, log %s: %" PRIu64 " committed frame%s pending "
               "replay, %s%s; heap %s; %s)\n",
               path, p.hdr->version, human(p.hdr->pool_size, b1, sizeof b1), p.nregions,
               human(p.hdr->log_size, b2, sizeof b2), res.frames, res.frames == 1 ? "" : "s",
               res.torn_tail ? "torn tail" : "no torn tail", p.slot_damaged ? ", one head slot damaged" : "",
               extent ? b4 : "empty",
               p.head.clean && res.frames == 0 ? "clean shutdown" : "needs recovery");
    }
    pool_close(&p);
    return EXIT_OK;
}

int parse_flags(int argc, char **argv, const char *cmd, const char *usage, const char *name, bool *quiet,
                bool *flag)
{
    const struct option lo[] = {{"quiet", 0, 0, 'q'}, {name, 0, 0, 'n'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int ch;
    opterr = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, ":qnh", lo, NULL)) != -1) {
        switch (ch) {
        case 'q': *quiet = true; break;
        case 'n': *flag = true; break;
        case 'h': fputs(usage, stdout); exit(EXIT_OK);
        default: bad_option(cmd, argv, lo);
        }
    }
    return optind;
}

static int cmd_check(int argc, char **argv)
{
    bool quiet = false, no_walk = false;
    optind = parse_flags(argc, argv, "check", check_usage, "no-heap-walk", &quiet, &no_walk);
    bool walk_heap = !no_walk;
    if (optind >= argc)
        usage_error("check", "missing POOL");
    int worst = EXIT_OK;
    for (int i = optind; i < argc; i++) {
        int r = check_one(argv[i], quiet, walk_heap);
        if (r > worst)
            worst = r;
    }
    return worst;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage_error(NULL, "missing COMMAND");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        fputs(main_usage, stdout);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
        printf("mango %d.%d (pool format %u)\n", MANGO_VERSION_MAJOR, MANGO_VERSION_MINOR,
               POOL_FORMAT_VERSION);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "help")) {
        if (argc > 3)
            usage_error(NULL, "unexpected argument '%s'", argv[3]);
        if (argc == 2)
            fputs(main_usage, stdout);
        else if (!strcmp(argv[2], "inspect"))
            fputs(inspect_usage, stdout);
        else if (!strcmp(argv[2], "check"))
            fputs(check_usage, stdout);
        else if (!strcmp(argv[2], "copy"))
            fputs(copy_usage, stdout);
        else
            usage_error(NULL, "unknown command '%s'", argv[2]);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "inspect"))
        return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "check"))
        return cmd_check(argc - 1, argv + 1);
    if (!strcmp(cmd, "copy"))
        return cmd_copy(argc - 1, argv + 1);
    if (cmd[0] == '-')
        usage_error(NULL, "unknown option '%s'", cmd);
    usage_error(NULL, "unknown command '%s'", cmd);
    return EXIT_USAGE;
}
