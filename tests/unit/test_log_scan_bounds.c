/* test_log_scan_bounds.c -- the log scan never reads a frame header across
 * the ring's end. A scan from a position that is not 64-byte aligned (a
 * crafted head slot: pool validation refuses it since session 37) found
 * "MGLF" in the ring's last 8 bytes and read the 64-byte header past the
 * end of the mapping. Here the ring is followed by a PROT_NONE page, so such
 * a read is a SIGSEGV, not a read of whatever mapping happens to follow. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "log/redo_log.h"
#include "mango.h"

#include "check.h"

#define CAP (64u * 1024u)

int main(void)
{
    char *m = mmap(NULL, CAP + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    if (m == MAP_FAILED)
        return check_report("test_log_scan_bounds");
    CHECK(mprotect(m + CAP, 4096, PROT_NONE) == 0);
    uint32_t magic = LOG_FRAME_MAGIC;
    for (uint64_t back = 8; back < 64; back += 8) {
        memset(m, 0, CAP);
        memcpy(m + CAP - back, &magic, sizeof magic);
        log_scan_result res;
        /* The first lap and a later one; a plain scan and one from a clean head. */
        for (uint64_t lap = 0; lap < 2; lap++) {
            uint64_t from = lap * CAP + CAP - back;
            int rc = redo_log_scan(m, CAP, from, 1, 1, UINT64_MAX, NULL, NULL, &res);
            CHECK(rc == MANGO_OK && res.frames == 0 && !res.torn_tail && res.end_lsn == from);
            CHECK(strstr(res.torn_reason, "not 64-byte aligned") != NULL);
            rc = redo_log_scan_from_clean_head(m, CAP, from, 1, 1, NULL, NULL, &res);
            CHECK(rc == MANGO_OK && res.frames == 0 && res.end_lsn == from);
        }
    }
    munmap(m, CAP + 4096);
    return check_report("test_log_scan_bounds");
}
