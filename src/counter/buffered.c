/*
 * buffered.c
 *	  Mode 'buffered': a commit's amount waits in the shared-memory slot table
 *	  (slots.c) and the worker, or flush_counters(), moves it into the rows.
 *	  The commit side is the engine's (engine.c reserves a slot at
 *	  PRE_COMMIT); this file is the flush side.
 *
 * Mode 'memcached' stages amounts in the same slot table while the worker
 * batches them to memcached (memcached.c); an amount still there when
 * memcached is down, or when the counter left that mode, is flushed here.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"

#include "counter/counter_internal.h"

/*
 * Move a counter's shared-memory amount into its rows, in this transaction;
 * given back if it rolls back.  Without wait, a counter whose rows are all
 * held gets its amount back at once and -1 is returned.  Returns the amount
 * moved.
 */
int64
BufferedFlush(int32 counter_id, const char *name, bool wait)
{
	int64		amount = SlotTake(ConfigRelid("counter_config"), counter_id);
	int32		shard = (int32) (MyProcPid % SHARDED_SEQ_MAX_SHARDS);
	bool		gone = false;

	if (amount == 0)
		return 0;
	/* t/shutdown_flush.pl holds a flush here: it took the amount */
	WAIT_POINT_HOLDING_INTERRUPTS("buffered-flush-taken");
	/* see rows this command already changed (a flush of both kinds, say) */
	CommandCounterIncrement();
	if (wait)
		gone = !CounterApply(counter_id, shard, amount, name, NULL, 0);
	else
	{
		switch (CounterTryApply(counter_id, shard, amount))
		{
			case APPLY_DONE:
				gone = false;
				break;
			case APPLY_GONE:
				gone = true;
				break;
			case APPLY_FULL:
				ereport(ERROR,
						(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
						 errmsg("counter \"%s\" would overflow bigint", name),
						 errhint("Its amount stays in shared memory.  Bring its total down with a negative increment.")));
				break;
			case APPLY_BUSY:
				/* the caller rolls back its subtransaction, which gives it back */
				return -1;
		}
	}
	if (gone)
	{
		/* the counter is gone: what it held belongs to nothing now */
		ereport(LOG,
				(errmsg("sharded_seq: " INT64_FORMAT " committed increments of counter \"%s\" will not be counted: the counter was dropped",
						amount, name)));
		return 0;
	}
	StatsCount(KIND_COUNTER, counter_id, STAT_FLUSHES, 1);
	return amount;
}
