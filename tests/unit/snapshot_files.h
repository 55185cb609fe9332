/* snapshot_files.h -- the files a snapshot test leaves or looks for: a
 * snapshot writer's temporary files ("<snap>.tmp.<pid>", next to the
 * snapshot's path) and a pool's own files, removed after a test. */
#ifndef SNAPSHOT_FILES_H
#define SNAPSHOT_FILES_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* How many "<snap>.tmp.*" files lie next to snap; *writer (if given) gets
 * the pid the last one is named for; remove: they are unlinked too. */
static inline int snapshot_leftovers(const char *snap, pid_t *writer, bool remove)
{
    const char *slash = strrchr(snap, '/');
    char dir[256], prefix[256];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - snap) : 1, slash ? snap : ".");
    snprintf(prefix, sizeof prefix, "%s.tmp.", slash ? slash + 1 : snap);
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            n++;
            if (writer) /* its name ends in the writer's pid */
                *writer = (pid_t)atol(e->d_name + strlen(prefix));
            if (remove) {
                char path[600];
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        }
    if (d)
        closedir(d);
    return n;
}

/* Remove a pool and its big-batch file. */
static inline void remove_pool_files(const char *pool)
{
    char big[600];
    snprintf(big, sizeof big, "%s.bigbatch", pool);
    unlink(pool);
    unlink(big);
}

#endif
