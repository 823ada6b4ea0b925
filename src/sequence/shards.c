/*
 * shards.c
 *	  Where a sequence's configuration and shards are, and how far they got:
 *	  where a block starts, the catalog places the draw path reads directly,
 *	  a generation's high water, the shard whose next block comes first,
 *	  the end of every carve of a block (CarveFinish: its bounds, made
 *	  durable), and who may see a sequence's positions.
 *
 * The bottom of src/sequence: admin.c, the node cache's files, engine.c and the rest
 * call it, and it calls none of them.
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
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "sequence/sequence_internal.h"

/*
 * First value of block k of a shard: base + (k * shards + shard) * block.
 * Sets *overflow when that lies beyond bigint.
 */
int64
BlockStart(int64 base, int64 k, int32 shards, int32 shard, int32 block,
		   bool *overflow)
{
	int64		index;
	int64		offset;
	int64		start;

	*overflow = pg_mul_s64_overflow(k, shards, &index) ||
		pg_add_s64_overflow(index, shard, &index) ||
		pg_mul_s64_overflow(index, block, &offset) ||
		pg_add_s64_overflow(base, offset, &start);
	return *overflow ? 0 : start;
}

/*
 * Where the configuration lives (ConfigPlaces in sequence_internal.h),
 * looked up again when ConfigEpoch moves (an update of the extension may add
 * columns; a reinstallation makes new tables).
 */

static ConfigPlaces Places = {PG_UINT64_MAX};

/* A column's number, from the relation's descriptor (no catalog lookup). */
static AttrNumber
ColumnOf(Relation rel, const char *column, bool required)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), column) == 0)
			return att->attnum;
	}
	if (required)
		elog(ERROR, "sharded_seq's table \"%s\" has no column \"%s\"",
			 RelationGetRelationName(rel), column);
	return InvalidAttrNumber;
}

/* The places of the configuration, with both tables open. */
ConfigPlaces *
SequenceConfigPlaces(Relation config, Relation shards)
{
	Oid			namespace = RelationGetNamespace(config);

	if (Places.epoch == ConfigEpoch && Places.config == RelationGetRelid(config))
		return &Places;
	Places.config = RelationGetRelid(config);
	Places.shards = RelationGetRelid(shards);
	/* the names the base script's constraints gave them (kept by a dump) */
	Places.by_name = get_relname_relid("sequence_config_name_key", namespace);
	Places.by_id = get_relname_relid("sequence_config_pkey", namespace);
	Places.by_generation = get_relname_relid("sequence_shards_pkey", namespace);
	Places.c_id = ColumnOf(config, "id", true);
	Places.c_name = ColumnOf(config, "name", true);
	Places.c_generation = ColumnOf(config, "generation", true);
	Places.c_base = ColumnOf(config, "base", true);
	Places.c_shards = ColumnOf(config, "shards", true);
	Places.c_block = ColumnOf(config, "block", true);
	Places.c_owner = ColumnOf(config, "owner", true);
	Places.c_acl = ColumnOf(config, "acl", true);
	Places.c_tier = ColumnOf(config, "tier", true);
	Places.c_cache = ColumnOf(config, "cache", false);
	Places.c_unknown = ColumnOf(config, "positions_unknown", false);
	Places.s_seq_id = ColumnOf(shards, "seq_id", true);
	Places.s_generation = ColumnOf(shards, "generation", true);
	Places.s_shard = ColumnOf(shards, "shard", true);
	Places.s_relid = ColumnOf(shards, "relid", true);
	Places.epoch = ConfigEpoch;
	return &Places;
}

/* Does a text column of tup hold value? */
bool
TextColumnIs(HeapTuple tup, AttrNumber attno, TupleDesc desc, const char *value)
{
	bool		isnull;
	Datum		d = heap_getattr(tup, attno, desc, &isnull);
	char	   *str;
	bool		is;

	if (isnull)
		return false;
	str = TextDatumGetCString(d);
	is = strcmp(str, value) == 0;
	pfree(str);
	return is;
}

/*
 * Make the WAL record that covers the shard's last reservation durable, and
 * return its LSN.  nextval_internal() logs ahead and stamps the page with
 * that record's LSN.
 */
XLogRecPtr
FlushShardReservation(Oid relid)
{
	Relation	rel = relation_open(relid, NoLock);
	Buffer		buf = ReadBuffer(rel, 0);
	XLogRecPtr	lsn;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	lsn = PageGetLSN(BufferGetPage(buf));
	UnlockReleaseBuffer(buf);
	relation_close(rel, NoLock);
	XLogFlush(lsn);
	return lsn;
}

/*
 * A transaction that made a new generation and draws from it may still roll
 * back, and the older generation then comes back into force with the new
 * one's shards gone.  Before any value up to last is handed out, advance the
 * older generations' shards (non-transactionally, like nextval) so that
 * whatever comes back starts above last.  Generations made by this
 * transaction are advanced too, down to and including the newest one made
 * by a committed transaction.  This transaction holds the sequence's draw
 * lock exclusively (it made the generation), so nobody draws meanwhile.
 */
static void
ProtectOlderGenerations(int32 id, int32 newest, const char *name, int64 last)
{
	static SPIPlanPtr list_plan = NULL;
	static SPIPlanPtr set_plan = NULL;
	Oid			list_types[2] = {INT4OID, INT4OID};
	Oid			set_types[2] = {OIDOID, INT8OID};
	Datum		list_args[2] = {Int32GetDatum(id), Int32GetDatum(newest)};
	OwnerContext ctx;
	SPITupleTable *rows;
	uint64		n;
	int32		stop_below = PG_INT32_MIN;

	/* schema 1.0 keeps no layouts: ALTER EXTENSION sharded_seq UPDATE adds them */
	if (!ShardLayoutsStored())
		return;
	BeginAsOwner(&ctx);
	PreparePlan(&list_plan,
				"SELECT s.generation, s.shard, s.relid::pg_catalog.oid, s.gen_base, s.gen_shards,"
				"       s.gen_block, s.xmin"
				"  FROM sharded_seq.sequence_shards s"
				" WHERE s.seq_id OPERATOR(pg_catalog.=) $1 AND s.generation OPERATOR(pg_catalog.<) $2"
				" ORDER BY s.generation DESC",
				2, list_types);
	PreparePlan(&set_plan,
				"SELECT pg_catalog.setval($1::pg_catalog.regclass, $2, true)"
				" WHERE COALESCE(pg_catalog.pg_sequence_last_value($1::pg_catalog.regclass), -1)"
				"       OPERATOR(pg_catalog.<) $2",
				2, set_types);
	if (SPI_execute_plan(list_plan, list_args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list the generations of sharded sequence \"%s\"", name);
	rows = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	tup = rows->vals[i];
		TupleDesc	desc = rows->tupdesc;
		bool		isnull;
		bool		no_layout = false;
		int32		generation = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		int32		shard = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		Oid			relid = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
		int64		base = DatumGetInt64(SPI_getbinval(tup, desc, 4, &isnull));
		int32		shards;
		int32		block;
		TransactionId xmin;
		int128		first_index;
		int128		k_min;

		no_layout |= isnull;
		shards = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
		no_layout |= isnull;
		block = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
		no_layout |= isnull;
		xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 7, &isnull));

		if (generation < stop_below)
			break;
		if (!TransactionIdIsCurrentTransactionId(xmin))
			stop_below = generation;	/* committed: the last one that can come back */
		if (no_layout || shards < 1 || block < 1 || last < base)
			continue;
		/* first block index whose start lies above last, then this shard's k */
		first_index = ((int128) last - base) / block + 1;
		k_min = first_index <= shard ? 0 : (first_index - shard + shards - 1) / shards;
		if (k_min > 0 && k_min <= PG_INT64_MAX)
		{
			Datum		set_args[2] = {ObjectIdGetDatum(relid), Int64GetDatum((int64) (k_min - 1))};

			if (SPI_execute_plan(set_plan, set_args, NULL, false, 0) != SPI_OK_SELECT)
				elog(ERROR, "could not advance shard %u of sharded sequence \"%s\"",
					 relid, name);
		}
	}
	EndAsOwner(&ctx);
}

/*
 * The end of every carve of a block, a session's (engine.c CarveBlock) and
 * the node cache's (node_reserve.c CarveNodeBlock): nextval k of the shard
 * (shard_relid, shard), taken under the sequence's draw lock, is the block
 * *first .. *last (an error past bigint's end).  It is made durable (the
 * shard's WAL flushed; for a generation this transaction made, older
 * generations protected first, and everything this transaction wrote), confirmed by the synchronous standbys in force, and
 * counted as reserved.  An error leaves the block unused: the callers install
 * or publish it only after this returns.  Past the range's end it raises
 * 2200H, or for a prefetch (quiet_end) returns false: the draw that needs the
 * block raises it, once the values before it are out.
 */
bool
CarveFinish(const CarveSpec *spec, int64 k, int32 shard, Oid shard_relid,
			int64 *first, int64 *last)
{
	bool		overflow;
	XLogRecPtr	lsn;

	*first = BlockStart(spec->base, k, spec->shards, shard, spec->block, &overflow);
	if (overflow && spec->quiet_end)
		return false;
	if (overflow)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("sharded sequence \"%s\" has reached its maximum value", spec->name),
				 errdetail("Values never wrap around past %lld.", (long long) PG_INT64_MAX),
				 errhint("Move to a new sequence, or lower block and shards with sharded_seq.alter_sequence() if the remaining range is being skipped.")));
	if (pg_add_s64_overflow(*first, (int64) spec->block - 1, last))
		*last = PG_INT64_MAX;

	if (spec->own_generation)
	{
		ProtectOlderGenerations(spec->id, spec->generation, spec->name, *last);
		lsn = XactLastRecEnd;
		XLogFlush(lsn);
	}
	else
		lsn = FlushShardReservation(shard_relid);

	/* a promoted standby must know the block too */
	WaitForSyncStandbys(lsn, spec->name);
	StatsNoteReserved(spec->id, *last - *first + 1);
	return true;
}

/*
 * Highest value any shard of this generation has reserved, or base - 1 when
 * none has.  Runs inside SPI as the extension owner.
 */
int64
GenerationHighWater(int32 seq_id, int32 generation, int64 base, int32 shards,
					int32 block)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[2] = {INT4OID, INT4OID};
	Datum		args[2] = {Int32GetDatum(seq_id), Int32GetDatum(generation)};
	int64		high = base - 1;	/* base > PG_INT64_MIN, see create */

	PreparePlan(&plan,
				"SELECT s.shard, pg_catalog.pg_sequence_last_value(s.relid)"
				"  FROM sharded_seq.sequence_shards s"
				" WHERE s.seq_id OPERATOR(pg_catalog.=) $1 AND s.generation OPERATOR(pg_catalog.=) $2",
				2, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read shards of sharded sequence %d", seq_id);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		int32		shard = DatumGetInt32(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
		Datum		k = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
		bool		overflow;
		int64		start;
		int64		end;

		if (isnull)
			continue;
		start = BlockStart(base, DatumGetInt64(k), shards, shard, block, &overflow);
		if (overflow || pg_add_s64_overflow(start, (int64) block - 1, &end))
			end = PG_INT64_MAX;
		high = Max(high, end);
	}
	return high;
}

/*
 * The next block a shard (a native sequence) will reserve: its last_value
 * + 1, or 0 if it reserved none, read from its page as nextval_internal
 * leaves it (what pg_sequence_last_value reports).
 */
static int64
ShardNextK(Oid relid)
{
	Relation	rel = relation_open(relid, AccessShareLock);
	Buffer		buf = ReadBuffer(rel, 0);
	Page		page;
	ItemId		lp;
	HeapTupleHeader th;
	Form_pg_sequence_data seq;
	int64		next;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	lp = PageGetItemId(page, FirstOffsetNumber);
	th = (HeapTupleHeader) PageGetItem(page, lp);
	seq = (Form_pg_sequence_data) ((char *) th + th->t_hoff);
	next = seq->is_called ? seq->last_value + 1 : seq->last_value;
	UnlockReleaseBuffer(buf);
	relation_close(rel, NoLock);
	return next;
}

/*
 * The shards of the generation the last LowestNextShard looked at, in shard
 * order, kept while the config word has not moved since they were read with
 * the triggers that mark every write in place (common/config_word.c).
 */
static struct
{
	bool		valid;
	uint64		word;			/* the config word they were read under */
	Oid			config;
	int32		seq_id;
	int32		generation;
	int32		n;
	Oid		   *relids;			/* n, in TopMemoryContext */
}			ShardList;

/* Read the shards of a generation into ShardList (under the draw lock). */
static void
ReadShardList(int32 seq_id, int32 generation, int32 shards)
{
	Relation	config = table_open(ConfigRelid("sequence_config"), AccessShareLock);
	Relation	shards_rel = table_open(ConfigRelid("sequence_shards"), AccessShareLock);
	ConfigPlaces *places = SequenceConfigPlaces(config, shards_rel);
	Snapshot	snapshot;
	ScanKeyData key[2];
	SysScanDesc scan;
	HeapTuple	tup;
	uint64		word = 0;
	bool		settled;
	bool		keep;
	Oid		   *relids = MemoryContextAllocZero(TopMemoryContext, sizeof(Oid) * Max(shards, 1));
	int32		n = 0;

	ShardList.valid = false;
	settled = ConfigWordSettled(&word);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key[0], places->s_seq_id, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(seq_id));
	ScanKeyInit(&key[1], places->s_generation, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(generation));
	scan = systable_beginscan(shards_rel, places->by_generation, OidIsValid(places->by_generation),
							  snapshot, 2, key);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		TupleDesc	desc = RelationGetDescr(shards_rel);
		bool		isnull;
		int32		s = DatumGetInt32(heap_getattr(tup, places->s_shard, desc, &isnull));

		if (s < 0 || s >= shards || OidIsValid(relids[s]))
			continue;
		relids[s] = DatumGetObjectId(heap_getattr(tup, places->s_relid, desc, &isnull));
		n++;
	}
	systable_endscan(scan);
	/* a change of our own transaction, if any, keeps the word unsettled */
	keep = settled && ConfigWatched(snapshot);
	UnregisterSnapshot(snapshot);
	table_close(shards_rel, AccessShareLock);
	table_close(config, AccessShareLock);
	if (n != shards)
	{
		pfree(relids);
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("sharded sequence %d has %d of its %d shards in generation %d",
						seq_id, n, shards, generation),
				 errdetail("Rows of sharded_seq.sequence_shards are missing."),
				 errhint("Drop the sequence with sharded_seq.drop_sequence() and create it again above the highest value in use (start => ...).")));
	}
	if (ShardList.relids)
		pfree(ShardList.relids);
	ShardList.relids = relids;
	ShardList.n = n;
	ShardList.config = ConfigRelid("sequence_config");
	ShardList.seq_id = seq_id;
	ShardList.generation = generation;
	ShardList.word = word;
	ShardList.valid = keep;
}

/*
 * The shard of a generation whose next block comes first: the smallest
 * (k + 1) * shards + i over shards i that reserved block k last (0 for one
 * that reserved none).  Its next block lies above every block of the
 * generation that was the first in line when it was taken, so a node that
 * always takes this one hands out increasing blocks, consecutive ones when
 * it alone draws (node_reserve.c).  Call under the draw lock and the node
 * cache's reservation lock: no shard moves meanwhile, and no layout change
 * retires the generation.  Reads the shards' pages directly: no SQL; the
 * list of shards is read again only when the config word moved.
 */
Oid
LowestNextShard(int32 seq_id, int32 generation, int32 shards, int32 *shard)
{
	Oid			best_relid = InvalidOid;
	int128		best = 0;
	uint64		word;

	if (!ShardList.valid || !ConfigWordSettled(&word) || word != ShardList.word ||
		ShardList.seq_id != seq_id || ShardList.generation != generation ||
		ShardList.n != shards || ShardList.config != ConfigRelid("sequence_config"))
		ReadShardList(seq_id, generation, shards);
	for (int32 s = 0; s < shards; s++)
	{
		Oid			relid = ShardList.relids[s];
		int128		next = (int128) ShardNextK(relid) * shards + s;

		if (!OidIsValid(best_relid) || next < best)
		{
			best = next;
			best_relid = relid;
			*shard = s;
		}
	}
	return best_relid;
}

/*
 * May the caller see this sequence's positions (false for an unknown id)?
 * The sequences view lists every sequence, but its generation_start and its
 * node cache counts only to them.
 */
bool
SequenceIdReadable(int32 id)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(id)};
	OwnerContext ctx;
	bool		readable = false;

	BeginAsOwner(&ctx);
	PreparePlan(&plan,
				"SELECT owner::pg_catalog.oid, acl FROM sharded_seq.sequence_config"
				" WHERE id OPERATOR(pg_catalog.=) $1", 1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.sequence_config");
	if (SPI_processed == 1)
	{
		bool		isnull;
		Oid			owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		Datum		acl = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);

		readable = SequenceReadable(owner, isnull ? NULL : DatumGetAclP(acl), ctx.caller);
	}
	EndAsOwner(&ctx);
	return readable;
}
