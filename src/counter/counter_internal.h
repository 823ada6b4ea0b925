/*
 * counter_internal.h
 *	  Shared by the files of src/counter/ only.  Inside the folder, calls run
 *	  down: admin.c > engine.c > buffered.c, memcached.c, maintain.c >
 *	  apply.c, sums.c, rewrite.c > config.c, rows.c > kept.c, layout.c; and
 *	  slots.c, below every user of it (README.md).
 */
#ifndef SHARDED_SEQ_COUNTER_INTERNAL_H
#define SHARDED_SEQ_COUNTER_INTERNAL_H

#include "counter/counter.h"
#include "access/tableam.h"
#include "topology/topology.h"
#include "common/hashfn.h"

/*
 * A counter of one installation in one database, hashed: where its slot
 * (slots.c) and its layout word (layout.c) are looked for.
 */
static inline uint32
CounterKeyHash(Oid dbid, Oid install, int32 counter_id)
{
	uint32		h = murmurhash32((uint32) counter_id);

	h = hash_combine(h, murmurhash32((uint32) install));
	return hash_combine(h, murmurhash32((uint32) dbid));
}

/* counter_shards' columns */
#define Anum_shard_counter_id	1
#define Anum_shard_shard		2
#define Anum_shard_value		3
#define Natts_shard				3

/* A shard row where a scan saw it (rows.c: ScanShards) */
typedef struct ShardRef
{
	int32		shard;
	ItemPointerData tid;		/* the version seen */
	int64		value;
} ShardRef;

/*
 * A counter's total as a snapshot saw its rows, and what says how long it
 * holds (sums.c); a session keeps its own, and shares them (kept.c).
 */
typedef struct KeptTotal
{
	TransactionId config_xmin;	/* the config row version they hold for */
	TransactionId seen_xmax;	/* xmax of the snapshot the rows were seen with */
	uint64		layout;			/* LayoutWord() when they were seen */
	int128		sum;
} KeptTotal;

/* Where a pinned counter's shard rows were last seen, per backend. */
typedef struct CounterPlace
{
	int32		counter_id;
	int32		shards;			/* pinned layout, or 0: adaptive */
	TransactionId config_xmin;	/* the counter_config row version loaded */
	bool		config_committed;	/* known committed, without the commit log */
	ItemPointerData *roots;		/* pinned: each shard's HOT root, in
								 * CacheEntryContext, or NULL */
	int			nroots;			/* rows remembered in refs */
	/* with shared memory (layout.c): the rows and their total, kept */
	bool		cached;
	KeptTotal	kept;			/* their total, while cached */
	ShardRef   *refs;			/* in CacheEntryContext, nroots of them */
	uint64		last_word;		/* the word at the previous read */
} CounterPlace;

/*
 * rows.c: row access.  ShardWrite is the only writer of shard rows: extern,
 * so any file of the folder may ask it; test/structure/one_writer.sh fails
 * on any other write.
 */

/* A write of shard rows, as ShardWrite takes it. */
typedef enum ShardWriteKind
{
	WRITE_INSERT,				/* rel, tuple, options */
	WRITE_UPDATE,				/* rel, tid (the version read), tuple, wait, tmfd */
	WRITE_DELETE,				/* rel, tid (the version read), tmfd */
	WRITE_SQL					/* plan, args, expected, what */
} ShardWriteKind;

typedef struct ShardWriteOp
{
	ShardWriteKind kind;
	int32		counter_id;
	Relation	rel;
	ItemPointer tid;
	HeapTuple	tuple;
	int			options;
	bool		wait;
	TM_FailureData *tmfd;
	SPIPlanPtr	plan;
	Datum	   *args;
	int			expected;
	const char *what;
} ShardWriteOp;

typedef enum ShardResult
{
	SHARD_UPDATED,
	SHARD_BUSY,					/* held by another transaction */
	SHARD_GONE,					/* deleted (a shrink or drop) */
	SHARD_FULL					/* the delta does not fit in this shard */
} ShardResult;

extern TM_Result ShardWrite(const ShardWriteOp *op);
extern int128 ScanShards(Relation rel, int32 counter_id, Snapshot snapshot,
						 int32 base, ShardRef **refs, int *nrefs, int *nall);
extern ShardResult UpdateShard(Relation rel, int32 counter_id, ShardRef *ref,
							   int64 delta, bool wait, Snapshot snapshot);
extern void InsertShardRow(Relation rel, int32 counter_id, int32 shard,
						   int64 value, int options);
extern void InsertIndexEntries(Relation rel, HeapTuple newtup, bool moved,
							   bool only_summarizing);

/* sums.c: a counter's total, read and kept */
extern void ForgetRows(CounterPlace *place);
extern int128 CounterSum(int32 counter_id, CounterPlace *place, ShardRef **refs,
						 int *nrefs);

/* apply.c: adding an amount to the rows */
extern bool CounterApply(int32 counter_id, int32 preferred, int64 delta,
						 const char *name, ShardRef *known, int nknown);

typedef enum CounterApplyResult
{
	APPLY_DONE,
	APPLY_BUSY,					/* every shard held by another transaction */
	APPLY_GONE,					/* the counter has no rows */
	APPLY_FULL					/* no shard can take the amount */
} CounterApplyResult;

extern CounterApplyResult CounterTryApply(int32 counter_id, int32 preferred,
										  int64 delta);

/* config.c (FetchCounterConfig is in the door) */
extern int64 CounterSetCount(int32 counter_id);

/* rewrite.c: the administration's writes of rows, by SQL */
extern bool InsertCounter(const char *name, int32 shards, const char *mode,
						  Oid owner, bool if_not_exists);
extern void ShardRowsCreate(int32 id, int32 shards, const char *name);
extern void ShardRowsRebuild(int32 id, int32 shards);
extern void ShardRowsDrop(int32 id);
extern void ShardRowsSet(int32 id, int64 value, const char *name);
extern int32 ShardRowsCount(int32 id);

/* engine.c */
extern void CounterDroppedInXact(int32 counter_id);
extern int128 CounterPendingInXact(int32 counter_id);
extern void CounterSetInXact(int32 counter_id);
extern int32 CounterSetAbove(int32 counter_id);

/* slots.c: the slot table both write-behind modes use */
extern bool SlotsAvailable(void);
extern bool SlotReserve(int32 counter_id, int64 amount, bool forward);
extern int64 SlotPending(int32 counter_id);
extern int64 SlotPendingSince(int32 counter_id, TimestampTz *since);
extern int64 SlotTake(Oid install, int32 counter_id);
extern void SlotsUsage(int *used, int *total, int64 *refused);
extern bool SlotsTakenInXact(void);
extern void SlotsXactCommit(void);
extern void SlotsXactAbort(void);
extern void SlotsSubXact(bool aborted, SubTransactionId subid,
						  SubTransactionId parent);
extern int64 SlotForwardTake(Oid install, int32 counter_id, void **slot, TimestampTz *since);

typedef enum SlotFreezeResult
{
	SLOT_FROZEN,				/* frozen, or no slot table: nothing to absorb */
	SLOT_NONE,					/* the table is full: no slot for the counter */
	SLOT_BUSY					/* a commit or flush held it past the wait */
} SlotFreezeResult;

extern SlotFreezeResult SlotFreeze(int32 counter_id, int wait_ms);
extern bool SlotsFrozenInXact(void);
extern void SlotForwardEnd(void *slot, int64 give_back, TimestampTz since);

/* layout.c: layout words, the net epoch, foreign rows */
#define LAYOUT_UNKNOWN	PG_UINT64_MAX
extern uint64 LayoutWord(int32 counter_id);
extern bool LayoutSettled(uint64 word);
extern void LayoutChanging(int32 counter_id);
extern void LayoutXactEnd(void);
extern void NoteForeignRows(void);
extern bool ForeignRowsSeen(void);
extern uint64 ShardsNetEpoch(void);

/* kept.c: totals kept in shared memory, for every session */
extern bool SharedKeptTotal(int32 counter_id, KeptTotal *total);
extern void ShareKeptTotal(int32 counter_id, const KeptTotal *total);

/* memcached.c: mode 'memcached', the commit side */
extern void MemcachedAfterCommit(int32 counter_id, int64 amount, int32 shard,
							  const char *name, int64 sets, int64 *claim_interval);
extern void MemcachedXactCommit(void);
extern void MemcachedXactAbort(void);
extern void MemcachedSubXact(bool aborted, SubTransactionId subid,
							SubTransactionId parent);
extern bool MemcachedFlushedInXact(void);
extern int64 MemcachedLeftover(int32 counter_id);
extern void MemcachedAbsorbLeftovers(int32 counter_id);
extern void MemcachedApplyLeftovers(void);
extern bool MemcachedPending(int32 counter_id, int64 *amount);
extern bool MemcachedStagingHere(void);

#endif							/* SHARDED_SEQ_COUNTER_INTERNAL_H */
