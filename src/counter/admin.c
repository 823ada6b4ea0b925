/*
 * admin.c
 *	  Administration of counters: create, alter (shards and mode, online),
 *	  set (the total, exactly at commit), drop, grant and revoke,
 *	  flush_counters, and the functions behind the counters view.
 *
 * Each function acts as the extension owner inside SPI (common/privileges.c), after
 * checking the caller's rights on the counter itself.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "counter/counter_internal.h"

/* The name to store for a mode a caller gave, as the schema in force spells it. */
static const char *
StoredMode(const char *mode)
{
	if (strcmp(mode, "exact") == 0)
		return "exact";
	if (strcmp(mode, "memcached") == 0)
	{
		McRequireBuilt("mode 'memcached'");
		return StoredModeName(MODE_MEMCACHED);
	}
	if (strcmp(mode, "buffered") == 0)
	{
		/* before ALTER EXTENSION UPDATE to 1.3, 'buffered' keeps its old meaning */
		if (!WriteBehindModesSplit())
		{
			McRequireBuilt("mode 'buffered' (memcached before the update to 1.3)");
			return "buffered";
		}
		if (!SlotsAvailable())
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("mode 'buffered' needs sharded_seq in shared_preload_libraries"),
					 errdetail("Buffered counters keep committed increments in shared memory, which only a preloaded library has."),
					 errhint("Add sharded_seq to shared_preload_libraries and restart the server, or use mode 'memcached' or 'exact'.")));
		return "buffered";
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown counter mode \"%s\"", mode),
			 errhint("mode must be 'exact', 'buffered' or 'memcached'.")));
	return NULL;				/* keep the compiler quiet */
}

typedef struct CounterRow
{
	int32		id;
	int32		shards;
	Oid			owner;
	Acl		   *acl;
} CounterRow;

/* Row-lock and return an owned counter (inside SPI, as the owner). */
static void
FetchOwnedCounter(Oid caller, const char *name, CounterRow *row)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		acl;

	PreparePlan(&plan,
				"SELECT id, shards, owner::pg_catalog.oid, acl FROM sharded_seq.counter_config"
				" WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE", 1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.counter_config");
	if (SPI_processed == 0)
		ReportNotFound(KIND_COUNTER, name);
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	row->id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	row->shards = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	if (isnull)
		row->shards = 0;		/* adaptive */
	row->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
	acl = SPI_getbinval(tup, desc, 4, &isnull);
	row->acl = isnull ? NULL : DatumGetAclP(acl);
	CheckOwnership(KIND_COUNTER, name, row->owner, caller);
}

/*
 * Wait for transactions that are handing this counter's amounts to
 * memcached at commit, and keep new ones out until this transaction ends.
 */
static void
LockCounterCommits(int32 counter_id)
{
	LockDatabaseObject(ConfigRelid("counter_config"), counter_id, 0, ExclusiveLock);
}

static void
ExecOrFail(SPIPlanPtr plan, Datum *args, int expected, const char *what)
{
	if (SPI_execute_plan(plan, args, NULL, false, 0) != expected)
		elog(ERROR, "could not %s", what);
}

PG_FUNCTION_INFO_V1(create_counter);
Datum
create_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	int32		shards = PG_ARGISNULL(1) ? DefaultCounterShards : PG_GETARG_INT32(1);
	const char *mode;
	OwnerContext ctx;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("mode must not be null"),
				 errhint("Leave mode out to create an exact counter.")));
	if (!PG_ARGISNULL(1))
		ValidateShards(shards, KIND_COUNTER);
	mode = StoredMode(text_to_cstring(PG_GETARG_TEXT_PP(2)));
	PreventCommandIfReadOnly("sharded_seq.create_counter()");

	BeginAsOwner(&ctx);
	if (!InsertCounter(name, shards, mode, ctx.caller, true))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("counter \"%s\" already exists", name),
				 errhint("Use sharded_seq.alter_counter() to change it, or choose another name.")));
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_COUNTER, "create");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(alter_counter);
Datum
alter_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	static SPIPlanPtr config_plan = NULL;
	Oid			types2[2] = {INT4OID, INT4OID};
	OwnerContext ctx;
	CounterRow	row;
	int32		shards;			/* the layout wanted: 0 is adaptive */
	/* schema 1.1 declares three arguments until ALTER EXTENSION UPDATE */
	bool		adaptive_given = PG_NARGS() > 3 && !PG_ARGISNULL(3);
	bool		layout_given = !PG_ARGISNULL(1) || adaptive_given;
	const char *mode = NULL;

	if (!PG_ARGISNULL(1))
		ValidateShards(PG_GETARG_INT32(1), KIND_COUNTER);
	if (!PG_ARGISNULL(1) && adaptive_given && PG_GETARG_BOOL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a counter cannot be adaptive with a fixed number of shards"),
				 errhint("Pass shards => n to pin the layout, or adaptive => true alone to let it grow.")));
	if (!PG_ARGISNULL(2))
		mode = StoredMode(text_to_cstring(PG_GETARG_TEXT_PP(2)));
	PreventCommandIfReadOnly("sharded_seq.alter_counter()");

	BeginAsOwner(&ctx);
	FetchOwnedCounter(ctx.caller, name, &row);
	if (mode != NULL)
	{
		static SPIPlanPtr mode_plan = NULL;
		Oid			mode_types[2] = {INT4OID, TEXTOID};
		Datum		mode_args[2] = {Int32GetDatum(row.id), CStringGetTextDatum(mode)};
		bool		leaves_memcached = ParseCounterMode(mode, strlen(mode)) != MODE_MEMCACHED;
		CounterConfigRow config;

		/*
		 * Leaving mode 'memcached': once no commit can still add to memcached,
		 * move what it holds into the rows.  A shared-memory slot needs
		 * nothing: the worker flushes it whatever the mode.
		 */
		/* what memcached holds must move, or the counter stays */
		if (leaves_memcached && FetchCounterConfig(NULL, row.id, &config) &&
			config.mode == MODE_MEMCACHED)
			McRequireReachable("change the mode of", name);
		if (leaves_memcached)
			LockCounterCommits(row.id);
		if (leaves_memcached && McEnabled() &&
			MemcachedFlush(row.id, 0, name, true) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not flush counter \"%s\" before leaving mode 'memcached'", name),
					 errhint("Check sharded_seq.memcached_servers(), or try again.")));
		PreparePlan(&mode_plan,
					"UPDATE sharded_seq.counter_config SET mode = $2, altered_at = pg_catalog.now()"
					" WHERE id OPERATOR(pg_catalog.=) $1 AND mode OPERATOR(pg_catalog.<>) $2",
					2, mode_types);
		ExecOrFail(mode_plan, mode_args, SPI_OK_UPDATE, "change counter mode");
		if (SPI_processed > 0)
			AnnounceConfigChange("counter_config");
	}
	if (!layout_given)
	{
		EndAsOwner(&ctx);
		ClusterAdminRecord(fcinfo, KIND_COUNTER, "change");
		PG_RETURN_VOID();
	}

	/* growing commits and maintain() stay out from here on */
	LockCounterCommits(row.id);
	if (!PG_ARGISNULL(1))
		shards = PG_GETARG_INT32(1);
	else if (PG_GETARG_BOOL(3))
		shards = AdaptiveCountersStored() ? 0 : row.shards;
	else
		shards = row.shards ? row.shards : Max(ShardRowsCount(row.id), 1);
	/* a layout another node set already: this node's rows may still differ */
	if (shards != 0 && (shards != row.shards || ShardRowsCount(row.id) != shards))
		ShardRowsRebuild(row.id, shards);
	if (shards != row.shards)
	{
		Datum		args[2] = {Int32GetDatum(row.id), Int32GetDatum(shards)};

		PreparePlan(&config_plan,
					"UPDATE sharded_seq.counter_config SET shards = CASE WHEN $2 OPERATOR(pg_catalog.=) 0 THEN NULL ELSE $2 END, altered_at = pg_catalog.now()"
					" WHERE id OPERATOR(pg_catalog.=) $1", 2, types2);
		ExecOrFail(config_plan, args, SPI_OK_UPDATE, "update counter");
		AnnounceConfigChange("counter_config");
	}
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_COUNTER, "change");
	PG_RETURN_VOID();
}

/* How long set_counter waits for commits and flushes holding the slot. */
#define SET_SLOT_WAIT_MS	10000

/*
 * Row-lock a counter for set_counter and check the caller's rights: its
 * owner, or a role with both update (it overwrites) and select (it says
 * nothing new, but a set is a read of the future total).  Inside SPI, as
 * the owner.
 */
static CounterMode
FetchCounterForSet(Oid caller, const char *name, CounterRow *row)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		acl;
	char	   *mode;

	PreparePlan(&plan,
				"SELECT id, owner::pg_catalog.oid, acl, mode FROM sharded_seq.counter_config"
				" WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE", 1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.counter_config");
	if (SPI_processed == 0)
		ReportNotFound(KIND_COUNTER, name);
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	row->id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	row->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
	acl = SPI_getbinval(tup, desc, 3, &isnull);
	row->acl = isnull ? NULL : DatumGetAclP(acl);
	mode = SPI_getvalue(tup, desc, 4);
	if (!has_privs_of_role(caller, row->owner) &&
		!(HasPrivilege(row->owner, row->acl, caller, ACL_UPDATE) &&
		  HasPrivilege(row->owner, row->acl, caller, ACL_SELECT)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for counter \"%s\"", name),
				 errdetail("Setting a counter needs its ownership, or both update and select on it."),
				 errhint("The owner can run sharded_seq.grant_counter('%s', '%s', 'all').",
						 name, GetUserNameFromId(caller, false))));
	return ParseCounterMode(mode, strlen(mode));
}

/* An error while a set waits: a deadlock is explained (see set_counter). */
static void
SetErrorCallback(void *arg)
{
	const char *name = (const char *) arg;

	if (geterrcode() == ERRCODE_T_R_DEADLOCK_DETECTED)
		errhint("This transaction set a counter with a higher id before \"%s\", and commits take counters in ascending id: set counters one per transaction, or in the order they were created (ascending id).  See server log for query details.",
				name);
}

/*
 * set_counter(name, total): the counter's committed total is total at this
 * transaction's commit, whatever its mode.  Amounts committed before are
 * absorbed: those in the rows are overwritten, those waiting in shared
 * memory or memcached are taken out (given back if this transaction or
 * savepoint rolls back); commits from now on wait for the rows, or for the
 * counter's commit lock, and count on top.  This transaction's own
 * increments before the call are absorbed too, those after it count on top.
 * The argument is in src/counter/README.md ("Setting a counter").
 */
PG_FUNCTION_INFO_V1(set_counter);
Datum
set_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	int64		total;
	int128		rows;
	OwnerContext ctx;
	CounterRow	row;
	CounterMode mode;
	int			wait_ms;
	int32		above;
	ErrorContextCallback errcb;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("total must not be null"),
				 errhint("Pass the total the counter should have, such as a count(*) of what it counts.")));
	total = PG_GETARG_INT64(1);
	PreventCommandIfReadOnly("sharded_seq.set_counter()");
	PreventCommandIfParallelMode("sharded_seq.set_counter()");
	/* the rows are read and locked with statement snapshots: see every commit before the lock */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("sharded_seq.set_counter() needs isolation level read committed"),
				 errdetail("A transaction snapshot would not see shard rows added by commits after it, and the total would miss them."),
				 errhint("Call it in a read committed transaction (the default).")));
	if (CitusGroup() >= 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot set a counter in a Citus cluster"),
				 errdetail("Every node writes its own rows, and no transaction here can hold the other nodes' commits back."),
				 errhint("Once no node increments it, add the difference with counter_incr().")));
	if (SessionNodeId() > 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot set a counter with sharded_seq.node_id set (%d here)", SessionNodeId()),
				 errdetail("Other nodes' increments reach this node by replication, in no order with this commit, so no total can be exact at it."),
				 errhint("Once every node's increments have arrived and none are made, add the difference with counter_incr().")));
	/* its commit writes this node's rows: refuse now if they are not ours */
	NodeClaimCheck();
	/* a cutover stopped this server, or one is awaited here */
	CutoverCounterCheck();

	BeginAsOwner(&ctx);
	mode = FetchCounterForSet(ctx.caller, name, &row);
	if (mode == MODE_MEMCACHED)
		McRequireReachable("set", name);

	/*
	 * Commits take their counters' locks, pins and rows in ascending id, and
	 * so does one set; sets in one transaction take theirs in call order.
	 * A set below a counter this transaction set already can therefore wait
	 * for a commit that waits for this transaction: say so when that fails.
	 */
	above = CounterSetAbove(row.id);
	if (above != 0)
	{
		errcb.callback = SetErrorCallback;
		errcb.arg = name;
		errcb.previous = error_context_stack;
		error_context_stack = &errcb;
	}

	/*
	 * Wait for commits handing amounts to memcached (they hold the lock
	 * until they have), and keep new ones, growing commits and maintain()
	 * out until this transaction ends.
	 */
	LockCounterCommits(row.id);

	/*
	 * Shared memory: freeze the slot, so that commits go to the rows (and
	 * wait there for this transaction), and wait for those already adding;
	 * then take what it holds into the rows, where it is overwritten.
	 */
	wait_ms = LockTimeout > 0 ? Min(LockTimeout, SET_SLOT_WAIT_MS) : SET_SLOT_WAIT_MS;
	switch (SlotFreeze(row.id, wait_ms))
	{
		case SLOT_FROZEN:
			break;
		case SLOT_NONE:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("cannot set counter \"%s\": the shared-memory slot table is full", name),
					 errhint("Try again once the worker has flushed and freed idle slots, or raise sharded_seq.buffered_slots.")));
			break;
		case SLOT_BUSY:
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("cannot set counter \"%s\": commits to it did not finish within %d ms", name, wait_ms),
					 errdetail("A commit or flush holding the counter's shared-memory amount may be waiting for a lock this transaction holds."),
					 above != 0 ?
					 errhint("This transaction set a counter with a higher id first, and commits take counters in ascending id: set counters one per transaction, or in the order they were created (ascending id).") :
					 errhint("Call sharded_seq.set_counter() in a transaction of its own, and try again.")));
			break;
	}
	(void) BufferedFlush(row.id, name, true);
	if (SlotPending(row.id) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot set counter \"%s\": its worker is stopping", name),
				 errdetail("Its shared-memory amount is left for the worker's last flush."),
				 errhint("Try again once the server has restarted.")));

	/*
	 * memcached: take what it holds into the rows, where it is overwritten.
	 * Read on this backend's connection: amounts that forwards and commits
	 * wrote on theirs before letting go of the locks waited for above were
	 * read back there first (ConfirmDelivered; the window left open is in
	 * src/counter/README.md).
	 */
	if (mode == MODE_MEMCACHED && McEnabled())
	{
		int32		shard = (int32) (MyProcPid % SHARDED_SEQ_MAX_SHARDS);
		int64		moved;

		while ((moved = MemcachedFlush(row.id, shard, name, true)) > 0)
			;
		if (moved < 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("cannot set counter \"%s\": memcached cannot be read", name),
					 errdetail("Its amount in memcached would count on top of the total once memcached is back."),
					 errhint("Try again when sharded_seq.memcached_servers can be reached; if memcached lost its data, point that setting at a fresh memcached.")));
	}

	/*
	 * Leftovers, amounts a session could not hand to memcached after its
	 * commit: this session's are absorbed here; another's, which no one
	 * else sees, carry the set count of their commit and are dropped when
	 * written after it moved.  The count moves with this commit, and is
	 * announced, so that commits waiting for the counter's lock read it
	 * afresh.
	 */
	MemcachedAbsorbLeftovers(row.id);
	if (CounterSetsStored())
	{
		static SPIPlanPtr sets_plan = NULL;
		Oid			sets_types[1] = {INT4OID};
		Datum		sets_args[1] = {Int32GetDatum(row.id)};

		PreparePlan(&sets_plan,
					"INSERT INTO sharded_seq.counter_sets AS s (counter_id, sets) VALUES ($1, 1)"
					" ON CONFLICT (counter_id) DO UPDATE SET sets = s.sets OPERATOR(pg_catalog.+) 1",
					1, sets_types);
		ExecOrFail(sets_plan, sets_args, SPI_OK_INSERT, "count the set");
		AnnounceConfigChange("counter_config");
	}

	/* this transaction's own amounts before the call are absorbed: its commit adds them */
	rows = (int128) total - CounterPendingInXact(row.id);
	if (rows > PG_INT64_MAX || rows < PG_INT64_MIN)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("cannot set counter \"%s\" to " INT64_FORMAT ": out of range with this transaction's increments", name, total),
				 errdetail("This transaction's earlier increments of it, which the total absorbs, take its rows beyond bigint."),
				 errhint("Set it in a transaction of its own.")));
	CommandCounterIncrement();
	ShardRowsSet(row.id, (int64) rows, name);
	if (above != 0)
		error_context_stack = errcb.previous;
	CounterSetInXact(row.id);
	EndAsOwner(&ctx);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(drop_counter);
Datum
drop_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	OwnerContext ctx;
	CounterRow	row;
	Datum		args[1];

	PreventCommandIfReadOnly("sharded_seq.drop_counter()");
	BeginAsOwner(&ctx);
	FetchOwnedCounter(ctx.caller, name, &row);
	args[0] = Int32GetDatum(row.id);
	LockCounterCommits(row.id);
	CounterDroppedInXact(row.id);
	/* the config row first, then the rows: the order a subscriber applies them in */
	PreparePlan(&plan,
				"DELETE FROM sharded_seq.counter_config WHERE id OPERATOR(pg_catalog.=) $1",
				1, argtypes);
	ExecOrFail(plan, args, SPI_OK_DELETE, "drop counter");
	if (CounterSetsStored())
	{
		static SPIPlanPtr sets_plan = NULL;

		PreparePlan(&sets_plan,
					"DELETE FROM sharded_seq.counter_sets WHERE counter_id OPERATOR(pg_catalog.=) $1",
					1, argtypes);
		if (SPI_execute_plan(sets_plan, args, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not drop the counter's set count");
	}
	ShardRowsDrop(row.id);
	AnnounceConfigChange("counter_config");
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_COUNTER, "drop");
	PG_RETURN_VOID();
}

static void
ChangeCounterAcl(FunctionCallInfo fcinfo, bool grant)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[2] = {INT4OID, ACLITEMARRAYOID};
	OwnerContext ctx;
	CounterRow	row;
	Datum		args[2];
	char	   *grantee;
	char	   *privilege;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("grantee and privilege must not be null"),
				 errhint("Name a role (or 'public') and a privilege: 'select', 'update' or 'all'.")));
	grantee = text_to_cstring(PG_GETARG_TEXT_PP(1));
	privilege = text_to_cstring(PG_GETARG_TEXT_PP(2));
	PreventCommandIfReadOnly("sharded_seq.grant_counter()");

	BeginAsOwner(&ctx);
	FetchOwnedCounter(ctx.caller, name, &row);
	args[0] = Int32GetDatum(row.id);
	args[1] = PointerGetDatum(ChangeAcl(KIND_COUNTER, name, row.owner, row.acl,
										grantee, privilege, grant));
	PreparePlan(&plan, "UPDATE sharded_seq.counter_config SET acl = $2 WHERE id OPERATOR(pg_catalog.=) $1",
				2, argtypes);
	ExecOrFail(plan, args, SPI_OK_UPDATE, "change counter privileges");
	AnnounceConfigChange("counter_config");
	EndAsOwner(&ctx);
}

PG_FUNCTION_INFO_V1(grant_counter);
Datum
grant_counter(PG_FUNCTION_ARGS)
{
	ChangeCounterAcl(fcinfo, true);
	ClusterAdminRecord(fcinfo, KIND_COUNTER, "change");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(revoke_counter);
Datum
revoke_counter(PG_FUNCTION_ARGS)
{
	ChangeCounterAcl(fcinfo, false);
	ClusterAdminRecord(fcinfo, KIND_COUNTER, "change");
	PG_RETURN_VOID();
}

/*
 * May the caller read this counter's total (select privilege, or owner)?
 * The counters view lists every counter, but shows totals only to them.
 */
static bool
CounterReadable(int32 id)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(id)};
	OwnerContext ctx;
	bool		readable = false;

	BeginAsOwner(&ctx);
	PreparePlan(&plan,
				"SELECT owner::pg_catalog.oid, acl FROM sharded_seq.counter_config"
				" WHERE id OPERATOR(pg_catalog.=) $1", 1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.counter_config");
	if (SPI_processed == 1)
	{
		bool		isnull;
		Oid			owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		Datum		acl = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);

		readable = HasPrivilege(owner, isnull ? NULL : DatumGetAclP(acl), ctx.caller, ACL_SELECT);
	}
	EndAsOwner(&ctx);
	return readable;
}

/*
 * The view's pending column: committed, not yet in the rows, in shared memory
 * (any mode: a slot outlives a mode change until flushed) and, for mode
 * 'memcached', in memcached.  NULL when memcached cannot be read, or for
 * others' counters.
 */
PG_FUNCTION_INFO_V1(counter_pending);
Datum
counter_pending(PG_FUNCTION_ARGS)
{
	int32		id = PG_GETARG_INT32(0);
	int64		amount = 0;
	CounterConfigRow row;

	if (!CounterReadable(id))
		PG_RETURN_NULL();
	if (FetchCounterConfig(NULL, id, &row) && row.mode == MODE_MEMCACHED &&
		!MemcachedPending(id, &amount))
		PG_RETURN_NULL();
	PG_RETURN_INT64(amount + SlotPending(id));
}

/*
 * counter_backlog(id): what monitoring reads of a counter's write-behind:
 * (pending_shared, pending_memcached, oldest_pending_at).  The oldest is a
 * time no pending amount is older than: the shared-memory slot stamps its
 * first amount after each emptying, and a counter's memcached key is
 * dated by its flushes and deliveries (StatsMcOldest).  NULL where
 * unreadable: for others' counters (but to pg_read_all_stats, as
 * sequence_usage), memcached's part when it cannot be read, the oldest when
 * nothing is pending.
 */
PG_FUNCTION_INFO_V1(counter_backlog);
Datum
counter_backlog(PG_FUNCTION_ARGS)
{
	int32		id = PG_GETARG_INT32(0);
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {true, true, true};
	CounterConfigRow row;
	TimestampTz oldest = 0;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "counter_backlog must return a row");
	if ((CounterReadable(id) || StatsReader(GetUserId())) &&
		FetchCounterConfig(NULL, id, &row))
	{
		TimestampTz since;
		int64		shared = SlotPendingSince(id, &since);
		int64		mc = 0;

		values[0] = Int64GetDatum(shared);
		nulls[0] = false;
		if (shared > 0)
			oldest = since;
		/* one timeout a statement, not one a counter, when memcached hangs */
		if (row.mode != MODE_MEMCACHED ||
			(McLastFailure() < GetCurrentStatementStartTimestamp() && MemcachedPending(id, &mc)))
		{
			values[1] = Int64GetDatum(mc);
			nulls[1] = false;
		}
		if (mc > 0)
		{
			TimestampTz mc_since = StatsMcOldest(id);

			if (mc_since != 0 && (oldest == 0 || mc_since < oldest))
				oldest = mc_since;
		}
		if (oldest != 0)
		{
			values[2] = TimestampTzGetDatum(oldest);
			nulls[2] = false;
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/* (used, total, refused) of the shared-memory slot table */
PG_FUNCTION_INFO_V1(buffered_slots);
Datum
buffered_slots(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			used;
	int			total;
	int64		refused;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	SlotsUsage(&used, &total, &refused);
	values[0] = Int32GetDatum(used);
	values[1] = Int32GetDatum(total);
	values[2] = Int64GetDatum(refused);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * Flush, now and in this transaction, every write-behind amount (shared
 * memory and memcached) of the counters the caller may increment.  Every
 * mode is looked at: an amount outlives a mode change until it is flushed.
 * Returns how many counters had an amount to move.
 */
PG_FUNCTION_INFO_V1(flush_counters);
Datum
flush_counters(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	OwnerContext ctx;
	int			flushed = 0;
	SPITupleTable *rows;
	uint64		n;

	PreventCommandIfReadOnly("sharded_seq.flush_counters()");
	if (!McEnabled() && !SlotsAvailable())
		PG_RETURN_INT32(0);
	BeginAsOwner(&ctx);
	PreparePlan(&plan,
				"SELECT id, name, owner::pg_catalog.oid, acl FROM sharded_seq.counter_config ORDER BY id",
				0, NULL);
	if (SPI_execute_plan(plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list counters");
	rows = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		int32		id = DatumGetInt32(SPI_getbinval(rows->vals[i], rows->tupdesc, 1, &isnull));
		char	   *name = SPI_getvalue(rows->vals[i], rows->tupdesc, 2);
		Oid			owner = DatumGetObjectId(SPI_getbinval(rows->vals[i], rows->tupdesc, 3, &isnull));
		Datum		acl = SPI_getbinval(rows->vals[i], rows->tupdesc, 4, &isnull);
		int64		moved;

		/* a flush moves amounts between tiers: only for those who may increment */
		if (!HasPrivilege(owner, isnull ? NULL : DatumGetAclP(acl), ctx.caller, ACL_UPDATE))
			continue;
		/*
		 * Keeps the worker from forwarding between the two flushes, which
		 * could leave an amount in neither; let go at once, so a flush of
		 * many counters does not fill the lock table.  The worker never
		 * waits while holding it.
		 */
		LockDatabaseObject(ConfigRelid("counter_config"), id, FORWARD_LOCK_SUBID, ShareLock);
		moved = BufferedFlush(id, name, true);
		if (McEnabled())
			moved += Max(MemcachedFlush(id, (int32) (MyProcPid % SHARDED_SEQ_MAX_SHARDS), name, true), 0);
		UnlockDatabaseObject(ConfigRelid("counter_config"), id, FORWARD_LOCK_SUBID, ShareLock);
		if (moved > 0)
			flushed++;
	}
	EndAsOwner(&ctx);
	PG_RETURN_INT32(flushed);
}

/* The view's total: NULL for a counter the caller may not read. */
PG_FUNCTION_INFO_V1(counter_total);
Datum
counter_total(PG_FUNCTION_ARGS)
{
	int128		total;

	if (!CounterReadable(PG_GETARG_INT32(0)))
		PG_RETURN_NULL();
	total = CounterSum(PG_GETARG_INT32(0), NULL, NULL, NULL);
	if (total > PG_INT64_MAX || total < PG_INT64_MIN)
		PG_RETURN_NULL();		/* a listing should not fail on one counter */
	PG_RETURN_INT64((int64) total);
}

/*
 * Apply counts (a JSON object of counter name to amount) to this node's
 * rows, each multiplied by sign, in this transaction; for each, calls
 * each_fn(name, amount, arg).  A counter unknown here is refused: its count
 * would be lost.
 */
static void
ApplyNodeCounts(const char *counts, int sign,
				void (*each_fn) (const char *name, int64 amount, void *arg), void *arg)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(counts)};
	SPITupleTable *rows;
	uint64		n;

	SPI_connect();
	if (SPI_execute_with_args("SELECT key, value::pg_catalog.int8 FROM pg_catalog.json_each_text($1::pg_catalog.json) ORDER BY key",
							  1, types, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the counts of a node");
	rows = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		char	   *name = SPI_getvalue(rows->vals[i], rows->tupdesc, 1);
		bool		isnull;
		int64		amount = DatumGetInt64(SPI_getbinval(rows->vals[i], rows->tupdesc, 2, &isnull));
		CounterConfigRow row;

		if (!FetchCounterConfig(name, 0, &row))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("counter \"%s\" of the leaving node does not exist here", name),
					 errdetail("Its count (%lld) would be lost.", (long long) amount),
					 errhint("Create it on the coordinator (sharded_seq.create_counter), then move the counts again.")));
		if (!CounterApply(row.id, 0, sign * amount, name, NULL, 0))
			elog(ERROR, "counter \"%s\" has no rows", name);
		if (each_fn)
			each_fn(name, amount, arg);
	}
	SPI_finish();
}

static void
ReturnMovedCount(const char *name, int64 amount, void *arg)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;
	Datum		values[2] = {CStringGetTextDatum(name), Int64GetDatum(amount)};
	bool		nulls[2] = {false, false};

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * move_node_counts(node_name, node_port): on the coordinator of a Citus
 * cluster, before a worker leaves it.  Flushes the worker's write-behind
 * amounts, reads each counter's committed count in its rows, and, in one
 * distributed transaction, adds it to this node's rows and takes it from
 * the worker's: counter_value stays exact throughout, and increments the
 * worker commits meanwhile stay there (run it again after they stop).
 */
PG_FUNCTION_INFO_V1(move_node_counts);
Datum
move_node_counts(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *node_name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int32		node_port = PG_GETARG_INT32(1);
	int32		group;
	char	   *counts;

	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for sharded_seq.move_node_counts()"),
				 errhint("Moving every counter's count off a node takes a superuser.")));
	PreventCommandIfReadOnly("sharded_seq.move_node_counts()");
	if (CitusGroup() != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq.move_node_counts() runs on the coordinator of a Citus cluster"),
				 errhint("Connect to the coordinator.")));
	group = ClusterWorkerGroup(node_name, node_port);
	InitMaterializedSRF(fcinfo, 0);
	counts = ClusterQueryGroup(group, "SELECT sharded_seq.node_counts()");
	ApplyNodeCounts(counts ? counts : "{}", 1, ReturnMovedCount, rsinfo);
	ClusterCallOnGroup(group, psprintf("SELECT sharded_seq.take_node_counts(%d, %s)",
									   group, quote_literal_cstr(counts ? counts : "{}")));
	return (Datum) 0;
}

/*
 * take_node_counts(node_group, counts): the leaving worker's part of
 * move_node_counts, run on every node in its transaction; only the node of
 * group node_group takes the counts from its rows.
 */
PG_FUNCTION_INFO_V1(take_node_counts);
Datum
take_node_counts(PG_FUNCTION_ARGS)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for sharded_seq.take_node_counts()"),
				 errhint("sharded_seq.move_node_counts() calls it on every node; do not call it directly.")));
	if (CitusGroup() == PG_GETARG_INT32(0))
		ApplyNodeCounts(text_to_cstring(PG_GETARG_TEXT_PP(1)), -1, NULL, NULL);
	PG_RETURN_VOID();
}
