/* mango_sd_notify.c -- sd_notify() for redis-server-durable, which is built
 * without libsystemd (docs/redis.md, "Running under systemd").
 *
 * Redis calls it when supervised by systemd (Type=notify units, such as
 * Debian's redis-server.service): STATUS=..., READY=1 once it accepts
 * connections, STOPPING=1 at shutdown. The protocol (sd_notify(3)): one
 * datagram with the state text to the AF_UNIX socket that $NOTIFY_SOCKET
 * names, a file system path or, when it starts with '@', an abstract name.
 * Returns as sd_notify() does: 1 sent, 0 no socket to tell, -errno on error.
 */
#define _GNU_SOURCE /* unsetenv, SOCK_CLOEXEC, MSG_NOSIGNAL under -std=c99 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "systemd/sd-daemon.h"

static int notify(const char *path, const char *state)
{
    if (!path || !*path) return 0;
    if (!state) return -EINVAL;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof sa.sun_path) return -EINVAL;
    memcpy(sa.sun_path, path, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract: the name is the n bytes, no terminator */
    else
        len++; /* a path: with its terminating NUL */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int rc = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0 ? -errno : 1;
    close(fd);
    return rc;
}

int sd_notify(int unset_environment, const char *state)
{
    int rc = notify(getenv("NOTIFY_SOCKET"), state);
    if (unset_environment) unsetenv("NOTIFY_SOCKET");
    return rc;
}
