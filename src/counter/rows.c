/*
 * rows.c
 *	  The one writer of counter shard rows, and access to single rows: every
 *	  insert, update and delete of a shard row goes through ShardWrite, which
 *	  marks the counter's layout word first (the rule in layout.c), by the
 *	  heap or by an SQL plan (ShardRowsSql, rewrite.c); every other file asks
 *	  it (test/structure/one_writer.sh checks that no file writes the table
 *	  any other way).  Also here: scanning a counter's rows by the index
 *	  (ScanShards), adding to one row (UpdateShard), adding one
 *	  (InsertShardRow), with the index entries a write makes.
 *
 * The trigger rows_changed_elsewhere lives here, beside the writer: it marks
 * every write that does not go through ShardWrite, and tells the engine's own
 * SQL writes from the others by a flag only ShardWrite sets.  The two halves
 * of the net under kept totals stay in one file, with the flag static.
 *
 * These run on the hot paths of counter_incr, counter_value and of applying
 * a transaction's increments at commit (apply.c, sums.c), so they use the
 * heap and the indexes directly rather than SPI.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "commands/trigger.h"
#include "common/int.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

/*
 * Total over every node's rows, as int128.  refs (unless NULL) collects the
 * rows of the node whose shards start at base, and *nall counts all rows.
 */
int128
ScanShards(Relation rel, int32 counter_id, Snapshot snapshot, int32 base,
		   ShardRef **refs, int *nrefs, int *nall)
{
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	TupleDesc	desc = RelationGetDescr(rel);
	int128		sum = 0;
	int			n = 0;
	int			cap = 0;
	int			all = 0;

	ScanKeyInit(&key, Anum_shard_counter_id, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(counter_id));
	scan = systable_beginscan(rel, ConfigRelid("counter_shards_pkey"), true,
							  snapshot, 1, &key);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		int64		value = DatumGetInt64(heap_getattr(tup, Anum_shard_value, desc, &isnull));
		int32		shard = DatumGetInt32(heap_getattr(tup, Anum_shard_shard, desc, &isnull));

		sum += value;
		all++;
		if (refs && shard >= base && shard < base + NODE_SHARDS)
		{
			if (n == cap)
			{
				cap = cap ? cap * 2 : 32;
				*refs = n ? repalloc(*refs, cap * sizeof(ShardRef)) : palloc(cap * sizeof(ShardRef));
			}
			(*refs)[n].shard = shard;
			(*refs)[n].tid = tup->t_self;
			(*refs)[n].value = value;
			n++;
		}
	}
	systable_endscan(scan);
	if (nrefs)
		*nrefs = n;
	if (nall)
		*nall = all;
	return sum;
}

/*
 * The common case of InsertIndexEntries, without an executor: the table has
 * only the extension's own indexes, each valid and ready.  Returns false,
 * having inserted nothing, for any other set of indexes.
 */
static bool
InsertOwnIndexEntries(Relation rel, HeapTuple newtup, bool moved)
{
	List	   *indexes = RelationGetIndexList(rel);
	Relation	opened[2];
	int			n = 0;
	bool		own = list_length(indexes) <= 2;
	ListCell   *lc;
	Datum		values[2];
	bool		isnull[2] = {false, false};
	bool		null;

	foreach(lc, indexes)
	{
		Relation	index;
		const char *name;

		if (!own)
			break;
		index = index_open(lfirst_oid(lc), RowExclusiveLock);
		opened[n++] = index;
		name = RelationGetRelationName(index);
		own = index->rd_index->indisvalid && index->rd_index->indisready &&
			index->rd_index->indislive &&
			(strcmp(name, "counter_shards_pkey") == 0 ||
			 strcmp(name, "counter_shards_extra") == 0 ||
			 strcmp(name, "counter_shards_multi") == 0);
	}
	if (own)
	{
		int32		shard = DatumGetInt32(heap_getattr(newtup, Anum_shard_shard,
													   RelationGetDescr(rel), &null));

		values[0] = heap_getattr(newtup, Anum_shard_counter_id, RelationGetDescr(rel), &null);
		values[1] = Int32GetDatum(shard);
		for (int i = 0; i < n; i++)
		{
			const char *name = RelationGetRelationName(opened[i]);
			bool		pkey = strcmp(name, "counter_shards_pkey") == 0;

			/*
			 * The other one is partial, on counter_id alone: rows other than
			 * each node's first (shard % 1024 <> 0, schema 1.3), or other
			 * than shard 0 (counter_shards_multi, schema 1.2).  An update
			 * never changes the key ("unchanged"), which lets btree delete
			 * old versions' entries bottom-up, not split.
			 */
			if (!pkey && (strcmp(name, "counter_shards_extra") == 0 ?
						  shard % NODE_SHARDS == 0 : shard == 0))
				continue;
			index_insert(opened[i], values, isnull, &newtup->t_self,
						 rel, pkey ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, moved,
						 BuildIndexInfo(opened[i]));
		}
	}
	for (int i = 0; i < n; i++)
		index_close(opened[i], NoLock);
	list_free(indexes);
	return own;
}

/*
 * Index a new row, or (moved) the new version of a row that a non-HOT
 * update moved, in every index the table has, as INSERT and UPDATE do: that
 * includes an index being built concurrently (CREATE INDEX or REINDEX
 * CONCURRENTLY) and any index an administrator added.
 */
void
InsertIndexEntries(Relation rel, HeapTuple newtup, bool moved, bool only_summarizing)
{
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;

	if (!only_summarizing && InsertOwnIndexEntries(rel, newtup, moved))
		return;
	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);

	InitResultRelInfo(rri, rel, 1, NULL, 0);
	ExecOpenIndices(rri, false);
	ExecStoreHeapTuple(newtup, slot, false);
	/* update = false: its hint would need a range table, which we lack */
#if PG_VERSION_NUM >= 160000
	(void) ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL,
								 only_summarizing);
#else
	Assert(!only_summarizing);
	(void) ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL);
#endif
	ExecCloseIndices(rri);
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
}

/*
 * Add delta to the newest version of the shard row at ref.  Increments
 * commute, so this follows concurrent updates whatever the isolation level,
 * and no increment is lost.  With wait = false a shard that another
 * transaction holds is reported busy instead of waited for.
 *
 * ref may be a location remembered from an earlier statement, since pruned
 * and reused, so it is used only if the row there is visible to snapshot and
 * is the same shard; newer versions reached from it were made by committed
 * updates, which no one can prune while snapshot is held.
 */
ShardResult
UpdateShard(Relation rel, int32 counter_id, ShardRef *ref, int64 delta,
			bool wait, Snapshot snapshot)
{
	ItemPointerData tid = ref->tid;
	TupleDesc	desc = RelationGetDescr(rel);
	Snapshot	fetch_snapshot = snapshot;

	for (;;)
	{
		HeapTupleData oldtup;
		Buffer		buf;
		HeapTuple	newtup;
		Datum		values[Natts_shard];
		bool		nulls[Natts_shard];
		TM_FailureData tmfd;
		TM_Result	result;
		int64		newvalue;

		oldtup.t_self = tid;
		if (!heap_fetch(rel, fetch_snapshot, &oldtup, &buf, true))
		{
			if (BufferIsValid(buf))
				ReleaseBuffer(buf);
			return SHARD_GONE;
		}
		fetch_snapshot = SnapshotAny;
		heap_deform_tuple(&oldtup, desc, values, nulls);
		/* make room on the page, so that the update can stay HOT */
		heap_page_prune_opt(rel, buf);
		ReleaseBuffer(buf);
		/* a remembered location may since have been pruned and reused */
		if (DatumGetInt32(values[Anum_shard_counter_id - 1]) != counter_id ||
			DatumGetInt32(values[Anum_shard_shard - 1]) != ref->shard)
			return SHARD_GONE;
		if (pg_add_s64_overflow(DatumGetInt64(values[Anum_shard_value - 1]), delta, &newvalue))
			return SHARD_FULL;
		values[Anum_shard_value - 1] = Int64GetDatum(newvalue);
		newtup = heap_form_tuple(desc, values, nulls);

		result = ShardWrite(&(ShardWriteOp) {
			.kind = WRITE_UPDATE, .counter_id = counter_id, .rel = rel,
			.tid = &tid, .tuple = newtup, .wait = wait, .tmfd = &tmfd});
		heap_freetuple(newtup);
		switch (result)
		{
			case TM_Ok:
				return SHARD_UPDATED;
			case TM_BeingModified:
				return SHARD_BUSY;
			case TM_Updated:
				tid = tmfd.ctid;	/* a newer version: add to that one */
				continue;
			case TM_Deleted:
			case TM_SelfModified:
				return SHARD_GONE;
			default:
				elog(ERROR, "unexpected heap_update status %d on a counter shard", result);
		}
	}
}

/* Insert a shard row and its index entries. */
void
InsertShardRow(Relation rel, int32 counter_id, int32 shard, int64 value, int options)
{
	Datum		values[Natts_shard];
	bool		nulls[Natts_shard] = {false, false, false};
	HeapTuple	tup;

	values[Anum_shard_counter_id - 1] = Int32GetDatum(counter_id);
	values[Anum_shard_shard - 1] = Int32GetDatum(shard);
	values[Anum_shard_value - 1] = Int64GetDatum(value);
	tup = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	(void) ShardWrite(&(ShardWriteOp) {
		.kind = WRITE_INSERT, .counter_id = counter_id, .rel = rel,
		.tuple = tup, .options = options});
	heap_freetuple(tup);
}

/* ---- the one door for writing shard rows ---- */

/* set while ShardWrite runs an SQL plan (rewrite.c): rows_changed_elsewhere
 * then knows the write for the engine's own */
static bool EngineSqlWriting = false;

/*
 * Every write of a shard row by the engine goes through here, by the heap
 * (insert, update, delete, with their index entries) or by one of the SQL
 * plans of rewrite.c.  The counter's layout word is marked before the write can be
 * seen: the rule kept totals stand on (layout.c).  The trigger
 * rows_changed_elsewhere knows an SQL write for the engine's own for as long
 * as the plan runs, and no other write.  Nothing else in the extension
 * writes counter_shards (test/structure/one_writer.sh checks it).
 */
TM_Result
ShardWrite(const ShardWriteOp *op)
{
	LockTupleMode lockmode;
	ShardedIndexUpdate indexes;
	TM_Result	result;
	int			rc;

	LayoutChanging(op->counter_id);
	switch (op->kind)
	{
		case WRITE_INSERT:
			heap_insert(op->rel, op->tuple, GetCurrentCommandId(true), op->options, NULL);
			InsertIndexEntries(op->rel, op->tuple, false, false);
			return TM_Ok;
		case WRITE_UPDATE:
			result = ShardedHeapUpdate(op->rel, op->tid, op->tuple,
									   GetCurrentCommandId(true), InvalidSnapshot,
									   op->wait, op->tmfd, &lockmode, &indexes);
			if (result == TM_Ok && indexes != INDEX_UPDATE_NONE)
				InsertIndexEntries(op->rel, op->tuple, true,
								   indexes == INDEX_UPDATE_SUMMARIZING);
			return result;
		case WRITE_DELETE:
			return heap_delete(op->rel, op->tid, GetCurrentCommandId(true),
							   InvalidSnapshot, false, op->tmfd, false);
		case WRITE_SQL:
			break;
	}
	EngineSqlWriting = true;
	PG_TRY();
	{
		rc = SPI_execute_plan(op->plan, op->args, NULL, false, 0);
	}
	PG_FINALLY();
	{
		EngineSqlWriting = false;
	}
	PG_END_TRY();
	if (rc != op->expected)
		elog(ERROR, "could not %s: %s", op->what, SPI_result_code_string(rc));
	return TM_Ok;
}

/*
 * Fired for every row of counter_shards written and every TRUNCATE of it,
 * and every claim changed (ENABLE ALWAYS: in logical replication's apply
 * worker too).  A shard row write marks its counter's layout word (a
 * TRUNCATE every word) before it can be seen, whoever makes it: this is
 * the net under kept totals (the rule in layout.c).  A write other
 * than the engine's own SQL (ShardWrite) also tells sessions that
 * rows may now come and go behind their back (no read from remembered
 * places any more, in this server's life when preloaded), and a changed
 * claim is checked again.
 */
PG_FUNCTION_INFO_V1(rows_changed_elsewhere);
Datum
rows_changed_elsewhere(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	bool		shards;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.rows_changed_elsewhere() must be called as a trigger"),
				 errhint("It is fired by changes to sharded_seq.counter_shards and sharded_seq.node_claims; do not call it directly.")));
	shards = RelationGetRelid(trigdata->tg_relation) == ConfigRelid("counter_shards");
	if (shards)
	{
		if (TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		{
			bool		isnull;
			Datum		id = heap_getattr(trigdata->tg_trigtuple, 1,
										  RelationGetDescr(trigdata->tg_relation), &isnull);

			if (!isnull)
				LayoutChanging(DatumGetInt32(id));
		}
		else
			LayoutChangingAll();
		if (EngineSqlWriting)
			return PointerGetDatum(NULL);
	}
	else if (InSecurityRestrictedOperation() && GetUserId() == ExtensionOwner())
	{
		/* the engine's own claim (InsertClaim), made as the owner */
		return PointerGetDatum(NULL);
	}
	NoteForeignRows();
	CacheInvalidateRelcache(trigdata->tg_relation);
	return PointerGetDatum(NULL);
}
