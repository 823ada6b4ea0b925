/*
 * worker.c
 *	  The background workers: a launcher, and one worker per database that
 *	  has the extension, which every sharded_seq.counter_flush_interval
 *	  flushes write-behind counters (shared memory and memcached) into their
 *	  shard rows and runs maintain().  Also the utility hook that moves a
 *	  worker out of the way of commands that need a database to themselves,
 *	  and the worker_status() function behind the workers view.
 *
 * Modelled on TimescaleDB's scheduler: the launcher connects to no database
 * and reads pg_database; it starts a worker for every database it is told
 * of (a backend that uses the extension, or CREATE EXTENSION, tells it) and,
 * once at start, for every database that accepts connections.  A worker in
 * a database without the extension unregisters it and exits.  Template
 * databases get no worker: CREATE DATABASE copies them only when nobody is
 * connected.
 */
#include "postgres.h"

#include <signal.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "common/hashfn.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "common/common.h"

#define RESTART_DELAY_MS	1000
#define PAUSE_MS			60000	/* longest a database command keeps it away */
#define SHUTDOWN_FIRST_LOG_MS 2000	/* waiting for pinned slots: say so after */
#define SHUTDOWN_LOG_MS		5000	/* and again every */
#define SHUTDOWN_RETRY_MS	5000	/* rows held at the last flush: try again for */

static ProcessUtility_hook_type prev_utility_hook = NULL;
static volatile sig_atomic_t got_sigterm = false;

PGDLLEXPORT void sharded_seq_launcher_main(Datum arg);
PGDLLEXPORT void sharded_seq_worker_main(Datum arg);


/* ---- the launcher ---- */

static void
HandleSigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	got_sigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

/*
 * Read pg_database: at the first scan, every database that accepts
 * connections is wanted; entries of databases gone, or that became templates
 * or stopped accepting connections, are dropped once their worker is gone.
 */
static void
ScanDatabases(bool first)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	Oid			usable[REGISTRY_MAX_DBS * 4];
	int			nusable = 0;
	Oid		   *all = palloc(sizeof(Oid) * 1024);
	int			nall = 0;
	int			room = 1024;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);

		if (d->datallowconn && !d->datistemplate && nusable < lengthof(usable))
			usable[nusable++] = d->oid;
		if (nall == room)
		{
			room *= 2;
			all = repalloc(all, sizeof(Oid) * room);
		}
		all[nall++] = d->oid;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	/* slots of a database dropped meanwhile belong to nothing */
	SlotsFreeGoneDatabases(all, nall);
	CommitTransactionCommand();

	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	if (first)
		for (int i = 0; i < nusable; i++)
		{
			RegistryDb   *db = RegistryEntry(usable[i], true);

			if (db != NULL)
				db->wanted = true;
		}
	for (int i = 0; i < REGISTRY_MAX_DBS; i++)
	{
		RegistryDb   *db = &RegistryShared->dbs[i];
		bool		found = false;

		if (db->dbid == InvalidOid || db->pid != 0)
			continue;
		for (int j = 0; j < nusable && !found; j++)
			found = usable[j] == db->dbid;
		/* gone, unusable, or found without the extension: the entry is free */
		if (!found || !db->wanted)
			db->dbid = InvalidOid;
	}
	LWLockRelease(RegistryShared->lock);
}

static BackgroundWorkerHandle *
StartWorker(Oid dbid)
{
	BackgroundWorker bgw;
	BackgroundWorkerHandle *handle;

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = BGW_NEVER_RESTART;	/* the launcher does it */
	snprintf(bgw.bgw_library_name, BGW_MAXLEN, "sharded_seq");
	snprintf(bgw.bgw_function_name, BGW_MAXLEN, "sharded_seq_worker_main");
	snprintf(bgw.bgw_name, BGW_MAXLEN, "sharded_seq worker for database %u", dbid);
	snprintf(bgw.bgw_type, BGW_MAXLEN, "sharded_seq worker");
	bgw.bgw_main_arg = ObjectIdGetDatum(dbid);
	bgw.bgw_notify_pid = MyProcPid;
	if (!RegisterDynamicBackgroundWorker(&bgw, &handle))
		return NULL;
	return handle;
}

void
sharded_seq_launcher_main(Datum arg)
{
	BackgroundWorkerHandle *handles[REGISTRY_MAX_DBS] = {0};
	Oid			handle_db[REGISTRY_MAX_DBS] = {0};
	TimestampTz retry_at[REGISTRY_MAX_DBS] = {0};
	bool		warned_full = false;

	pqsignal(SIGTERM, HandleSigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("sharded_seq launcher");

	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	RegistryShared->launcher_pid = MyProcPid;
	RegistryShared->launcher_started = GetCurrentTimestamp();
	RegistryShared->launcher_latch = MyLatch;
	LWLockRelease(RegistryShared->lock);

	ScanDatabases(true);
	while (!got_sigterm)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		ScanDatabases(false);

		for (int i = 0; i < REGISTRY_MAX_DBS; i++)
		{
			RegistryDb   *db = &RegistryShared->dbs[i];
			pid_t		pid;
			Oid			dbid;
			bool		start;

			/* a worker that stopped: start it again after a pause */
			if (handles[i] != NULL &&
				GetBackgroundWorkerPid(handles[i], &pid) == BGWH_STOPPED)
			{
				pfree(handles[i]);
				handles[i] = NULL;
				retry_at[i] = TimestampTzPlusMilliseconds(now, RESTART_DELAY_MS);
			}
			LWLockAcquire(RegistryShared->lock, LW_SHARED);
			dbid = db->dbid;
			start = dbid != InvalidOid && db->wanted && db->pid == 0 &&
				now >= db->paused_until;
			LWLockRelease(RegistryShared->lock);
			if (handles[i] != NULL && handle_db[i] != dbid)
				start = false;	/* the entry's old worker is still going */
			if (!start || handles[i] != NULL || now < retry_at[i])
				continue;
			handles[i] = StartWorker(dbid);
			handle_db[i] = dbid;
			retry_at[i] = TimestampTzPlusMilliseconds(now, RESTART_DELAY_MS);
			if (handles[i] == NULL && !warned_full)
			{
				ereport(WARNING,
						(errmsg("sharded_seq: could not start a worker for database %u", dbid),
						 errhint("Raise max_worker_processes: the launcher needs one per database that has the extension.")));
				warned_full = true;
			}
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 RESTART_DELAY_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}

	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	RegistryShared->launcher_pid = 0;
	RegistryShared->launcher_latch = NULL;
	LWLockRelease(RegistryShared->lock);
	proc_exit(0);
}

/* ---- the worker of one database ---- */

static RegistryDb *MyDb = NULL;


static void
ClearMyPid(int code, Datum arg)
{
	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	if (MyDb->pid == MyProcPid)
	{
		MyDb->pid = 0;
		MyDb->latch = NULL;
	}
	LWLockRelease(RegistryShared->lock);
	RegistryWakeLauncher();
}

/* Write-behind counters of this database with an amount to move. */
typedef struct FlushTotals
{
	int64		amount;
	int32		counters;
} FlushTotals;

static int
CompareIds(const void *a, const void *b)
{
	int32		x = *(const int32 *) a;
	int32		y = *(const int32 *) b;

	return (x > y) - (x < y);
}

static void RememberError(const char *message);
static void ForwardRound(void);

static TimestampTz LastForward = 0;

/* Has the batch delay passed since forwarding last looked? */
static bool
ForwardDue(void)
{
	return MemcachedBatchDelay > 0 &&
		TimestampDifferenceExceeds(LastForward, GetCurrentTimestamp(), MemcachedBatchDelay);
}

/*
 * Flush one counter in a subtransaction of its own, never waiting: a row held
 * by another transaction (even a prepared one) or an error keeps that
 * counter's amount where it was, for a later round, and holds up no other
 * counter.  Returns the amount moved.
 */
static int64
FlushOne(bool memcached, int32 id, const char *name)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile int64 moved = 0;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		moved = memcached ? MemcachedFlush(id, (int32) (MyProcPid % SHARDED_SEQ_MAX_SHARDS), name, false)
			: BufferedFlush(id, name, false);
		/* busy: the rollback gives the amount back */
		if (moved < 0)
			RollbackAndReleaseCurrentSubTransaction();
		else
			ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		ereport(LOG,
				(errmsg("sharded_seq: could not flush counter \"%s\": %s", name, edata->message)));
		RememberError(edata->message);
		FreeErrorData(edata);
		moved = 0;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return Max(moved, 0);
}

/* Flush every shared-memory slot of this database, in counter id order. */
static void
FlushAllBuffered(Oid install, FlushTotals *totals)
{
	int32	   *ids;
	int			n = SlotCounters(install, &ids);

	qsort(ids, n, sizeof(int32), CompareIds);
	for (int i = 0; i < n; i++)
	{
		char		name[32];
		int64		moved;

		snprintf(name, sizeof(name), "#%d", ids[i]);
		moved = FlushOne(false, ids[i], name);
		if (moved > 0)
		{
			totals->amount += moved;
			totals->counters++;
		}
	}
	if (ids)
		pfree(ids);
}

typedef struct McCounter
{
	int32		id;
	char		name[NAMEDATALEN];
} McCounter;

/* The counters in mode 'memcached', in id order, allocated in cxt. */
static McCounter *
ListMemcachedCounters(MemoryContext cxt, int *count)
{
	McCounter  *list;
	uint64		n;
	int			kept = 0;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT id, name, mode FROM sharded_seq.counter_config"
					" WHERE mode OPERATOR(pg_catalog.<>) 'exact' ORDER BY id", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list write-behind counters");
	n = SPI_processed;
	list = MemoryContextAlloc(cxt, sizeof(McCounter) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *mode = SPI_getvalue(tup, desc, 3);

		if (ParseCounterMode(mode, strlen(mode)) != MODE_MEMCACHED)
			continue;
		list[kept].id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		strlcpy(list[kept].name, SPI_getvalue(tup, desc, 2), NAMEDATALEN);
		kept++;
	}
	SPI_finish();
	*count = kept;
	return list;
}

/*
 * Flush every counter in mode 'memcached', whether or not anyone increments,
 * committing every few counters: each flush holds an advisory lock until its
 * transaction ends.
 */
#define MC_FLUSH_BATCH 64

static void
FlushAllMemcached(McCounter *list, int n, FlushTotals *totals)
{
	int			in_batch = 0;

	for (int i = 0; i < n; i++)
	{
		int64		moved;

		/* a flush may wait for a row lock: forwarding must not wait long */
		if (in_batch > 0 && (in_batch == MC_FLUSH_BATCH || ForwardDue()))
		{
			PopActiveSnapshot();
			CommitTransactionCommand();
			in_batch = 0;
			ForwardRound();
		}
		if (in_batch == 0)
		{
			SetCurrentStatementStartTimestamp();
			StartTransactionCommand();
			PushActiveSnapshot(GetTransactionSnapshot());
		}
		moved = FlushOne(true, list[i].id, list[i].name);
		in_batch++;
		if (moved > 0)
		{
			totals->amount += moved;
			totals->counters++;
		}
	}
	if (in_batch > 0)
	{
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
}

static void
RememberError(const char *message)
{
	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	MyDb->last_error_at = GetCurrentTimestamp();
	strlcpy(MyDb->last_error, message ? message : "unknown error", REGISTRY_ERROR_LEN);
	LWLockRelease(RegistryShared->lock);
}

/* In PG_CATCH: log the error, undo the transaction, and show the error in the view. */
static void
RecordError(void)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(TopMemoryContext);
	edata = CopyErrorData();
	EmitErrorReport();
	AbortCurrentTransaction();
	FlushErrorState();
	RememberError(edata->message);
	FreeErrorData(edata);
}

/*
 * Forward the 'memcached' amounts that commits left in shared memory, one
 * request per counter, under the counter's lock (alter_counter and
 * drop_counter hold it while they leave mode 'memcached') and its forwarding
 * lock (flush_counters holds it while it flushes), taken without waiting.
 * A counter whose locks are busy waits for the next tick;
 * one no longer in mode 'memcached' keeps its amount for the rows.
 */
static void
ForwardRound(void)
{
	MemoryContext caller_cxt = CurrentMemoryContext;

	LastForward = GetCurrentTimestamp();
	/* cleared first: an amount added during the scan below sets it again */
	if (pg_atomic_read_u32(&MyDb->forward_news) == 0 ||
		pg_atomic_exchange_u32(&MyDb->forward_news, 0) == 0)
		return;
	PG_TRY();
	{
		bool		missed = false;
		Oid			install;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		install = OidIsValid(get_extension_oid("sharded_seq", true)) ? CurrentInstallation() : InvalidOid;
		PopActiveSnapshot();
		/* memcached down: the next flush takes the amounts to the rows */
		if (OidIsValid(install) && McEnabled() && !McRecentlyDown())
		{
			Oid			config = ConfigRelid("counter_config");
			int32	   *ids;
			int			n = SlotsForwardCandidates(install, &ids);

			PushActiveSnapshot(GetTransactionSnapshot());
			for (int i = 0; i < n; i++)
			{
				CounterConfigRow row;

				if (!ConditionalLockDatabaseObject(config, ids[i], 0, ShareUpdateExclusiveLock))
				{
					missed = true;
					continue;
				}
				if (!ConditionalLockDatabaseObject(config, ids[i], FORWARD_LOCK_SUBID, ExclusiveLock))
				{
					UnlockDatabaseObject(config, ids[i], 0, ShareUpdateExclusiveLock);
					missed = true;
					continue;
				}
				/* the mode as of now, after any alter_counter that held the lock */
				if (FetchCounterConfig(NULL, ids[i], &row) && row.mode == MODE_MEMCACHED)
					(void) MemcachedForward(install, ids[i]);
				else
					SlotForwardStop(install, ids[i]);
				/* its amount is in memcached now: one counter's locks at a time */
				UnlockDatabaseObject(config, ids[i], FORWARD_LOCK_SUBID, ExclusiveLock);
				UnlockDatabaseObject(config, ids[i], 0, ShareUpdateExclusiveLock);
			}
			PopActiveSnapshot();
		}
		CommitTransactionCommand();
		if (missed)
			pg_atomic_write_u32(&MyDb->forward_news, 1);
	}
	PG_CATCH();
	{
		RecordError();
		MemoryContextSwitchTo(caller_cxt);
	}
	PG_END_TRY();
}

/*
 * One round: flush, and maintain unless only flushing.  Returns false when
 * the extension is not installed here.  Errors are recorded, not raised:
 * the next round tries again, and an undone flush gave its amounts back.
 */
static bool
Round(bool flush_only)
{
	FlushTotals totals = {0, 0};
	volatile bool installed = true;
	uint32		notes;
	MemoryContext caller_cxt = CurrentMemoryContext;
	static MemoryContext round_cxt = NULL;

	if (round_cxt == NULL)
		round_cxt = AllocSetContextCreate(TopMemoryContext, "sharded_seq worker round",
										  ALLOCSET_DEFAULT_SIZES);
	MemoryContextReset(round_cxt);
	LWLockAcquire(RegistryShared->lock, LW_SHARED);
	notes = MyDb->notes;
	LWLockRelease(RegistryShared->lock);

	PG_TRY();
	{
		Oid			install;
		McCounter  *mc = NULL;
		int			nmc = 0;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		installed = OidIsValid(get_extension_oid("sharded_seq", true));
		install = installed ? CurrentInstallation() : InvalidOid;
		/* gone: its slots belong to nothing now */
		if (!installed)
			SlotsFreeIdle(InvalidOid);
		if (OidIsValid(install))
		{
			pgstat_report_activity(STATE_RUNNING, "sharded_seq: flush");
			FlushAllBuffered(install, &totals);
			if (!flush_only && McEnabled())
				mc = ListMemcachedCounters(round_cxt, &nmc);
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
		if (OidIsValid(install))
			SlotsFreeIdle(install);
		ForwardRound();
		FlushAllMemcached(mc, nmc, &totals);
		ForwardRound();
		LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
		MyDb->mc_servers = RegistryServersHash();
		MyDb->last_flush_at = GetCurrentTimestamp();
		MyDb->last_flush_amount = totals.amount;
		MyDb->last_flush_counters = totals.counters;
		MyDb->flushed_total += totals.amount;
		LWLockRelease(RegistryShared->lock);

		/* maintain() came with schema 1.2 */
		if (OidIsValid(install) && !flush_only)
		{
			bool		maintained = false;

			SetCurrentStatementStartTimestamp();
			StartTransactionCommand();
			PushActiveSnapshot(GetTransactionSnapshot());
			if (AdaptiveCountersStored())
			{
				pgstat_report_activity(STATE_RUNNING, "sharded_seq: maintain");
				if (SPI_connect() != SPI_OK_CONNECT)
					elog(ERROR, "SPI_connect failed");
				if (SPI_execute("SELECT * FROM sharded_seq.maintain()", false, 0) != SPI_OK_SELECT)
					elog(ERROR, "could not run sharded_seq.maintain()");
				SPI_finish();
				maintained = true;
			}
			PopActiveSnapshot();
			CommitTransactionCommand();
			if (maintained)
			{
				LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
				MyDb->last_maintain_at = GetCurrentTimestamp();
				LWLockRelease(RegistryShared->lock);
			}
		}
	}
	PG_CATCH();
	{
		RecordError();
		MemoryContextSwitchTo(caller_cxt);
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);
	if (!installed)
	{
		/* unless a backend said otherwise meanwhile (a CREATE EXTENSION) */
		LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
		if (MyDb->notes != notes)
			installed = true;
		else
			MyDb->wanted = false;
		LWLockRelease(RegistryShared->lock);
	}
	return installed;
}

/*
 * On SIGTERM: stop taking amounts (commits then write the rows), wait for
 * every transaction that pinned a slot before that (a commit about to add,
 * a flush that may give its amount back), and flush once more.  The wait
 * has no bound: a pin ends with its transaction, which a shutdown ends too
 * (a fast one cancels it, a smart one waits for it before it stops the
 * worker), so it is as long as the shutdown itself; it is logged.  A clean
 * shutdown so loses nothing committed, and no commit waits for this.
 */
static void
FinalFlush(void)
{
	TimestampTz started = GetCurrentTimestamp();
	long		log_after = SHUTDOWN_FIRST_LOG_MS;

	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	MyDb->accepting = false;
	LWLockRelease(RegistryShared->lock);
	/* the write above before the reads of pins below (see SlotReserve) */
	pg_memory_barrier();
	for (;;)
	{
		int32		ids[8];
		int			n = SlotsPinnedHere(ids, lengthof(ids));

		if (n == 0)
			break;
		if (TimestampDifferenceExceeds(started, GetCurrentTimestamp(), log_after))
		{
			StringInfoData list;

			initStringInfo(&list);
			for (int i = 0; i < Min(n, (int) lengthof(ids)); i++)
				appendStringInfo(&list, "%s%d", i > 0 ? ", " : "", ids[i]);
			if (n > (int) lengthof(ids))
				appendStringInfoString(&list, ", ...");
			ereport(LOG,
					(errmsg("sharded_seq: the worker waits for %d slots that transactions hold before its last flush", n),
					 errdetail("Counters with ids %s are being committed or flushed; their amounts are counted once those transactions end.", list.data)));
			pfree(list.data);
			log_after += SHUTDOWN_LOG_MS;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	(void) Round(true);

	/*
	 * A counter whose rows were all held (by a commit that went to the rows
	 * as this began, and is about to end) gets another try; a prepared
	 * transaction's hold outlasts this, and SlotsReportLeft logs it.
	 */
	for (int i = 0; i < SHUTDOWN_RETRY_MS / 100 && SlotsLeftHere(); i++)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 100, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		(void) Round(true);
	}
	SlotsReportLeft();
}

void
sharded_seq_worker_main(Datum arg)
{
	Oid			dbid = DatumGetObjectId(arg);

	pqsignal(SIGTERM, HandleSigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	MyDb = RegistryEntry(dbid, false);
	if (MyDb == NULL || MyDb->pid != 0)
	{
		LWLockRelease(RegistryShared->lock);
		proc_exit(0);
	}
	MyDb->pid = MyProcPid;
	MyDb->latch = MyLatch;
	RegistryMarkWorker();
	MyDb->started_at = GetCurrentTimestamp();
	LWLockRelease(RegistryShared->lock);
	before_shmem_exit(ClearMyPid, (Datum) 0);

	BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	pgstat_report_appname("sharded_seq worker");
	/* a flush is durable here; waiting for a standby could hold up shutdown */
	SetConfigOption("synchronous_commit", "local", PGC_SUSET, PGC_S_OVERRIDE);
	/* a database's own defaults may not stop it from writing */
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET, PGC_S_OVERRIDE);
	/* a flush waits for a row lock at most this long, then tries next round */
	SetConfigOption("lock_timeout", "1000", PGC_SUSET, PGC_S_OVERRIDE);
	/* it runs as a superuser: nothing of a database owner's may be resolved */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	MyDb->accepting = true;
	LWLockRelease(RegistryShared->lock);

	while (!got_sigterm)
	{
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* flush to the rows of the node this server is now */
			NodeIdForget();
		}
		if (!Round(false))
		{
			/* no extension here: stop until a backend says otherwise */
			LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
			MyDb->wanted = false;
			LWLockRelease(RegistryShared->lock);
			proc_exit(0);
		}
		/* a latch set for other reasons (catch-up interrupts) is no round */
		{
			TimestampTz next = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   CounterFlushInterval * 1000L);

			while (!got_sigterm && !ConfigReloadPending)
			{
				long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next);

				if (left <= 0)
					break;

				/*
				 * 'memcached' amounts arrived: let more gather for the batch
				 * delay (only a signal cuts it short), then forward them.
				 * Otherwise sleep until a commit says so.
				 */
				if (MemcachedBatchDelay > 0 && pg_atomic_read_u32(&MyDb->forward_news) != 0)
				{
					TimestampTz due = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
																  Min(left, MemcachedBatchDelay));
					long		wait;

					/* a signal still ends the wait at once */
					while (!got_sigterm && !ConfigReloadPending &&
						   (wait = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), due)) > 0)
					{
						(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
										 wait, PG_WAIT_EXTENSION);
						ResetLatch(MyLatch);
						CHECK_FOR_INTERRUPTS();
					}
					ForwardRound();
					continue;
				}
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 left, PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
		}
	}
	FinalFlush();
	proc_exit(0);
}

/* ---- from _PG_init ---- */

void
WorkerRegister(void)
{
	BackgroundWorker bgw;

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = 5;
	snprintf(bgw.bgw_library_name, BGW_MAXLEN, "sharded_seq");
	snprintf(bgw.bgw_function_name, BGW_MAXLEN, "sharded_seq_launcher_main");
	snprintf(bgw.bgw_name, BGW_MAXLEN, "sharded_seq launcher");
	snprintf(bgw.bgw_type, BGW_MAXLEN, "sharded_seq launcher");
	RegisterBackgroundWorker(&bgw);
}

/* ---- database commands that need the database to themselves ---- */

/* Stop a database's worker and keep it away until Resume; true if paused. */
static bool
PauseWorker(Oid dbid)
{
	RegistryDb   *db;
	pid_t		pid = 0;

	if (RegistryShared == NULL || !OidIsValid(dbid))
		return false;
	/* only for those the command itself will allow: the database's owner */
	if (!DatabaseOwnedBy(dbid, GetUserId()))
		return false;
	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	db = RegistryEntry(dbid, false);
	if (db != NULL)
	{
		db->paused_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PAUSE_MS);
		pid = db->pid;
	}
	LWLockRelease(RegistryShared->lock);
	if (db == NULL)
		return false;
	if (pid != 0)
		(void) kill(pid, SIGTERM);
	/* the command itself waits up to 5 s for others to leave; so do we */
	for (int i = 0; i < 500 && pid != 0; i++)
	{
		pg_usleep(10000L);
		LWLockAcquire(RegistryShared->lock, LW_SHARED);
		pid = db->dbid == dbid ? db->pid : 0;
		LWLockRelease(RegistryShared->lock);
	}
	return true;
}

static Oid	PausedHere = InvalidOid;	/* paused by this backend, not resumed yet */

static void
ResumeWorker(Oid dbid)
{
	RegistryDb   *db;

	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	db = RegistryEntry(dbid, false);
	if (db != NULL)
		db->paused_until = 0;
	LWLockRelease(RegistryShared->lock);
	PausedHere = InvalidOid;
	RegistryWakeLauncher();
}

/* A backend that dies in the middle of the command (FATAL) lets the worker back. */
static void
ResumeAtExit(int code, Datum arg)
{
	if (OidIsValid(PausedHere) && RegistryShared != NULL)
		ResumeWorker(PausedHere);
}

/* The database a command needs to itself, or InvalidOid. */
static Oid
DatabaseNeededAlone(Node *stmt)
{
	const char *name = NULL;
	ListCell   *lc;

	switch (nodeTag(stmt))
	{
		case T_DropdbStmt:
			name = ((DropdbStmt *) stmt)->dbname;
			break;
		case T_CreatedbStmt:
			foreach(lc, ((CreatedbStmt *) stmt)->options)
			{
				DefElem    *opt = lfirst_node(DefElem, lc);

				if (strcmp(opt->defname, "template") == 0 && opt->arg != NULL)
					name = defGetString(opt);
			}
			break;
		case T_RenameStmt:
			if (((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
				name = ((RenameStmt *) stmt)->subname;
			break;
		case T_AlterDatabaseStmt:
			foreach(lc, ((AlterDatabaseStmt *) stmt)->options)
			{
				DefElem    *opt = lfirst_node(DefElem, lc);

				if (strcmp(opt->defname, "tablespace") == 0)
					name = ((AlterDatabaseStmt *) stmt)->dbname;
			}
			break;
		default:
			break;
	}
	return name ? get_database_oid(name, true) : InvalidOid;
}

static void
WorkerUtility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			  ProcessUtilityContext context, ParamListInfo params,
			  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	Oid			alone;
	bool		paused;
	static bool exit_callback = false;

	/* a prepared transaction's changes become visible: no kept total may hide them */
	if (IsA(stmt, TransactionStmt) &&
		(((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED ||
		 ((TransactionStmt *) stmt)->kind == TRANS_STMT_ROLLBACK_PREPARED))
		LayoutChangingAll();
	/*
	 * A command that may hide shard-row writes from the marks (DISABLE
	 * TRIGGER, TRUNCATE, ...; the rule in counter_buffer.c) marks every word
	 * until its transaction ends, before it runs.
	 */
	if (LayoutWordsAvailable() && IsTransactionState() && ChangesShardTable(stmt))
		LayoutChangingAll();
	alone = DatabaseNeededAlone(stmt);
	paused = PauseWorker(alone);
	if (paused)
	{
		if (!exit_callback)
			before_shmem_exit(ResumeAtExit, (Datum) 0);
		exit_callback = true;
		PausedHere = alone;
	}

	PG_TRY();
	{
		if (prev_utility_hook)
			prev_utility_hook(pstmt, queryString, readOnlyTree, context, params,
							  queryEnv, dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
									params, queryEnv, dest, qc);
	}
	PG_FINALLY();
	{
		if (paused)
			ResumeWorker(alone);
	}
	PG_END_TRY();

	if (IsA(stmt, CreateExtensionStmt) &&
		strcmp(((CreateExtensionStmt *) stmt)->extname, "sharded_seq") == 0)
		RegistryNoteDatabase();
	/*
	 * ENABLE TRIGGER ALL on one of our tables must not leave our triggers
	 * firing on origin only (an update script sets the modes itself)
	 */
	if (IsTransactionState() && !creating_extension && AltersOwnTable(stmt))
		RestoreTriggerModes();
	if (IsA(stmt, CreatedbStmt))
		ForgetSharedTotals(get_database_oid(((CreatedbStmt *) stmt)->dbname, true));
}

void
WorkerUtilityInit(void)
{
	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = WorkerUtility;
}

/* ---- worker_status(): what the workers view shows ---- */

static Datum
TimeOrNull(TimestampTz t, bool *isnull)
{
	*isnull = (t == 0);
	return TimestampTzGetDatum(t);
}

PG_FUNCTION_INFO_V1(worker_status);
Datum
worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[12];
	bool		nulls[12];
	RegistryData snap;

	InitMaterializedSRF(fcinfo, 0);
	memset(nulls, 0, sizeof(nulls));
	if (RegistryShared == NULL)
	{
		/* one row that says why nothing runs */
		memset(nulls, true, sizeof(nulls));
		values[0] = CStringGetTextDatum("launcher");
		nulls[0] = false;
		values[3] = BoolGetDatum(false);
		nulls[3] = false;
		values[10] = CStringGetTextDatum("sharded_seq is not in shared_preload_libraries");
		nulls[10] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		return (Datum) 0;
	}
	LWLockAcquire(RegistryShared->lock, LW_SHARED);
	memcpy(&snap, RegistryShared, sizeof(snap));
	LWLockRelease(RegistryShared->lock);

	/* (kind, database, pid, running, started_at, last_flush_at, last_flush_amount,
	 *  last_flush_counters, flushed_total, last_maintain_at, last_error, last_error_at) */
	memset(nulls, true, sizeof(nulls));
	values[0] = CStringGetTextDatum("launcher");
	nulls[0] = false;
	values[2] = Int32GetDatum(snap.launcher_pid);
	nulls[2] = snap.launcher_pid == 0;
	values[3] = BoolGetDatum(snap.launcher_pid != 0);
	nulls[3] = false;
	values[4] = TimeOrNull(snap.launcher_started, &nulls[4]);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);

	for (int i = 0; i < REGISTRY_MAX_DBS; i++)
	{
		RegistryDb   *db = &snap.dbs[i];
		char	   *dbname;

		if (db->dbid == InvalidOid || (!db->wanted && db->pid == 0))
			continue;
		dbname = get_database_name(db->dbid);
		if (dbname == NULL)
			continue;
		memset(nulls, false, sizeof(nulls));
		values[0] = CStringGetTextDatum("worker");
		values[1] = DirectFunctionCall1(namein, CStringGetDatum(dbname));
		values[2] = Int32GetDatum(db->pid);
		nulls[2] = db->pid == 0;
		values[3] = BoolGetDatum(db->pid != 0);
		values[4] = TimeOrNull(db->started_at, &nulls[4]);
		values[5] = TimeOrNull(db->last_flush_at, &nulls[5]);
		values[6] = Int64GetDatum(db->last_flush_amount);
		nulls[6] = db->last_flush_at == 0;
		values[7] = Int32GetDatum(db->last_flush_counters);
		nulls[7] = db->last_flush_at == 0;
		values[8] = Int64GetDatum(db->flushed_total);
		values[9] = TimeOrNull(db->last_maintain_at, &nulls[9]);
		values[10] = CStringGetTextDatum(db->last_error);
		nulls[10] = db->last_error[0] == '\0';
		values[11] = TimeOrNull(db->last_error_at, &nulls[11]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
