/*
 * config_word.c
 *	  The config word: shared memory that tells a session whether a copy of
 *	  configuration kept in shared memory (the sequence directory,
 *	  sequence/directory.c; the reads a reservation keeps, sequence/shards.c
 *	  and node_reserve.c) is still what the tables hold, and whether a draw
 *	  has any invalidation to take in (AcceptConfigChanges, with the roles
 *	  count beside the word).
 *
 * The word is a change count, and a lock says who is changing now.  A
 * transaction that may change configuration first takes the config lock in
 * share mode (a transaction-level advisory lock of database 0, so it is held
 * to the transaction's end: through PREPARE, across a restart, until COMMIT
 * or ROLLBACK PREPARED, by whoever runs it, the apply worker of a two-phase
 * subscription too; and released after the commit is visible and its
 * invalidations sent), then moves the count, before its change can be seen.
 * The word is settled when nobody holds the lock: a copy made from a
 * snapshot taken after the word was seen settled holds while the count has
 * not moved.
 *
 * Who marks (ConfigChanging): every announcement of a change
 * (AnnounceConfigChange, catalog.c: the administrative functions); every row
 * written to sequence_config, sequence_shards and cutover_stops and every
 * TRUNCATE of them, by anyone (their ALWAYS triggers sequence_arrived and
 * config_changed: SQL by hand, logical replication's apply worker, a
 * restore), which also send a relcache invalidation; and the utility hook
 * (worker/hooks.c) before a command that may hide such a write or replace
 * the tables or their trigger functions (ChangesSequenceConfig, catalog.c).
 * A copy is made or kept only while those triggers are in place
 * (ConfigWatched), and never on a standby: replay marks nothing.
 *
 * Lock order: the config lock is taken last, in share mode, and never
 * waited for in exclusive mode (ConfigWordSettled only tries it, and lets
 * it go at once).
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "common/common.h"
#include "common/compat.h"

#define CONFIG_LOCK_KEY		0x43464757	/* 'CFGW', with SHARDED_SEQ_LOCK_CLASS */

static pg_atomic_uint64 *Word = NULL;
static pg_atomic_uint64 *RolesWord = NULL;	/* role changes committed */

Size
ConfigWordShmemSize(void)
{
	return 2 * sizeof(pg_atomic_uint64);
}

void
ConfigWordShmemInit(void)
{
	bool		found;

	Word = ShmemInitStruct("sharded_seq config word", ConfigWordShmemSize(), &found);
	RolesWord = Word + 1;
	if (!found)
	{
		pg_atomic_init_u64(Word, 0);
		pg_atomic_init_u64(RolesWord, 0);
	}
}

static void
ConfigLockTag(LOCKTAG *tag)
{
	/* database 0: one word for the server, as the copies' keys carry the database */
	SET_LOCKTAG_ADVISORY(*tag, InvalidOid, SHARDED_SEQ_LOCK_CLASS, CONFIG_LOCK_KEY, 3);
}

/* the transaction of ours that marked last: its own changes are in its snapshots */
static LocalTransactionId Marked = InvalidLocalTransactionId;

/* the count this backend last found settled */
static bool VerifiedValid = false;
static uint64 Verified = 0;

/*
 * Where the lock was last found held: a draw asks at every call (through
 * AcceptConfigChanges), and a change left open must not make each of them
 * try the lock.
 */
static uint64 BusyAt = 0;
static LocalTransactionId BusyIn = InvalidLocalTransactionId;

/*
 * Tell every backend, at commit, that a config row changed; and every
 * session to come, through the config word, from now on.
 */
void
AnnounceConfigChange(const char *relname)
{
	ConfigChanging();
	CacheInvalidateRelcacheByRelid(ConfigRelid(relname));
}

/*
 * This transaction may change configuration: every copy made before is
 * stale, and none is trusted or made until it ends.  Call it before the
 * change can be seen.  The lock is taken at every call (held already, it
 * costs a local count), so that a change after a rolled-back savepoint,
 * which let go of the lock taken inside it, is still covered.
 */
void
ConfigChanging(void)
{
	LOCKTAG		tag;

	if (Word == NULL || !IsTransactionState())
		return;
	ConfigLockTag(&tag);
	(void) LockAcquire(&tag, ShareLock, false, false);
	/* after the lock: whoever sees the new count and then tries the lock fails */
	pg_atomic_fetch_add_u64(Word, 1);
	Marked = MyLocalTransactionId();
}

/*
 * The word, if a copy may be made or trusted under it now: shared memory is
 * there, this is no standby, this transaction changed nothing, and nobody
 * holds the config lock (no transaction that changed configuration is in
 * progress or prepared) between two reads of the count that agree.  Tries
 * the lock in exclusive mode without waiting, and lets it go at once.
 */
bool
ConfigWordSettled(uint64 *word)
{
	LOCKTAG		tag;
	uint64		before;
	uint64		after;

	if (Word == NULL || RecoveryInProgress() || !IsTransactionState() ||
		Marked == MyLocalTransactionId())
		return false;
	before = pg_atomic_read_u64(Word);

	/*
	 * Every change moves the count before it is made, so if the count is the
	 * one this backend last found settled (nobody held the lock: every change
	 * counted by then had ended), nothing changed since, and nothing is in
	 * flight that was not counted.
	 */
	if (VerifiedValid && before == Verified)
	{
		*word = before;
		return true;
	}
	/* found held at this count in this transaction: try again in the next one */
	if (BusyIn == MyLocalTransactionId() && BusyAt == before)
		return false;
	ConfigLockTag(&tag);
	if (LockAcquire(&tag, ExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
	{
		BusyAt = before;
		BusyIn = MyLocalTransactionId();
		return false;
	}
	LockRelease(&tag, ExclusiveLock, false);
	after = pg_atomic_read_u64(Word);
	if (after != before)
		return false;
	Verified = after;
	VerifiedValid = true;
	*word = after;
	return true;
}

/*
 * Take in the invalidations that other sessions committed, before a draw:
 * AcceptInvalidationMessages, skipped while nothing it could bring has
 * changed since this session last took them in.  For configuration, that
 * is while the word is settled at the count seen then (every committed
 * change moved the count, and sent its invalidations before letting go of
 * the config lock).  For privileges, while the roles count has not moved
 * (RolesChanging).  Other catalog changes arrive as PostgreSQL takes them
 * in: at the next transaction, or the next lock.  So the answer holds
 * across transactions: a new one's first draw takes in nothing the word
 * did not count (a transaction takes in what came before it at its start).
 * A transaction that marked the word takes them in at every draw.
 */
static uint64 AcceptedAt = 0;
static uint64 AcceptedRoles = 0;
static bool AcceptedSettled = false;

static pg_noinline void
AcceptConfigChangesNow(void)
{
	uint64		word = 0;
	bool		settled = ConfigWordSettled(&word);
	uint64		roles = RolesWord ? pg_atomic_read_u64(RolesWord) : 0;

	/* both read first: whatever they counted has sent its invalidations */
	AcceptInvalidationMessages();
	AcceptedAt = word;
	AcceptedRoles = roles;
	AcceptedSettled = settled;
}

void
AcceptConfigChanges(void)
{
	/* settled when taken in, and this transaction has marked nothing */
	if (AcceptedSettled && Marked != MyLocalTransactionId() &&
		pg_atomic_read_u64(Word) == AcceptedAt &&
		pg_atomic_read_u64(RolesWord) == AcceptedRoles)
		return;
	AcceptConfigChangesNow();
}

/*
 * A role command in this transaction (ChangesRoles, from the utility hook):
 * once it commits, and its invalidations are sent, move the roles count.
 * Resource owners let go of what they hold after the commit has sent its
 * invalidations, so the count moves then.  A prepared transaction moves it
 * again at its COMMIT PREPARED, which is a role command too.
 */
static bool RolesPending = false;

static void
RolesChanged(ResourceReleasePhase phase, bool isCommit, bool isTopLevel, void *arg)
{
	if (!RolesPending || !isTopLevel || phase != RESOURCE_RELEASE_AFTER_LOCKS)
		return;
	RolesPending = false;
	if (isCommit)
		pg_atomic_fetch_add_u64(RolesWord, 1);
}

void
RolesChanging(void)
{
	static bool registered = false;

	if (RolesWord == NULL)
		return;
	if (!registered)
	{
		RegisterResourceReleaseCallback(RolesChanged, NULL);
		registered = true;
	}
	RolesPending = true;
}

/*
 * Are the triggers that mark every write of sequence configuration in
 * place, as snapshot sees pg_trigger (1.7), on tables that inherit from
 * nothing?  While they are, and the word
 * has not moved, nothing in sequence_config, sequence_shards or
 * cutover_stops changed.
 */
bool
ConfigWatched(Snapshot snapshot)
{
	static const struct
	{
		const char *table;
		const char *function;
		int16		row_events;
		int16		stmt_events;
	}			watches[] =
	{
		{"sequence_config", "sequence_arrived", TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE, 0},
		{"sequence_config", "config_changed", TRIGGER_TYPE_DELETE, TRIGGER_TYPE_TRUNCATE},
		{"sequence_shards", "config_changed",
		TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_DELETE, TRIGGER_TYPE_TRUNCATE},
		{"cutover_stops", "config_changed",
		TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_DELETE, TRIGGER_TYPE_TRUNCATE},
	};

	for (int i = 0; i < lengthof(watches); i++)
	{
		Oid			relid = InstalledRelid(watches[i].table);
		int16		row;
		int16		stmt;

		/* a parent's ALTER TABLE could rewrite it behind its triggers */
		if (!OidIsValid(relid) || has_superclass(relid) || get_rel_relispartition(relid))
			return false;
		OwnTriggerEvents(relid, watches[i].function, snapshot, &row, &stmt);
		if ((row & watches[i].row_events) != watches[i].row_events ||
			(stmt & watches[i].stmt_events) != watches[i].stmt_events)
			return false;
	}
	return true;
}

/*
 * Fired by every row written to sequence_shards and cutover_stops, deleted
 * from sequence_config, and by a TRUNCATE of the three (1.7, ENABLE
 * ALWAYS): the change is marked, and this server's sessions are told at
 * commit.
 */
PG_FUNCTION_INFO_V1(config_changed);
Datum
config_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.config_changed() must be called as a trigger"),
				 errhint("It is fired by writes to the tables of sequence configuration; do not call it directly.")));
	ConfigChanging();
	CacheInvalidateRelcache(trigdata->tg_relation);
	return PointerGetDatum(NULL);
}
