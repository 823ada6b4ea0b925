/*
 * sequence.h
 *	  The door of src/sequence/: sharded sequences.  What the layers above
 *	  (the worker, module.c) may use; the engine's internals stay in
 *	  sequence_internal.h.
 */
#ifndef SHARDED_SEQ_SEQUENCE_H
#define SHARDED_SEQ_SEQUENCE_H

#include "common/common.h"

/* settings (module.c registers them) */
extern int	DefaultSequenceShards;
extern int	DefaultBlock;
extern int	DefaultLeaseSize;
extern int	NodeCacheSequences;
#ifdef SHARDED_SEQ_WAIT_POINTS
extern int	NodeCacheFirstBlock;
#endif

/* admin.c: drop the native sequences of retired generations (maintain()) */
extern int	ReapShards(void);

/* node_cache.c: the node-wide cache's shared memory; node_reserve.c: the worker's prefetch */
extern Size NodeCacheShmemSize(void);
extern void NodeCacheShmemInit(void);
extern void NodeCachePrefetch(void);

/* directory.c: copies of sequence configuration, for new sessions */
extern Size SequenceDirectoryShmemSize(void);
extern void SequenceDirectoryShmemInit(void);

#endif							/* SHARDED_SEQ_SEQUENCE_H */
