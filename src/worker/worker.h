/*
 * worker.h
 *	  The door of src/worker/: the launcher, one worker per database, and the
 *	  utility hook.  Only module.c includes it.
 */
#ifndef SHARDED_SEQ_WORKER_H
#define SHARDED_SEQ_WORKER_H

#include "common/common.h"
#include "counter/counter.h"
#include "sequence/sequence.h"

/* registered from _PG_init, when preloaded */
extern void WorkerRegister(void);
extern void WorkerUtilityInit(void);

#endif							/* SHARDED_SEQ_WORKER_H */
