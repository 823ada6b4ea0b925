/*
 * config.c
 *	  What the catalog says about a counter, read directly with the latest
 *	  snapshot: its counter_config row (FetchCounterConfig) and how many times
 *	  set_counter has set it (CounterSetCount, the count a memcached commit
 *	  carries).  Both run on the engine's paths (a counter met for the first
 *	  time, a growing commit, a memcached commit) and need no rights of the
 *	  caller's, so they use the heap and the index, not SPI.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/transam.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

/* counter_config's columns, the same in every schema version */
#define Anum_config_id			1
#define Anum_config_name		2
#define Anum_config_shards		3
#define Anum_config_mode		4
#define Anum_config_owner		5
#define Anum_config_acl			6

/*
 * A counter's configuration row, by name (or, with name NULL, by id), as the
 * latest snapshot sees it.  Read directly: this runs whenever a session meets
 * a counter it has not cached, and needs no rights of the caller's.
 */
bool
FetchCounterConfig(const char *name, int32 id, CounterConfigRow *row)
{
	Relation	rel = table_open(ConfigRelid("counter_config"), AccessShareLock);
	Oid			indexid = ConfigRelid(name ? "counter_config_name_key" : "counter_config_pkey");
	Relation	index = index_open(indexid, AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	if (name)
		ScanKeyEntryInitialize(&key, 0, Anum_config_name, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[0], F_TEXTEQ,
							   CStringGetTextDatum(name));
	else
		ScanKeyInit(&key, Anum_config_id, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(id));
	scan = systable_beginscan(rel, indexid, true, snapshot, 1, &key);
	/* a change may commit here, after the snapshot (specs/config_race) */
	WAIT_POINT("counter-config-read");
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		isnull;
		Datum		d;
		text	   *mode;

		row->id = DatumGetInt32(heap_getattr(tup, Anum_config_id, desc, &isnull));
		d = heap_getattr(tup, Anum_config_shards, desc, &isnull);
		row->shards = isnull ? 0 : DatumGetInt32(d);
		mode = DatumGetTextPP(heap_getattr(tup, Anum_config_mode, desc, &isnull));
		row->mode = ParseCounterMode(VARDATA_ANY(mode), VARSIZE_ANY_EXHDR(mode));
		row->owner = DatumGetObjectId(heap_getattr(tup, Anum_config_owner, desc, &isnull));
		d = heap_getattr(tup, Anum_config_acl, desc, &isnull);
		row->acl = CopyAcl(d, isnull, CurrentMemoryContext);
		/* frozen: its raw xid may be older than the commit log kept */
		row->xmin = HeapTupleHeaderXminFrozen(tup->t_data) ? FrozenTransactionId
			: HeapTupleHeaderGetRawXmin(tup->t_data);
		found = true;
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * How many times set_counter has set a counter, as the latest snapshot sees
 * it: its counter_sets row (schema 1.5), or 0.  Read only on the rare paths:
 * a memcached commit once per configuration load, a flush from memcached
 * with an amount, a leftover's write.
 */
int64
CounterSetCount(int32 counter_id)
{
	Relation	rel;
	Snapshot	snapshot;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	int64		sets = 0;

	if (!CounterSetsStored())
		return 0;
	rel = table_open(ConfigRelid("counter_sets"), AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(counter_id));
	scan = systable_beginscan(rel, ConfigRelid("counter_sets_pkey"), true, snapshot, 1, &key);
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;

		sets = DatumGetInt64(heap_getattr(tup, 2, RelationGetDescr(rel), &isnull));
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	return sets;
}
