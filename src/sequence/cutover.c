/*
 * cutover.c
 *	  A cutover from a logical-replication publisher to its subscriber: the
 *	  mark on a sequence whose configuration arrived by replication
 *	  (sequence_arrived), and the two halves of sharded_seq.cutover():
 *	  cutover() on the new primary, cutover_source() on the old one.
 *
 * A subscriber receives sequence_config and sequence_shards, but not the
 * positions of the shards (native sequences do not replicate), so it would
 * hand out again what the publisher handed out.  A row written by the apply
 * worker is therefore marked positions_unknown and refused.  cutover()
 * connects to the publisher with the subscription's connection, stops it
 * (topology/cutover.c), has it wait for transactions in flight, flush
 * write-behind amounts and report each sequence's reserved high water, waits
 * until the subscription has applied that, and then advances every sequence
 * above the old primary's high water as advance_sequence does, clearing the
 * marks, and moves object_id_seq above the ids that arrived.  A publisher
 * with this server's system identifier (itself, a pg_basebackup copy) is
 * refused: the stop it writes would stop this server too.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/logicalworker.h"
#include "replication/origin.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/pg_lsn.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "datatype/timestamp.h"

#include "sequence/sequence_internal.h"

/*
 * Fired before every row written to sequence_config (ENABLE ALWAYS), by
 * anyone: marks the config word, so no session trusts a copy made before,
 * and tells this server's sessions at commit (they cache configuration
 * until a relcache invalidation says otherwise), so a row written by hand
 * is seen as one written by the administrative functions is.  In logical
 * replication's apply or table synchronization worker, the row is also
 * marked positions_unknown.  An
 * update of a row that is not marked (this server took the sequence over:
 * cutover() ran, or it made the sequence itself) keeps the local row and
 * only marks it: the local generation lies above everything drawn here, and
 * the publisher's older one would let a later cutover start below that.
 */
PG_FUNCTION_INFO_V1(sequence_arrived);
Datum
sequence_arrived(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	HeapTuple	tup;
	int			att;
	Datum		value = BoolGetDatum(true);
	bool		isnull = false;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.sequence_arrived() must be called as a trigger"),
				 errhint("It is fired by writes to sharded_seq.sequence_config; do not call it directly.")));
	/* any row written: copies of configuration are stale (common/config_word.c) */
	ConfigChanging();
	CacheInvalidateRelcache(trigdata->tg_relation);
	tup = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? trigdata->tg_newtuple : trigdata->tg_trigtuple;
	if (!IsLogicalWorker())
		return PointerGetDatum(tup);
	att = get_attnum(RelationGetRelid(trigdata->tg_relation), "positions_unknown");
	if (att == InvalidAttrNumber)
		return PointerGetDatum(tup);
	desc = RelationGetDescr(trigdata->tg_relation);
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		bool		old_null;
		Datum		old_mark = heap_getattr(trigdata->tg_trigtuple, att, desc, &old_null);

		if (old_null || !DatumGetBool(old_mark))
		{
			ereport(LOG,
					(errmsg("sharded_seq: a replicated change of a sequence this server took over is not applied; the sequence is refused until sharded_seq.cutover() or advance_sequence()")));
			tup = trigdata->tg_trigtuple;
		}
	}
	tup = heap_modify_tuple_by_cols(tup, desc, 1, &att, &value, &isnull);
	return PointerGetDatum(tup);
}

/*
 * cutover_source(): on the old primary, after cutover_stop() committed.
 * Waits for the transactions in flight (one that began before the stop may
 * still commit an increment), flushes write-behind amounts into their rows,
 * and returns each sequence's reserved high water, read under its draw lock
 * (a reservation in progress ends first; a later one sees the stop).  Its
 * last row has a NULL name and the WAL position recorded in this server's
 * row of cutover_stops by this transaction: once that row shows it on the
 * subscriber, everything before it has been applied there.
 */
PG_FUNCTION_INFO_V1(cutover_source);
Datum
cutover_source(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	static SPIPlanPtr list_plan = NULL;
	static SPIPlanPtr row_plan = NULL;
	static SPIPlanPtr mark_plan = NULL;
	Oid			int_types[1] = {INT4OID};
	Oid			text_types[1] = {TEXTOID};
	char	   *system = CutoverSystemText();
	Datum		values[3];
	bool		nulls[3];
	OwnerContext ctx;
	int32	   *ids;
	char	  **names;
	uint64		n;
	bool		isnull;

	PreventCommandIfReadOnly("sharded_seq.cutover_source()");
	CutoverCheckPrivilege("sharded_seq.cutover_source()");
	if (!CutoverStopsStored() || !CutoverRowFor(system, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this server is not stopped by a cutover"),
				 errhint("SELECT sharded_seq.cutover_stop() first, in a transaction of its own; sharded_seq.cutover() on the subscriber calls both.")));
	if (IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("sharded_seq.cutover_source() cannot run inside a transaction block"),
				 errhint("Run it on its own: it waits for every other transaction in progress.")));
	WaitForTransactionsInFlight();
	InitMaterializedSRF(fcinfo, 0);

	/* as the caller: the amounts of the counters it may increment */
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT sharded_seq.flush_counters()", false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not flush the counters");
	SPI_finish();

	BeginAsOwner(&ctx);
	PreparePlan(&list_plan, "SELECT id, name FROM sharded_seq.sequence_config ORDER BY name", 0, NULL);
	if (SPI_execute_plan(list_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.sequence_config");
	n = SPI_processed;
	ids = palloc(sizeof(int32) * Max(n, 1));
	names = palloc(sizeof(char *) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		ids[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		names[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
	}
	PreparePlan(&row_plan,
				"SELECT generation, base, shards, block FROM sharded_seq.sequence_config"
				" WHERE id OPERATOR(pg_catalog.=) $1", 1, int_types);
	for (uint64 i = 0; i < n; i++)
	{
		Datum		args[1] = {Int32GetDatum(ids[i])};
		HeapTuple	tup;
		TupleDesc	desc;

		LockSequenceDraws(ids[i]);
		/* a fresh snapshot: a layout change we waited for is seen */
		if (SPI_execute_plan(row_plan, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read sharded_seq.sequence_config");
		if (SPI_processed == 0)
			continue;
		tup = SPI_tuptable->vals[0];
		desc = SPI_tuptable->tupdesc;
		values[0] = CStringGetTextDatum(names[i]);
		values[1] = Int64GetDatum(GenerationHighWater(ids[i],
													  DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull)),
													  DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull)),
													  DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull)),
													  DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull))));
		nulls[0] = nulls[1] = false;
		nulls[2] = true;
		values[2] = (Datum) 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}

	/* the insert position now: this transaction's commit ends above it */
	{
		Datum		args[1] = {CStringGetTextDatum(system)};

		PreparePlan(&mark_plan,
					"UPDATE sharded_seq.cutover_stops SET flushed_lsn = pg_catalog.pg_current_wal_insert_lsn()"
					" WHERE system_identifier OPERATOR(pg_catalog.=) $1 RETURNING flushed_lsn",
					1, text_types);
		if (SPI_execute_plan(mark_plan, args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING ||
			SPI_processed != 1)
			elog(ERROR, "could not record the flush of this server");
		values[2] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		nulls[0] = nulls[1] = true;
		nulls[2] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	EndAsOwner(&ctx);
	return (Datum) 0;
}

/* One sequence's high water on the old primary. */
typedef struct SourceRow
{
	char	   *name;
	int64		high;
} SourceRow;

/* Run query on the publisher; raise its error as ours. */
static WalRcvExecResult *
RemoteQuery(WalReceiverConn *conn, const char *subname, const char *query,
			int ntypes, const Oid *types)
{
	WalRcvExecResult *res = walrcv_exec(conn, query, ntypes, types);

	if (res->status != WALRCV_OK_TUPLES)
		ereport(ERROR,
				(errcode(res->sqlstate ? res->sqlstate : ERRCODE_CONNECTION_EXCEPTION),
				 errmsg("the publisher of subscription \"%s\" could not run %s: %s",
						subname, query, res->err ? res->err : "no rows"),
				 errhint("Fix the cause on the publisher and call sharded_seq.cutover() again; it may be called any number of times.")));
	return res;
}

/*
 * cutover(subscription, timeout): on the subscriber about to become the
 * primary, while the subscription to the old primary still exists.  One row
 * per sequence: its name, the old primary's reserved high water and where
 * it starts here (local positions).
 */
PG_FUNCTION_INFO_V1(cutover);
Datum
cutover(PG_FUNCTION_ARGS)
{
	char	   *subname;
	Interval   *timeout;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			subid;
	Subscription *sub;
	int64		timeout_ms;
	WalReceiverConn *volatile conn;
	char	   *err = NULL;
	char	   *volatile system = NULL;
	volatile XLogRecPtr lsn = InvalidXLogRecPtr;
	List	   *volatile rows = NIL;
	ListCell   *lc;
	char		origin_name[NAMEDATALEN];
	RepOriginId origin;
	TimestampTz start;
	OwnerContext ctx;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", PG_ARGISNULL(0) ? "subscription" : "timeout"),
				 errhint("Pass the subscription to the old primary, e.g. sharded_seq.cutover('my_subscription'); leave timeout out for 5 minutes.")));
	subname = NameStr(*PG_GETARG_NAME(0));
	timeout = PG_GETARG_INTERVAL_P(1);
	PreventCommandIfReadOnly("sharded_seq.cutover()");
	if (!CutoverStopsStored())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("sharded_seq's schema here predates cutovers"),
				 errhint("ALTER EXTENSION sharded_seq UPDATE (to 1.5 or later), then call again.")));
	subid = get_subscription_oid(subname, true);
	if (!OidIsValid(subid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("subscription \"%s\" does not exist", subname),
				 errhint("Call sharded_seq.cutover() in the subscriber's database before DROP SUBSCRIPTION; if the old primary is gone, use sharded_seq.advance_sequence() for each sequence.")));
	sub = GetSubscription(subid, false);
	if (!superuser() && !has_privs_of_role(GetUserId(), sub->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for subscription \"%s\"", subname),
				 errdetail("sharded_seq.cutover() connects to the publisher with the subscription's connection."),
				 errhint("Run it as a superuser or as the subscription's owner (who must also own every sharded sequence).")));
	if (!sub->enabled)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("subscription \"%s\" is disabled", subname),
				 errhint("ALTER SUBSCRIPTION %s ENABLE, then call again: what the old primary committed must still arrive.",
						 quote_identifier(subname))));
	timeout_ms = (timeout->time + (int64) timeout->day * USECS_PER_DAY +
				  (int64) timeout->month * DAYS_PER_MONTH * USECS_PER_DAY) / 1000;
	if (timeout_ms <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be positive"),
				 errhint("Pass how long to wait for the subscription to catch up, e.g. '5 min'.")));
	/* both waits take milliseconds in an int (statement_timeout there) */
	if (timeout_ms > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be at most %d milliseconds (about 24 days)", PG_INT32_MAX),
				 errhint("Pass how long to wait for the subscription to catch up, e.g. '5 min'; the call may be repeated.")));

	/* the old primary: stop it, then its high waters */
	load_file("libpqwalreceiver", false);
	conn = ShardedConnectAsSubscription(sub, "sharded_seq cutover", &err);
	if (conn == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
				 errmsg("could not connect to the publisher of subscription \"%s\": %s", subname, err),
				 errhint("sharded_seq.cutover() needs the old primary; if it is gone, use sharded_seq.advance_sequence() for each sequence.")));
	PG_TRY();
	{
		Oid			bool_type[1] = {BOOLOID};
		Oid			text_type[1] = {TEXTOID};
		Oid			source_types[3] = {TEXTOID, INT8OID, LSNOID};
		WalRcvExecResult *res;
		TupleTableSlot *slot;
		bool		isnull;
		bool		has;
		TimeLineID	tli;
		char	   *remote_system = walrcv_identify_system(conn, &tli);

		/*
		 * The stop is keyed by the system identifier: written on this server
		 * or on a physical copy of it (pg_basebackup), it would stop this
		 * server too once it replicates here.
		 */
		if (strcmp(remote_system, CutoverSystemText()) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the publisher of subscription \"%s\" has this server's system identifier %s",
							subname, remote_system),
					 errdetail("It is this server or a physical copy of it (pg_basebackup); the stop sharded_seq.cutover() writes there would stop this server too."),
					 errhint("A physical copy holds the shard positions as of the copy only: stop the writes on the old primary, then for each sequence SELECT sharded_seq.advance_sequence(name, past => <its reserved_high_water in sharded_seq.sequences there>).")));

		res = RemoteQuery(conn, subname,
						  "SELECT pg_catalog.to_regprocedure('sharded_seq.cutover_source()') IS NOT NULL",
						  1, bool_type);
		slot = MakeSingleTupleTableSlot(res->tupledesc, &TTSOpsMinimalTuple);
		has = tuplestore_gettupleslot(res->tuplestore, true, false, slot) &&
			DatumGetBool(slot_getattr(slot, 1, &isnull)) && !isnull;
		ExecDropSingleTupleTableSlot(slot);
		walrcv_clear_result(res);
		if (!has)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("the publisher of subscription \"%s\" has no sharded_seq 1.5 or later", subname),
					 errdetail("A cutover needs sharded_seq.cutover_source() on the old primary too."),
					 errhint("Run ALTER EXTENSION sharded_seq UPDATE on the publisher, then call sharded_seq.cutover() again.")));

		/* the wait for transactions in flight there is bounded too */
		res = RemoteQuery(conn, subname,
						  psprintf("SELECT pg_catalog.set_config('statement_timeout', '" INT64_FORMAT "', false)",
								   timeout_ms),
						  1, text_type);
		walrcv_clear_result(res);

		/*
		 * If this call is cancelled or fails, the disconnect below closes
		 * the connection, but the backend there notices only when it checks
		 * the socket: have it check every second while it waits.  Best
		 * effort (not every platform supports it).
		 */
		res = walrcv_exec(conn, "SELECT pg_catalog.set_config('client_connection_check_interval', '1000', false)",
						  1, text_type);
		walrcv_clear_result(res);

		res = RemoteQuery(conn, subname, "SELECT sharded_seq.cutover_stop()", 1, text_type);
		slot = MakeSingleTupleTableSlot(res->tupledesc, &TTSOpsMinimalTuple);
		if (tuplestore_gettupleslot(res->tuplestore, true, false, slot))
			system = TextDatumGetCString(slot_getattr(slot, 1, &isnull));
		ExecDropSingleTupleTableSlot(slot);
		walrcv_clear_result(res);

		res = RemoteQuery(conn, subname,
						  "SELECT sequence_name, high_water, flushed_lsn FROM sharded_seq.cutover_source()",
						  3, source_types);
		slot = MakeSingleTupleTableSlot(res->tupledesc, &TTSOpsMinimalTuple);
		while (tuplestore_gettupleslot(res->tuplestore, true, false, slot))
		{
			Datum		d = slot_getattr(slot, 1, &isnull);

			if (isnull)
			{
				lsn = DatumGetLSN(slot_getattr(slot, 3, &isnull));
				continue;
			}
			{
				SourceRow  *row = palloc(sizeof(SourceRow));

				row->name = TextDatumGetCString(d);
				row->high = DatumGetInt64(slot_getattr(slot, 2, &isnull));
				rows = lappend(rows, row);
			}
		}
		ExecDropSingleTupleTableSlot(slot);
		walrcv_clear_result(res);
	}
	PG_FINALLY();
	{
		walrcv_disconnect(conn);
	}
	PG_END_TRY();
	if (system == NULL || XLogRecPtrIsInvalid(lsn))
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("the publisher of subscription \"%s\" did not report where to wait", subname),
				 errhint("Check that the publisher runs the same sharded_seq version as this server.")));

	/*
	 * Wait until the subscription has applied the transaction that recorded
	 * lsn: its origin is past lsn, and the publisher's row here shows it.
	 */
	snprintf(origin_name, sizeof(origin_name), "pg_%u", subid);
	start = GetCurrentTimestamp();
	for (;;)
	{
		XLogRecPtr	flushed = InvalidXLogRecPtr;

		origin = replorigin_by_name(origin_name, true);
		if (origin != InvalidRepOriginId && replorigin_get_progress(origin, true) >= lsn &&
			CutoverRowFor(system, &flushed) && flushed >= lsn)
			break;
		if (TimestampDifferenceExceeds(start, GetCurrentTimestamp(), (int) Min(timeout_ms, PG_INT32_MAX)))
			ereport(ERROR,
					(errcode(ERRCODE_QUERY_CANCELED),
					 errmsg("subscription \"%s\" did not apply the old primary's changes up to %X/%X in time",
							subname, LSN_FORMAT_ARGS(lsn)),
					 errdetail("The old primary stays stopped; sharded_seq.cutover_resume() there undoes it."),
					 errhint("Check that the subscription's worker runs (pg_stat_subscription) and that its publication includes sharded_seq.cutover_stops (FOR ALL TABLES does), then call sharded_seq.cutover() again, with a longer timeout.")));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 50,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}

	/* every sequence above what the old primary reserved, as advance_sequence does */
	InitMaterializedSRF(fcinfo, 0);
	BeginAsOwner(&ctx);
	foreach(lc, rows)
	{
		SourceRow  *row = lfirst(lc);
		Datum		values[3];
		bool		nulls[3] = {false, false, false};
		int64		new_start;

		if (row->high == PG_INT64_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
					 errmsg("sharded sequence \"%s\" has reached its maximum value", row->name),
					 errhint("Values never wrap around; move to a new sequence.")));
		if (!AdvanceSequenceAbove(&ctx, row->name, row->high + 1, &new_start))
		{
			ereport(NOTICE,
					(errmsg("sharded sequence \"%s\" of the publisher does not exist here; skipped", row->name)));
			continue;
		}
		values[0] = CStringGetTextDatum(row->name);
		values[1] = Int64GetDatum(row->high);
		values[2] = Int64GetDatum(new_start);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	/* the publisher's object ids are in the config rows here now */
	AdvanceObjectIds();
	/* this server's counters are its own from now on (CutoverAwaited) */
	CutoverRecordDone(subid);
	/* what arrived but the publisher no longer has stays refused (read after the advances) */
	CommandCounterIncrement();
	if (SPI_execute("SELECT name FROM sharded_seq.sequence_config WHERE positions_unknown ORDER BY name",
					false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.sequence_config");
	for (uint64 i = 0; i < SPI_processed; i++)
		ereport(WARNING,
				(errmsg("sharded sequence \"%s\" stays refused: the publisher did not report it",
						SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1)),
				 errhint("SELECT sharded_seq.advance_sequence('%s', past => <the highest value handed out>) once you know it.",
						 SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1))));
	EndAsOwner(&ctx);
	return (Datum) 0;
}
