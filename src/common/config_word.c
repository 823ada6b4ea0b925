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
 * written to sequence_config, by anyone (its ALWAYS trigger
 * sequence_arrived: SQL by hand, logical replication's apply worker, a
 * restore's COPY); and the utility hook (worker/hooks.c) before a command
 * that may hide such a write or replace the tables (ChangesOwnTable,
 * catalog.c), COPY into a table of ours, and COMMIT PREPARED.  A copy is
 * made only while that trigger is in place (sequence/directory.c), and
 * never on a standby: replay marks nothing.  Not covered: a row DELETEd by
 * hand (the trigger fires on INSERT and UPDATE), seen when the word next
 * moves, as sessions that cached the row see it at their next relcache
 * invalidation.
 *
 * Lock-free: the word is an atomic; Changing is this backend's own.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/shmem.h"

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
