/*
 * apply.c
 *	  Adding an amount to a counter's rows, at commit or at a flush: trying
 *	  its shards without waiting, growing an adaptive counter by a row when
 *	  every shard is held (the LongAdder idea), adding this node's rows at its
 *	  first commit to a counter made elsewhere, and waiting only when nothing
 *	  else is left (CounterApply, CounterTryApply).  Each row is written
 *	  through rows.c (UpdateShard, InsertShardRow: ShardWrite).
 *
 * Shards are tried with heap_update(wait = false), which reports a shard
 * another transaction holds instead of waiting for it.  When every shard is
 * held, an adaptive counter gets a new row; a pinned one waits.  With node
 * ids (topology/node.c), each node writes only its own rows, numbered from its
 * NodeShardBase().
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

/* setting (defined in module.c); here, the lowest file that reads it */
int			MaxCounterShards = 16;

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

/*
 * Add delta to one shard: the preferred one if free, else the next free one;
 * with wait, when every shard is held, wait for them in turn.
 */
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
