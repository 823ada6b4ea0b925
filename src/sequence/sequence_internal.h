/*
 * sequence_internal.h
 *	  Shared by the files of src/sequence/ only.
 */
#ifndef SHARDED_SEQ_SEQUENCE_INTERNAL_H
#define SHARDED_SEQ_SEQUENCE_INTERNAL_H

#include "sequence/sequence.h"

/* admin.c: where blocks of a generation start, and making a block durable */
extern int64 GenerationHighWater(int32 seq_id, int32 generation, int64 base,
								 int32 shards, int32 block);
extern int64 BlockStart(int64 base, int64 k, int32 shards, int32 shard,
						int32 block, bool *overflow);
extern XLogRecPtr FlushShardReservation(Oid relid);
extern Oid	LowestNextShard(int32 seq_id, int32 generation, int32 shards, int32 *shard);

/* node_cache.c: the node-wide cache (engine.c draws through it) */
typedef struct NodeEntry NodeEntry;

typedef struct NodeRef
{
	NodeEntry  *entry;
	uint64		incarnation;	/* the entry's when attached: valid while equal */
} NodeRef;

typedef enum NodeDrawResult
{
	NODE_GOT,					/* a value */
	NODE_STALE,					/* the entry went to another sequence: attach again */
	NODE_FALLBACK				/* draw a block of the session's own */
} NodeDrawResult;

extern bool NodeCacheEnabled(void);
extern bool NodeCacheAttach(Oid config_relid, int32 id, NodeRef *ref);
extern NodeDrawResult NodeCacheDraw(NodeRef *ref, int32 generation,
									int64 *local, int32 *value_gen);
extern void NodeCacheForget(Oid config_relid, int32 id);
extern void NodeCacheLockReservations(int32 id);
extern void NodeCacheUnlockReservations(int32 id);

#endif							/* SHARDED_SEQ_SEQUENCE_INTERNAL_H */
