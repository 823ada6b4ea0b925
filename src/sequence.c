/*
 * sequence.c
 *	  The sequence engine: sharded_nextval and sharded_currval.
 *
 * Each backend keeps, per sequence, the configuration it last loaded and the
 * block of values it reserved.  A block is reserved by advancing this
 * session's shard, a native sequence, with nextval_internal(): that is
 * WAL-logged and never rolled back.  The WAL that covers the reservation is
 * flushed before any value of the block is returned, so no crash can hand a
 * value out twice.
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "sharded_seq.h"

typedef struct SeqEntry
{
	char		name[NAMEDATALEN];	/* hash key */

	/* configuration, valid while loaded_epoch == ConfigEpoch */
	uint64		loaded_epoch;
	int32		id;
	int32		generation;
	int64		base;
	int32		shards;
	int32		block;
	int32		shard;			/* this session's shard */
	Oid			shard_relid;
	Oid			owner;
	Acl		   *acl;			/* in TopMemoryContext, or NULL */
	Oid			checked_user;	/* user whose USAGE was checked, or 0 */

	/* this session's block: next .. block_end, from block_generation */
	bool		have_block;
	int32		block_generation;
	int64		next;
	int64		block_end;

	/* for sharded_currval */
	bool		last_valid;
	int64		last;
} SeqEntry;

static HTAB *SeqEntries = NULL;
static uint32 SessionSalt = 0;

/* Load name's configuration with the latest snapshot; false if it is gone. */
static bool
LoadSequenceConfig(SeqEntry *entry)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	Oid			saved_user;
	int			saved_context;
	bool		found = false;

	args[0] = CStringGetTextDatum(entry->name);
	BecomeExtensionOwner(&saved_user, &saved_context);
	SPI_connect();
	PreparePlan(&plan,
				"SELECT c.id, c.generation, c.base, c.shards, c.block, c.owner::pg_catalog.oid, c.acl,"
				"       (SELECT pg_catalog.array_agg(s.relid::pg_catalog.oid ORDER BY s.shard)"
				"          FROM sharded_seq.sequence_shards s"
				"         WHERE s.seq_id = c.id AND s.generation = c.generation)"
				"  FROM sharded_seq.sequence_config c WHERE c.name = $1",
				1, argtypes);
	if (SPI_execute_snapshot(plan, args, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.sequence_config");

	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int32		id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		Datum		acl;
		ArrayType  *relids;
		Datum	   *relid_values;
		int			nrelids;

		if (id != entry->id)
		{
			/* new object under this name: forget this session's past */
			entry->have_block = false;
			entry->last_valid = false;
		}
		entry->id = id;
		entry->generation = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		entry->base = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		entry->shards = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
		entry->block = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
		entry->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 6, &isnull));
		if (entry->acl)
			pfree(entry->acl);
		acl = SPI_getbinval(tup, desc, 7, &isnull);
		entry->acl = CopyAcl(acl, isnull);
		relids = DatumGetArrayTypeP(SPI_getbinval(tup, desc, 8, &isnull));
		if (isnull)
			elog(ERROR, "sharded sequence \"%s\" has no shards", entry->name);
		deconstruct_array(relids, OIDOID, sizeof(Oid), true, TYPALIGN_INT,
						  &relid_values, NULL, &nrelids);
		if (nrelids != entry->shards)
			elog(ERROR, "sharded sequence \"%s\" has %d shards, expected %d",
				 entry->name, nrelids, entry->shards);
		entry->shard = (int32) ((SessionSalt + (uint32) id) % (uint32) entry->shards);
		entry->shard_relid = DatumGetObjectId(relid_values[entry->shard]);
		entry->checked_user = InvalidOid;
		found = true;
	}
	SPI_finish();
	RestoreUser(saved_user, saved_context);
	entry->loaded_epoch = ConfigEpoch;
	return found;
}

static SeqEntry *
LookupSequence(FunctionCallInfo fcinfo)
{
	bool		is_new;
	SeqEntry   *entry = CallSiteEntry(fcinfo, &SeqEntries, sizeof(SeqEntry),
									  KIND_SEQUENCE, &is_new);

	if (SessionSalt == 0)
		SessionSalt = murmurhash32((uint32) MyProcPid ^ (uint32) MyStartTime) | 1;
	if (is_new && !LoadSequenceConfig(entry))
	{
		char		name[NAMEDATALEN];

		strlcpy(name, entry->name, sizeof(name));
		ForgetEntry(fcinfo, SeqEntries, entry, entry->acl);
		ReportNotFound(KIND_SEQUENCE, name);
	}

	/* See administrative changes committed by other sessions at once. */
	AcceptInvalidationMessages();
	if (entry->loaded_epoch != ConfigEpoch && !LoadSequenceConfig(entry))
		ReportNotFound(KIND_SEQUENCE, entry->name);
	if (entry->checked_user != GetUserId())
	{
		CheckPrivilege(KIND_SEQUENCE, entry->name, entry->owner, entry->acl, ACL_USAGE);
		entry->checked_user = GetUserId();
	}
	return entry;
}

/*
 * Make the WAL record that covers the shard's last reservation durable.
 * nextval_internal() logs ahead and stamps the page with that record's LSN.
 */
static void
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
}

static void
DrawBlock(SeqEntry *entry)
{
	Oid			config_relid = ConfigRelid("sequence_config");
	int32		locked_id;
	int64		k;
	int64		start;
	bool		overflow;

	/*
	 * Hold the sequence's draw lock while reserving: a layout change takes it
	 * exclusively from reading the shards' high-water marks until it commits.
	 * Taking the lock also reads pending invalidations, so if our layout is
	 * still current now, no change can slip in before we reserve.
	 */
	for (;;)
	{
		locked_id = entry->id;
		LockDatabaseObject(config_relid, locked_id, 0, ShareLock);
		if (entry->loaded_epoch == ConfigEpoch)
			break;
		UnlockDatabaseObject(config_relid, locked_id, 0, ShareLock);
		if (!LoadSequenceConfig(entry))
			ReportNotFound(KIND_SEQUENCE, entry->name);
	}
	k = nextval_internal(entry->shard_relid, false);
	UnlockDatabaseObject(config_relid, locked_id, 0, ShareLock);

	FlushShardReservation(entry->shard_relid);

	start = BlockStart(entry->base, k, entry->shards, entry->shard, entry->block, &overflow);
	if (overflow)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("sharded sequence \"%s\" has reached its maximum value", entry->name),
				 errdetail("Values never wrap around past %lld.", (long long) PG_INT64_MAX),
				 errhint("Move to a new sequence, or lower block and shards with sharded_seq.alter_sequence() if the remaining range is being skipped.")));
	entry->next = start;
	if (pg_add_s64_overflow(start, (int64) entry->block - 1, &entry->block_end))
		entry->block_end = PG_INT64_MAX;
	entry->block_generation = entry->generation;
	entry->have_block = true;
}

PG_FUNCTION_INFO_V1(sharded_nextval);
Datum
sharded_nextval(PG_FUNCTION_ARGS)
{
	SeqEntry   *entry;
	int64		value;

	PreventCommandIfReadOnly("sharded_nextval()");
	PreventCommandIfParallelMode("sharded_nextval()");

	entry = LookupSequence(fcinfo);
	if (!entry->have_block || entry->block_generation != entry->generation)
		DrawBlock(entry);

	value = entry->next;
	if (value == entry->block_end)
		entry->have_block = false;
	else
		entry->next++;

	entry->last = value;
	entry->last_valid = true;
	PG_RETURN_INT64(value);
}

PG_FUNCTION_INFO_V1(sharded_currval);
Datum
sharded_currval(PG_FUNCTION_ARGS)
{
	SeqEntry   *entry = LookupSequence(fcinfo);

	if (!entry->last_valid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_currval of sequence \"%s\" is not yet defined in this session",
						entry->name),
				 errhint("Call sharded_nextval('%s') in this session first.", entry->name)));
	PG_RETURN_INT64(entry->last);
}
