/* test_snapshot_disks.c -- following block devices down to their disks
 * (src/snapshot/disks.c), which decides whether a snapshot of an fs-mode
 * pool is paced: on a sysfs tree made here (partitions, device-mapper and md
 * slaves, loop devices, cycles, too many disks), on the real /sys with loop
 * devices when run as root, and through mango_snapshot's report. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "check.h"
#include "mango.h"
#include "test_config.h"
#include "snapshot/disks.h"

static char root[128]; /* the fake /sys */

static void mkdirs(const char *rel)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *c = p + strlen(root) + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            mkdir(p, 0755);
            *c = '/';
        }
    mkdir(p, 0755);
}

static void touch(const char *rel, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* <root>/<rel> -> <target> (relative to the link's directory, as sysfs's). */
static void link_to(const char *target, const char *rel)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    if (symlink(target, p) != 0)
        perror(p);
}

/* A block device: its directory, and /dev/block/MAJ:MIN pointing to it. */
static void device(unsigned maj, unsigned min, const char *dir)
{
    mkdirs(dir);
    char rel[64], target[256];
    snprintf(rel, sizeof rel, "dev/block/%u:%u", maj, min);
    snprintf(target, sizeof target, "../../%s", dir);
    link_to(target, rel);
}

/* A partition: a device whose directory has a "partition" file. */
static void partition(unsigned maj, unsigned min, const char *dir)
{
    device(maj, min, dir);
    char rel[256];
    snprintf(rel, sizeof rel, "%s/partition", dir);
    touch(rel, "1\n");
}

/* A stacked device's slave: <dir>/slaves/<name> -> the slave's directory
 * (target relative to devices/). */
static void slave(const char *dir, const char *name, const char *target)
{
    char rel[256], to[256];
    snprintf(rel, sizeof rel, "%s/slaves", dir);
    mkdirs(rel);
    snprintf(rel, sizeof rel, "%s/slaves/%s", dir, name);
    snprintf(to, sizeof to, "../../../../%s", target);
    link_to(to, rel);
}

static disk_set of(unsigned maj, unsigned min)
{
    disk_set s = {0};
    disks_of_device(root, makedev(maj, min), &s);
    return s;
}

static bool share(unsigned a1, unsigned a2, unsigned b1, unsigned b2)
{
    disk_set a = of(a1, a2), b = of(b1, b2);
    return disks_may_share(&a, &b);
}

/* A block device node in /dev for dev; false if there is none. */
static bool block_node(dev_t dev, char *out, size_t n)
{
    DIR *d = opendir("/dev");
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        struct stat st;
        snprintf(out, n, "/dev/%s", e->d_name);
        found = stat(out, &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == dev;
    }
    if (d)
        closedir(d);
    return found;
}

/* The fake tree. Majors 240-247 (local/experimental), away from the real
 * device of /var/tmp, which the loop devices' backing files are on. */
static void fake_sysfs(dev_t real)
{
    mkdir(root, 0755);
    mkdirs("dev/block");
    device(240, 0, "devices/pci/block/vda");
    partition(240, 1, "devices/pci/block/vda/vda1");
    partition(240, 2, "devices/pci/block/vda/vda2");
    device(240, 16, "devices/pci/block/vdb");
    partition(240, 17, "devices/pci/block/vdb/vdb1");
    /* LVM volume on vda2 */
    device(241, 0, "devices/virtual/block/dm-0");
    slave("devices/virtual/block/dm-0", "vda2", "pci/block/vda/vda2");
    /* md mirror of sda and sdb, a partition of it */
    device(242, 0, "devices/ata/block/sda");
    device(242, 16, "devices/ata/block/sdb");
    partition(242, 17, "devices/ata/block/sdb/sdb1");
    device(243, 0, "devices/virtual/block/md0");
    slave("devices/virtual/block/md0", "sda", "ata/block/sda");
    slave("devices/virtual/block/md0", "sdb", "ata/block/sdb");
    partition(243, 1, "devices/virtual/block/md0/md0p1");
    /* a device-mapper device over itself (sysfs never says that: bounded) */
    device(241, 1, "devices/virtual/block/dm-1");
    mkdirs("devices/virtual/block/dm-1/slaves");
    link_to("..", "devices/virtual/block/dm-1/slaves/dm-1");
    /* ten disks under one md: more than a set holds */
    device(243, 2, "devices/virtual/block/md1");
    for (int i = 0; i < 10; i++) {
        char dir[96], name[32];
        snprintf(name, sizeof name, "nvme%dn1", i);
        snprintf(dir, sizeof dir, "devices/nvme/block/%s", name);
        device(244, (unsigned)i, dir);
        slave("devices/virtual/block/md1", name, dir + strlen("devices/"));
    }
    /* the real device of /var/tmp, and loop devices over files on it and
     * in /dev/shm, and over a file that is gone */
    char dir[96];
    snprintf(dir, sizeof dir, "devices/host/block/hosta");
    device(major(real), minor(real), dir);
    device(7, 0, "devices/virtual/block/loop0");
    mkdirs("devices/virtual/block/loop0/loop");
    char text[128];
    snprintf(text, sizeof text, "/var/tmp/mango-disks-%d.img\n", (int)getpid());
    touch("devices/virtual/block/loop0/loop/backing_file", text);
    device(7, 1, "devices/virtual/block/loop1");
    mkdirs("devices/virtual/block/loop1/loop");
    snprintf(text, sizeof text, "/dev/shm/mango-disks-%d.img\n", (int)getpid());
    touch("devices/virtual/block/loop1/loop/backing_file", text);
    device(7, 2, "devices/virtual/block/loop2");
    mkdirs("devices/virtual/block/loop2/loop");
    touch("devices/virtual/block/loop2/loop/backing_file", "/var/tmp/no-such-file (deleted)\n");
    device(7, 3, "devices/virtual/block/loop3"); /* no file attached: a disk of its own */
    /* a loop device over the block device node of /var/tmp's disk (the node
     * is in devtmpfs, a tmpfs: not to be taken for memory) */
    device(7, 4, "devices/virtual/block/loop4");
    mkdirs("devices/virtual/block/loop4/loop");
    char node[300];
    if (block_node(real, node, sizeof node)) {
        snprintf(text, sizeof text, "%s\n", node);
        touch("devices/virtual/block/loop4/loop/backing_file", text);
    }
}

static void fake_tree_cases(void)
{
    struct stat st;
    if (stat("/var/tmp", &st) != 0 || (major(st.st_dev) >= 240 && major(st.st_dev) <= 244) ||
        major(st.st_dev) == 7 || major(st.st_dev) == 0) {
        printf("skipped the fake tree: /var/tmp's device %u:%u collides with it or has no block device\n",
               major(st.st_dev), minor(st.st_dev));
        return;
    }
    snprintf(root, sizeof root, "/tmp/mango-fake-sysfs-%d", (int)getpid());
    fake_sysfs(st.st_dev);
    char img[96], shm[96];
    snprintf(img, sizeof img, "/var/tmp/mango-disks-%d.img", (int)getpid());
    snprintf(shm, sizeof shm, "/dev/shm/mango-disks-%d.img", (int)getpid());
    close(open(img, O_CREAT | O_WRONLY, 0600));
    close(open(shm, O_CREAT | O_WRONLY, 0600));

    disk_set s = of(240, 1);
    CHECK(!s.unknown && s.n == 1 && strstr(s.disk[0], "/block/vda") && !strstr(s.disk[0], "vda1"));
    CHECK(share(240, 1, 240, 0));   /* a partition and its disk */
    CHECK(share(240, 1, 240, 2));   /* two partitions of one disk */
    CHECK(!share(240, 0, 240, 16)); /* two disks */
    CHECK(!share(240, 1, 240, 17));
    CHECK(share(241, 0, 240, 1)); /* an LVM volume on vda2, and vda1 */
    CHECK(!share(241, 0, 240, 17));
    s = of(243, 1);
    CHECK(!s.unknown && s.n == 2); /* a partition of an md mirror: both its disks */
    CHECK(share(243, 1, 242, 17));
    CHECK(!share(243, 1, 240, 0));
    s = of(241, 1);
    CHECK(s.unknown); /* a cycle ends as unknown */
    CHECK(share(241, 1, 240, 16));
    s = of(243, 2);
    CHECK(s.unknown && s.n == DISKS_MAX); /* too many disks */
    CHECK(share(243, 2, 240, 0));
    s = of(7, 0);
    CHECK(!s.unknown && s.n == 1 && strstr(s.disk[0], "hosta")); /* a loop device: the disk of its file */
    CHECK(share(7, 0, major(st.st_dev), minor(st.st_dev)));
    CHECK(!share(7, 0, 240, 0));
    s = of(7, 1);
    CHECK(!s.unknown && s.n == 0); /* over a file in memory: no disk */
    CHECK(!share(7, 1, major(st.st_dev), minor(st.st_dev)));
    CHECK(of(7, 2).unknown); /* its file is gone */
    s = of(7, 3);
    CHECK(!s.unknown && s.n == 1 && strstr(s.disk[0], "loop3"));
    char node[300];
    if (block_node(st.st_dev, node, sizeof node)) {
        s = of(7, 4);
        CHECK(!s.unknown && s.n == 1 && strstr(s.disk[0], "hosta")); /* the disk of the device it is over */
        CHECK(share(7, 4, major(st.st_dev), minor(st.st_dev)));
    } else {
        printf("skipped a loop device over a block device: no node in /dev for %u:%u\n", major(st.st_dev),
               minor(st.st_dev));
    }
    CHECK(of(0, 40).unknown);  /* no block device of its own (btrfs, overlayfs, NFS) */
    CHECK(of(245, 9).unknown); /* not in sysfs */
    CHECK(share(0, 40, 240, 0));
    disk_set none = {0};
    CHECK(!disks_may_share(&none, &none));

    unlink(img);
    unlink(shm);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
}

/* The real /sys: a loop device over a file on /var/tmp is on /var/tmp's
 * disk; one over a file in /dev/shm on none. Root and losetup only. */
static void real_loop_devices(void)
{
    if (geteuid() != 0 || system("command -v losetup > /dev/null 2>&1") != 0) {
        printf("skipped the real loop devices: needs root and losetup\n");
        return;
    }
    const char *dirs[2] = {"/var/tmp", "/dev/shm"};
    struct stat vt;
    CHECK(stat("/var/tmp", &vt) == 0);
    disk_set host = {0};
    disks_of_device("/sys", vt.st_dev, &host);
    for (int i = 0; i < 2; i++) {
        char img[96], cmd[256], dev[64] = "";
        snprintf(img, sizeof img, "%s/mango-disks-loop-%d.img", dirs[i], (int)getpid());
        snprintf(cmd, sizeof cmd, "truncate -s 1M %s && losetup -f --show %s", img, img);
        FILE *p = popen(cmd, "r");
        bool got = p && fgets(dev, sizeof dev, p);
        if (p)
            pclose(p);
        dev[strcspn(dev, "\n")] = 0;
        struct stat ds;
        if (!got || stat(dev, &ds) != 0) {
            printf("skipped a real loop device over %s: losetup gave none\n", img);
            unlink(img);
            continue;
        }
        disk_set s = {0};
        disks_of_device("/sys", ds.st_rdev, &s);
        printf("%s over %s: %u disk(s)%s, first %s; /var/tmp's: %u%s\n", dev, img, s.n,
               s.unknown ? " and unknown" : "", s.n ? s.disk[0] : "-", host.n, host.unknown ? " and unknown" : "");
        if (i == 0) {
            CHECK(disks_may_share(&s, &host)); /* the disk of its file */
            if (!host.unknown)
                CHECK(!s.unknown && s.n == host.n && strcmp(s.disk[0], host.disk[0]) == 0);
        } else {
            CHECK(!s.unknown && s.n == 0); /* memory */
        }
        snprintf(cmd, sizeof cmd, "losetup -d %s", dev);
        CHECK(system(cmd) == 0);
        unlink(img);
    }
}

/* disks_relation for a file and a directory on the machine's own file systems. */
static void relations(void)
{
    char f[96];
    snprintf(f, sizeof f, "/var/tmp/mango-disks-rel-%d", (int)getpid());
    int fd = open(f, O_CREAT | O_RDWR, 0600);
    CHECK(fd >= 0);
    CHECK(disks_relation(fd, "/var/tmp/x.snap") == DISK_SAME_OR_UNKNOWN);
    CHECK(disks_relation(fd, "/dev/shm/x.snap") == DISK_MEMORY);
    CHECK(disks_relation(fd, "/no/such/dir/x.snap") == DISK_SAME_OR_UNKNOWN); /* doubt: paced */
    char cwd[512];
    if (getcwd(cwd, sizeof cwd) && chdir("/dev/shm") == 0) {
        CHECK(disks_relation(fd, "x.snap") == DISK_MEMORY); /* a name in the working directory */
        CHECK(chdir(cwd) == 0);
    }
    close(fd);
    unlink(f);
    fd = open("/dev/shm", O_RDONLY | O_DIRECTORY);
    CHECK(disks_relation(fd, "/var/tmp/x.snap") == DISK_MEMORY); /* the pool in memory */
    close(fd);
}

static uint64_t *counter;
static void init_state(void *arg)
{
    (void)arg;
    counter = malloc(sizeof *counter); /* inside init_state: from the durable heap */
    *counter = 1;
    mango_capture(counter, sizeof *counter);
}
static bool is_ro(void *c) { (void)c; return false; }
static void nothing(void *c) { (void)c; }

/* mango_snapshot's report: an fs-mode pool on /var/tmp, snapshots to
 * /var/tmp (the same disk: paced by default) and to /dev/shm (not). */
static void snapshot_reports(void)
{
    char pool[96], snap[96];
    snprintf(pool, sizeof pool, "/var/tmp/mango-disks-%d.pool", (int)getpid());
    unlink(pool);
    mango_config cfg;
    small_test_config(&cfg, pool, MANGO_PERSIST_FS);
    mango_callbacks cb = {.is_read_only = is_ro, .process_request = nothing, .init_state = init_state};
    int rc = mango_init(&cfg, &cb);
    CHECK(rc == MANGO_FRESH);
    if (rc != MANGO_FRESH) {
        printf("mango_init: %s\n", mango_last_error());
        return;
    }
    unsetenv("MANGO_SNAPSHOT_SHARE");
    unsetenv("MANGO_SNAPSHOT_MBPS");
    for (int i = 0; i < 2; i++) {
        snprintf(snap, sizeof snap, "%s/mango-disks-%d.snap", i ? "/dev/shm" : "/var/tmp", (int)getpid());
        unlink(snap);
        mango_snapshot_info si;
        memset(&si, 0xff, sizeof si);
        rc = mango_snapshot(snap, &si);
        CHECK(rc == MANGO_OK);
        printf("snapshot to %s: share %u, shares_disk %d\n", snap, si.share, (int)si.shares_disk);
        CHECK(si.share == (i ? 100u : 25u) && si.shares_disk == (i == 0));
        setenv("MANGO_SNAPSHOT_SHARE", "40", 1); /* set: used wherever the snapshot goes */
        unlink(snap);
        CHECK(mango_snapshot(snap, &si) == MANGO_OK && si.share == 40 && si.shares_disk == (i == 0));
        unsetenv("MANGO_SNAPSHOT_SHARE");
        unlink(snap);
    }
    CHECK(mango_shutdown() == MANGO_OK);
    unlink(pool);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    fake_tree_cases();
    real_loop_devices();
    relations();
    snapshot_reports();
    return check_report("test_snapshot_disks");
}
