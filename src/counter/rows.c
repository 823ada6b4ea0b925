/*
 * rows.c
 *	  Row access for counters: reading a counter's configuration, summing its
 *	  shards, adding to one of them, growing an adaptive counter by a row,
 *	  maintain()'s fold and gather, and the administration's layouts.  Every
 *	  write of a shard row goes through one function here, ShardWrite, which
 *	  marks the layout word first (the rule in layout.c); the trigger
 *	  rows_changed_elsewhere marks every other write.
 *
 * These are the hot paths of counter_incr, counter_value and of applying a
 * transaction's increments at commit, so they use the heap and the indexes
 * directly rather than SPI.  Shards are tried with heap_update(wait = false),
 * which reports a shard another transaction holds instead of waiting for it.
 * When every shard is held, an adaptive counter gets a new row; a pinned one
 * waits.
 *
 * With node ids (common/node.c), each node writes only its own rows, numbered from
 * its NodeShardBase(), and a total is the sum over every node's rows.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/relscan.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/inval.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "common/int.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/predicate.h"
#include "access/transam.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

static bool NodeRowsAlone(void);

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

static TM_Result ShardWrite(const ShardWriteOp *op);


#define Anum_shard_counter_id	1
#define Anum_shard_shard		2
#define Anum_shard_value		3
#define Natts_shard				3

/* counter_config's columns, the same in every schema version */
#define Anum_config_id			1
#define Anum_config_name		2
#define Anum_config_shards		3
#define Anum_config_mode		4
#define Anum_config_owner		5
#define Anum_config_acl			6

/*
 * A counter's configuration row, by name (or, with name NULL, by id), as the
 * latest snapshot sees it.  Read directly: this runs whenever a session meets
 * a counter it has not cached, and needs no rights of the caller's.
 */
bool
FetchCounterConfig(const char *name, int32 id, CounterConfigRow *row)
{
	Relation	rel = table_open(ConfigRelid("counter_config"), AccessShareLock);
	Oid			indexid = ConfigRelid(name ? "counter_config_name_key" : "counter_config_pkey");
	Relation	index = index_open(indexid, AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	if (name)
		ScanKeyEntryInitialize(&key, 0, Anum_config_name, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[0], F_TEXTEQ,
							   CStringGetTextDatum(name));
	else
		ScanKeyInit(&key, Anum_config_id, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(id));
	scan = systable_beginscan(rel, indexid, true, snapshot, 1, &key);
	/* a change may commit here, after the snapshot (specs/config_race) */
	WAIT_POINT("counter-config-read");
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		isnull;
		Datum		d;
		text	   *mode;

		row->id = DatumGetInt32(heap_getattr(tup, Anum_config_id, desc, &isnull));
		d = heap_getattr(tup, Anum_config_shards, desc, &isnull);
		row->shards = isnull ? 0 : DatumGetInt32(d);
		mode = DatumGetTextPP(heap_getattr(tup, Anum_config_mode, desc, &isnull));
		row->mode = ParseCounterMode(VARDATA_ANY(mode), VARSIZE_ANY_EXHDR(mode));
		row->owner = DatumGetObjectId(heap_getattr(tup, Anum_config_owner, desc, &isnull));
		d = heap_getattr(tup, Anum_config_acl, desc, &isnull);
		row->acl = CopyAcl(d, isnull, CurrentMemoryContext);
		/* frozen: its raw xid may be older than the commit log kept */
		row->xmin = HeapTupleHeaderXminFrozen(tup->t_data) ? FrozenTransactionId
			: HeapTupleHeaderGetRawXmin(tup->t_data);
		found = true;
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * How many times set_counter has set a counter, as the latest snapshot sees
 * it: its counter_sets row (schema 1.5), or 0.  Read only on the rare paths:
 * a memcached commit once per configuration load, a flush from memcached
 * with an amount, a leftover's write.
 */
int64
CounterSetCount(int32 counter_id)
{
	Relation	rel;
	Snapshot	snapshot;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	int64		sets = 0;

	if (!CounterSetsStored())
		return 0;
	rel = table_open(ConfigRelid("counter_sets"), AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(counter_id));
	scan = systable_beginscan(rel, ConfigRelid("counter_sets_pkey"), true, snapshot, 1, &key);
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;

		sets = DatumGetInt64(heap_getattr(tup, 2, RelationGetDescr(rel), &isnull));
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	return sets;
}

/*
 * Total over every node's rows, as int128.  refs (unless NULL) collects the
 * rows of the node whose shards start at base, and *nall counts all rows.
 */
static int128
ScanShards(Relation rel, int32 counter_id, Snapshot snapshot, int32 base,
		   ShardRef **refs, int *nrefs, int *nall)
{
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	TupleDesc	desc = RelationGetDescr(rel);
	int128		sum = 0;
	int			n = 0;
	int			cap = 0;
	int			all = 0;

	ScanKeyInit(&key, Anum_shard_counter_id, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(counter_id));
	scan = systable_beginscan(rel, ConfigRelid("counter_shards_pkey"), true,
							  snapshot, 1, &key);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		int64		value = DatumGetInt64(heap_getattr(tup, Anum_shard_value, desc, &isnull));
		int32		shard = DatumGetInt32(heap_getattr(tup, Anum_shard_shard, desc, &isnull));

		sum += value;
		all++;
		if (refs && shard >= base && shard < base + NODE_SHARDS)
		{
			if (n == cap)
			{
				cap = cap ? cap * 2 : 32;
				*refs = n ? repalloc(*refs, cap * sizeof(ShardRef)) : palloc(cap * sizeof(ShardRef));
			}
			(*refs)[n].shard = shard;
			(*refs)[n].tid = tup->t_self;
			(*refs)[n].value = value;
			n++;
		}
	}
	systable_endscan(scan);
	if (nrefs)
		*nrefs = n;
	if (nall)
		*nall = all;
	return sum;
}

/*
 * May what a place remembers serve this snapshot at all?  Its config row
 * version (the counter's last layout change) must be visible to it; never
 * under SERIALIZABLE (reads must take predicate locks through the index), nor
 * where node ids are in use (NodeRowsAlone): other nodes' rows of the counter
 * may appear at any moment.  A version loaded committed is not looked up in
 * the commit log again: after enough transactions its xid is no longer there.
 */
static bool
PlaceTrusted(CounterPlace *place, Snapshot snapshot)
{
	return place != NULL && !IsolationIsSerializable() && NodeRowsAlone() &&
		TransactionIdIsValid(place->config_xmin) &&
		!XidInMVCCSnapshot(place->config_xmin, snapshot) &&
		(place->config_committed || TransactionIdDidCommit(place->config_xmin));
}

/*
 * Make buf hold block blk, share-locked (pruned first if prune), letting go
 * of the page it held.  Returns true if it read a new page.
 */
static bool
LockedPage(Relation rel, Buffer *buf, BlockNumber blk, bool prune)
{
	if (BufferIsValid(*buf) && BufferGetBlockNumber(*buf) == blk)
		return false;
	if (BufferIsValid(*buf))
		UnlockReleaseBuffer(*buf);
	*buf = ReadBuffer(rel, blk);
	if (prune)
		heap_page_prune_opt(rel, *buf);
	LockBuffer(*buf, BUFFER_LOCK_SHARE);
	return true;
}

/*
 * Read a pinned counter's rows where they were last seen, without the
 * index: its rows are shards 0 .. shards-1 while its config row is trusted,
 * and the primary key leaves no room for another visible row.  Each row
 * must still be found on its HOT chain, as this snapshot sees it; false
 * sends the caller to the index.
 */
static bool
ReadKnownRows(Relation rel, CounterPlace *place, Snapshot snapshot,
			  int128 *sum, ShardRef **refs, int *nrefs)
{
	TupleDesc	desc = RelationGetDescr(rel);
	BlockNumber nblocks;
	Buffer		buf = InvalidBuffer;
	ShardRef   *found = NULL;
	bool		ok = true;
	int			n;

	if (place == NULL || place->shards == 0 || place->roots == NULL ||
		!PlaceTrusted(place, snapshot))
		return false;
	n = place->shards;
	if (refs)
		found = palloc(Max(n, 1) * sizeof(ShardRef));
	*sum = 0;
	/* remembered rows may lie past the end of a table VACUUM truncated */
	nblocks = RelationGetNumberOfBlocks(rel);
	for (int i = 0; i < n && ok; i++)
	{
		ItemPointerData tid = place->roots[i];
		BlockNumber blk = ItemPointerGetBlockNumber(&tid);
		HeapTupleData tup;
		bool		all_dead;
		bool		isnull;

		if (blk >= nblocks)
		{
			ok = false;
			break;
		}
		(void) LockedPage(rel, &buf, blk, true);
		/* a pruned root may have been reused: the row must be ours */
		ok = ItemPointerGetOffsetNumber(&tid) <= PageGetMaxOffsetNumber(BufferGetPage(buf)) &&
			heap_hot_search_buffer(&tid, rel, buf, snapshot, &tup, &all_dead, true) &&
			DatumGetInt32(heap_getattr(&tup, Anum_shard_counter_id, desc, &isnull)) == place->counter_id &&
			DatumGetInt32(heap_getattr(&tup, Anum_shard_shard, desc, &isnull)) == i;
		if (!ok)
			break;
		tup.t_self = tid;
		*sum += DatumGetInt64(heap_getattr(&tup, Anum_shard_value, desc, &isnull));
		if (found)
		{
			found[i].shard = i;
			found[i].tid = tid;
			found[i].value = DatumGetInt64(heap_getattr(&tup, Anum_shard_value, desc, &isnull));
		}
	}
	if (BufferIsValid(buf))
		UnlockReleaseBuffer(buf);
	if (!ok)
		return false;
	if (refs)
	{
		*refs = found;
		*nrefs = n;
	}
	return true;
}

void
ForgetRows(CounterPlace *place)
{
	if (place->roots)
		pfree(place->roots);
	if (place->refs)
		pfree(place->refs);
	place->roots = NULL;
	place->refs = NULL;
	place->nroots = 0;
	place->cached = false;
}

/*
 * Remember a counter's rows from a scan's refs (n < 0: they are not all of
 * its rows) and, for a pinned counter, the root of each row's HOT chain,
 * which stays put while HOT updates move the row along its chain.  Returns
 * false, remembering nothing, if they cannot be used.
 */
static bool
RememberRows(Relation rel, CounterPlace *place, ShardRef *refs, int n)
{
	OffsetNumber *roots;
	Buffer		buf = InvalidBuffer;
	bool		ok = true;

	ForgetRows(place);
	if ((place->shards != 0 && n != place->shards) || n < 0 || !NodeRowsAlone())
		return false;
	if (place->shards != 0)
	{
		place->roots = MemoryContextAllocZero(CacheEntryContext(), n * sizeof(ItemPointerData));
		roots = palloc(MaxHeapTuplesPerPage * sizeof(OffsetNumber));
		for (int i = 0; i < n && ok; i++)
		{
			int32		shard = refs[i].shard;
			BlockNumber blk = ItemPointerGetBlockNumber(&refs[i].tid);
			OffsetNumber root;

			if (shard < 0 || shard >= n || ItemPointerIsValid(&place->roots[shard]))
			{
				ok = false;
				break;
			}
			if (LockedPage(rel, &buf, blk, false))
				heap_get_root_tuples(BufferGetPage(buf), roots);
			root = roots[ItemPointerGetOffsetNumber(&refs[i].tid) - 1];
			ok = OffsetNumberIsValid(root);
			ItemPointerSet(&place->roots[shard], blk, root);
		}
		if (BufferIsValid(buf))
			UnlockReleaseBuffer(buf);
		pfree(roots);
		if (!ok)
		{
			ForgetRows(place);
			return false;
		}
	}
	place->nroots = n;
	place->refs = MemoryContextAlloc(CacheEntryContext(), Max(n, 1) * sizeof(ShardRef));
	memcpy(place->refs, refs, n * sizeof(ShardRef));
	return true;
}

/*
 * Do two MVCC snapshots of this transaction count the same transactions as
 * ended?  Then they see the same rows, but for changes of its own (which no
 * kept total trusts: they leave the layout word changing).  Copies lose
 * snapXactCompletionCount, so the contents are compared; a new transaction
 * that has not ended changes neither.
 */
static bool
SnapshotsAlike(Snapshot a, Snapshot b)
{
	return a->snapshot_type == SNAPSHOT_MVCC && b->snapshot_type == SNAPSHOT_MVCC &&
		!a->takenDuringRecovery && !b->takenDuringRecovery &&
		!a->suboverflowed && !b->suboverflowed &&
		a->xmin == b->xmin && a->xmax == b->xmax &&
		a->xcnt == b->xcnt && a->subxcnt == b->subxcnt &&
		memcmp(a->xip, b->xip, a->xcnt * sizeof(TransactionId)) == 0 &&
		memcmp(a->subxip, b->subxip, a->subxcnt * sizeof(TransactionId)) == 0;
}

/*
 * Is the safety net of kept totals (the rule in layout.c) in place
 * on rel, as snapshot sees the catalog?  snapshot was taken after net (the
 * epoch) was read, so an answer found under net is good while the epoch
 * stays: every change to the net moves it before it commits.
 */
static bool
ShardsNetHolds(Relation rel, Snapshot snapshot, uint64 net)
{
	static uint64 checked_net = 0;
	static Oid	checked_relid = InvalidOid;
	static bool holds = false;

	if (checked_net != net + 1 || checked_relid != RelationGetRelid(rel))
	{
		holds = ShardTriggersInPlace(RelationGetRelid(rel), snapshot);
		checked_net = net + 1;
		checked_relid = RelationGetRelid(rel);
	}
	return holds;
}

/*
 * Keep a counter's rows and total, as the snapshot "seen" saw them in sum
 * and refs (n of nall rows; refs NULL: none), if that snapshot also sees
 * them as they stand now that its layout word was read while nobody was
 * changing its rows: they then stay its rows and total for as long as the
 * word stays.
 * That holds when seen and a snapshot taken after the word was read count
 * the same transactions as ended (SnapshotsAlike).  Otherwise they are seen
 * again with that later snapshot, but only once the word held still between
 * two reads: a counter whose rows change all the time is not worth a second
 * scan.  Only with shared memory.
 */
static void
KeepRows(Relation rel, CounterPlace *place, Snapshot seen, int128 sum,
		 ShardRef *refs, int n, int nall)
{
	uint64		net;
	uint64		word;
	bool		still;
	Snapshot	snapshot;

	net = ShardsNetEpoch();
	word = LayoutWord(place->counter_id);
	still = word == place->last_word;
	place->last_word = word;
	if (!LayoutSettled(word) || !NodeRowsAlone() || IsolationIsSerializable())
		return;
	/*
	 * A look without the lock first: once a transaction newer than seen's
	 * xmax has ended, the snapshots differ, and a counter met for the first
	 * time under commits is not worth a fresh snapshot.
	 */
	if (!still &&
		!TransactionIdPrecedes(XidFromFullTransactionId(ShardedTransamVariables->latestCompletedXid),
							   seen->xmax))
		return;
	/* taken under ProcArrayLock: after the word was read */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	if (!ShardsNetHolds(rel, snapshot, net))
	{
		UnregisterSnapshot(snapshot);
		return;
	}
	if (refs == NULL || !SnapshotsAlike(seen, snapshot))
	{
		if (!still)
		{
			UnregisterSnapshot(snapshot);
			return;
		}
		refs = NULL;
		sum = ScanShards(rel, place->counter_id, snapshot, 0, &refs, &n, &nall);
	}
	/* nothing that could hide a write happened since net was read */
	if (RememberRows(rel, place, refs, nall == n ? n : -1) && ShardsNetEpoch() == net)
	{
		place->cached = true;
		place->kept.config_xmin = place->config_xmin;
		place->kept.seen_xmax = snapshot->xmax;
		place->kept.layout = word;
		place->kept.sum = sum;
		ShareKeptTotal(place->counter_id, &place->kept);
	}
	UnregisterSnapshot(snapshot);
}

/*
 * Does a kept total still hold for this snapshot?  It must be kept for the
 * config row version this session loaded.  The word is read after the
 * snapshot was taken, so a change the snapshot sees has moved it (every
 * insert, update and delete of a shard row marks it first).  And the
 * snapshot must see everything the rows were seen with: every transaction
 * below that snapshot's xmax has ended before this one was taken.  No
 * buffer, not even the table, is touched.
 */
static bool
TotalHolds(CounterPlace *place, const KeptTotal *kept, Snapshot snapshot)
{
	return kept->config_xmin == place->config_xmin && PlaceTrusted(place, snapshot) &&
		LayoutWord(place->counter_id) == kept->layout &&
		TransactionIdFollowsOrEquals(snapshot->xmin, kept->seen_xmax);
}

/* The total this session kept with a counter's rows, if it still holds. */
static bool
ReadKeptTotal(CounterPlace *place, Snapshot snapshot, int128 *sum,
			  ShardRef **refs, int *nrefs)
{
	if (place == NULL || !place->cached || !TotalHolds(place, &place->kept, snapshot))
		return false;
	*sum = place->kept.sum;
	if (refs)
	{
		*refs = palloc(Max(place->nroots, 1) * sizeof(ShardRef));
		memcpy(*refs, place->refs, place->nroots * sizeof(ShardRef));
		*nrefs = place->nroots;
	}
	return true;
}

/* The total another session kept (kept.c), on the same terms. */
static bool
ReadSharedTotal(CounterPlace *place, Snapshot snapshot, int128 *sum)
{
	KeptTotal	kept;

	if (place == NULL || !SharedKeptTotal(place->counter_id, &kept) ||
		!TotalHolds(place, &kept, snapshot))
		return false;
	*sum = kept.sum;
	return true;
}

/*
 * Sum of a counter's shards as the active snapshot sees them; with refs,
 * also where each shard row is (palloc'd in the current context).  place,
 * if given, keeps the rows and their total, or remembers where a pinned
 * counter's rows are, to skip the index next time.
 */
int128
CounterSum(int32 counter_id, CounterPlace *place, ShardRef **refs, int *nrefs)
{
	Relation	rel;
	bool		pushed = false;
	int128		sum;
	ShardRef   *local = NULL;
	int			nlocal = 0;
	int			nall = 0;
	bool		keep;

	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		pushed = true;
	}
	/* another session's total serves only a caller that needs no rows */
	if (ReadKeptTotal(place, GetActiveSnapshot(), &sum, refs, nrefs) ||
		(refs == NULL && ReadSharedTotal(place, GetActiveSnapshot(), &sum)))
	{
		if (pushed)
			PopActiveSnapshot();
		return sum;
	}
	keep = place != NULL && LayoutWordsAvailable();
	/* keeping the total, or remembering a pinned counter's rows, needs refs */
	if ((keep || (place != NULL && place->shards != 0)) && refs == NULL)
		refs = &local, nrefs = &nlocal;
	rel = table_open(ConfigRelid("counter_shards"), AccessShareLock);
	if (ReadKnownRows(rel, place, GetActiveSnapshot(), &sum, refs, nrefs))
	{
		/* read from the rows' places (all of them): keep the total too */
		if (keep && !place->cached)
			KeepRows(rel, place, GetActiveSnapshot(), sum, *refs, *nrefs, *nrefs);
	}
	else
	{
		sum = ScanShards(rel, counter_id, GetActiveSnapshot(),
						 SessionNodeId() * NODE_SHARDS, refs, nrefs, &nall);
		/* only rows that are all this node's can be read from their places */
		if (keep)
			KeepRows(rel, place, GetActiveSnapshot(), sum, *refs, *nrefs, nall);
		else if (place && place->shards != 0)
			(void) RememberRows(rel, place, *refs, nall == *nrefs ? *nrefs : -1);
	}
	if (pushed)
		PopActiveSnapshot();
	table_close(rel, AccessShareLock);
	return sum;
}

/*
 * The common case of InsertIndexEntries, without an executor: the table has
 * only the extension's own indexes, each valid and ready.  Returns false,
 * having inserted nothing, for any other set of indexes.
 */
static bool
InsertOwnIndexEntries(Relation rel, HeapTuple newtup, bool moved)
{
	List	   *indexes = RelationGetIndexList(rel);
	Relation	opened[2];
	int			n = 0;
	bool		own = list_length(indexes) <= 2;
	ListCell   *lc;
	Datum		values[2];
	bool		isnull[2] = {false, false};
	bool		null;

	foreach(lc, indexes)
	{
		Relation	index;
		const char *name;

		if (!own)
			break;
		index = index_open(lfirst_oid(lc), RowExclusiveLock);
		opened[n++] = index;
		name = RelationGetRelationName(index);
		own = index->rd_index->indisvalid && index->rd_index->indisready &&
			index->rd_index->indislive &&
			(strcmp(name, "counter_shards_pkey") == 0 ||
			 strcmp(name, "counter_shards_extra") == 0 ||
			 strcmp(name, "counter_shards_multi") == 0);
	}
	if (own)
	{
		int32		shard = DatumGetInt32(heap_getattr(newtup, Anum_shard_shard,
													   RelationGetDescr(rel), &null));

		values[0] = heap_getattr(newtup, Anum_shard_counter_id, RelationGetDescr(rel), &null);
		values[1] = Int32GetDatum(shard);
		for (int i = 0; i < n; i++)
		{
			const char *name = RelationGetRelationName(opened[i]);
			bool		pkey = strcmp(name, "counter_shards_pkey") == 0;

			/*
			 * The other one is partial, on counter_id alone: rows other than
			 * each node's first (shard % 1024 <> 0, schema 1.3), or other
			 * than shard 0 (counter_shards_multi, schema 1.2).  An update
			 * never changes the key ("unchanged"), which lets btree delete
			 * old versions' entries bottom-up, not split.
			 */
			if (!pkey && (strcmp(name, "counter_shards_extra") == 0 ?
						  shard % NODE_SHARDS == 0 : shard == 0))
				continue;
			index_insert(opened[i], values, isnull, &newtup->t_self,
						 rel, pkey ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, moved,
						 BuildIndexInfo(opened[i]));
		}
	}
	for (int i = 0; i < n; i++)
		index_close(opened[i], NoLock);
	list_free(indexes);
	return own;
}

/*
 * Index a new row, or (moved) the new version of a row that a non-HOT
 * update moved, in every index the table has, as INSERT and UPDATE do: that
 * includes an index being built concurrently (CREATE INDEX or REINDEX
 * CONCURRENTLY) and any index an administrator added.
 */
void
InsertIndexEntries(Relation rel, HeapTuple newtup, bool moved, bool only_summarizing)
{
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;

	if (!only_summarizing && InsertOwnIndexEntries(rel, newtup, moved))
		return;
	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);

	InitResultRelInfo(rri, rel, 1, NULL, 0);
	ExecOpenIndices(rri, false);
	ExecStoreHeapTuple(newtup, slot, false);
	/* update = false: its hint would need a range table, which we lack */
#if PG_VERSION_NUM >= 160000
	(void) ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL,
								 only_summarizing);
#else
	Assert(!only_summarizing);
	(void) ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL);
#endif
	ExecCloseIndices(rri);
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
}

typedef enum ShardResult
{
	SHARD_UPDATED,
	SHARD_BUSY,					/* held by another transaction */
	SHARD_GONE,					/* deleted (a shrink or drop) */
	SHARD_FULL					/* the delta does not fit in this shard */
} ShardResult;

/*
 * Add delta to the newest version of the shard row at ref.  Increments
 * commute, so this follows concurrent updates whatever the isolation level,
 * and no increment is lost.  With wait = false a shard that another
 * transaction holds is reported busy instead of waited for.
 *
 * ref may be a location remembered from an earlier statement, since pruned
 * and reused, so it is used only if the row there is visible to snapshot and
 * is the same shard; newer versions reached from it were made by committed
 * updates, which no one can prune while snapshot is held.
 */
static ShardResult
UpdateShard(Relation rel, int32 counter_id, ShardRef *ref, int64 delta,
			bool wait, Snapshot snapshot)
{
	ItemPointerData tid = ref->tid;
	TupleDesc	desc = RelationGetDescr(rel);
	Snapshot	fetch_snapshot = snapshot;

	for (;;)
	{
		HeapTupleData oldtup;
		Buffer		buf;
		HeapTuple	newtup;
		Datum		values[Natts_shard];
		bool		nulls[Natts_shard];
		TM_FailureData tmfd;
		TM_Result	result;
		int64		newvalue;

		oldtup.t_self = tid;
		if (!heap_fetch(rel, fetch_snapshot, &oldtup, &buf, true))
		{
			if (BufferIsValid(buf))
				ReleaseBuffer(buf);
			return SHARD_GONE;
		}
		fetch_snapshot = SnapshotAny;
		heap_deform_tuple(&oldtup, desc, values, nulls);
		/* make room on the page, so that the update can stay HOT */
		heap_page_prune_opt(rel, buf);
		ReleaseBuffer(buf);
		/* a remembered location may since have been pruned and reused */
		if (DatumGetInt32(values[Anum_shard_counter_id - 1]) != counter_id ||
			DatumGetInt32(values[Anum_shard_shard - 1]) != ref->shard)
			return SHARD_GONE;
		if (pg_add_s64_overflow(DatumGetInt64(values[Anum_shard_value - 1]), delta, &newvalue))
			return SHARD_FULL;
		values[Anum_shard_value - 1] = Int64GetDatum(newvalue);
		newtup = heap_form_tuple(desc, values, nulls);

		result = ShardWrite(&(ShardWriteOp) {
			.kind = WRITE_UPDATE, .counter_id = counter_id, .rel = rel,
			.tid = &tid, .tuple = newtup, .wait = wait, .tmfd = &tmfd});
		heap_freetuple(newtup);
		switch (result)
		{
			case TM_Ok:
				return SHARD_UPDATED;
			case TM_BeingModified:
				return SHARD_BUSY;
			case TM_Updated:
				tid = tmfd.ctid;	/* a newer version: add to that one */
				continue;
			case TM_Deleted:
			case TM_SelfModified:
				return SHARD_GONE;
			default:
				elog(ERROR, "unexpected heap_update status %d on a counter shard", result);
		}
	}
}

/* Try each shard once, starting with the preferred one. */
static ShardResult
TryShards(Relation rel, int32 counter_id, int32 preferred, ShardRef *refs,
		  int n, int64 delta, bool wait)
{
	int			first = 0;
	ShardResult best = SHARD_GONE;

	for (int i = 0; i < n; i++)
		if (refs[i].shard == preferred)
			first = i;
	for (int k = 0; k < n; k++)
	{
		ShardResult r = UpdateShard(rel, counter_id, &refs[(first + k) % n],
									delta, wait, GetActiveSnapshot());

		if (r == SHARD_UPDATED)
			return r;
		if (r == SHARD_FULL || (r == SHARD_BUSY && best == SHARD_GONE))
			best = r;
	}
	return best;
}

/*
 * Add delta to one shard: the preferred one if free, else the next free one;
 * with wait, when every shard is held, wait for them in turn.
 */
/*
 * Remembered locations may lie past the end of a table that VACUUM truncated
 * or VACUUM FULL rewrote since they were seen.  The caller holds a lock that
 * keeps the table from shrinking now.
 */
static bool
KnownWithinTable(Relation rel, ShardRef *known, int nknown)
{
	BlockNumber nblocks = RelationGetNumberOfBlocks(rel);

	for (int i = 0; i < nknown; i++)
		if (ItemPointerGetBlockNumber(&known[i].tid) >= nblocks)
			return false;
	return true;
}

/* Insert a shard row and its index entries. */
static void
InsertShardRow(Relation rel, int32 counter_id, int32 shard, int64 value, int options)
{
	Datum		values[Natts_shard];
	bool		nulls[Natts_shard] = {false, false, false};
	HeapTuple	tup;

	values[Anum_shard_counter_id - 1] = Int32GetDatum(counter_id);
	values[Anum_shard_shard - 1] = Int32GetDatum(shard);
	values[Anum_shard_value - 1] = Int64GetDatum(value);
	tup = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	(void) ShardWrite(&(ShardWriteOp) {
		.kind = WRITE_INSERT, .counter_id = counter_id, .rel = rel,
		.tuple = tup, .options = options});
	heap_freetuple(tup);
}

/* Is there a row for this shard, as the latest snapshot sees it? */
static bool
ShardExists(Relation rel, int32 counter_id, int32 shard, ShardRef *ref)
{
	ScanKeyData keys[2];
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found;
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());

	ScanKeyInit(&keys[0], Anum_shard_counter_id, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(counter_id));
	ScanKeyInit(&keys[1], Anum_shard_shard, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(shard));
	scan = systable_beginscan(rel, ConfigRelid("counter_shards_pkey"), true,
							  snapshot, 2, keys);
	tup = systable_getnext(scan);
	found = HeapTupleIsValid(tup);
	if (found)
	{
		ref->shard = shard;
		ref->tid = tup->t_self;
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	return found;
}

/*
 * The lock that keeps two commits from adding the same shard row.  Lock tags
 * have 16 bits for it; the rows of one node (1024 numbers) never share one,
 * and rows of different nodes that do (a server whose node id changed) only
 * make their commits take turns.
 */
static uint16
ShardLockSub(int32 shard)
{
	return (uint16) ((uint32) shard & 0xFFFF);
}

/*
 * Every row of the counter is held by other transactions.  If it is
 * adaptive and below sharded_seq.max_counter_shards, add a row holding
 * delta instead of waiting (the LongAdder idea: contention makes cells).
 *
 * Nothing here waits.  The counter object lock (RowShareLock) keeps
 * alter_counter and drop_counter out; a lock per shard number keeps two
 * commits from adding the same row, and whoever gets it checks, with a
 * snapshot taken after, that no committed transaction added the row first.
 */
static ShardResult
GrowCounter(Relation rel, int32 counter_id, int32 base, ShardRef *refs, int n,
			int64 delta)
{
	Oid			config_relid = ConfigRelid("counter_config");
	Oid			shards_relid = RelationGetRelid(rel);
	CounterConfigRow config;

	if (n >= MaxCounterShards ||
		!ConditionalLockDatabaseObject(config_relid, counter_id, 0, RowShareLock))
		return SHARD_BUSY;
	if (!FetchCounterConfig(NULL, counter_id, &config))
		return SHARD_BUSY;		/* gone meanwhile: the caller decides */
	if (config.acl)
		pfree(config.acl);
	if (config.shards != 0)
		return SHARD_BUSY;		/* pinned meanwhile */

	for (int32 shard = base; shard < base + MaxCounterShards; shard++)
	{
		bool		taken = false;
		ShardRef	ref;

		for (int i = 0; i < n && !taken; i++)
			taken = (refs[i].shard == shard);
		if (taken ||
			!ConditionalLockDatabaseObject(shards_relid, counter_id, ShardLockSub(shard), ExclusiveLock))
			continue;
		if (ShardExists(rel, counter_id, shard, &ref))
		{
			/* added by a commit since our scan: it may well be free */
			if (UpdateShard(rel, counter_id, &ref, delta, false, GetLatestSnapshot()) == SHARD_UPDATED)
				return SHARD_UPDATED;
			continue;
		}
		InsertShardRow(rel, counter_id, shard, delta, 0);
		return SHARD_UPDATED;
	}
	return SHARD_BUSY;
}

/* Has this node a row of the counter, as the latest snapshot sees it? */
static bool
NodeHasRows(Relation rel, int32 counter_id, int32 base)
{
	ScanKeyData keys[3];
	SysScanDesc scan;
	bool		found;
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());

	ScanKeyInit(&keys[0], Anum_shard_counter_id, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(counter_id));
	ScanKeyInit(&keys[1], Anum_shard_shard, BTGreaterEqualStrategyNumber, F_INT4GE,
				Int32GetDatum(base));
	ScanKeyInit(&keys[2], Anum_shard_shard, BTLessStrategyNumber, F_INT4LT,
				Int32GetDatum(base + NODE_SHARDS));
	scan = systable_beginscan(rel, ConfigRelid("counter_shards_pkey"), true,
							  snapshot, 3, keys);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	return found;
}

/*
 * The counter has rows, but none of this node's (it was created on another
 * node): this node's first commit to it adds them, a pinned counter's layout
 * or an adaptive counter's one row, with delta in the preferred one.
 * Returns SHARD_UPDATED; SHARD_BUSY if a lock is held and wait is false, or
 * if another commit added the rows meanwhile and wait is false; SHARD_GONE
 * if the counter is gone, or the rows were added meanwhile (look again).
 */
static ShardResult
AddNodeRows(Relation rel, int32 counter_id, int32 base, int32 preferred,
			int64 delta, bool wait)
{
	Oid			config_relid = ConfigRelid("counter_config");
	Oid			shards_relid = RelationGetRelid(rel);
	CounterConfigRow config;
	int32		rows;

	/* as a growing commit: alter_counter and drop_counter stay out */
	if (wait)
		LockDatabaseObject(config_relid, counter_id, 0, RowShareLock);
	else if (!ConditionalLockDatabaseObject(config_relid, counter_id, 0, RowShareLock))
		return SHARD_BUSY;
	/* of two first commits, the second waits for the first and finds its rows */
	if (wait)
		LockDatabaseObject(shards_relid, counter_id, ShardLockSub(base), ExclusiveLock);
	else if (!ConditionalLockDatabaseObject(shards_relid, counter_id, ShardLockSub(base), ExclusiveLock))
		return SHARD_BUSY;
	if (!FetchCounterConfig(NULL, counter_id, &config))
		return SHARD_GONE;
	if (config.acl)
		pfree(config.acl);
	if (NodeHasRows(rel, counter_id, base))
		return wait ? SHARD_GONE : SHARD_BUSY;
	rows = config.shards > 0 ? config.shards : 1;
	if (preferred < base || preferred >= base + rows)
		preferred = base;
	for (int32 shard = base; shard < base + rows; shard++)
		InsertShardRow(rel, counter_id, shard, shard == preferred ? delta : 0, 0);
	return SHARD_UPDATED;
}

static ShardResult
ApplyToShard(int32 counter_id, int32 preferred, int64 delta, ShardRef *known,
			 int nknown, bool wait)
{
	Oid			relid = ConfigRelid("counter_shards");
	Relation	rel;
	ShardResult r = SHARD_GONE;
	int32		base = NodeShardBase();

	/* callers name a shard within a node: this is the one of our node */
	preferred = base + (int32) ((uint32) preferred % NODE_SHARDS);
	if (wait)
		rel = table_open(relid, RowExclusiveLock);
	else
	{
		/* not even a table or index lock may be waited for */
		List	   *indexes;
		ListCell   *lc;

		if (!ConditionalLockRelationOid(relid, RowExclusiveLock))
			return SHARD_BUSY;
		rel = table_open(relid, NoLock);
		indexes = RelationGetIndexList(rel);
		foreach(lc, indexes)
			if (!ConditionalLockRelationOid(lfirst_oid(lc), RowExclusiveLock))
			{
				table_close(rel, NoLock);
				return SHARD_BUSY;
			}
	}

	/* the newest rows: a shard added or removed since our snapshot counts */
	PushActiveSnapshot(GetLatestSnapshot());
	if (nknown > 0 && KnownWithinTable(rel, known, nknown))
		r = TryShards(rel, counter_id, preferred, known, nknown, delta, false);

	/*
	 * Rows can all vanish while we wait for them (maintain() rewrites a
	 * counter's rows), so after a wait that found none, look again with a
	 * newer snapshot.
	 */
	for (int attempt = 0; r != SHARD_UPDATED && attempt < 100; attempt++)
	{
		ShardRef   *refs = NULL;
		int			n = 0;
		int			nall = 0;

		if (attempt > 0)
		{
			PopActiveSnapshot();
			PushActiveSnapshot(GetLatestSnapshot());
		}
		(void) ScanShards(rel, counter_id, GetActiveSnapshot(), base, &refs, &n, &nall);
		if (n == 0 && nall > 0)
			r = AddNodeRows(rel, counter_id, base, preferred, delta, wait);
		else
		{
			r = TryShards(rel, counter_id, preferred, refs, n, delta, false);
			if (r == SHARD_BUSY)
				r = GrowCounter(rel, counter_id, base, refs, n, delta);
			if (r == SHARD_BUSY && wait)
				r = TryShards(rel, counter_id, preferred, refs, n, delta, true);
		}
		if (refs)
			pfree(refs);
		/* no row of any node: the counter was dropped */
		if (r != SHARD_GONE || nall == 0 || !wait)
			break;
	}
	PopActiveSnapshot();

	/* the lock stays until the transaction ends: it wrote the table */
	table_close(rel, NoLock);
	return r;
}

/*
 * Add delta to one shard of the counter, at commit: this session's shard if
 * free, else the next free one; only when every shard is held, wait for them
 * in turn.  known/nknown are where the increment last saw the shard rows; if
 * none of them takes the update, the rows are looked up afresh.  Returns
 * false if the counter has no shard rows left.
 */
bool
CounterApply(int32 counter_id, int32 preferred, int64 delta, const char *name,
			 ShardRef *known, int nknown)
{
	ShardResult r = ApplyToShard(counter_id, preferred, delta, known, nknown, true);

	if (r == SHARD_FULL)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("counter \"%s\" would overflow bigint", name),
				 errdetail("No shard can take %lld more.", (long long) delta),
				 errhint("The transaction was rolled back and nothing was changed.  Keep totals within bigint.")));
	return r == SHARD_UPDATED;
}

/* The same, never waiting, and reporting instead of raising an error. */
CounterApplyResult
CounterTryApply(int32 counter_id, int32 preferred, int64 delta)
{
	switch (ApplyToShard(counter_id, preferred, delta, NULL, 0, false))
	{
		case SHARD_UPDATED:
			return APPLY_DONE;
		case SHARD_BUSY:
			return APPLY_BUSY;
		case SHARD_FULL:
			return APPLY_FULL;
		default:
			return APPLY_GONE;
	}
}

/* One row of a counter, as maintain() found it. */
typedef struct FoundRow
{
	ItemPointerData tid;
	int32		shard;
	int64		value;
	bool		idle;
	bool		fold;			/* folded into the keeper */
} FoundRow;

/* Delete a row version exactly as it was read; false if it was held or changed. */
static bool
DeleteAsRead(Relation rel, int32 counter_id, ItemPointer tid)
{
	TM_FailureData tmfd;

	return ShardWrite(&(ShardWriteOp) {
		.kind = WRITE_DELETE, .counter_id = counter_id, .rel = rel,
		.tid = tid, .tmfd = &tmfd}) == TM_Ok;
}

/*
 * maintain()'s work on one counter, in the caller's subtransaction, which
 * is rolled back on MAINTAIN_BUSY.  Nothing here waits.
 *
 * Fold: rows not updated since idle_before (or frozen) go into one of them.
 * With every row idle, the counter is back to one row; with some still
 * busy, the idle ones become one.  Gather: rows spread over more pages than
 * they need are rewritten together, at the end of the table, where a fresh
 * page leaves room for HOT updates.
 *
 * A row is deleted only as the version that was read, so each value moved
 * is final; the keeper is added to, which commutes with concurrent
 * increments.  Readers see the old rows or the new ones, never a mix.
 * Only this node's rows (from base) are touched: other nodes' are theirs.
 */
MaintainResult
MaintainCounterRows(int32 counter_id, int32 base, bool fold,
					TransactionId idle_before)
{
	Relation	rel = table_open(ConfigRelid("counter_shards"), RowExclusiveLock);
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyData keys[3];
	SysScanDesc scan;
	HeapTuple	tup;
	TupleDesc	desc = RelationGetDescr(rel);
	FoundRow   *rows = NULL;
	int			n = 0;
	int			cap = 0;
	int			nidle = 0;
	int			keeper = -1;
	int			npages = 0;
	BlockNumber *pages;
	bool		gather;
	int128		moved = 0;
	MaintainResult result = MAINTAIN_NOTHING;

	/*
	 * Like a growing commit: alter_counter and drop_counter must not read or
	 * delete the rows while this rewrites them, so each waits for the other.
	 * Held to the end of the transaction (the subtransaction's, if undone).
	 */
	if (!ConditionalLockDatabaseObject(ConfigRelid("counter_config"), counter_id, 0, RowShareLock))
	{
		table_close(rel, NoLock);
		return MAINTAIN_BUSY;
	}
	ScanKeyInit(&keys[0], Anum_shard_counter_id, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(counter_id));
	ScanKeyInit(&keys[1], Anum_shard_shard, BTGreaterEqualStrategyNumber, F_INT4GE,
				Int32GetDatum(base));
	ScanKeyInit(&keys[2], Anum_shard_shard, BTLessStrategyNumber, F_INT4LT,
				Int32GetDatum(base + NODE_SHARDS));
	scan = systable_beginscan(rel, ConfigRelid("counter_shards_pkey"), true,
							  snapshot, 3, keys);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		FoundRow   *r;

		if (n == cap)
		{
			cap = cap ? cap * 2 : 16;
			rows = n ? repalloc(rows, cap * sizeof(FoundRow)) : palloc(cap * sizeof(FoundRow));
		}
		r = &rows[n++];
		r->tid = tup->t_self;
		r->shard = DatumGetInt32(heap_getattr(tup, Anum_shard_shard, desc, &isnull));
		r->value = DatumGetInt64(heap_getattr(tup, Anum_shard_value, desc, &isnull));
		r->idle = fold &&
			(HeapTupleHeaderXminFrozen(tup->t_data) ||
			 TransactionIdPrecedes(HeapTupleHeaderGetRawXmin(tup->t_data), idle_before));
		r->fold = false;
		nidle += r->idle;
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	if (n <= 1)
	{
		table_close(rel, NoLock);
		return MAINTAIN_NOTHING;
	}

	/* the keeper: the lowest idle row; every other idle row folds into it */
	if (nidle >= 2)
	{
		for (int i = 0; i < n; i++)
			if (rows[i].idle && (keeper < 0 || rows[i].shard < rows[keeper].shard))
				keeper = i;
		for (int i = 0; i < n; i++)
			if (rows[i].idle && i != keeper)
			{
				rows[i].fold = true;
				moved += rows[i].value;
			}
		if (moved + rows[keeper].value > PG_INT64_MAX ||
			moved + rows[keeper].value < PG_INT64_MIN)
		{
			table_close(rel, NoLock);
			return MAINTAIN_NOTHING;	/* would not fit one row: leave it */
		}
	}

	/* rows left after folding, and the pages they lie on */
	pages = palloc(n * sizeof(BlockNumber));
	for (int i = 0; i < n; i++)
	{
		BlockNumber blk = ItemPointerGetBlockNumber(&rows[i].tid);
		bool		seen = false;

		if (rows[i].fold)
			continue;
		for (int j = 0; j < npages && !seen; j++)
			seen = (pages[j] == blk);
		if (!seen)
			pages[npages++] = blk;
	}
	gather = npages > 2 + (n - (keeper >= 0 ? nidle - 1 : 0)) / 32;
	if (keeper < 0 && !gather)
	{
		table_close(rel, NoLock);
		return MAINTAIN_NOTHING;
	}

	for (int i = 0; i < n && result != MAINTAIN_BUSY; i++)
	{
		if (!rows[i].fold && !gather)
			continue;
		if (!DeleteAsRead(rel, counter_id, &rows[i].tid))
			result = MAINTAIN_BUSY;
	}
	if (result != MAINTAIN_BUSY && gather)
	{
		/* the survivors, together on the last page or a new one */
		for (int i = 0; i < n; i++)
			if (!rows[i].fold)
				InsertShardRow(rel, counter_id, rows[i].shard,
							   rows[i].value + (i == keeper ? (int64) moved : 0),
							   HEAP_INSERT_SKIP_FSM);
	}
	else if (result != MAINTAIN_BUSY)
	{
		ShardRef	ref;

		ref.shard = rows[keeper].shard;
		ref.tid = rows[keeper].tid;
		if (UpdateShard(rel, counter_id, &ref, (int64) moved, false,
						GetLatestSnapshot()) != SHARD_UPDATED)
			result = MAINTAIN_BUSY;
	}
	if (result != MAINTAIN_BUSY)
		result = keeper >= 0 ? MAINTAIN_FOLDED : MAINTAIN_GATHERED;
	table_close(rel, NoLock);
	return result;
}

/* ---- the one door for writing shard rows ---- */

/* set while ShardWrite runs one of the plans below: rows_changed_elsewhere
 * then knows the write for the engine's own */
static bool EngineSqlWriting = false;

/*
 * Every write of a shard row by the engine goes through here, by the heap
 * (insert, update, delete, with their index entries) or by one of the SQL
 * plans below.  The counter's layout word is marked before the write can be
 * seen: the rule kept totals stand on (layout.c).  The trigger
 * rows_changed_elsewhere knows an SQL write for the engine's own for as long
 * as the plan runs, and no other write.  Nothing else in the extension
 * writes counter_shards (test/structure/one_writer.sh checks it).
 */
static TM_Result
ShardWrite(const ShardWriteOp *op)
{
	LockTupleMode lockmode;
	ShardedIndexUpdate indexes;
	TM_Result	result;
	int			rc;

	LayoutChanging(op->counter_id);
	switch (op->kind)
	{
		case WRITE_INSERT:
			heap_insert(op->rel, op->tuple, GetCurrentCommandId(true), op->options, NULL);
			InsertIndexEntries(op->rel, op->tuple, false, false);
			return TM_Ok;
		case WRITE_UPDATE:
			result = ShardedHeapUpdate(op->rel, op->tid, op->tuple,
									   GetCurrentCommandId(true), InvalidSnapshot,
									   op->wait, op->tmfd, &lockmode, &indexes);
			if (result == TM_Ok && indexes != INDEX_UPDATE_NONE)
				InsertIndexEntries(op->rel, op->tuple, true,
								   indexes == INDEX_UPDATE_SUMMARIZING);
			return result;
		case WRITE_DELETE:
			return heap_delete(op->rel, op->tid, GetCurrentCommandId(true),
							   InvalidSnapshot, false, op->tmfd, false);
		case WRITE_SQL:
			break;
	}
	EngineSqlWriting = true;
	PG_TRY();
	{
		rc = SPI_execute_plan(op->plan, op->args, NULL, false, 0);
	}
	PG_FINALLY();
	{
		EngineSqlWriting = false;
	}
	PG_END_TRY();
	if (rc != op->expected)
		elog(ERROR, "could not %s: %s", op->what, SPI_result_code_string(rc));
	return TM_Ok;
}

/* Run one of the SQL plans below (as the owner, inside BeginAsOwner). */
static void
ShardRowsSql(SPIPlanPtr plan, Datum *args, int expected, int32 counter_id,
			 const char *what)
{
	(void) ShardWrite(&(ShardWriteOp) {
		.kind = WRITE_SQL, .counter_id = counter_id, .plan = plan,
		.args = args, .expected = expected, .what = what});
}

/*
 * A new counter's rows on this node: shards base .. base + shards-1, all 0
 * (inside SPI, as the owner).
 */
void
ShardRowsCreate(int32 id, int32 shards, const char *name)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {INT4OID, INT4OID, INT4OID};
	Datum		args[3];

	args[0] = Int32GetDatum(id);
	args[1] = Int32GetDatum(Max(shards, 1));
	args[2] = Int32GetDatum(NodeShardBase());
	PreparePlan(&plan,
				"INSERT INTO sharded_seq.counter_shards (counter_id, shard)"
				" SELECT $1, $3 OPERATOR(pg_catalog.+) g"
				"   FROM pg_catalog.generate_series(0, $2 OPERATOR(pg_catalog.-) 1) g",
				3, types);
	ShardRowsSql(plan, args, SPI_OK_INSERT, id,
				 psprintf("create shards of counter \"%s\"", name));
}

/*
 * Insert a counter and this node's shard rows (inside SPI, as the owner);
 * shards 0 makes it adaptive, with one row.  Nobody needs telling: sessions
 * look up a name they do not know every time.  Other nodes add their rows
 * at their first commit to it.
 */
bool
InsertCounter(const char *name, int32 shards, const char *mode, Oid owner,
			  bool if_not_exists)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr plan_ine = NULL;
	Oid			argtypes[5] = {INT4OID, TEXTOID, INT4OID, TEXTOID, OIDOID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	const char *sql =
		"INSERT INTO sharded_seq.counter_config (id, name, shards, mode, owner)"
		" VALUES ($1, $2, $3, $4, $5::pg_catalog.regrole)";
	int32		id = NextObjectId();

	/* schema 1.1 until ALTER EXTENSION UPDATE: its former default layout */
	if (shards == 0 && !AdaptiveCountersStored())
		shards = 16;
	args[0] = Int32GetDatum(id);
	args[1] = CStringGetTextDatum(name);
	args[2] = Int32GetDatum(shards);
	if (shards == 0)
		nulls[2] = 'n';
	args[3] = CStringGetTextDatum(mode);
	args[4] = ObjectIdGetDatum(owner);
	if (if_not_exists)
		PreparePlan(&plan_ine, psprintf("%s ON CONFLICT (name) DO NOTHING", sql), 5, argtypes);
	else
		PreparePlan(&plan, sql, 5, argtypes);
	if (SPI_execute_plan(if_not_exists ? plan_ine : plan, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not create counter \"%s\"", name);
	if (SPI_processed == 0)
		return false;			/* someone else created it first */

	ShardRowsCreate(id, shards, name);
	return true;
}

/* This node's rows of counter $1: base $2 .. $2 + 1023 */
#define NODE_ROWS_SQL \
	" counter_id OPERATOR(pg_catalog.=) $1" \
	" AND shard OPERATOR(pg_catalog.>=) $2" \
	" AND shard OPERATOR(pg_catalog.<) ($2 OPERATOR(pg_catalog.+) 1024)"

/* How many rows this node has of a counter (inside SPI, as the owner). */
int32
ShardRowsCount(int32 id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {INT4OID, INT4OID};
	Datum		args[2];
	bool		isnull;

	args[0] = Int32GetDatum(id);
	args[1] = Int32GetDatum(NodeShardBase());
	PreparePlan(&plan,
				"SELECT pg_catalog.count(*)::pg_catalog.int4 FROM sharded_seq.counter_shards"
				" WHERE" NODE_ROWS_SQL, 2, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not count counter shards");
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Give this node's rows of a counter exactly the shards base .. base +
 * shards-1, their total in the first (inside SPI, as the owner, with commits
 * to the counter kept out).  Other nodes' rows, and their totals, are
 * theirs: each node lays out its own rows.
 */
void
ShardRowsRebuild(int32 id, int32 shards)
{
	static SPIPlanPtr lock_plan = NULL;
	static SPIPlanPtr delete_plan = NULL;
	static SPIPlanPtr insert_plan = NULL;
	Oid			types2[2] = {INT4OID, INT4OID};
	Oid			types4[4] = {INT4OID, INT4OID, INT4OID, NUMERICOID};
	Datum		args[4];
	bool		isnull;
	Datum		total;

	args[0] = Int32GetDatum(id);
	args[1] = Int32GetDatum(NodeShardBase());
	/* wait for commits adding to the rows, so that the sum is final */
	PreparePlan(&lock_plan,
				"SELECT COALESCE(pg_catalog.sum(value), 0::pg_catalog.numeric) FROM"
				" (SELECT value FROM sharded_seq.counter_shards"
				"   WHERE" NODE_ROWS_SQL " FOR UPDATE) s",
				2, types2);
	if (SPI_execute_plan(lock_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lock counter shards");
	total = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	PreparePlan(&delete_plan,
				"DELETE FROM sharded_seq.counter_shards WHERE" NODE_ROWS_SQL,
				2, types2);
	ShardRowsSql(delete_plan, args, SPI_OK_DELETE, id, "remove counter shards");
	args[2] = Int32GetDatum(shards);
	args[3] = total;
	PreparePlan(&insert_plan,
				"INSERT INTO sharded_seq.counter_shards (counter_id, shard, value)"
				" SELECT $1, $2 OPERATOR(pg_catalog.+) g,"
				"        CASE WHEN g OPERATOR(pg_catalog.=) 0 THEN $4::pg_catalog.int8 ELSE 0 END"
				"   FROM pg_catalog.generate_series(0, $3 OPERATOR(pg_catalog.-) 1) g",
				4, types4);
	ShardRowsSql(insert_plan, args, SPI_OK_INSERT, id, "add counter shards");
}

/*
 * set_counter: make this node's rows of a counter add up to value, all of
 * it in the lowest row (inside SPI, as the owner, with the counter's commit
 * lock held, so no commit grows or folds the rows meanwhile).  The rows are
 * locked first, waiting for commits adding to them; from then until this
 * transaction ends no commit adds to them, so their total at its commit is
 * value, and a commit that waited adds on top.  Refused if another node has
 * rows of the counter: their increments arrive by replication, in no order
 * with this commit.
 */
void
ShardRowsSet(int32 id, int64 value, const char *name)
{
	static SPIPlanPtr lock_plan = NULL;
	static SPIPlanPtr other_plan = NULL;
	static SPIPlanPtr set_plan = NULL;
	Oid			types2[2] = {INT4OID, INT4OID};
	Oid			types4[4] = {INT4OID, INT4OID, INT4OID, INT8OID};
	Datum		args[4];
	bool		isnull;
	int32		lowest;

	args[0] = Int32GetDatum(id);
	args[1] = Int32GetDatum(NodeShardBase());
	PreparePlan(&other_plan,
				"SELECT EXISTS (SELECT FROM sharded_seq.counter_shards"
				" WHERE counter_id OPERATOR(pg_catalog.=) $1"
				"   AND (shard OPERATOR(pg_catalog.<) $2"
				"        OR shard OPERATOR(pg_catalog.>=) ($2 OPERATOR(pg_catalog.+) 1024)))",
				2, types2);
	if (SPI_execute_plan(other_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read counter shards");
	if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot set counter \"%s\": other nodes have rows of it", name),
				 errdetail("Their increments reach this node by replication, in no order with this commit, so no total can be exact at it."),
				 errhint("Once every node's increments have arrived and none are made, add the difference with counter_incr().")));
	PreparePlan(&lock_plan,
				"SELECT pg_catalog.min(shard) FROM"
				" (SELECT shard FROM sharded_seq.counter_shards"
				"   WHERE" NODE_ROWS_SQL " FOR UPDATE) s",
				2, types2);
	if (SPI_execute_plan(lock_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lock counter shards");
	lowest = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("counter \"%s\" has no shard rows", name),
				 errhint("It was dropped meanwhile, or its rows were deleted by hand: create it again.")));
	args[2] = Int32GetDatum(lowest);
	args[3] = Int64GetDatum(value);
	PreparePlan(&set_plan,
				"UPDATE sharded_seq.counter_shards"
				"   SET value = CASE WHEN shard OPERATOR(pg_catalog.=) $3 THEN $4 ELSE 0::pg_catalog.int8 END"
				" WHERE" NODE_ROWS_SQL,
				4, types4);
	ShardRowsSql(set_plan, args, SPI_OK_UPDATE, id, "set counter");
}

/* Every row of a dropped counter, on every node (inside SPI, as the owner). */
void
ShardRowsDrop(int32 id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {INT4OID};
	Datum		args[1];

	args[0] = Int32GetDatum(id);
	PreparePlan(&plan,
				"DELETE FROM sharded_seq.counter_shards WHERE counter_id OPERATOR(pg_catalog.=) $1",
				1, types);
	ShardRowsSql(plan, args, SPI_OK_DELETE, id, "drop counter");
}

/*
 * May a node-0 session trust a pinned counter's rows to be exactly shards
 * 0 .. shards-1, as the fast read does?  Not once any node has claimed an
 * id in this database: other nodes' rows may come and go.  Checked again
 * whenever configuration may have changed; a claim made here announces
 * itself (InsertClaim).
 */
static bool
NodeRowsAlone(void)
{
	static uint64 checked_epoch = 0;
	static bool alone = false;

	if (SessionNodeId() != 0)
		return false;
	/* rows were written here from outside the engine: replication, by hand */
	if (ForeignRowsSeen())
		return false;
	if (checked_epoch != ConfigEpoch)
	{
		alone = true;
		if (NodeClaimsStored())
		{
			Relation	rel = table_open(ConfigRelid("node_claims"), AccessShareLock);
			Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
			TableScanDesc scan = table_beginscan(rel, snapshot, 0, NULL);

			alone = heap_getnext(scan, ForwardScanDirection) == NULL;
			table_endscan(scan);
			UnregisterSnapshot(snapshot);
			table_close(rel, AccessShareLock);
		}
		checked_epoch = ConfigEpoch;
	}
	return alone;
}

/*
 * Fired for every row of counter_shards written and every TRUNCATE of it,
 * and every claim changed (ENABLE ALWAYS: in logical replication's apply
 * worker too).  A shard row write marks its counter's layout word (a
 * TRUNCATE every word) before it can be seen, whoever makes it: this is
 * the net under kept totals (the rule in layout.c).  A write other
 * than the engine's own SQL (ShardWrite) also tells sessions that
 * rows may now come and go behind their back (no read from remembered
 * places any more, in this server's life when preloaded), and a changed
 * claim is checked again.
 */
PG_FUNCTION_INFO_V1(rows_changed_elsewhere);
Datum
rows_changed_elsewhere(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	bool		shards;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.rows_changed_elsewhere() must be called as a trigger"),
				 errhint("It is fired by changes to sharded_seq.counter_shards and sharded_seq.node_claims; do not call it directly.")));
	shards = RelationGetRelid(trigdata->tg_relation) == ConfigRelid("counter_shards");
	if (shards)
	{
		if (TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		{
			bool		isnull;
			Datum		id = heap_getattr(trigdata->tg_trigtuple, 1,
										  RelationGetDescr(trigdata->tg_relation), &isnull);

			if (!isnull)
				LayoutChanging(DatumGetInt32(id));
		}
		else
			LayoutChangingAll();
		if (EngineSqlWriting)
			return PointerGetDatum(NULL);
	}
	else if (InSecurityRestrictedOperation() && GetUserId() == ExtensionOwner())
	{
		/* the engine's own claim (InsertClaim), made as the owner */
		return PointerGetDatum(NULL);
	}
	NoteForeignRows();
	CacheInvalidateRelcache(trigdata->tg_relation);
	return PointerGetDatum(NULL);
}
