/*
 * engine.c
 *	  The sequence engine: sharded_nextval and sharded_currval.
 *
 * Each backend keeps, per sequence, the configuration it last loaded and the
 * block of values it reserved.  When preloaded, a database-tier sequence
 * with cache 'node' draws from the node-wide cache instead (node_cache.c):
 * one block shared by every session of the server.  A block is reserved by
 * advancing a shard, a native sequence, with nextval_internal(): that is
 * WAL-logged and never rolled back.  The WAL that covers the reservation is
 * flushed before any value of the block is returned, so no crash can hand a
 * value out twice; with synchronous standbys, they confirm it first as well
 * (topology/replication.c), so no failover to one of them can either.
 *
 * Everything here counts in local positions.  On node n > 0 (topology/node.c) the
 * value handed out is n * 2^53 + local; the session's node is fixed, so
 * local order is value order, and currval and the floor below which a lease
 * must not take a session (S2) stay local.
 *
 * A session draws each generation in one way, per session or from the node,
 * except that it moves from the node to blocks of its own when it must (the
 * node cache is full, or would not confirm a block with the standbys).
 * Every block of a node-cached sequence, the node's or a session's, is
 * reserved under one lock from the shard whose next block comes first, so
 * each lies above every block reserved before it: a session that moves from
 * the node to blocks of its own stays above what the node handed it (S2).
 * A change of cache starts a new generation.
 *
 * A memcached-tier sequence has one shard, so the blocks it carves increase
 * in the order they are carved.  Each block is a lease that memcached hands
 * out in batches (one increment per batch, never one per value): the
 * database carves, memcached dispenses.  A lease that is missing, used up or
 * unreadable is replaced by one session under an advisory lock while the
 * others wait, and never recreated at an old value.  When memcached cannot
 * be reached, the session carves a block for itself, as the database tier
 * does; both come from the same reservations, so they never overlap.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "sequence/sequence_internal.h"

typedef struct SeqEntry
{
	CacheEntry	cache;			/* name, first: the hash key */

	/* configuration, valid while loaded_epoch == ConfigEpoch */
	uint64		loaded_epoch;
	Oid			config_relid;	/* which installation of the extension */
	int32		id;
	int32		generation;
	int64		base;
	int32		shards;
	int32		block;
	int32		shard;			/* this session's shard */
	Oid			shard_relid;
	bool		memcached;		/* tier 'memcached' */
	bool		cache_node;		/* cache 'node' */
	bool		positions_unknown;	/* arrived by replication: refused */
	bool		gen_uncommitted;	/* generation made by this transaction */
	bool		config_read;	/* read from the tables, not from the
								 * directory: shard and shard_relid are set */
	Oid			owner;
	Acl		   *acl;			/* in CacheEntryContext, or NULL */
	Oid			checked_user;	/* user whose USAGE was checked, or 0 */
	uint64		checked_epoch;	/* PrivilegeEpoch of that check */

	/* this session's block: next .. block_end, from block_generation */
	bool		have_block;
	int32		block_generation;
	int64		block_base;		/* base of that generation */
	int64		next;
	int64		block_end;
	int64		uncounted;		/* values handed out from blocks of our own,
								 * not yet in STAT_SESSION_VALUES */

	/* for sharded_currval, and the floor for later values */
	bool		last_valid;
	int64		last;

	/* memcached tier: the lease this session last drew from */
	bool		lease_valid;
	int64		lease_start;

	/* the node cache */
	bool		node_attached;
	NodeRef		node;
	int32		session_gen;	/* drew blocks of its own in this generation */
} SeqEntry;

/*
 * What a session must remember of a sequence its cache dropped: the value
 * sharded_currval returns, which is also the floor below which a memcached
 * lease must not take this session (S2).  PostgreSQL's own currval keeps as
 * much per sequence used.
 */
typedef struct SeqLast
{
	Oid			config_relid;	/* hash key: installation and sequence id */
	int32		id;
	int64		last;
} SeqLast;

static HTAB *SeqLasts = NULL;

static ObjectCache SeqCache;

/*
 * Values a session hands out from its own blocks are counted in the shared
 * stats when the block ends, the entry goes, or the session exits: one
 * count a block, not a shared write a value.
 */
static void
CountSessionValues(SeqEntry *entry)
{
	if (entry->uncounted > 0)
		StatsCount(KIND_SEQUENCE, entry->id, STAT_SESSION_VALUES, entry->uncounted);
	entry->uncounted = 0;
}

static void
CountSessionValuesAtExit(int code, Datum arg)
{
	HASH_SEQ_STATUS status;
	SeqEntry   *entry;

	if (SeqCache.table == NULL)
		return;
	hash_seq_init(&status, SeqCache.table);
	while ((entry = hash_seq_search(&status)) != NULL)
		CountSessionValues(entry);
}

static void
EvictSequence(CacheEntry *e)
{
	SeqEntry   *entry = (SeqEntry *) e;

	CountSessionValues(entry);

	if (entry->acl)
		pfree(entry->acl);
	entry->acl = NULL;
	if (entry->last_valid)
	{
		SeqLast		key;
		SeqLast    *note;

		if (SeqLasts == NULL)
		{
			HASHCTL		ctl;

			ctl.keysize = offsetof(SeqLast, last);
			ctl.entrysize = sizeof(SeqLast);
			SeqLasts = hash_create("sharded_seq last values", 64, &ctl,
								   HASH_ELEM | HASH_BLOBS);
		}
		memset(&key, 0, sizeof(key));
		key.config_relid = entry->config_relid;
		key.id = entry->id;
		note = hash_search(SeqLasts, &key, HASH_ENTER, NULL);
		note->last = entry->last;
	}
}

/* A reloaded entry takes back what its evicted predecessor handed out. */
static void
RestoreLast(SeqEntry *entry)
{
	SeqLast		key;
	SeqLast    *note;

	if (SeqLasts == NULL)
		return;
	memset(&key, 0, sizeof(key));
	key.config_relid = entry->config_relid;
	key.id = entry->id;
	note = hash_search(SeqLasts, &key, HASH_FIND, NULL);
	if (note)
	{
		entry->last = note->last;
		entry->last_valid = true;
		hash_search(SeqLasts, &key, HASH_REMOVE, NULL);
	}
}

static ObjectCache SeqCache = {
	"sharded_seq sequences", KIND_SEQUENCE, sizeof(SeqEntry), EvictSequence
};

static uint32 SessionSalt = 0;

/* Another object under this name (or the first): forget this session's past. */
static void
TakeObject(SeqEntry *entry, Oid config_relid, int32 id)
{
	if (id == entry->id && config_relid == entry->config_relid)
		return;
	entry->have_block = false;
	entry->last_valid = false;
	entry->lease_valid = false;
	entry->node_attached = false;
	entry->session_gen = 0;
	entry->config_relid = config_relid;
	entry->id = id;
	RestoreLast(entry);
}

/*
 * Offer a configuration just read to the directory (directory.c), if it is
 * one a session may draw by without reading the tables: a node-cached
 * database-tier sequence with nothing uncommitted of ours in it, the
 * marking triggers in place (ConfigWatched) and this server not stopped by a
 * cutover, both as a snapshot taken after the config word was seen settled
 * at word sees them.
 */
static void
OfferToDirectory(SeqEntry *entry, uint64 word, Snapshot snapshot)
{
	SequenceCopy copy;

	if (!entry->cache_node || entry->memcached || entry->positions_unknown ||
		entry->gen_uncommitted || TransactionIdIsValid(GetTopTransactionIdIfAny()) ||
		!NodeCacheEnabled())
		return;
	if (entry->acl && VARSIZE(entry->acl) > DIRECTORY_ACL_BYTES)
		return;
	if (!ConfigWatched(snapshot))
		return;
	if (CutoverStopsStored() && CutoverRowFor(CutoverSystemText(), NULL))
		return;
	memset(&copy, 0, offsetof(SequenceCopy, acl));
	copy.config_relid = entry->config_relid;
	copy.id = entry->id;
	copy.generation = entry->generation;
	copy.base = entry->base;
	copy.shards = entry->shards;
	copy.block = entry->block;
	copy.owner = entry->owner;
	copy.acl_len = entry->acl ? VARSIZE(entry->acl) : 0;
	if (entry->acl)
		memcpy(copy.acl, entry->acl, copy.acl_len);
	DirectoryPublish(entry->cache.name, &copy, word);
}

/*
 * Take name's configuration from the directory, when it holds a current
 * copy and this transaction changed nothing (its own changes are not in the
 * copy).  The shards are left unread: a reservation reads the tables again.
 */
static bool
TakeFromDirectory(SeqEntry *entry)
{
	SequenceCopy copy;
	uint64		epoch;

	if (TransactionIdIsValid(GetTopTransactionIdIfAny()))
		return false;
	AcceptInvalidationMessages();
	epoch = ConfigEpoch;
	if (!DirectoryFind(entry->cache.name, &copy))
		return false;
	RegistryNoteUse();
	TakeObject(entry, copy.config_relid, copy.id);
	entry->generation = copy.generation;
	entry->base = copy.base;
	entry->shards = copy.shards;
	entry->block = copy.block;
	entry->owner = copy.owner;
	if (entry->acl)
		pfree(entry->acl);
	entry->acl = NULL;
	if (copy.acl_len > 0)
	{
		entry->acl = MemoryContextAlloc(CacheEntryContext(), copy.acl_len);
		memcpy(entry->acl, copy.acl, copy.acl_len);
	}
	entry->memcached = false;
	entry->cache_node = true;
	entry->positions_unknown = false;
	entry->gen_uncommitted = false;
	entry->config_read = false;
	if (entry->generation != entry->block_generation)
		entry->lease_valid = false;
	entry->checked_user = InvalidOid;
	entry->loaded_epoch = epoch;
	/* the copy was made while no cutover stopped this server, and still holds */
	CutoverNoteNotStopped(epoch);
	elog(DEBUG1, "sharded_seq: configuration of sharded sequence \"%s\" taken from the directory",
		 entry->cache.name);
	return true;
}

/*
 * Read name's configuration from the tables with the latest snapshot; false
 * if it is gone.  The rows are read straight from the tables through their
 * indexes (no SQL is planned); the extension's own code reads its own
 * tables, so no privilege applies.
 */
static bool
ReadSequenceConfig(SeqEntry *entry)
{
	ConfigPlaces *places;
	bool		found = false;
	uint64		epoch;
	uint64		word = 0;
	bool		settled;
	Snapshot	snapshot;
	Relation	config;
	Relation	shards_rel;
	SysScanDesc scan;
	ScanKeyData key[2];
	HeapTuple	tup;

	/* the extension is used here (BeginAsOwner notes it elsewhere) */
	RegistryNoteUse();

	/*
	 * The epoch is read before the snapshot is taken.  A change that commits
	 * after that point is not in the snapshot, but its invalidation moves the
	 * epoch on, so this load is never taken for current.
	 */
	config = table_open(ConfigRelid("sequence_config"), AccessShareLock);
	shards_rel = table_open(ConfigRelid("sequence_shards"), AccessShareLock);
	places = SequenceConfigPlaces(config, shards_rel);
	AcceptInvalidationMessages();
	epoch = ConfigEpoch;
	settled = ConfigWordSettled(&word);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	/* a change may commit here, after the snapshot (specs/config_race) */
	WAIT_POINT("sequence-config-read");

	ScanKeyEntryInitialize(&key[0], 0, places->c_name, BTEqualStrategyNumber, InvalidOid,
						   TupleDescAttr(RelationGetDescr(config), places->c_name - 1)->attcollation,
						   F_TEXTEQ, CStringGetTextDatum(entry->cache.name));
	scan = systable_beginscan(config, places->by_name, OidIsValid(places->by_name),
							  snapshot, 1, key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		TupleDesc	desc = RelationGetDescr(config);
		bool		isnull;
		int32		id = DatumGetInt32(heap_getattr(tup, places->c_id, desc, &isnull));
		Datum		acl;
		Oid		   *relids;
		int			nrelids = 0;
		TransactionId shards_xmin = InvalidTransactionId;
		SysScanDesc shard_scan;
		HeapTuple	shard_tup;

		TakeObject(entry, places->config, id);
		entry->generation = DatumGetInt32(heap_getattr(tup, places->c_generation, desc, &isnull));
		entry->base = DatumGetInt64(heap_getattr(tup, places->c_base, desc, &isnull));
		entry->shards = DatumGetInt32(heap_getattr(tup, places->c_shards, desc, &isnull));
		entry->block = DatumGetInt32(heap_getattr(tup, places->c_block, desc, &isnull));
		entry->owner = DatumGetObjectId(heap_getattr(tup, places->c_owner, desc, &isnull));
		if (entry->acl)
			pfree(entry->acl);
		acl = heap_getattr(tup, places->c_acl, desc, &isnull);
		entry->acl = CopyAcl(acl, isnull, CacheEntryContext());
		entry->memcached = TextColumnIs(tup, places->c_tier, desc, "memcached");
		/* schema 1.4 has no cache column: every sequence draws per session */
		entry->cache_node = places->c_cache != InvalidAttrNumber &&
			TextColumnIs(tup, places->c_cache, desc, "node");
		/* its configuration arrived by replication (1.5: cutover()) */
		entry->positions_unknown = places->c_unknown != InvalidAttrNumber &&
			DatumGetBool(heap_getattr(tup, places->c_unknown, desc, &isnull)) && !isnull;

		/* the generation's shards, in shard order */
		relids = palloc(sizeof(Oid) * Max(entry->shards, 1));
		ScanKeyInit(&key[0], places->s_seq_id, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(id));
		ScanKeyInit(&key[1], places->s_generation, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(entry->generation));
		shard_scan = systable_beginscan(shards_rel, places->by_generation,
										OidIsValid(places->by_generation), snapshot, 2, key);
		while (HeapTupleIsValid(shard_tup = systable_getnext(shard_scan)))
		{
			TupleDesc	sdesc = RelationGetDescr(shards_rel);
			int32		shard = DatumGetInt32(heap_getattr(shard_tup, places->s_shard, sdesc, &isnull));

			if (nrelids == 0)
				shards_xmin = HeapTupleHeaderGetRawXmin(shard_tup->t_data);
			if (shard >= 0 && shard < entry->shards)
				relids[shard] = DatumGetObjectId(heap_getattr(shard_tup, places->s_relid, sdesc, &isnull));
			nrelids++;
		}
		systable_endscan(shard_scan);
		if (nrelids == 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("sharded sequence \"%s\" has no shards", entry->cache.name),
					 errdetail("Its rows in sharded_seq.sequence_shards are missing."),
					 errhint("Drop it with sharded_seq.drop_sequence('%s') and create it again above the highest value in use (start => ...).",
							 entry->cache.name)));
		if (nrelids != entry->shards)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("sharded sequence \"%s\" has %d shards, expected %d",
							entry->cache.name, nrelids, entry->shards),
					 errhint("Drop it with sharded_seq.drop_sequence('%s') and create it again above the highest value in use (start => ...).",
							 entry->cache.name)));
		entry->gen_uncommitted = TransactionIdIsCurrentTransactionId(shards_xmin);
		entry->shard = (int32) ((SessionSalt + (uint32) id) % (uint32) entry->shards);
		entry->shard_relid = relids[entry->shard];
		pfree(relids);
		if (entry->generation != entry->block_generation)
			entry->lease_valid = false;
		entry->checked_user = InvalidOid;
		entry->config_read = true;
		found = true;
	}
	systable_endscan(scan);
	table_close(shards_rel, AccessShareLock);
	table_close(config, AccessShareLock);
	if (found && settled)
		OfferToDirectory(entry, word, snapshot);
	UnregisterSnapshot(snapshot);
	/* a name that is gone is looked up again at every call */
	entry->loaded_epoch = found ? epoch : 0;
	return found;
}

/* Load name's configuration, from the directory if it can; false if it is gone. */
static bool
LoadSequenceConfig(SeqEntry *entry)
{
	return TakeFromDirectory(entry) || ReadSequenceConfig(entry);
}

/* Load entry's configuration; a Citus worker may take it from the coordinator first. */
static bool
LoadOrPullSequence(SeqEntry *entry)
{
	return LoadSequenceConfig(entry) ||
		(ClusterPull(KIND_SEQUENCE, entry->cache.name) && LoadSequenceConfig(entry));
}

/* inline: every draw looks its sequence up, and most find it at once */
static pg_attribute_always_inline SeqEntry *
LookupSequence(FunctionCallInfo fcinfo)
{
	bool		is_new;
	SeqEntry   *entry = (SeqEntry *) CallSiteEntry(fcinfo, &SeqCache, &is_new);

	if (SessionSalt == 0)
		SessionSalt = murmurhash32((uint32) MyProcPid ^ (uint32) MyStartTime) | 1;
	if (is_new && !LoadOrPullSequence(entry))
	{
		char		name[NAMEDATALEN];

		strlcpy(name, entry->cache.name, sizeof(name));
		ForgetEntry(&SeqCache, &entry->cache);
		ReportNotFound(KIND_SEQUENCE, name);
	}

	/* See administrative changes committed by other sessions at once. */
	AcceptConfigChanges();
	if (entry->loaded_epoch != ConfigEpoch && !LoadOrPullSequence(entry))
		ReportNotFound(KIND_SEQUENCE, entry->cache.name);
	if (entry->checked_user != GetUserId() || entry->checked_epoch != PrivilegeEpoch)
	{
		CheckPrivilege(KIND_SEQUENCE, entry->cache.name, entry->owner, entry->acl, ACL_USAGE);
		entry->checked_user = GetUserId();
		entry->checked_epoch = PrivilegeEpoch;
	}
	return entry;
}

/*
 * Are this sequence's blocks reserved in the node cache's order (see the
 * top of this file)?  A generation this transaction made is drawn by this
 * session alone, from its own shard, until it commits.
 */
static bool
InNodeOrder(SeqEntry *entry)
{
	return entry->cache_node && !entry->memcached && !entry->gen_uncommitted &&
		NodeCacheEnabled();
}

/*
 * Reserve the next block of this session's shard, durably (on the
 * synchronous standbys too, when they are in force), and return its first
 * and last values.  A node-cached sequence's blocks are all reserved under
 * its reservation lock, from the shard whose next block comes first (see
 * the top of this file).
 */
static void
CarveBlock(SeqEntry *entry, int64 *first, int64 *last)
{
	Oid			config_relid = ConfigRelid("sequence_config");
	int32		locked_id;
	volatile int64 k = 0;
	CarveSpec	spec;
	volatile int32 shard = entry->shard;
	volatile Oid shard_relid = entry->shard_relid;
	int32		ordered_id = entry->id;
	bool		ordered = InNodeOrder(entry);

	if (ordered)
		NodeCacheLockReservations(ordered_id);
	PG_TRY();
	{
		/*
		 * Hold the sequence's draw lock while reserving: a layout change takes
		 * it exclusively from reading the shards' high-water marks until it
		 * commits.  Taking the lock also reads pending invalidations, so if our
		 * layout is still current now, no change can slip in before we reserve.
		 */
		for (;;)
		{
			locked_id = entry->id;
			LockDatabaseObject(config_relid, locked_id, 0, ShareLock);
			if (entry->loaded_epoch == ConfigEpoch && entry->config_read)
				break;
			UnlockDatabaseObject(config_relid, locked_id, 0, ShareLock);
			if (!ReadSequenceConfig(entry))
				ReportNotFound(KIND_SEQUENCE, entry->cache.name);
		}
		/* current now: a cutover's mark or stop cannot slip in before we reserve */
		if (entry->positions_unknown)
			PositionsUnknownError(entry->cache.name);
		CutoverStopCheck();
		shard = entry->shard;
		shard_relid = entry->shard_relid;
		if (ordered && InNodeOrder(entry) && entry->id == ordered_id)
		{
			int32		lowest;

			shard_relid = LowestNextShard(entry->id, entry->generation, entry->shards, &lowest);
			shard = lowest;
		}
		k = nextval_internal(shard_relid, false);
		UnlockDatabaseObject(config_relid, locked_id, 0, ShareLock);
	}
	PG_FINALLY();
	{
		if (ordered)
			NodeCacheUnlockReservations(ordered_id);
	}
	PG_END_TRY();

	spec.id = entry->id;
	spec.name = entry->cache.name;
	spec.base = entry->base;
	spec.shards = entry->shards;
	spec.block = entry->block;
	spec.generation = entry->generation;
	spec.own_generation = entry->gen_uncommitted;
	spec.quiet_end = false;
	(void) CarveFinish(&spec, k, shard, shard_relid, first, last);
}

static void
UseRange(SeqEntry *entry, int64 first, int64 last)
{
	static bool exit_counting = false;

	if (!exit_counting)
	{
		before_shmem_exit(CountSessionValuesAtExit, (Datum) 0);
		exit_counting = true;
	}
	CountSessionValues(entry);
	entry->next = first;
	entry->block_end = last;
	entry->block_generation = entry->generation;
	entry->block_base = entry->base;
	entry->have_block = true;
}

/* Does this session hold a block of the generation in force? */
static bool
BlockCurrent(SeqEntry *entry)
{
	return entry->have_block && entry->block_generation == entry->generation &&
		entry->block_base == entry->base;
}

/*
 * Database tier, and the memcached tier's fallback: a block of our own.  The
 * session keeps to blocks of its own for the rest of the generation.
 */
static void
DrawBlock(SeqEntry *entry)
{
	int64		first;
	int64		last;

	CarveBlock(entry, &first, &last);
	UseRange(entry, first, last);
	entry->session_gen = entry->generation;
}

/* Does this session draw this sequence from the node cache? */
static bool
UsesNodeCache(SeqEntry *entry)
{
	return InNodeOrder(entry) && entry->session_gen != entry->generation;
}

/*
 * Draw from the node cache into *local.  False when this session must draw
 * per session instead (the cache is full, cannot confirm a block with the
 * standbys, or the value would not be above this session's last).
 */
static bool
DrawFromNode(SeqEntry *entry, int64 *local)
{
	for (int attempt = 0; attempt < 3; attempt++)
	{
		int32		value_gen;
		NodeDrawResult r;

		if (!entry->node_attached)
		{
			if (!NodeCacheAttach(entry->config_relid, entry->id, &entry->node))
			{
				StatsCount(KIND_SEQUENCE, entry->id, STAT_NODE_FULL, 1);
				return false;
			}
			entry->node_attached = true;
		}
		r = NodeCacheDraw(&entry->node, entry->generation, local, &value_gen);
		if (r == NODE_STALE)
		{
			entry->node_attached = false;
			continue;
		}
		if (r != NODE_GOT)
			return false;
		/* never below our last (S2): a block of our own lies above it */
		if (entry->last_valid && *local <= entry->last)
			return false;
		return true;
	}
	return false;
}

static char *
LeaseKey(SeqEntry *entry)
{
	/* the timeline keeps leases apart across a failover */
	return McKey("seq:%d:g%d:t%u:cur", entry->id, entry->generation,
				 (unsigned) GetWALInsertionTimeLine());
}

static char *
LeaseCounterKey(SeqEntry *entry, int64 start)
{
	return McKey("seq:%d:g%d:t%u:L" INT64_FORMAT, entry->id, entry->generation,
				 (unsigned) GetWALInsertionTimeLine(), start);
}

/* Can this session use the lease starting at start? */
static bool
LeaseUsable(SeqEntry *entry, int64 start)
{
	int64		end;

	if (start < entry->base)
		return false;
	if (pg_add_s64_overflow(start, (int64) entry->block - 1, &end))
		end = PG_INT64_MAX;
	return !entry->last_valid || end > entry->last;
}

/*
 * Replace the lease that starts at broken (or none) under the sequence's
 * rebuild lock.  If another session replaced it while we waited, use its
 * lease; otherwise carve a new one and publish it.  Returns false if
 * memcached cannot take it, with the carved block kept for this session.
 */
static bool
RebuildLease(SeqEntry *entry, bool have_broken, int64 broken)
{
	LOCKTAG		tag;
	volatile bool published = false;

	/* session-level, so that a long transaction does not keep holding it */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, SHARDED_SEQ_LOCK_CLASS, (uint32) entry->id, 2);
	(void) LockAcquire(&tag, ExclusiveLock, true, false);
	PG_TRY();
	{
		int64		current;
		McResult	r = McGet(LeaseKey(entry), &current);

		if (r == MC_OK && (!have_broken || current != broken) && LeaseUsable(entry, current))
		{
			entry->lease_start = current;
			entry->lease_valid = true;
			published = true;
		}
		else if (r != MC_DOWN)
		{
			int64		first;
			int64		last;

			McResult	added;

			CarveBlock(entry, &first, &last);
			/* the counter first, then the pointer to it */
			added = McAdd(LeaseCounterKey(entry, first), 0, 0);
			if (added == MC_OK)
			{
				McResult	set = McSet(LeaseKey(entry), first, 0);

				if (set == MC_DOWN)
					UseRange(entry, first, last);	/* nothing was sent: ours alone */
				else
				{
					/*
					 * Published, or perhaps published (a timeout): others may
					 * draw from it, so this session draws from it only through
					 * memcached's counter as well, never directly.
					 */
					entry->lease_start = first;
					entry->lease_valid = true;
					published = true;
					if (set == MC_OK)
						StatsCount(KIND_SEQUENCE, entry->id, STAT_REBUILDS, 1);
					else
						StatsCount(KIND_SEQUENCE, entry->id, STAT_ERRORS, 1);
				}
			}
			else if (added == MC_DOWN || added == MC_UNKNOWN)
				UseRange(entry, first, last);	/* no pointer names it: ours alone */
			else
				StatsCount(KIND_SEQUENCE, entry->id, STAT_ERRORS, 1);	/* a stale key: nobody uses it */
		}
	}
	PG_FINALLY();
	{
		LockRelease(&tag, ExclusiveLock, true);
	}
	PG_END_TRY();
	return published;
}

/*
 * Take a batch of values from the memcached lease into this session's block.
 * Returns false if memcached cannot serve; the caller then carves a block.
 */
static bool
DrawFromMemcached(SeqEntry *entry)
{
	uint64		batch = Max(1, Min(entry->block / 100, 10000));

	for (int attempt = 0; attempt < 4; attempt++)
	{
		uint64		n;
		int64		end;
		int64		first;
		McResult	r;

		if (!entry->lease_valid)
		{
			int64		current = 0;

			r = McGet(LeaseKey(entry), &current);
			if (r == MC_DOWN)
				return false;
			if (r == MC_OK && LeaseUsable(entry, current))
			{
				entry->lease_start = current;
				entry->lease_valid = true;
			}
			else
			{
				/* missing, unreadable or behind us: never reuse, replace */
				if (!RebuildLease(entry, r == MC_OK, current))
					return BlockCurrent(entry);
				continue;
			}
		}

		r = McIncr(LeaseCounterKey(entry, entry->lease_start), batch, &n);
		if (r == MC_DOWN)
			return false;
		if (pg_add_s64_overflow(entry->lease_start, (int64) entry->block - 1, &end))
			end = PG_INT64_MAX;
		if (r == MC_OK && n >= batch && n - batch < (uint64) entry->block)
		{
			int64		hi = Min(end, entry->lease_start + (int64) n - 1);

			first = entry->lease_start + (int64) (n - batch);
			/*
			 * Never below what we handed out (S2).  Defence in depth: a
			 * lease is usable only if it ends above our last value, and a
			 * counter's batches only increase, so no known path gets here.
			 */
			if (entry->last_valid && first <= entry->last)
				first = entry->last + 1;
			if (first <= hi)
			{
				UseRange(entry, first, hi);
				StatsCount(KIND_SEQUENCE, entry->id, STAT_HITS, 1);
				return true;
			}
			if (hi < end)
				continue;		/* a batch we had passed already: take another */
		}
		else if (r != MC_OK)
			StatsCount(KIND_SEQUENCE, entry->id, STAT_ERRORS, 1);
		/* used up, lost or unreadable: replace it */
		entry->lease_valid = false;
		if (!RebuildLease(entry, true, entry->lease_start))
			return BlockCurrent(entry);
	}
	return false;
}

PG_FUNCTION_INFO_V1(sharded_nextval);
Datum
sharded_nextval(PG_FUNCTION_ARGS)
{
	SeqEntry   *entry;
	DrawPlace	place;
	int64		local;
	int64		value;

	/* their own tests first: two calls into the server saved on every draw */
	if (unlikely(XactReadOnly))
		PreventCommandIfReadOnly("sharded_nextval()");
	if (unlikely(IsInParallelMode()))
		PreventCommandIfParallelMode("sharded_nextval()");

	entry = LookupSequence(fcinfo);
	/* a cutover: this server has not seen the reservations */
	if (entry->positions_unknown)
		PositionsUnknownError(entry->cache.name);
	/* more than one server: may this session draw, and on which node? */
	TopologyBeforeDraw(&place);
	if (!BlockCurrent(entry))
	{
		entry->have_block = false;
		if (UsesNodeCache(entry) && DrawFromNode(entry, &local))
		{
			/* a node cache value: one outside the node's range is refused, and a gap */
			value = DrawPlaceValue(&place, local, entry->cache.name);
			goto done;
		}
		/* a generation this transaction made is never published in memcached */
		if (!entry->memcached || entry->gen_uncommitted)
			DrawBlock(entry);
		else if (!McEnabled() || !DrawFromMemcached(entry))
		{
			if (McEnabled())
				StatsCount(KIND_SEQUENCE, entry->id, STAT_FALLBACKS, 1);
			if (!entry->have_block)
				DrawBlock(entry);
		}
	}

	/* never at or below what this session handed out (S2) */
	while (entry->last_valid && entry->next <= entry->last)
	{
		if (entry->block_end > entry->last)
			entry->next = entry->last + 1;
		else
			DrawBlock(entry);
	}

	/* the node's value first: one outside its range is refused, not used up */
	local = entry->next;
	value = DrawPlaceValue(&place, local, entry->cache.name);
	if (local == entry->block_end)
		entry->have_block = false;
	else
		entry->next++;
	entry->uncounted++;

done:
	entry->last = local;
	entry->last_valid = true;
	PG_RETURN_INT64(value);
}

PG_FUNCTION_INFO_V1(sharded_currval);
Datum
sharded_currval(PG_FUNCTION_ARGS)
{
	SeqEntry   *entry = LookupSequence(fcinfo);

	if (!entry->last_valid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_currval of sequence \"%s\" is not yet defined in this session",
						entry->cache.name),
				 errhint("Call sharded_nextval('%s') in this session first.", entry->cache.name)));
	PG_RETURN_INT64(SequenceNodeValue(entry->last, entry->cache.name));
}
