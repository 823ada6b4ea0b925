/*
 * sequence_internal.h
 *	  Shared by the files of src/sequence/ only.
 */
#ifndef SHARDED_SEQ_SEQUENCE_INTERNAL_H
#define SHARDED_SEQ_SEQUENCE_INTERNAL_H

#include "sequence/sequence.h"
#include "topology/topology.h"

/*
 * shards.c (the bottom): where blocks of a generation start, how far its
 * shards got, making a block durable, who may see positions
 */
extern int64 GenerationHighWater(int32 seq_id, int32 generation, int64 base,
								 int32 shards, int32 block);
extern int64 BlockStart(int64 base, int64 k, int32 shards, int32 shard,
						int32 block, bool *overflow);
extern XLogRecPtr FlushShardReservation(Oid relid);

/* what a carve needs of its sequence (CarveFinish) */
typedef struct CarveSpec
{
	int32		id;
	const char *name;
	int64		base;
	int32		shards;
	int32		block;
	int32		generation;
	bool		own_generation; /* this transaction made it: may roll back */
	bool		quiet_end;		/* a prefetch: past the range's end, no error */
} CarveSpec;

extern bool CarveFinish(const CarveSpec *spec, int64 k, int32 shard, Oid shard_relid,
						int64 *first, int64 *last);
extern Oid	LowestNextShard(int32 seq_id, int32 generation, int32 shards, int32 *shard);
extern bool SequenceIdReadable(int32 seq_id);

/* admin.c */
extern bool SequenceHighWater(int32 id, bool stats_readers, int64 *high_water);
extern void LockSequenceDraws(int32 seq_id);
extern bool AdvanceSequenceAbove(OwnerContext *ctx, const char *name, int64 min_base,
								 int64 *start);
extern void PositionsUnknownError(const char *name);
extern int64 DropSequenceHighWater(const char *name, bool drop);

/*
 * shards.c: where the configuration lives, for reading it straight from the
 * tables (engine.c, node_reserve.c): no SQL is planned on the draw path.
 */
typedef struct ConfigPlaces
{
	uint64		epoch;
	Oid			config;			/* sequence_config */
	Oid			by_name;		/* its unique index on name, or InvalidOid */
	Oid			by_id;			/* its primary key (id), or InvalidOid */
	AttrNumber	c_id,
				c_name,
				c_generation,
				c_base,
				c_shards,
				c_block,
				c_owner,
				c_acl,
				c_tier,
				c_cache,		/* InvalidAttrNumber before schema 1.5 */
				c_unknown;		/* positions_unknown, likewise */
	Oid			shards;			/* sequence_shards */
	Oid			by_generation;	/* its primary key (seq_id, generation, shard) */
	AttrNumber	s_seq_id,
				s_generation,
				s_shard,
				s_relid;
} ConfigPlaces;

extern ConfigPlaces *SequenceConfigPlaces(Relation config, Relation shards);
extern bool TextColumnIs(HeapTuple tup, AttrNumber attno, TupleDesc desc, const char *value);

/* node_cache.c, node_draw.c, node_reserve.c: the node-wide cache (engine.c draws through it) */
typedef struct NodeEntry NodeEntry;

typedef struct NodeRef
{
	NodeEntry  *entry;
	uint64		incarnation;	/* the entry's when attached: valid while equal */
	uint64		next_mark;		/* 1 + the block whose low-water mark this
								 * session crosses next if it alone draws; 0:
								 * it crossed none */
	uint64		after;			/* the state our last add left */
	uint32		lone;			/* adds in a row, in this transaction, that found it there */
	LocalTransactionId lone_in;	/* the transaction lone counts in */
	uint32		run;			/* the run slot it last took (node_draw.c) */
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
extern int64 NodeCacheValuesOut(int32 id, bool *has_entry);
extern void NodeCacheLockReservations(int32 id);
extern void NodeCacheUnlockReservations(int32 id);

/*
 * directory.c: a copy of a node-cached sequence's configuration in shared
 * memory, for a session's first draw (engine.c)
 */
#define DIRECTORY_ACL_BYTES 512

typedef struct SequenceCopy
{
	Oid			config_relid;
	int32		id;
	int32		generation;
	int64		base;
	int32		shards;
	int32		block;
	Oid			owner;
	int32		acl_len;		/* bytes of acl; 0 for a NULL acl */
	char		acl[DIRECTORY_ACL_BYTES];
} SequenceCopy;

extern bool DirectoryFind(const char *name, SequenceCopy *out);
extern void DirectoryPublish(const char *name, const SequenceCopy *copy, uint64 word);

#endif							/* SHARDED_SEQ_SEQUENCE_INTERNAL_H */
