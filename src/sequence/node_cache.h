/*
 * node_cache.h
 *	  The node cache's shared layout, for its files only (src/sequence/):
 *	  node_cache.c (the shared table: memory, hash, entries, incarnations, the
 *	  view), node_sweep.c (freeing an entry, the sweep that finds one to
 *	  give), node_reserve.c (reservations: one at a time, carving, publishing,
 *	  the worker's prefetch) and node_draw.c (the draw, with its runs).
 *	  Calls among them run one way: node_cache.c > node_sweep.c;
 *	  node_draw.c > node_reserve.c; none calls node_draw.c.
 */
#ifndef SHARDED_SEQ_NODE_CACHE_H
#define SHARDED_SEQ_NODE_CACHE_H

#include "port/atomics.h"
#include "storage/lwlock.h"
#include "utils/hsearch.h"

#include "sequence/sequence_internal.h"

#define NODE_RING		8		/* published blocks kept per entry */
#define OFF_BITS		40
#define OFF_MASK		((UINT64CONST(1) << OFF_BITS) - 1)
#define BLOCK_MASK		((UINT64CONST(1) << (64 - OFF_BITS)) - 1)

/*
 * Block numbers count modulo 2^24, the bits of them state keeps: every block
 * number stored (state, slots, published) is reduced.  A slot is still known
 * by its number, as 2^24 is a multiple of NODE_RING, and published is always
 * the state's block or the next one, so "is the next one published" is a
 * test of inequality.
 */
static inline uint64
NextBlock(uint64 blockno)
{
	return (blockno + 1) & BLOCK_MASK;
}

#define SLOT_WRITING	PG_UINT64_MAX
#define MAX_ATTEMPTS	100000	/* a bound against livelock only: each try is progress */
#define RESERVE_SUBID	3		/* advisory (LOCK_CLASS, id, 3): one reservation at a time */
#define SYNC_UNSURE		2		/* the standby state moved during the wait: no SyncStamp() */
#define MAX_RESYNCS		3		/* then draw per session: sessions disagree on the state */

typedef struct NodeKey
{
	Oid			dbid;			/* InvalidOid: a free entry */
	Oid			config_relid;	/* which installation of the extension */
	int32		id;
} NodeKey;

typedef struct NodeBlock
{
	pg_atomic_uint64 blockno;	/* the block this slot holds; SLOT_WRITING while written */
	uint64		incarnation;	/* of the entry it was published for */
	int64		first;
	int64		count;
	int32		generation;
	uint32		sync;			/* SyncStamp() it was confirmed under */
} NodeBlock;

typedef struct NodeEntry
{
	/* written by every draw: alone on its cache line */
	pg_atomic_uint64 state;
	pg_atomic_uint32 run_drawn;		/* a run drew since the sweep last passed */
	char		pad[PG_CACHE_LINE_SIZE - sizeof(pg_atomic_uint64) - sizeof(pg_atomic_uint32)];

	/* read by every draw, written once per block */
	pg_atomic_uint64 incarnation;
	pg_atomic_uint32 generation;	/* of the newest published block */
	pg_atomic_uint64 published;		/* the newest published block number */
	NodeBlock	ring[NODE_RING];

	pg_atomic_uint32 reserving;		/* a reservation is in flight; see BeginReserving */
	pg_atomic_uint32 prefetch_wanted;	/* the worker is asked for the next block */
	pg_atomic_uint32 eager;		/* draws outran a prefetch: ask at a block's start */
	/* under NodeShared->lock */
	NodeKey		key;
	uint64		swept_state;	/* state at the last sweep: unchanged means idle */
} NodeEntry;

typedef struct NodeHashEnt
{
	NodeKey		key;
	int32		index;
} NodeHashEnt;

typedef struct NodeCacheData
{
	LWLock	   *lock;			/* the hash, keys, the sweep */
	int32		nentries;
	int32		nfree;
	int32		hand;			/* the sweep's next entry */
	pg_atomic_uint64 next_incarnation;
	char	   *entries;		/* nentries of EntryStride() bytes */
} NodeCacheData;

extern NodeCacheData *NodeShared;
extern HTAB *NodeHash;


static inline Size
EntryStride(void)
{
	return CACHELINEALIGN(sizeof(NodeEntry));
}

static inline NodeEntry *
EntryAt(int32 i)
{
	return (NodeEntry *) (NodeShared->entries + (Size) i * EntryStride());
}

static inline int32
IndexOf(NodeEntry *e)
{
	return (int32) (((char *) e - NodeShared->entries) / EntryStride());
}

static inline NodeKey
MakeKey(Oid dbid, Oid config_relid, int32 id)
{
	NodeKey		key;

	memset(&key, 0, sizeof(key));
	key.dbid = dbid;
	key.config_relid = config_relid;
	key.id = id;
	return key;
}

static inline int64
UsedOf(uint64 state, int64 count)
{
	return Min((int64) (state & OFF_MASK), count);
}


/*
 * Values handed out from an entry's current block, counted when the entry
 * lets it go (they are counted per block otherwise): noted under the lock,
 * counted once it is released (the statistics have an LWLock of their own).
 */
typedef struct LeftCount
{
	Oid			dbid;
	int32		id;
	int64		used;
} LeftCount;

/* node_sweep.c */
extern void CountLeft(LeftCount *left);
extern void FreeEntry(NodeEntry *e, LeftCount *left);
extern NodeEntry *FindVictim(LeftCount *left);

typedef enum SlotRead
{
	SLOT_OK,
	SLOT_MOVED,					/* rewritten, or being rewritten: the ticket is stale */
	SLOT_OTHER					/* published for another incarnation: the ref is stale */
} SlotRead;

static inline SlotRead
ReadSlot(NodeEntry *e, uint64 j, uint64 incarnation, NodeBlock *out)
{
	NodeBlock  *slot = &e->ring[j % NODE_RING];
	uint64		before;
	uint64		after;

	before = pg_atomic_read_u64(&slot->blockno);
	pg_read_barrier();
	out->incarnation = slot->incarnation;
	out->first = slot->first;
	out->count = slot->count;
	out->generation = slot->generation;
	out->sync = slot->sync;
	pg_read_barrier();
	after = pg_atomic_read_u64(&slot->blockno);
	if (before != j || after != j)
		return SLOT_MOVED;
	if (out->incarnation != incarnation)
		return SLOT_OTHER;
	return SLOT_OK;
}

/* node_reserve.c */
typedef enum ReserveMode
{
	RESERVE_REFILL,				/* block j is used up: publish the next one and move on to it */
	RESERVE_PREFETCH,			/* block j is in use: publish the next one only */
	RESERVE_RESET,				/* a newer generation is in force: move on to it at once */
	RESERVE_RESYNC				/* block j was confirmed under another standby state: leave it */
} ReserveMode;

typedef enum ReserveResult
{
	RESERVED_RETRY,				/* look at the state again */
	RESERVED_FALLBACK,			/* draw per session instead */
	RESERVED_STALE				/* the entry is another sequence's now */
} ReserveResult;

extern ReserveResult Reserve(NodeRef *ref, ReserveMode mode, uint64 j, int32 generation,
							 uint32 stamp, bool conditional, bool *waited);

#endif							/* SHARDED_SEQ_NODE_CACHE_H */
