/*
 * node_reserve.c
 *	  The node cache's reservations: one at a time per sequence (an advisory
 *	  lock, also held by a session that carves a block of its own from a
 *	  node-cached sequence's shards), the block carved from the shard whose
 *	  next block comes first (CarveNodeBlock, through shards.c's CarveFinish,
 *	  as a session's block is), published in the entry's ring, and the
 *	  database worker's prefetch.
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


/* The entry this backend is reserving for, released if it exits meanwhile. */
static NodeEntry *ReservingEntry = NULL;
static bool ExitCallbackSet = false;


/*
 * Every reservation from a node-cached sequence's shards, the node's and a
 * session's alike, holds this lock: LowestNextShard then sees no shard
 * move meanwhile, so each block lies above every block reserved before it.
 */
static void
ReservationTag(LOCKTAG *tag, int32 id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, SHARDED_SEQ_LOCK_CLASS, (uint32) id, RESERVE_SUBID);
}

void
NodeCacheLockReservations(int32 id)
{
	LOCKTAG		tag;

	ReservationTag(&tag, id);
	(void) LockAcquire(&tag, ExclusiveLock, true, false);
}

void
NodeCacheUnlockReservations(int32 id)
{
	LOCKTAG		tag;

	ReservationTag(&tag, id);
	LockRelease(&tag, ExclusiveLock, true);
}

static void
ReleaseReserving(int code, Datum arg)
{
	if (ReservingEntry)
		pg_atomic_write_u32(&ReservingEntry->reserving, 0);
	ReservingEntry = NULL;
}

/*
 * Mark the entry as reserved for, if it still holds our sequence.  Under the
 * lock, so that FindVictim never gives an entry away meanwhile.
 */
static bool
BeginReserving(NodeRef *ref)
{
	bool		ours;

	if (!ExitCallbackSet)
	{
		before_shmem_exit(ReleaseReserving, (Datum) 0);
		ExitCallbackSet = true;
	}
	LWLockAcquire(NodeShared->lock, LW_SHARED);
	ours = pg_atomic_read_u64(&ref->entry->incarnation) == ref->incarnation;
	if (ours)
	{
		pg_atomic_write_u32(&ref->entry->reserving, 1);
		ReservingEntry = ref->entry;
	}
	LWLockRelease(NodeShared->lock);
	return ours;
}

static void
EndReserving(void)
{
	ReleaseReserving(0, (Datum) 0);
}

/* Has the row's configuration arrived by replication (cutover())? */
static bool
PositionsUnknown(HeapTuple tup, ConfigPlaces *places, TupleDesc desc)
{
	bool		isnull;
	Datum		d;

	if (places->c_unknown == InvalidAttrNumber)
		return false;
	d = heap_getattr(tup, places->c_unknown, desc, &isnull);
	return !isnull && DatumGetBool(d);
}

/*
 * Reserve the next block of the node: the shard of the generation in force
 * whose next block comes first, as CarveBlock does for a session.  Under the draw lock (conditionally when
 * conditional), with the configuration read with the latest snapshot: a
 * layout change holds the draw lock until it commits, so what is read is the
 * generation in force.  Returns false, reserving nothing, when the lock is
 * busy or the range is used up (conditional: a prefetch), or the sequence is
 * gone or no longer cached per node.
 * The block's WAL is flushed, and confirmed by the synchronous standbys when
 * in force, before it returns.
 */
/*
 * What the last CarveNodeBlock of this backend read, under the draw lock,
 * with a snapshot taken after the config word was seen settled and while
 * the triggers that mark every write were in place (ConfigWatched): while
 * the word has not moved, no configuration changed, and the next
 * reservation skips the read.
 */
static struct
{
	bool		valid;
	uint64		word;			/* the config word it was read under */
	Oid			config_relid;
	int32		id;
	char		name[NAMEDATALEN];
	int32		generation;
	int64		base;
	int32		shards;
	int32		block;
}			Seen;

static bool
CarveNodeBlock(Oid config_relid, int32 id, bool conditional, NodeBlock *out)
{
	bool		ok = false;
	char		name[NAMEDATALEN] = "";
	Oid			relid;
	int32		shard = 0;
	int32		generation = 0;
	int64		base = 0;
	int32		shards = 1;
	int32		block = 1;
	int64		k;
	int64		last;
	CarveSpec	spec;
	Relation	config;
	Relation	shards_rel;
	ConfigPlaces *places;
	Snapshot	snapshot;
	ScanKeyData key[2];
	SysScanDesc scan;
	HeapTuple	tup;
	uint32		stamp = SyncStamp();
	uint64		word = 0;
	bool		settled;
	bool		keep;

	if (conditional)
	{
		if (!ConditionalLockDatabaseObject(config_relid, id, 0, ShareLock))
			return false;
	}
	else
		LockDatabaseObject(config_relid, id, 0, ShareLock);

	/* what a change committed before we got the lock sent */
	AcceptInvalidationMessages();
	if (Seen.valid && ConfigWordSettled(&word) && word == Seen.word &&
		Seen.config_relid == config_relid && Seen.id == id && !CutoverStopped())
	{
		strlcpy(name, Seen.name, sizeof(name));
		generation = Seen.generation;
		base = Seen.base;
		shards = Seen.shards;
		block = Seen.block;
		goto reserve;
	}
	Seen.valid = false;
	settled = ConfigWordSettled(&word);

	/* straight from the tables, as the session's load is (engine.c) */
	config = table_open(config_relid, AccessShareLock);
	shards_rel = table_open(ConfigRelid("sequence_shards"), AccessShareLock);
	places = SequenceConfigPlaces(config, shards_rel);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key[0], places->c_id, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(id));
	scan = systable_beginscan(config, places->by_id, OidIsValid(places->by_id), snapshot, 1, key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup) && ConfigRelid("sequence_config") == config_relid &&
		places->c_cache != InvalidAttrNumber &&
		TextColumnIs(tup, places->c_tier, RelationGetDescr(config), "database") &&
		TextColumnIs(tup, places->c_cache, RelationGetDescr(config), "node") &&
		!PositionsUnknown(tup, places, RelationGetDescr(config)) && !CutoverStopped())
	{
		TupleDesc	desc = RelationGetDescr(config);
		bool		isnull;
		char	   *n = TextDatumGetCString(heap_getattr(tup, places->c_name, desc, &isnull));
		SysScanDesc shard_scan;
		HeapTuple	shard_tup;

		strlcpy(name, n, sizeof(name));
		generation = DatumGetInt32(heap_getattr(tup, places->c_generation, desc, &isnull));
		base = DatumGetInt64(heap_getattr(tup, places->c_base, desc, &isnull));
		shards = DatumGetInt32(heap_getattr(tup, places->c_shards, desc, &isnull));
		block = DatumGetInt32(heap_getattr(tup, places->c_block, desc, &isnull));

		/* a generation this transaction made may roll back: never shared */
		ScanKeyInit(&key[0], places->s_seq_id, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(id));
		ScanKeyInit(&key[1], places->s_generation, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(generation));
		shard_scan = systable_beginscan(shards_rel, places->by_generation,
										OidIsValid(places->by_generation), snapshot, 2, key);
		shard_tup = systable_getnext(shard_scan);
		ok = HeapTupleIsValid(shard_tup) &&
			!TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetRawXmin(shard_tup->t_data));
		systable_endscan(shard_scan);
	}
	systable_endscan(scan);
	/* a change of our own transaction, if any, keeps the word unsettled */
	keep = ok && settled && ConfigWatched(snapshot);
	UnregisterSnapshot(snapshot);
	table_close(shards_rel, AccessShareLock);
	table_close(config, AccessShareLock);
	if (!ok)
	{
		UnlockDatabaseObject(config_relid, id, 0, ShareLock);
		return false;
	}
	if (keep)
	{
		Seen.config_relid = config_relid;
		Seen.id = id;
		strlcpy(Seen.name, name, sizeof(Seen.name));
		Seen.generation = generation;
		Seen.base = base;
		Seen.shards = shards;
		Seen.block = block;
		Seen.word = word;
		Seen.valid = true;
	}

reserve:
	relid = LowestNextShard(id, generation, shards, &shard);
	k = nextval_internal(relid, false);
	UnlockDatabaseObject(config_relid, id, 0, ShareLock);

	spec.id = id;
	spec.name = name;
	spec.base = base;
	spec.shards = shards;
	spec.block = block;
	spec.generation = generation;
	spec.own_generation = false;	/* one this transaction made is never shared */
	spec.quiet_end = conditional;	/* a prefetch past the end: nothing, no error */
	/* an error leaves the block unpublished: nobody uses it */
	if (!CarveFinish(&spec, k, shard, relid, &out->first, &last))
		return false;
	out->count = last - out->first + 1;
	out->generation = generation;
	/* stamped with the state it was waited for under, if that held still */
	out->sync = SyncStamp() == stamp ? stamp : SYNC_UNSURE;
	return true;
}


/*
 * Publish a carved block as the entry's next, and move the state on to it
 * unless it is a prefetch (a newer generation is moved on to at once).  The
 * reservation lock and the reserving mark are held.  False, publishing
 * nothing, for a block of a generation older than the entry's (a hand-edited
 * configuration): reserving again would only carve the same generation.
 */
static bool
Publish(NodeEntry *e, uint64 incarnation, NodeBlock *carved, ReserveMode mode, uint64 j)
{
	uint64		blockno = NextBlock(pg_atomic_read_u64(&e->published));
	NodeBlock  *slot = &e->ring[blockno % NODE_RING];
	int32		in_force = (int32) pg_atomic_read_u32(&e->generation);

	if (carved->generation < in_force)
		return false;			/* generations only move forward: a gap */
	pg_atomic_write_u64(&slot->blockno, SLOT_WRITING);
	pg_write_barrier();
	slot->incarnation = incarnation;
	slot->first = carved->first;
	slot->count = carved->count;
	slot->generation = carved->generation;
	slot->sync = carved->sync;
	pg_write_barrier();
	pg_atomic_write_u64(&slot->blockno, blockno);
	pg_atomic_write_u64(&e->published, blockno);

	if (carved->generation > in_force || mode == RESERVE_RESYNC)
	{
		uint64		old;
		NodeBlock	prev;

		/* the older block's values left are gaps from now on */
		if (carved->generation > in_force)
			pg_atomic_write_u32(&e->generation, (uint32) carved->generation);
		old = pg_atomic_exchange_u64(&e->state, blockno << OFF_BITS);
		if (ReadSlot(e, old >> OFF_BITS, incarnation, &prev) == SLOT_OK)
			StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_HITS, UsedOf(old, prev.count));
	}
	else if (mode != RESERVE_PREFETCH)
	{
		uint64		cur = pg_atomic_read_u64(&e->state);
		NodeBlock	prev;

		while ((cur >> OFF_BITS) == j)
		{
			if (pg_atomic_compare_exchange_u64(&e->state, &cur, blockno << OFF_BITS))
			{
				if (ReadSlot(e, j, incarnation, &prev) == SLOT_OK)
					StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_HITS, prev.count);
				break;
			}
		}
	}
	return true;
}


/*
 * One reservation at a time per sequence: the caller that gets the lock
 * reserves; the others wait for it to end and then look again (with
 * *waited set), unless wait_for_it is false (a prefetch, the worker).
 * For RESERVE_RESET, generation is the one the caller must see in force;
 * for RESERVE_RESYNC, stamp is the caller's SyncStamp().
 */
pg_noinline ReserveResult
Reserve(NodeRef *ref, ReserveMode mode, uint64 j, int32 generation, uint32 stamp,
		bool conditional, bool *waited)
{
	NodeEntry  *e = ref->entry;
	LOCKTAG		tag;
	volatile ReserveResult result = RESERVED_RETRY;
	volatile bool marked = false;

	ReservationTag(&tag, e->key.id);
	if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
	{
		if (conditional)
			return RESERVED_RETRY;
		/* a reservation is in flight: wait for it, then look again */
		(void) LockAcquire(&tag, ShareLock, true, false);
		LockRelease(&tag, ShareLock, true);
		*waited = true;
		return RESERVED_RETRY;
	}
	PG_TRY();
	{
		uint64		state;
		uint64		published;
		NodeBlock	carved;

		/* t/node_cache.pl holds a reservation here while callers pile up */
		WAIT_POINT("node-cache-reserve");
		marked = BeginReserving(ref);
		if (!marked)
			result = RESERVED_STALE;
		else
		{
			bool		needed;

			state = pg_atomic_read_u64(&e->state);
			published = pg_atomic_read_u64(&e->published);
			switch (mode)
			{
				case RESERVE_REFILL:
					needed = (state >> OFF_BITS) == j && published == j;
					break;
				case RESERVE_PREFETCH:
					needed = (state >> OFF_BITS) == j && published == j;
					break;
				case RESERVE_RESYNC:
					{
						NodeBlock	cur;

						needed = (state >> OFF_BITS) == j &&
							ReadSlot(e, j, ref->incarnation, &cur) == SLOT_OK &&
							cur.sync != stamp;
						break;
					}
				default:
					needed = (int32) pg_atomic_read_u32(&e->generation) < generation;
					break;
			}
			if (needed)
			{
				/* a block shared by every session waits for the standbys */
				if (!ReservationConfirmedHere())
					result = RESERVED_FALLBACK;
				else if (!CarveNodeBlock(e->key.config_relid, e->key.id, conditional, &carved))
					result = conditional ? RESERVED_RETRY : RESERVED_FALLBACK;
				else
				{
					if (!Publish(e, ref->incarnation, &carved, mode, j))
						result = RESERVED_FALLBACK;
					StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_RESERVATIONS, 1);
				}
			}
		}
	}
	PG_FINALLY();
	{
		if (marked)
			EndReserving();
		LockRelease(&tag, ExclusiveLock, true);
	}
	PG_END_TRY();
	return result;
}

/* ---- the worker's prefetch ---- */

/*
 * The database's worker, woken by RegistryPrefetchNews: reserve the next
 * block of every entry of this database that asked, without waiting for any
 * lock (a busy one leaves it to the sessions).  In a transaction.
 */
void
NodeCachePrefetch(void)
{
	Oid			config_relid;
	int32		n = 0;
	NodeRef    *wanted;

	if (NodeShared == NULL)
		return;
	config_relid = ConfigRelid("sequence_config");
	if (!NodeCacheStored())
		return;
	wanted = palloc(sizeof(NodeRef) * NodeShared->nentries);
	LWLockAcquire(NodeShared->lock, LW_SHARED);
	for (int32 i = 0; i < NodeShared->nentries; i++)
	{
		NodeEntry  *e = EntryAt(i);

		if (e->key.dbid == MyDatabaseId && e->key.config_relid == config_relid &&
			pg_atomic_read_u32(&e->prefetch_wanted) != 0)
		{
			pg_atomic_write_u32(&e->prefetch_wanted, 0);
			wanted[n].entry = e;
			wanted[n].incarnation = pg_atomic_read_u64(&e->incarnation);
			n++;
		}
	}
	LWLockRelease(NodeShared->lock);
	for (int32 i = 0; i < n; i++)
	{
		bool		waited = false;
		uint64		state = pg_atomic_read_u64(&wanted[i].entry->state);

		(void) Reserve(&wanted[i], RESERVE_PREFETCH, state >> OFF_BITS, 0, 0, true, &waited);
	}
	pfree(wanted);
}

