/*
 * layout.c
 *	  Layout words: shared memory that tells a session whether the shard rows
 *	  it remembers for a counter are still all of its rows, so that a total it
 *	  kept (kept.c, sums.c) still holds.  Also the net epoch and the
 *	  foreign-rows flag, which switch keeping off.
 *
 * Layout words: for each bucket of counters, a change count (high bits) and
 * the transactions changing a layout now (low bits).  A transaction that
 * inserts or deletes shard rows adds to both before it does, and at its end
 * adds to the count and takes itself out.  A reader that saw a settled word
 * (nobody changing) and then took a snapshot has every row; while the word
 * stays the same, remembered rows are still all the rows.  A prepared
 * transaction takes itself out at PREPARE: its changes stay invisible (its
 * xid is still running) until COMMIT PREPARED, which marks every word.
 *
 * The rule kept totals stand on (sums.c: KeepRows, TotalHolds): every write
 * of a counter's shard rows marks its layout word before the write can be
 * seen, and keeps it "changing" until the writing transaction has ended.  A
 * kept total holds only while its word has not moved.
 *
 * Writers, and how each marks:
 *   - the engine: every write of a shard row, by the heap or by SQL, goes
 *     through ShardWrite (rows.c), which calls LayoutChanging first;
 *   - every other row write (by hand, logical replication's apply worker, a
 *     data-only restore, an owner's function run by REFRESH or an index
 *     expression): the ALWAYS trigger rows_changed_elsewhere (rows.c) marks
 *     the row's counter, a TRUNCATE every counter;
 *   - COMMIT/ROLLBACK PREPARED: every word (the worker's utility hook,
 *     src/worker/hooks.c), since the words of a prepared transaction from
 *     before a restart are gone.
 * What can hide a write from those marks is a command on the shard table
 * (DISABLE TRIGGER, DROP TRIGGER, TRUNCATE, VACUUM FULL, CLUSTER, ALTER
 * EXTENSION UPDATE; a data-only restore disables the triggers): the utility
 * hook marks every word before such a command runs, "changing" until its
 * transaction ends (ChangesOwnTable, common/catalog.c), and
 * LayoutChangingAll moves net_epoch.  KeepRows keeps nothing unless the
 * trigger is in place as a snapshot taken after the epoch was read sees it
 * (ShardsNetHolds, sums.c).  Not covered: a superuser's DML on pg_trigger
 * itself, which no command announces.
 * Exceptions, where no total is kept at all: no shared memory (not
 * preloaded), a standby (replay marks nothing), SERIALIZABLE, a node id or
 * another node's rows, foreign rows written (NoteForeignRows).
 *
 * Lock-free: words and flags are atomics; Changing is this backend's own.
 */
#include "postgres.h"

#include "access/xlog.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "utils/memutils.h"

#include "counter/counter_internal.h"

#define LAYOUT_BUCKETS		4096
#define LAYOUT_CHANGING_BITS 20
#define LAYOUT_CHANGING_MASK ((UINT64CONST(1) << LAYOUT_CHANGING_BITS) - 1)
#define LAYOUT_COUNT_ONE	(UINT64CONST(1) << LAYOUT_CHANGING_BITS)

typedef struct LayoutShared
{
	pg_atomic_uint32 foreign_rows;	/* shard rows were written outside the engine */
	pg_atomic_uint64 net_epoch;	/* moved by anything that may hide a row write */
	pg_atomic_uint64 layout[LAYOUT_BUCKETS];
} LayoutShared;

static LayoutShared *Words = NULL;

Size
LayoutShmemSize(void)
{
	return sizeof(LayoutShared);
}

void
LayoutShmemInit(void)
{
	bool		found;

	Words = ShmemInitStruct("sharded_seq layout words", sizeof(LayoutShared), &found);
	if (!found)
	{
		pg_atomic_init_u32(&Words->foreign_rows, 0);
		pg_atomic_init_u64(&Words->net_epoch, 0);
		for (int i = 0; i < LAYOUT_BUCKETS; i++)
			pg_atomic_init_u64(&Words->layout[i], 0);
	}
}

/*
 * Buckets this transaction marked changing, in TopMemoryContext.  Kept for
 * the next transaction up to CHANGING_KEEP; a larger array (LayoutChangingAll
 * lists every bucket) is freed when its transaction ends.
 */
static pg_atomic_uint64 **Changing = NULL;
static int	NChanging = 0;
static int	ChangingSize = 0;
static bool ChangingAll = false;	/* every bucket: moves net_epoch at the end */

#define CHANGING_KEEP 64

static pg_atomic_uint64 *
LayoutBucket(int32 counter_id)
{
	uint32		h = CounterKeyHash(MyDatabaseId, ConfigRelid("counter_config"), counter_id);

	return &Words->layout[h % LAYOUT_BUCKETS];
}

/*
 * Are there layout words to keep totals by?  Not without shared memory, nor
 * on a standby: WAL replay changes rows without marking any word.
 */
bool
LayoutWordsAvailable(void)
{
	return Words != NULL && !RecoveryInProgress();
}

/* The counter's layout word, or LAYOUT_UNKNOWN where there are none. */
uint64
LayoutWord(int32 counter_id)
{
	if (!LayoutWordsAvailable())
		return LAYOUT_UNKNOWN;
	return pg_atomic_read_u64(LayoutBucket(counter_id));
}

/* Is nobody changing the layouts of that word's counters? */
bool
LayoutSettled(uint64 word)
{
	return word != LAYOUT_UNKNOWN && (word & LAYOUT_CHANGING_MASK) == 0;
}

/* Before inserting or deleting a counter's shard rows in this transaction. */
void
LayoutChanging(int32 counter_id)
{
	pg_atomic_uint64 *bucket;

	if (Words == NULL)
		return;
	bucket = LayoutBucket(counter_id);
	for (int i = 0; i < NChanging; i++)
		if (Changing[i] == bucket)
			return;
	/* room first: the end of the transaction must find every bucket */
	if (NChanging == ChangingSize)
	{
		int			size = Max(16, ChangingSize * 2);

		Changing = Changing
			? repalloc(Changing, size * sizeof(pg_atomic_uint64 *))
			: MemoryContextAlloc(TopMemoryContext, size * sizeof(pg_atomic_uint64 *));
		ChangingSize = size;
	}
	Changing[NChanging++] = bucket;
	pg_atomic_fetch_add_u64(bucket, LAYOUT_COUNT_ONE + 1);
}

/*
 * Mark every word changing until this transaction ends, as a change to
 * every counter would: before COMMIT PREPARED or ROLLBACK PREPARED (the
 * prepared transaction may come from before a restart, when no word knew of
 * it), and when this transaction changes what the shard table is (see the
 * rule above).
 */
void
LayoutChangingAll(void)
{
	if (Words == NULL)
		return;
	if (ChangingSize < NChanging + LAYOUT_BUCKETS)
	{
		int			size = NChanging + LAYOUT_BUCKETS;

		Changing = Changing
			? repalloc(Changing, size * sizeof(pg_atomic_uint64 *))
			: MemoryContextAlloc(TopMemoryContext, size * sizeof(pg_atomic_uint64 *));
		ChangingSize = size;
	}
	if (!ChangingAll)
	{
		for (int i = 0; i < LAYOUT_BUCKETS; i++)
		{
			bool		listed = false;

			for (int j = 0; j < NChanging && !listed; j++)
				listed = Changing[j] == &Words->layout[i];
			if (listed)
				continue;
			Changing[NChanging++] = &Words->layout[i];
			pg_atomic_fetch_add_u64(&Words->layout[i], LAYOUT_COUNT_ONE + 1);
		}
		ChangingAll = true;
	}
	pg_atomic_fetch_add_u64(&Words->net_epoch, 1);
}

/* At the end of the transaction (after its commit is visible), or at PREPARE. */
void
LayoutXactEnd(void)
{
	for (int i = 0; i < NChanging; i++)
		pg_atomic_fetch_add_u64(Changing[i], LAYOUT_COUNT_ONE - 1);
	NChanging = 0;
	if (ChangingAll)
		pg_atomic_fetch_add_u64(&Words->net_epoch, 1);
	ChangingAll = false;
	if (ChangingSize > CHANGING_KEEP)
	{
		pfree(Changing);
		Changing = NULL;
		ChangingSize = 0;
	}
}

/* What ShardsNetHolds' answer is good for; read before the word. */
uint64
ShardsNetEpoch(void)
{
	if (Words == NULL)
		return 0;
	return pg_atomic_read_u64(&Words->net_epoch);
}

/*
 * Rows of counter_shards written outside the engine (replication, by hand):
 * remembered row places are no longer trusted, for the server's life.  Set
 * before such a change can be seen; without shared memory, each session
 * relies on the relcache invalidation that comes with it.
 */
void
NoteForeignRows(void)
{
	if (Words != NULL)
		pg_atomic_write_u32(&Words->foreign_rows, 1);
}

bool
ForeignRowsSeen(void)
{
	return Words != NULL && pg_atomic_read_u32(&Words->foreign_rows) != 0;
}
