/*
 * engine.c
 *	  The counter engine: counter_incr, counter_value, and what a transaction
 *	  owes its counters until it commits.
 *
 * A counter is a set of shard rows; its total is their sum.  counter_incr
 * adds to this transaction's pending amount for the counter, kept in backend
 * memory per subtransaction, so a rolled-back savepoint takes its share back.
 * Just before commit each counter's net amount is applied once: to one shard
 * row (apply.c), or, for a write-behind counter, to its shared
 * memory slot (slots.c) or memcached (memcached.c) once the
 * commit is final.  Counters are taken in id order, so shard
 * rows are locked only for the moment of commit, a million increments in one
 * transaction cost one row update, and commits cannot deadlock on them.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "counter/counter_internal.h"

/* settings (defined in module.c) */
int			DefaultCounterShards = 0;

typedef struct CounterEntry
{
	CacheEntry	cache;			/* name, first: the hash key */
	uint64		loaded_epoch;
	TransactionId own_xid;		/* loaded from our own uncommitted insert, or 0 */
	bool		exists;
	int32		id;
	int32		shards;			/* pinned layout, or 0: adaptive */
	int32		shard;			/* this session's preferred shard */
	CounterMode mode;
	int64		claim_interval; /* last flush interval this backend tried to claim */
	bool		sets_known;		/* sets read under this configuration */
	int64		sets;			/* CounterSetCount: a set announces itself */
	CounterPlace place;			/* where the shard rows were last seen */
	Oid			owner;
	Acl		   *acl;			/* in CacheEntryContext, or NULL */
	Oid			select_user;	/* user whose SELECT was checked, or 0 */
	Oid			update_user;	/* user whose UPDATE was checked, or 0 */
	uint64		checked_epoch;	/* PrivilegeEpoch of those checks */
} CounterEntry;

static void
EvictCounter(CacheEntry *e)
{
	CounterEntry *entry = (CounterEntry *) e;

	if (entry->acl)
		pfree(entry->acl);
	entry->acl = NULL;
	ForgetRows(&entry->place);
}

static ObjectCache CounterCache = {
	"sharded_seq counters", KIND_COUNTER, sizeof(CounterEntry), EvictCounter
};
static uint32 CounterSalt = 0;

/*
 * One subtransaction's share of a pending amount.  int128, so that merging
 * a committed savepoint into its parent cannot overflow; the net amount must
 * fit a bigint only when it is applied.
 */
typedef struct PendingFrame
{
	SubTransactionId subid;
	int128		delta;
	struct PendingFrame *outer;
} PendingFrame;

/*
 * A counter of one installation: ids start again at 1 after DROP and CREATE
 * EXTENSION, which one transaction may do between two increments.
 */
typedef struct PendingKey
{
	Oid			install;		/* counter_config's OID */
	int32		counter_id;
} PendingKey;

/*
 * This transaction's pending amount for one counter, with what its commit
 * needs: the cache entry may be evicted before then.
 */
typedef struct PendingCounter
{
	PendingKey	key;			/* hash key */
	PendingFrame *frames;		/* innermost first */
	ShardRef   *known;			/* where the shard rows were last seen */
	int			nknown;
	int32		shard;			/* preferred shard */
	CounterMode mode;
	char		name[NAMEDATALEN];
} PendingCounter;

/*
 * Made once per backend and emptied at the end of each transaction (its
 * frames live in TopTransactionContext): making a hash table per transaction
 * cost more than an increment.  NULL until first use.  dynahash keeps a
 * removed entry's memory for the next one and never gives it back, so a
 * transaction that touched more than PENDING_KEEP counters destroys the
 * table (with its own memory context) instead: E5 holds after any
 * transaction, and the next one makes a small table again.
 */
static HTAB *Pending = NULL;

#define PENDING_KEEP 1024

static bool
PendingEmpty(void)
{
	return Pending == NULL || hash_get_num_entries(Pending) == 0;
}

/*
 * At the end of a transaction: forget its increments.  No allocation here,
 * nor errors.  Entries are removed only here, so the count is the most this
 * transaction held.
 */
static void
ClearPending(void)
{
	HASH_SEQ_STATUS status;
	PendingCounter *pc;

	if (PendingEmpty())
		return;
	if (hash_get_num_entries(Pending) > PENDING_KEEP)
	{
		hash_destroy(Pending);
		Pending = NULL;
		return;
	}
	hash_seq_init(&status, Pending);
	while ((pc = hash_seq_search(&status)) != NULL)
		(void) hash_search(Pending, &pc->key, HASH_REMOVE, NULL);
}

/* Counters this transaction dropped, by the subtransaction that did it. */
typedef struct DroppedCounter
{
	int32		counter_id;
	SubTransactionId subid;
	struct DroppedCounter *next;
} DroppedCounter;

static DroppedCounter *Dropped = NULL;	/* in TopTransactionContext */

/* set_counter ran in this transaction (a rolled-back savepoint included) */
static bool SetInXact = false;

/* The counters it set, rolled-back savepoints included (TopTransactionContext). */
typedef struct SetCounter
{
	int32		counter_id;
	struct SetCounter *next;
} SetCounter;

static SetCounter *SetCounters = NULL;

static bool CounterSetHere(int32 counter_id);

static int128
FramesSum(PendingCounter *pc)
{
	int128		sum = 0;

	for (PendingFrame *f = pc->frames; f; f = f->outer)
		sum += f->delta;
	return sum;
}

/* This transaction's uncommitted increments of a counter. */
static int128
PendingAmount(int32 counter_id)
{
	PendingKey	key;
	PendingCounter *pc;

	if (PendingEmpty())
		return 0;
	memset(&key, 0, sizeof(key));
	key.install = ConfigRelid("counter_config");
	key.counter_id = counter_id;
	pc = hash_search(Pending, &key, HASH_FIND, NULL);
	return pc ? FramesSum(pc) : 0;
}

static void
AddPending(CounterEntry *entry, int64 delta, ShardRef *refs, int nrefs)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	PendingKey	key;
	PendingCounter *pc;
	bool		found;

	if (Pending == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(PendingKey);
		ctl.entrysize = sizeof(PendingCounter);
		ctl.hcxt = TopMemoryContext;	/* dynahash makes its own context below */
		Pending = hash_create("sharded_seq pending increments", 16, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	memset(&key, 0, sizeof(key));
	key.install = ConfigRelid("counter_config");
	key.counter_id = entry->id;
	pc = hash_search(Pending, &key, HASH_ENTER, &found);
	if (!found)
	{
		pc->frames = NULL;
		pc->known = NULL;
		pc->nknown = 0;
		strlcpy(pc->name, entry->cache.name, NAMEDATALEN);
	}
	pc->shard = entry->shard;
	pc->mode = entry->mode;
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
	pc->frames->delta += delta;
}

static bool
DroppedInXact(int32 counter_id)
{
	for (DroppedCounter *d = Dropped; d; d = d->next)
		if (d->counter_id == counter_id)
			return true;
	return false;
}

/* set_counter: what this transaction added before the call (it is absorbed). */
int128
CounterPendingInXact(int32 counter_id)
{
	return PendingAmount(counter_id);
}

/*
 * set_counter ran: this transaction cannot be prepared, and its own amounts
 * of the counter go to the rows at its commit (ApplyPending).
 */
void
CounterSetInXact(int32 counter_id)
{
	SetCounter *sc;

	SetInXact = true;
	if (CounterSetHere(counter_id))
		return;
	sc = MemoryContextAlloc(TopTransactionContext, sizeof(SetCounter));
	sc->counter_id = counter_id;
	sc->next = SetCounters;
	SetCounters = sc;
}

/*
 * The highest id above counter_id this transaction set, or 0.  Commits take
 * counters in ascending id: a set below one already set here can close a
 * cycle with a commit of both (README.md, "Setting a counter").
 */
int32
CounterSetAbove(int32 counter_id)
{
	int32		above = 0;

	for (SetCounter *sc = SetCounters; sc; sc = sc->next)
		if (sc->counter_id > counter_id && sc->counter_id > above)
			above = sc->counter_id;
	return above;
}

static bool
CounterSetHere(int32 counter_id)
{
	for (SetCounter *sc = SetCounters; sc; sc = sc->next)
		if (sc->counter_id == counter_id)
			return true;
	return false;
}

/* drop_counter: this transaction's increments of it go nowhere, if it commits. */
void
CounterDroppedInXact(int32 counter_id)
{
	DroppedCounter *d = MemoryContextAlloc(TopTransactionContext, sizeof(DroppedCounter));

	d->counter_id = counter_id;
	d->subid = GetCurrentSubTransactionId();
	d->next = Dropped;
	Dropped = d;
}

/* ---- configuration ---- */

/* Load a counter's configuration with the latest snapshot. */
static void
LoadCounterConfig(CounterEntry *entry)
{
	CounterConfigRow row;
	uint64		epoch;

	/* the epoch from before the snapshot: a later change shows as a new epoch */
	AcceptInvalidationMessages();
	epoch = ConfigEpoch;
	entry->loaded_epoch = epoch;
	entry->select_user = entry->update_user = InvalidOid;
	if (entry->acl)
		pfree(entry->acl);
	entry->acl = NULL;
	entry->sets_known = false;
	entry->exists = FetchCounterConfig(entry->cache.name, 0, &row);
	RegistryNoteUse();			/* the extension is used here: the worker serves it */
	entry->own_xid = InvalidTransactionId;
	if (entry->exists)
	{
		/* a creation nobody else knows of: it may yet be rolled back */
		if (TransactionIdIsCurrentTransactionId(row.xmin))
			entry->own_xid = row.xmin;
		entry->id = row.id;
		entry->shards = row.shards;
		entry->owner = row.owner;
		/* the row's copy is in the caller's memory: the entry keeps its own */
		entry->acl = CopyAcl(PointerGetDatum(row.acl), row.acl == NULL, CacheEntryContext());
		if (row.acl)
			pfree(row.acl);
		entry->mode = row.mode;
		entry->place.counter_id = entry->id;
		entry->place.shards = entry->shards;
		entry->place.config_xmin = row.xmin;
		/* the latest snapshot sees it: committed, unless it is ours */
		entry->place.config_committed = !TransactionIdIsValid(entry->own_xid);
		ForgetRows(&entry->place);
		entry->shard = (int32) ((CounterSalt + (uint32) entry->id) %
								(uint32) (entry->shards > 0 ? entry->shards : MaxCounterShards));
	}
}

/*
 * Reload an entry whose configuration may have changed.  Only a single node
 * creates a counter it does not know: on several primaries two nodes could
 * create one name at once, and replication would stop on the name's key.
 */
static void
RefreshCounter(CounterEntry *entry, bool create_missing)
{
	OwnerContext ctx;

	LoadCounterConfig(entry);
	if (!entry->exists && ClusterPull(KIND_COUNTER, entry->cache.name))
		LoadCounterConfig(entry);
	if (entry->exists || !create_missing || SessionNodeId() > 0 || CitusGroup() >= 0)
		return;
	PreventCommandIfReadOnly("counter_incr()");
	BeginAsOwner(&ctx);
	InsertCounter(entry->cache.name, DefaultCounterShards, "exact", ctx.caller, true);
	EndAsOwner(&ctx);
	CommandCounterIncrement();
	LoadCounterConfig(entry);
}

static CounterEntry *
LookupCounter(FunctionCallInfo fcinfo, bool create_missing)
{
	bool		is_new;
	CounterEntry *entry = (CounterEntry *) CallSiteEntry(fcinfo, &CounterCache, &is_new);

	if (CounterSalt == 0)
		CounterSalt = murmurhash32((uint32) MyProcPid ^ (uint32) MyStartTime) | 1;
	AcceptInvalidationMessages();

	/*
	 * Creating a counter announces nothing (nobody caches a name that does
	 * not exist), so a creation of ours that was rolled back shows here: load
	 * it again.  Not by asking the commit log, which may have dropped that
	 * xid by the time the session comes back to the counter.
	 */
	if (TransactionIdIsValid(entry->own_xid) &&
		!TransactionIdIsCurrentTransactionId(entry->own_xid))
	{
		entry->loaded_epoch = 0;
		entry->own_xid = InvalidTransactionId;
	}
	if (entry->loaded_epoch != ConfigEpoch || !entry->exists)
		RefreshCounter(entry, create_missing);
	if (!entry->exists)
	{
		char		name[NAMEDATALEN];

		strlcpy(name, entry->cache.name, sizeof(name));
		if (is_new)
			ForgetEntry(&CounterCache, &entry->cache);
		if (create_missing && CitusGroup() >= 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("counter \"%s\" does not exist", name),
					 errdetail("In a Citus cluster, counter_incr does not create counters: one made on a single node would be unknown to the others."),
					 errhint("Create it on the coordinator with sharded_seq.create_counter('%s'): it reaches every node.",
							 name)));
		if (create_missing && SessionNodeId() > 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("counter \"%s\" does not exist", name),
					 errdetail("With sharded_seq.node_id set (%d here), counter_incr does not create counters: two nodes creating one name at once would stop replication on counter_config's unique name.",
							   SessionNodeId()),
					 errhint("Create it once, on one node, with sharded_seq.create_counter('%s'); replication brings it to the others.",
							 name)));
		ReportNotFound(KIND_COUNTER, name);
	}
	return entry;
}

static void
CheckCounterPrivilege(CounterEntry *entry, AclMode mode)
{
	Oid			user = GetUserId();
	Oid		   *checked = (mode == ACL_SELECT) ? &entry->select_user : &entry->update_user;

	if (entry->checked_epoch != PrivilegeEpoch)
	{
		entry->select_user = entry->update_user = InvalidOid;
		entry->checked_epoch = PrivilegeEpoch;
	}
	if (*checked == user)
		return;
	CheckPrivilege(KIND_COUNTER, entry->cache.name, entry->owner, entry->acl, mode);
	*checked = user;
}

/* ---- commit ---- */

/* One counter's net amount at commit. */
typedef struct CommitItem
{
	int32		counter_id;
	int128		amount;
	PendingCounter *pending;
} CommitItem;

static int
CompareItems(const void *a, const void *b)
{
	int32		x = ((const CommitItem *) a)->counter_id;
	int32		y = ((const CommitItem *) b)->counter_id;

	return (x > y) - (x < y);
}

/*
 * Add an amount to the counter's shard rows in this transaction.  A counter
 * this transaction dropped takes nothing; one dropped by another session
 * fails the commit.
 */
static void
ApplyToRows(CommitItem *item, int64 amount)
{
	PendingCounter *pc = item->pending;

	if (CounterApply(item->counter_id, pc->shard, amount, pc->name,
					 pc->known, pc->nknown))
		return;
	if (DroppedInXact(item->counter_id))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("counter \"%s\" was dropped before this transaction committed", pc->name),
			 errhint("The transaction was rolled back.  Recreate the counter, or retry without it.")));
}

/*
 * The counter's entry as of the invalidations received by now, or NULL if
 * it was dropped (the commit then fails in ApplyToRows).  Neither a slot nor
 * memcached checks the counter again, so this is where a drop or a mode
 * change that committed before ours is seen.
 */
static CounterEntry *
CurrentEntry(CommitItem *item)
{
	PendingCounter *pc = item->pending;
	CounterEntry *entry;
	bool		is_new;

	AcceptInvalidationMessages();
	entry = (CounterEntry *) CacheLookup(&CounterCache, pc->name, &is_new);
	if (is_new || entry->loaded_epoch != ConfigEpoch)
		RefreshCounter(entry, false);
	if (!entry->exists || entry->id != item->counter_id)
		return NULL;
	return entry;
}

/*
 * Send a memcached counter's amount to memcached after commit, if memcached
 * is usable and the counter is still in that mode.  Returns false if the
 * amount must go to the shard rows instead.
 */
static bool
TryBuffer(CommitItem *item, int64 amount, bool preparing)
{
	PendingCounter *pc = item->pending;
	CounterEntry *entry;

	if (preparing || amount <= 0 || (uint64) amount > MC_MAX_DELTA ||
		!McEnabled() || McRecentlyDown())
		return false;
	if (pc->mode != MODE_MEMCACHED || DroppedInXact(item->counter_id))
		return false;

	/*
	 * Held until this transaction has finished with memcached, after commit:
	 * alter_counter and drop_counter take it exclusively, so an amount never
	 * lands in memcached after its counter left mode 'memcached'.
	 */
	LockDatabaseObject(ConfigRelid("counter_config"), item->counter_id, 0, ShareLock);
	entry = CurrentEntry(item);
	if (entry == NULL || entry->mode != MODE_MEMCACHED)
		return false;

	/*
	 * The sets in force at this commit, for the amount to carry should it be
	 * left over: a set waits for this lock, and announces itself, so the
	 * count cached with the configuration is current.  Read once per load.
	 */
	if (!entry->sets_known)
	{
		entry->sets = CounterSetCount(item->counter_id);
		entry->sets_known = true;
	}
	MemcachedAfterCommit(item->counter_id, amount, pc->shard, pc->name,
					  entry->sets, &entry->claim_interval);
	/* decided for memcached: a test stops memcached here (t/set_counter.pl) */
	WAIT_POINT("counter-memcached-decided");
	return true;
}

/*
 * Apply every counter's net amount, in counter id order, once.  Then the
 * amounts that earlier commits could not hand to memcached, if the rows can
 * take them without waiting.
 */
static void
ApplyPending(bool preparing)
{
	HASH_SEQ_STATUS status;
	PendingCounter *pc;
	CommitItem *items;
	long		n = 0;
	Oid			install;

	if (preparing && SetInXact)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that called sharded_seq.set_counter()"),
				 errdetail("Until it commits, set_counter keeps the counter's write-behind commits out of shared memory and memcached, which a prepared transaction could keep from the worker indefinitely."),
				 errhint("Call sharded_seq.set_counter() in a transaction that commits directly.")));
	if (preparing && (MemcachedFlushedInXact() || SlotsTakenInXact()))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that has flushed buffered counters"),
				 errdetail("The amounts it took from memcached or shared memory could not be given back by ROLLBACK PREPARED."),
				 errhint("Call sharded_seq.flush_counters() in a transaction of its own.")));
	if (PendingEmpty())
		return;					/* leftovers ride only with counter work */

	/*
	 * Increments of an installation this transaction dropped (and perhaps
	 * created again, with ids starting at 1) go nowhere.
	 */
	install = CurrentInstallation();
	items = palloc0(hash_get_num_entries(Pending) * sizeof(CommitItem));
	hash_seq_init(&status, Pending);
	while ((pc = hash_seq_search(&status)) != NULL)
	{
		CommitItem *item;

		if (pc->key.install != install)
			continue;
		item = &items[n++];

		item->counter_id = pc->key.counter_id;
		item->amount = FramesSum(pc);
		item->pending = pc;
	}
	qsort(items, n, sizeof(CommitItem), CompareItems);

	for (long i = 0; i < n; i++)
	{
		CommitItem *item = &items[i];
		int64		amount;

		if (item->amount == 0)
			continue;
		if (item->amount > PG_INT64_MAX || item->amount < PG_INT64_MIN)
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("counter \"%s\" would overflow bigint", item->pending->name),
					 errdetail("This transaction's increments add up to more than a bigint."),
					 errhint("The transaction was rolled back.  Commit in smaller transactions.")));
		amount = (int64) item->amount;

		/*
		 * A counter this transaction set: its rows are locked by the set, and
		 * its amount must count on top of it.  Left over in memcached's
		 * place, it would carry the set count from before the set, which
		 * this commit moves: it would be dropped as absorbed.  (A set undone
		 * by a savepoint: the rows are right all the same.)
		 */
		if (CounterSetHere(item->counter_id))
		{
			ApplyToRows(item, amount);
			continue;
		}
		/*
		 * A prepared commit may finish in another backend: it goes to the
		 * rows.  Without batching, TryBuffer looks the counter up itself,
		 * under its lock.
		 */
		if ((item->pending->mode == MODE_BUFFERED ||
			 (item->pending->mode == MODE_MEMCACHED && MemcachedStagingHere())) &&
			!preparing && amount > 0 && !DroppedInXact(item->counter_id))
		{
			CounterEntry *entry = CurrentEntry(item);

			if (entry != NULL && entry->mode == MODE_BUFFERED &&
				SlotReserve(item->counter_id, amount, false))
				continue;
			/* the worker forwards it to memcached, many commits in one request */
			if (entry != NULL && entry->mode == MODE_MEMCACHED && (uint64) amount <= MC_MAX_DELTA &&
				MemcachedStagingHere() && SlotReserve(item->counter_id, amount, true))
				continue;
		}
		if (!TryBuffer(item, amount, preparing))
			ApplyToRows(item, amount);
	}
	if (!preparing)
		MemcachedApplyLeftovers();
	ClearPending();
}

static void
CounterXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			ApplyPending(false);
			break;
		case XACT_EVENT_PRE_PREPARE:
			ApplyPending(true);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			ClearPending();		/* its frames go with TopTransactionContext */
			SetInXact = false;
			SetCounters = NULL;
			Dropped = NULL;
			LayoutXactEnd();
			SlotsXactCommit();
			MemcachedXactCommit();
			break;
		case XACT_EVENT_PREPARE:
			ClearPending();
			SetInXact = false;
			SetCounters = NULL;
			Dropped = NULL;
			LayoutXactEnd();
			SlotsXactCommit();	/* nothing was reserved or taken */
			MemcachedXactCommit();	/* nothing was buffered: only leftovers are kept */
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			ClearPending();
			SetInXact = false;
			SetCounters = NULL;
			Dropped = NULL;
			LayoutXactEnd();
			SlotsXactAbort();
			MemcachedXactAbort();
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
	DroppedCounter **link;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	MemcachedSubXact(event == SUBXACT_EVENT_ABORT_SUB, mySubid, parentSubid);
	SlotsSubXact(event == SUBXACT_EVENT_ABORT_SUB, mySubid, parentSubid);

	link = &Dropped;
	while (*link)
	{
		DroppedCounter *d = *link;

		if (d->subid == mySubid && event == SUBXACT_EVENT_ABORT_SUB)
		{
			*link = d->next;	/* the drop is undone */
			continue;
		}
		if (d->subid == mySubid)
			d->subid = parentSubid;
		link = &d->next;
	}

	if (PendingEmpty())
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

/*
 * Stored total, plus what is committed but not yet in the rows, plus this
 * transaction's pending amount, plus delta; with refs, also where the shard
 * rows are.  Each place is read before the place amounts come from (rows,
 * memcached, shared memory): an amount moved meanwhile is then missed for a
 * moment, never counted twice.
 */
static int64
VisibleTotal(CounterEntry *entry, int64 delta, bool read_memcached,
			 ShardRef **refs, int *nrefs)
{
	int128		total = CounterSum(entry->id, &entry->place, refs, nrefs) + PendingAmount(entry->id) + delta;
	int64		waiting;

	/*
	 * counter_value reads memcached; counter_incr does not, which spares it a
	 * round trip: its result leaves out other sessions' unflushed amounts.
	 * Unreadable counts as none.  Memcached before the slot: the worker
	 * forwards a slot's amount to memcached, so the other order could count
	 * it twice.
	 */
	if (entry->mode == MODE_MEMCACHED && read_memcached && MemcachedPending(entry->id, &waiting))
		total += waiting;

	/* any mode: a slot outlives a switch away from 'buffered' until flushed */
	total += SlotPending(entry->id);
	/* committed here, but neither in memcached nor in the rows yet */
	total += MemcachedLeftover(entry->id);

	if (total > PG_INT64_MAX || total < PG_INT64_MIN)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("counter \"%s\" would overflow bigint", entry->cache.name),
				 errdetail("Its total would not fit in a bigint."),
				 errhint("Nothing was changed.  Keep totals within bigint, or add an amount of the opposite sign.")));
	return (int64) total;
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
	/* more than one server: may this commit write this node's rows? */
	TopologyBeforeIncrement();
	total = VisibleTotal(entry, delta, false, &refs, &nrefs);
	AddPending(entry, delta, refs, nrefs);
	PG_RETURN_INT64(total);
}

/*
 * A counter's total.  In a Citus cluster, this node's part (with this
 * transaction's increments) plus every other node's committed part, each
 * read there now (counter_node_value).
 */
PG_FUNCTION_INFO_V1(counter_value);
Datum
counter_value(PG_FUNCTION_ARGS)
{
	CounterEntry *entry = LookupCounter(fcinfo, false);
	int128		total;

	CheckCounterPrivilege(entry, ACL_SELECT);
	total = VisibleTotal(entry, 0, true, NULL, NULL);
	total += ClusterSumElsewhere("SELECT sharded_seq.counter_node_value($1)", entry->cache.name);
	if (total > PG_INT64_MAX || total < PG_INT64_MIN)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("counter \"%s\" is out of bigint's range over the cluster", entry->cache.name),
				 errdetail("Every node's part fits, but their sum does not."),
				 errhint("Keep totals within bigint, or add an amount of the opposite sign.")));
	PG_RETURN_INT64((int64) total);
}

/* This node's part of a counter's total (counter_value, without the other nodes). */
PG_FUNCTION_INFO_V1(counter_node_value);
Datum
counter_node_value(PG_FUNCTION_ARGS)
{
	CounterEntry *entry = LookupCounter(fcinfo, false);

	CheckCounterPrivilege(entry, ACL_SELECT);
	PG_RETURN_INT64(VisibleTotal(entry, 0, true, NULL, NULL));
}
