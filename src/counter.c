/*
 * counter.c
 *	  The counter engine (exact mode): counter_incr, counter_value and the
 *	  counter administration functions.
 *
 * A counter is a set of shard rows; its total is their sum.  counter_incr
 * adds to this transaction's pending amount for the counter, kept in backend
 * memory per subtransaction, so a rolled-back savepoint takes its share back.
 * Just before commit the pending amounts are added to one shard each
 * (counter_shards.c), in counter id order.  So the shard rows are locked only
 * for the moment of commit: an increment never waits during the transaction,
 * a million increments in one transaction cost one row update, and commits
 * that take counters in a fixed order cannot deadlock on them.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "storage/lock.h"

#include "sharded_seq.h"

typedef struct CounterEntry
{
	char		name[NAMEDATALEN];	/* hash key */
	uint64		loaded_epoch;
	bool		exists;
	int32		id;
	int32		shards;
	int32		shard;			/* this session's preferred shard */
	bool		buffered;		/* mode 'buffered' */
	int64		claim_interval; /* last flush interval this backend tried to claim */
	CounterPlace place;			/* where the shard rows were last seen */
	Oid			owner;
	Acl		   *acl;			/* in TopMemoryContext, or NULL */
	Oid			select_user;	/* user whose SELECT was checked, or 0 */
	Oid			update_user;	/* user whose UPDATE was checked, or 0 */
} CounterEntry;

static HTAB *CounterEntries = NULL;
static uint32 CounterSalt = 0;

/* One subtransaction's share of a pending amount. */
typedef struct PendingFrame
{
	SubTransactionId subid;
	int64		delta;
	struct PendingFrame *outer;
} PendingFrame;

/* This transaction's pending amount for one counter. */
typedef struct PendingKey
{
	int32		counter_id;
	int32		buffered;		/* 1: for memcached, 0: for the shard rows */
} PendingKey;

typedef struct PendingCounter
{
	PendingKey	key;			/* hash key */
	int32		shard;
	char		name[NAMEDATALEN];
	PendingFrame *frames;		/* innermost first */
	ShardRef   *known;			/* where the shard rows were last seen */
	int			nknown;
	CounterEntry *entry;		/* backend-lived: entries are never freed */
} PendingCounter;

static HTAB *Pending = NULL;	/* in TopTransactionContext, or NULL */

static int128
FramesSum(PendingCounter *pc)
{
	int128		sum = 0;

	for (PendingFrame *f = pc->frames; f; f = f->outer)
		sum += f->delta;
	return sum;
}

/* This transaction's uncommitted increments of a counter, both kinds. */
static int128
PendingAmount(int32 counter_id)
{
	int128		sum = 0;

	if (Pending == NULL)
		return 0;
	for (int32 b = 0; b < 2; b++)
	{
		PendingKey	key = {counter_id, b};
		PendingCounter *pc = hash_search(Pending, &key, HASH_FIND, NULL);

		if (pc)
			sum += FramesSum(pc);
	}
	return sum;
}

static void
AddPending(CounterEntry *entry, int64 delta, ShardRef *refs, int nrefs)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	PendingCounter *pc;
	bool		found;
	/* buffered counters take positive amounts memcached can add in one step */
	PendingKey	key = {entry->id, entry->buffered && delta > 0 && (uint64) delta <= MC_MAX_DELTA};

	if (Pending == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(PendingKey);
		ctl.entrysize = sizeof(PendingCounter);
		ctl.hcxt = TopTransactionContext;
		Pending = hash_create("sharded_seq pending increments", 16, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	pc = hash_search(Pending, &key, HASH_ENTER, &found);
	if (!found)
	{
		pc->frames = NULL;
		pc->known = NULL;
		pc->nknown = 0;
		strlcpy(pc->name, entry->name, NAMEDATALEN);
	}
	pc->shard = entry->shard;
	pc->entry = entry;
	if (nrefs > 0 && pc->nknown == 0)
	{
		pc->known = MemoryContextAlloc(TopTransactionContext, nrefs * sizeof(ShardRef));
		memcpy(pc->known, refs, nrefs * sizeof(ShardRef));
		pc->nknown = nrefs;
	}
	if (pc->frames == NULL || pc->frames->subid != subid)
	{
		PendingFrame *f = MemoryContextAlloc(TopTransactionContext, sizeof(PendingFrame));

		f->subid = subid;
		f->delta = 0;
		f->outer = pc->frames;
		pc->frames = f;
	}
	if (pg_add_s64_overflow(pc->frames->delta, delta, &pc->frames->delta))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("counter \"%s\" would overflow bigint", entry->name),
				 errdetail("This transaction's increments add up to more than a bigint."),
				 errhint("Nothing was changed.  Commit in smaller transactions.")));
}

static int
ComparePending(const void *a, const void *b)
{
	int32		x = (*(PendingCounter *const *) a)->key.counter_id;
	int32		y = (*(PendingCounter *const *) b)->key.counter_id;

	return (x > y) - (x < y);
}

static void
ApplyToShards(PendingCounter *pc, int64 delta)
{
	if (!CounterApply(pc->key.counter_id, pc->shard, delta, pc->name,
					  pc->known, pc->nknown))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("counter \"%s\" was dropped before this transaction committed", pc->name),
				 errhint("The transaction was rolled back.  Recreate the counter, or retry without it.")));
}

/* Amounts a flush took from memcached, given back if this transaction aborts. */
typedef struct GiveBack
{
	char		key[250];
	uint64		amount;
	struct GiveBack *next;
} GiveBack;

static GiveBack *GiveBacks = NULL;	/* in TopMemoryContext */

static char *
PendingKeyName(int32 counter_id)
{
	return McKey("ctr:%d:pending", counter_id);
}

/*
 * Move a counter's amount from memcached to a shard row, in this
 * transaction.  Only one session flushes a counter at a time (an advisory
 * lock held to the end of the transaction); the amount is read and then
 * decremented by exactly that much, so increments arriving meanwhile stay
 * pending.  Returns the amount moved, or -1 if nothing could safely be moved.
 */
static int64
FlushCounter(int32 counter_id, int32 shard, const char *name, bool wait)
{
	LOCKTAG		tag;
	char	   *key = PendingKeyName(counter_id);
	int64		amount;
	uint64		left;
	McResult	r;
	GiveBack   *gb;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, SHARDED_SEQ_FLUSH_CLASS, (uint32) counter_id, 2);
	if (LockAcquire(&tag, ExclusiveLock, false, !wait) == LOCKACQUIRE_NOT_AVAIL)
		return -1;
	r = McGet(key, &amount);
	if (r == MC_MISSING)
		return 0;
	if (r != MC_OK)
	{
		StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
		return -1;
	}
	if (amount <= 0)
		return 0;
	/* at most what one decrement can take; the rest waits for the next flush */
	amount = Min(amount, (int64) MC_MAX_DELTA);
	/* taken out first: a read may then miss it for a moment, never count it twice */
	if (McDecr(key, (uint64) amount, &left) != MC_OK)
	{
		StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
		return -1;
	}
	gb = MemoryContextAlloc(TopMemoryContext, sizeof(GiveBack));
	strlcpy(gb->key, key, sizeof(gb->key));
	gb->amount = (uint64) amount;
	gb->next = GiveBacks;
	GiveBacks = gb;
	if (!CounterApply(counter_id, shard, amount, name, NULL, 0))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("counter \"%s\" was dropped while it was being flushed", name),
				 errhint("Its pending amount was given back to memcached.")));
	StatsCount(KIND_COUNTER, counter_id, STAT_FLUSHES, 1);
	return amount;
}

/* A buffered amount, at commit: into memcached, or the shard rows if it is down. */
static void
ApplyBuffered(PendingCounter *pc, int64 delta)
{
	char	   *key = PendingKeyName(pc->key.counter_id);
	uint64		unused;
	McResult	r = McIncr(key, (uint64) delta, &unused);

	/* a missing key is created holding our amount, never after an unknown incr */
	if (r == MC_MISSING)
		r = McAdd(key, delta, 0);
	if (r == MC_OK)
	{
		int64		interval = (int64) time(NULL) / CounterFlushInterval;

		StatsCount(KIND_COUNTER, pc->key.counter_id, STAT_HITS, 1);
		/* the first committer in each interval flushes; each backend asks once */
		if (pc->entry->claim_interval != interval)
		{
			pc->entry->claim_interval = interval;
			if (McAdd(McKey("ctr:%d:flush:" INT64_FORMAT, pc->key.counter_id, interval), 1,
					  CounterFlushInterval * 2) == MC_OK)
				(void) FlushCounter(pc->key.counter_id, pc->shard, pc->name, false);
		}
	}
	else if (r == MC_DOWN)
	{
		/* nothing reached memcached: count it in the shard rows instead */
		StatsCount(KIND_COUNTER, pc->key.counter_id, STAT_FALLBACKS, 1);
		ApplyToShards(pc, delta);
	}
	else
	{
		/*
		 * The amount may or may not be in memcached.  Writing it to the shard
		 * rows too could count it twice, so it is left: at worst it is lost.
		 */
		StatsCount(KIND_COUNTER, pc->key.counter_id, STAT_ERRORS, 1);
	}
}

/* Add every pending amount where it goes, in counter id order. */
static void
ApplyPending(void)
{
	HASH_SEQ_STATUS status;
	PendingCounter *pc;
	PendingCounter **list;
	long		n = 0;

	if (Pending == NULL)
		return;
	list = palloc(hash_get_num_entries(Pending) * sizeof(PendingCounter *));
	hash_seq_init(&status, Pending);
	while ((pc = hash_seq_search(&status)) != NULL)
		list[n++] = pc;
	qsort(list, n, sizeof(PendingCounter *), ComparePending);
	for (long i = 0; i < n; i++)
	{
		int64		delta = (int64) FramesSum(list[i]);

		if (delta == 0)
			continue;
		if (list[i]->key.buffered)
			ApplyBuffered(list[i], delta);
		else
			ApplyToShards(list[i], delta);
	}
	Pending = NULL;
}

static void
EndGiveBacks(bool aborted)
{
	while (GiveBacks)
	{
		GiveBack   *gb = GiveBacks;
		uint64		unused;

		/* libmemcached only: nothing here may ereport during abort */
		if (aborted && McIncr(gb->key, gb->amount, &unused) == MC_MISSING)
			(void) McAdd(gb->key, (int64) gb->amount, 0);
		GiveBacks = gb->next;
		pfree(gb);
	}
}

static void
CounterXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			ApplyPending();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
			Pending = NULL;		/* its memory goes with TopTransactionContext */
			EndGiveBacks(false);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			Pending = NULL;
			EndGiveBacks(true);
			break;
		default:
			break;
	}
}

/* A rolled-back subtransaction takes its increments back; a committed one hands them up. */
static void
CounterSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS status;
	PendingCounter *pc;

	if (Pending == NULL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	hash_seq_init(&status, Pending);
	while ((pc = hash_seq_search(&status)) != NULL)
	{
		PendingFrame *f = pc->frames;

		if (f == NULL || f->subid != mySubid)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			pc->frames = f->outer;
		else if (f->outer && f->outer->subid == parentSubid)
		{
			/* cannot overflow: the sum was checked as it grew */
			f->outer->delta += f->delta;
			pc->frames = f->outer;
		}
		else
			f->subid = parentSubid;
	}
}

void
CounterInit(void)
{
	RegisterXactCallback(CounterXactCallback, NULL);
	RegisterSubXactCallback(CounterSubXactCallback, NULL);
}

/* Forget this transaction's increments of a counter it is dropping. */
static void
ForgetPending(int32 counter_id)
{
	for (int32 b = 0; b < 2 && Pending != NULL; b++)
	{
		PendingKey	key = {counter_id, b};

		hash_search(Pending, &key, HASH_REMOVE, NULL);
	}
}

/* The amount waiting in memcached: 0 if none, false if it cannot be read. */
static bool
MemcachedPending(int32 counter_id, int64 *amount)
{
	McResult	r;

	*amount = 0;
	if (!McEnabled())
		return true;
	r = McGet(PendingKeyName(counter_id), amount);
	if (r == MC_MISSING)
		*amount = 0;
	if (r == MC_OK || r == MC_MISSING)
		return true;
	*amount = 0;
	StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
	return false;
}

/*
 * Stored total, plus this transaction's pending amount, plus delta; with
 * refs, also where the shard rows are.
 */
static int64
VisibleTotal(CounterEntry *entry, int64 delta, ShardRef **refs, int *nrefs)
{
	int128		total = CounterSum(entry->id, &entry->place, refs, nrefs) + PendingAmount(entry->id) + delta;
	int64		waiting;

	/* a buffered counter's amount not yet flushed; unreadable counts as none */
	if (entry->buffered && MemcachedPending(entry->id, &waiting))
		total += waiting;

	if (total > PG_INT64_MAX || total < PG_INT64_MIN)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("counter \"%s\" would overflow bigint", entry->name),
				 errdetail("Its total would not fit in a bigint."),
				 errhint("Nothing was changed.  Keep totals within bigint, or add an amount of the opposite sign.")));
	return (int64) total;
}

/* Load a counter's configuration with the latest snapshot (inside SPI). */
static void
LoadCounterConfig(CounterEntry *entry)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(entry->name)};

	PreparePlan(&plan,
				"SELECT id, shards, owner::pg_catalog.oid, acl, mode = 'buffered', xmin"
				"  FROM sharded_seq.counter_config WHERE name = $1",
				1, argtypes);
	if (SPI_execute_snapshot(plan, args, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.counter_config");
	entry->loaded_epoch = ConfigEpoch;
	entry->select_user = entry->update_user = InvalidOid;
	if (entry->acl)
		pfree(entry->acl);
	entry->acl = NULL;
	entry->exists = (SPI_processed == 1);
	if (entry->exists)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		acl;

		entry->id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		entry->shards = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		entry->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
		acl = SPI_getbinval(tup, desc, 4, &isnull);
		entry->acl = CopyAcl(acl, isnull);
		entry->buffered = DatumGetBool(SPI_getbinval(tup, desc, 5, &isnull));
		entry->place.counter_id = entry->id;
		entry->place.shards = entry->shards;
		entry->place.config_xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 6, &isnull));
		entry->place.npages = 0;
		entry->shard = (int32) ((CounterSalt + (uint32) entry->id) % (uint32) entry->shards);
	}
}

static void
ValidateMode(const char *mode)
{
	if (strcmp(mode, "exact") == 0 || strcmp(mode, "buffered") == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown counter mode \"%s\"", mode),
			 errhint("mode must be 'exact' or 'buffered'.")));
}

/* Insert a counter and its shard rows (inside SPI, as the owner). */
static bool
InsertCounter(const char *name, int32 shards, const char *mode, Oid owner,
			  bool if_not_exists)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr plan_ine = NULL;
	static SPIPlanPtr shards_plan = NULL;
	Oid			argtypes[5] = {INT4OID, TEXTOID, INT4OID, TEXTOID, OIDOID};
	Datum		args[5];
	Oid			shard_types[2] = {INT4OID, INT4OID};
	Datum		shard_args[2];
	const char *sql =
		"INSERT INTO sharded_seq.counter_config (id, name, shards, mode, owner)"
		" VALUES ($1, $2, $3, $4, $5::pg_catalog.regrole)";
	int32		id = NextObjectId();

	args[0] = Int32GetDatum(id);
	args[1] = CStringGetTextDatum(name);
	args[2] = Int32GetDatum(shards);
	args[3] = CStringGetTextDatum(mode);
	args[4] = ObjectIdGetDatum(owner);
	if (if_not_exists)
		PreparePlan(&plan_ine, psprintf("%s ON CONFLICT (name) DO NOTHING", sql), 5, argtypes);
	else
		PreparePlan(&plan, sql, 5, argtypes);
	if (SPI_execute_plan(if_not_exists ? plan_ine : plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not create counter \"%s\"", name);
	if (SPI_processed == 0)
		return false;			/* someone else created it first */

	shard_args[0] = Int32GetDatum(id);
	shard_args[1] = Int32GetDatum(shards);
	PreparePlan(&shards_plan,
				"INSERT INTO sharded_seq.counter_shards (counter_id, shard)"
				" SELECT $1, g FROM pg_catalog.generate_series(0, $2 - 1) g",
				2, shard_types);
	if (SPI_execute_plan(shards_plan, shard_args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not create shards of counter \"%s\"", name);
	AnnounceConfigChange("counter_config");
	return true;
}

static CounterEntry *
LookupCounter(FunctionCallInfo fcinfo, bool create_missing)
{
	bool		is_new;
	CounterEntry *entry = CallSiteEntry(fcinfo, &CounterEntries, sizeof(CounterEntry),
										KIND_COUNTER, &is_new);

	if (CounterSalt == 0)
		CounterSalt = murmurhash32((uint32) MyProcPid ^ (uint32) MyStartTime) | 1;
	AcceptInvalidationMessages();
	if (entry->loaded_epoch != ConfigEpoch || (!entry->exists && create_missing))
	{
		OwnerContext ctx;

		BeginAsOwner(&ctx);
		LoadCounterConfig(entry);
		if (!entry->exists && create_missing)
		{
			PreventCommandIfReadOnly("counter_incr()");
			InsertCounter(entry->name, DefaultCounterShards, "exact", ctx.caller, true);
			CommandCounterIncrement();
			LoadCounterConfig(entry);
		}
		EndAsOwner(&ctx);
	}
	if (!entry->exists)
	{
		char		name[NAMEDATALEN];

		strlcpy(name, entry->name, sizeof(name));
		if (is_new)
			ForgetEntry(fcinfo, CounterEntries, entry, entry->acl);
		ReportNotFound(KIND_COUNTER, name);
	}
	return entry;
}

static void
CheckCounterPrivilege(CounterEntry *entry, AclMode mode)
{
	Oid			user = GetUserId();
	Oid		   *checked = (mode == ACL_SELECT) ? &entry->select_user : &entry->update_user;

	if (*checked == user)
		return;
	CheckPrivilege(KIND_COUNTER, entry->name, entry->owner, entry->acl, mode);
	*checked = user;
}

PG_FUNCTION_INFO_V1(counter_incr);
Datum
counter_incr(PG_FUNCTION_ARGS)
{
	CounterEntry *entry;
	int64		delta;
	int64		total;
	ShardRef   *refs = NULL;
	int			nrefs = 0;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("delta must not be null"),
				 errhint("Pass a number to add, or leave delta out to add 1.")));
	delta = PG_GETARG_INT64(1);
	PreventCommandIfReadOnly("counter_incr()");
	PreventCommandIfParallelMode("counter_incr()");

	entry = LookupCounter(fcinfo, true);
	CheckCounterPrivilege(entry, ACL_UPDATE);
	total = VisibleTotal(entry, delta, &refs, &nrefs);
	AddPending(entry, delta, refs, nrefs);
	PG_RETURN_INT64(total);
}

PG_FUNCTION_INFO_V1(counter_value);
Datum
counter_value(PG_FUNCTION_ARGS)
{
	CounterEntry *entry = LookupCounter(fcinfo, false);

	CheckCounterPrivilege(entry, ACL_SELECT);
	PG_RETURN_INT64(VisibleTotal(entry, 0, NULL, NULL));
}

/* The view's pending column: NULL when memcached cannot be read. */
PG_FUNCTION_INFO_V1(counter_pending);
Datum
counter_pending(PG_FUNCTION_ARGS)
{
	int64		amount;

	if (!MemcachedPending(PG_GETARG_INT32(0), &amount))
		PG_RETURN_NULL();
	PG_RETURN_INT64(amount);
}

/*
 * Flush every counter's memcached amount to its shard rows now, in this
 * transaction.  Exact counters are included, in case they were buffered
 * until an alter.  Returns how many counters had an amount to move.
 */
PG_FUNCTION_INFO_V1(flush_counters);
Datum
flush_counters(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	OwnerContext ctx;
	int			flushed = 0;
	SPITupleTable *rows;
	uint64		n;

	PreventCommandIfReadOnly("sharded_seq.flush_counters()");
	if (!McEnabled())
		PG_RETURN_INT32(0);
	BeginAsOwner(&ctx);
	PreparePlan(&plan, "SELECT id, name FROM sharded_seq.counter_config ORDER BY id", 0, NULL);
	if (SPI_execute_plan(plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list counters");
	rows = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		int32		id = DatumGetInt32(SPI_getbinval(rows->vals[i], rows->tupdesc, 1, &isnull));
		char	   *name = SPI_getvalue(rows->vals[i], rows->tupdesc, 2);

		if (FlushCounter(id, (int32) (CounterSalt % SHARDED_SEQ_MAX_SHARDS), name, true) > 0)
			flushed++;
	}
	EndAsOwner(&ctx);
	PG_RETURN_INT32(flushed);
}

/* The view's total: callers need no rights on the counter to list it. */
PG_FUNCTION_INFO_V1(counter_total);
Datum
counter_total(PG_FUNCTION_ARGS)
{
	int128		total = CounterSum(PG_GETARG_INT32(0), NULL, NULL, NULL);

	if (total > PG_INT64_MAX || total < PG_INT64_MIN)
		PG_RETURN_NULL();		/* a listing should not fail on one counter */
	PG_RETURN_INT64((int64) total);
}

/* ---- administration ---- */

typedef struct CounterRow
{
	int32		id;
	int32		shards;
	Oid			owner;
	Acl		   *acl;
} CounterRow;

/* Row-lock and return an owned counter (inside SPI, as the owner). */
static void
FetchOwnedCounter(Oid caller, const char *name, CounterRow *row)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		acl;

	PreparePlan(&plan,
				"SELECT id, shards, owner::pg_catalog.oid, acl FROM sharded_seq.counter_config"
				" WHERE name = $1 FOR UPDATE", 1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.counter_config");
	if (SPI_processed == 0)
		ReportNotFound(KIND_COUNTER, name);
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	row->id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	row->shards = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	row->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
	acl = SPI_getbinval(tup, desc, 4, &isnull);
	row->acl = isnull ? NULL : DatumGetAclP(acl);
	CheckOwnership(KIND_COUNTER, name, row->owner, caller);
}

static void
ExecOrFail(SPIPlanPtr plan, Datum *args, int expected, const char *what)
{
	if (SPI_execute_plan(plan, args, NULL, false, 0) != expected)
		elog(ERROR, "could not %s", what);
}

PG_FUNCTION_INFO_V1(create_counter);
Datum
create_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	int32		shards = PG_ARGISNULL(1) ? DefaultCounterShards : PG_GETARG_INT32(1);
	char	   *mode;
	OwnerContext ctx;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("mode must not be null"),
				 errhint("Leave mode out to create an exact counter.")));
	mode = text_to_cstring(PG_GETARG_TEXT_PP(2));
	ValidateShards(shards, KIND_COUNTER);
	ValidateMode(mode);
	PreventCommandIfReadOnly("sharded_seq.create_counter()");

	BeginAsOwner(&ctx);
	if (!InsertCounter(name, shards, mode, ctx.caller, true))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("counter \"%s\" already exists", name),
				 errhint("Use sharded_seq.alter_counter() to change it, or choose another name.")));
	EndAsOwner(&ctx);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(alter_counter);
Datum
alter_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	static SPIPlanPtr grow_plan = NULL;
	static SPIPlanPtr shrink_plan = NULL;
	static SPIPlanPtr fold_plan = NULL;
	static SPIPlanPtr config_plan = NULL;
	Oid			types3[3] = {INT4OID, INT4OID, INT4OID};
	Oid			types2[2] = {INT4OID, INT4OID};
	OwnerContext ctx;
	CounterRow	row;
	int32		shards;

	if (!PG_ARGISNULL(1))
		ValidateShards(PG_GETARG_INT32(1), KIND_COUNTER);
	if (!PG_ARGISNULL(2))
		ValidateMode(text_to_cstring(PG_GETARG_TEXT_PP(2)));
	PreventCommandIfReadOnly("sharded_seq.alter_counter()");

	BeginAsOwner(&ctx);
	FetchOwnedCounter(ctx.caller, name, &row);
	shards = PG_ARGISNULL(1) ? row.shards : PG_GETARG_INT32(1);
	if (!PG_ARGISNULL(2))
	{
		static SPIPlanPtr mode_plan = NULL;
		Oid			mode_types[2] = {INT4OID, TEXTOID};
		Datum		mode_args[2] = {Int32GetDatum(row.id), PointerGetDatum(PG_GETARG_TEXT_PP(2))};

		/* leaving buffered mode: move what memcached holds into the rows first */
		if (strcmp(text_to_cstring(PG_GETARG_TEXT_PP(2)), "exact") == 0 && McEnabled() &&
			FlushCounter(row.id, 0, name, true) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not flush counter \"%s\" before leaving buffered mode", name),
					 errhint("Check sharded_seq.memcached_servers(), or try again.")));
		PreparePlan(&mode_plan,
					"UPDATE sharded_seq.counter_config SET mode = $2, altered_at = pg_catalog.now()"
					" WHERE id = $1 AND mode <> $2", 2, mode_types);
		ExecOrFail(mode_plan, mode_args, SPI_OK_UPDATE, "change counter mode");
		if (SPI_processed > 0)
			AnnounceConfigChange("counter_config");
	}
	if (shards > row.shards)
	{
		Datum		args[3] = {Int32GetDatum(row.id), Int32GetDatum(row.shards), Int32GetDatum(shards)};

		PreparePlan(&grow_plan,
					"INSERT INTO sharded_seq.counter_shards (counter_id, shard)"
					" SELECT $1, g FROM pg_catalog.generate_series($2, $3 - 1) g",
					3, types3);
		ExecOrFail(grow_plan, args, SPI_OK_INSERT, "add counter shards");
	}
	else if (shards < row.shards)
	{
		/* Move the removed shards' values into shard 0, in one transaction. */
		Datum		args[2] = {Int32GetDatum(row.id), Int32GetDatum(shards)};

		PreparePlan(&shrink_plan,
					"WITH gone AS (DELETE FROM sharded_seq.counter_shards"
					"               WHERE counter_id = $1 AND shard >= $2 RETURNING value)"
					"UPDATE sharded_seq.counter_shards"
					"   SET value = (value::pg_catalog.numeric + (SELECT coalesce(pg_catalog.sum(value), 0) FROM gone))::pg_catalog.int8"
					" WHERE counter_id = $1 AND shard = 0",
					2, types2);
		PreparePlan(&fold_plan,
					"SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = $1 AND shard >= $2 FOR UPDATE",
					2, types2);
		/* lock the removed shards first, so the DELETE sees their final values */
		ExecOrFail(fold_plan, args, SPI_OK_SELECT, "lock counter shards");
		ExecOrFail(shrink_plan, args, SPI_OK_UPDATE, "remove counter shards");
	}
	if (shards != row.shards)
	{
		Datum		args[2] = {Int32GetDatum(row.id), Int32GetDatum(shards)};

		PreparePlan(&config_plan,
					"UPDATE sharded_seq.counter_config SET shards = $2, altered_at = pg_catalog.now()"
					" WHERE id = $1", 2, types2);
		ExecOrFail(config_plan, args, SPI_OK_UPDATE, "update counter");
		AnnounceConfigChange("counter_config");
	}
	EndAsOwner(&ctx);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(drop_counter);
Datum
drop_counter(PG_FUNCTION_ARGS)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	OwnerContext ctx;
	CounterRow	row;
	Datum		args[1];

	PreventCommandIfReadOnly("sharded_seq.drop_counter()");
	BeginAsOwner(&ctx);
	FetchOwnedCounter(ctx.caller, name, &row);
	args[0] = Int32GetDatum(row.id);
	ForgetPending(row.id);
	PreparePlan(&plan,
				"WITH s AS (DELETE FROM sharded_seq.counter_shards WHERE counter_id = $1)"
				"DELETE FROM sharded_seq.counter_config WHERE id = $1",
				1, argtypes);
	ExecOrFail(plan, args, SPI_OK_DELETE, "drop counter");
	AnnounceConfigChange("counter_config");
	EndAsOwner(&ctx);
	PG_RETURN_VOID();
}

static void
ChangeCounterAcl(FunctionCallInfo fcinfo, bool grant)
{
	char	   *name = NameArg(fcinfo, 0, KIND_COUNTER);
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[2] = {INT4OID, ACLITEMARRAYOID};
	OwnerContext ctx;
	CounterRow	row;
	Datum		args[2];
	char	   *grantee;
	char	   *privilege;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("grantee and privilege must not be null"),
				 errhint("Name a role (or 'public') and a privilege: 'select', 'update' or 'all'.")));
	grantee = text_to_cstring(PG_GETARG_TEXT_PP(1));
	privilege = text_to_cstring(PG_GETARG_TEXT_PP(2));
	PreventCommandIfReadOnly("sharded_seq.grant_counter()");

	BeginAsOwner(&ctx);
	FetchOwnedCounter(ctx.caller, name, &row);
	args[0] = Int32GetDatum(row.id);
	args[1] = PointerGetDatum(ChangeAcl(KIND_COUNTER, name, row.owner, row.acl,
										grantee, privilege, grant));
	PreparePlan(&plan, "UPDATE sharded_seq.counter_config SET acl = $2 WHERE id = $1",
				2, argtypes);
	ExecOrFail(plan, args, SPI_OK_UPDATE, "change counter privileges");
	AnnounceConfigChange("counter_config");
	EndAsOwner(&ctx);
}

PG_FUNCTION_INFO_V1(grant_counter);
Datum
grant_counter(PG_FUNCTION_ARGS)
{
	ChangeCounterAcl(fcinfo, true);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(revoke_counter);
Datum
revoke_counter(PG_FUNCTION_ARGS)
{
	ChangeCounterAcl(fcinfo, false);
	PG_RETURN_VOID();
}
