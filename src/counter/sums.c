/*
 * sums.c
 *	  A counter's total: the sum of its shard rows as a snapshot sees them
 *	  (CounterSum), read through the index (ScanShards, rows.c), or where a
 *	  pinned counter's rows were last seen (ReadKnownRows); and totals kept
 *	  while the counter's layout word stays (KeepRows, TotalHolds; shared
 *	  through kept.c), by the rule at the top of layout.c.  Nothing here
 *	  writes.
 *
 * With node ids (topology/node.c), a total is the sum over every node's rows,
 * and nothing is remembered or kept (NodeRowsAlone).
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "storage/bufmgr.h"
#include "storage/predicate.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

static bool NodeRowsAlone(void);

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
