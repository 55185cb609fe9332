/* test_log_scan_pipelined.c -- recovery's rule for frames in flight at a
 * crash (redo_log.h): after a bad frame, complete frames written while it was
 * not yet durable are dropped with it; a complete frame written after it was
 * durable proves corruption and the scan refuses. From a clean shutdown's
 * head the ring is not searched. Rings are built by hand. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log/redo_log.h"
#include "mango.h"
#include "pool/crc32c.h"

#include "check.h"

#define CAP (64u * 1024u)
#define GEN 7u

static char ring[CAP];

/* A batch frame with n entries at lsn; returns its end. */
static uint64_t put_frame(uint64_t lsn, uint64_t seq, uint32_t n, uint64_t durable_lsn)
{
    log_frame *f = (log_frame *)(ring + lsn % CAP);
    log_entry *e = (log_entry *)(f + 1);
    uint64_t bytes = (sizeof *f + n * sizeof *e + 63) & ~63ull;
    memset(f, 0, bytes);
    for (uint32_t i = 0; i < n; i++) {
        e[i].addr = 0x600000000000ull + 32 * (seq * 16 + i);
        e[i].mask = 0xffffffffu;
        memset(e[i].data, (int)(seq + i), sizeof e[i].data);
    }
    f->magic = LOG_FRAME_MAGIC;
    f->version = LOG_FRAME_VERSION;
    f->kind = LOG_FRAME_BATCH;
    f->lsn = lsn;
    f->seq = seq;
    f->generation = GEN;
    f->n_entries = n;
    f->payload_crc = crc32c(0, e, n * sizeof *e);
    f->frame_bytes = bytes;
    f->durable_lsn = durable_lsn;
    f->header_crc = crc32c(0, f, offsetof(log_frame, header_crc));
    return lsn + bytes;
}

static int scan(log_scan_result *r)
{
    return redo_log_scan(ring, CAP, 0, 1, GEN, UINT64_MAX, NULL, NULL, r);
}

int main(void)
{
    log_scan_result r;
    uint64_t p1, p2, p3, end;

    /* Synchronous commit: each frame written after the previous was durable. */
    memset(ring, 0, sizeof ring);
    p1 = 0;
    p2 = put_frame(p1, 1, 3, 0);
    p3 = put_frame(p2, 2, 2, p2);
    end = put_frame(p3, 3, 5, p3);
    CHECK(scan(&r) == MANGO_OK && r.frames == 3 && r.end_lsn == end && !r.torn_tail);

    /* Pipelined: frames 2 and 3 were sealed while only frame 1 was durable;
     * frame 2 is torn (payload bit flip), frame 3 reached the medium whole. */
    ((char *)ring)[p2 + sizeof(log_frame) + 5] ^= 1;
    put_frame(p3, 3, 5, p2); /* durable_lsn = end of frame 1 <= p2 */
    CHECK(scan(&r) == MANGO_OK);
    CHECK(r.frames == 1 && r.end_lsn == p2 && r.torn_tail && r.torn_lsn == p2);
    CHECK(r.dropped_after_torn == 1);

    /* Same, but frame 2 never reached the medium at all (zeroes). */
    memset(ring + p2, 0, p3 - p2);
    CHECK(scan(&r) == MANGO_OK);
    CHECK(r.frames == 1 && r.end_lsn == p2 && r.torn_tail && r.dropped_after_torn == 1);

    /* Corruption: frame 3 was written after frame 2 was durable (its
     * durable_lsn is past p2), so a bad frame 2 lost acknowledged data. */
    p3 = put_frame(p2, 2, 2, p2);
    put_frame(p3, 3, 5, p3);
    ((char *)ring)[p2 + sizeof(log_frame) + 5] ^= 1;
    CHECK(scan(&r) == MANGO_EBADPOOL);
    CHECK(strstr(mango_last_error(), "corrupt") != NULL);

    /* Two frames in flight after the torn one: both dropped; a fourth one
     * that knew frame 2 durable makes it corruption again. */
    memset(ring, 0, sizeof ring);
    p2 = put_frame(0, 1, 3, 0);
    p3 = put_frame(p2, 2, 2, p2);
    uint64_t p4 = put_frame(p3, 3, 1, p2);
    uint64_t p5 = put_frame(p4, 4, 1, p2);
    ((char *)ring)[p2 + 20] ^= 4; /* frame 2's header */
    CHECK(scan(&r) == MANGO_OK && r.frames == 1 && r.end_lsn == p2 && r.dropped_after_torn == 2);
    put_frame(p5, 5, 1, p3); /* written once frame 2 was durable */
    CHECK(scan(&r) == MANGO_EBADPOOL);

    /* A complete frame of an earlier generation after the tear is stale,
     * neither dropped nor evidence. */
    memset(ring, 0, sizeof ring);
    p2 = put_frame(0, 1, 3, 0);
    p3 = put_frame(p2, 2, 2, p2);
    put_frame(p3, 3, 1, p3);
    ((log_frame *)(ring + p3))->generation = GEN - 1;
    log_frame *f3 = (log_frame *)(ring + p3);
    f3->header_crc = crc32c(0, f3, offsetof(log_frame, header_crc));
    memset(ring + p2, 0, 64);
    CHECK(scan(&r) == MANGO_OK && r.frames == 1 && r.dropped_after_torn == 0);

    /* From a clean head (redo_log_scan_from_clean_head): an invalid frame at
     * the head is the end, with no search of the ring after it, so frames
     * after it, even ones that prove corruption to redo_log_scan, are not
     * read. A valid frame at the head is visited, and from there the scan is
     * redo_log_scan's, search included. */
    memset(ring, 0, sizeof ring);
    p2 = put_frame(0, 1, 3, 0);
    p3 = put_frame(p2, 2, 2, p2);
    put_frame(p3, 3, 1, p3); /* written once frame 2 was durable */
    ((char *)ring)[p2 + 20] ^= 4;
    CHECK(redo_log_scan(ring, CAP, p2, 2, GEN, UINT64_MAX, NULL, NULL, &r) == MANGO_EBADPOOL);
    CHECK(redo_log_scan_from_clean_head(ring, CAP, p2, 2, GEN, NULL, NULL, &r) == MANGO_OK);
    CHECK(r.frames == 0 && r.end_lsn == p2 && r.next_seq == 2 && !r.torn_tail && r.dropped_after_torn == 0);
    CHECK(redo_log_scan_from_clean_head(ring, CAP, 0, 1, GEN, NULL, NULL, &r) == MANGO_EBADPOOL);
    ((char *)ring)[p2 + 20] ^= 4; /* frame 2 whole again */
    CHECK(redo_log_scan_from_clean_head(ring, CAP, 0, 1, GEN, NULL, NULL, &r) == MANGO_OK);
    CHECK(r.frames == 3 && !r.torn_tail);
    return check_report("test_log_scan_pipelined");
}
