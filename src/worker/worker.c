/*
 * worker.c
 *	  The worker of one database: every sharded_seq.counter_flush_interval it
 *	  flushes write-behind counters (slots in shared memory and memcached)
 *	  into their shard rows and runs maintain(); between rounds it forwards
 *	  'memcached' amounts that wait in slots; at shutdown it makes the last
 *	  flush once no commit can add to a slot any more.
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
#define SHUTDOWN_FIRST_LOG_MS 2000	/* waiting for pinned slots: say so after */
#define SHUTDOWN_LOG_MS		5000	/* and again every */
#define SHUTDOWN_RETRY_MS	5000	/* rows held at the last flush: try again for */

volatile sig_atomic_t WorkerGotSigterm = false;

void
WorkerHandleSigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	WorkerGotSigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
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

/*
 * An error this round, even one that failed a single counter: the round's
 * end then counts as a failure (last_error_at = last_flush_at), which the
 * workers view's healthy reads.
 */
static bool RoundFailed = false;

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
	RoundFailed = true;
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
 * Node cache entries of this database asked for their next block: reserve
 * them (sequence/node_reserve.c), each without waiting for any lock.
 */
static void
PrefetchRound(void)
{
	MemoryContext caller_cxt = CurrentMemoryContext;

	if (pg_atomic_read_u32(&MyDb->prefetch_news) == 0 ||
		pg_atomic_exchange_u32(&MyDb->prefetch_news, 0) == 0)
		return;
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (OidIsValid(get_extension_oid("sharded_seq", true)))
		{
			pgstat_report_activity(STATE_RUNNING, "sharded_seq: prefetch");
			NodeCachePrefetch();
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		RecordError();
		MemoryContextSwitchTo(caller_cxt);
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);
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
	RoundFailed = false;

	PG_TRY();
	{
		Oid			install;
		McCounter  *mc = NULL;
		int			nmc = 0;
		TimestampTz round_start = GetCurrentTimestamp();
		TimestampTz round_end;

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
		/* amounts that could not reach memcached, or leave it, wait */
		if (McLastFailure() >= round_start)
			RememberError("a memcached request failed: write-behind amounts wait in shared memory or memcached");
		round_end = GetCurrentTimestamp();
		LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
		MyDb->mc_servers = RegistryServersHash();
		MyDb->last_flush_at = round_end;
		if (RoundFailed)
			MyDb->last_error_at = round_end;
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

	pqsignal(SIGTERM, WorkerHandleSigterm);
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

	while (!WorkerGotSigterm)
	{
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* flush to the rows of the node this server is now */
			NodeIdForget();
		}
		PrefetchRound();
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

			while (!WorkerGotSigterm && !ConfigReloadPending)
			{
				long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next);

				if (left <= 0)
					break;

				/* sessions asked for sequence blocks: before anything else */
				if (pg_atomic_read_u32(&MyDb->prefetch_news) != 0)
				{
					PrefetchRound();
					continue;
				}

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
					while (!WorkerGotSigterm && !ConfigReloadPending &&
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
