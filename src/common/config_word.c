/*
 * config_word.c
 *	  The config word: shared memory that tells a session whether a copy of
 *	  configuration kept in shared memory (the sequence directory,
 *	  sequence/directory.c) is still what the tables hold.
 *
 * One word: a change count (high bits) and the transactions changing
 * configuration now (low bits).  A transaction that may change a
 * configuration row adds to both before its change can be seen, and takes
 * itself out when it ends (after its commit is visible), or at PREPARE (a
 * prepared transaction's changes stay invisible until COMMIT PREPARED, which
 * marks again).  A copy made from a snapshot taken after the word was seen
 * settled (nobody changing) holds while the word has not moved.
 *
 * Who marks (ConfigChanging): every announcement of a change
 * (AnnounceConfigChange, catalog.c: the administrative functions); every row
 * written to sequence_config, sequence_shards and cutover_stops and every
 * TRUNCATE of them, by anyone (their ALWAYS triggers sequence_arrived and
 * config_changed: SQL by hand, logical replication's apply worker, a
 * restore), which also send a relcache invalidation; and the utility hook
 * (worker/hooks.c) before a command that may hide such a write or replace
 * the tables or their trigger functions (ChangesSequenceConfig, catalog.c),
 * and COMMIT PREPARED.  A copy is made or kept only while those triggers are
 * in place (ConfigWatched), and never on a standby: replay marks nothing.
 *
 * Lock-free: the word is an atomic; Changing is this backend's own.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/inval.h"
#include "utils/snapmgr.h"

#include "common/common.h"

#define WORD_CHANGING_BITS	20
#define WORD_CHANGING_MASK	((UINT64CONST(1) << WORD_CHANGING_BITS) - 1)
#define WORD_COUNT_ONE		(UINT64CONST(1) << WORD_CHANGING_BITS)

static pg_atomic_uint64 *Word = NULL;
static bool Changing = false;	/* this transaction counts among the changing */

Size
ConfigWordShmemSize(void)
{
	return sizeof(pg_atomic_uint64);
}

void
ConfigWordShmemInit(void)
{
	bool		found;

	Word = ShmemInitStruct("sharded_seq config word", sizeof(pg_atomic_uint64), &found);
	if (!found)
		pg_atomic_init_u64(Word, 0);
}

static void
StopChanging(void)
{
	if (!Changing)
		return;
	pg_atomic_fetch_sub_u64(Word, 1);
	Changing = false;
}

static void
ConfigWordXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			StopChanging();
			break;
		default:
			break;
	}
}

static void
ConfigWordAtExit(int code, Datum arg)
{
	StopChanging();
}

/*
 * This transaction may change configuration: every copy made before is
 * stale, and none is trusted or made until it ends.  Call it before the
 * change can be seen.  Once per transaction is enough: the word stays
 * unsettled until the transaction ends.
 */
void
ConfigChanging(void)
{
	static bool registered = false;

	if (Word == NULL)
		return;
	if (!registered)
	{
		RegisterXactCallback(ConfigWordXactCallback, NULL);
		before_shmem_exit(ConfigWordAtExit, (Datum) 0);
		registered = true;
	}
	if (Changing)
		return;
	pg_atomic_fetch_add_u64(Word, WORD_COUNT_ONE + 1);
	Changing = true;
}

/*
 * The word, if a copy may be made or trusted under it now: shared memory is
 * there, this is no standby, and nobody is changing configuration.
 */
bool
ConfigWordSettled(uint64 *word)
{
	uint64		w;

	if (Word == NULL || RecoveryInProgress())
		return false;
	w = pg_atomic_read_u64(Word);
	if ((w & WORD_CHANGING_MASK) != 0)
		return false;
	*word = w;
	return true;
}

/*
 * Are the triggers that mark every write of sequence configuration in
 * place, as snapshot sees pg_trigger (1.7)?  While they are, and the word
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

		if (!OidIsValid(relid))
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
