/*
 * hooks.c
 *	  The utility hook: moves a database's worker out of the way of commands
 *	  that need the database to themselves (DROP DATABASE, ALTER DATABASE ...
 *	  RENAME, CREATE DATABASE from it as a template), marks every layout word
 *	  before commands that change the shard table, notes CREATE EXTENSION,
 *	  and puts our triggers back to their firing mode after ENABLE TRIGGER ALL.
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
#define PAUSE_MS			60000	/* longest a database command keeps it away */

static ProcessUtility_hook_type prev_utility_hook = NULL;

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
	 * TRIGGER, TRUNCATE, ...; the rule in counter/layout.c) marks every word
	 * until its transaction ends, before it runs.
	 */
	if (LayoutWordsAvailable() && IsTransactionState() && ChangesOwnTable(stmt, "counter_shards"))
		LayoutChangingAll();
	/* the same for copies of sequence configuration (common/config_word.c) */
	if (IsTransactionState() && ChangesSequenceConfig(stmt))
		ConfigChanging();
	/* and privileges: draws see a role change at their next call */
	if (ChangesRoles(stmt))
		RolesChanging();
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
	/* the Citus calls a renamed role made name it by its new name */
	if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_ROLE &&
		IsTransactionState())
		ClusterRoleRenamed(((RenameStmt *) stmt)->subname, ((RenameStmt *) stmt)->newname);
}

void
WorkerUtilityInit(void)
{
	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = WorkerUtility;
}
