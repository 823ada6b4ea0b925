/*
 * admin.c
 *	  Administration of sharded sequences: create, alter, advance, drop,
 *	  grant and revoke, and the reserved high-water mark.  Where shards
 *	  stand and where blocks start is shards.c's.
 *
 * A layout change (shards, block, advance) never edits the old shards.  It
 * locks them against new reservations, reads how far they got, and starts a
 * new generation of shards above that.  Everything is transactional: a
 * rolled-back alter leaves the old generation in force and untouched.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/int.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "sequence/sequence_internal.h"

/* settings (defined in module.c) */
int			DefaultSequenceShards = 4;
int			DefaultBlock = 1000;
int			DefaultLeaseSize = 10000;

typedef struct SeqRow
{
	int32		id;
	int32		generation;
	int64		base;
	int32		shards;
	int32		block;
	Oid			owner;
	Acl		   *acl;
	char	   *tier;
	char	   *cache;			/* 'node' or 'session' (NULL before schema 1.5) */
} SeqRow;

static void
RunSql(const char *sql)
{
	if (SPI_execute(sql, false, 0) < 0)
		elog(ERROR, "could not run \"%s\"", sql);
}

/*
 * Create the native sequences that hold one generation's shards.  Each row
 * keeps its generation's layout, so that the generation's values can be
 * computed even after the config row has moved on.
 */
static void
CreateShards(int32 seq_id, int32 generation, int64 base, int32 shards, int32 block)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr plan_10 = NULL;
	Oid			argtypes[7] = {INT4OID, INT4OID, INT4OID, OIDOID, INT8OID, INT4OID, INT4OID};
	Oid			namespace = get_namespace_oid(SHARDED_SEQ_SCHEMA, false);
	bool		layouts = ShardLayoutsStored();

	if (layouts)
		PreparePlan(&plan,
					"INSERT INTO sharded_seq.sequence_shards"
					" (seq_id, generation, shard, relid, gen_base, gen_shards, gen_block)"
					" VALUES ($1, $2, $3, $4, $5, $6, $7)", 7, argtypes);
	else
		PreparePlan(&plan_10,
					"INSERT INTO sharded_seq.sequence_shards (seq_id, generation, shard, relid)"
					" VALUES ($1, $2, $3, $4)", 4, argtypes);
	for (int32 i = 0; i < shards; i++)
	{
		/* built from integers only: no user text reaches the SQL */
		char	   *relname = psprintf("seq_%d_g%d_s%d", seq_id, generation, i);
		Datum		args[7];

		RunSql(psprintf("CREATE SEQUENCE %s.%s MINVALUE 0 START 0 NO CYCLE",
						SHARDED_SEQ_SCHEMA, relname));
		args[0] = Int32GetDatum(seq_id);
		args[1] = Int32GetDatum(generation);
		args[2] = Int32GetDatum(i);
		args[3] = ObjectIdGetDatum(get_relname_relid(relname, namespace));
		args[4] = Int64GetDatum(base);
		args[5] = Int32GetDatum(shards);
		args[6] = Int32GetDatum(block);
		if (SPI_execute_plan(layouts ? plan : plan_10, args, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not record shard %d of sharded sequence %d", i, seq_id);
	}
}

/*
 * Block new reservations from a sequence until this transaction ends, after
 * waiting for those in progress.  Sessions reserving a block hold this lock
 * in share mode only while they reserve, never until their transaction ends,
 * so an administrative change waits microseconds, not for long transactions.
 */
void
LockSequenceDraws(int32 seq_id)
{
	LockDatabaseObject(ConfigRelid("sequence_config"), seq_id, 0, ExclusiveLock);
}

/*
 * Drop the native sequences of dropped sequences and of old generations.
 * Nothing reserves from them any more, but a transaction that reserved from
 * one still holds a lock on it; such shards are left for the next reaping.
 * So are generations retired by this very transaction: if it rolls back they
 * are in force again, and a draw from the new generation may first need to
 * advance them.
 */
int
ReapShards(void)
{
	int			reaped = 0;
	static SPIPlanPtr list_plan = NULL;
	static SPIPlanPtr delete_plan = NULL;
	Oid			del_argtypes[1] = {OIDOID};
	SPITupleTable *shards;
	uint64		n;

	PreparePlan(&list_plan,
				"SELECT s.relid::pg_catalog.oid, c.xmin FROM sharded_seq.sequence_shards s"
				"  LEFT JOIN sharded_seq.sequence_config c ON c.id OPERATOR(pg_catalog.=) s.seq_id"
				" WHERE c.id IS NULL OR s.generation OPERATOR(pg_catalog.<) c.generation",
				0, NULL);
	PreparePlan(&delete_plan,
				"DELETE FROM sharded_seq.sequence_shards WHERE relid OPERATOR(pg_catalog.=) $1",
				1, del_argtypes);
	if (SPI_execute_plan(list_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list retired shards");
	shards = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		Oid			relid = DatumGetObjectId(SPI_getbinval(shards->vals[i], shards->tupdesc, 1, &isnull));
		Datum		retired_by = SPI_getbinval(shards->vals[i], shards->tupdesc, 2, &isnull);
		Datum		del_args[1] = {ObjectIdGetDatum(relid)};
		char	   *relname;

		if (!isnull && TransactionIdIsCurrentTransactionId(DatumGetTransactionId(retired_by)))
			continue;
		if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
			continue;
		relname = get_rel_name(relid);
		if (relname != NULL)
			RunSql(psprintf("DROP SEQUENCE %s.%s", SHARDED_SEQ_SCHEMA,
							quote_identifier(relname)));
		if (SPI_execute_plan(delete_plan, del_args, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not forget shard %u", relid);
		reaped++;
	}
	return reaped;
}

/* Read and row-lock a sequence's config row; false if there is none. */
static bool
FetchSeqRow(const char *name, SeqRow *row, bool for_update)
{
	static SPIPlanPtr plans[2][2] = {{NULL, NULL}, {NULL, NULL}};
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	bool		cached = NodeCacheStored();
	const char *sql = psprintf(
							   "SELECT id, generation, base, shards, block, owner::pg_catalog.oid, acl, tier, %s"
							   "  FROM sharded_seq.sequence_config WHERE name OPERATOR(pg_catalog.=) $1%s",
							   cached ? "cache" : "NULL::pg_catalog.text",
							   for_update ? " FOR UPDATE" : "");
	SPIPlanPtr *plan = &plans[cached][for_update];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		acl;
	Datum		cache;

	PreparePlan(plan, sql, 1, argtypes);
	if (SPI_execute_plan(*plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.sequence_config");
	if (SPI_processed == 0)
		return false;
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	row->id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	row->generation = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	row->base = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
	row->shards = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
	row->block = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
	row->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 6, &isnull));
	acl = SPI_getbinval(tup, desc, 7, &isnull);
	row->acl = isnull ? NULL : DatumGetAclP(acl);
	row->tier = TextDatumGetCString(SPI_getbinval(tup, desc, 8, &isnull));
	cache = SPI_getbinval(tup, desc, 9, &isnull);
	row->cache = isnull ? NULL : TextDatumGetCString(cache);
	return true;
}

static void
ValidateCache(const char *cache)
{
	if (strcmp(cache, "node") == 0 || strcmp(cache, "session") == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown cache \"%s\"", cache),
			 errhint("cache must be 'node' (one block shared by the server's sessions) or 'session' (a block per session).")));
}

/*
 * The cache argument, or NULL when it is absent (a call through the
 * functions of schema 1.4, which lack it) or NULL (alter: keep it).
 */
static char *
CacheArg(FunctionCallInfo fcinfo, int argno)
{
	char	   *cache;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	cache = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	ValidateCache(cache);
	return cache;
}

static void
ValidateTier(const char *tier)
{
	if (strcmp(tier, "database") == 0)
		return;
	if (strcmp(tier, "memcached") == 0)
	{
		McRequireBuilt("tier 'memcached'");
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown tier \"%s\"", tier),
			 errhint("tier must be 'database' or 'memcached'.")));
}

/*
 * The layout for tier from the shards and block arguments, falling back to
 * current (when the tier is unchanged) or to the tier's defaults.  A
 * memcached-tier sequence carves its leases from one shard, so that they
 * increase in the order they are carved; its block is the lease size.
 */
static void
ChooseLayout(FunctionCallInfo fcinfo, int shards_arg, int block_arg,
			 const char *tier, const SeqRow *current, int32 *shards, int32 *block)
{
	bool		memcached = strcmp(tier, "memcached") == 0;

	if (current && strcmp(tier, current->tier) == 0)
	{
		*shards = current->shards;
		*block = current->block;
	}
	else
	{
		*shards = memcached ? 1 : DefaultSequenceShards;
		*block = memcached ? DefaultLeaseSize : DefaultBlock;
	}
	if (!PG_ARGISNULL(shards_arg))
		*shards = PG_GETARG_INT32(shards_arg);
	if (!PG_ARGISNULL(block_arg))
		*block = PG_GETARG_INT32(block_arg);
	ValidateShards(*shards, KIND_SEQUENCE);
	ValidateBlock(*block);
	if (memcached && *shards != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a memcached-tier sequence has exactly one shard"),
				 errdetail("memcached hands out values from leases carved one after another from a single shard."),
				 errhint("Leave shards out; block sets the lease size.")));
}

/*
 * Start a new generation with the given layout whose first value is above
 * everything reserved so far and at least min_base; returns that first
 * value (a local position).
 */
static int64
NewGeneration(const char *name, SeqRow *row, int32 shards, int32 block,
			  const char *tier, const char *cache, int64 min_base)
{
	static SPIPlanPtr update_plan = NULL;
	static SPIPlanPtr update_plan_14 = NULL;
	Oid			update_types[7] = {INT4OID, INT4OID, INT8OID, INT4OID, INT4OID, TEXTOID, TEXTOID};
	Datum		update_args[7];
	int64		high;
	int64		base;

	LockSequenceDraws(row->id);
	high = GenerationHighWater(row->id, row->generation, row->base, row->shards, row->block);
	if (high == PG_INT64_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("sharded sequence \"%s\" has reached its maximum value", name),
				 errhint("Values never wrap around; move to a new sequence.")));
	base = Max(high + 1, min_base);

	update_args[0] = Int32GetDatum(row->id);
	update_args[1] = Int32GetDatum(row->generation + 1);
	update_args[2] = Int64GetDatum(base);
	update_args[3] = Int32GetDatum(shards);
	update_args[4] = Int32GetDatum(block);
	update_args[5] = CStringGetTextDatum(tier);
	if (cache)
	{
		update_args[6] = CStringGetTextDatum(cache);
		PreparePlan(&update_plan,
					"UPDATE sharded_seq.sequence_config"
					"   SET generation = $2, base = $3, shards = $4, block = $5, tier = $6,"
					"       cache = $7, altered_at = pg_catalog.now()"
					" WHERE id OPERATOR(pg_catalog.=) $1", 7, update_types);
	}
	else
		PreparePlan(&update_plan_14,
					"UPDATE sharded_seq.sequence_config"
					"   SET generation = $2, base = $3, shards = $4, block = $5, tier = $6,"
					"       altered_at = pg_catalog.now()"
					" WHERE id OPERATOR(pg_catalog.=) $1", 6, update_types);
	if (SPI_execute_plan(cache ? update_plan : update_plan_14, update_args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not update sharded sequence \"%s\"", name);
	CreateShards(row->id, row->generation + 1, base, shards, block);
	ReapShards();
	AnnounceConfigChange("sequence_config");
	return base;
}

/*
 * Common prologue: refuse read-only transactions and servers stopped by a
 * cutover, act as the owner, and reap what earlier transactions retired.
 */
static void
BeginAdmin(OwnerContext *ctx)
{
	PreventCommandIfReadOnly("sharded_seq administration");
	/* an old primary: a change would replicate onto the new one's generations */
	CutoverStopCheck();
	BeginAsOwner(ctx);
	ReapShards();
}

/* Fetch, check ownership (as the caller) and row-lock a sequence. */
static void
FetchOwnedSeq(OwnerContext *ctx, const char *name, SeqRow *row)
{
	if (!FetchSeqRow(name, row, true))
		ReportNotFound(KIND_SEQUENCE, name);
	CheckOwnership(KIND_SEQUENCE, name, row->owner, ctx->caller);
}

static char *
RequiredText(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errhint("Pass a value for %s, or leave it out to take the default.", what)));
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

PG_FUNCTION_INFO_V1(create_sequence);
Datum
create_sequence(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_SEQUENCE);
	int32		shards;
	int32		block;
	int64		start;
	char	   *tier = RequiredText(fcinfo, 4, "tier");
	char	   *cache = PG_NARGS() > 5 ? RequiredText(fcinfo, 5, "cache") : NULL;
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr plan_14 = NULL;
	Oid			argtypes[8] = {INT4OID, TEXTOID, INT4OID, INT4OID, TEXTOID, INT8OID, OIDOID, TEXTOID};
	Datum		args[8];
	OwnerContext ctx;
	SeqRow		existing;
	int32		id;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("start must not be null"),
				 errhint("Leave start out to begin at 1.")));
	start = PG_GETARG_INT64(3);
	if (start == PG_INT64_MIN)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("start must be greater than %lld", (long long) PG_INT64_MIN),
				 errhint("Choose a start value such as 1.")));
	ValidateTier(tier);
	if (cache)
		ValidateCache(cache);
	ChooseLayout(fcinfo, 1, 2, tier, NULL, &shards, &block);

	/* start is a value; the layout counts in this node's local positions */
	start = SequenceNodeLocal(start, false, name, "start");

	BeginAdmin(&ctx);
	if (FetchSeqRow(name, &existing, false))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("sharded sequence \"%s\" already exists", name),
				 errhint("Use sharded_seq.alter_sequence() to change it, or choose another name.")));
	id = NextObjectId();
	args[0] = Int32GetDatum(id);
	args[1] = CStringGetTextDatum(name);
	args[2] = Int32GetDatum(shards);
	args[3] = Int32GetDatum(block);
	args[4] = CStringGetTextDatum(tier);
	args[5] = Int64GetDatum(start);
	args[6] = ObjectIdGetDatum(ctx.caller);
	if (cache)
	{
		args[7] = CStringGetTextDatum(cache);
		PreparePlan(&plan,
					"INSERT INTO sharded_seq.sequence_config"
					" (id, name, shards, block, tier, generation, base, owner, cache)"
					" VALUES ($1, $2, $3, $4, $5, 1, $6, $7::pg_catalog.regrole, $8)",
					8, argtypes);
	}
	else
		PreparePlan(&plan_14,
					"INSERT INTO sharded_seq.sequence_config"
					" (id, name, shards, block, tier, generation, base, owner)"
					" VALUES ($1, $2, $3, $4, $5, 1, $6, $7::pg_catalog.regrole)",
					7, argtypes);
	if (SPI_execute_plan(cache ? plan : plan_14, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not create sharded sequence \"%s\"", name);
	CreateShards(id, 1, start, shards, block);
	ReapShards();
	AnnounceConfigChange("sequence_config");
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_SEQUENCE, "create");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(alter_sequence);
Datum
alter_sequence(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_SEQUENCE);
	OwnerContext ctx;
	SeqRow		row;
	int32		shards;
	int32		block;
	char	   *tier;
	char	   *cache;

	if (!PG_ARGISNULL(1))
		ValidateShards(PG_GETARG_INT32(1), KIND_SEQUENCE);
	if (!PG_ARGISNULL(2))
		ValidateBlock(PG_GETARG_INT32(2));
	if (!PG_ARGISNULL(3))
		ValidateTier(text_to_cstring(PG_GETARG_TEXT_PP(3)));
	cache = CacheArg(fcinfo, 4);

	BeginAdmin(&ctx);
	FetchOwnedSeq(&ctx, name, &row);
	tier = PG_ARGISNULL(3) ? row.tier : text_to_cstring(PG_GETARG_TEXT_PP(3));
	if (cache == NULL)
		cache = row.cache;
	ChooseLayout(fcinfo, 1, 2, tier, &row, &shards, &block);

	/*
	 * A change of cache starts a new generation too: a session that drew
	 * per session may hold values above the node's block, and one that drew
	 * from the node values above its own shard's, so within one generation a
	 * switch could hand a session a value below its last (S2).
	 */
	if (shards != row.shards || block != row.block || strcmp(tier, row.tier) != 0 ||
		(cache && row.cache && strcmp(cache, row.cache) != 0))
		NewGeneration(name, &row, shards, block, tier, cache, PG_INT64_MIN);
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_SEQUENCE, "change");
	PG_RETURN_VOID();
}

/*
 * advance_sequence's work, also cutover()'s: as the owner (ctx), the caller
 * owning the sequence, a new generation starting at min_base or above
 * everything reserved here, whichever is higher (*start, if given).  The
 * owner vouches for min_base, so a sequence whose positions were unknown
 * here (it arrived by logical replication) may be drawn from again.  False
 * if there is no sequence of that name.
 */
bool
AdvanceSequenceAbove(OwnerContext *ctx, const char *name, int64 min_base, int64 *start)
{
	static SPIPlanPtr clear_plan = NULL;
	Oid			types[1] = {INT4OID};
	Datum		args[1];
	SeqRow		row;
	int64		base;

	if (!FetchSeqRow(name, &row, true))
		return false;
	CheckOwnership(KIND_SEQUENCE, name, row.owner, ctx->caller);
	base = NewGeneration(name, &row, row.shards, row.block, row.tier, row.cache, min_base);
	if (get_attnum(ConfigRelid("sequence_config"), "positions_unknown") != InvalidAttrNumber)
	{
		args[0] = Int32GetDatum(row.id);
		PreparePlan(&clear_plan,
					"UPDATE sharded_seq.sequence_config SET positions_unknown = false"
					" WHERE id OPERATOR(pg_catalog.=) $1 AND positions_unknown", 1, types);
		if (SPI_execute_plan(clear_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not update sharded sequence \"%s\"", name);
	}
	if (start)
		*start = base;
	return true;
}

/* A sequence whose reservations this server has never seen: refused. */
void
PositionsUnknownError(const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("sharded sequence \"%s\" arrived by logical replication, and what its publisher reserved is unknown here", name),
			 errdetail("Drawing from it now could hand out values the publisher handed out."),
			 errhint("On this server, while its subscription still exists: SELECT sharded_seq.cutover('subscription_name').  If the old primary is gone: SELECT sharded_seq.advance_sequence('%s', past => <the highest value it may have handed out>).",
					 name)));
}

PG_FUNCTION_INFO_V1(advance_sequence);
Datum
advance_sequence(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_SEQUENCE);
	int64		past;
	OwnerContext ctx;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("past must not be null"),
				 errhint("Pass the highest value already in use, e.g. (SELECT max(id) FROM orders).")));
	past = PG_GETARG_INT64(1);
	if (past == PG_INT64_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("cannot advance sharded sequence \"%s\" past the largest bigint", name),
				 errhint("No value can be greater than %lld.", (long long) PG_INT64_MAX)));

	BeginAdmin(&ctx);
	/* above past in this node's local positions (past + 1 on node 0) */
	if (!AdvanceSequenceAbove(&ctx, name, SequenceNodeLocal(past, true, name, "past"), NULL))
		ReportNotFound(KIND_SEQUENCE, name);
	/* the old primary is gone: its object ids are taken here too */
	AdvanceObjectIds();
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_SEQUENCE, "change");
	PG_RETURN_VOID();
}

/*
 * Drop a sequence the caller owns (as the owner, ctx) once reservations
 * are locked out; the highest local position it ever reserved: every older
 * generation lies below the current one's base, and every block handed to
 * a session or to the node cache lies at or below the current one's high
 * water.
 */
static int64
DropOwnedSeq(OwnerContext *ctx, const char *name)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1];
	SeqRow		row;
	int64		high;

	FetchOwnedSeq(ctx, name, &row);
	args[0] = Int32GetDatum(row.id);
	LockSequenceDraws(row.id);
	high = GenerationHighWater(row.id, row.generation, row.base, row.shards, row.block);
	PreparePlan(&plan, "DELETE FROM sharded_seq.sequence_config WHERE id OPERATOR(pg_catalog.=) $1", 1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not drop sharded sequence \"%s\"", name);
	/* its node cache entry goes now (if this rolls back, the next draw makes one) */
	NodeCacheForget(ConfigRelid("sequence_config"), row.id);
	ReapShards();
	AnnounceConfigChange("sequence_config");
	return high;
}

PG_FUNCTION_INFO_V1(drop_sequence);
Datum
drop_sequence(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_SEQUENCE);
	OwnerContext ctx;

	BeginAdmin(&ctx);
	(void) DropOwnedSeq(&ctx, name);
	EndAsOwner(&ctx);
	ClusterAdminRecord(fcinfo, KIND_SEQUENCE, "drop");
	PG_RETURN_VOID();
}

/*
 * release_column's end of a sharded sequence: the highest value it may ever
 * have handed out on this node, and drop it (the caller must own it) unless
 * another column still draws from it.
 */
int64
DropSequenceHighWater(const char *name, bool drop)
{
	OwnerContext ctx;
	int64		high;
	SeqRow		row;

	BeginAdmin(&ctx);
	if (drop)
		high = DropOwnedSeq(&ctx, name);
	else
	{
		if (!FetchSeqRow(name, &row, true))
			ReportNotFound(KIND_SEQUENCE, name);
		/* wait for reservations in progress; others may draw on after */
		LockSequenceDraws(row.id);
		high = GenerationHighWater(row.id, row.generation, row.base, row.shards, row.block);
		UnlockDatabaseObject(ConfigRelid("sequence_config"), row.id, 0, ExclusiveLock);
	}
	EndAsOwner(&ctx);
	return SequenceNodeValue(high, name);
}

static void
ChangeSequenceAcl(FunctionCallInfo fcinfo, bool grant)
{
	char	   *name = NameArg(fcinfo, 0, KIND_SEQUENCE);
	char	   *grantee = RequiredText(fcinfo, 1, "grantee");
	char	   *privilege = RequiredText(fcinfo, 2, "privilege");
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[2] = {INT4OID, ACLITEMARRAYOID};
	Datum		args[2];
	OwnerContext ctx;
	SeqRow		row;

	BeginAdmin(&ctx);
	FetchOwnedSeq(&ctx, name, &row);
	args[0] = Int32GetDatum(row.id);
	args[1] = PointerGetDatum(ChangeAcl(KIND_SEQUENCE, name, row.owner, row.acl,
										grantee, privilege, grant));
	PreparePlan(&plan, "UPDATE sharded_seq.sequence_config SET acl = $2 WHERE id OPERATOR(pg_catalog.=) $1",
				2, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not change privileges of sharded sequence \"%s\"", name);
	AnnounceConfigChange("sequence_config");
	EndAsOwner(&ctx);
}

PG_FUNCTION_INFO_V1(grant_sequence);
Datum
grant_sequence(PG_FUNCTION_ARGS)
{
	ChangeSequenceAcl(fcinfo, true);
	ClusterAdminRecord(fcinfo, KIND_SEQUENCE, "change");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(revoke_sequence);
Datum
revoke_sequence(PG_FUNCTION_ARGS)
{
	ChangeSequenceAcl(fcinfo, false);
	ClusterAdminRecord(fcinfo, KIND_SEQUENCE, "change");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(sequence_readable);
Datum
sequence_readable(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(SequenceIdReadable(PG_GETARG_INT32(0)));
}

/*
 * The highest position a sequence reserved in its generation in force, or
 * false when there is none, or when the current user may not see it
 * (stats_readers: pg_read_all_stats may, for monitoring).
 */
bool
SequenceHighWater(int32 id, bool stats_readers, int64 *high_water)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(id)};
	OwnerContext ctx;
	bool		found = false;
	int64		high = 0;
	int64		base = 0;

	BeginAsOwner(&ctx);
	PreparePlan(&plan,
				"SELECT generation, base, shards, block, owner::pg_catalog.oid, acl"
				" FROM sharded_seq.sequence_config WHERE id OPERATOR(pg_catalog.=) $1",
				1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.sequence_config");
	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int32		generation = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		int32		shards = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
		int32		block = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
		Oid			owner = DatumGetObjectId(SPI_getbinval(tup, desc, 5, &isnull));
		Datum		acl = SPI_getbinval(tup, desc, 6, &isnull);

		if (SequenceReadable(owner, isnull ? NULL : DatumGetAclP(acl), ctx.caller) ||
			(stats_readers && StatsReader(ctx.caller)))
		{
			base = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
			high = GenerationHighWater(id, generation, base, shards, block);
			found = true;
		}
	}
	EndAsOwner(&ctx);
	*high_water = high;
	return found && high >= base;
}

/*
 * The view's reserved_high_water: NULL if nothing is reserved yet, and for a
 * sequence the caller may not see the positions of (even called directly).
 */
PG_FUNCTION_INFO_V1(sequence_high_water);
Datum
sequence_high_water(PG_FUNCTION_ARGS)
{
	int64		high;

	if (!SequenceHighWater(PG_GETARG_INT32(0), false, &high))
		PG_RETURN_NULL();
	PG_RETURN_INT64(high);
}
