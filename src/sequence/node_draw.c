/*
 * node_draw.c
 *	  The node cache's draw: a ticket of the entry's state with one atomic
 *	  add (state = (block number << 40) | offset), block j's slot read
 *	  seqlock-style (a ticket whose slot moved on is a gap, never a wrong
 *	  value), a used-up block moved on from or reserved (node_reserve.c), the
 *	  low-water mark's prefetch, and runs: a transaction that draws alone in
 *	  bulk adds 16 at a time and hands the tickets out while the state stays
 *	  where its add left it.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/proc.h"

#include "sequence/node_cache.h"

/* ---- drawing ---- */

/*
 * Block j was found used up (ticket off >= count).  Move the state on to
 * the next block if it is published; otherwise reserve it, or wait for the
 * reservation in flight.
 */
static pg_noinline ReserveResult
MoveOn(NodeRef *ref, uint64 j, int64 count, bool *waited)
{
	NodeEntry  *e = ref->entry;

	for (;;)
	{
		uint64		cur = pg_atomic_read_u64(&e->state);

		if ((cur >> OFF_BITS) != j)
			return RESERVED_RETRY;
		if (pg_atomic_read_u64(&e->published) != j)
		{
			if (pg_atomic_compare_exchange_u64(&e->state, &cur, NextBlock(j) << OFF_BITS))
			{
				StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_HITS, count);
				return RESERVED_RETRY;
			}
			continue;
		}
		/* a whole block went before its successor came: ask earlier from now on */
		if (count > 0 && pg_atomic_read_u32(&e->eager) == 0)
			pg_atomic_write_u32(&e->eager, 1);
		return Reserve(ref, RESERVE_REFILL, j, 0, 0, false, waited);
	}
}

/*
 * The drawer that crosses the low-water mark of block j asks for block j+1:
 * from the database's worker if one runs (and no synchronous standby must
 * confirm it: the worker must not wait for one at shutdown), else it
 * reserves it itself, unless a reservation is already in flight.  The mark
 * is half the block, or its start once draws outran a prefetch (eager); an
 * eager entry whose block is still missing at half the block has the
 * drawer there reserve it.  A session that crossed the previous block's mark
 * too draws alone and fast: it reserves itself, as a session of its own
 * blocks would, since waking the worker once a block costs it more (a
 * signal, and the worker's turn on a core).
 */
static pg_noinline void
Prefetch(NodeRef *ref, uint64 j, int64 off, int64 count)
{
	NodeEntry  *e = ref->entry;
	bool		waited = false;
	bool		eager = pg_atomic_read_u32(&e->eager) != 0;
	bool		alone;

	if (off != (eager ? 0 : count / 2) && !(eager && off == count / 2))
		return;
	if (pg_atomic_read_u64(&e->published) != j)
		return;
	alone = ref->next_mark == j + 1;
	ref->next_mark = NextBlock(j) + 1;
	if (!alone && off == (eager ? 0 : count / 2) && !SyncStandbysActive())
	{
		pg_atomic_write_u32(&e->prefetch_wanted, 1);
		if (RegistryPrefetchNews())
			return;
		pg_atomic_write_u32(&e->prefetch_wanted, 0);
	}
	(void) Reserve(ref, RESERVE_PREFETCH, j, 0, 0, true, &waited);
}

/* ---- runs: a transaction that draws alone ---- */

#define RUN_AFTER		16		/* adds in a row, in one transaction, that found the state where ours left it */
#define RUN_LENGTH		16		/* tickets a run takes: at most RUN_LENGTH - 1 become a gap */
#define RUN_SLOTS		4		/* runs a session holds at once (sequences drawn in turn) */

/*
 * A run: tickets of one block that a transaction drawing alone took with one
 * add.  It hands them out without an atomic operation while the state is
 * still the one its add left (end).  Any other draw, a move to the next
 * block, a new generation or a resync moves the state, and so ends the run;
 * its rest is a gap.  Values keep draw order across sessions: a draw from
 * the run reads the state before the next add of anybody, and that add
 * gets a ticket at or above end.  Runs are for a transaction that draws in
 * bulk: only one that drew alone RUN_AFTER times takes them, and its end
 * gives the rest back if nobody drew since (so does the session's exit), so
 * sessions that draw now and then leave no gap.
 */
typedef struct NodeRun
{
	NodeEntry  *entry;			/* NULL: a free slot */
	uint64		incarnation;	/* of the ref that took it: 0 when free */
	uint64		next;			/* the next ticket (as a state) */
	uint64		stop;			/* tickets up to here lie in the block */
	uint64		end;			/* the state the run's add left */
	int64		value;			/* next's value */
	int32		generation;
} NodeRun;

static NodeRun Runs[RUN_SLOTS];
static uint32 NextRunSlot = 0;
static bool RunsCallbacksSet = false;

/* Give a run's rest back, if nobody drew since it was taken; free the slot. */
static void
GiveBack(NodeRun *run)
{
	uint64		end = run->end;

	if (run->entry != NULL && run->next != run->end &&
		pg_atomic_read_u64(&run->entry->incarnation) == run->incarnation)
		(void) pg_atomic_compare_exchange_u64(&run->entry->state, &end, run->next);
	memset(run, 0, sizeof(NodeRun));
}

static void
GiveBackRuns(int code, Datum arg)
{
	for (int i = 0; i < RUN_SLOTS; i++)
		GiveBack(&Runs[i]);
}

static void
GiveBackAtXactEnd(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE)
		GiveBackRuns(0, (Datum) 0);
}

/*
 * The add that left old + n handed out ticket old, of block blk: keep the
 * tickets after it that lie in the block as the ref's run.  A run that
 * holds the block's low-water mark asks for the next block now: another
 * session's draw may end the run before the mark is handed out.
 */
static pg_noinline void
TakeRun(NodeRef *ref, uint64 old, uint64 n, NodeBlock *blk)
{
	int64		off = (int64) (old & OFF_MASK);
	uint64		in_block = Min(n, (uint64) (blk->count - off));
	NodeRun    *run = &Runs[ref->run % RUN_SLOTS];

	if (in_block <= 1)
		return;
	if (!RunsCallbacksSet)
	{
		RegisterXactCallback(GiveBackAtXactEnd, NULL);
		before_shmem_exit(GiveBackRuns, (Datum) 0);
		RunsCallbacksSet = true;
	}
	if (run->incarnation != ref->incarnation)
	{
		/* the slot holds another sequence's run, perhaps: take the next one */
		ref->run = NextRunSlot++ % RUN_SLOTS;
		run = &Runs[ref->run];
		GiveBack(run);
	}
	run->entry = ref->entry;
	run->incarnation = ref->incarnation;
	run->next = old + 1;
	run->stop = old + in_block;
	run->end = old + n;
	run->value = blk->first + off + 1;
	run->generation = blk->generation;
	if (off < blk->count / 2 && blk->count / 2 < off + (int64) in_block)
		Prefetch(ref, old >> OFF_BITS, blk->count / 2, blk->count);
}

/* whether this draw waited for a reservation: not on the stack, so the hot path keeps none */
static bool DrawWaited;

/*
 * Draw with a ticket of the state: one add, or RUN_LENGTH of them (a run)
 * for a transaction whose last RUN_AFTER adds found nobody had drawn since.
 */
static pg_noinline NodeDrawResult
DrawTicket(NodeRef *ref, int32 generation, int64 *local, int32 *value_gen)
{
	NodeEntry  *e = ref->entry;
	NodeDrawResult result = NODE_FALLBACK;
	uint32		stamp = SyncStamp();
	int			resyncs = 0;

	DrawWaited = false;

	for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++)
	{
		uint64		old;
		uint64		j;
		int64		off;
		NodeBlock	blk;
		ReserveResult r = RESERVED_RETRY;

		if (pg_atomic_read_u64(&e->incarnation) != ref->incarnation)
		{
			result = NODE_STALE;
			break;
		}
		if ((int32) pg_atomic_read_u32(&e->generation) < generation)
		{
			old = pg_atomic_read_u64(&e->state);
			r = Reserve(ref, RESERVE_RESET, old >> OFF_BITS, generation, 0, false, &DrawWaited);
		}
		else
		{
			uint64		n;

			if (ref->lone_in != MyLocalTransactionId())
			{
				ref->lone = 0;
				ref->lone_in = MyLocalTransactionId();
			}
			/* a run is drawn from only while no synchronous standby is in force */
			n = ref->lone >= RUN_AFTER && SyncStandbysNone() ? RUN_LENGTH : 1;
			old = pg_atomic_fetch_add_u64(&e->state, n);
			if (old != ref->after)
				ref->lone = 0;
			else if (ref->lone < RUN_AFTER)
				ref->lone++;
			ref->after = old + n;
			j = old >> OFF_BITS;
			off = (int64) (old & OFF_MASK);
			switch (ReadSlot(e, j, ref->incarnation, &blk))
			{
				case SLOT_MOVED:
					continue;	/* a stale ticket: a gap */
				case SLOT_OTHER:
					r = RESERVED_STALE;
					break;
				case SLOT_OK:
					if (off < blk.count && stamp != 0 && blk.sync != stamp)
					{
						/* S1 across a failover: only a block the standbys in force confirmed */
						if (++resyncs > MAX_RESYNCS)
							goto done;
						r = Reserve(ref, RESERVE_RESYNC, j, 0, stamp, false, &DrawWaited);
					}
					else if (off < blk.count)
					{
						*local = blk.first + off;
						*value_gen = blk.generation;
						if (n > 1)
							TakeRun(ref, old, n, &blk);
						if (off == 0 || off == blk.count / 2)
							Prefetch(ref, j, off, blk.count);
						result = NODE_GOT;
						goto done;
					}
					r = MoveOn(ref, j, blk.count, &DrawWaited);
					break;
			}
		}
		if (r == RESERVED_STALE)
		{
			result = NODE_STALE;
			break;
		}
		if (r == RESERVED_FALLBACK)
			break;
	}
done:
	if (DrawWaited)
		StatsCount(KIND_SEQUENCE, e->key.id, STAT_NODE_WAITS, 1);
	return result;
}

/*
 * Draw a value from the node cache.  generation is the one the caller's
 * configuration has in force: an older one cached here is left at once.
 * NODE_GOT: *local (of generation *value_gen) is the caller's.  NODE_STALE:
 * the entry is no longer this sequence's; attach again.  NODE_FALLBACK:
 * draw per session.  The ref's run first: the state read before the rest,
 * as a ticket would be taken.
 */
NodeDrawResult
NodeCacheDraw(NodeRef *ref, int32 generation, int64 *local, int32 *value_gen)
{
	NodeRun    *run = &Runs[ref->run];
	NodeEntry  *e = ref->entry;

	/* tail calls only: the common path saves no register */
	if (run->next != run->stop && run->incarnation == ref->incarnation &&
		pg_atomic_read_u64(&e->state) == run->end)
	{
		pg_read_barrier();
		if (pg_atomic_read_u64(&e->incarnation) == ref->incarnation &&
			(int32) pg_atomic_read_u32(&e->generation) >= generation &&
			SyncStandbysNone())
		{
			*local = run->value++;
			*value_gen = run->generation;
			run->next++;
			/* the state stays: tell the sweep this entry is in use */
			pg_atomic_write_u32(&e->run_drawn, 1);
			return NODE_GOT;
		}
	}
	return DrawTicket(ref, generation, local, value_gen);
}

