/*
 * node.c
 *	  Node ids for several primaries (sharded_seq.node_id): which node this
 *	  session is, where that puts its sequence values and counter rows, the
 *	  node's claim in sharded_seq.node_claims, and replicated_tables().
 *
 * Node n > 0 hands out sequence values n * 2^53 + local, where local is
 * what the sequence machinery produces and stays below 2^53, and writes only
 * the counter rows numbered n * 1024 .. n * 1024 + 1023.  Node 0 is a single
 * node: today's values and rows 0 .. 1023.  A session takes its node id
 * once, at its first use of a sequence or counter, and keeps it, so its
 * values keep increasing (S2) across a reload that changes the setting.
 *
 * A node id is claimed, not trusted.  The first session of node n records
 * (n, system identifier, database) in node_claims, a table the replication
 * group publishes, and a node that finds n claimed by another system or
 * database refuses to draw values or write counter rows.  Servers that
 * claimed one id before they met both keep their claims, side by side (the
 * key is node id, system and database), and the earliest holds the id on
 * every node that has both (ClaimCompare).  Claims are read
 * directly, with a dirty snapshot, so that a claim another session is still
 * inserting counts and nobody waits for its transaction.  A session
 * remembers a committed claim of its own until configuration may have
 * changed (ConfigEpoch), so a check costs one index lookup, no SPI, at the
 * first use and after such a change, and nothing otherwise; a refusal is
 * not remembered, so deleting a stale claim takes effect at the next call.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "topology/topology.h"

/* node_claims' columns */
#define Anum_claim_node_id		1
#define Anum_claim_system		2
#define Anum_claim_database		3
#define Anum_claim_claimed_at	4

int			NodeIdSetting = 0;
static int	SessionNode = -1;	/* fixed at first use; -1 before */

/* TopologyBeforeDraw's answer on node 0 (topology.h), dropped with the node id */
DrawMemoData DrawMemo = {0, false};

static bool ClaimVerified = false;	/* our claim, committed, was seen ... */
static uint64 ClaimEpoch = 0;	/* ... under this ConfigEpoch */

/*
 * This session's first use: its node id from now on (SessionNodeId).  In a
 * Citus cluster, Citus group g is node g, whatever the setting, which may
 * only agree: the coordinator, group 0, is node 0, whose values are then
 * held to a range like any node's (NodeRanged).
 */
static pg_noinline int32
SessionNodeFirstUse(void)
{
	int32		group = CitusGroup();

	if (group < 0)
		SessionNode = NodeIdSetting;
	else if (group > SHARDED_SEQ_MAX_NODE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("Citus group %d has no sharded_seq node id", group),
				 errdetail("Citus group g is node id g, and node ids end at %d; Citus never gives a group id twice, so the groups past it can draw no sequence value and write no counter row.",
						   SHARDED_SEQ_MAX_NODE),
				 errhint("Draw values and increment counters on the coordinator or on a worker of a lower group.")));
	else if (NodeIdSetting != 0 && NodeIdSetting != group)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sharded_seq.node_id is %d, but this node is Citus group %d", NodeIdSetting, group),
				 errdetail("In a Citus cluster each node's node id is its Citus group, so that no two nodes draw one value."),
				 group == 0 ?
				 errhint("Remove the setting (ALTER SYSTEM RESET sharded_seq.node_id; SELECT pg_reload_conf(); then reconnect).") :
				 errhint("Remove the setting (ALTER SYSTEM RESET sharded_seq.node_id; SELECT pg_reload_conf(); then reconnect), or set it to %d.", group)));
	else
		SessionNode = group;
	return SessionNode;
}

static pg_noinline void
GroupChangedError(int32 group)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("this session took node id %d, but this node is now Citus group %d", SessionNode, group),
			 errdetail("The session began before this node joined the Citus cluster; its values could repeat another node's."),
			 errhint("Reconnect: a new session takes its node id from the Citus group.")));
}

/*
 * This session's node id: the setting as it was at its first use.  A
 * session that took it before its node joined a Citus cluster (or before
 * its group changed) is refused: it would draw from another node's range,
 * or from node 0's, which every such session on every node shares.
 */
int32
SessionNodeId(void)
{
	bool		ranged;

	return SessionNodeRanged(&ranged);
}

/*
 * Whether node's values are held to its range: every node but 0, and node
 * 0 too in a Citus cluster (the coordinator), where the workers' ranges
 * begin at 2^53.  A single server's node 0 hands out the whole bigint range.
 */
static inline bool
RangedFor(int32 node, int32 group)
{
	return node > 0 || group >= 0;
}

bool
NodeRanged(int32 node)
{
	return RangedFor(node, CitusGroup());
}

/*
 * SessionNodeRanged's answer, good while ConfigEpoch and the transaction
 * stay what they were (as CitusGroup's own memo is).
 */
typedef struct NodeMemo
{
	uint64		epoch;			/* ConfigEpoch when found */
	LocalTransactionId lxid;	/* the transaction it was found in */
	int32		node;
	bool		ranged;
} NodeMemo;

static NodeMemo SessionNodeMemo = {0, InvalidLocalTransactionId, 0, false};

/* SessionNodeRanged, found again: one look at the Citus group */
static pg_noinline int32
SessionNodeRangedSlow(bool *ranged)
{
	int32		group;

	if (SessionNode < 0)
	{
		(void) SessionNodeFirstUse();
		group = CitusGroup();
	}
	else if ((group = CitusGroup()) >= 0 && SessionNode != group)
		GroupChangedError(group);
	*ranged = RangedFor(SessionNode, group);
	SessionNodeMemo.epoch = ConfigEpoch;
	SessionNodeMemo.lxid = MyProc != NULL && IsTransactionState() ?
		MyLocalTransactionId() : InvalidLocalTransactionId;
	SessionNodeMemo.node = SessionNode;
	SessionNodeMemo.ranged = *ranged;
	return SessionNode;
}

/*
 * SessionNodeId, and whether its values are held to a range (NodeRanged):
 * every draw asks, so the answer found earlier in this transaction is kept
 * while no invalidation moved ConfigEpoch.
 */
int32
SessionNodeRanged(bool *ranged)
{
	if (likely(SessionNodeMemo.lxid != InvalidLocalTransactionId &&
			   SessionNodeMemo.epoch == ConfigEpoch && MyProc != NULL &&
			   SessionNodeMemo.lxid == MyLocalTransactionId()))
	{
		*ranged = SessionNodeMemo.ranged;
		return SessionNodeMemo.node;
	}
	return SessionNodeRangedSlow(ranged);
}

/*
 * Take the setting again at the next use.  Only for the background worker,
 * between rounds: it draws no sequence values, so no S2 to keep, and its
 * flushes must go to the rows of the node the server is now.
 */
void
NodeIdForget(void)
{
	SessionNode = -1;
	SessionNodeMemo.lxid = InvalidLocalTransactionId;
	DrawMemo.epoch = 0;
	ClaimVerified = false;
}

/* The lowest and highest value node hands out (NodeRanged). */
static void
NodeRange(int32 node, int64 *lo, int64 *hi)
{
	*lo = (int64) node << NODE_VALUE_BITS;
	*hi = *lo + (((int64) 1 << NODE_VALUE_BITS) - 1);
}

static char *
SystemIdentifierText(void)
{
	return psprintf(UINT64_FORMAT, GetSystemIdentifier());
}

typedef struct Claim
{
	bool		settled;		/* committed, and not by this transaction */
	char	   *system;
	char	   *database;
	TimestampTz claimed_at;
} Claim;

/* One claim of node_claims' tuple tup. */
static void
ClaimFromTuple(HeapTuple tup, TupleDesc desc, Claim *claim)
{
	bool		isnull;
	Datum		d;

	claim->system = TextDatumGetCString(heap_getattr(tup, Anum_claim_system, desc, &isnull));
	d = heap_getattr(tup, Anum_claim_database, desc, &isnull);
	claim->database = pstrdup(NameStr(*DatumGetName(d)));
	d = heap_getattr(tup, Anum_claim_claimed_at, desc, &isnull);
	claim->claimed_at = isnull ? 0 : DatumGetTimestampTz(d);
}

/*
 * Every claim of node (several systems may claim one id before they meet;
 * the table keeps them all), as snapshot sees them.  A dirty snapshot
 * counts a claim another transaction is inserting already (it may be
 * replication applying another system's), and reading waits for nobody.
 * Returns how many, in *claims (palloc'd).
 */
static int
ReadClaims(int32 node, Snapshot snapshot, Claim **claims)
{
	Relation	rel = table_open(ConfigRelid("node_claims"), AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	int			n = 0;
	int			size = 2;

	*claims = palloc(size * sizeof(Claim));
	/* node_id leads the primary key, in 1.3's (node_id) as in 1.4's */
	ScanKeyInit(&key, Anum_claim_node_id, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(node));
	scan = systable_beginscan(rel, ConfigRelid("node_claims_pkey"), true, snapshot, 1, &key);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		if (n == size)
			*claims = repalloc(*claims, (size *= 2) * sizeof(Claim));
		ClaimFromTuple(tup, RelationGetDescr(rel), &(*claims)[n]);
		(*claims)[n].settled = snapshot->snapshot_type == SNAPSHOT_DIRTY &&
			!TransactionIdIsValid(snapshot->xmin) &&
			!TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tup->t_data));
		n++;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return n;
}

/*
 * Which of two claims of one node id holds it: the earlier claimed_at, then
 * the lower system identifier (decimal text of a uint64: the shorter, then
 * bytewise, which is numeric order), then the lower database name
 * (bytewise).  Only stored values and no collation take part, so every node
 * that holds both claims picks the same one.
 */
static int
ClaimCompare(const Claim *a, const Claim *b)
{
	size_t		la = strlen(a->system);
	size_t		lb = strlen(b->system);
	int			c;

	if (a->claimed_at != b->claimed_at)
		return a->claimed_at < b->claimed_at ? -1 : 1;
	if (la != lb)
		return la < lb ? -1 : 1;
	if ((c = strcmp(a->system, b->system)) != 0)
		return c;
	return strcmp(a->database, b->database);
}

/* When claim was made, for messages (a copy: timestamptz_to_str's is static) */
static char *
ClaimTime(const Claim *claim)
{
	/* claimed_at is NOT NULL: 0 is 2000-01-01, a time like any other */
	return pstrdup(timestamptz_to_str(claim->claimed_at));
}

/* Record this system's claim of node (nothing if it holds one already). */
static void
InsertClaim(int32 node, const char *system, const char *database)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {INT4OID, TEXTOID, NAMEOID};
	Datum		args[3];
	OwnerContext ctx;
	uint64		inserted;

	args[0] = Int32GetDatum(node);
	args[1] = CStringGetTextDatum(system);
	args[2] = DirectFunctionCall1(namein, CStringGetDatum(database));
	BeginAsOwner(&ctx);
	/* no conflict target: the key is (node_id) in 1.3, three columns in 1.4 */
	PreparePlan(&plan,
				"INSERT INTO sharded_seq.node_claims (node_id, system_identifier, database)"
				" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
				3, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the claim of node %d", node);
	inserted = SPI_processed;
	EndAsOwner(&ctx);
	/* node 0 sessions stop trusting remembered row places (NodeRowsAlone) */
	if (inserted > 0)
		AnnounceConfigChange("node_claims");
	CommandCounterIncrement();
}

/*
 * Refuse to go on unless this system and database hold the claim of the
 * session's node: claiming it if nobody has, refusing if another system
 * holds it and this one does not, and, where claims of several systems
 * stand side by side (made before they met), refusing unless this one's
 * comes first (ClaimCompare).  Nothing to do on node 0.
 */
void
NodeClaimCheck(void)
{
	int32		node = SessionNodeId();
	char	   *system;
	const char *database;
	SnapshotData dirty;
	Claim	   *claims;
	Claim	   *mine = NULL;
	Claim	   *first = NULL;
	int			n;

	if (node == 0)
		return;
	/* a claim replicated here since the last check bumps ConfigEpoch */
	AcceptInvalidationMessages();
	/* a new installation of the extension, say, has none: look again */
	if (ClaimVerified && ClaimEpoch == ConfigEpoch)
		return;
	if (!NodeClaimsStored())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq.node_id needs version 1.3 of the extension's schema"),
				 errdetail("This server has sharded_seq.node_id = %d, and the claims of node ids came with 1.3.", node),
				 errhint("Run ALTER EXTENSION sharded_seq UPDATE, or set sharded_seq.node_id to 0.")));

	system = SystemIdentifierText();
	database = get_database_name(MyDatabaseId);
	InitDirtySnapshot(dirty);
	n = ReadClaims(node, &dirty, &claims);
	if (n == 0)
	{
		InsertClaim(node, system, database);
		InitDirtySnapshot(dirty);
		n = ReadClaims(node, &dirty, &claims);
	}
	/*
	 * The dirty snapshot may show two versions of one claim (an UPDATE in
	 * progress): this system's claim is the earliest of its own rows.
	 */
	for (int i = 0; i < n; i++)
	{
		if (strcmp(claims[i].system, system) == 0 && strcmp(claims[i].database, database) == 0 &&
			(mine == NULL || ClaimCompare(&claims[i], mine) < 0))
			mine = &claims[i];
		if (first == NULL || ClaimCompare(&claims[i], first) < 0)
			first = &claims[i];
	}
	if (first == NULL)
		elog(ERROR, "the claim of node %d vanished as it was made", node);
	if (mine == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq.node_id %d is claimed by system %s, database \"%s\", not by this one (system %s, database \"%s\")",
						node, first->system, first->database, system, database),
				 errdetail("Two primaries with one node id would hand out the same sequence values and write the same counter rows; the claim in sharded_seq.node_claims dates from %s.",
						   ClaimTime(first)),
				 errhint("Give this server a node id no other node uses (ALTER SYSTEM SET sharded_seq.node_id = ...; SELECT pg_reload_conf(); then reconnect), or, if that system is gone for good, delete its claim: DELETE FROM sharded_seq.node_claims WHERE node_id = %d AND system_identifier = '%s'.",
						 node, first->system)));
	if (first != mine)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq.node_id %d is claimed by system %s, database \"%s\", earlier than by this one (system %s, database \"%s\")",
						node, first->system, first->database, system, database),
				 errdetail("Two primaries with one node id would hand out the same sequence values and write the same counter rows; of the claims in sharded_seq.node_claims, the earliest holds the id on every node that has them: %s, against this one's %s.",
						   ClaimTime(first), ClaimTime(mine)),
				 errhint("Give this server a node id no other node uses (ALTER SYSTEM SET sharded_seq.node_id = ...; SELECT pg_reload_conf(); then reconnect) and delete this claim: DELETE FROM sharded_seq.node_claims WHERE node_id = %d AND system_identifier = '%s'; or, if system %s is gone for good, delete its claim instead.",
						 node, system, first->system)));
	/* a claim our transaction is still making may yet be rolled back */
	ClaimVerified = mine->settled;
	ClaimEpoch = ConfigEpoch;
}

/*
 * BEFORE INSERT on node_claims, fired by logical replication only (ENABLE
 * REPLICA): a claim this node holds already is skipped, not a duplicate key.
 * A subscription with origin = none and copy_data = true copies back the
 * subscriber's own claim when the publisher has it from the subscriber, as
 * it has when each of two servers that claimed before joining copies the
 * other's claims.  The row held here stays.
 */
PG_FUNCTION_INFO_V1(claim_received);
Datum
claim_received(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	Claim		incoming;
	Claim	   *held;
	bool		isnull;
	int			n;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) || !TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.claim_received() must be called as a BEFORE INSERT row trigger"),
				 errhint("It is fired by logical replication on sharded_seq.node_claims; do not call it directly.")));
	desc = RelationGetDescr(trigdata->tg_relation);
	ClaimFromTuple(trigdata->tg_trigtuple, desc, &incoming);
	/* committed claims, and those of this transaction (an earlier row of a copy) */
	n = ReadClaims(DatumGetInt32(heap_getattr(trigdata->tg_trigtuple, Anum_claim_node_id, desc, &isnull)),
				   SnapshotSelf, &held);
	for (int i = 0; i < n; i++)
		if (strcmp(held[i].system, incoming.system) == 0 &&
			strcmp(held[i].database, incoming.database) == 0)
			return PointerGetDatum(NULL);
	return PointerGetDatum(trigdata->tg_trigtuple);
}

/* First counter shard number of this session's node, for writers. */
int32
NodeShardBase(void)
{
	NodeClaimCheck();
	return SessionNodeId() * NODE_SHARDS;
}

/* The highest local position this session's node can hand out. */
int64
NodeLocalMax(void)
{
	int32		node = SessionNodeId();
	int64		lo;
	int64		hi;

	if (!NodeRanged(node))
		return PG_INT64_MAX;
	NodeRange(node, &lo, &hi);
	return hi - lo;
}

/*
 * The value this session hands out for a sequence's local position.  Node 0:
 * local itself.  Node n: n * 2^53 + local, and local must lie in 0 .. 2^53-1.
 */
int64
SequenceNodeValue(int64 local, const char *seqname)
{
	int32		node = SessionNodeId();
	int64		lo;
	int64		hi;

	if (!NodeRanged(node))
		return local;
	NodeRange(node, &lo, &hi);
	if (local >= 0 && local <= hi - lo)
		return lo + local;
	if (local < 0)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("sharded sequence \"%s\" is below node %d's range", seqname, node),
				 errdetail("Node %d hands out values %lld to %lld, and this sequence's next position is %lld below them.",
						   node, (long long) lo, (long long) hi, (long long) -local),
				 errhint("Move it into the range with sharded_seq.advance_sequence('%s', %lld).",
						 seqname, (long long) (lo - 1))));
	ereport(ERROR,
			(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
			 errmsg("sharded sequence \"%s\" has reached the end of node %d's range", seqname, node),
			 errdetail("Node %d hands out values %lld to %lld; values never leave a node's range.",
					   node, (long long) lo, (long long) hi),
			 errhint("Create a new sequence for this node: its values start again at the bottom of the range.")));
	return 0;					/* keep the compiler quiet */
}

/*
 * The local position from which values are at or above value (start), or
 * above it (past, with above true), on this session's node.  Node 0: the
 * value itself.  Node n: positions start at 0, the bottom of its range; a
 * value above the range is refused, but for past in a Citus cluster.
 */
int64
SequenceNodeLocal(int64 value, bool above, const char *seqname, const char *what)
{
	int32		node = SessionNodeId();
	int64		lo;
	int64		hi;

	if (!NodeRanged(node))
		return above ? value + 1 : value;	/* callers refuse PG_INT64_MAX */
	NodeRange(node, &lo, &hi);
	/*
	 * A Citus cluster runs one advance on every node: past a higher node's
	 * value, this node's values never reach it, so nothing moves here.
	 */
	if (above && value > hi && CitusGroup() >= 0)
		return 0;
	if (value > hi || (above && value == hi))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("%s %lld lies beyond node %d's range for sharded sequence \"%s\"",
						what, (long long) value, node, seqname),
				 errdetail("Node %d (sharded_seq.node_id) hands out values %lld to %lld.",
						   node, (long long) lo, (long long) hi),
				 above ?
				 errhint("Pass the highest value of this node's range in use, such as (SELECT max(id) FROM t WHERE id BETWEEN %lld AND %lld): this node's values never reach higher nodes' ranges.",
						 (long long) lo, (long long) hi) :
				 errhint("Choose a start within that range, or leave start out.")));
	if (value < lo)
		return 0;
	return value - lo + (above ? 1 : 0);
}

/*
 * The view's positions: the value a local position stands for on this
 * session's node, or NULL when it lies outside the node's range.
 */
PG_FUNCTION_INFO_V1(node_value);
Datum
node_value(PG_FUNCTION_ARGS)
{
	int64		local = PG_GETARG_INT64(0);
	int32		node = SessionNodeId();
	int64		lo;
	int64		hi;

	if (!NodeRanged(node))
		PG_RETURN_INT64(local);
	NodeRange(node, &lo, &hi);
	if (local < 0 || local > hi - lo)
		PG_RETURN_NULL();
	PG_RETURN_INT64(lo + local);
}

/* The node id this session draws values and writes counter rows as. */
PG_FUNCTION_INFO_V1(node_id);
Datum
node_id(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(SessionNodeId());
}

/*
 * Fired by logical replication's apply worker only (ENABLE REPLICA): a
 * counter's configuration changed on another node.  The change must reach
 * this node's sessions, which cache configuration until a relcache
 * invalidation of counter_config says otherwise (E1); the administrative
 * functions announce their own changes.
 */
PG_FUNCTION_INFO_V1(config_replicated);
Datum
config_replicated(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.config_replicated() must be called as a trigger"),
				 errhint("It is fired by logical replication on sharded_seq.counter_config; do not call it directly.")));
	CacheInvalidateRelcache(trigdata->tg_relation);
	return PointerGetDatum(NULL);
}

/*
 * A new id for a sequence or counter (as the extension owner, inside SPI).
 * Node 0 takes the id sequence's next value k.  Node n > 0 takes n + 1024k:
 * counter_config is replicated, so ids made by different nodes must never
 * meet.  An id already taken (by an object made while this database was
 * node 0, say, and replicated here) is skipped.
 */
int32
NextObjectId(void)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr taken_plan = NULL;
	Oid			taken_types[1] = {INT4OID};
	int32		node = SessionNodeId();

	if (node > 0)
		NodeClaimCheck();
	PreparePlan(&plan, "SELECT pg_catalog.nextval('sharded_seq.object_id_seq'::pg_catalog.regclass)", 0, NULL);
	for (;;)
	{
		bool		isnull;
		int64		k;
		int64		id;
		Datum		args[1];

		if (SPI_execute_plan(plan, NULL, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not allocate an object id");
		k = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		id = node == 0 ? k : node + (int64) NODE_SHARDS * k;
		if (id > PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("too many sharded sequences and counters have been created"),
					 errhint("Identifiers are never reused; drop objects you no longer need and reuse their names.")));
		if (node == 0)
			return (int32) id;
		args[0] = Int32GetDatum((int32) id);
		PreparePlan(&taken_plan,
					"SELECT 1 FROM sharded_seq.counter_config WHERE id OPERATOR(pg_catalog.=) $1"
					" UNION ALL SELECT 1 FROM sharded_seq.sequence_config WHERE id OPERATOR(pg_catalog.=) $1",
					1, taken_types);
		if (SPI_execute_plan(taken_plan, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not check object id %d", (int32) id);
		if (SPI_processed == 0)
			return (int32) id;
	}
}

/*
 * Move object_id_seq above every id in the config tables.  A subscriber
 * receives the publisher's rows but not its object_id_seq (a sequence), so
 * its next create_sequence or create_counter would take an id in use
 * (cutover(), advance_sequence()).  Runs in SPI, as the extension's owner.
 */
void
AdvanceObjectIds(void)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {INT4OID};
	int32		node = SessionNodeId();
	Datum		args[1] = {Int32GetDatum(node == 0 ? 1 : NODE_SHARDS)};

	/* node 0 makes id k; node n makes n + NODE_SHARDS * k */
	PreparePlan(&plan,
				"SELECT pg_catalog.setval('sharded_seq.object_id_seq'::pg_catalog.regclass, x.k)"
				"  FROM (SELECT pg_catalog.max(m) OPERATOR(pg_catalog./) $1 AS k"
				"          FROM (SELECT pg_catalog.max(id) AS m FROM sharded_seq.sequence_config"
				"                UNION ALL SELECT pg_catalog.max(id) FROM sharded_seq.counter_config) i) x,"
				"       sharded_seq.object_id_seq s"
				" WHERE x.k OPERATOR(pg_catalog.>) s.last_value"
				"    OR (x.k OPERATOR(pg_catalog.=) s.last_value AND NOT s.is_called)",
				1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not advance sharded_seq.object_id_seq");
}
