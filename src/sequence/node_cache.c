/*
 * node_cache.c
 *	  The node-wide sequence cache: a sequence's current block in shared
 *	  memory, taken with one atomic add, and the next block reserved before
 *	  the current one runs out (when sharded_seq is preloaded).
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

#include "sequence/sequence_internal.h"

int			NodeCacheSequences = 1024;

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

#ifdef SHARDED_SEQ_WAIT_POINTS
/* test builds: the block number every entry starts at, to test the wrap */
int			NodeCacheFirstBlock = 0;
#endif
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

static NodeCacheData *NodeShared = NULL;
static HTAB *NodeHash = NULL;

/* The entry this backend is reserving for, released if it exits meanwhile. */
static NodeEntry *ReservingEntry = NULL;
static bool ExitCallbackSet = false;

static Size
EntryStride(void)
{
	return CACHELINEALIGN(sizeof(NodeEntry));
}

static NodeEntry *
EntryAt(int32 i)
{
	return (NodeEntry *) (NodeShared->entries + (Size) i * EntryStride());
}

static int32
IndexOf(NodeEntry *e)
{
	return (int32) (((char *) e - NodeShared->entries) / EntryStride());
}

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

static NodeKey
MakeKey(Oid dbid, Oid config_relid, int32 id)
{
	NodeKey		key;

	memset(&key, 0, sizeof(key));
	key.dbid = dbid;
	key.config_relid = config_relid;
	key.id = id;
	return key;
}

static int64
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

static void
NoteCurrentBlock(NodeEntry *e, LeftCount *left)
{
	uint64		state = pg_atomic_read_u64(&e->state);
	NodeBlock  *slot = &e->ring[(state >> OFF_BITS) % NODE_RING];

	left->dbid = e->key.dbid;
	left->id = e->key.id;
	left->used = 0;
	if (pg_atomic_read_u64(&slot->blockno) == (state >> OFF_BITS) && slot->count > 0)
		left->used = UsedOf(state, slot->count);
}

static void
CountLeft(LeftCount *left)
{
	if (OidIsValid(left->dbid) && left->used > 0)
		StatsCountIn(left->dbid, KIND_SEQUENCE, left->id, STAT_NODE_HITS, left->used);
}

/* Free an entry: no session finds it again, and none uses its blocks.  Lock held. */
static void
FreeEntry(NodeEntry *e, LeftCount *left)
{
	bool		found;

	NoteCurrentBlock(e, left);
	hash_search(NodeHash, &e->key, HASH_REMOVE, &found);
	pg_atomic_write_u64(&e->incarnation,
						pg_atomic_fetch_add_u64(&NodeShared->next_incarnation, 1));
	e->key.dbid = InvalidOid;
	NodeShared->nfree++;
}

/*
 * An entry to give a new sequence: a free one, or one nobody drew from since
 * the sweep last passed it (the sweep notes each entry's state as it
 * passes, and a draw from a run, which leaves the state, marks run_drawn),
 * and that has no reservation in flight.  NULL if none.  Lock held
 * exclusively.
 */
static NodeEntry *
FindVictim(LeftCount *left)
{
	for (int32 n = 0; n < NodeShared->nentries; n++)
	{
		NodeEntry  *e = EntryAt(NodeShared->hand);
		uint64		state = pg_atomic_read_u64(&e->state);

		NodeShared->hand = (NodeShared->hand + 1) % NodeShared->nentries;
		if (pg_atomic_read_u32(&e->reserving) != 0)
			continue;
		if (e->key.dbid == InvalidOid)
			return e;
		if (state == e->swept_state && pg_atomic_read_u32(&e->run_drawn) == 0)
		{
			FreeEntry(e, left);
			return e;
		}
		e->swept_state = state;
		pg_atomic_write_u32(&e->run_drawn, 0);
	}
	return NULL;
}

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

/* ---- reading a block ---- */

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

/* ---- reserving ---- */

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
	bool		overflow;
	XLogRecPtr	lsn;
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

	out->first = BlockStart(base, k, shards, shard, block, &overflow);
	/* a prefetch past the end raises nothing: the draw that needs the block does, once the values before it are out */
	if (overflow && conditional)
		return false;
	if (overflow)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("sharded sequence \"%s\" has reached its maximum value", name),
				 errdetail("Values never wrap around past %lld.", (long long) PG_INT64_MAX),
				 errhint("Move to a new sequence, or lower block and shards with sharded_seq.alter_sequence() if the remaining range is being skipped.")));
	if (pg_add_s64_overflow(out->first, (int64) block - 1, &last))
		last = PG_INT64_MAX;
	out->count = last - out->first + 1;
	out->generation = generation;

	lsn = FlushShardReservation(relid);
	/* an error leaves the block unpublished: nobody uses it */
	WaitForSyncStandbys(lsn, name);
	StatsNoteReserved(id, out->count);
	/* stamped with the state it was waited for under, if that held still */
	out->sync = SyncStamp() == stamp ? stamp : SYNC_UNSURE;
	return true;
}

typedef enum ReserveMode
{
	RESERVE_REFILL,				/* block j is used up: publish the next one and move on to it */
	RESERVE_PREFETCH,			/* block j is in use: publish the next one only */
	RESERVE_RESET,				/* a newer generation is in force: move on to it at once */
	RESERVE_RESYNC				/* block j was confirmed under another standby state: leave it */
} ReserveMode;

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

typedef enum ReserveResult
{
	RESERVED_RETRY,				/* look at the state again */
	RESERVED_FALLBACK,			/* draw per session instead */
	RESERVED_STALE				/* the entry is another sequence's now */
} ReserveResult;

/*
 * One reservation at a time per sequence: the caller that gets the lock
 * reserves; the others wait for it to end and then look again (with
 * *waited set), unless wait_for_it is false (a prefetch, the worker).
 * For RESERVE_RESET, generation is the one the caller must see in force;
 * for RESERVE_RESYNC, stamp is the caller's SyncStamp().
 */
static pg_noinline ReserveResult
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

/* ---- drawing ---- */

/*
 * Block j was found used up (ticket off >= count).  Move the state on to
 * the next block if it is published; otherwise reserve it, or wait for the
 * reservation in flight.
 */
static pg_noinline ReserveResult
MoveOn(NodeRef *ref, uint64 j, int64 count, bool *waited)
{
	NodeEntry  *e = ref->entry;

	for (;;)
	{
		uint64		cur = pg_atomic_read_u64(&e->state);

		if ((cur >> OFF_BITS) != j)
			return RESERVED_RETRY;
		if (pg_atomic_read_u64(&e->published) != j)
		{
			if (pg_atomic_compare_exchange_u64(&e->state, &cur, NextBlock(j) << OFF_BITS))
			{
				StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_HITS, count);
				return RESERVED_RETRY;
			}
			continue;
		}
		/* a whole block went before its successor came: ask earlier from now on */
		if (count > 0 && pg_atomic_read_u32(&e->eager) == 0)
			pg_atomic_write_u32(&e->eager, 1);
		return Reserve(ref, RESERVE_REFILL, j, 0, 0, false, waited);
	}
}

/*
 * The drawer that crosses the low-water mark of block j asks for block j+1:
 * from the database's worker if one runs (and no synchronous standby must
 * confirm it: the worker must not wait for one at shutdown), else it
 * reserves it itself, unless a reservation is already in flight.  The mark
 * is half the block, or its start once draws outran a prefetch (eager); an
 * eager entry whose block is still missing at half the block has the
 * drawer there reserve it.  A session that crossed the previous block's mark
 * too draws alone and fast: it reserves itself, as a session of its own
 * blocks would, since waking the worker once a block costs it more (a
 * signal, and the worker's turn on a core).
 */
static pg_noinline void
Prefetch(NodeRef *ref, uint64 j, int64 off, int64 count)
{
	NodeEntry  *e = ref->entry;
	bool		waited = false;
	bool		eager = pg_atomic_read_u32(&e->eager) != 0;
	bool		alone;

	if (off != (eager ? 0 : count / 2) && !(eager && off == count / 2))
		return;
	if (pg_atomic_read_u64(&e->published) != j)
		return;
	alone = ref->next_mark == j + 1;
	ref->next_mark = NextBlock(j) + 1;
	if (!alone && off == (eager ? 0 : count / 2) && !SyncStandbysActive())
	{
		pg_atomic_write_u32(&e->prefetch_wanted, 1);
		if (RegistryPrefetchNews())
			return;
		pg_atomic_write_u32(&e->prefetch_wanted, 0);
	}
	(void) Reserve(ref, RESERVE_PREFETCH, j, 0, 0, true, &waited);
}

/* ---- runs: a transaction that draws alone ---- */

#define RUN_AFTER		16		/* adds in a row, in one transaction, that found the state where ours left it */
#define RUN_LENGTH		16		/* tickets a run takes: at most RUN_LENGTH - 1 become a gap */
#define RUN_SLOTS		4		/* runs a session holds at once (sequences drawn in turn) */

/*
 * A run: tickets of one block that a transaction drawing alone took with one
 * add.  It hands them out without an atomic operation while the state is
 * still the one its add left (end).  Any other draw, a move to the next
 * block, a new generation or a resync moves the state, and so ends the run;
 * its rest is a gap.  Values keep draw order across sessions: a draw from
 * the run reads the state before the next add of anybody, and that add
 * gets a ticket at or above end.  Runs are for a transaction that draws in
 * bulk: only one that drew alone RUN_AFTER times takes them, and its end
 * gives the rest back if nobody drew since (so does the session's exit), so
 * sessions that draw now and then leave no gap.
 */
typedef struct NodeRun
{
	NodeEntry  *entry;			/* NULL: a free slot */
	uint64		incarnation;	/* of the ref that took it: 0 when free */
	uint64		next;			/* the next ticket (as a state) */
	uint64		stop;			/* tickets up to here lie in the block */
	uint64		end;			/* the state the run's add left */
	int64		value;			/* next's value */
	int32		generation;
} NodeRun;

static NodeRun Runs[RUN_SLOTS];
static uint32 NextRunSlot = 0;
static bool RunsCallbacksSet = false;

/* Give a run's rest back, if nobody drew since it was taken; free the slot. */
static void
GiveBack(NodeRun *run)
{
	uint64		end = run->end;

	if (run->entry != NULL && run->next != run->end &&
		pg_atomic_read_u64(&run->entry->incarnation) == run->incarnation)
		(void) pg_atomic_compare_exchange_u64(&run->entry->state, &end, run->next);
	memset(run, 0, sizeof(NodeRun));
}

static void
GiveBackRuns(int code, Datum arg)
{
	for (int i = 0; i < RUN_SLOTS; i++)
		GiveBack(&Runs[i]);
}

static void
GiveBackAtXactEnd(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE)
		GiveBackRuns(0, (Datum) 0);
}

/*
 * The add that left old + n handed out ticket old, of block blk: keep the
 * tickets after it that lie in the block as the ref's run.  A run that
 * holds the block's low-water mark asks for the next block now: another
 * session's draw may end the run before the mark is handed out.
 */
static pg_noinline void
TakeRun(NodeRef *ref, uint64 old, uint64 n, NodeBlock *blk)
{
	int64		off = (int64) (old & OFF_MASK);
	uint64		in_block = Min(n, (uint64) (blk->count - off));
	NodeRun    *run = &Runs[ref->run % RUN_SLOTS];

	if (in_block <= 1)
		return;
	if (!RunsCallbacksSet)
	{
		RegisterXactCallback(GiveBackAtXactEnd, NULL);
		before_shmem_exit(GiveBackRuns, (Datum) 0);
		RunsCallbacksSet = true;
	}
	if (run->incarnation != ref->incarnation)
	{
		/* the slot holds another sequence's run, perhaps: take the next one */
		ref->run = NextRunSlot++ % RUN_SLOTS;
		run = &Runs[ref->run];
		GiveBack(run);
	}
	run->entry = ref->entry;
	run->incarnation = ref->incarnation;
	run->next = old + 1;
	run->stop = old + in_block;
	run->end = old + n;
	run->value = blk->first + off + 1;
	run->generation = blk->generation;
	if (off < blk->count / 2 && blk->count / 2 < off + (int64) in_block)
		Prefetch(ref, old >> OFF_BITS, blk->count / 2, blk->count);
}

/* whether this draw waited for a reservation: not on the stack, so the hot path keeps none */
static bool DrawWaited;

/*
 * Draw with a ticket of the state: one add, or RUN_LENGTH of them (a run)
 * for a transaction whose last RUN_AFTER adds found nobody had drawn since.
 */
static pg_noinline NodeDrawResult
DrawTicket(NodeRef *ref, int32 generation, int64 *local, int32 *value_gen)
{
	NodeEntry  *e = ref->entry;
	NodeDrawResult result = NODE_FALLBACK;
	uint32		stamp = SyncStamp();
	int			resyncs = 0;

	DrawWaited = false;

	for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++)
	{
		uint64		old;
		uint64		j;
		int64		off;
		NodeBlock	blk;
		ReserveResult r = RESERVED_RETRY;

		if (pg_atomic_read_u64(&e->incarnation) != ref->incarnation)
		{
			result = NODE_STALE;
			break;
		}
		if ((int32) pg_atomic_read_u32(&e->generation) < generation)
		{
			old = pg_atomic_read_u64(&e->state);
			r = Reserve(ref, RESERVE_RESET, old >> OFF_BITS, generation, 0, false, &DrawWaited);
		}
		else
		{
			uint64		n;

			if (ref->lone_in != MyLocalTransactionId())
			{
				ref->lone = 0;
				ref->lone_in = MyLocalTransactionId();
			}
			/* a run is drawn from only while no synchronous standby is in force */
			n = ref->lone >= RUN_AFTER && SyncStandbysNone() ? RUN_LENGTH : 1;
			old = pg_atomic_fetch_add_u64(&e->state, n);
			if (old != ref->after)
				ref->lone = 0;
			else if (ref->lone < RUN_AFTER)
				ref->lone++;
			ref->after = old + n;
			j = old >> OFF_BITS;
			off = (int64) (old & OFF_MASK);
			switch (ReadSlot(e, j, ref->incarnation, &blk))
			{
				case SLOT_MOVED:
					continue;	/* a stale ticket: a gap */
				case SLOT_OTHER:
					r = RESERVED_STALE;
					break;
				case SLOT_OK:
					if (off < blk.count && stamp != 0 && blk.sync != stamp)
					{
						/* S1 across a failover: only a block the standbys in force confirmed */
						if (++resyncs > MAX_RESYNCS)
							goto done;
						r = Reserve(ref, RESERVE_RESYNC, j, 0, stamp, false, &DrawWaited);
					}
					else if (off < blk.count)
					{
						*local = blk.first + off;
						*value_gen = blk.generation;
						if (n > 1)
							TakeRun(ref, old, n, &blk);
						if (off == 0 || off == blk.count / 2)
							Prefetch(ref, j, off, blk.count);
						result = NODE_GOT;
						goto done;
					}
					r = MoveOn(ref, j, blk.count, &DrawWaited);
					break;
			}
		}
		if (r == RESERVED_STALE)
		{
			result = NODE_STALE;
			break;
		}
		if (r == RESERVED_FALLBACK)
			break;
	}
done:
	if (DrawWaited)
		StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_WAITS, 1);
	return result;
}

/*
 * Draw a value from the node cache.  generation is the one the caller's
 * configuration has in force: an older one cached here is left at once.
 * NODE_GOT: *local (of generation *value_gen) is the caller's.  NODE_STALE:
 * the entry is no longer this sequence's; attach again.  NODE_FALLBACK:
 * draw per session.  The ref's run first: the state read before the rest,
 * as a ticket would be taken.
 */
NodeDrawResult
NodeCacheDraw(NodeRef *ref, int32 generation, int64 *local, int32 *value_gen)
{
	NodeRun    *run = &Runs[ref->run];
	NodeEntry  *e = ref->entry;

	/* tail calls only: the common path saves no register */
	if (run->next != run->stop && run->incarnation == ref->incarnation &&
		pg_atomic_read_u64(&e->state) == run->end)
	{
		pg_read_barrier();
		if (pg_atomic_read_u64(&e->incarnation) == ref->incarnation &&
			(int32) pg_atomic_read_u32(&e->generation) >= generation &&
			SyncStandbysNone())
		{
			*local = run->value++;
			*value_gen = run->generation;
			run->next++;
			/* the state stays: tell the sweep this entry is in use */
			pg_atomic_write_u32(&e->run_drawn, 1);
			return NODE_GOT;
		}
	}
	return DrawTicket(ref, generation, local, value_gen);
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
