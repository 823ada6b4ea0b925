/*
 * worker_internal.h
 *	  Shared by the files of src/worker/ only.
 */
#ifndef SHARDED_SEQ_WORKER_INTERNAL_H
#define SHARDED_SEQ_WORKER_INTERNAL_H

#include <signal.h>

#include "worker/worker.h"
#include "topology/topology.h"

#define RESTART_DELAY_MS	1000	/* the launcher's poll, and a worker's restart pause */

PGDLLEXPORT void sharded_seq_launcher_main(Datum arg);
PGDLLEXPORT void sharded_seq_worker_main(Datum arg);

/* worker.c: SIGTERM for the launcher and the workers */
extern volatile sig_atomic_t WorkerGotSigterm;
extern void WorkerHandleSigterm(SIGNAL_ARGS);

#endif							/* SHARDED_SEQ_WORKER_INTERNAL_H */
