/*
 * rewrite.c
 *	  The administration's writes of a counter's rows, by SQL as the owner
 *	  (inside SPI): a new counter and its rows (InsertCounter,
 *	  ShardRowsCreate), alter_counter's new layout (ShardRowsRebuild),
 *	  set_counter's rewrite (ShardRowsSet), drop_counter's delete
 *	  (ShardRowsDrop), and the count of this node's rows.  Every plan that
 *	  writes counter_shards runs through ShardRowsSql, that is through
 *	  ShardWrite (rows.c), which marks the layout word and lets the trigger
 *	  know the write for the engine's own.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "counter/counter_internal.h"

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
