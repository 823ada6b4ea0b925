/*
 * topology.c
 *	  The questions the engines ask the topology layer, each one call that
 *	  stands for every check more than one server needs: before a draw
 *	  (a cutover stop, the session's node, its claim, its range) and before
 *	  an increment (a write Citus repeats on every node, the claim, a cutover).
 *
 * A draw asks on every call, so a node 0 session's answer is remembered until
 * ConfigEpoch moves: a cutover stop written here or replicated here, and a
 * change of Citus group, each move it (README.md, "Invariants").  A node n > 0
 * session asks every time: its claim check takes in invalidations first.
 */
#include "postgres.h"

#include "access/xact.h"

#include "topology/topology.h"

/*
 * TopologyBeforeDraw, answered again: refuse on a server a cutover stopped,
 * find the session's node (and whether its values are held to a range), and
 * refuse unless this system holds the node's claim.
 */
void
TopologyBeforeDrawSlow(DrawPlace *place)
{
	uint64		epoch = ConfigEpoch;

	CutoverStopCheck();
	place->node = SessionNodeRanged(&place->ranged);
	if (place->node != 0)
		NodeClaimCheck();
	place->epoch = ConfigEpoch;
	/* node 0 claims nothing: its answer holds while ConfigEpoch stays */
	if (place->node == 0 && place->epoch == epoch && IsTransactionState())
	{
		DrawMemo.ranged = place->ranged;
		DrawMemo.epoch = epoch;
	}
}

/*
 * DrawPlaceValue off its fast path: a reservation since the answer saw
 * invalidations (perhaps this node just joined Citus), or the node's values
 * are held to its range.
 */
int64
DrawPlaceValueSlow(DrawPlace *place, int64 local, const char *seqname)
{
	if (place->epoch != ConfigEpoch)
		place->ranged = NodeRanged(place->node);
	return !place->ranged ? local : SequenceNodeValue(local, seqname);
}

/*
 * Before an increment: refuse one Citus would repeat on every node, one whose
 * commit would write rows of a node this system does not hold, and one on a
 * server a cutover stopped (or that awaits one).
 */
void
TopologyBeforeIncrement(void)
{
	if (ClusterWritesReplicatedTable())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("counter_incr in a write to a Citus reference table would count once per node"),
				 errdetail("Citus writes each row of a reference table (or of a table with several placements per shard) on every node that holds a copy, and a row trigger fires on each."),
				 errhint("Count in a trigger on a distributed table, or call counter_incr in the statement or function that writes the reference table.")));
	/* its commit writes this node's rows: refuse now if they are not ours */
	NodeClaimCheck();
	/* a cutover stopped this server, or one is awaited here */
	CutoverCounterCheck();
}
