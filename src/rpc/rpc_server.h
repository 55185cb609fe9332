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
/* The commit pipeline's listener (pipeline_set_listener, arg: the server):
 * wakes the workers that hold responses behind a ticket now durable. */
void rpc_server_durable_advanced(void *arg, uint64_t durable, bool failed);
/* Stops accepting, closes every connection (destroy_client), joins the threads. */
void rpc_server_stop(rpc_server *s);

#endif
