/*
 * counter_memcached.c
 *	  Write-behind through memcached for counters in mode 'buffered': the
 *	  amounts a transaction hands to memcached once it has committed, flushes
 *	  from memcached into the shard rows, the amounts a flush gives back when
 *	  its transaction or savepoint rolls back, and leftovers, the committed
 *	  amounts memcached could not take.
 *
 * Nothing is sent to memcached before the transaction's commit is final, so
 * an abort after PRE_COMMIT (a serialization failure, a later pre-commit
 * step, ROLLBACK PREPARED) never leaves an increment counted.  Code that runs
 * after commit cannot raise errors: it uses libmemcached and memory that was
 * set aside before commit.  An amount that finds no memcached server after
 * commit becomes a leftover of this backend; it goes to the shard rows with
 * the backend's next counter commit, or when the backend exits, and only in
 * the installation of the extension it was committed in.
 */
#include "postgres.h"

#include <time.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "sharded_seq.h"

#define MC_KEY_LEN 250

/* An amount to add to memcached once this transaction has committed. */
typedef struct AfterCommit
{
	char		key[MC_KEY_LEN];
	Oid			install;		/* counter_config's OID: which installation */
	int32		counter_id;
	int32		shard;
	char		name[NAMEDATALEN];
	uint64		amount;
	struct AfterCommit *next;
} AfterCommit;

/* An amount a flush took from memcached, given back if its work is undone. */
typedef struct GiveBack
{
	char		key[MC_KEY_LEN];
	Oid			install;
	int32		counter_id;
	int32		shard;
	char		name[NAMEDATALEN];
	uint64		amount;
	SubTransactionId subid;
	struct GiveBack *next;
} GiveBack;

/* A committed amount that memcached could not take: it goes to the rows. */
typedef struct Leftover
{
	Oid			install;		/* ids are reused by a later installation */
	int32		counter_id;
	int32		shard;
	char		name[NAMEDATALEN];
	int64		amount;
	bool		taken;			/* by the transaction now committing */
	struct Leftover *next;
} Leftover;

/* all in TopMemoryContext */
static AfterCommit *AfterCommits = NULL;
static GiveBack *GiveBacks = NULL;
static Leftover *Leftovers = NULL;

static void EnsureExitCallback(void);

static char *
PendingKeyName(int32 counter_id)
{
	return McKey("ctr:%d:pending", counter_id);
}

/*
 * Add amount to a counter's memcached key, creating the key if it is
 * missing.  When two sessions create it at once, the one that finds it
 * already there adds to it.  Uses libmemcached only: safe after commit.
 */
static McResult
Deliver(const char *key, uint64 amount)
{
	for (int attempt = 0; attempt < 3; attempt++)
	{
		uint64		unused;
		McResult	r = McIncr(key, amount, &unused);

		if (r != MC_MISSING)
			return r;
		r = McAdd(key, (int64) amount, 0);
		if (r != MC_EXISTS)
			return r;
	}
	return MC_UNKNOWN;
}

static void
AddLeftover(Oid install, int32 counter_id, int32 shard, const char *name,
			uint64 amount)
{
	Leftover   *lo;

	for (lo = Leftovers; lo; lo = lo->next)
		if (lo->install == install && lo->counter_id == counter_id && !lo->taken &&
			(uint64) lo->amount + amount <= (uint64) PG_INT64_MAX)
		{
			lo->amount += (int64) amount;
			return;
		}
	lo = MemoryContextAlloc(TopMemoryContext, sizeof(Leftover));
	lo->install = install;
	lo->counter_id = counter_id;
	lo->shard = shard;
	strlcpy(lo->name, name, NAMEDATALEN);
	lo->amount = (int64) amount;
	lo->taken = false;
	lo->next = Leftovers;
	Leftovers = lo;
}

/* Give back what a flush took; if memcached cannot take it, the rows will. */
static void
GiveBackNow(GiveBack *gb)
{
	McResult	r = Deliver(gb->key, gb->amount);

	if (r == MC_DOWN)
		AddLeftover(gb->install, gb->counter_id, gb->shard, gb->name, gb->amount);
	else if (r != MC_OK)
		StatsCount(KIND_COUNTER, gb->counter_id, STAT_ERRORS, 1);
}

/*
 * At PRE_COMMIT: add amount to the counter in memcached once this
 * transaction has committed.  The first committer in each flush interval
 * also flushes the counter, in this transaction.
 */
void
BufferAfterCommit(int32 counter_id, int64 amount, int32 shard,
				  const char *name, int64 *claim_interval)
{
	AfterCommit *ac;
	int64		interval = (int64) time(NULL) / CounterFlushInterval;

	EnsureExitCallback();
	ac = MemoryContextAlloc(TopMemoryContext, sizeof(AfterCommit));

	strlcpy(ac->key, PendingKeyName(counter_id), MC_KEY_LEN);
	ac->install = ConfigRelid("counter_config");
	ac->counter_id = counter_id;
	ac->shard = shard;
	strlcpy(ac->name, name, NAMEDATALEN);
	ac->amount = (uint64) amount;
	ac->next = AfterCommits;
	AfterCommits = ac;

	/* each backend asks once per interval; memcached's add picks one asker */
	if (*claim_interval != interval)
	{
		*claim_interval = interval;
		if (McAdd(McKey("ctr:%d:flush:" INT64_FORMAT, counter_id, interval), 1,
				  CounterFlushInterval * 2) == MC_OK)
			(void) FlushCounter(counter_id, shard, name, false);
	}
}

/* After commit (or PREPARE): deliver, and settle what this transaction took. */
void
BufferAtCommit(void)
{
	Leftover  **link = &Leftovers;

	while (*link)
	{
		Leftover   *lo = *link;

		if (lo->taken)
		{
			*link = lo->next;
			pfree(lo);
		}
		else
			link = &lo->next;
	}
	while (AfterCommits)
	{
		AfterCommit *ac = AfterCommits;
		McResult	r = Deliver(ac->key, ac->amount);

		if (r == MC_OK)
			StatsCount(KIND_COUNTER, ac->counter_id, STAT_HITS, 1);
		else if (r == MC_DOWN)
		{
			/* nothing reached memcached: the rows will take it */
			StatsCount(KIND_COUNTER, ac->counter_id, STAT_FALLBACKS, 1);
			AddLeftover(ac->install, ac->counter_id, ac->shard, ac->name, ac->amount);
		}
		else
		{
			/*
			 * It may or may not be in memcached.  Writing it to the rows too
			 * could count it twice, so it is left: at worst it is lost.
			 */
			StatsCount(KIND_COUNTER, ac->counter_id, STAT_ERRORS, 1);
		}
		AfterCommits = ac->next;
		pfree(ac);
	}
	while (GiveBacks)
	{
		GiveBack   *gb = GiveBacks;

		GiveBacks = gb->next;
		pfree(gb);
	}
}

void
BufferAtAbort(void)
{
	while (AfterCommits)
	{
		AfterCommit *ac = AfterCommits;

		AfterCommits = ac->next;
		pfree(ac);
	}
	for (Leftover *lo = Leftovers; lo; lo = lo->next)
		lo->taken = false;
	while (GiveBacks)
	{
		GiveBack   *gb = GiveBacks;

		GiveBackNow(gb);
		GiveBacks = gb->next;
		pfree(gb);
	}
}

/* A rolled-back savepoint gives back what its flushes took. */
void
BufferAtSubXact(bool aborted, SubTransactionId subid, SubTransactionId parent)
{
	GiveBack  **link = &GiveBacks;

	while (*link)
	{
		GiveBack   *gb = *link;

		if (gb->subid != subid)
			link = &gb->next;
		else if (aborted)
		{
			GiveBackNow(gb);
			*link = gb->next;
			pfree(gb);
		}
		else
		{
			gb->subid = parent;
			link = &gb->next;
		}
	}
}

bool
FlushedInXact(void)
{
	return GiveBacks != NULL;
}

/*
 * Forget leftovers of an installation that is gone (DROP and CREATE
 * EXTENSION start counter ids again at 1): they belong to no counter now.
 */
static void
ForgetOtherInstallations(Oid install)
{
	Leftover  **link = &Leftovers;

	while (*link)
	{
		Leftover   *lo = *link;

		if (lo->install != install && !lo->taken)
		{
			ereport(LOG,
					(errmsg("sharded_seq: %lld committed increments of counter \"%s\" were dropped with its extension",
							(long long) lo->amount, lo->name)));
			*link = lo->next;
			pfree(lo);
		}
		else
			link = &lo->next;
	}
}

/* This backend's leftovers of a counter, not yet in the rows: its reads count them. */
int64
LeftoverAmount(int32 counter_id)
{
	int64		n = 0;
	Oid			install;

	if (Leftovers == NULL)
		return 0;
	install = ConfigRelid("counter_config");
	for (Leftover *lo = Leftovers; lo; lo = lo->next)
		if (lo->install == install && lo->counter_id == counter_id)
			n += lo->amount;
	return n;
}

long
CountLeftovers(void)
{
	long		n = 0;

	for (Leftover *lo = Leftovers; lo; lo = lo->next)
		n += !lo->taken;
	return n;
}

/* Append the leftovers to a commit's items, marking them taken. */
long
TakeLeftovers(CommitItem *items, long n)
{
	if (Leftovers == NULL)
		return n;
	ForgetOtherInstallations(ConfigRelid("counter_config"));
	for (Leftover *lo = Leftovers; lo; lo = lo->next)
	{
		CommitItem *item;

		if (lo->taken)
			continue;
		item = &items[n++];
		memset(item, 0, sizeof(CommitItem));
		item->counter_id = lo->counter_id;
		item->shard = lo->shard;
		item->name = lo->name;
		item->amount = lo->amount;
		lo->taken = true;
	}
	return n;
}

/*
 * A backend that exits with leftovers writes them to the rows in a
 * transaction of its own, as PostgreSQL does when it removes temporary tables
 * at exit.  Never to memcached: the counter may have left buffered mode, and
 * an answer that times out would leave it unknown whether it counted.
 */
static void
BufferAtExit(int code, Datum arg)
{
	if (Leftovers == NULL || !OidIsValid(MyDatabaseId))
		return;
	PG_TRY();
	{
		AbortOutOfAnyTransaction();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		ForgetOtherInstallations(ConfigRelid("counter_config"));
		for (Leftover *lo = Leftovers; lo; lo = lo->next)
			(void) CounterApply(lo->counter_id, lo->shard, lo->amount, lo->name, NULL, 0);
		PopActiveSnapshot();
		CommitTransactionCommand();
		Leftovers = NULL;
	}
	PG_CATCH();
	{
		EmitErrorReport();
		FlushErrorState();
		AbortOutOfAnyTransaction();
		for (Leftover *lo = Leftovers; lo; lo = lo->next)
			ereport(LOG,
					(errmsg("sharded_seq: %lld committed increments of counter \"%s\" were lost at exit",
							(long long) lo->amount, lo->name),
					 errdetail("memcached could not be reached after they committed, nor the database at exit.")));
	}
	PG_END_TRY();
}

/*
 * Register the exit callback in this backend, before anything can leave a
 * leftover.  Not from _PG_init: with shared_preload_libraries that runs in
 * the postmaster.
 */
static void
EnsureExitCallback(void)
{
	static int	registered_pid = 0;

	if (registered_pid == MyProcPid)
		return;
	before_shmem_exit(BufferAtExit, (Datum) 0);
	registered_pid = MyProcPid;
}

/*
 * Move a counter's amount from memcached to a shard row, in this
 * transaction.  Only one session flushes a counter at a time (an advisory
 * lock held to the end of the transaction); the amount is read and then
 * decremented by exactly that much, so increments arriving meanwhile stay
 * pending.  If this transaction or savepoint rolls back, the amount is given
 * back.  Returns the amount moved, or -1 if nothing could safely be moved.
 */
int64
FlushCounter(int32 counter_id, int32 shard, const char *name, bool wait)
{
	LOCKTAG		tag;
	char	   *key = PendingKeyName(counter_id);
	int64		amount;
	uint64		left;
	McResult	r;
	GiveBack   *gb;

	EnsureExitCallback();
	/* nothing to move: take no lock (flush_counters may visit every counter) */
	r = McGet(key, &amount);
	if (r == MC_MISSING || (r == MC_OK && amount <= 0))
		return 0;
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
	/* memory for the give-back first: nothing may fail between decr and recording it */
	gb = MemoryContextAlloc(TopMemoryContext, sizeof(GiveBack));
	/* taken out first: a read may then miss it for a moment, never count it twice */
	if (McDecr(key, (uint64) amount, &left) != MC_OK)
	{
		pfree(gb);
		StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
		return -1;
	}
	strlcpy(gb->key, key, sizeof(gb->key));
	gb->install = ConfigRelid("counter_config");
	gb->counter_id = counter_id;
	gb->shard = shard;
	strlcpy(gb->name, name, NAMEDATALEN);
	gb->amount = (uint64) amount;
	gb->subid = GetCurrentSubTransactionId();
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

/* The amount waiting in memcached: 0 if none, false if it cannot be read. */
bool
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
