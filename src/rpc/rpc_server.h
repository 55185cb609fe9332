/* rpc_server.h -- RPC mode's sockets and thread pool (rpc_server.c owns
 * them); the public calls are mango_rpc_* in include/mango.h, wired by
 * runtime.c. */
#ifndef MANGO_RPC_SERVER_H
#define MANGO_RPC_SERVER_H

#include "mango.h"

typedef struct rpc_server rpc_server;

/* Listens, starts the acceptor and cfg->threads workers (each claims one of
 * the runtime's max_threads slots when it first runs a command). */
int rpc_server_start(rpc_server **out, const mango_rpc_config *cfg, const mango_callbacks *cb,
                     unsigned max_threads);
int rpc_server_port(const rpc_server *s);
void rpc_server_stats(const rpc_server *s, mango_rpc_stats *out);
/* Stops accepting, closes every connection (destroy_client), joins the threads. */
void rpc_server_stop(rpc_server *s);

#endif
