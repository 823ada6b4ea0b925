/*
 * cutover.c
 *	  A server stopped by a cutover across logical replication: the row of
 *	  sharded_seq.cutover_stops keyed by its system identifier, the check the
 *	  engines make before handing out a value or taking an increment (and,
 *	  for counters, on a subscriber before its cutover), the wait for
 *	  transactions in flight, and cutover_stop() / cutover_resume() (run on
 *	  the old primary).
 *
 * The row replicates to the subscriber with the rest of the tables; there
 * another system identifier makes it mean nothing.  A session remembers that
 * its server is not stopped until configuration may have changed
 * (ConfigEpoch): cutover_stop() announces a change of both config tables,
 * so every later transaction, and every reservation (it takes the draw lock,
 * which reads invalidations), looks again.  A refusal is not remembered.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_subscription_rel.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/pg_lsn.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "topology/topology.h"

static uint64 NotStoppedEpoch = 0;	/* ConfigEpoch when found not stopped */
static uint64 NotAwaitingEpoch = 0; /* ConfigEpoch when no cutover awaited */

/* Does this schema have cutover_stops (1.5)? */
bool
CutoverStopsStored(void)
{
	Oid			namespace = get_namespace_oid(SHARDED_SEQ_SCHEMA, true);

	return OidIsValid(namespace) && OidIsValid(get_relname_relid("cutover_stops", namespace));
}

/* This server's system identifier, as cutover_stops keys it. */
char *
CutoverSystemText(void)
{
	return psprintf(UINT64_FORMAT, GetSystemIdentifier());
}

/*
 * Is there a row for system in cutover_stops, as the latest snapshot sees
 * it?  Read through the primary key directly: no SQL, no privilege.
 */
bool
CutoverRowFor(const char *system, XLogRecPtr *flushed)
{
	Relation	rel = table_open(ConfigRelid("cutover_stops"), AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found;

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, CStringGetTextDatum(system));
	scan = systable_beginscan(rel, ConfigRelid("cutover_stops_pkey"), true, snapshot, 1, &key);
	tup = systable_getnext(scan);
	found = HeapTupleIsValid(tup);
	if (found && flushed)
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, 3, RelationGetDescr(rel), &isnull);

		*flushed = isnull ? InvalidXLogRecPtr : DatumGetLSN(d);
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	return found;
}

static pg_noinline bool
CutoverStoppedRead(void)
{
	bool		stopped;

	if (!CutoverStopsStored())
		stopped = false;
	else
		stopped = CutoverRowFor(CutoverSystemText(), NULL);
	if (!stopped)
		NotStoppedEpoch = ConfigEpoch;
	return stopped;
}

/* Has a cutover stopped this server?  Never raises for a missing table. */
bool
CutoverStopped(void)
{
	/* looked at under this epoch: nothing was written to cutover_stops since */
	if (NotStoppedEpoch == ConfigEpoch)
		return false;
	return CutoverStoppedRead();
}

/*
 * A copy of configuration made while this server was not stopped still holds
 * (sequence/directory.c): remember it as a look of our own under epoch.
 */
void
CutoverNoteNotStopped(uint64 epoch)
{
	NotStoppedEpoch = epoch;
}

/* Refuse to hand out a value or take an increment on a stopped server. */
void
CutoverStopCheck(void)
{
	if (!CutoverStopped())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("sharded_seq on this server was stopped by a cutover"),
			 errdetail("Another server took over its sequences and counters (sharded_seq.cutover() on the new primary); values drawn here now could be handed out twice."),
			 errhint("Write to the new primary.  If the cutover was abandoned, SELECT sharded_seq.cutover_resume() here undoes the stop.")));
}

/*
 * Has a cutover() of this server completed for subscription subid?  Its row
 * of cutover_done, keyed by this server's system identifier: the table
 * replicates onwards with the rest (a chain of cutovers), and rows of other
 * servers mean nothing here.
 */
static bool
CutoverDoneFor(Oid subid, const char *self)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	Snapshot	snapshot;
	bool		done = false;

	rel = table_open(ConfigRelid("cutover_done"), AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
	while (!done && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		null1;
		bool		null2;
		Datum		system = heap_getattr(tup, 1, RelationGetDescr(rel), &null1);
		Datum		sub = heap_getattr(tup, 2, RelationGetDescr(rel), &null2);

		done = !null1 && !null2 && DatumGetObjectId(sub) == subid &&
			strcmp(TextDatumGetCString(system), self) == 0;
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	return done;
}

/*
 * Does this database subscribe to sequence_config (it is the subscriber of
 * a cutover) through a subscription no cutover() of this server has
 * completed for?  Multi-primary groups never publish sequence_config.  Read
 * directly, no SQL; remembered per ConfigEpoch when false (the apply
 * worker's writes and cutover() bump it).
 */
static bool
CutoverAwaited(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *self = NULL;
	bool		awaited = false;

	if (NotAwaitingEpoch == ConfigEpoch)
		return false;
	if (!CutoverStopsStored())
		return false;
	rel = table_open(SubscriptionRelRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_subscription_rel_srrelid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ConfigRelid("sequence_config")));
	scan = systable_beginscan(rel, SubscriptionRelSrrelidSrsubidIndexId, true, NULL, 1, &key);
	while (!awaited && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		Oid			subid = ((Form_pg_subscription_rel) GETSTRUCT(tup))->srsubid;

		if (self == NULL)
			self = CutoverSystemText();
		awaited = !CutoverDoneFor(subid, self);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!awaited)
		NotAwaitingEpoch = ConfigEpoch;
	return awaited;
}

/* cutover() completed for subscription subid: record it (as the owner). */
void
CutoverRecordDone(Oid subid)
{
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		args[2] = {CStringGetTextDatum(CutoverSystemText()), ObjectIdGetDatum(subid)};

	if (SPI_execute_with_args("INSERT INTO sharded_seq.cutover_done (system_identifier, subscription)"
							  " VALUES ($1, $2) ON CONFLICT (system_identifier, subscription)"
							  " DO UPDATE SET done_at = pg_catalog.now()",
							  2, argtypes, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the cutover in sharded_seq.cutover_done");
	/* sessions that found a cutover awaited look again */
	AnnounceConfigChange("counter_config");
}

/*
 * Refuse a counter increment or set on a stopped server, and on the
 * subscriber of a cutover before cutover(): the publisher's counter rows
 * replicate over this server's, so what is added here would be lost.
 */
void
CutoverCounterCheck(void)
{
	CutoverStopCheck();
	if (!CutoverAwaited())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("counters of this database arrive by logical replication, and no cutover has been made"),
			 errdetail("This database subscribes to sharded_seq.sequence_config: the publisher's counter rows would overwrite an increment made here."),
			 errhint("Increment on the publisher, or SELECT sharded_seq.cutover('subscription_name') here first.")));
}

/* The publisher-side functions: a superuser or the extension's owner. */
void
CutoverCheckPrivilege(const char *function)
{
	Oid			owner = ExtensionOwner();

	if (superuser() || (OidIsValid(owner) && has_privs_of_role(GetUserId(), owner)))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for %s", function),
			 errdetail("It stops or resumes every sharded sequence and counter of this database."),
			 errhint("Run it as a superuser or as the owner of the extension sharded_seq (on the publisher: the role of the subscription's connection).")));
}

/*
 * Wait until every transaction in progress now in this database has ended
 * (as CREATE INDEX CONCURRENTLY waits): one that began before the stop may
 * still commit increments.  Skips this backend, and vacuum.
 */
void
WaitForTransactionsInFlight(void)
{
	int			n;
	VirtualTransactionId *vxids;

	vxids = GetCurrentVirtualXIDs(InvalidTransactionId, false, false,
								  PROC_IS_AUTOVACUUM | PROC_IN_VACUUM, &n);
	for (int i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		(void) VirtualXactLock(vxids[i], true);
	}
	pfree(vxids);
}

static void
RequireStops(void)
{
	if (!CutoverStopsStored())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("sharded_seq's schema here predates cutovers"),
				 errhint("ALTER EXTENSION sharded_seq UPDATE (to 1.5 or later), then call again.")));
}

/*
 * cutover_stop(): stop this server (the old primary of a cutover).  Returns
 * its system identifier.  Committed before cutover_source() runs, so that
 * the transactions that source waits for are the only ones that could still
 * add to a counter.
 */
PG_FUNCTION_INFO_V1(cutover_stop);
Datum
cutover_stop(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	char	   *system = CutoverSystemText();
	Datum		args[1] = {CStringGetTextDatum(system)};
	OwnerContext ctx;

	PreventCommandIfReadOnly("sharded_seq.cutover_stop()");
	CutoverCheckPrivilege("sharded_seq.cutover_stop()");
	RequireStops();
	BeginAsOwner(&ctx);
	PreparePlan(&plan,
				"INSERT INTO sharded_seq.cutover_stops (system_identifier) VALUES ($1)"
				" ON CONFLICT DO NOTHING", 1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the stop of this server");
	AnnounceConfigChange("sequence_config");
	AnnounceConfigChange("counter_config");
	EndAsOwner(&ctx);
	PG_RETURN_TEXT_P(cstring_to_text(system));
}

/* cutover_resume(): undo cutover_stop() here; true if this server was stopped. */
PG_FUNCTION_INFO_V1(cutover_resume);
Datum
cutover_resume(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(CutoverSystemText())};
	OwnerContext ctx;
	bool		found;

	PreventCommandIfReadOnly("sharded_seq.cutover_resume()");
	CutoverCheckPrivilege("sharded_seq.cutover_resume()");
	RequireStops();
	BeginAsOwner(&ctx);
	PreparePlan(&plan,
				"DELETE FROM sharded_seq.cutover_stops WHERE system_identifier OPERATOR(pg_catalog.=) $1",
				1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not remove the stop of this server");
	found = SPI_processed > 0;
	AnnounceConfigChange("sequence_config");
	AnnounceConfigChange("counter_config");
	EndAsOwner(&ctx);
	PG_RETURN_BOOL(found);
}
