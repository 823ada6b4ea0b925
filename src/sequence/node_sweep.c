/*
 * node_sweep.c
 *	  The node cache's sweep: freeing an entry (no session finds it again,
 *	  none uses its blocks: its incarnation moves on), and finding an entry
 *	  to give a new sequence, a free one or one nobody drew from since the
 *	  sweep last passed.  Values handed out from a freed entry's current
 *	  block are counted once the lock is let go (CountLeft).
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "utils/hsearch.h"

#include "sequence/node_cache.h"

static void
NoteCurrentBlock(NodeEntry *e, LeftCount *left)
{
	uint64		state = pg_atomic_read_u64(&e->state);
	NodeBlock  *slot = &e->ring[(state >> OFF_BITS) % NODE_RING];

	left->dbid = e->key.dbid;
	left->id = e->key.id;
	left->used = 0;
	if (pg_atomic_read_u64(&slot->blockno) == (state >> OFF_BITS) && slot->count > 0)
		left->used = UsedOf(state, slot->count);
}

void
CountLeft(LeftCount *left)
{
	if (OidIsValid(left->dbid) && left->used > 0)
		StatsCountIn(left->dbid, KIND_SEQUENCE, left->id, STAT_NODE_HITS, left->used);
}

/* Free an entry: no session finds it again, and none uses its blocks.  Lock held. */
void
FreeEntry(NodeEntry *e, LeftCount *left)
{
	bool		found;

	NoteCurrentBlock(e, left);
	hash_search(NodeHash, &e->key, HASH_REMOVE, &found);
	pg_atomic_write_u64(&e->incarnation,
						pg_atomic_fetch_add_u64(&NodeShared->next_incarnation, 1));
	e->key.dbid = InvalidOid;
	NodeShared->nfree++;
}

/*
 * An entry to give a new sequence: a free one, or one nobody drew from since
 * the sweep last passed it (the sweep notes each entry's state as it
 * passes, and a draw from a run, which leaves the state, marks run_drawn),
 * and that has no reservation in flight.  NULL if none.  Lock held
 * exclusively.
 */
NodeEntry *
FindVictim(LeftCount *left)
{
	for (int32 n = 0; n < NodeShared->nentries; n++)
	{
		NodeEntry  *e = EntryAt(NodeShared->hand);
		uint64		state = pg_atomic_read_u64(&e->state);

		NodeShared->hand = (NodeShared->hand + 1) % NodeShared->nentries;
		if (pg_atomic_read_u32(&e->reserving) != 0)
			continue;
		if (e->key.dbid == InvalidOid)
			return e;
		if (state == e->swept_state && pg_atomic_read_u32(&e->run_drawn) == 0)
		{
			FreeEntry(e, left);
			return e;
		}
		e->swept_state = state;
		pg_atomic_write_u32(&e->run_drawn, 0);
	}
	return NULL;
}

