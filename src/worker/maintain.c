/*
 * maintain.c
 *	  sharded_seq.maintain(): reaps the native sequences of retired sequence
 *	  generations (src/sequence/) and folds and gathers counter rows
 *	  (src/counter/).  The worker runs it every round; a DBA may call it.
 *
 * One maintain() runs at a time per database: another one running does
 * the work, so a second call returns at once with zeros.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"

#include "worker/worker_internal.h"

PG_FUNCTION_INFO_V1(maintain);
Datum
maintain(PG_FUNCTION_ARGS)
{
	OwnerContext ctx;
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			folded;
	int			gathered;
	int			reaped;
	int32		base;

	PreventCommandIfReadOnly("sharded_seq.maintain()");
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "maintain() must return a record");

	/* this node's rows only; a node whose claim is not ours does nothing */
	base = NodeShardBase();

	/* one maintain() at a time; another one running does the work */
	if (!ConditionalLockDatabaseObject(ConfigRelid("maintenance"), 0, 0, ExclusiveLock))
	{
		values[0] = values[1] = values[2] = Int32GetDatum(0);
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
	}

	BeginAsOwner(&ctx);
	reaped = ReapShards();
	EndAsOwner(&ctx);
	CounterMaintain(base, &folded, &gathered);

	values[0] = Int32GetDatum(folded);
	values[1] = Int32GetDatum(gathered);
	values[2] = Int32GetDatum(reaped);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
