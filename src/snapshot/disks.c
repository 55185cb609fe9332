/* disks.c -- following a file's block device down to its disks through
 * sysfs (disks.h says why). */
#define _GNU_SOURCE
#include "snapshot/disks.h"

#include <dirent.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>


static bool in_memory(const struct statfs *f) { return f->f_type == TMPFS_MAGIC || f->f_type == RAMFS_MAGIC; }

/* Deep enough for a partition of a loop device on an LVM volume on md. */
#define DEPTH_MAX 8

static void add_disks_of_dir(const char *sysfs, const char *dir, disk_set *s, int depth);
static void add_disks_of_dev(const char *sysfs, dev_t dev, disk_set *s, int depth);

static bool exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p)
        return false;
    return access(p, F_OK) == 0;
}

static void add_disk(const char *dir, disk_set *s)
{
    for (unsigned i = 0; i < s->n; i++)
        if (strcmp(s->disk[i], dir) == 0)
            return;
    if (s->n == DISKS_MAX || strlen(dir) >= sizeof s->disk[0]) {
        s->unknown = true;
        return;
    }
    snprintf(s->disk[s->n++], sizeof s->disk[0], "%s", dir);
}

/* A loop device: the disks of the file behind it. */
static bool follow_loop(const char *sysfs, const char *dir, disk_set *s, int depth)
{
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s/loop/backing_file", dir) >= sizeof p)
        return false;
    FILE *f = fopen(p, "r");
    if (!f)
        return false; /* not a loop device, or one with no file attached */
    char file[PATH_MAX];
    bool got = fgets(file, sizeof file, f) != NULL;
    fclose(f);
    struct stat st;
    struct statfs sf;
    if (got)
        file[strcspn(file, "\n")] = 0;
    if (!got || stat(file, &st) != 0 || statfs(file, &sf) != 0) /* (a deleted one reads "... (deleted)") */
        s->unknown = true;
    else if (S_ISBLK(st.st_mode)) /* over a block device: its disks (its node lives in devtmpfs) */
        add_disks_of_dev(sysfs, st.st_rdev, s, depth + 1);
    else if (!in_memory(&sf)) /* (a file in memory: this device is on no disk) */
        add_disks_of_dev(sysfs, st.st_dev, s, depth + 1);
    return true;
}

/* A stacked device: the disks of each of its slaves. */
static bool follow_slaves(const char *sysfs, const char *dir, disk_set *s, int depth)
{
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s/slaves", dir) >= sizeof p)
        return false;
    DIR *d = opendir(p);
    if (!d)
        return false;
    bool any = false;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char link[PATH_MAX], real[PATH_MAX];
        if ((size_t)snprintf(link, sizeof link, "%s/%s", p, e->d_name) >= sizeof link || !realpath(link, real))
            s->unknown = true;
        else
            add_disks_of_dir(sysfs, real, s, depth + 1);
        any = true;
    }
    closedir(d);
    return any;
}

static void add_disks_of_dir(const char *sysfs, const char *dir, disk_set *s, int depth)
{
    if (depth > DEPTH_MAX) {
        s->unknown = true;
        return;
    }
    if (exists(dir, "partition")) { /* a partition's directory is inside its disk's */
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (!slash || slash == parent) {
            s->unknown = true;
            return;
        }
        *slash = 0;
        add_disks_of_dir(sysfs, parent, s, depth + 1);
        return;
    }
    if (follow_loop(sysfs, dir, s, depth))
        return;
    if (follow_slaves(sysfs, dir, s, depth))
        return;
    add_disk(dir, s);
}

static void add_disks_of_dev(const char *sysfs, dev_t dev, disk_set *s, int depth)
{
    if (depth > DEPTH_MAX) {
        s->unknown = true;
        return;
    }
    if (major(dev) == 0) { /* no block device of its own */
        s->unknown = true;
        return;
    }
    char link[PATH_MAX], real[PATH_MAX];
    if ((size_t)snprintf(link, sizeof link, "%s/dev/block/%u:%u", sysfs, major(dev), minor(dev)) >= sizeof link ||
        !realpath(link, real)) {
        s->unknown = true;
        return;
    }
    add_disks_of_dir(sysfs, real, s, depth);
}

void disks_of_device(const char *sysfs, dev_t dev, disk_set *s) { add_disks_of_dev(sysfs, dev, s, 0); }

bool disks_may_share(const disk_set *a, const disk_set *b)
{
    if (a->unknown || b->unknown)
        return true;
    for (unsigned i = 0; i < a->n; i++)
        for (unsigned j = 0; j < b->n; j++)
            if (strcmp(a->disk[i], b->disk[j]) == 0)
                return true;
    return false;
}

disk_relation disks_relation(int pool_fd, const char *path)
{
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir)
        return DISK_SAME_OR_UNKNOWN;
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    struct statfs df, pf;
    struct stat ds, ps;
    if (statfs(dir, &df) != 0 || stat(dir, &ds) != 0 || fstatfs(pool_fd, &pf) != 0 || fstat(pool_fd, &ps) != 0)
        return DISK_SAME_OR_UNKNOWN;
    if (in_memory(&df) || in_memory(&pf)) /* a writer to or beside memory takes no disk from the log's syncs */
        return DISK_MEMORY;
    if (ds.st_dev == ps.st_dev)
        return DISK_SAME_OR_UNKNOWN;
    disk_set a = {0}, b = {0};
    disks_of_device("/sys", ps.st_dev, &a);
    disks_of_device("/sys", ds.st_dev, &b);
    return disks_may_share(&a, &b) ? DISK_SAME_OR_UNKNOWN : DISK_OTHER;
}
