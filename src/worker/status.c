/*
 * status.c
 *	  worker_status(), behind the sharded_seq.workers view: the launcher and
 *	  every database's worker, from a copy of the registry.
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
