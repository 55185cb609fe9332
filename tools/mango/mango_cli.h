/* mango_cli.h -- what the `mango` command's files share: exit codes, the
 * usage error, sizes for people, the pool check (mango_cli.c) and the copy
 * command (mango_copy.c). */
#ifndef MANGO_CLI_H
#define MANGO_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { EXIT_OK = 0, EXIT_BAD = 1, EXIT_USAGE = 2 };

/* Print "mango CMD: <message>" and a pointer to --help; exit 2. */
void usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* The exit status for a runtime error code (EBADPOOL: 1, others: 2). */
int exit_code_for(int rc);
/* v bytes as "1.5 GiB" into buf. */
const char *human(uint64_t v, char *buf, size_t n);
/* The options of check and copy: -q/--quiet and one more flag, -n/--NAME
 * (their --help prints usage). Returns optind; exits on --help or an
 * unknown option. */
int parse_flags(int argc, char **argv, const char *cmd, const char *usage, const char *name, bool *quiet,
                bool *flag);
/* mango check of one pool: an exit status. */
int check_one(const char *path, bool quiet, bool walk_heap);
/* The same for the pool file `file`, its messages naming it `path` (mango
 * copy checks its temporary file under the name the copy will have). */
int check_one_as(const char *file, const char *path, bool quiet, bool walk_heap);

extern const char *copy_usage;
int cmd_copy(int argc, char **argv);

#endif
