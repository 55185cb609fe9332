/* test_pool_create_sizes.c -- pool_create refuses sizes that do not fit
 * instead of letting its layout arithmetic wrap. A log size near 2^64 wrapped
 * the offsets: on tmpfs a pool was published that never opens, on a disk the
 * ring's zero-fill ran until the file system was full (found by a review,
 * session 37). Runs in /dev/shm only (never on a disk, for that reason).
 *
 *   - a log size of 2^64 - 64 KiB, one of the pool's size, and a data region
 *     of 2^64 - 4 KiB bytes: MANGO_EINVAL, nothing at the path, no
 *     temporary file;
 *   - a pool whose data region lies over the heap's addresses would not
 *     open (pool validation): refused at creation the same way;
 *   - a sound pool is created and opens. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "pool/pool.h"
#include "runtime/error.h"

static char dir[] = "/dev/shm/mango-create-sizes-XXXXXX";
static char path[256];

static pool_create_params params(void)
{
    pool_create_params pp = {
        .pool_size = 8u << 20,
        .log_size = 1u << 20,
        .mode = PERSIST_EMULATED,
        .heap_base = 0x600000000000ull,
        .n_data = 1,
        .data_vaddr = {0x500000000000ull},
        .data_size = {4096},
        .fingerprint = 0x1234,
        .fingerprint_text = "test_pool_create_sizes",
    };
    return pp;
}

static int files_in_dir(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void refused(pool_create_params pp, const char *needle)
{
    int rc = pool_create(path, &pp);
    CHECK(rc == MANGO_EINVAL);
    CHECK(strstr(mango_last_error(), needle) != NULL);
    if (rc != MANGO_EINVAL || !strstr(mango_last_error(), needle))
        fprintf(stderr, "  rc %d: %s\n", rc, mango_last_error());
    CHECK(files_in_dir() == 0); /* no pool, no temporary file */
    unlink(path);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        printf("test_pool_create_sizes: no /dev/shm, skipped\n");
        return 0;
    }
    snprintf(path, sizeof path, "%s/pool", dir);
    pool_create_params pp = params();
    pp.log_size = (size_t)(UINT64_MAX - 65535); /* a multiple of 4096 */
    refused(pp, "does not fit");
    pp = params();
    pp.log_size = pp.pool_size;
    refused(pp, "does not fit");
    pp = params();
    pp.data_size[0] = UINT64_MAX - 4095;
    refused(pp, "too small");
    pp = params();
    pp.data_vaddr[0] = pp.heap_base + 4096; /* over the heap */
    refused(pp, "would not open");

    pp = params();
    CHECK(pool_create(path, &pp) == MANGO_OK);
    pool p;
    CHECK(pool_open(&p, path, PERSIST_EMULATED, false) == MANGO_OK);
    pool_close(&p);
    unlink(path);
    rmdir(dir);
    return check_report("test_pool_create_sizes");
}
