/* disks.h -- which disks a file's bytes end up on, read from sysfs, so that
 * a snapshot written to another disk than its pool's is not paced: pacing
 * leaves the pool's disk to the application's log syncs, and a writer on
 * another disk takes nothing from them (snapshot.c, MANGO_SNAPSHOT_SHARE).
 *
 * A block device is followed down to the disks under it: a partition to its
 * disk, a loop device to the disks of its backing file, a stacked device
 * (device-mapper, md) to its slaves; a loop device over a file in memory is
 * on no disk, one over a block device on that device's disks. A file system with no block device of
 * its own (st_dev major 0: btrfs, overlayfs, NFS, FUSE) is "unknown", and so
 * is anything sysfs does not explain: unknown counts as sharing a disk, so
 * the doubt keeps the pacing.
 */
#ifndef MANGO_SNAPSHOT_DISKS_H
#define MANGO_SNAPSHOT_DISKS_H

#include <stdbool.h>
#include <sys/types.h>

#define DISKS_MAX 8

typedef struct disk_set {
    unsigned n;
    bool unknown;                 /* some device could not be followed down */
    char disk[DISKS_MAX][256];    /* each disk's sysfs directory (realpath) */
} disk_set;

/* Add the disks under block device dev (from st_dev) to *s, reading the
 * sysfs tree at sysfs ("/sys"; tests pass a tree of their own). */
void disks_of_device(const char *sysfs, dev_t dev, disk_set *s);
/* Whether a and b may share a disk: true if either is unknown. (A set that
 * is empty and known is on no disk: a loop device over a file in memory.) */
bool disks_may_share(const disk_set *a, const disk_set *b);

typedef enum disk_relation {
    DISK_SAME_OR_UNKNOWN = 0, /* path's directory may be on one of the pool's disks */
    DISK_OTHER,               /* on other disks only */
    DISK_MEMORY,              /* in memory (tmpfs, ramfs): on no disk */
} disk_relation;

/* Where a new file at path (its directory exists) would be, against the
 * file open at pool_fd. Reads /sys. */
disk_relation disks_relation(int pool_fd, const char *path);

#endif
