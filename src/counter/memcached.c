/*
 * memcached.c
 *	  Write-behind through memcached for counters in mode 'memcached': the
 *	  amounts a transaction hands to memcached once it has committed, flushes
 *	  from memcached into the shard rows, the amounts a flush gives back when
 *	  its transaction or savepoint rolls back, and leftovers, the committed
 *	  amounts memcached could not take.
 *
 * Nothing is sent to memcached before the transaction's commit is final, so
 * an abort after PRE_COMMIT (a serialization failure, a later pre-commit
 * step, ROLLBACK PREPARED) never leaves an increment counted.  Code that runs
 * after commit or during abort cannot raise errors: it uses libmemcached and
 * nodes allocated before, moving them between lists.  An amount that finds
 * no memcached server after commit becomes a leftover of this backend: it
 * goes to the shard rows with the backend's next counter commit (without
 * waiting, and never failing that commit), or when the backend exits, and
 * only in the installation of the extension it was committed in, and only
 * if no set_counter committed since its own commit (the set absorbed it).
 */
#include "postgres.h"

#include <time.h>

#include "access/xact.h"
#include "catalog/namespace.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

/* settings (defined in module.c) */
int			MemcachedBatchDelay = 10;
int			CounterFlushInterval = 10;

#define MC_KEY_LEN 250

/*
 * An amount of one counter on its way: to memcached after commit, back to
 * memcached after an undone flush, or to the rows (a leftover).
 */
typedef struct Amount
{
	char		key[MC_KEY_LEN];	/* the counter's memcached key */
	bool		made;			/* this backend saw the key made before */
	Oid			install;		/* counter_config's OID: ids are reused by a
								 * later installation */
	int32		counter_id;
	int32		shard;
	char		name[NAMEDATALEN];
	uint64		amount;
	int64		sets;			/* the counter's set count at its commit, or
								 * at the flush a give-back undoes */
	SubTransactionId subid;		/* give-backs: the flush's subtransaction;
								 * leftovers taken by set_counter: the set's */
	bool		taken;			/* leftovers: written, or absorbed by a set, by
								 * the current xact */
	TimestampTz since;			/* to memcached: none of it is older (0: now) */
	TimestampTz clean_at;		/* give-backs: the flush took every amount
								 * older than this (0: not all) */
	bool		given_back;		/* a flush's amount on its way back */
	struct Amount *next;
} Amount;

/* all in AmountContext */
static Amount *AfterCommits = NULL;
static Amount *GiveBacks = NULL;
static Amount *Leftovers = NULL;

/*
 * The nodes outlive a transaction's memory, so they have a context of their
 * own, and a spare.  A node is freed when its transaction ends, but an
 * allocator keeps freed chunks: one commit to many 'memcached' counters would
 * leave its memory behind for the backend's life.  So when a transaction
 * ends with the context grown past AMOUNTS_KEEP and mostly free, the
 * leftovers still held (usually none) are copied to the spare, and the
 * context is reset and becomes the spare: nothing there can fail.
 */
static MemoryContext AmountContext = NULL;
static MemoryContext SpareContext = NULL;

#define AMOUNTS_KEEP (64 * 1024)

static void EnsureExitCallback(void);

/*
 * Recently built pending keys: building one costs more than an increment.
 * The worker forwards for every counter of its database, so it keeps more:
 * a forgotten key costs it an answered add before the next forward.
 */
#define KEY_CACHE_SIZE 64
#define WORKER_KEY_CACHE_SIZE 4096

typedef struct KeyCacheEntry
{
	Oid			install;		/* InvalidOid: empty */
	uint64		token;
	int32		counter_id;
	bool		created;		/* this backend saw the key made (or there) */
	char		key[MC_KEY_LEN];
} KeyCacheEntry;

static KeyCacheEntry *KeyCache = NULL;	/* TopMemoryContext */
static int	KeyCacheSize = 0;

static KeyCacheEntry *
KeyCacheEntryFor(int32 counter_id)
{
	if (KeyCache == NULL)
	{
		int			size = MyBackendType == B_BG_WORKER ? WORKER_KEY_CACHE_SIZE : KEY_CACHE_SIZE;

		KeyCache = MemoryContextAllocZero(TopMemoryContext, size * sizeof(KeyCacheEntry));
		KeyCacheSize = size;
	}
	return &KeyCache[(uint32) counter_id % (uint32) KeyCacheSize];
}

static char *
PendingKeyName(int32 counter_id)
{
	KeyCacheEntry *e = KeyCacheEntryFor(counter_id);
	Oid			install = ConfigRelid("counter_config");
	uint64		token = InstallationToken();

	if (e->install != install || e->token != token || e->counter_id != counter_id)
	{
		char	   *key = McKey("ctr:%d:pending", counter_id);

		e->install = InvalidOid;
		strlcpy(e->key, key, MC_KEY_LEN);
		pfree(key);
		e->token = token;
		e->counter_id = counter_id;
		e->created = false;
		e->install = install;
	}
	return e->key;
}

/* A node for counter_id, allocated before anything is sent. */
static Amount *
NewAmount(int32 counter_id, int32 shard, const char *name, uint64 amount,
		  int64 sets)
{
	Amount	   *a;

	if (AmountContext == NULL)
	{
		AmountContext = AllocSetContextCreate(TopMemoryContext, "sharded_seq memcached amounts",
											  ALLOCSET_SMALL_SIZES);
		SpareContext = AllocSetContextCreate(TopMemoryContext, "sharded_seq memcached amounts",
											 ALLOCSET_SMALL_SIZES);
	}
	a = MemoryContextAllocZero(AmountContext, sizeof(Amount));

	strlcpy(a->key, PendingKeyName(counter_id), MC_KEY_LEN);
	a->made = KeyCacheEntryFor(counter_id)->created;
	a->install = ConfigRelid("counter_config");
	a->counter_id = counter_id;
	a->shard = shard;
	strlcpy(a->name, name, NAMEDATALEN);
	a->amount = amount;
	a->sets = sets;
	/* the local statistics entry too: no allocation after commit */
	StatsCount(KIND_COUNTER, counter_id, STAT_HITS, 0);
	return a;
}

/*
 * After commit: mark a counter's key as made, if the cache still holds it
 * (no catalog access here).
 */
static void
NoteKeyMade(Amount *a)
{
	KeyCacheEntry *e = KeyCacheEntryFor(a->counter_id);

	if (e->install == a->install && e->counter_id == a->counter_id &&
		strcmp(e->key, a->key) == 0)
		e->created = true;
}

/*
 * Add an amount to a counter's memcached key, in a request that asks for no
 * reply: a write, not a round trip.  The request creates a missing key too,
 * but memcached does that with an add that loses to a concurrent one, and
 * the loser's amount would vanish unseen: so the first time this backend
 * delivers to a counter, it makes the key with an add that answers.  After
 * memcached loses a key, increments racing to make it again may be lost
 * with it.  Uses libmemcached only: safe after commit.
 */
static McResult
Deliver(Amount *a)
{
	McResult	r;

	if (!a->made)
	{
		r = McAdd(a->key, 0, 0);

		/* whatever became of the add (of 0), no amount was sent: not lost */
		if (r != MC_OK && r != MC_EXISTS)
			return MC_DOWN;
		NoteKeyMade(a);
	}
	r = McIncrQuiet(a->key, a->amount);
	/* sent, or maybe: the key's amount may now be this old (monitoring) */
	if (r != MC_DOWN)
	{
		TimestampTz since = a->since != 0 ? a->since : GetCurrentTimestamp();

		if (a->given_back)
			StatsMcGivenBack(a->counter_id, since);
		else
			StatsMcDelivered(a->counter_id, since);
	}
	return r;
}

/*
 * The worker's forward: an increment that answers, on the ordinary
 * connection, so the amount is in memcached before the worker lets a
 * set_counter have the counter's lock (a set reads the key on another
 * connection; a quiet request on the worker's own could be served after
 * that read).  One forward carries many commits: the round trips are the
 * worker's, not a commit's.  A read first: it finds the key missing (then
 * made with an add that answers, so no concurrent maker's amount vanishes)
 * or the connection dead (memcached restarted behind it: then nothing is
 * sent, rather than an increment whose outcome a reset hides).  An incr
 * that finds no key applied nothing: MC_DOWN, the amount stays.
 */
static McResult
DeliverAnswered(Amount *a)
{
	int64		current;
	uint64		unused;
	McResult	r = McGet(a->key, &current);

	if (r == MC_MISSING)
	{
		r = McAdd(a->key, 0, 0);
		if (r != MC_OK && r != MC_EXISTS)
			return MC_DOWN;
	}
	else if (r != MC_OK)
		return MC_DOWN;
	r = McIncr(a->key, a->amount, &unused);
	if (r == MC_MISSING)
		return MC_DOWN;
	if (r != MC_DOWN)
		StatsMcDelivered(a->counter_id, a->since != 0 ? a->since : GetCurrentTimestamp());
	return r;
}

/*
 * Wait until memcached has processed this backend's quiet requests to a's
 * key: a read on the same connection is answered after them.  memcached
 * orders requests per connection only, so a set_counter (or alter_counter)
 * that gets the lock next and reads the key on its own connection could
 * otherwise read it without the amount, which would then count on top of the
 * set.  Uses libmemcached only: safe after commit; a failure changes nothing.
 */
static void
ConfirmDelivered(Amount *a)
{
	int64		ignored;

	(void) McGetAfterOwn(a->key, &ignored);
}

/*
 * Deliver a node, counting a success as a hit if count_hit; keep it as a
 * leftover if no server took it, else free it.  A delivered amount is
 * confirmed (a read on the same connection) before the caller's locks go.
 */
static void
DeliverOrKeep(Amount *a, bool count_hit)
{
	McResult	r = Deliver(a);

	if (r == MC_DOWN)
	{
		/* nothing reached memcached: the rows will take it, one per counter */
		StatsCount(KIND_COUNTER, a->counter_id, STAT_FALLBACKS, 1);
		for (Amount *lo = Leftovers; lo; lo = lo->next)
			if (lo->install == a->install && lo->counter_id == a->counter_id &&
				lo->sets == a->sets && !lo->taken &&
				lo->amount + a->amount <= (uint64) PG_INT64_MAX)
			{
				lo->amount += a->amount;
				pfree(a);
				return;
			}
		a->taken = false;
		a->subid = InvalidSubTransactionId;
		a->next = Leftovers;
		Leftovers = a;
		return;
	}
	/*
	 * An unknown outcome may or may not have counted.  Writing it to the rows
	 * too could count it twice, so it is left: at worst it is lost.
	 */
	if (r != MC_OK)
		StatsCount(KIND_COUNTER, a->counter_id, STAT_ERRORS, 1);
	else
	{
		if (count_hit)
			StatsCount(KIND_COUNTER, a->counter_id, STAT_HITS, 1);
		/*
		 * Before this transaction lets go of the counter's commit lock (or
		 * a flush's lock): a set_counter that takes it next reads the key
		 * on another connection, which memcached may serve first.
		 */
		ConfirmDelivered(a);
	}
	pfree(a);
}

/*
 * At PRE_COMMIT: add amount to the counter in memcached once this
 * transaction has committed.  The first committer in each flush interval
 * also flushes the counter, in this transaction.
 */
void
MemcachedAfterCommit(int32 counter_id, int64 amount, int32 shard,
				  const char *name, int64 sets, int64 *claim_interval)
{
	Amount	   *a;
	int64		interval = (int64) time(NULL) / CounterFlushInterval;

	EnsureExitCallback();
	a = NewAmount(counter_id, shard, name, (uint64) amount, sets);
	a->next = AfterCommits;
	AfterCommits = a;

	/*
	 * Unless this database's worker flushes the memcached this session uses,
	 * each backend asks once per interval, and memcached's add picks one
	 * asker to flush.
	 */
	if (*claim_interval != interval && !RegistryFlushesMyMemcached())
	{
		*claim_interval = interval;
		if (McAdd(McKey("ctr:%d:flush:" INT64_FORMAT, counter_id, interval), 1,
				  CounterFlushInterval * 2) == MC_OK)
			(void) MemcachedFlush(counter_id, shard, name, false);
	}
}

/*
 * At the end of a transaction, once only leftovers are listed: give back
 * what it left in AmountContext.  No errors here: a copy that finds no
 * memory leaves things as they are.
 */
static void
ShrinkAmounts(void)
{
	Size		allocated;
	Size		live = 0;
	Amount	   *copies = NULL;
	Amount	  **tail = &copies;
	MemoryContext old;

	if (AmountContext == NULL || AfterCommits != NULL || GiveBacks != NULL)
		return;
	allocated = MemoryContextMemAllocated(AmountContext, false);
	if (allocated <= AMOUNTS_KEEP)
		return;
	for (Amount *lo = Leftovers; lo; lo = lo->next)
		live += sizeof(Amount);
	/* mostly leftovers still owed to the rows: copying them would gain little */
	if (live > allocated / 4)
		return;
	for (Amount *lo = Leftovers; lo; lo = lo->next)
	{
		Amount	   *copy = MemoryContextAllocExtended(SpareContext, sizeof(Amount),
													  MCXT_ALLOC_NO_OOM);

		if (copy == NULL)
		{
			MemoryContextReset(SpareContext);
			return;
		}
		memcpy(copy, lo, sizeof(Amount));
		copy->next = NULL;
		*tail = copy;
		tail = &copy->next;
	}
	Leftovers = copies;
	MemoryContextReset(AmountContext);
	old = AmountContext;
	AmountContext = SpareContext;
	SpareContext = old;
}

/* After commit (or PREPARE): deliver, and settle what this transaction took. */
void
MemcachedXactCommit(void)
{
	Amount	  **link = &Leftovers;

	while (*link)
	{
		Amount	   *lo = *link;

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
		Amount	   *a = AfterCommits;

		AfterCommits = a->next;
		DeliverOrKeep(a, true);
	}
	while (GiveBacks)
	{
		Amount	   *gb = GiveBacks;

		GiveBacks = gb->next;
		/* the flush is in the rows: nothing older than its read is left */
		if (gb->clean_at != 0)
			StatsMcCleaned(gb->counter_id, gb->clean_at);
		pfree(gb);
	}
	ShrinkAmounts();
}

/* Give back what an undone flush took; if memcached cannot take it, the rows will. */
static void
GiveBackNow(Amount *gb)
{
	gb->given_back = true;
	DeliverOrKeep(gb, false);
}

void
MemcachedXactAbort(void)
{
	while (AfterCommits)
	{
		Amount	   *a = AfterCommits;

		AfterCommits = a->next;
		pfree(a);
	}
	for (Amount *lo = Leftovers; lo; lo = lo->next)
		lo->taken = false;
	while (GiveBacks)
	{
		Amount	   *gb = GiveBacks;

		GiveBacks = gb->next;
		GiveBackNow(gb);
	}
	ShrinkAmounts();
}

/*
 * A rolled-back savepoint gives back what its flushes took, and the
 * leftovers its sets absorbed.
 */
void
MemcachedSubXact(bool aborted, SubTransactionId subid, SubTransactionId parent)
{
	Amount	  **link = &GiveBacks;

	for (Amount *lo = Leftovers; lo; lo = lo->next)
		if (lo->taken && lo->subid == subid)
		{
			if (aborted)
				lo->taken = false;
			else
				lo->subid = parent;
		}

	while (*link)
	{
		Amount	   *gb = *link;

		if (gb->subid != subid)
			link = &gb->next;
		else if (aborted)
		{
			*link = gb->next;
			GiveBackNow(gb);
		}
		else
		{
			gb->subid = parent;
			link = &gb->next;
		}
	}
}

bool
MemcachedFlushedInXact(void)
{
	return GiveBacks != NULL;
}

/* Log a leftover that will never be counted, and why. */
static void
LogNotCounted(Amount *lo, const char *why)
{
	ereport(LOG,
			(errmsg("sharded_seq: %llu committed increments of counter \"%s\" will not be counted: %s",
					(unsigned long long) lo->amount, lo->name, why)));
}

/*
 * Forget leftovers of an installation that is gone (DROP and CREATE
 * EXTENSION start counter ids again at 1): they belong to no counter now.
 */
static void
ForgetOtherInstallations(Oid install)
{
	Amount	  **link = &Leftovers;

	while (*link)
	{
		Amount	   *lo = *link;

		if (lo->install != install && !lo->taken)
		{
			LogNotCounted(lo, "the extension was dropped");
			*link = lo->next;
			pfree(lo);
		}
		else
			link = &lo->next;
	}
}

/*
 * This backend's leftovers of a counter, not yet in the rows: its reads
 * count them, unless a set absorbed them.
 */
int64
MemcachedLeftover(int32 counter_id)
{
	int64		n = 0;
	int64		sets = -1;
	Oid			install;

	if (Leftovers == NULL)
		return 0;
	install = ConfigRelid("counter_config");
	for (Amount *lo = Leftovers; lo; lo = lo->next)
		if (lo->install == install && lo->counter_id == counter_id && !lo->taken)
		{
			if (sets < 0)
				sets = CounterSetCount(counter_id);
			if (lo->sets == sets)
				n += (int64) lo->amount;
		}
	return n;
}

/*
 * set_counter, in this backend: its total absorbs this backend's leftovers
 * of the counter.  They are taken, freed if the transaction commits, owed
 * again if it or the set's savepoint rolls back.
 */
void
MemcachedAbsorbLeftovers(int32 counter_id)
{
	Oid			install = ConfigRelid("counter_config");

	for (Amount *lo = Leftovers; lo; lo = lo->next)
		if (lo->install == install && lo->counter_id == counter_id && !lo->taken)
		{
			lo->taken = true;
			lo->subid = GetCurrentSubTransactionId();
		}
}

/*
 * Try to write one leftover to the rows, never waiting and never raising an
 * error.  Returns false only if its rows, table or commit lock are held:
 * then try again later.
 */
static bool
WriteLeftover(Amount *lo)
{
	LOCKTAG		tag;

	/*
	 * The counter's commit lock, as its commits take it: a set_counter,
	 * which takes it exclusively to its end, then committed before this
	 * write (and counted) or comes after it (and absorbs it).  Held to the
	 * end of the transaction.
	 */
	SET_LOCKTAG_OBJECT(tag, MyDatabaseId, lo->install, (uint32) lo->counter_id, 0);
	if (LockAcquire(&tag, ShareLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	if (CounterSetCount(lo->counter_id) != lo->sets)
	{
		/* the set's total took it in: writing it would count it twice */
		ereport(LOG,
				(errmsg("sharded_seq: %llu committed increments of counter \"%s\" left in this backend are dropped: a set_counter absorbed them",
						(unsigned long long) lo->amount, lo->name)));
		return true;
	}
	/* see this transaction's own updates of the same rows */
	CommandCounterIncrement();
	switch (CounterTryApply(lo->counter_id, lo->shard, (int64) lo->amount))
	{
		case APPLY_DONE:
			return true;
		case APPLY_BUSY:
			return false;
		case APPLY_GONE:
			LogNotCounted(lo, "the counter was dropped");
			return true;
		case APPLY_FULL:
			LogNotCounted(lo, "its total is at the bigint limit");
			return true;
	}
	return true;
}

/*
 * At a counter commit (PRE_COMMIT, after the commit's own counters): write
 * the leftovers whose rows are free.  The rest wait for a later commit.
 */
void
MemcachedApplyLeftovers(void)
{
	Oid			install;

	/* a serializable commit could fail on them: a later commit writes them */
	if (Leftovers == NULL || IsolationIsSerializable())
		return;
	/* the extension dropped in this very transaction: leave them be */
	install = CurrentInstallation();
	if (!OidIsValid(install))
		return;
	ForgetOtherInstallations(install);
	for (Amount *lo = Leftovers; lo; lo = lo->next)
		if (!lo->taken && WriteLeftover(lo))
			lo->taken = true;
}

/*
 * A backend that exits with leftovers writes them to the rows in a
 * transaction of its own, as PostgreSQL does when it removes temporary tables
 * at exit.  Never to memcached: the counter may have left buffered mode, and
 * an answer that times out would leave it unknown whether it counted.  It
 * waits at most a second for rows that other transactions hold: interrupts
 * are held off at exit, so a lock wait could not be cancelled.
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
		ForgetOtherInstallations(CurrentInstallation());
		for (int attempt = 0; attempt < 20; attempt++)
		{
			bool		busy = false;

			for (Amount *lo = Leftovers; lo; lo = lo->next)
				if (!lo->taken)
				{
					if (WriteLeftover(lo))
						lo->taken = true;
					else
						busy = true;
				}
			if (!busy)
				break;
			pg_usleep(50000L);
		}
		CommitTransactionCommand();
		for (Amount *lo = Leftovers; lo; lo = lo->next)
			if (!lo->taken)
				LogNotCounted(lo, "at exit, other transactions held the counter's rows");
		Leftovers = NULL;
	}
	PG_CATCH();
	{
		EmitErrorReport();
		FlushErrorState();
		AbortOutOfAnyTransaction();
		for (Amount *lo = Leftovers; lo; lo = lo->next)
			LogNotCounted(lo, "at exit, the database could not take them");
		Leftovers = NULL;
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
 * back.  Without wait, neither the flush lock nor a row is waited for: a
 * counter whose rows are all held gets its amount back at once.  Returns the
 * amount moved, or -1 if nothing could safely be moved.
 */
int64
MemcachedFlush(int32 counter_id, int32 shard, const char *name, bool wait)
{
	LOCKTAG		tag;
	char	   *key = pstrdup(PendingKeyName(counter_id));
	int64		amount;
	uint64		left;
	McResult	r;
	Amount	   *gb;
	CounterApplyResult applied;
	TimestampTz read_at;
	bool		all;

	EnsureExitCallback();
	/* nothing to move: take no lock (flush_counters may visit every counter) */
	read_at = GetCurrentTimestamp();
	r = McGet(key, &amount);
	if (r == MC_MISSING || (r == MC_OK && amount <= 0))
	{
		StatsMcCleaned(counter_id, read_at);
		return 0;
	}
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, SHARDED_SEQ_FLUSH_CLASS, (uint32) counter_id, 2);
	if (LockAcquire(&tag, ExclusiveLock, false, !wait) == LOCKACQUIRE_NOT_AVAIL)
		return -1;
	read_at = GetCurrentTimestamp();
	r = McGet(key, &amount);
	if (r == MC_MISSING || (r == MC_OK && amount <= 0))
	{
		StatsMcCleaned(counter_id, read_at);
		return 0;
	}
	if (r != MC_OK)
	{
		StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
		return -1;
	}
	/* at most what one decrement can take; the rest waits for the next flush */
	all = amount <= (int64) MC_MAX_DELTA;
	amount = Min(amount, (int64) MC_MAX_DELTA);

	/*
	 * The give-back is made first: nothing may fail between decr and
	 * recording it.  Should it be left over, it carries the sets in force
	 * now: a set needs this flush lock to finish, so none commits before the
	 * give-back is made.
	 */
	gb = NewAmount(counter_id, shard, name, (uint64) amount, CounterSetCount(counter_id));
	gb->subid = GetCurrentSubTransactionId();
	gb->clean_at = all ? read_at : 0;
	/* given back, it is as old as the key's amounts were */
	gb->since = StatsMcOldest(counter_id);
	/* taken out first: a read may then miss it for a moment, never count it twice */
	if (McDecr(key, (uint64) amount, &left) != MC_OK)
	{
		/* if it was applied after all (a timeout), that amount is lost */
		pfree(gb);
		StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
		return -1;
	}
	gb->next = GiveBacks;
	GiveBacks = gb;
	/* see rows this command already changed (a flush of both kinds, say) */
	CommandCounterIncrement();
	if (wait)
		applied = CounterApply(counter_id, shard, amount, name, NULL, 0) ? APPLY_DONE : APPLY_GONE;
	else
	{
		applied = CounterTryApply(counter_id, shard, amount);
		/* rows replaced under it (a fold) look gone to one try: look again */
		if (applied == APPLY_GONE)
			applied = CounterApply(counter_id, shard, amount, name, NULL, 0) ? APPLY_DONE : APPLY_GONE;
	}
	/* every row held: give the amount back now, whatever the caller does next */
	if (applied == APPLY_BUSY)
	{
		GiveBacks = gb->next;
		GiveBackNow(gb);
		return -1;
	}
	if (applied == APPLY_FULL)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("counter \"%s\" would overflow bigint", name),
				 errhint("Its amount was given back to memcached.  Bring its total down with a negative increment.")));
	if (applied == APPLY_GONE)
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
	/* after this backend's own quiet increments, on their connection */
	r = McGetAfterOwn(PendingKeyName(counter_id), amount);
	if (r == MC_MISSING)
		*amount = 0;
	if (r == MC_OK || r == MC_MISSING)
		return true;
	*amount = 0;
	StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
	return false;
}

/*
 * Does a commit here hand its 'memcached' amounts to shared memory, for the
 * worker to forward many commits at a time?  Only while that worker runs
 * and uses the memcached servers this session does.
 */
bool
MemcachedStagingHere(void)
{
	return MemcachedBatchDelay > 0 && McEnabled() && !McRecentlyDown() &&
		RegistryForwardsHere();
}

/*
 * The worker's: move a counter's shared-memory amount into memcached.  The
 * caller holds the counter's lock and saw it in mode 'memcached'.  Nothing
 * may fail between taking the amount and settling it; an amount no server
 * took goes back to the slot, for the rows.  Returns the amount forwarded.
 */
int64
MemcachedForward(Oid install, int32 counter_id)
{
	Amount	   *a = NewAmount(counter_id, 0, "", 0, 0);
	void	   *slot;
	TimestampTz since;
	int64		amount = SlotForwardTake(install, counter_id, &slot, &since);
	McResult	r;

	if (amount == 0)
	{
		pfree(a);
		return 0;
	}
	a->amount = Min((uint64) amount, MC_MAX_DELTA);
	a->since = since;
	r = DeliverAnswered(a);
	if (r == MC_DOWN)
	{
		SlotForwardEnd(slot, amount, since);
		pfree(a);
		return 0;
	}
	SlotForwardEnd(slot, amount - (int64) a->amount, since);
	/* more than one request can carry: the rest goes at the next forward */
	if (amount > (int64) a->amount)
		RegistryForwardNews();
	amount = (int64) a->amount;
	pfree(a);
	/* as after a commit: an unknown outcome is not sent twice */
	if (r != MC_OK)
	{
		StatsCount(KIND_COUNTER, counter_id, STAT_ERRORS, 1);
		return 0;
	}
	return amount;
}
