/*
 * slots.c
 *	  The slot table: a bounded table in shared memory, one slot per counter,
 *	  holding committed increments that are not yet in the shard rows.  Mode
 *	  'buffered' keeps its amounts here until the worker flushes them
 *	  (buffered.c); mode 'memcached' stages amounts here for the worker to
 *	  forward to memcached in batches (memcached.c).  The table writes no
 *	  row and calls no worker: whether the worker still takes amounts is read
 *	  from the registry (common/registry.c).
 *
 * A committing transaction finds (or claims) its counter's slot and pins it
 * at PRE_COMMIT, and adds its amount with one atomic add once the commit is
 * final, so an abort never counts.  A flush takes the whole amount with an
 * atomic exchange (SlotTake) and its caller writes it to the rows in its
 * transaction; if that
 * transaction or savepoint rolls back, the amount is added back.  A read
 * adds the slot's amount to the rows it read with an older snapshot: an
 * amount moved meanwhile is missed for a moment, never counted twice.
 *
 * Lookups take no lock.  Claiming and freeing slots take the table's LWLock;
 * a pin (a count in the slot) keeps the worker from freeing a slot that a
 * commit is about to add to.  Shared memory exists only when the library is
 * in shared_preload_libraries; without it a buffered counter behaves as an
 * exact one.
 *
 * The worker's last flush loses nothing (a clean shutdown): a backend pins
 * first and then asks whether the worker still takes amounts; the worker
 * stops taking them and then waits until no slot of its database is pinned.
 * Both sides order their write before their read with a full barrier (the
 * pin's atomic add; the worker's pg_memory_barrier), so either the worker
 * sees the pin and waits for its transaction to end, or the backend sees
 * the worker stopping and writes the rows itself (a commit) or leaves the
 * amount for the worker (a flush).  Pins live only from PRE_COMMIT to the
 * end of the transaction (every end, FATAL included, lets them go), or
 * inside the worker's own calls.
 *
 * set_counter freezes a counter's slot until its transaction ends
 * (SlotFreeze): commits then go to the rows, flushes and forwards leave the
 * slot alone, and the set takes what committed before.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "counter/counter_internal.h"

#define SLOT_FREE	0			/* never used since the last free run: ends probes */
#define SLOT_USED	1
#define SLOT_DEAD	2			/* freed: probes go on past it */

typedef struct BufferSlot
{
	pg_atomic_uint32 state;
	pg_atomic_uint32 pins;		/* commits about to add, flushes holding an amount */
	pg_atomic_uint64 pending;	/* committed, not yet in the rows */
	Oid			dbid;
	Oid			install;		/* counter_config's OID */
	int32		counter_id;
	int32		idle_rounds;	/* worker's: flushes that found it empty */
	pg_atomic_uint32 forward;	/* a 'memcached' commit added: the worker
								 * forwards the amount to memcached */
	pg_atomic_uint32 frozen;	/* pid of a set_counter in progress, or 0:
								 * commits go to the rows meanwhile */
	pg_atomic_uint64 since;		/* pending holds nothing older (monitoring;
								 * meaningful while pending > 0) */
	char		pad[PG_CACHE_LINE_SIZE - 48];	/* one slot per cache line */
} BufferSlot;

StaticAssertDecl(sizeof(BufferSlot) == PG_CACHE_LINE_SIZE,
				 "a buffer slot fills one cache line");

typedef struct BufferShared
{
	LWLock	   *lock;			/* claims and frees */
	int			nslots;
	pg_atomic_uint64 refused;	/* commits that found the table full */
	int			used;			/* slots in use; under the lock */
	BufferSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} BufferShared;

int			BufferedSlots = 4096;
static BufferShared *Shared = NULL;

/* An amount this transaction took from a slot, given back if it rolls back. */
typedef struct Taken
{
	BufferSlot *slot;			/* pinned while listed */
	uint64		amount;
	TimestampTz since;			/* the slot's, when taken */
	SubTransactionId subid;
	struct Taken *next;
} Taken;

/* A commit's slot, pinned at PRE_COMMIT, added to at COMMIT. */
typedef struct ToAdd
{
	BufferSlot *slot;
	uint64		amount;
	bool		forward;		/* a 'memcached' amount: wake the forwarding */
	struct ToAdd *next;
} ToAdd;

/* A slot this transaction froze for set_counter, pinned until it ends. */
typedef struct Frozen
{
	BufferSlot *slot;
	struct Frozen *next;
} Frozen;

static Taken *TakenList = NULL; /* in ListContext */
static Frozen *FrozenList = NULL;	/* in ListContext */
static ToAdd *AddList = NULL;	/* in ListContext */

/*
 * The lists' nodes outlive a transaction's memory, so they have a context of
 * their own.  A node is freed when its transaction ends, but an allocator
 * keeps freed chunks: one transaction that listed many slots would leave its
 * memory behind.  Past LISTS_KEEP bytes, the end of a transaction (the lists
 * are empty then) resets the context.
 */
static MemoryContext ListContext = NULL;

#define LISTS_KEEP	(64 * 1024)

/* A list node, allocated before anything is pinned or taken. */
static void *
NewListNode(Size size)
{
	if (ListContext == NULL)
		ListContext = AllocSetContextCreate(TopMemoryContext, "sharded_seq slot lists",
											ALLOCSET_SMALL_SIZES);
	return MemoryContextAlloc(ListContext, size);
}

Size
SlotsShmemSize(void)
{
	return add_size(offsetof(BufferShared, slots),
					mul_size(BufferedSlots, sizeof(BufferSlot)));
}

void
SlotsShmemInit(void)
{
	bool		found;

	Shared = ShmemInitStruct("sharded_seq buffered counters", SlotsShmemSize(), &found);
	if (!found)
	{
		Shared->lock = &(GetNamedLWLockTranche("sharded_seq buffered"))->lock;
		Shared->nslots = BufferedSlots;
		Shared->used = 0;
		pg_atomic_init_u64(&Shared->refused, 0);
		for (int i = 0; i < BufferedSlots; i++)
		{
			BufferSlot *s = &Shared->slots[i];

			pg_atomic_init_u32(&s->state, SLOT_FREE);
			pg_atomic_init_u32(&s->pins, 0);
			pg_atomic_init_u64(&s->pending, 0);
			pg_atomic_init_u64(&s->since, 0);
			pg_atomic_init_u32(&s->forward, 0);
			pg_atomic_init_u32(&s->frozen, 0);
			s->dbid = InvalidOid;
			s->install = InvalidOid;
			s->counter_id = 0;
			s->idle_rounds = 0;
		}
	}
}

bool
SlotsAvailable(void)
{
	return Shared != NULL;
}

static bool
SlotIs(BufferSlot *s, Oid dbid, Oid install, int32 counter_id)
{
	if (pg_atomic_read_u32(&s->state) != SLOT_USED)
		return false;
	pg_read_barrier();			/* the key was written before the state */
	return s->counter_id == counter_id && s->install == install && s->dbid == dbid;
}

/* Is a slot in use by this database (read without the lock)? */
static bool
SlotHere(BufferSlot *s)
{
	if (pg_atomic_read_u32(&s->state) != SLOT_USED)
		return false;
	pg_read_barrier();			/* the key was written before the state */
	return s->dbid == MyDatabaseId;
}

/* The slot of a counter, or NULL; with no lock, so it may be freed at once. */
static BufferSlot *
FindSlot(Oid dbid, Oid install, int32 counter_id)
{
	int			n = Shared->nslots;
	uint32		start = CounterKeyHash(dbid, install, counter_id) % (uint32) n;

	for (int i = 0; i < n; i++)
	{
		BufferSlot *s = &Shared->slots[(start + i) % n];
		uint32		state = pg_atomic_read_u32(&s->state);

		if (state == SLOT_FREE)
			return NULL;
		if (state == SLOT_USED && SlotIs(s, dbid, install, counter_id))
			return s;
	}
	return NULL;
}

/*
 * The counter's slot, pinned; claimed if missing and claim is true.  NULL
 * if it has none (or the table is full).
 */
static BufferSlot *
PinSlot(Oid install, int32 counter_id, bool claim)
{
	for (;;)
	{
		BufferSlot *s = FindSlot(MyDatabaseId, install, counter_id);

		if (s != NULL)
		{
			pg_atomic_fetch_add_u32(&s->pins, 1);
			/* a free that ran meanwhile sees the pin, or we see its state */
			if (SlotIs(s, MyDatabaseId, install, counter_id))
				return s;
			pg_atomic_fetch_sub_u32(&s->pins, 1);
			continue;
		}
		if (!claim)
			return NULL;
		/* full: refuse without the lock, which every such commit would take */
		if (Shared->used >= Shared->nslots - Shared->nslots / 4)
		{
			pg_atomic_fetch_add_u64(&Shared->refused, 1);
			return NULL;
		}

		LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
		s = FindSlot(MyDatabaseId, install, counter_id);
		/* at most three quarters full: a lookup that misses stops soon */
		if (s == NULL && Shared->used < Shared->nslots - Shared->nslots / 4)
		{
			int			n = Shared->nslots;
			uint32		start = CounterKeyHash(MyDatabaseId, install, counter_id) % (uint32) n;

			for (int i = 0; i < n && s == NULL; i++)
			{
				BufferSlot *c = &Shared->slots[(start + i) % n];

				/*
				 * The first slot not in use, whatever stray pin it carries: a
				 * lookup stops at the first free one, so the key must not go
				 * past it.  A stray pinner re-checks the key and lets go.
				 */
				if (pg_atomic_read_u32(&c->state) != SLOT_USED)
					s = c;
			}
			if (s != NULL)
			{
				s->dbid = MyDatabaseId;
				s->install = install;
				s->counter_id = counter_id;
				s->idle_rounds = 0;
				pg_atomic_write_u64(&s->pending, 0);
				pg_atomic_write_u64(&s->since, 0);
				pg_atomic_write_u32(&s->forward, 0);
				pg_atomic_write_u32(&s->frozen, 0);
				pg_write_barrier();
				pg_atomic_write_u32(&s->state, SLOT_USED);
				Shared->used++;
			}
		}
		if (s != NULL)
			pg_atomic_fetch_add_u32(&s->pins, 1);	/* under the lock: no free between */
		LWLockRelease(Shared->lock);
		if (s == NULL)
			pg_atomic_fetch_add_u64(&Shared->refused, 1);
		return s;
	}
}

static void
Unpin(BufferSlot *s)
{
	pg_atomic_fetch_sub_u32(&s->pins, 1);
}

/*
 * Every amount enters a slot here: a commit's (since 0: now), or one given
 * back (since: when the slot had it before).  The first amount into an
 * empty slot stamps when; an older one given back moves the stamp down.
 */
static void
SlotAddPending(BufferSlot *s, uint64 amount, TimestampTz since)
{
	uint64		prev = pg_atomic_fetch_add_u64(&s->pending, amount);
	uint64		old;

	if (prev == 0)
	{
		pg_atomic_write_u64(&s->since, (uint64) (since != 0 ? since : GetCurrentTimestamp()));
		return;
	}
	if (since == 0)
		return;
	old = pg_atomic_read_u64(&s->since);
	while ((TimestampTz) old > since &&
		   !pg_atomic_compare_exchange_u64(&s->since, &old, (uint64) since))
		;
}

/*
 * At PRE_COMMIT: reserve the counter's slot for a positive amount to be added
 * once the commit is final.  False if the amount must go to the rows: no
 * shared memory, the table is full, or the slot could overflow.
 */
bool
SlotReserve(int32 counter_id, int64 amount, bool forward)
{
	BufferSlot *s;
	ToAdd	   *a;

	if (Shared == NULL || amount <= 0)
		return false;
	/* without a worker to flush it, an amount would wait here unseen */
	if (!RegistryAcceptingHere())
		return false;
	/* allocate first: nothing may fail once the slot is pinned */
	a = NewListNode(sizeof(ToAdd));
	/* t/shutdown_flush.pl holds a commit here: asked, not yet pinned */
	WAIT_POINT_HOLDING_INTERRUPTS("slot-reserve-unpinned");
	s = PinSlot(ConfigRelid("counter_config"), counter_id, true);
	if (s == NULL)
	{
		pfree(a);
		return false;
	}
	/*
	 * Again, after the pin (see the top of the file): a worker that stopped
	 * taking amounts before this look waits for the pin; one that stops
	 * after it has already made its last flush, so the rows take this one.
	 */
	if (!RegistryAcceptingHere())
	{
		Unpin(s);
		pfree(a);
		return false;
	}
	/*
	 * A set_counter is absorbing the slot: this commit goes to the rows,
	 * where it waits for the set's row locks and counts on top of it.  The
	 * pin above came first (a full barrier): a set that froze after it
	 * waits for this commit instead (SlotFreeze).
	 */
	if (pg_atomic_read_u32(&s->frozen) != 0)
	{
		Unpin(s);
		pfree(a);
		return false;
	}
	/* keep a slot's sum within bigint; a flush makes room again */
	if ((uint64) amount > (uint64) (PG_INT64_MAX / 2) ||
		pg_atomic_read_u64(&s->pending) > (uint64) (PG_INT64_MAX / 2) - (uint64) amount)
	{
		Unpin(s);
		pfree(a);
		return false;
	}
	/* read first: a hot slot's line is not written by every commit */
	if (forward && pg_atomic_read_u32(&s->forward) == 0)
		pg_atomic_write_u32(&s->forward, 1);
	a->slot = s;
	a->amount = (uint64) amount;
	a->forward = forward;
	a->next = AddList;
	AddList = a;
	/* t/shutdown_flush.pl holds a commit here: pinned, before its commit */
	WAIT_POINT_HOLDING_INTERRUPTS("slot-reserved");
	return true;
}

/*
 * Committed amounts not yet in the rows, and (*since) a time none of them is
 * older than (0 when nothing is pending): for monitoring.
 */
int64
SlotPendingSince(int32 counter_id, TimestampTz *since)
{
	BufferSlot *s;
	uint64		v;
	TimestampTz t;

	*since = 0;
	if (Shared == NULL)
		return 0;
	s = FindSlot(MyDatabaseId, ConfigRelid("counter_config"), counter_id);
	if (s == NULL)
		return 0;
	v = pg_atomic_read_u64(&s->pending);
	t = (TimestampTz) pg_atomic_read_u64(&s->since);
	if (!SlotIs(s, MyDatabaseId, ConfigRelid("counter_config"), counter_id) || v == 0)
		return 0;
	/* an amount between its add and its stamp: it is from now */
	*since = t != 0 ? t : GetCurrentTimestamp();
	return (int64) v;
}

/* Committed amounts not yet in the rows: 0 without a slot. */
int64
SlotPending(int32 counter_id)
{
	TimestampTz since;

	return SlotPendingSince(counter_id, &since);
}

/*
 * Take a counter's whole amount for a flush in this transaction; given back
 * if it rolls back.  Returns 0 if there is nothing.  Cannot fail once the
 * amount is taken.
 */
int64
SlotTake(Oid install, int32 counter_id)
{
	BufferSlot *s;
	Taken	   *t;
	uint64		amount;

	if (Shared == NULL)
		return 0;
	t = NewListNode(sizeof(Taken));
	s = PinSlot(install, counter_id, false);
	if (s == NULL)
	{
		pfree(t);
		return 0;
	}

	/*
	 * A backend's flush, after the pin, as a commit's reservation: once the
	 * worker stops, an amount taken here and given back by a rollback would
	 * come after its last flush.  The worker's last flush takes it instead.
	 */
	if (!RegistryIsWorker() && !RegistryAcceptingHere())
	{
		Unpin(s);
		pfree(t);
		return 0;
	}
	/* a set_counter elsewhere absorbs this amount: not ours to move */
	if (pg_atomic_read_u32(&s->frozen) != 0 &&
		pg_atomic_read_u32(&s->frozen) != (uint32) MyProcPid)
	{
		Unpin(s);
		pfree(t);
		return 0;
	}
	t->since = (TimestampTz) pg_atomic_read_u64(&s->since);
	amount = pg_atomic_exchange_u64(&s->pending, 0);
	if (amount == 0)
	{
		Unpin(s);
		pfree(t);
		return 0;
	}
	t->slot = s;
	t->amount = amount;
	t->subid = GetCurrentSubTransactionId();
	t->next = TakenList;
	TakenList = t;
	return (int64) amount;
}

/*
 * Counters of this database with a slot (only those with a 'memcached'
 * amount waiting, if forwarding): palloc'd ids.
 */
static int
ListSlotCounters(Oid install, bool forwarding, int32 **ids)
{
	int			n = 0;

	*ids = NULL;
	if (Shared == NULL)
		return 0;
	*ids = palloc(sizeof(int32) * Shared->nslots);
	for (int i = 0; i < Shared->nslots; i++)
	{
		BufferSlot *s = &Shared->slots[i];

		if (!SlotHere(s) || s->install != install)
			continue;
		if (forwarding && (pg_atomic_read_u32(&s->forward) == 0 ||
						   pg_atomic_read_u64(&s->pending) == 0))
			continue;
		(*ids)[n++] = s->counter_id;
	}
	return n;
}

/* For a flush: every counter of this database with a slot. */
int
SlotCounters(Oid install, int32 **ids)
{
	return ListSlotCounters(install, false, ids);
}

/* ---- forwarding 'memcached' amounts (the worker's) ---- */

/* For forwarding: counters of this database with a 'memcached' amount waiting. */
int
SlotsForwardCandidates(Oid install, int32 **ids)
{
	return ListSlotCounters(install, true, ids);
}

/*
 * Take a counter's whole amount to forward it; the slot stays pinned until
 * SlotForwardEnd, which gives back what could not be forwarded.  Returns
 * 0 (and no slot) if there is nothing.  Cannot fail.
 */
int64
SlotForwardTake(Oid install, int32 counter_id, void **slot, TimestampTz *since)
{
	BufferSlot *s = PinSlot(install, counter_id, false);
	uint64		amount;

	*slot = NULL;
	*since = 0;
	if (s == NULL)
		return 0;
	/* a set_counter absorbs the slot: the amount stays for it */
	if (pg_atomic_read_u32(&s->frozen) != 0)
	{
		Unpin(s);
		return 0;
	}
	*since = (TimestampTz) pg_atomic_read_u64(&s->since);
	amount = pg_atomic_exchange_u64(&s->pending, 0);
	if (amount == 0)
	{
		Unpin(s);
		return 0;
	}
	*slot = s;
	return (int64) amount;
}

void
SlotForwardEnd(void *slot, int64 give_back, TimestampTz since)
{
	BufferSlot *s = (BufferSlot *) slot;

	if (give_back > 0)
		SlotAddPending(s, (uint64) give_back, since);
	Unpin(s);
}

/* The counter left mode 'memcached': its amount goes to the rows now. */
void
SlotForwardStop(Oid install, int32 counter_id)
{
	BufferSlot *s = PinSlot(install, counter_id, false);

	if (s == NULL)
		return;
	pg_atomic_write_u32(&s->forward, 0);
	Unpin(s);
}

/*
 * Free a slot, under the lock, unless a lookup pinned it meanwhile (that
 * lookup then sees it used).  Its key stays readable for lookups racing by.
 */
static bool
FreeSlot(BufferSlot *s, const char *why)
{
	uint64		left;

	if (pg_atomic_read_u32(&s->pins) != 0)
		return false;
	(void) pg_atomic_exchange_u32(&s->state, SLOT_DEAD);
	if (pg_atomic_read_u32(&s->pins) != 0)
	{
		pg_atomic_write_u32(&s->state, SLOT_USED);
		return false;
	}
	Shared->used--;
	left = pg_atomic_exchange_u64(&s->pending, 0);
	if (left != 0)
		ereport(LOG,
				(errmsg("sharded_seq: " UINT64_FORMAT " committed increments of counter %d will not be counted: %s",
						left, s->counter_id, why)));
	return true;
}

/*
 * Turn tombstones back into free slots where no key's probe passes them, so
 * that lookups that miss stop early again.  A key at slot j, whose probe
 * starts at h, passes h .. j-1: count those passes with a difference array.
 */
static void
ClearTombstones(void)
{
	int			n = Shared->nslots;
	int		   *delta = palloc0(sizeof(int) * (n + 1));
	int			cover = 0;
	bool		any_dead = false;

	for (int j = 0; j < n; j++)
	{
		BufferSlot *s = &Shared->slots[j];
		int			h;

		if (pg_atomic_read_u32(&s->state) == SLOT_DEAD)
			any_dead = true;
		if (pg_atomic_read_u32(&s->state) != SLOT_USED)
			continue;
		h = (int) (CounterKeyHash(s->dbid, s->install, s->counter_id) % (uint32) n);
		if (h <= j)
		{
			delta[h]++;
			delta[j]--;
		}
		else
		{
			/* wraps around the end */
			delta[h]++;
			delta[n]--;
			delta[0]++;
			delta[j]--;
		}
	}
	for (int i = 0; i < n && any_dead; i++)
	{
		BufferSlot *s = &Shared->slots[i];

		cover += delta[i];
		if (cover == 0 && pg_atomic_read_u32(&s->state) == SLOT_DEAD &&
			pg_atomic_read_u32(&s->pins) == 0)
			pg_atomic_write_u32(&s->state, SLOT_FREE);
	}
	pfree(delta);
}

/*
 * Free this database's slots that the worker found empty for two rounds in a
 * row, and those of an installation that is gone (all of them, with
 * install InvalidOid: the extension was dropped), logging any amount they
 * held.  Only the database's worker calls this.
 */
void
SlotsFreeIdle(Oid install)
{
	if (Shared == NULL)
		return;
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < Shared->nslots; i++)
	{
		BufferSlot *s = &Shared->slots[i];

		if (!SlotHere(s))
			continue;
		if (s->install != install)
		{
			FreeSlot(s, "the extension was dropped");
			continue;
		}
		if (pg_atomic_read_u64(&s->pending) != 0)
			s->idle_rounds = 0;
		else if (++s->idle_rounds >= 2)
			FreeSlot(s, "");
	}
	ClearTombstones();
	LWLockRelease(Shared->lock);
}

/* The launcher: free the slots of databases that no longer exist. */
void
SlotsFreeGoneDatabases(const Oid *existing, int n)
{
	if (Shared == NULL)
		return;
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < Shared->nslots; i++)
	{
		BufferSlot *s = &Shared->slots[i];
		bool		found = false;

		if (pg_atomic_read_u32(&s->state) != SLOT_USED)
			continue;
		for (int j = 0; j < n && !found; j++)
			found = existing[j] == s->dbid;
		if (!found)
			FreeSlot(s, "the database was dropped");
	}
	ClearTombstones();
	LWLockRelease(Shared->lock);
}

/*
 * Slots of this database pinned by a commit about to add to them or by a
 * flush holding their amount: how many, and the first max counter ids.
 */
int
SlotsPinnedHere(int32 *ids, int max)
{
	int			n = 0;

	if (Shared == NULL)
		return 0;
	for (int i = 0; i < Shared->nslots; i++)
	{
		BufferSlot *s = &Shared->slots[i];

		if (SlotHere(s) && pg_atomic_read_u32(&s->pins) != 0)
		{
			if (n < max)
				ids[n] = s->counter_id;
			n++;
		}
	}
	return n;
}

/* Does a slot of this database still hold an amount? */
bool
SlotsLeftHere(void)
{
	if (Shared == NULL)
		return false;
	for (int i = 0; i < Shared->nslots; i++)
	{
		BufferSlot *s = &Shared->slots[i];

		if (SlotHere(s) && pg_atomic_read_u64(&s->pending) != 0)
			return true;
	}
	return false;
}

/* After the worker's last flush: log what could not be moved (rows held). */
void
SlotsReportLeft(void)
{
	if (Shared == NULL)
		return;
	for (int i = 0; i < Shared->nslots; i++)
	{
		BufferSlot *s = &Shared->slots[i];
		uint64		left;

		if (!SlotHere(s))
			continue;
		left = pg_atomic_read_u64(&s->pending);
		if (left != 0)
			ereport(LOG,
					(errmsg("sharded_seq: " UINT64_FORMAT " committed increments of counter %d are still in shared memory as its worker stops",
							left, s->counter_id),
					 errdetail("The worker could not write them to the counter's rows: another transaction held every row (a prepared transaction?), or this server's node id is claimed by another (see sharded_seq.node_claims).  They are lost if the server stops now; add them again with counter_incr once the cause is gone.")));
	}
}

/* Slots in use, in all, and commits refused for want of one. */
void
SlotsUsage(int *used, int *total, int64 *refused)
{
	*used = *total = 0;
	*refused = 0;
	if (Shared == NULL)
		return;
	*total = Shared->nslots;
	for (int i = 0; i < Shared->nslots; i++)
		if (pg_atomic_read_u32(&Shared->slots[i].state) == SLOT_USED)
			(*used)++;
	*refused = (int64) pg_atomic_read_u64(&Shared->refused);
}

bool
SlotsTakenInXact(void)
{
	return TakenList != NULL;
}

/* ---- set_counter: freezing a slot ---- */

/* Pins this transaction holds on a slot for amounts it took. */
static uint32
OwnPins(BufferSlot *s)
{
	uint32		n = 0;

	for (Taken *t = TakenList; t; t = t->next)
		n += (t->slot == s);
	for (Frozen *f = FrozenList; f; f = f->next)
		n += (f->slot == s);
	return n;
}

/*
 * For set_counter: freeze the counter's slot (claimed if missing) until this
 * transaction ends, and wait until no other commit or flush holds it.  From
 * then on commits go to the rows instead (SlotReserve), where they wait for
 * the set's row locks, and no other flush or forward takes the amount: what
 * the slot holds is exactly what committed before, for the caller to take.
 * The freeze and the wait are ordered by a full barrier against the pin and
 * the look at frozen in SlotReserve (the same pattern as the worker's stop).
 * Returns SLOT_FROZEN, or why not.  The wait checks interrupts, and gives
 * up after wait_ms: a commit holding a pin may wait for a lock this
 * transaction took earlier.
 */
SlotFreezeResult
SlotFreeze(int32 counter_id, int wait_ms)
{
	BufferSlot *s;
	Frozen	   *f;
	TimestampTz start = GetCurrentTimestamp();

	if (Shared == NULL)
		return SLOT_FROZEN;		/* no slots: every commit writes the rows */
	f = NewListNode(sizeof(Frozen));
	s = PinSlot(ConfigRelid("counter_config"), counter_id, true);
	if (s == NULL)
	{
		pfree(f);
		return SLOT_NONE;
	}
	for (Frozen *g = FrozenList; g; g = g->next)
		if (g->slot == s)
		{
			/* frozen by this transaction already: one pin is enough */
			Unpin(s);
			pfree(f);
			return SLOT_FROZEN;
		}
	f->slot = s;
	f->next = FrozenList;
	FrozenList = f;				/* the transaction's end lets it go, whatever happens */
	pg_atomic_write_u32(&s->frozen, (uint32) MyProcPid);
	pg_memory_barrier();
	while (pg_atomic_read_u32(&s->pins) > OwnPins(s))
	{
		CHECK_FOR_INTERRUPTS();
		if (TimestampDifferenceExceeds(start, GetCurrentTimestamp(), wait_ms))
			return SLOT_BUSY;
		pg_usleep(1000L);
	}
	return SLOT_FROZEN;
}

bool
SlotsFrozenInXact(void)
{
	return FrozenList != NULL;
}

static void
ThawSlots(void)
{
	while (FrozenList)
	{
		Frozen	   *f = FrozenList;

		FrozenList = f->next;
		pg_atomic_write_u32(&f->slot->frozen, 0);
		Unpin(f->slot);
		pfree(f);
	}
}

/* ---- transaction ends: no errors here, only atomics and pfree ---- */

/* Once the lists are empty: give back what a large transaction left. */
static void
ShrinkLists(void)
{
	if (ListContext != NULL && AddList == NULL && TakenList == NULL && FrozenList == NULL &&
		MemoryContextMemAllocated(ListContext, false) > LISTS_KEEP)
		MemoryContextReset(ListContext);
}

void
SlotsXactCommit(void)
{
	while (AddList)
	{
		ToAdd	   *a = AddList;

		AddList = a->next;
		SlotAddPending(a->slot, a->amount, 0);
		/* after the add: a forwarding that clears the news then sees it */
		if (a->forward)
			RegistryForwardNews();
		Unpin(a->slot);
		pfree(a);
	}
	while (TakenList)
	{
		Taken	   *t = TakenList;

		TakenList = t->next;
		Unpin(t->slot);
		pfree(t);
	}
	/* after the adds: the set's transaction has committed */
	ThawSlots();
	ShrinkLists();
}

void
SlotsXactAbort(void)
{
	while (AddList)
	{
		ToAdd	   *a = AddList;

		AddList = a->next;
		Unpin(a->slot);
		pfree(a);
	}
	while (TakenList)
	{
		Taken	   *t = TakenList;

		TakenList = t->next;
		SlotAddPending(t->slot, t->amount, t->since);
		Unpin(t->slot);
		pfree(t);
	}
	/* after the give-backs: no other flush may move them first */
	ThawSlots();
	ShrinkLists();
}

void
SlotsSubXact(bool aborted, SubTransactionId subid, SubTransactionId parent)
{
	Taken	  **link = &TakenList;

	while (*link)
	{
		Taken	   *t = *link;

		if (t->subid != subid)
			link = &t->next;
		else if (aborted)
		{
			*link = t->next;
			SlotAddPending(t->slot, t->amount, t->since);
			Unpin(t->slot);
			pfree(t);
		}
		else
		{
			t->subid = parent;
			link = &t->next;
		}
	}
}
