/*
 * launcher.c
 *	  The launcher: connects to no database, reads pg_database, and starts a
 *	  worker (worker.c) for every database in the registry
 *	  (common/registry.c) that is wanted and has none, again after a pause if
 *	  one stops.
 *
 * Modelled on TimescaleDB's scheduler: a database is wanted once at start
 * if it accepts connections, and whenever a backend that uses the extension,
 * or CREATE EXTENSION, notes it.  A worker in a database without the
 * extension unregisters it and exits.  Template databases get no worker:
 * CREATE DATABASE copies them only when nobody is connected.
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

#include "worker/worker_internal.h"

/* ---- the launcher ---- */


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

	pqsignal(SIGTERM, WorkerHandleSigterm);
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
	while (!WorkerGotSigterm)
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
