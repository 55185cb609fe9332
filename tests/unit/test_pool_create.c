/* test_pool_create.c -- creating a pool when other processes create the
 * same pool at the same moment, or were killed while creating it.
 *
 *   - racing creators: 3 processes released together call pool_create() on
 *     one path, 12 rounds; exactly one succeeds, the others get MANGO_EEXIST,
 *     and the pool left is a valid one (a creator renaming its file over a
 *     pool made meanwhile would replace a pool another process may already
 *     be writing to);
 *   - abandoned creations: "<pool>.tmp.<pid>" files left by dead processes
 *     are removed by the next creation of that pool; those of live processes,
 *     those still locked (a creator in another PID namespace), those of other
 *     pools and names that are not ours are kept;
 *   - creators killed at random moments (SIGKILL, 10 rounds) leave no
 *     temporary file once the pool has been created again;
 *   - a pool is not created under a name another pool's open or creation
 *     removes as its own file ("<pool>.bigbatch", "<pool>.tmp.<pid>",
 *     "<pool>.copying-<pid>"): MANGO_EINVAL and nothing made (such a pool,
 *     holding acknowledged data, was deleted by the next open of <pool>);
 *     look-alikes are created.
 *
 * The pools live in /var/tmp (a real file system, where a creation
 * allocates and writes blocks and takes long enough to race), 64 MiB each.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "pool/pool.h"
#include "runtime/error.h"

#define POOL_BYTES (64u << 20)

static char dir[256];
static char pool_path[512];

static pool_create_params params(void)
{
    pool_create_params pp = {
        .pool_size = POOL_BYTES,
        .log_size = 1u << 20,
        .mode = PERSIST_FS,
        .heap_base = 0x600000000000ull,
        .n_data = 0,
        .fingerprint = 0x1234,
        .fingerprint_text = "test_pool_create",
    };
    return pp;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* Files in dir whose names contain ".tmp.". */
static int count_temporaries(void)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static bool pool_is_valid(const char *path)
{
    pool p;
    int rc = pool_open(&p, path, PERSIST_FS, false);
    if (rc != MANGO_OK) {
        fprintf(stderr, "pool_open: %s\n", mango_last_error());
        return false;
    }
    pool_close(&p);
    return true;
}

static void racing_creators(void)
{
    int ok_rounds = 0;
    for (int round = 0; round < 12; round++) {
        unlink(pool_path);
        int gate[2];
        CHECK(pipe(gate) == 0);
        pid_t kids[3];
        for (int i = 0; i < 3; i++) {
            kids[i] = fork();
            if (kids[i] == 0) {
                close(gate[1]);
                char c;
                (void)!read(gate[0], &c, 1); /* released when the parent closes the pipe */
                pool_create_params pp = params();
                int rc = pool_create(pool_path, &pp);
                _exit(rc == MANGO_OK ? 0 : rc == MANGO_EEXIST ? 1 : 2);
            }
        }
        close(gate[0]);
        close(gate[1]);
        int created = 0, refused = 0, other = 0;
        for (int i = 0; i < 3; i++) {
            int st;
            waitpid(kids[i], &st, 0);
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 3;
            created += code == 0;
            refused += code == 1;
            other += code > 1;
        }
        if (created != 1 || refused != 2 || other)
            fprintf(stderr, "round %d: created %d, refused %d, other %d\n", round, created, refused, other);
        ok_rounds += created == 1 && refused == 2 && !other;
        CHECK(pool_is_valid(pool_path));
        CHECK(count_temporaries() == 0);
    }
    printf("racing creators: %d of 12 rounds with exactly one creation\n", ok_rounds);
    CHECK(ok_rounds == 12);
}

static pid_t dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

static void make_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    CHECK(write(fd, "leftover", 8) == 8);
    close(fd);
}

static void abandoned_creations(void)
{
    unlink(pool_path);
    char dead1[600], dead2[600], live[600], locked[600], other_pool[600], not_pid[600], zero_pid[600];
    snprintf(dead1, sizeof dead1, "%s.tmp.%d", pool_path, (int)dead_pid());
    snprintf(dead2, sizeof dead2, "%s.tmp.%d", pool_path, (int)dead_pid());
    snprintf(live, sizeof live, "%s.tmp.%d", pool_path, (int)getppid());
    snprintf(locked, sizeof locked, "%s.tmp.%d", pool_path, (int)dead_pid());
    snprintf(other_pool, sizeof other_pool, "%s/other.pool.tmp.%d", dir, (int)dead_pid());
    snprintf(not_pid, sizeof not_pid, "%s.tmp.12ab", pool_path);
    snprintf(zero_pid, sizeof zero_pid, "%s.tmp.0", pool_path);
    const char *all[] = {dead1, dead2, live, locked, other_pool, not_pid, zero_pid};
    for (unsigned i = 0; i < sizeof all / sizeof *all; i++)
        make_file(all[i]);
    int hold = open(locked, O_RDONLY);
    CHECK(hold >= 0 && flock(hold, LOCK_EX | LOCK_NB) == 0);

    pool_create_params pp = params();
    CHECK(pool_create(pool_path, &pp) == MANGO_OK);
    CHECK(pool_is_valid(pool_path));
    CHECK(!exists(dead1));
    CHECK(!exists(dead2));
    CHECK(exists(live));
    CHECK(exists(locked));
    CHECK(exists(other_pool));
    CHECK(exists(not_pid));
    CHECK(exists(zero_pid));
    close(hold);
    /* Unlocked now, its process dead: the next creation removes it. */
    unlink(pool_path);
    CHECK(pool_create(pool_path, &pp) == MANGO_OK);
    CHECK(!exists(locked));
    CHECK(exists(live) && exists(other_pool) && exists(not_pid) && exists(zero_pid));
    for (unsigned i = 0; i < sizeof all / sizeof *all; i++)
        unlink(all[i]);
}

static void killed_creators(void)
{
    int left_behind = 0;
    for (int round = 0; round < 10; round++) {
        unlink(pool_path);
        pid_t pid = fork();
        if (pid == 0) {
            pool_create_params pp = params();
            _exit(pool_create(pool_path, &pp) == MANGO_OK ? 0 : 1);
        }
        struct timespec ts = {0, (long)(rand() % 20000) * 1000L}; /* 0-20 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        left_behind += count_temporaries() > 0;
        /* Whatever the kill interrupted, a pool that is there is whole. */
        if (exists(pool_path))
            CHECK(pool_is_valid(pool_path));
        unlink(pool_path);
        pool_create_params pp = params();
        CHECK(pool_create(pool_path, &pp) == MANGO_OK);
        CHECK(count_temporaries() == 0);
    }
    printf("killed creators: %d of 10 kills left a temporary file, none after the next creation\n",
           left_behind);
}

static void names_of_other_pools_files(void)
{
    const char *refused[] = {"p.pool.bigbatch", "p.pool.tmp.123", "p.pool.copying-99", "q.tmp.7"};
    const char *created[] = {"p.pool.bigbatch.bak", "p.pool.tmp.x", "p.pool.tmp.0", "p.pool.copying-"};
    pool_create_params pp = params();
    for (unsigned i = 0; i < sizeof refused / sizeof *refused; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, refused[i]);
        CHECK(pool_create(path, &pp) == MANGO_EINVAL);
        CHECK(strstr(mango_last_error(), "must not end in") != NULL);
        CHECK(!exists(path));
        CHECK(count_temporaries() == 0);
    }
    for (unsigned i = 0; i < sizeof created / sizeof *created; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, created[i]);
        CHECK(pool_create(path, &pp) == MANGO_OK);
        CHECK(pool_is_valid(path));
        unlink(path);
    }
}

int main(void)
{
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    snprintf(dir, sizeof dir, "/var/tmp/mango_test_pool_create_%d", (int)getpid());
    if (mkdir(dir, 0700) != 0) {
        perror(dir);
        return 1;
    }
    snprintf(pool_path, sizeof pool_path, "%s/p.pool", dir);
    racing_creators();
    abandoned_creations();
    killed_creators();
    names_of_other_pools_files();
    DIR *d = opendir(dir); /* whatever a failed check left */
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            unlinkat(dirfd(d), e->d_name, 0);
    if (d)
        closedir(d);
    CHECK(rmdir(dir) == 0);
    return check_report("test_pool_create");
}
