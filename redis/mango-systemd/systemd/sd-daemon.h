/* systemd/sd-daemon.h -- the one declaration of libsystemd's header that
 * redis-server-durable needs: sd_notify(), implemented by mango_sd_notify.c.
 * redis/build.sh puts this directory first on the include path and defines
 * HAVE_LIBSYSTEMD, so Redis's "supervised systemd" code is compiled in
 * without linking libsystemd (docs/redis.md, "Running under systemd"). */
#ifndef MANGO_SD_DAEMON_H
#define MANGO_SD_DAEMON_H

int sd_notify(int unset_environment, const char *state);

#endif
