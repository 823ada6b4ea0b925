/*
 * module.c
 *	  Module initialisation and settings.  All settings live under the
 *	  reserved "sharded_seq." prefix.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "common/common.h"
#include "counter/counter.h"
#include "sequence/sequence.h"
#include "topology/topology.h"
#include "worker/worker.h"

PG_MODULE_MAGIC;


void		_PG_init(void);

static emit_log_hook_type prev_emit_log_hook = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/*
 * Shared memory: statistics, buffered counters' slots, kept totals, the
 * workers' state, the node-wide sequence cache.
 */
static void
ShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(CountsShmemSize());
	RequestAddinShmemSpace(SlotsShmemSize());
	RequestAddinShmemSpace(LayoutShmemSize());
	RequestAddinShmemSpace(KeptShmemSize());
	RequestAddinShmemSpace(RegistryShmemSize());
	RequestAddinShmemSpace(NodeCacheShmemSize());
	RequestAddinShmemSpace(SequenceDirectoryShmemSize());
	RequestAddinShmemSpace(ConfigWordShmemSize());
	RequestNamedLWLockTranche("sharded_seq", 1);
	RequestNamedLWLockTranche("sharded_seq node cache", 1);
	RequestNamedLWLockTranche("sharded_seq directory", 1);
	RequestNamedLWLockTranche("sharded_seq buffered", 1);
	RequestNamedLWLockTranche("sharded_seq workers", 1);
}

static void
ShmemStartup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	CountsShmemInit();
	SlotsShmemInit();
	LayoutShmemInit();
	KeptShmemInit();
	RegistryShmemInit();
	NodeCacheShmemInit();
	SequenceDirectoryShmemInit();
	ConfigWordShmemInit();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * PostgreSQL checks an integer setting against its bounds before any check
 * hook runs, and its "outside the valid range" error has no hint.  Add ours
 * to that error, for our settings only, as it is reported; and to the
 * refusal to SET sharded_seq.node_id in a session.
 */
static void
AddRangeHint(ErrorData *edata)
{
	if (edata->hint == NULL && edata->message_id != NULL && edata->message != NULL &&
		edata->sqlerrcode == ERRCODE_INVALID_PARAMETER_VALUE &&
		strstr(edata->message_id, "is outside the valid range for parameter") != NULL &&
		strstr(edata->message, "\"sharded_seq.") != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(ErrorContext);

		edata->hint = pstrdup("Choose a value in that range, or RESET the setting to its default.");
		MemoryContextSwitchTo(old);
	}
	/* nor has its refusal of a SET of a server-wide setting */
	if (edata->hint == NULL && edata->message != NULL &&
		edata->sqlerrcode == ERRCODE_CANT_CHANGE_RUNTIME_PARAM &&
		strstr(edata->message, "\"sharded_seq.node_id\"") != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(ErrorContext);

		edata->hint = pstrdup("Set it in postgresql.conf or with ALTER SYSTEM, then SELECT pg_reload_conf(); sessions started afterwards use it.");
		MemoryContextSwitchTo(old);
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * The largest timeout (ms) and flush interval (s) the settings accept.
 * Integer settings carry their ranges as bounds, so pg_settings shows them
 * and PostgreSQL refuses a value outside them before any check hook could
 * run; AddRangeHint gives that refusal its hint.
 */
#define MAX_TIMEOUT_MS			60000
#define MAX_FLUSH_INTERVAL_S	86400
#define MAX_BATCH_DELAY_MS	1000

static bool
CheckServers(char **newval, void **extra, GucSource source)
{
	return McCheckServers(*newval);
}

/* Only marks the connection for rebuilding: assign hooks must not fail. */
static void
AssignServers(const char *newval, void *extra)
{
	McSettingsChanged();
}

static void
AssignTimeout(int newval, void *extra)
{
	McSettingsChanged();
}

void
_PG_init(void)
{
	DefineCustomIntVariable("sharded_seq.default_sequence_shards",
							"Shards given to a sharded sequence when create_sequence() is not told.",
							"More shards let more sessions reserve blocks at once.",
							&DefaultSequenceShards, 4, 1, SHARDED_SEQ_MAX_SHARDS,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_block",
							"Values a session reserves at once from a sharded sequence when create_sequence() is not told.",
							"Larger blocks cost fewer durable reservations; a session that ends leaves the rest of its block unused.",
							&DefaultBlock, 1000, 1, SHARDED_SEQ_MAX_BLOCK,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_counter_shards",
							"Shard rows pinned for a counter that create_counter() or counter_incr() creates without being told; 0 makes it adaptive.",
							"An adaptive counter is one row that grows under contention, up to sharded_seq.max_counter_shards.",
							&DefaultCounterShards, 0, 0, SHARDED_SEQ_MAX_SHARDS,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.max_counter_shards",
							"Most rows an adaptive counter grows to.",
							"A commit that finds every row of an adaptive counter held adds one, up to this many, instead of waiting.",
							&MaxCounterShards, 16, 1, SHARDED_SEQ_MAX_SHARDS,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.counter_fold_after",
							"How long an adaptive counter's extra rows stay idle before maintain() folds them back.",
							NULL, &CounterFoldAfter, 60, 1, MAX_FLUSH_INTERVAL_S,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.session_cache_size",
							"Most sequences, and most counters, a session keeps loaded at once.",
							"The least recently used is dropped beyond this; each entry costs a few hundred bytes.",
							&SessionCacheSize, 25000, 16, 10000000,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_lease_size",
							"Values in each memcached lease of a memcached-tier sequence when create_sequence() is not told.",
							"A lease is reserved durably from the database; memcached hands out values inside it.",
							&DefaultLeaseSize, 10000, 1, SHARDED_SEQ_MAX_BLOCK,
							PGC_USERSET, 0, NULL, NULL, NULL);
	/* settings that reach the network are superuser-only */
	DefineCustomStringVariable("sharded_seq.memcached_servers",
							   "memcached servers for the fast path, as a libmemcached list: host:port,host:port.",
							   "Empty turns the fast path off; nothing then talks to the network.",
							   &MemcachedServers, "",
							   PGC_SUSET, 0, CheckServers, AssignServers, NULL);
	DefineCustomIntVariable("sharded_seq.memcached_connect_timeout",
							"How long to wait for a memcached connection.",
							NULL, &MemcachedConnectTimeout, 200, 1, MAX_TIMEOUT_MS,
							PGC_SUSET, GUC_UNIT_MS, NULL, AssignTimeout, NULL);
	DefineCustomIntVariable("sharded_seq.memcached_poll_timeout",
							"How long to wait for a memcached reply.",
							NULL, &MemcachedPollTimeout, 200, 1, MAX_TIMEOUT_MS,
							PGC_SUSET, GUC_UNIT_MS, NULL, AssignTimeout, NULL);
	DefineCustomIntVariable("sharded_seq.counter_flush_interval",
							"How often the background worker moves write-behind counters' amounts into their shard rows.",
							"Unflushed amounts are what a crash (mode 'buffered') or a memcached loss (mode 'memcached') can take.",
							&CounterFlushInterval, 10, 1, MAX_FLUSH_INTERVAL_S,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.memcached_batch_delay",
							"How long mode 'memcached' amounts wait in shared memory for the worker to send them; 0: each commit sends its own.",
							"Used only when the library is preloaded.  A crash or an immediate shutdown loses what is still waiting; 0 loses nothing to a crash, and costs a memcached request per commit.",
							&MemcachedBatchDelay, 10, 0, MAX_BATCH_DELAY_MS,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	/* read once per session, at its first use: see topology/node.c */
	DefineCustomIntVariable("sharded_seq.node_id",
							"This primary's node id among several: its part of every sequence's values and its own counter rows; 0 is a single node.",
							"Node n > 0 hands out values n * 2^53 + 0 .. 2^53-1 and writes counter rows n * 1024 + 0 .. 1023.  Sessions started after a change use the new id.",
							&NodeIdSetting, 0, 0, SHARDED_SEQ_MAX_NODE,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	/*
	 * It sizes shared memory, so it is fixed at server start; a library
	 * loaded later may not define such a setting.  It then stands in at
	 * reload level, so that a postgresql.conf that still sets it after the
	 * library left shared_preload_libraries draws no warning.
	 */
	DefineCustomIntVariable("sharded_seq.buffered_slots",
							"Counters that can hold increments in shared memory at once (mode 'buffered').",
							"When three quarters of the slots are taken, a commit adds to the counter's rows instead, as in mode 'exact'.  Takes effect only with sharded_seq in shared_preload_libraries.",
							&BufferedSlots, 4096, 16, 1048576,
							process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.shared_totals",
							"Counter totals shared memory keeps for every session (0: none).",
							"A session meeting a counter for the first time reads a total another session kept instead of its rows; each costs 64 bytes.  Takes effect only with sharded_seq in shared_preload_libraries.",
							&SharedTotals, 65536, 0, 16777216,
							process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.node_cache_sequences",
							"Sequences whose current block shared memory holds for every session (cache 'node'); 0 turns the node cache off.",
							"A sequence that finds no room draws a block per session.  Each costs about 600 bytes.  Takes effect only with sharded_seq in shared_preload_libraries.",
							&NodeCacheSequences, 1024, 0, 1048576,
							process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							0, NULL, NULL, NULL);
#ifdef SHARDED_SEQ_WAIT_POINTS
	/* test builds only: t/node_cache.pl starts entries near the wrap of block numbers */
	DefineCustomIntVariable("sharded_seq.test_node_first_block",
							"Test builds: the block number every node cache entry starts at.",
							NULL,
							&NodeCacheFirstBlock, 0, 0, 16777215,
							process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							NULL, NULL, NULL);
#endif
	MarkGUCPrefixReserved("sharded_seq");
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = AddRangeHint;
	if (process_shared_preload_libraries_in_progress)
	{
		prev_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = ShmemRequest;
		prev_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = ShmemStartup;
		WorkerRegister();
		WorkerUtilityInit();
	}
	CatalogInit();
	RegistryInit();
	CounterInit();
}
