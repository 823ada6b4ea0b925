/*
 * stats.c
 *	  Counts of memcached fast-path events (hits, lease rebuilds, fallbacks
 *	  to the database, errors, flushes) and of the node-wide sequence cache
 *	  (values, reservations, waits, sessions it had no room for) per
 *	  sequence and counter, and the functions that show them and probe the
 *	  servers; what monitoring reads beside them (values handed out and
 *	  reserved, the recent rate of reservations, the age of a counter's
 *	  memcached amount).
 *
 * With sharded_seq in shared_preload_libraries the counts live in shared
 * memory and cover every session; otherwise each session counts its own.
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "common/common.h"

/*
 * An open-addressing table: a lookup starts at the key's hash and stops at
 * the first free slot.  Slots are never freed (until the server restarts),
 * so no lookup can stop short of its key.
 */
#define STATS_SLOTS 4096

typedef struct StatSlot
{
	Oid			dbid;			/* InvalidOid: free */
	int32		kind;
	int32		id;
	pg_atomic_uint64 v[NUM_STAT_FIELDS];
} StatSlot;

/*
 * The rate of reservations compares the count now with a sample taken
 * between one and two windows ago (or at the first reservation).
 */
#define RATE_WINDOW_US	INT64CONST(60000000)

typedef struct StatsShared
{
	LWLock	   *lock;			/* taken to claim a slot, and to move the rate's samples */
	TimestampTz started_at;		/* when the counts began: the server's start */
	bool		full;			/* an object went uncounted: a missing slot no
								 * longer means zero */
	StatSlot	slots[STATS_SLOTS];
} StatsShared;

typedef struct LocalKey
{
	int32		kind;
	int32		id;
} LocalKey;

typedef struct LocalStat
{
	LocalKey	key;
	uint64		v[NUM_STAT_FIELDS];
} LocalStat;

static StatsShared *Shared = NULL;
static HTAB *Local = NULL;

Size
CountsShmemSize(void)
{
	return sizeof(StatsShared);
}

void
CountsShmemInit(void)
{
	bool		found;

	Shared = ShmemInitStruct("sharded_seq stats", sizeof(StatsShared), &found);
	if (!found)
	{
		memset(Shared, 0, sizeof(StatsShared));
		Shared->lock = &(GetNamedLWLockTranche("sharded_seq"))->lock;
		Shared->started_at = GetCurrentTimestamp();
		for (int i = 0; i < STATS_SLOTS; i++)
			for (int f = 0; f < NUM_STAT_FIELDS; f++)
				pg_atomic_init_u64(&Shared->slots[i].v[f], 0);
	}
}

static uint32
SlotHash(Oid dbid, ObjectKind kind, int32 id)
{
	uint32		h = hash_bytes_uint32((uint32) dbid);

	h = hash_combine(h, hash_bytes_uint32((uint32) kind));
	return hash_combine(h, hash_bytes_uint32((uint32) id)) % STATS_SLOTS;
}

static StatSlot *
SharedSlot(Oid dbid, ObjectKind kind, int32 id, bool claim)
{
	uint32		start = SlotHash(dbid, kind, id);
	StatSlot   *found = NULL;

	/* the common case, without the lock: a slot claimed earlier */
	for (int i = 0; i < STATS_SLOTS; i++)
	{
		StatSlot   *s = &Shared->slots[(start + i) % STATS_SLOTS];
		Oid			slot_db = s->dbid;

		if (slot_db == InvalidOid)
			break;
		pg_read_barrier();
		if (slot_db == dbid && s->kind == (int32) kind && s->id == id)
			return s;
	}
	if (!claim)
		return NULL;

	/* claim a slot under the lock, looking again first */
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < STATS_SLOTS && found == NULL; i++)
	{
		StatSlot   *s = &Shared->slots[(start + i) % STATS_SLOTS];

		if (s->dbid == InvalidOid)
		{
			s->kind = (int32) kind;
			s->id = id;
			pg_write_barrier();
			s->dbid = dbid;
			found = s;
		}
		else if (s->dbid == dbid && s->kind == (int32) kind && s->id == id)
			found = s;
	}
	if (found == NULL)
		Shared->full = true;
	LWLockRelease(Shared->lock);
	return found;				/* NULL when full: the event goes uncounted */
}

/*
 * The shared slot of an object, for monitoring: false when its figures are
 * unknown (the table filled up, so a missing slot may hide uncounted
 * events); *slot NULL and true when nothing was ever counted for it.
 */
static bool
MonitoredSlot(ObjectKind kind, int32 id, StatSlot **slot)
{
	*slot = SharedSlot(MyDatabaseId, kind, id, false);
	return *slot != NULL || !Shared->full;
}

/* Count n events of a sequence or counter of another database (shared only). */
void
StatsCountIn(Oid dbid, ObjectKind kind, int32 id, StatField field, int64 n)
{
	StatSlot   *s;

	if (Shared == NULL)
		return;
	s = SharedSlot(dbid, kind, id, true);
	if (s)
		pg_atomic_fetch_add_u64(&s->v[field], (uint64) n);
}

/* The counts of an object of this database, zero where none (shared only). */
void
StatsRead(ObjectKind kind, int32 id, int64 *counts)
{
	StatSlot   *s = Shared ? SharedSlot(MyDatabaseId, kind, id, false) : NULL;

	for (int f = 0; f < NUM_STAT_FIELDS; f++)
		counts[f] = s ? (int64) pg_atomic_read_u64(&s->v[f]) : 0;
}

/*
 * For monitoring: the counts of an object of this database (shared only),
 * false when they are unknown (not preloaded, or the table filled up).
 */
bool
StatsReadMonitored(ObjectKind kind, int32 id, int64 *counts)
{
	StatSlot   *s;

	if (Shared == NULL || !MonitoredSlot(kind, id, &s))
		return false;
	for (int f = 0; f < NUM_STAT_FIELDS; f++)
		counts[f] = s ? (int64) pg_atomic_read_u64(&s->v[f]) : 0;
	return true;
}

void
StatsCount(ObjectKind kind, int32 id, StatField field, int64 n)
{
	if (Shared != NULL)
	{
		StatSlot   *s = SharedSlot(MyDatabaseId, kind, id, true);

		if (s)
			pg_atomic_fetch_add_u64(&s->v[field], (uint64) n);
		return;
	}
	else
	{
		LocalKey	key = {(int32) kind, id};
		LocalStat  *ls;
		bool		found;

		if (Local == NULL)
		{
			HASHCTL		ctl;

			ctl.keysize = sizeof(LocalKey);
			ctl.entrysize = sizeof(LocalStat);
			Local = hash_create("sharded_seq stats", 32, &ctl, HASH_ELEM | HASH_BLOBS);
		}
		/* bounded like the session's caches: past that, new objects go uncounted */
		ls = hash_search(Local, &key, HASH_FIND, &found);
		if (ls == NULL && hash_get_num_entries(Local) >= SessionCacheSize)
			return;
		if (ls == NULL)
		{
			ls = hash_search(Local, &key, HASH_ENTER, &found);
			memset(ls->v, 0, sizeof(ls->v));
		}
		ls->v[field] += n;
	}
}

/*
 * A block of values was reserved on this server (node-wide, preloaded only).
 * At most once a window, under the lock, the newer sample becomes the older
 * and the count now the newer: the rate then spans one to two windows.
 */
void
StatsNoteReserved(int32 seq_id, int64 values)
{
	StatSlot   *s;
	uint64		total;
	TimestampTz now;
	TimestampTz t1;

	if (Shared == NULL)
		return;
	s = SharedSlot(MyDatabaseId, KIND_SEQUENCE, seq_id, true);
	if (s == NULL)
		return;
	total = pg_atomic_add_fetch_u64(&s->v[STAT_RESERVED], (uint64) values);
	now = GetCurrentTimestamp();
	t1 = (TimestampTz) pg_atomic_read_u64(&s->v[STAT_RATE_T1]);
	if (t1 != 0 && now - t1 < RATE_WINDOW_US)
		return;
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	t1 = (TimestampTz) pg_atomic_read_u64(&s->v[STAT_RATE_T1]);
	if (t1 == 0 || now - t1 >= 2 * RATE_WINDOW_US)
	{
		/*
		 * The first block, or the first after two windows without one: the
		 * rate counts from this reservation on, not over the idle time.
		 */
		pg_atomic_write_u64(&s->v[STAT_RATE_T0], (uint64) now);
		pg_atomic_write_u64(&s->v[STAT_RATE_R0], total - (uint64) values);
		pg_atomic_write_u64(&s->v[STAT_RATE_T1], (uint64) now);
		pg_atomic_write_u64(&s->v[STAT_RATE_R1], total - (uint64) values);
	}
	else if (now - t1 >= RATE_WINDOW_US)
	{
		pg_atomic_write_u64(&s->v[STAT_RATE_T0], (uint64) t1);
		pg_atomic_write_u64(&s->v[STAT_RATE_R0], pg_atomic_read_u64(&s->v[STAT_RATE_R1]));
		pg_atomic_write_u64(&s->v[STAT_RATE_T1], (uint64) now);
		pg_atomic_write_u64(&s->v[STAT_RATE_R1], total);
	}
	LWLockRelease(Shared->lock);
}

/*
 * Values reserved per second, from the older sample to now; false when
 * unknown (not preloaded, nothing reserved since the start, or the sample is
 * younger than a second: one block over a moment says nothing of a rate).
 */
bool
StatsReserveRate(int32 seq_id, double *per_second)
{
	StatSlot   *s = NULL;
	TimestampTz t0;
	uint64		r0;
	uint64		now_count;
	TimestampTz now = GetCurrentTimestamp();

	if (Shared == NULL || !MonitoredSlot(KIND_SEQUENCE, seq_id, &s) || s == NULL)
		return false;
	LWLockAcquire(Shared->lock, LW_SHARED);
	t0 = (TimestampTz) pg_atomic_read_u64(&s->v[STAT_RATE_T0]);
	r0 = pg_atomic_read_u64(&s->v[STAT_RATE_R0]);
	now_count = pg_atomic_read_u64(&s->v[STAT_RESERVED]);
	LWLockRelease(Shared->lock);
	if (t0 == 0 || now - t0 < USECS_PER_SEC || now_count < r0)
		return false;
	*per_second = (double) (now_count - r0) * USECS_PER_SEC / (double) (now - t0);
	return true;
}

/*
 * The age of a counter's memcached amount, from two stamps: the latest
 * flush that found or took every amount older than its read (clean), and
 * the oldest delivery since then (first; one not above clean is of an
 * earlier round).  Deliveries stamp first, flushes raise clean.
 */
void
StatsMcDelivered(int32 counter_id, TimestampTz since)
{
	StatSlot   *s;
	uint64		old;

	if (Shared == NULL)
		return;
	s = SharedSlot(MyDatabaseId, KIND_COUNTER, counter_id, true);
	if (s == NULL)
		return;
	old = pg_atomic_read_u64(&s->v[STAT_MC_FIRST]);
	for (;;)
	{
		TimestampTz clean = (TimestampTz) pg_atomic_read_u64(&s->v[STAT_MC_CLEAN]);

		/* an older delivery of this round stamped it already */
		if ((TimestampTz) old > clean && (TimestampTz) old <= since)
			return;
		if (pg_atomic_compare_exchange_u64(&s->v[STAT_MC_FIRST], &old, (uint64) since))
			return;
	}
}

void
StatsMcCleaned(int32 counter_id, TimestampTz read_at)
{
	StatSlot   *s;
	uint64		old;

	if (Shared == NULL)
		return;
	/* only a key that had a delivery since the start: idle counters take no slot */
	s = SharedSlot(MyDatabaseId, KIND_COUNTER, counter_id, false);
	if (s == NULL)
		return;
	old = pg_atomic_read_u64(&s->v[STAT_MC_CLEAN]);
	while ((TimestampTz) old < read_at &&
		   !pg_atomic_compare_exchange_u64(&s->v[STAT_MC_CLEAN], &old, (uint64) read_at))
		;
}

/*
 * An undone flush gave its amount back, dated since: a clean flush that
 * found the key empty meanwhile was wrong about it, so clean moves below.
 */
void
StatsMcGivenBack(int32 counter_id, TimestampTz since)
{
	StatSlot   *s;
	uint64		old;

	if (Shared == NULL || since == 0)
		return;
	s = SharedSlot(MyDatabaseId, KIND_COUNTER, counter_id, true);
	if (s == NULL)
		return;
	old = pg_atomic_read_u64(&s->v[STAT_MC_CLEAN]);
	while ((TimestampTz) old >= since &&
		   !pg_atomic_compare_exchange_u64(&s->v[STAT_MC_CLEAN], &old, (uint64) (since - 1)))
		;
	StatsMcDelivered(counter_id, since);
}

/*
 * A time no amount in a counter's memcached key is older than: the oldest
 * delivery since the last clean flush, else that flush's read, else the
 * server's start.  Amounts memcached kept across a restart of the server
 * are dated by deliveries since, until the worker's first round flushes
 * them.  0 when unknown (not preloaded, or the table filled up).
 */
TimestampTz
StatsMcOldest(int32 counter_id)
{
	StatSlot   *s;
	TimestampTz clean;
	TimestampTz first;

	if (Shared == NULL || !MonitoredSlot(KIND_COUNTER, counter_id, &s))
		return 0;
	if (s == NULL)
		return Shared->started_at;
	clean = (TimestampTz) pg_atomic_read_u64(&s->v[STAT_MC_CLEAN]);
	first = (TimestampTz) pg_atomic_read_u64(&s->v[STAT_MC_FIRST]);
	if (first > clean)
		return first;
	return clean != 0 ? clean : Shared->started_at;
}

static void
EmitRow(ReturnSetInfo *rsinfo, int32 kind, int32 id, const uint64 *v, const char *scope)
{
	Datum		values[8];
	bool		nulls[8] = {0};

	values[0] = CStringGetTextDatum(kind == KIND_SEQUENCE ? "sequence" : "counter");
	values[1] = Int32GetDatum(id);
	for (int f = 0; f < NUM_MC_STAT_FIELDS; f++)
		values[2 + f] = Int64GetDatum((int64) v[f]);
	values[2 + NUM_MC_STAT_FIELDS] = CStringGetTextDatum(scope);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/* (kind, id, hits, rebuilds, fallbacks, errors, flushes, scope) */
PG_FUNCTION_INFO_V1(memcached_stats);
Datum
memcached_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);
	if (Shared != NULL)
	{
		for (int i = 0; i < STATS_SLOTS; i++)
		{
			StatSlot   *s = &Shared->slots[i];
			uint64		v[NUM_STAT_FIELDS];
			bool		any = false;

			if (s->dbid != MyDatabaseId)
				continue;
			for (int f = 0; f < NUM_STAT_FIELDS; f++)
			{
				v[f] = pg_atomic_read_u64(&s->v[f]);
				any |= f < NUM_MC_STAT_FIELDS && v[f] != 0;
			}
			/* a sequence counted only by the node cache is not listed here */
			if (any)
				EmitRow(rsinfo, s->kind, s->id, v, "cluster");
		}
	}
	else if (Local != NULL)
	{
		HASH_SEQ_STATUS status;
		LocalStat  *ls;

		hash_seq_init(&status, Local);
		while ((ls = hash_seq_search(&status)) != NULL)
			EmitRow(rsinfo, ls->key.kind, ls->key.id, ls->v, "session");
	}
	return (Datum) 0;
}

static void
ReportServer(const char *name, int port, bool healthy, const char *detail, void *arg)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;
	Datum		values[4];
	bool		nulls[4] = {0};

	values[0] = CStringGetTextDatum(name);
	values[1] = Int32GetDatum(port);
	values[2] = BoolGetDatum(healthy);
	values[3] = CStringGetTextDatum(detail);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/* (server, port, healthy, detail) for each configured memcached server */
PG_FUNCTION_INFO_V1(memcached_servers);
Datum
memcached_servers(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);
	McProbeServers(ReportServer, rsinfo);
	return (Datum) 0;
}
