/*
 * registry.c
 *	  The databases that have the extension, and their workers: a table in
 *	  shared memory that the engines read and note their use in, and that the
 *	  launcher and the workers (src/worker/) fill.
 *
 * It sits below the engines and the worker so that neither calls the other:
 * a commit asks here whether its database's worker still takes amounts
 * (RegistryAcceptingHere), a worker says here that it does.  Every field is
 * written under the lock; the few read on every commit (pid, accepting,
 * mc_servers, forward_news) are read without it, which the callers allow for
 * (counter/slots.c says why an answer read after a pin is enough).
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/memutils.h"

#include "common/common.h"

RegistryData *RegistryShared = NULL;

/* Is this process a database's worker (set by the worker at its start)? */
static bool IsWorker = false;

/* ---- shared memory ---- */

Size
RegistryShmemSize(void)
{
	return sizeof(RegistryData);
}

void
RegistryShmemInit(void)
{
	bool		found;

	RegistryShared = ShmemInitStruct("sharded_seq workers", sizeof(RegistryData), &found);
	if (!found)
	{
		memset(RegistryShared, 0, sizeof(RegistryData));
		RegistryShared->lock = &(GetNamedLWLockTranche("sharded_seq workers"))->lock;
		for (int i = 0; i < REGISTRY_MAX_DBS; i++)
		{
			pg_atomic_init_u32(&RegistryShared->dbs[i].forward_news, 0);
			pg_atomic_init_u32(&RegistryShared->dbs[i].prefetch_news, 0);
		}
	}
}

/* The entry of a database, made if make; NULL if missing or no room.  Lock held. */
RegistryDb *
RegistryEntry(Oid dbid, bool make)
{
	RegistryDb   *free_entry = NULL;

	for (int i = 0; i < REGISTRY_MAX_DBS; i++)
	{
		if (RegistryShared->dbs[i].dbid == dbid)
			return &RegistryShared->dbs[i];
		if (RegistryShared->dbs[i].dbid == InvalidOid && free_entry == NULL)
			free_entry = &RegistryShared->dbs[i];
	}
	if (!make || free_entry == NULL)
		return NULL;
	memset(free_entry, 0, sizeof(RegistryDb));
	pg_atomic_init_u32(&free_entry->forward_news, 0);
	pg_atomic_init_u32(&free_entry->prefetch_news, 0);
	free_entry->dbid = dbid;
	return free_entry;
}

void
RegistryWakeLauncher(void)
{
	if (RegistryShared->launcher_latch)
		SetLatch(RegistryShared->launcher_latch);
}

static bool NotePending = false;
static uint64 NotedEpoch = PG_UINT64_MAX;

/*
 * This database has the extension: make sure it gets a worker, once this
 * transaction ends (a CREATE EXTENSION is seen by the worker only after its
 * commit; an aborted one costs a worker start that finds nothing).
 */
void
RegistryNoteDatabase(void)
{
	NotePending = true;
}

/*
 * The extension is used here: called wherever it acts as its owner
 * (BeginAsOwner: every administrative function, view and load of a
 * sequence) and wherever the counter engine loads a counter.  It notes once
 * per configuration epoch (the rhythm of relation ids looked up again), so
 * it is cheap enough for every call.
 */
void
RegistryNoteUse(void)
{
	/* once per configuration epoch, as relation ids are looked up again */
	if (NotedEpoch != ConfigEpoch)
	{
		NotedEpoch = ConfigEpoch;
		NotePending = true;
	}
}

/*
 * At the end of every transaction: tell the launcher.  Each note counts, so
 * that a worker that found no extension a moment before does not give the
 * database up.  Only shared memory and a latch: safe after commit.
 */
static void
RegistryXactEnd(void)
{
	RegistryDb   *db;
	bool		wake = false;

	if (!NotePending)
		return;
	NotePending = false;
	if (RegistryShared == NULL || !OidIsValid(MyDatabaseId))
		return;
	LWLockAcquire(RegistryShared->lock, LW_EXCLUSIVE);
	db = RegistryEntry(MyDatabaseId, true);
	if (db != NULL)
	{
		db->notes++;
		wake = !db->wanted || db->pid == 0;
		db->wanted = true;
	}
	LWLockRelease(RegistryShared->lock);
	if (wake)
		RegistryWakeLauncher();
}

/* This database's entry, found without the lock; NULL if it has none. */
static volatile RegistryDb *
RegistryEntryHere(void)
{
	if (RegistryShared == NULL || !OidIsValid(MyDatabaseId))
		return NULL;
	for (int i = 0; i < REGISTRY_MAX_DBS; i++)
		if (RegistryShared->dbs[i].dbid == MyDatabaseId)
			return &RegistryShared->dbs[i];
	return NULL;
}

/*
 * Does this database's worker flush what commits put in shared memory?  Read
 * without the lock on every buffered commit.  Only an answer read after the
 * slot was pinned counts (counter/slots.c says why): a worker that stops
 * accepting waits for pinned slots before its last flush.
 */
bool
RegistryAcceptingHere(void)
{
	volatile RegistryDb *db = RegistryEntryHere();

	return db != NULL && db->pid != 0 && db->accepting;
}

uint32
RegistryServersHash(void)
{
	static char *hashed = NULL;
	static uint32 hash = 0;

	if (!McEnabled())
		return 0;
	/* hashed once per setting, not on every commit */
	if (hashed == NULL || strcmp(hashed, MemcachedServers) != 0)
	{
		if (hashed)
			pfree(hashed);
		hashed = MemoryContextStrdup(TopMemoryContext, MemcachedServers);
		hash = hash_bytes((const unsigned char *) MemcachedServers,
						  strlen(MemcachedServers)) | 1;
	}
	return hash;
}

/*
 * After commit (no errors): a 'memcached' amount was added to a slot here.
 * Read first, so a hot counter's commits do not all write the line.
 */
void
RegistryForwardNews(void)
{
	volatile RegistryDb *db = RegistryEntryHere();

	if (db != NULL && pg_atomic_read_u32((pg_atomic_uint32 *) &db->forward_news) == 0 &&
		pg_atomic_exchange_u32((pg_atomic_uint32 *) &db->forward_news, 1) == 0)
	{
		Latch	   *latch = db->latch;

		/* the first news since the last forward: an idle worker sleeps */
		if (latch != NULL)
			SetLatch(latch);
	}
}

/*
 * A node cache entry of this database asks for its next block: wake this
 * database's worker, if one runs and takes requests.  Returns false when
 * none does; the caller then reserves the block itself.
 */
bool
RegistryPrefetchNews(void)
{
	volatile RegistryDb *db = RegistryEntryHere();
	Latch	   *latch;

	if (db == NULL || db->pid == 0 || !db->accepting)
		return false;
	latch = db->latch;
	if (latch == NULL)
		return false;
	pg_atomic_write_u32((pg_atomic_uint32 *) &db->prefetch_news, 1);
	SetLatch(latch);
	return true;
}

/*
 * Does this database's worker take 'memcached' amounts from shared memory
 * to the memcached servers this session uses?  Read without the lock on
 * every such commit; SlotReserve asks RegistryAcceptingHere again after
 * its pin.
 */
bool
RegistryForwardsHere(void)
{
	uint32		mine = RegistryServersHash();
	volatile RegistryDb *db = RegistryEntryHere();

	return db != NULL && mine != 0 && db->pid != 0 && db->accepting &&
		db->mc_servers == mine;
}

/*
 * Does this database's worker flush the memcached this session uses (its
 * servers may be set per role or database, which the worker need not see)?
 */
bool
RegistryFlushesMyMemcached(void)
{
	RegistryDb   *db;
	bool		flushes;
	uint32		mine = RegistryServersHash();

	if (RegistryShared == NULL || mine == 0)
		return false;
	LWLockAcquire(RegistryShared->lock, LW_SHARED);
	db = RegistryEntry(MyDatabaseId, false);
	flushes = db != NULL && db->pid != 0 && db->mc_servers == mine;
	LWLockRelease(RegistryShared->lock);
	return flushes;
}

/* ---- who is asking ---- */

/* The worker of a database, once its entry is its own (worker/worker.c). */
void
RegistryMarkWorker(void)
{
	IsWorker = true;
}

/* A database's worker flushes without asking whether a worker accepts. */
bool
RegistryIsWorker(void)
{
	return IsWorker;
}

/* Every transaction's end, whatever it used: the notes of RegistryNoteUse. */
static void
RegistryXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			RegistryXactEnd();
			break;
		default:
			break;
	}
}

void
RegistryInit(void)
{
	RegisterXactCallback(RegistryXactCallback, NULL);
}
