/* kv_hashmap_ack.c -- the hash-map crash test's record of what was
 * acknowledged (kvstore hashmap --ack FILE).
 *
 * Per key, the value length its last acknowledged PUT or DEL left (0:
 * absent), and the one command in flight (the workload is one thread). It
 * is a small shared file, so it survives the workload's SIGKILL. After a
 * recovery every key must hold its acknowledged length, except the key of
 * the command in flight, which may hold either its old or its new length
 * (the hash map's values are a function of key and length, checked apart).
 * Without it the kill loop checked only that the recovered map was
 * consistent: a runtime that never synced its commits passed it (found by a
 * review, session 39).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvstore_driver.h"

#define HM_ACK_MAGIC 0x4b4341484d474e4dull /* "MNGMHACK" */

struct hm_ack {
    uint64_t magic;
    uint32_t keys, pad;
    _Atomic uint64_t acked;        /* PUTs and DELs acknowledged, over all runs */
    _Atomic uint32_t inflight_key; /* the command issued and not yet returned */
    _Atomic uint32_t inflight_len;
    _Atomic uint32_t inflight;     /* 1 while it is out */
    uint32_t pad2;
    _Atomic uint32_t len[];        /* per key: acknowledged value length, 0 absent */
};

hm_ack *hm_ack_open(const char *path, uint32_t keys)
{
    size_t size = sizeof(hm_ack) + (size_t)keys * sizeof(uint32_t);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "kvstore: cannot open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    off_t was = lseek(fd, 0, SEEK_END);
    if (was != 0 && was != (off_t)size) {
        fprintf(stderr, "kvstore: %s was written for another --values (or is not a hash-map ack file)\n", path);
        exit(2);
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        fprintf(stderr, "kvstore: cannot size %s: %s\n", path, strerror(errno));
        exit(2);
    }
    hm_ack *a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (a == MAP_FAILED) {
        fprintf(stderr, "kvstore: cannot map %s: %s\n", path, strerror(errno));
        exit(2);
    }
    if (a->magic == 0) { /* new: every key absent, like a new pool */
        a->keys = keys;
        a->magic = HM_ACK_MAGIC;
    } else if (a->magic != HM_ACK_MAGIC || a->keys != keys) {
        fprintf(stderr, "kvstore: %s was written for another --values (or is not a hash-map ack file)\n", path);
        exit(2);
    }
    return a;
}

uint64_t hm_ack_check(hm_ack *a, const uint32_t *recovered)
{
    uint64_t lost = 0;
    bool out = atomic_load(&a->inflight) != 0;
    uint32_t out_key = atomic_load(&a->inflight_key), out_len = atomic_load(&a->inflight_len);
    for (uint32_t i = 0; i < a->keys; i++) {
        uint32_t want = atomic_load(&a->len[i]);
        if (recovered[i] == want || (out && i == out_key && recovered[i] == out_len))
            continue;
        if (lost++ < 5)
            printf("hashmap: key %u recovered %s%u bytes, but its last acknowledged command left %u\n", i,
                   recovered[i] ? "" : "absent, ", recovered[i], want);
    }
    /* The recovered map is the next run's starting point. */
    for (uint32_t i = 0; i < a->keys; i++)
        atomic_store(&a->len[i], recovered[i]);
    atomic_store(&a->inflight, 0);
    return lost;
}

uint64_t hm_ack_total(const hm_ack *a) { return atomic_load(&a->acked); }

void hm_ack_begin(hm_ack *a, uint32_t key, uint32_t len)
{
    atomic_store(&a->inflight_key, key);
    atomic_store(&a->inflight_len, len);
    atomic_store(&a->inflight, 1);
}

void hm_ack_end(hm_ack *a, uint32_t key, uint32_t len, bool applied)
{
    if (applied)
        atomic_store(&a->len[key], len);
    atomic_fetch_add(&a->acked, 1);
    atomic_store(&a->inflight, 0);
}
