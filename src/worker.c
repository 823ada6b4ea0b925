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
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "sharded_seq.h"

#define MAX_WORKER_DBS		64
#define ERROR_LEN			256
#define RESTART_DELAY_MS	1000
#define PAUSE_MS			60000	/* longest a database command keeps it away */
#define SHUTDOWN_WAIT_MS	3000	/* for the database's backends to finish */

typedef struct WorkerDb
{
	Oid			dbid;			/* InvalidOid: a free entry */
	bool		wanted;			/* has, or may have, the extension */
	pid_t		pid;			/* its worker, or 0 */
	TimestampTz started_at;
	TimestampTz paused_until;	/* a database command needs it gone */
	TimestampTz last_flush_at;
	int64		last_flush_amount;
	int32		last_flush_counters;
	int64		flushed_total;
	TimestampTz last_maintain_at;
	TimestampTz last_error_at;
	char		last_error[ERROR_LEN];
} WorkerDb;

typedef struct WorkerShared
{
	LWLock	   *lock;
	pid_t		launcher_pid;
	TimestampTz launcher_started;
	volatile sig_atomic_t stopping;	/* the launcher got SIGTERM: a shutdown */
	Latch	   *launcher_latch;
	WorkerDb	dbs[MAX_WORKER_DBS];
} WorkerShared;

static WorkerShared *Shared = NULL;
static ProcessUtility_hook_type prev_utility_hook = NULL;
static volatile sig_atomic_t got_sigterm = false;

PGDLLEXPORT void sharded_seq_launcher_main(Datum arg);
PGDLLEXPORT void sharded_seq_worker_main(Datum arg);

/* ---- shared memory ---- */

Size
WorkerShmemSize(void)
{
	return sizeof(WorkerShared);
}

void
WorkerShmemInit(void)
{
	bool		found;

	Shared = ShmemInitStruct("sharded_seq workers", sizeof(WorkerShared), &found);
	if (!found)
	{
		memset(Shared, 0, sizeof(WorkerShared));
		Shared->lock = &(GetNamedLWLockTranche("sharded_seq workers"))->lock;
	}
}

/* The entry of a database, made if make; NULL if missing or no room.  Lock held. */
static WorkerDb *
DbEntry(Oid dbid, bool make)
{
	WorkerDb   *free_entry = NULL;

	for (int i = 0; i < MAX_WORKER_DBS; i++)
	{
		if (Shared->dbs[i].dbid == dbid)
			return &Shared->dbs[i];
		if (Shared->dbs[i].dbid == InvalidOid && free_entry == NULL)
			free_entry = &Shared->dbs[i];
	}
	if (!make || free_entry == NULL)
		return NULL;
	memset(free_entry, 0, sizeof(WorkerDb));
	free_entry->dbid = dbid;
	return free_entry;
}

static void
WakeLauncher(void)
{
	if (Shared->launcher_latch)
		SetLatch(Shared->launcher_latch);
}

/* This database has the extension: make sure it gets a worker. */
void
WorkerNoteDatabase(void)
{
	static Oid	noted = InvalidOid;
	WorkerDb   *db;
	bool		wake = false;

	if (Shared == NULL || !OidIsValid(MyDatabaseId) || noted == MyDatabaseId)
		return;
	noted = MyDatabaseId;
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	db = DbEntry(MyDatabaseId, true);
	if (db != NULL && !db->wanted)
	{
		db->wanted = true;
		wake = true;
	}
	LWLockRelease(Shared->lock);
	if (wake)
		WakeLauncher();
}

/* Is this database's worker running (and so flushing every interval)? */
bool
WorkerRunningHere(void)
{
	WorkerDb   *db;
	bool		running;

	if (Shared == NULL)
		return false;
	LWLockAcquire(Shared->lock, LW_SHARED);
	db = DbEntry(MyDatabaseId, false);
	running = db != NULL && db->pid != 0;
	LWLockRelease(Shared->lock);
	return running;
}

/* ---- the launcher ---- */

/* The postmaster stops the launcher and the workers together at shutdown. */
static void
HandleLauncherSigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	Shared->stopping = true;
	got_sigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

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
	Oid			usable[MAX_WORKER_DBS * 4];
	int			nusable = 0;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);

		if (d->datallowconn && !d->datistemplate && nusable < lengthof(usable))
			usable[nusable++] = d->oid;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();

	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	if (first)
		for (int i = 0; i < nusable; i++)
		{
			WorkerDb   *db = DbEntry(usable[i], true);

			if (db != NULL)
				db->wanted = true;
		}
	for (int i = 0; i < MAX_WORKER_DBS; i++)
	{
		WorkerDb   *db = &Shared->dbs[i];
		bool		found = false;

		if (db->dbid == InvalidOid || db->pid != 0)
			continue;
		for (int j = 0; j < nusable && !found; j++)
			found = usable[j] == db->dbid;
		if (!found)
			db->dbid = InvalidOid;
	}
	LWLockRelease(Shared->lock);
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
	BackgroundWorkerHandle *handles[MAX_WORKER_DBS] = {0};
	Oid			handle_db[MAX_WORKER_DBS] = {0};
	TimestampTz retry_at[MAX_WORKER_DBS] = {0};
	bool		warned_full = false;

	pqsignal(SIGTERM, HandleLauncherSigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	Shared->stopping = false;
	pgstat_report_appname("sharded_seq launcher");

	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	Shared->launcher_pid = MyProcPid;
	Shared->launcher_started = GetCurrentTimestamp();
	Shared->launcher_latch = MyLatch;
	LWLockRelease(Shared->lock);

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

		for (int i = 0; i < MAX_WORKER_DBS; i++)
		{
			WorkerDb   *db = &Shared->dbs[i];
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
			LWLockAcquire(Shared->lock, LW_SHARED);
			dbid = db->dbid;
			start = dbid != InvalidOid && db->wanted && db->pid == 0 &&
				now >= db->paused_until;
			LWLockRelease(Shared->lock);
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

	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	Shared->launcher_pid = 0;
	Shared->launcher_latch = NULL;
	LWLockRelease(Shared->lock);
	proc_exit(0);
}

/* ---- the worker of one database ---- */

static WorkerDb *MyDb = NULL;

static void
ClearMyPid(int code, Datum arg)
{
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	if (MyDb->pid == MyProcPid)
		MyDb->pid = 0;
	LWLockRelease(Shared->lock);
	WakeLauncher();
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

/* Flush every shared-memory slot of this database, in counter id order. */
static void
FlushAllBuffered(Oid install, FlushTotals *totals)
{
	int32	   *ids;
	int			n = BufferCounters(install, &ids);

	qsort(ids, n, sizeof(int32), CompareIds);
	for (int i = 0; i < n; i++)
	{
		char		name[32];
		int64		moved;

		snprintf(name, sizeof(name), "#%d", ids[i]);
		moved = FlushBuffered(ids[i], name);
		if (moved > 0)
		{
			totals->amount += moved;
			totals->counters++;
		}
	}
	if (ids)
		pfree(ids);
}

/* Flush every counter in mode 'memcached', whether or not anyone increments. */
static void
FlushAllMemcached(FlushTotals *totals)
{
	uint64		n;

	if (!McEnabled())
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT id, name, mode FROM sharded_seq.counter_config"
					" WHERE mode OPERATOR(pg_catalog.<>) 'exact' ORDER BY id", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list write-behind counters");
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int32		id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		char	   *name = SPI_getvalue(tup, desc, 2);
		char	   *mode = SPI_getvalue(tup, desc, 3);
		int64		moved;

		if (ParseCounterMode(mode, strlen(mode)) != MODE_MEMCACHED)
			continue;
		moved = FlushCounter(id, (int32) (MyProcPid % SHARDED_SEQ_MAX_SHARDS), name, false);
		if (moved > 0)
		{
			totals->amount += moved;
			totals->counters++;
		}
	}
	SPI_finish();
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
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	MyDb->last_error_at = GetCurrentTimestamp();
	strlcpy(MyDb->last_error, edata->message ? edata->message : "unknown error", ERROR_LEN);
	LWLockRelease(Shared->lock);
	FreeErrorData(edata);
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
	MemoryContext round_cxt = CurrentMemoryContext;

	PG_TRY();
	{
		Oid			install;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		installed = OidIsValid(get_extension_oid("sharded_seq", true));
		install = installed ? CurrentInstallation() : InvalidOid;
		if (OidIsValid(install))
		{
			pgstat_report_activity(STATE_RUNNING, "sharded_seq: flush");
			FlushAllBuffered(install, &totals);
			if (!flush_only)
				FlushAllMemcached(&totals);
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
		if (OidIsValid(install))
			BufferFreeIdle(install);
		LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
		MyDb->last_flush_at = GetCurrentTimestamp();
		MyDb->last_flush_amount = totals.amount;
		MyDb->last_flush_counters = totals.counters;
		MyDb->flushed_total += totals.amount;
		LWLockRelease(Shared->lock);

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
				LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
				MyDb->last_maintain_at = GetCurrentTimestamp();
				LWLockRelease(Shared->lock);
			}
		}
	}
	PG_CATCH();
	{
		RecordError();
		MemoryContextSwitchTo(round_cxt);
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);
	return installed;
}

/*
 * On SIGTERM, flush once more.  In a server shutdown (the launcher is told
 * too), first keep flushing until the database's other backends are gone,
 * so that a clean shutdown loses nothing committed.  Otherwise (a pause for
 * a database command, pg_terminate_backend) one flush: the slots outlive
 * this worker, and the next one flushes them.
 */
static void
FinalFlush(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz deadline = TimestampTzPlusMilliseconds(now, SHUTDOWN_WAIT_MS);
	bool		paused;
	bool		shutdown = false;

	LWLockAcquire(Shared->lock, LW_SHARED);
	paused = MyDb->paused_until > now;
	LWLockRelease(Shared->lock);
	/* the postmaster signals its children one after another */
	for (int i = 0; i < 20 && !paused && !(shutdown = Shared->stopping); i++)
		pg_usleep(10000L);
	while (shutdown && CountDBBackends(MyDatabaseId) > 1 &&
		   GetCurrentTimestamp() < deadline)
	{
		(void) Round(true);
		pg_usleep(20000L);
	}
	(void) Round(true);
}

void
sharded_seq_worker_main(Datum arg)
{
	Oid			dbid = DatumGetObjectId(arg);

	pqsignal(SIGTERM, HandleSigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	MyDb = DbEntry(dbid, false);
	if (MyDb == NULL || MyDb->pid != 0)
	{
		LWLockRelease(Shared->lock);
		proc_exit(0);
	}
	MyDb->pid = MyProcPid;
	MyDb->started_at = GetCurrentTimestamp();
	LWLockRelease(Shared->lock);
	before_shmem_exit(ClearMyPid, (Datum) 0);

	BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	pgstat_report_appname("sharded_seq worker");
	/* a flush waits for a row lock at most this long, then tries next round */
	SetConfigOption("lock_timeout", "1000", PGC_SUSET, PGC_S_OVERRIDE);

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
			LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
			MyDb->wanted = false;
			LWLockRelease(Shared->lock);
			proc_exit(0);
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 CounterFlushInterval * 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
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
	WorkerDb   *db;
	pid_t		pid = 0;

	if (Shared == NULL || !OidIsValid(dbid))
		return false;
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	db = DbEntry(dbid, false);
	if (db != NULL)
	{
		db->paused_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PAUSE_MS);
		pid = db->pid;
	}
	LWLockRelease(Shared->lock);
	if (db == NULL)
		return false;
	if (pid != 0)
		(void) kill(pid, SIGTERM);
	/* the command itself waits up to 5 s for others to leave; so do we */
	for (int i = 0; i < 500 && pid != 0; i++)
	{
		pg_usleep(10000L);
		LWLockAcquire(Shared->lock, LW_SHARED);
		pid = db->dbid == dbid ? db->pid : 0;
		LWLockRelease(Shared->lock);
	}
	return true;
}

static void
ResumeWorker(Oid dbid)
{
	WorkerDb   *db;

	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	db = DbEntry(dbid, false);
	if (db != NULL)
		db->paused_until = 0;
	LWLockRelease(Shared->lock);
	WakeLauncher();
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
	Oid			alone = DatabaseNeededAlone(stmt);
	bool		paused = PauseWorker(alone);

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
		WorkerNoteDatabase();
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
	WorkerShared snap;

	InitMaterializedSRF(fcinfo, 0);
	memset(nulls, 0, sizeof(nulls));
	if (Shared == NULL)
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
	LWLockAcquire(Shared->lock, LW_SHARED);
	memcpy(&snap, Shared, sizeof(snap));
	LWLockRelease(Shared->lock);

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

	for (int i = 0; i < MAX_WORKER_DBS; i++)
	{
		WorkerDb   *db = &snap.dbs[i];
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
