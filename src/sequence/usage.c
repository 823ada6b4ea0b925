/*
 * usage.c
 *	  sequence_usage(): what monitoring reads of a sequence on this server:
 *	  values handed out and reserved since the server started, the recent
 *	  rate of reservations and the highest local position its node can hand
 *	  out, behind the sequence_usage view.
 *
 * The counts are node-wide only with the library preloaded (shared memory);
 * otherwise they are NULL, as they are once the statistics table filled up.
 * Every figure is NULL to a role that may not see the sequence's positions
 * (they tell how fast others draw), unless it has the privileges of
 * pg_read_all_stats, as pg_stat_statements shows every query to it: a
 * monitoring role in pg_monitor sees every sequence.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"

#include "sequence/sequence_internal.h"

/* (handed_out, reserved, reserve_rate, local_max, high_water) of sequence id */
PG_FUNCTION_INFO_V1(sequence_usage);
Datum
sequence_usage(PG_FUNCTION_ARGS)
{
	int32		id = PG_GETARG_INT32(0);
	TupleDesc	desc;
	Datum		values[5];
	bool		nulls[5] = {true, true, true, true, true};
	int64		high;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "sequence_usage must return a row");
	if (SequenceHighWater(id, true, &high))
	{
		values[4] = Int64GetDatum(high);
		nulls[4] = false;
	}
	if (SequenceIdReadable(id) || StatsReader(GetUserId()))
	{
		int64		counts[NUM_STAT_FIELDS];

		values[3] = Int64GetDatum(NodeLocalMax());
		nulls[3] = false;

		/* unknown without preload, or once the stats table filled up */
		if (StatsReadMonitored(KIND_SEQUENCE, id, counts))
		{
			bool		has_entry;
			int64		node_out = NodeCacheValuesOut(id, &has_entry);
			double		rate;

			values[0] = Int64GetDatum(node_out + counts[STAT_SESSION_VALUES]);
			values[1] = Int64GetDatum(counts[STAT_RESERVED]);
			nulls[0] = nulls[1] = false;
			if (StatsReserveRate(id, &rate))
			{
				values[2] = Float8GetDatum(rate);
				nulls[2] = false;
			}
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
