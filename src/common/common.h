/*
 * common.h
 *	  The door of src/common/: the foundation every subsystem stands on.  The
 *	  catalog and privileges, the per-session object cache, the config word,
 *	  the memcached client, statistics, wait points, and the registry of
 *	  databases and their workers.  What exists because there is more than
 *	  one server is src/topology/'s.  Includes no other subsystem's header.
 */
#ifndef SHARDED_SEQ_COMMON_H
#define SHARDED_SEQ_COMMON_H

#include "postgres.h"

#include "common/compat.h"
#include "access/xlogdefs.h"
#include "executor/spi.h"
#include "storage/block.h"
#include "storage/itemptr.h"
#include "fmgr.h"
#include "utils/acl.h"
#include "utils/relcache.h"
#include "datatype/timestamp.h"
#include "access/htup.h"
#include "lib/ilist.h"
#include "utils/hsearch.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"

#define SHARDED_SEQ_SCHEMA		"sharded_seq"
#define SHARDED_SEQ_MAX_NAME	(NAMEDATALEN - 1)
#define SHARDED_SEQ_MAX_SHARDS	1024
#define SHARDED_SEQ_MAX_BLOCK	100000000

/* advisory lock class for lease rebuilds and counter flushes */
#define SHARDED_SEQ_LOCK_CLASS	0x53534551	/* 'SSEQ' */
#define SHARDED_SEQ_FLUSH_CLASS 0x53534652	/* 'SSFR' */

/*
 * WAIT_POINT("name"): a place where a test can hold this backend (see
 * wait_point.c).  Only test builds (make WAIT_POINTS=1) have them; elsewhere
 * the macro is nothing.  Never place one where the backend holds an LWLock
 * or a spinlock, or inside a critical section: it waits on a lock.
 */
#define WAIT_POINT_CLASS		0x53535750	/* 'SSWP' */
#define WAIT_BACKEND_CLASS		0x53534242	/* 'SSBB' */
#ifdef SHARDED_SEQ_WAIT_POINTS
extern void WaitPointReached(const char *name);
#define WAIT_POINT(name)		WaitPointReached(name)
/*
 * The same, deaf to interrupts while it waits: a backend let go with a
 * SIGTERM pending goes on to its next CHECK_FOR_INTERRUPTS, as one stopped
 * in a debugger would.  Its wait cannot be cancelled: the test must let go.
 */
#define WAIT_POINT_HOLDING_INTERRUPTS(name) \
	do { HOLD_INTERRUPTS(); WaitPointReached(name); RESUME_INTERRUPTS(); } while (0)
#else
#define WAIT_POINT(name)		((void) 0)
#define WAIT_POINT_HOLDING_INTERRUPTS(name) ((void) 0)
#endif

/* How a counter takes increments: counter_config.mode */
typedef enum CounterMode
{
	MODE_EXACT,
	MODE_BUFFERED,				/* shared memory, flushed by the worker */
	MODE_MEMCACHED				/* memcached, flushed by the worker */
} CounterMode;

typedef enum ObjectKind
{
	KIND_SEQUENCE,
	KIND_COUNTER
} ObjectKind;


/* settings of common (module.c registers them) */
extern int	SessionCacheSize;

/* catalog.c */
extern uint64 ConfigEpoch;
extern uint64 PrivilegeEpoch;
extern void CatalogInit(void);
extern const char *KindName(ObjectKind kind);
extern void ValidateName(const char *name, ObjectKind kind);
extern char *NameArg(FunctionCallInfo fcinfo, int argno, ObjectKind kind);
extern void ValidateShards(int shards, ObjectKind kind);
extern void ValidateBlock(int block);
extern Oid	ExtensionOwner(void);
extern Oid	ConfigRelid(const char *relname);
extern Oid	InstalledRelid(const char *relname);
extern bool ShardLayoutsStored(void);
extern bool AdaptiveCountersStored(void);
extern bool WriteBehindModesSplit(void);
extern bool NodeClaimsStored(void);
extern bool ClusterCallsStored(void);
extern bool NodeCacheStored(void);
extern bool CounterSetsStored(void);
extern bool ChangesOwnTable(Node *stmt, const char *relname);
extern bool ChangesSequenceConfig(Node *stmt);
extern bool ChangesRoles(Node *stmt);
extern void OwnTriggerEvents(Oid relid, const char *function, Snapshot snapshot,
							 int16 *row, int16 *stmt);
extern bool ShardTriggersInPlace(Oid shards_relid, Snapshot snapshot);
extern bool AltersOwnTable(Node *stmt);
extern void RestoreTriggerModes(void);
extern CounterMode ParseCounterMode(const char *mode, int len);
extern const char *StoredModeName(CounterMode mode);
extern Oid	CurrentInstallation(void);
extern uint64 InstallationToken(void);

/* privileges.c: running as the owner, ACLs */
typedef struct OwnerContext
{
	Oid			caller;			/* whose rights are checked */
	Oid			saved_user;
	int			saved_context;
	int			guc_nest_level; /* search_path pinned for the owner's plans */
} OwnerContext;

extern void BeginAsOwner(OwnerContext *ctx);
extern void EndAsOwner(OwnerContext *ctx);
extern bool HasPrivilege(Oid owner, Acl *acl, Oid role, AclMode mode);
extern bool SequenceReadable(Oid owner, Acl *acl, Oid role);
extern bool StatsReader(Oid role);
extern void CheckPrivilege(ObjectKind kind, const char *name, Oid owner,
						   Acl *acl, AclMode mode);
extern void CheckOwnership(ObjectKind kind, const char *name, Oid owner, Oid role);
extern Acl *ChangeAcl(ObjectKind kind, const char *name, Oid owner, Acl *acl,
					  const char *grantee, const char *privilege, bool grant);
extern Acl *CopyAcl(Datum value, bool isnull, MemoryContext cxt);

/* cache.c: a bounded per-session cache of objects by name; entries start with this. */
typedef struct CacheEntry
{
	char		name[NAMEDATALEN];	/* hash key */
	dlist_node	lru;
	uint64		incarnation;	/* unique per entry made; 0 once evicted */
} CacheEntry;

typedef struct ObjectCache
{
	const char *label;
	ObjectKind	kind;
	Size		entrysize;
	void		(*evict) (CacheEntry *entry);	/* release what it owns */
	HTAB	   *table;
	dlist_head	lru;			/* most recently used first */
	long		count;
	CacheEntry *last;			/* the entry looked up last by name */
	uint64		last_incarnation;	/* its incarnation then */
} ObjectCache;

extern CacheEntry *CacheLookup(ObjectCache *cache, const char *name, bool *is_new);
extern CacheEntry *CallSiteEntry(FunctionCallInfo fcinfo, ObjectCache *cache,
								 bool *is_new);
extern void ForgetEntry(ObjectCache *cache, CacheEntry *entry);
extern MemoryContext CacheEntryContext(void);

/* config_word.c: is a copy of configuration in shared memory current? */
extern Size ConfigWordShmemSize(void);
extern void ConfigWordShmemInit(void);
extern void ConfigChanging(void);
extern bool ConfigWordSettled(uint64 *word);
extern void AcceptConfigChanges(void);
extern void RolesChanging(void);
extern bool ConfigWatched(Snapshot snapshot);
extern void AnnounceConfigChange(const char *relname);

/* catalog.c, continued */
extern void ReportNotFound(ObjectKind kind, const char *name);
extern SPIPlanPtr PreparePlan(SPIPlanPtr *cache, const char *sql, int nargs,
							  Oid *argtypes);

/* memcache.c */
typedef enum McResult
{
	MC_OK,
	MC_MISSING,					/* the key is not there (or a hidden timeout) */
	MC_EXISTS,					/* add: the key is already there */
	MC_DOWN,					/* nothing was sent: no server could be reached */
	MC_UNKNOWN					/* the request may or may not have been applied */
} McResult;

#define MC_MAX_DELTA	((uint64) PG_UINT32_MAX)

extern char *MemcachedServers;
extern int	MemcachedConnectTimeout;
extern int	MemcachedPollTimeout;
extern void McSettingsChanged(void);
extern bool McEnabled(void);
extern bool McRecentlyDown(void);
extern TimestampTz McLastFailure(void);
extern char *McKey(const char *fmt,...) pg_attribute_printf(1, 2);
extern McResult McIncr(const char *key, uint64 delta, uint64 *newvalue);
extern McResult McDecr(const char *key, uint64 delta, uint64 *newvalue);
extern McResult McGet(const char *key, int64 *value);
extern McResult McGetAfterOwn(const char *key, int64 *value);
extern McResult McIncrQuiet(const char *key, uint64 delta);
extern McResult McAdd(const char *key, int64 value, time_t expiry);
extern McResult McSet(const char *key, int64 value, time_t expiry);
extern bool McCheckServers(const char *list);
extern void McRequireBuilt(const char *what);
extern void McRequireReachable(const char *what, const char *name);
extern void McProbeServers(void (*report) (const char *, int, bool, const char *, void *),
						   void *arg);

/* stats.c */
typedef enum StatField
{
	STAT_HITS,					/* served by memcached */
	STAT_REBUILDS,				/* leases carved and published */
	STAT_FALLBACKS,				/* served by the database instead */
	STAT_ERRORS,				/* memcached calls that failed */
	STAT_FLUSHES,				/* buffered amounts written to shard rows */
	/* the node-wide sequence cache (sequence/node_cache.c) */
	STAT_NODE_HITS,				/* values handed out from it */
	STAT_NODE_RESERVATIONS,		/* blocks reserved for it */
	STAT_NODE_WAITS,			/* draws that waited for a reservation */
	STAT_NODE_FULL,				/* sessions that found it full and drew per session */
	/* monitoring (sequence_usage, counter_backlog): shared memory only */
	STAT_SESSION_VALUES,		/* values handed out from blocks of a session */
	STAT_RESERVED,				/* values in blocks reserved on this server */
	STAT_RATE_T0,				/* the older sample of STAT_RESERVED: time */
	STAT_RATE_R0,				/* ... and count */
	STAT_RATE_T1,				/* the newer sample, taken at least */
	STAT_RATE_R1,				/* RATE_WINDOW after the older */
	STAT_MC_CLEAN,				/* a counter's memcached key: the last flush
								 * that left nothing older than this */
	STAT_MC_FIRST,				/* the oldest delivery to it since */
	NUM_STAT_FIELDS
} StatField;

/* the fields memcached_stats shows */
#define NUM_MC_STAT_FIELDS		(STAT_FLUSHES + 1)

extern void StatsCount(ObjectKind kind, int32 id, StatField field, int64 n);
extern void StatsCountIn(Oid dbid, ObjectKind kind, int32 id, StatField field, int64 n);
extern void StatsRead(ObjectKind kind, int32 id, int64 *counts);
extern bool StatsReadMonitored(ObjectKind kind, int32 id, int64 *counts);
extern void StatsNoteReserved(int32 seq_id, int64 values);
extern bool StatsReserveRate(int32 seq_id, double *per_second);
extern void StatsMcDelivered(int32 counter_id, TimestampTz since);
extern void StatsMcCleaned(int32 counter_id, TimestampTz read_at);
extern void StatsMcGivenBack(int32 counter_id, TimestampTz since);
extern TimestampTz StatsMcOldest(int32 counter_id);
extern Size CountsShmemSize(void);
extern void CountsShmemInit(void);

/* registry.c: the databases with the extension, and their workers */
#define REGISTRY_MAX_DBS	64
#define REGISTRY_ERROR_LEN	256

typedef struct RegistryDb
{
	Oid			dbid;			/* InvalidOid: a free entry */
	bool		wanted;			/* has, or may have, the extension */
	uint32		notes;			/* times a backend said it has the extension */
	pid_t		pid;			/* its worker, or 0 */
	bool		accepting;		/* its worker flushes what commits put in slots */
	uint32		mc_servers;		/* hash of the memcached servers it flushes, or 0 */
	pg_atomic_uint32 forward_news;	/* commits left 'memcached' amounts in slots */
	pg_atomic_uint32 prefetch_news; /* node cache entries ask for their next block */
	Latch	   *latch;			/* its worker's, to wake it for them */
	TimestampTz started_at;
	TimestampTz paused_until;	/* a database command needs it gone */
	TimestampTz last_flush_at;
	int64		last_flush_amount;
	int32		last_flush_counters;
	int64		flushed_total;
	TimestampTz last_maintain_at;
	TimestampTz last_error_at;
	char		last_error[REGISTRY_ERROR_LEN];
} RegistryDb;

typedef struct RegistryData
{
	LWLock	   *lock;
	pid_t		launcher_pid;
	TimestampTz launcher_started;
	Latch	   *launcher_latch;
	RegistryDb	dbs[REGISTRY_MAX_DBS];
} RegistryData;

extern RegistryData *RegistryShared;
extern Size RegistryShmemSize(void);
extern void RegistryShmemInit(void);
extern void RegistryInit(void);
extern RegistryDb *RegistryEntry(Oid dbid, bool make);
extern void RegistryWakeLauncher(void);
extern uint32 RegistryServersHash(void);
extern void RegistryNoteDatabase(void);
extern void RegistryNoteUse(void);
extern void RegistryMarkWorker(void);
extern bool RegistryIsWorker(void);
extern bool RegistryAcceptingHere(void);
extern void RegistryForwardNews(void);
extern bool RegistryForwardsHere(void);
extern bool RegistryFlushesMyMemcached(void);
extern bool RegistryPrefetchNews(void);

#endif							/* SHARDED_SEQ_COMMON_H */
