/*
 * maintain.c
 *	  The counter part of sharded_seq.maintain() (src/worker/maintain.c):
 *	  folds the idle rows of adaptive counters back, and gathers counters
 *	  whose rows have spread over many pages.
 *
 * Each counter is handled in a subtransaction of its own, with no waiting:
 * a counter with a row held or changed meanwhile is left for the next run.
 * So maintain() is safe at any moment, next to increments and reads, and no
 * total ever changes (see MaintainCounterRows in rows.c).
 *
 * A row is idle if no transaction updated it since the previous fold pass,
 * which sharded_seq.maintenance records (time and transaction counter).  A
 * fold pass runs at most once per sharded_seq.counter_fold_after, so rows are
 * folded after one to two such periods without an update.
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "counter/counter_internal.h"

/* settings (defined in module.c) */
int			CounterFoldAfter = 60;

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
