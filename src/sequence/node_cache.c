/*
 * node_cache.c
 *	  The node-wide sequence cache's shared table: a sequence's current block
 *	  in shared memory, taken with one atomic add, and the next block
 *	  reserved before the current one runs out (when sharded_seq is
 *	  preloaded).  This file holds the table: its shared memory, the hash
 *	  that finds a sequence's entry, the entries and their incarnations, and
 *	  sequence_cache() behind the sequences view.  The draw and its runs are
 *	  node_draw.c's, reservations node_reserve.c's, the sweep node_sweep.c's
 *	  (their shared layout: node_cache.h).
 *
 * Each cached sequence has an entry, found through a shared hash under the
 * cache's LWLock only when a session first meets the sequence.  The hot path
 * takes no lock: state = (block number << 40) | offset, and a fetch-add on it
 * gives a ticket (j, off).  Block j's slot in a ring of published blocks is
 * read seqlock-style; a ticket whose slot moved on is dropped (a gap, never a
 * wrong value).  off < count: the value is first + off.  off >= count: the
 * block is used up; the next one is taken if published (prefetched), or
 * reserved by one caller while the others wait for that one reservation, on
 * a heavyweight lock (visible to the deadlock detector and in pg_locks).
 * A transaction that draws alone in bulk adds 16 at a time and hands the
 * tickets out while the state stays where its add left it (a run: NodeRun).
 *
 * Blocks are reserved from the generation's shards, as any session's block
 * is (CarveNodeBlock: the draw lock, nextval_internal, the WAL flushed, the
 * synchronous standbys waited for), so they never overlap a per-session
 * block.  The node takes the shard whose next block comes first
 * (LowestNextShard), so its blocks increase, and follow each other when it
 * alone draws: a node hands values out in draw order, with no gap between
 * blocks.  Every
 * slot carries the entry's incarnation, which moves on whenever the entry is
 * freed or given to another sequence, so a session holding a stale pointer
 * never hands out another sequence's value.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "sequence/node_cache.h"


int			NodeCacheSequences = 1024;

#ifdef SHARDED_SEQ_WAIT_POINTS
/* test builds: the block number every entry starts at, to test the wrap */
int			NodeCacheFirstBlock = 0;
#endif

NodeCacheData *NodeShared = NULL;
HTAB	   *NodeHash = NULL;

/* ---- shared memory ---- */

Size
NodeCacheShmemSize(void)
{
	Size		size = MAXALIGN(sizeof(NodeCacheData));

	if (NodeCacheSequences <= 0)
		return size;
	size = add_size(size, PG_CACHE_LINE_SIZE);
	size = add_size(size, mul_size(NodeCacheSequences, EntryStride()));
	size = add_size(size, hash_estimate_size(NodeCacheSequences, sizeof(NodeHashEnt)));
	return size;
}

void
NodeCacheShmemInit(void)
{
	bool		found;
	HASHCTL		ctl;

	if (NodeCacheSequences <= 0)
		return;
	NodeShared = ShmemInitStruct("sharded_seq node cache",
								 MAXALIGN(sizeof(NodeCacheData)) + PG_CACHE_LINE_SIZE +
								 mul_size(NodeCacheSequences, EntryStride()), &found);
	if (!found)
	{
		memset(NodeShared, 0, sizeof(NodeCacheData));
		NodeShared->lock = &(GetNamedLWLockTranche("sharded_seq node cache"))->lock;
		NodeShared->nentries = NodeCacheSequences;
		NodeShared->nfree = NodeCacheSequences;
		NodeShared->entries = (char *) CACHELINEALIGN((char *) NodeShared + MAXALIGN(sizeof(NodeCacheData)));
		pg_atomic_init_u64(&NodeShared->next_incarnation, 1);
		for (int32 i = 0; i < NodeCacheSequences; i++)
		{
			NodeEntry  *e = EntryAt(i);

			memset(e, 0, sizeof(NodeEntry));
			pg_atomic_init_u64(&e->state, 0);
			pg_atomic_init_u32(&e->run_drawn, 0);
			pg_atomic_init_u64(&e->incarnation, 0);
			pg_atomic_init_u32(&e->generation, 0);
#ifdef SHARDED_SEQ_WAIT_POINTS
			pg_atomic_init_u64(&e->published, (uint64) NodeCacheFirstBlock & BLOCK_MASK);
#else
			pg_atomic_init_u64(&e->published, 0);
#endif
			pg_atomic_init_u32(&e->reserving, 0);
			pg_atomic_init_u32(&e->prefetch_wanted, 0);
			pg_atomic_init_u32(&e->eager, 0);
			for (int r = 0; r < NODE_RING; r++)
				pg_atomic_init_u64(&e->ring[r].blockno, 0);
		}
	}
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(NodeKey);
	ctl.entrysize = sizeof(NodeHashEnt);
	NodeHash = ShmemInitHash("sharded_seq node cache hash", NodeCacheSequences,
							 NodeCacheSequences, &ctl, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/* Is the node cache there (preloaded, sharded_seq.node_cache_sequences > 0)? */
bool
NodeCacheEnabled(void)
{
	return NodeShared != NULL;
}

/* ---- entries ---- */

/*
 * The entry of a sequence of this database, made if need be.  Returns false
 * when the table is full: the caller draws per session.  Its first block is
 * empty, so the first draw reserves one.
 */
bool
NodeCacheAttach(Oid config_relid, int32 id, NodeRef *ref)
{
	NodeKey		key = MakeKey(MyDatabaseId, config_relid, id);
	NodeHashEnt *h;
	NodeEntry  *e;
	bool		found;
	uint64		blockno;
	NodeBlock  *slot;
	LeftCount	left = {InvalidOid, 0, 0};

	LWLockAcquire(NodeShared->lock, LW_SHARED);
	h = hash_search(NodeHash, &key, HASH_FIND, NULL);
	if (h)
	{
		ref->entry = EntryAt(h->index);
		ref->incarnation = pg_atomic_read_u64(&ref->entry->incarnation);
		ref->next_mark = 0;
		ref->after = 0;
		ref->lone = 0;
		ref->lone_in = InvalidLocalTransactionId;
		ref->run = 0;
		LWLockRelease(NodeShared->lock);
		return true;
	}
	LWLockRelease(NodeShared->lock);

	LWLockAcquire(NodeShared->lock, LW_EXCLUSIVE);
	h = hash_search(NodeHash, &key, HASH_FIND, NULL);
	if (h == NULL)
	{
		e = FindVictim(&left);
		if (e == NULL)
		{
			LWLockRelease(NodeShared->lock);
			return false;
		}
		NodeShared->nfree--;
		e->key = key;
		e->swept_state = PG_UINT64_MAX;
		pg_atomic_write_u32(&e->run_drawn, 0);
		pg_atomic_write_u32(&e->prefetch_wanted, 0);
		pg_atomic_write_u32(&e->eager, 0);
		pg_atomic_write_u32(&e->generation, 0);
		pg_atomic_write_u64(&e->incarnation,
							pg_atomic_fetch_add_u64(&NodeShared->next_incarnation, 1));

		/*
		 * Block numbers go on across sequences (the incarnation tells a
		 * slot of another sequence apart too).  An empty block starts it: the first draw
		 * finds it used up and reserves.
		 */
		blockno = NextBlock(pg_atomic_read_u64(&e->published));
		slot = &e->ring[blockno % NODE_RING];
		pg_atomic_write_u64(&slot->blockno, SLOT_WRITING);
		pg_write_barrier();
		slot->incarnation = pg_atomic_read_u64(&e->incarnation);
		slot->first = 0;
		slot->count = 0;
		slot->generation = 0;
		slot->sync = 0;
		pg_write_barrier();
		pg_atomic_write_u64(&slot->blockno, blockno);
		pg_atomic_write_u64(&e->published, blockno);
		pg_atomic_write_u64(&e->state, blockno << OFF_BITS);
		h = hash_search(NodeHash, &key, HASH_ENTER, &found);
		h->index = IndexOf(e);
	}
	ref->entry = EntryAt(h->index);
	ref->incarnation = pg_atomic_read_u64(&ref->entry->incarnation);
	ref->next_mark = 0;
	ref->after = 0;
	ref->lone = 0;
	ref->lone_in = InvalidLocalTransactionId;
	ref->run = 0;
	LWLockRelease(NodeShared->lock);
	CountLeft(&left);
	return true;
}

/* drop_sequence: the sequence's entry goes (its blocks are gaps). */
void
NodeCacheForget(Oid config_relid, int32 id)
{
	NodeKey		key = MakeKey(MyDatabaseId, config_relid, id);
	NodeHashEnt *h;
	LeftCount	left = {InvalidOid, 0, 0};

	if (NodeShared == NULL)
		return;
	LWLockAcquire(NodeShared->lock, LW_EXCLUSIVE);
	h = hash_search(NodeHash, &key, HASH_FIND, NULL);
	if (h)
		FreeEntry(EntryAt(h->index), &left);
	LWLockRelease(NodeShared->lock);
	CountLeft(&left);
}

/* ---- the sequences view ---- */

/*
 * Values the node cache of this server handed out for a sequence of this
 * database: those of finished blocks (counted) and of the current one.
 * *has_entry: the sequence holds an entry now.  0 without the node cache.
 */
int64
NodeCacheValuesOut(int32 id, bool *has_entry)
{
	NodeKey		key;
	NodeHashEnt *h;
	int64		counts[NUM_STAT_FIELDS];
	int64		live = 0;

	*has_entry = false;
	if (NodeShared == NULL)
		return 0;
	key = MakeKey(MyDatabaseId, ConfigRelid("sequence_config"), id);
	LWLockAcquire(NodeShared->lock, LW_SHARED);
	h = hash_search(NodeHash, &key, HASH_FIND, NULL);
	if (h)
	{
		NodeEntry  *e = EntryAt(h->index);
		uint64		state = pg_atomic_read_u64(&e->state);
		NodeBlock	blk;

		if (ReadSlot(e, state >> OFF_BITS, pg_atomic_read_u64(&e->incarnation), &blk) == SLOT_OK)
			live = UsedOf(state, blk.count);
		*has_entry = true;
	}
	LWLockRelease(NodeShared->lock);
	StatsRead(KIND_SEQUENCE, id, counts);
	return counts[STAT_NODE_HITS] + live;
}

/*
 * sequence_cache(seq_id, tier, cache): the cache in force for a sequence of
 * this database ('node' when the node cache is there, the sequence is of
 * the database tier with cache 'node', and it holds an entry or one is
 * free), and its node cache counts (NULL without the node cache, and to a
 * role that may not see the sequence's positions: they tell how fast others
 * draw).
 */
PG_FUNCTION_INFO_V1(sequence_cache);
Datum
sequence_cache(PG_FUNCTION_ARGS)
{
	int32		id = PG_GETARG_INT32(0);
	char	   *tier = text_to_cstring(PG_GETARG_TEXT_PP(1));
	char	   *cache = text_to_cstring(PG_GETARG_TEXT_PP(2));
	TupleDesc	desc;
	Datum		values[5];
	bool		nulls[5] = {false, true, true, true, true};
	bool		node = false;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "sequence_cache must return a row");
	if (NodeShared != NULL)
	{
		bool		has_entry;
		int64		out = NodeCacheValuesOut(id, &has_entry);

		node = strcmp(tier, "database") == 0 && strcmp(cache, "node") == 0 &&
			(has_entry || NodeShared->nfree > 0);
		if (SequenceIdReadable(id))
		{
			int64		counts[NUM_STAT_FIELDS];

			StatsRead(KIND_SEQUENCE, id, counts);
			values[1] = Int64GetDatum(out);
			values[2] = Int64GetDatum(counts[STAT_NODE_RESERVATIONS]);
			values[3] = Int64GetDatum(counts[STAT_NODE_WAITS]);
			values[4] = Int64GetDatum(counts[STAT_NODE_FULL]);
			memset(&nulls[1], 0, sizeof(bool) * 4);
		}
	}
	values[0] = CStringGetTextDatum(node ? "node" : "session");
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
