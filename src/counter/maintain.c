/*
 * maintain.c
 *	  The counter part of sharded_seq.maintain() (src/worker/maintain.c):
 *	  folds the idle rows of adaptive counters back, and gathers counters
 *	  whose rows have spread over many pages.
 *
 * Each counter is handled in a subtransaction of its own, with no waiting:
 * a counter with a row held or changed meanwhile is left for the next run.
 * So maintain() is safe at any moment, next to increments and reads, and no
 * total ever changes (see MaintainCounterRows below).  Rows are deleted,
 * added to and added through rows.c (ShardWrite), as every write of them.
 *
 * A row is idle if no transaction updated it since the previous fold pass,
 * which sharded_seq.maintenance records (time and transaction counter).  A
 * fold pass runs at most once per sharded_seq.counter_fold_after, so rows are
 * folded after one to two such periods without an update.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "counter/counter_internal.h"

/* settings (defined in module.c) */
int			CounterFoldAfter = 60;

typedef enum MaintainResult
{
	MAINTAIN_NOTHING,
	MAINTAIN_FOLDED,			/* idle rows folded into one (perhaps gathered too) */
	MAINTAIN_GATHERED,			/* rows rewritten together */
	MAINTAIN_BUSY				/* a row was held or changed: undo, try later */
} MaintainResult;

typedef struct Candidate
{
	int32		id;
	bool		adaptive;
} Candidate;

/*
 * Counters with more than one row of this node, whose rows start at base
 * (inside SPI, as the owner), copied into the caller's memory context.
 */
static Candidate *
ListCandidates(MemoryContext cxt, int32 base, int *n)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr plan_12 = NULL;
	Oid			types[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(base)};
	Candidate  *list;

	/*
	 * A node's first row is always there, so the partial index on rows
	 * other than each node's first (shard % 1024 <> 0) holds only the
	 * counters that have several rows on some node.  Schema 1.2's is on
	 * shard <> 0, and knows node 0 only.
	 */
	if (NodeClaimsStored())
		PreparePlan(&plan,
					"SELECT m.counter_id, c.shards IS NULL"
					"  FROM (SELECT DISTINCT s.counter_id FROM sharded_seq.counter_shards s"
					"         WHERE (s.shard OPERATOR(pg_catalog.%) 1024) OPERATOR(pg_catalog.<>) 0"
					"           AND s.shard OPERATOR(pg_catalog.>) $1"
					"           AND s.shard OPERATOR(pg_catalog.<) ($1 OPERATOR(pg_catalog.+) 1024)) m"
					"  JOIN sharded_seq.counter_config c ON c.id OPERATOR(pg_catalog.=) m.counter_id"
					" ORDER BY 1", 1, types);
	else
		PreparePlan(&plan_12,
					"SELECT m.counter_id, c.shards IS NULL"
					"  FROM (SELECT DISTINCT s.counter_id FROM sharded_seq.counter_shards s"
					"         WHERE s.shard OPERATOR(pg_catalog.<>) 0) m"
					"  JOIN sharded_seq.counter_config c ON c.id OPERATOR(pg_catalog.=) m.counter_id"
					" ORDER BY 1", 0, NULL);
	if (SPI_execute_plan(NodeClaimsStored() ? plan : plan_12, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list counters with several rows");
	*n = (int) SPI_processed;
	list = MemoryContextAlloc(cxt, Max(*n, 1) * sizeof(Candidate));
	for (int i = 0; i < *n; i++)
	{
		bool		isnull;

		list[i].id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		list[i].adaptive = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull));
	}
	return list;
}

/*
 * Is a fold pass due?  If so, *idle_before is the transaction counter the
 * previous pass recorded (invalid on the first pass, which only records).
 */
static bool
FoldPassDue(TransactionId *idle_before)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(CounterFoldAfter)};
	bool		isnull;
	int64		previous;
	FullTransactionId next = ReadNextFullTransactionId();

	PreparePlan(&plan,
				"SELECT fold_xid FROM sharded_seq.maintenance"
				" WHERE pg_catalog.now() OPERATOR(pg_catalog.-) fold_at"
				"       OPERATOR(pg_catalog.>=) pg_catalog.make_interval(secs => $1)",
				1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.maintenance");
	if (SPI_processed == 0)
		return false;
	previous = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));

	/* a mark 2^31 transactions old cannot be compared with a row's xmin */
	*idle_before = InvalidTransactionId;
	if (previous > 0 &&
		U64FromFullTransactionId(next) - (uint64) previous < (uint64) 1 << 31)
		*idle_before = XidFromFullTransactionId(FullTransactionIdFromU64((uint64) previous));
	return true;
}

/*
 * Record this pass.  The mark is taken after our own writes, so that a row
 * this pass folded into counts as idle next time unless someone updates it.
 */
static void
RecordFoldPass(void)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {INT8OID};
	Datum		args[1];

	args[0] = Int64GetDatum((int64) U64FromFullTransactionId(ReadNextFullTransactionId()));
	PreparePlan(&plan,
				"UPDATE sharded_seq.maintenance SET fold_at = pg_catalog.now(), fold_xid = $1",
				1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not update sharded_seq.maintenance");
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
static MaintainResult
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

/*
 * maintain()'s counter part (src/worker/maintain.c), with the maintenance
 * lock held: folds and gathers this node's rows, whose shards start at base.
 */
void
CounterMaintain(int32 base, int *folded, int *gathered)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	OwnerContext ctx;
	Candidate  *list;
	int			n;
	bool		fold;
	TransactionId idle_before = InvalidTransactionId;

	*folded = *gathered = 0;
	BeginAsOwner(&ctx);
	fold = FoldPassDue(&idle_before);
	list = ListCandidates(cxt, base, &n);
	EndAsOwner(&ctx);

	for (int i = 0; i < n; i++)
	{
		MaintainResult r;

		CHECK_FOR_INTERRUPTS();
		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(cxt);
		r = MaintainCounterRows(list[i].id, base,
								fold && list[i].adaptive && TransactionIdIsValid(idle_before),
								idle_before);
		if (r == MAINTAIN_BUSY)
			RollbackAndReleaseCurrentSubTransaction();
		else
			ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		*folded += (r == MAINTAIN_FOLDED);
		*gathered += (r == MAINTAIN_GATHERED);
	}

	if (fold)
	{
		BeginAsOwner(&ctx);
		RecordFoldPass();
		EndAsOwner(&ctx);
	}
}
