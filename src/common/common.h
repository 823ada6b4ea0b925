/*
 * sharded_seq.h
 *	  Declarations shared by the sharded_seq source files.
 */
#ifndef SHARDED_SEQ_H
#define SHARDED_SEQ_H

#include "postgres.h"

#include "compat.h"
#include "access/xlogdefs.h"
#include "executor/spi.h"
#include "storage/block.h"
#include "storage/itemptr.h"
#include "fmgr.h"
#include "utils/acl.h"
#include "utils/relcache.h"
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

/*
 * Node ids (sharded_seq.node_id): node n > 0 hands out sequence values
 * n * 2^53 + local (local < 2^53) and writes counter rows n * 1024 + s.
 */
#define SHARDED_SEQ_MAX_NODE	1023
#define NODE_VALUE_BITS			53
#define NODE_SHARDS				1024

/* advisory lock class for lease rebuilds and counter flushes */
#define SHARDED_SEQ_LOCK_CLASS	0x53534551	/* 'SSEQ' */
#define SHARDED_SEQ_FLUSH_CLASS 0x53534652	/* 'SSFR' */

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

/* settings (sharded_seq.c) */
extern int	DefaultSequenceShards;
extern int	DefaultBlock;
extern int	DefaultCounterShards;
extern int	DefaultLeaseSize;
extern int	CounterFlushInterval;
extern int	MaxCounterShards;
extern int	SessionCacheSize;
extern int	CounterFoldAfter;
extern int	BufferedSlots;
extern int	NodeIdSetting;
extern int	MemcachedBatchDelay;

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
extern bool ShardLayoutsStored(void);
extern bool AdaptiveCountersStored(void);
extern bool WriteBehindModesSplit(void);
extern bool NodeClaimsStored(void);
extern bool ChangesShardTable(Node *stmt);
extern bool ShardTriggersInPlace(Oid shards_relid, Snapshot snapshot);
extern bool AltersOwnTable(Node *stmt);
extern void RestoreTriggerModes(void);
extern CounterMode ParseCounterMode(const char *mode, int len);
extern const char *StoredModeName(CounterMode mode);
extern Oid	CurrentInstallation(void);
typedef struct OwnerContext
{
	Oid			caller;			/* whose rights are checked */
	Oid			saved_user;
	int			saved_context;
	int			guc_nest_level; /* search_path pinned for the owner's plans */
} OwnerContext;

extern void BeginAsOwner(OwnerContext *ctx);
extern void EndAsOwner(OwnerContext *ctx);
extern uint64 InstallationToken(void);
extern bool HasPrivilege(Oid owner, Acl *acl, Oid role, AclMode mode);
extern bool SequenceReadable(Oid owner, Acl *acl, Oid role);
extern void CheckPrivilege(ObjectKind kind, const char *name, Oid owner,
						   Acl *acl, AclMode mode);
extern void CheckOwnership(ObjectKind kind, const char *name, Oid owner, Oid role);
extern Acl *ChangeAcl(ObjectKind kind, const char *name, Oid owner, Acl *acl,
					  const char *grantee, const char *privilege, bool grant);
extern Acl *CopyAcl(Datum value, bool isnull, MemoryContext cxt);
extern MemoryContext CacheEntryContext(void);
/* A bounded per-session cache of objects by name; entries start with this. */
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
} ObjectCache;

extern CacheEntry *CacheLookup(ObjectCache *cache, const char *name, bool *is_new);
extern CacheEntry *CallSiteEntry(FunctionCallInfo fcinfo, ObjectCache *cache,
								 bool *is_new);
extern void ForgetEntry(ObjectCache *cache, CacheEntry *entry);
extern void AnnounceConfigChange(const char *relname);
extern void ReportNotFound(ObjectKind kind, const char *name);
extern int32 NextObjectId(void);
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
extern char *McKey(const char *fmt,...) pg_attribute_printf(1, 2);
extern McResult McIncr(const char *key, uint64 delta, uint64 *newvalue);
extern McResult McDecr(const char *key, uint64 delta, uint64 *newvalue);
extern McResult McGet(const char *key, int64 *value);
extern McResult McGetAfterOwn(const char *key, int64 *value);
extern McResult McIncrQuiet(const char *key, uint64 delta);
extern McResult McAdd(const char *key, int64 value, time_t expiry);
extern McResult McSet(const char *key, int64 value, time_t expiry);
extern bool McServersValid(const char *list, char **why);
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
	NUM_STAT_FIELDS
} StatField;

extern void StatsCount(ObjectKind kind, int32 id, StatField field, int64 n);
extern Size CountsShmemSize(void);
extern void CountsShmemInit(void);

/* counter_shards.c */
typedef struct ShardRef
{
	int32		shard;
	ItemPointerData tid;		/* the version seen */
	int64		value;
} ShardRef;

/*
 * A counter's total as a snapshot saw its rows, and what says how long it
 * holds (counter_shards.c); a session keeps its own, and shares them
 * (counter_kept.c).
 */
typedef struct KeptTotal
{
	TransactionId config_xmin;	/* the config row version they hold for */
	TransactionId seen_xmax;	/* xmax of the snapshot the rows were seen with */
	uint64		layout;			/* LayoutWord() when they were seen */
	int128		sum;
} KeptTotal;

/* Where a pinned counter's shard rows were last seen, per backend. */
typedef struct CounterPlace
{
	int32		counter_id;
	int32		shards;			/* pinned layout, or 0: adaptive */
	TransactionId config_xmin;	/* the counter_config row version loaded */
	bool		config_committed;	/* known committed, without the commit log */
	ItemPointerData *roots;		/* pinned: each shard's HOT root, in
								 * CacheEntryContext, or NULL */
	int			nroots;			/* rows remembered in refs */
	/* with shared memory (counter_buffer.c): the rows and their total, kept */
	bool		cached;
	KeptTotal	kept;			/* their total, while cached */
	ShardRef   *refs;			/* in CacheEntryContext, nroots of them */
	uint64		last_word;		/* the word at the previous read */
} CounterPlace;

extern void ForgetRows(CounterPlace *place);

/* A counter's configuration row, as the engine needs it. */
typedef struct CounterConfigRow
{
	int32		id;
	int32		shards;			/* pinned layout, or 0: adaptive */
	CounterMode mode;
	Oid			owner;
	Acl		   *acl;			/* palloc'd, or NULL */
	TransactionId xmin;
} CounterConfigRow;

extern bool FetchCounterConfig(const char *name, int32 id, CounterConfigRow *row);
extern int128 CounterSum(int32 counter_id, CounterPlace *place, ShardRef **refs,
						 int *nrefs);
extern bool CounterApply(int32 counter_id, int32 preferred, int64 delta,
						 const char *name, ShardRef *known, int nknown);

typedef enum CounterApplyResult
{
	APPLY_DONE,
	APPLY_BUSY,					/* every shard held by another transaction */
	APPLY_GONE,					/* the counter has no rows */
	APPLY_FULL					/* no shard can take the amount */
} CounterApplyResult;

extern CounterApplyResult CounterTryApply(int32 counter_id, int32 preferred,
										  int64 delta);
extern void InsertIndexEntries(Relation rel, HeapTuple newtup, bool moved,
							   bool only_summarizing);

typedef enum MaintainResult
{
	MAINTAIN_NOTHING,
	MAINTAIN_FOLDED,			/* idle rows folded into one (perhaps gathered too) */
	MAINTAIN_GATHERED,			/* rows rewritten together */
	MAINTAIN_BUSY				/* a row was held or changed: undo, try later */
} MaintainResult;

extern void ExecShardRowsSql(SPIPlanPtr plan, Datum *args, const char *nulls,
							 int expected, int32 counter_id, const char *what);
extern bool EngineWritesShardRows(void);

extern MaintainResult MaintainCounterRows(int32 counter_id, int32 base, bool fold,
										  TransactionId idle_before);

/* counter.c */
extern void CounterInit(void);
extern void CounterDroppedInXact(int32 counter_id);

/* counter_buffer.c: write-behind in shared memory (mode 'buffered') */
extern Size SlotsShmemSize(void);
extern void SlotsShmemInit(void);
extern bool SlotsAvailable(void);
extern bool SlotReserve(int32 counter_id, int64 amount, bool forward);
extern int64 SlotPending(int32 counter_id);
extern int64 SlotTake(Oid install, int32 counter_id);
extern int	SlotCounters(Oid install, int32 **ids);
extern void SlotsFreeIdle(Oid install);
extern void SlotsUsage(int *used, int *total, int64 *refused);
extern bool SlotsTakenInXact(void);
extern void SlotsXactCommit(void);
extern void SlotsXactAbort(void);
extern void SlotsSubXact(bool aborted, SubTransactionId subid,
						  SubTransactionId parent);
extern int64 BufferedFlush(int32 counter_id, const char *name, bool wait);
extern void SlotsFreeGoneDatabases(const Oid *existing, int n);
extern int	SlotsPinnedHere(int32 *ids, int max);
extern bool SlotsLeftHere(void);
extern void SlotsReportLeft(void);
extern int	SlotsForwardCandidates(Oid install, int32 **ids);
extern int64 SlotForwardTake(Oid install, int32 counter_id, void **slot);
extern void SlotForwardEnd(void *slot, int64 give_back);
extern void SlotForwardStop(Oid install, int32 counter_id);
#define LAYOUT_UNKNOWN	PG_UINT64_MAX
extern Size LayoutShmemSize(void);
extern void LayoutShmemInit(void);
extern void CounterMaintain(int32 base, int *folded, int *gathered);
extern bool LayoutWordsAvailable(void);
extern uint64 LayoutWord(int32 counter_id);
extern bool LayoutSettled(uint64 word);
extern void LayoutChanging(int32 counter_id);
extern void LayoutXactEnd(void);
extern void LayoutChangingAll(void);
extern void NoteForeignRows(void);
extern bool ForeignRowsSeen(void);
extern uint64 ShardsNetEpoch(void);

/* counter_kept.c: totals kept in shared memory, for every session */
extern int	SharedTotals;
extern Size KeptShmemSize(void);
extern void KeptShmemInit(void);
extern bool SharedKeptTotal(int32 counter_id, KeptTotal *total);
extern void ShareKeptTotal(int32 counter_id, const KeptTotal *total);
extern void ForgetSharedTotals(Oid dbid);

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

/* worker.c: the launcher and one worker per database */
extern void WorkerRegister(void);
extern void WorkerUtilityInit(void);

/* counter_memcached.c: write-behind through memcached (mode 'memcached') */
extern void MemcachedAfterCommit(int32 counter_id, int64 amount, int32 shard,
							  const char *name, int64 *claim_interval);
extern void MemcachedXactCommit(void);
extern void MemcachedXactAbort(void);
extern void MemcachedSubXact(bool aborted, SubTransactionId subid,
							SubTransactionId parent);
extern bool MemcachedFlushedInXact(void);
extern int64 MemcachedLeftover(int32 counter_id);
extern void MemcachedApplyLeftovers(void);
extern int64 MemcachedFlush(int32 counter_id, int32 shard, const char *name, bool wait);
extern bool MemcachedPending(int32 counter_id, int64 *amount);
/*
 * Sub-id of the counter object lock that the worker's forwarding and
 * flush_counters take (0, the counter's own, is alter_counter's and the
 * commits'): flush_counters then never waits for an alter_counter.
 */
#define FORWARD_LOCK_SUBID	1
extern bool MemcachedStagingHere(void);
extern int64 MemcachedForward(Oid install, int32 counter_id);

/* counter_admin.c */
extern bool InsertCounter(const char *name, int32 shards, const char *mode,
						  Oid owner, bool if_not_exists);

/* node.c: node ids for several primaries, and their claims */
extern int	SessionNode;
extern int32 SessionNodeFirstUse(void);

/* This session's node id: the setting as it was at its first use. */
static inline int32
SessionNodeId(void)
{
	return SessionNode >= 0 ? SessionNode : SessionNodeFirstUse();
}

extern void NodeIdForget(void);
extern void NodeClaimCheck(void);
extern int32 NodeShardBase(void);
extern int64 SequenceNodeValue(int64 local, const char *seqname);
extern int64 SequenceNodeLocal(int64 value, bool above, const char *seqname,
							   const char *what);

/* replication.c */
extern void WaitForSyncStandbys(XLogRecPtr lsn, const char *seqname);

/* sequence_admin.c */
extern int	ReapShards(void);
extern int64 GenerationHighWater(int32 seq_id, int32 generation, int64 base,
								 int32 shards, int32 block);
extern int64 BlockStart(int64 base, int64 k, int32 shards, int32 shard,
						int32 block, bool *overflow);

#endif
