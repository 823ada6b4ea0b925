/*
 * topology.h
 *	  The door of src/topology/: what exists because there is more than one
 *	  server.  Node ids and their claims, a Citus cluster (its groups,
 *	  administration carried to every node, peer connections), cutover stops,
 *	  and synchronous standbys.  Sits on src/common/; the engines ask it a few
 *	  questions (README.md): before a draw (TopologyBeforeDraw), before an
 *	  increment (TopologyBeforeIncrement), after an administrative call
 *	  (ClusterAdminRecord), and the other nodes' part of a counter
 *	  (ClusterSumElsewhere).
 */
#ifndef SHARDED_SEQ_TOPOLOGY_H
#define SHARDED_SEQ_TOPOLOGY_H

#include "common/common.h"

/*
 * Node ids (sharded_seq.node_id): node n > 0 hands out sequence values
 * n * 2^53 + local (local < 2^53) and writes counter rows n * 1024 + s.
 */
#define SHARDED_SEQ_MAX_NODE	1023
#define NODE_VALUE_BITS			53
#define NODE_SHARDS				1024

/* the setting of topology (module.c registers it) */
extern int	NodeIdSetting;

/*
 * The questions the engines ask (topology.c)
 *
 * Before a draw: may this session hand out a value (no cutover stopped this
 * server; its node's claim is this system's), and on which node.  The
 * answer, a DrawPlace, also maps a local position to the value handed out
 * (DrawPlaceValue).  A node 0 session's answer is remembered per ConfigEpoch:
 * every fact behind it (a cutover stop, the Citus group) moves ConfigEpoch
 * when it changes.
 */
typedef struct DrawPlace
{
	int32		node;			/* this session's node id */
	bool		ranged;			/* its values are held to its range */
	uint64		epoch;			/* ConfigEpoch when answered */
} DrawPlace;

typedef struct DrawMemoData
{
	uint64		epoch;			/* ConfigEpoch of a node 0 answer; 0: none */
	bool		ranged;
} DrawMemoData;

extern DrawMemoData DrawMemo;
extern void TopologyBeforeDrawSlow(DrawPlace *place);
extern int64 DrawPlaceValueSlow(DrawPlace *place, int64 local, const char *seqname);

static inline void
TopologyBeforeDraw(DrawPlace *place)
{
	if (likely(DrawMemo.epoch == ConfigEpoch))
	{
		place->node = 0;
		place->ranged = DrawMemo.ranged;
		place->epoch = DrawMemo.epoch;
		return;
	}
	TopologyBeforeDrawSlow(place);
}

/*
 * The value handed out for local position local: local itself on a single
 * server's node 0.  A value outside the node's range is refused.
 */
static inline int64
DrawPlaceValue(DrawPlace *place, int64 local, const char *seqname)
{
	if (likely(!place->ranged && place->epoch == ConfigEpoch))
		return local;
	return DrawPlaceValueSlow(place, local, seqname);
}

/* Before an increment: may this session's commit write this node's rows? */
extern void TopologyBeforeIncrement(void);

/* citus.c: a Citus cluster, administration carried to every node */
extern int32 CitusGroup(void);
extern void ClusterAdminRecord(FunctionCallInfo fcinfo, ObjectKind kind,
							   const char *op);
extern void ClusterRefuseOnWorker(const char *what);
extern void ClusterCallOnGroup(int32 group, const char *call);
extern int32 ClusterWorkerGroup(const char *name, int32 port);
extern char *ClusterQueryGroup(int32 group, const char *command);
extern bool ClusterPull(ObjectKind kind, const char *name);
extern bool ClusterWritesReplicatedTable(void);
extern void ClusterRoleRenamed(const char *oldname, const char *newname);

/* peers.c: kept connections to the other nodes of a Citus cluster */
extern int128 ClusterSumElsewhere(const char *query, const char *arg);

/* cutover.c: a server stopped by a cutover (cutover_stops) */
extern bool CutoverStopsStored(void);
extern char *CutoverSystemText(void);
extern bool CutoverRowFor(const char *system, XLogRecPtr *flushed);
extern bool CutoverStopped(void);
extern void CutoverNoteNotStopped(uint64 epoch);
extern void CutoverStopCheck(void);
extern void CutoverCounterCheck(void);
extern void CutoverCheckPrivilege(const char *function);
extern void CutoverRecordDone(Oid subid);
extern void WaitForTransactionsInFlight(void);

/* node.c: node ids for several primaries, and their claims */
extern int32 SessionNodeId(void);
extern bool NodeRanged(int32 node);
extern int32 SessionNodeRanged(bool *ranged);
extern void NodeIdForget(void);
extern int32 NextObjectId(void);
extern void AdvanceObjectIds(void);
extern void NodeClaimCheck(void);
extern int32 NodeShardBase(void);
extern int64 SequenceNodeValue(int64 local, const char *seqname);
extern int64 NodeLocalMax(void);
extern int64 SequenceNodeLocal(int64 value, bool above, const char *seqname,
							   const char *what);

/* replication.c: synchronous standbys */
extern void WaitForSyncStandbys(XLogRecPtr lsn, const char *seqname);
extern bool SyncStandbysActive(void);
extern bool ReservationConfirmedHere(void);
extern uint32 SyncStampSlow(void);
extern const volatile uint8 *SyncStatusByte;
extern uint8 SyncNoneStatus;

/*
 * The synchronous replication state a node cache block is confirmed under (0:
 * no synchronous standby in force).  Every node cache draw asks: the common
 * answer is one byte of shared memory.
 */
static inline bool
SyncStandbysNone(void)
{
	/* false until SyncStampSlow has run once: then it is known */
	return SyncStatusByte != NULL && *SyncStatusByte == SyncNoneStatus;
}

static inline uint32
SyncStamp(void)
{
	if (likely(SyncStandbysNone()))
		return 0;
	return SyncStampSlow();
}

#endif							/* SHARDED_SEQ_TOPOLOGY_H */
