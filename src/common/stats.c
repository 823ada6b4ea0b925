/*
 * stats.c
 *	  Counts of memcached fast-path events (hits, lease rebuilds, fallbacks
 *	  to the database, errors, flushes) and of the node-wide sequence cache
 *	  (values, reservations, waits, sessions it had no room for) per
 *	  sequence and counter, and the functions that show them and probe the
 *	  servers.
 *
 * With sharded_seq in shared_preload_libraries the counts live in shared
 * memory and cover every session; otherwise each session counts its own.
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/tuplestore.h"

#include "common/common.h"

#define STATS_SLOTS 1024

typedef struct StatSlot
{
	Oid			dbid;			/* InvalidOid: free */
	int32		kind;
	int32		id;
	pg_atomic_uint64 v[NUM_STAT_FIELDS];
} StatSlot;

typedef struct StatsShared
{
	LWLock	   *lock;			/* taken to claim a slot */
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
		for (int i = 0; i < STATS_SLOTS; i++)
			for (int f = 0; f < NUM_STAT_FIELDS; f++)
				pg_atomic_init_u64(&Shared->slots[i].v[f], 0);
	}
}

static StatSlot *
SharedSlot(Oid dbid, ObjectKind kind, int32 id, bool claim)
{
	StatSlot   *found = NULL;
	StatSlot   *free_slot = NULL;

	/* the common case, without the lock: a slot claimed earlier */
	for (int i = 0; i < STATS_SLOTS; i++)
	{
		StatSlot   *s = &Shared->slots[i];

		if (s->dbid == dbid && s->kind == (int32) kind && s->id == id)
			return s;
	}
	if (!claim)
		return NULL;

	/* claim a slot under the lock, looking again first */
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < STATS_SLOTS && found == NULL; i++)
	{
		StatSlot   *s = &Shared->slots[i];

		if (s->dbid == dbid && s->kind == (int32) kind && s->id == id)
			found = s;
		else if (s->dbid == InvalidOid && free_slot == NULL)
			free_slot = s;
	}
	if (found == NULL && free_slot != NULL)
	{
		free_slot->kind = (int32) kind;
		free_slot->id = id;
		pg_write_barrier();
		free_slot->dbid = dbid;
		found = free_slot;
	}
	LWLockRelease(Shared->lock);
	return found;				/* NULL when full: the event goes uncounted */
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
