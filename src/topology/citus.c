/*
 * citus.c
 *	  A Citus cluster: which Citus group this node is (node.c makes it the
 *	  node id), administration carried from the coordinator to every node
 *	  through sharded_seq.cluster_calls, calls about one node
 *	  (move_node_counts), and the check that keeps counter_incr out of
 *	  writes that Citus repeats on every node.
 *
 * cluster_calls is a Citus reference table, made one by the coordinator's
 * first administrative call in a cluster, by cluster_setup(), or at a
 * worker's request at its first use (ClusterCallsReady seeds it with every
 * definition).  A row the coordinator writes reaches every node's placement
 * in the same distributed transaction (Citus commits it in two phases), and
 * an AFTER INSERT trigger on each placement runs the row's call there
 * (cluster_call_arrived), as the role that made it.  The coordinator ran the
 * call itself before writing the row, so its own placement skips it.  The
 * table keeps every call of every live object, and of a dropped one its
 * drop, so a node that has no placement yet, or got it by a copy (Citus
 * copies without firing triggers), replays an object's calls at its first
 * use of it (ClusterPull), and one that missed calls while disabled applies
 * them in cluster_sync().  Replays and arriving calls take one lock on a
 * worker (ClusterPullLock).  Live state (shards, reservations, counter
 * rows) is never carried: each node keeps its own.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "parser/parsetree.h"
#include "storage/lmgr.h"
#include "tcop/pquery.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/portal.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "topology/topology.h"

/* cluster_calls' columns, as the trigger reads them */
#define Anum_call_kind		1
#define Anum_call_name		2
#define Anum_call_n			3
#define Anum_call_op		4
#define Anum_call_made_by	5
#define Anum_call_call		6

/* cluster_calls.kind of an object kind, and back */
#define KIND_TEXT(kind)		((kind) == KIND_SEQUENCE ? "sequence" : "counter")
#define TEXT_KIND(text)		(strcmp((text), "sequence") == 0 ? KIND_SEQUENCE : KIND_COUNTER)

/* true while this backend runs a call that came from the coordinator */
static bool ClusterApplying = false;

static pg_noinline int32 ReadCitusGroup(void);

/*
 * This node's Citus group, or -1 when the database is in no Citus cluster
 * (no citus extension here, or no node in its metadata yet).  The
 * coordinator is group 0; Citus never gives a group id twice.
 */
int32
CitusGroup(void)
{
	/* Citus's metadata triggers invalidate relcache entries: ConfigEpoch moves */
	static uint64 epoch = 0;
	static int32 cached = -1;
	/* the transaction that last found it in force: no state check in a hot loop */
	static LocalTransactionId checked_in = InvalidLocalTransactionId;

	if (MyProc == NULL)
		return -1;
	if (epoch == ConfigEpoch && checked_in == MyLocalTransactionId() &&
		checked_in != InvalidLocalTransactionId)
		return cached;
	if (epoch != ConfigEpoch || !IsTransactionState())
	{
		cached = ReadCitusGroup();
		epoch = IsTransactionState() ? ConfigEpoch : 0;
	}
	checked_in = epoch != 0 ? MyLocalTransactionId() : InvalidLocalTransactionId;
	return cached;
}

/* CitusGroup, read from Citus's metadata */
static pg_noinline int32
ReadCitusGroup(void)
{
	Oid			local_rel;
	Oid			node_rel;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	Snapshot	snapshot;
	bool		member;
	int32		group = -1;

	if (!IsTransactionState())
		return -1;
	/* Citus runs only preloaded, and defines its settings then: no lookup without it */
	if (GetConfigOption("citus.node_conninfo", true, false) == NULL)
		return -1;
	/* syscache lookups first: a session's first use pays little without Citus */
	local_rel = get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE);
	node_rel = get_relname_relid("pg_dist_node", PG_CATALOG_NAMESPACE);
	if (!OidIsValid(local_rel) || !OidIsValid(node_rel) ||
		!OidIsValid(get_extension_oid("citus", true)))
		return -1;

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rel = table_open(node_rel, AccessShareLock);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	member = heap_getnext(scan, ForwardScanDirection) != NULL;
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	if (member)
	{
		rel = table_open(local_rel, AccessShareLock);
		scan = table_beginscan(rel, snapshot, 0, NULL);
		if ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull;
			Datum		d = heap_getattr(tup, 1, RelationGetDescr(rel), &isnull);

			if (!isnull)
				group = DatumGetInt32(d);
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}
	UnregisterSnapshot(snapshot);
	return group;
}

/* The SQL call that repeats the running function's call, arguments as literals. */
static char *
CallText(FunctionCallInfo fcinfo)
{
	HeapTuple	proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	Form_pg_proc form;
	StringInfoData buf;

	if (!HeapTupleIsValid(proc))
		elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
	form = (Form_pg_proc) GETSTRUCT(proc);
	initStringInfo(&buf);
	appendStringInfo(&buf, "SELECT %s.%s(",
					 quote_identifier(get_namespace_name(form->pronamespace)),
					 quote_identifier(NameStr(form->proname)));
	for (int i = 0; i < PG_NARGS(); i++)
	{
		Oid			type = form->proargtypes.values[i];

		if (i > 0)
			appendStringInfoString(&buf, ", ");
		if (PG_ARGISNULL(i))
			appendStringInfoString(&buf, "NULL");
		else
		{
			Oid			out;
			bool		varlena;

			getTypeOutputInfo(type, &out, &varlena);
			appendStringInfoString(&buf,
								   quote_literal_cstr(OidOutputFunctionCall(out, PG_GETARG_DATUM(i))));
		}
		appendStringInfo(&buf, "::%s", format_type_be_qualified(type));
	}
	appendStringInfoChar(&buf, ')');
	ReleaseSysCache(proc);
	return buf.data;
}

/* Run sql with SPI (connected), expecting result; returns SPI_processed. */
static uint64
RunSql(const char *sql, int nargs, Oid *types, Datum *args, int expected)
{
	int			rc = SPI_execute_with_args(sql, nargs, types, args, NULL, false, 0);

	if (rc != expected)
		elog(ERROR, "sharded_seq: cluster statement failed (%d): %s", rc, sql);
	return SPI_processed;
}

/* Whether cluster_calls is a Citus table already (SPI connected). */
static bool
ClusterCallsDistributed(void)
{
	return RunSql("SELECT 1 FROM pg_catalog.pg_dist_partition"
				  " WHERE logicalrelid OPERATOR(pg_catalog.=) 'sharded_seq.cluster_calls'::pg_catalog.regclass",
				  0, NULL, NULL, SPI_OK_SELECT) > 0;
}

/*
 * Make cluster_calls a reference table, the first time, with a row for the
 * creation and the grants of every object that exists already; then make
 * sure every node has a placement of it (a node added since has none until
 * Citus copies its reference tables there).  Returns true if it seeded the
 * table now: the call being recorded is in the seed.  As the owner.
 */
static bool
ClusterCallsReady(void)
{
	bool		seeded = false;
	int			nest;

	nest = NewGUCNestLevel();
	/* Citus refuses a reference table with triggers without this */
	(void) set_config_option("citus.enable_unsafe_triggers", "on",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	if (!ClusterCallsDistributed())
	{
		/*
		 * Empty first: Citus copies rows to a placement without firing
		 * triggers.  Rows here came from a restore (pg_dump keeps them): the
		 * seed below makes them again from the definitions.
		 */
		RunSql("DELETE FROM sharded_seq.cluster_calls", 0, NULL, NULL, SPI_OK_DELETE);
		RunSql("SELECT pg_catalog.create_reference_table('sharded_seq.cluster_calls')",
			   0, NULL, NULL, SPI_OK_SELECT);

		/*
		 * A sequence this server drew past 2^53 before it became the
		 * coordinator has handed out values of the workers' ranges: carried
		 * to them, they would hand those out again.  It stays here, where
		 * it draws no more (the end of node 0's range).
		 */
		if (RunSql("SELECT pg_catalog.string_agg(c.name, ', ' ORDER BY c.name) FROM sharded_seq.sequence_config c"
				   " WHERE sharded_seq.sequence_high_water(c.id) OPERATOR(pg_catalog.>=) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 53)"
				   " HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0",
				   0, NULL, NULL, SPI_OK_SELECT) > 0)
			ereport(WARNING,
					(errmsg("sharded sequences %s are not carried to the Citus workers",
							SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1)),
					 errdetail("This server handed out their values past 2^53 before it became the coordinator, in the workers' ranges, where the workers would hand them out again."),
					 errhint("Create new sequences for the cluster (sharded_seq.create_sequence): each node's values start in its own range.")));
		RunSql("INSERT INTO sharded_seq.cluster_calls (kind, name, n, op, made_by, call)"
			   " SELECT 'sequence', c.name, 1, 'create', r.rolname,"
			   "        pg_catalog.format('SELECT sharded_seq.create_sequence(%L, shards => %s, block => %s, tier => %L, cache => %L)',"
			   "                          c.name, c.shards, c.block, c.tier, c.cache)"
			   "   FROM sharded_seq.sequence_config c"
			   "   JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.owner"
			   "  WHERE COALESCE(sharded_seq.sequence_high_water(c.id), 0) OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 53)"
			   " UNION ALL"
			   " SELECT 'counter', c.name, 1, 'create', r.rolname,"
			   "        pg_catalog.format('SELECT sharded_seq.create_counter(%L, shards => %s, mode => %L)',"
			   "                          c.name, COALESCE(c.shards::pg_catalog.text, 'NULL'), c.mode)"
			   "   FROM sharded_seq.counter_config c"
			   "   JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.owner",
			   0, NULL, NULL, SPI_OK_INSERT);
		RunSql("INSERT INTO sharded_seq.cluster_calls (kind, name, n, op, made_by, call)"
			   " SELECT g.kind, g.name,"
			   "        1 OPERATOR(pg_catalog.+) pg_catalog.row_number() OVER (PARTITION BY g.kind, g.name ORDER BY g.grantee, g.privilege),"
			   "        'change', g.owner_name,"
			   "        pg_catalog.format('SELECT sharded_seq.grant_%s(%L, %L, %L)', g.kind, g.name, g.grantee, g.privilege)"
			   "   FROM (SELECT k.kind, k.name, o.rolname AS owner_name,"
			   "                CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'public'"
			   "                     ELSE gr.rolname::pg_catalog.text END AS grantee,"
			   "                pg_catalog.lower(a.privilege_type) AS privilege"
			   "           FROM (SELECT 'sequence' AS kind, name, owner, acl FROM sharded_seq.sequence_config"
			   "                  WHERE COALESCE(sharded_seq.sequence_high_water(id), 0) OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 53)"
			   "                 UNION ALL"
			   "                 SELECT 'counter', name, owner, acl FROM sharded_seq.counter_config) k"
			   "           JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) k.owner"
			   "          CROSS JOIN LATERAL pg_catalog.aclexplode(k.acl) a"
			   "           LEFT JOIN pg_catalog.pg_roles gr ON gr.oid OPERATOR(pg_catalog.=) a.grantee"
			   "          WHERE a.grantee OPERATOR(pg_catalog.<>) k.owner"
			   "            AND (a.grantee OPERATOR(pg_catalog.=) 0 OR gr.rolname IS NOT NULL)) g",
			   0, NULL, NULL, SPI_OK_INSERT);
		seeded = true;
	}
	else
	{
		RunSql("SELECT 1 FROM pg_catalog.pg_dist_node n"
			   " WHERE n.isactive AND n.noderole OPERATOR(pg_catalog.=) 'primary'"
			   "   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p"
			   "                     JOIN pg_catalog.pg_dist_shard s ON s.shardid OPERATOR(pg_catalog.=) p.shardid"
			   "                    WHERE s.logicalrelid OPERATOR(pg_catalog.=) 'sharded_seq.cluster_calls'::pg_catalog.regclass"
			   "                      AND p.groupid OPERATOR(pg_catalog.=) n.groupid)",
			   0, NULL, NULL, SPI_OK_SELECT);
		if (SPI_processed > 0)
			RunSql("SELECT pg_catalog.replicate_reference_tables('block_writes')",
				   0, NULL, NULL, SPI_OK_SELECT);
	}
	AtEOXact_GUC(true, nest);
	return seeded;
}

/*
 * Carry call to every node, in this transaction, as a row of cluster_calls
 * (kind "sequence", "counter", or "node" for a call about a node, which is
 * not kept).  On the coordinator only.
 */
static void
ClusterRecordCall(const char *kind, const char *name, const char *op, const char *call)
{
	Oid			types[6] = {TEXTOID, TEXTOID, TEXTOID, NAMEOID, TEXTOID, INT4OID};
	Datum		args[6];
	OwnerContext ctx;
	bool		kept = strcmp(kind, "node") != 0;
	bool		isnull;

	BeginAsOwner(&ctx);
	/* a table seeded now holds this object's definition already */
	if (!ClusterCallsReady() || !kept)
	{
		args[0] = CStringGetTextDatum(kind);
		args[1] = CStringGetTextDatum(name);
		args[2] = CStringGetTextDatum(op);
		args[3] = DirectFunctionCall1(namein, CStringGetDatum(GetUserNameFromId(ctx.caller, false)));
		args[4] = CStringGetTextDatum(call);
		/* n read first, then written as a constant: every copy gets the same row */
		RunSql("SELECT COALESCE(pg_catalog.max(n), 0) OPERATOR(pg_catalog.+) 1 FROM sharded_seq.cluster_calls"
			   " WHERE kind OPERATOR(pg_catalog.=) $1 AND name OPERATOR(pg_catalog.=) $2",
			   2, types, args, SPI_OK_SELECT);
		args[5] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		RunSql("INSERT INTO sharded_seq.cluster_calls (kind, name, n, op, made_by, call)"
			   " VALUES ($1, $2, $6, $3, $4, $5)",
			   6, types, args, SPI_OK_INSERT);
		/*
		 * A drop keeps only itself, so that a node that missed it (disabled
		 * meanwhile) drops the object at its cluster_sync(); a call about a
		 * node is not kept.
		 */
		if (strcmp(op, "drop") == 0 || !kept)
			RunSql("DELETE FROM sharded_seq.cluster_calls"
				   " WHERE kind OPERATOR(pg_catalog.=) $1 AND name OPERATOR(pg_catalog.=) $2"
				   "   AND (n OPERATOR(pg_catalog.<) $6 OR $3 OPERATOR(pg_catalog.<>) 'drop')",
				   6, types, args, SPI_OK_DELETE);
	}
	EndAsOwner(&ctx);
}

/* Refuse on a worker what only the coordinator may do. */
void
ClusterRefuseOnWorker(const char *what)
{
	int32		group;

	if (ClusterApplying || (group = CitusGroup()) <= 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s runs on the Citus coordinator", what),
			 errdetail("This node is a worker of a Citus cluster (group %d): a definition changed here would differ from every other node's.",
					   group),
			 errhint("Run it on the coordinator: it reaches every node in the same transaction.")));
}

/*
 * The end of every administrative function (its first argument is the
 * object's name): on the coordinator of a Citus cluster, carry the call to
 * every node, in this transaction; on a worker, refuse it, unless it came
 * from the coordinator.  op is "create", "change" or "drop".  The refusal
 * comes after the function's work, which the error rolls back.
 */
void
ClusterAdminRecord(FunctionCallInfo fcinfo, ObjectKind kind, const char *op)
{
	ClusterRefuseOnWorker("sharded_seq administration");
	if (ClusterApplying || CitusGroup() != 0)
		return;
	if (!ClusterCallsStored())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq administration in a Citus cluster needs version 1.6 of the extension's schema"),
				 errdetail("Without sharded_seq.cluster_calls a change made on the coordinator would reach no worker."),
				 errhint("Run ALTER EXTENSION sharded_seq UPDATE on the coordinator: Citus carries it to every node.")));
	ClusterRecordCall(KIND_TEXT(kind), TextDatumGetCString(PG_GETARG_DATUM(0)), op,
					  CallText(fcinfo));
}

/*
 * On the coordinator: run call on the node of Citus group group, in this
 * distributed transaction (every node gets it; the function it calls acts
 * on that group only).
 */
void
ClusterCallOnGroup(int32 group, const char *call)
{
	ClusterRecordCall("node", psprintf("%d", group), "change", call);
}

/*
 * The Citus group of the active primary node name:port, refused unless it
 * is a worker other than this node.
 */
int32
ClusterWorkerGroup(const char *name, int32 port)
{
	Oid			types[2] = {TEXTOID, INT4OID};
	Datum		args[2] = {CStringGetTextDatum(name), Int32GetDatum(port)};
	bool		isnull;
	int32		group = -1;

	SPI_connect();
	if (RunSql("SELECT groupid FROM pg_catalog.pg_dist_node"
			   " WHERE nodename OPERATOR(pg_catalog.=) $1 AND nodeport OPERATOR(pg_catalog.=) $2"
			   "   AND noderole OPERATOR(pg_catalog.=) 'primary'",
			   2, types, args, SPI_OK_SELECT) > 0)
		group = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	if (group <= 0 || group == CitusGroup())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s:%d is not another worker of this Citus cluster", name, port),
				 errhint("Name a worker as pg_dist_node lists it (nodename, nodeport).")));
	return group;
}

/*
 * What command (a query of one value) returns on the node of group, in a
 * transaction of its own there, as the current user.
 */
char *
ClusterQueryGroup(int32 group, const char *command)
{
	Oid			types[2] = {INT4OID, TEXTOID};
	Datum		args[2] = {Int32GetDatum(group), CStringGetTextDatum(command)};
	MemoryContext outer = CurrentMemoryContext;
	bool		isnull;
	char	   *result;
	bool		ok;

	SPI_connect();
	if (RunSql("SELECT r.success, r.result"
			   "  FROM pg_catalog.pg_dist_node n,"
			   "       pg_catalog.master_run_on_worker(ARRAY[n.nodename], ARRAY[n.nodeport], ARRAY[$2], false) r"
			   " WHERE n.groupid OPERATOR(pg_catalog.=) $1 AND n.noderole OPERATOR(pg_catalog.=) 'primary'",
			   2, types, args, SPI_OK_SELECT) != 1)
		elog(ERROR, "no primary node of Citus group %d", group);
	ok = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	result = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("could not run a query on Citus group %d", group),
				 errdetail("%s", result ? result : "no answer"),
				 errhint("The node must be up and reachable from here.")));
	result = result ? MemoryContextStrdup(outer, result) : NULL;
	SPI_finish();
	return result;
}

/*
 * Whether relid is a shard placement (or, on the coordinator, the table) of
 * a Citus table whose shards have several placements, as every reference
 * table's have: a row trigger on it fires once on each node.
 */
static bool
MultiPlacementTable(Oid relid)
{
	static Oid	last_relid = InvalidOid;
	static uint64 last_epoch = 0;
	static bool last_answer = false;
	Oid			types[2] = {OIDOID, TEXTOID};
	Datum		args[2];
	char	   *name;

	if (relid == last_relid && last_epoch == ConfigEpoch)
		return last_answer;
	if ((name = get_rel_name(relid)) == NULL)
		return false;
	args[0] = ObjectIdGetDatum(relid);
	args[1] = CStringGetTextDatum(name);
	SPI_connect();
	/* a placement is named after its table: name_shardid, in the table's schema */
	last_answer = RunSql("SELECT 1 FROM pg_catalog.pg_dist_shard s"
						 " WHERE (s.logicalrelid OPERATOR(pg_catalog.=) $1"
						 "        OR ((SELECT c.relname::pg_catalog.text FROM pg_catalog.pg_class c"
						 "              WHERE c.oid OPERATOR(pg_catalog.=) s.logicalrelid::pg_catalog.oid)"
						 "            OPERATOR(pg_catalog.||) '_' OPERATOR(pg_catalog.||) s.shardid::pg_catalog.text)"
						 "           OPERATOR(pg_catalog.=) $2)"
						 "   AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_placement p"
						 "         WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid) OPERATOR(pg_catalog.>) 1"
						 " LIMIT 1",
						 2, types, args, SPI_OK_SELECT) > 0;
	SPI_finish();
	last_relid = relid;
	last_epoch = ConfigEpoch;
	return last_answer;
}

/*
 * Whether the statement this backend runs for its client writes a Citus
 * table whose shards have several placements (a reference table): a
 * counting trigger there would count once per node.  Citus sends each
 * placement's write to its node as a statement of its own, so looking at
 * the statement of the active portal finds it on every node.
 */
bool
ClusterWritesReplicatedTable(void)
{
	ListCell   *lc;

	if (ActivePortal == NULL || CitusGroup() < 0)
		return false;
	foreach(lc, ActivePortal->stmts)
	{
		PlannedStmt *stmt = lfirst_node(PlannedStmt, lc);

		if (stmt->commandType == CMD_UTILITY)
		{
			CopyStmt   *copy = (CopyStmt *) stmt->utilityStmt;

			if (IsA(copy, CopyStmt) && copy->is_from && copy->relation &&
				MultiPlacementTable(RangeVarGetRelid(copy->relation, NoLock, true)))
				return true;
		}
		else
		{
			ListCell   *rc;

			foreach(rc, stmt->resultRelations)
				if (MultiPlacementTable(rt_fetch(lfirst_int(rc), stmt->rtable)->relid))
					return true;
		}
	}
	return false;
}

/* Whether kind's object name exists here (SPI connected, as the owner). */
static bool
ObjectHere(ObjectKind kind, const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};

	return RunSql(kind == KIND_SEQUENCE
				  ? "SELECT 1 FROM sharded_seq.sequence_config WHERE name OPERATOR(pg_catalog.=) $1"
				  : "SELECT 1 FROM sharded_seq.counter_config WHERE name OPERATOR(pg_catalog.=) $1",
				  1, types, args, SPI_OK_SELECT) > 0;
}

/* Run one call from the coordinator here, as the role that made it. */
static void
ApplyCall(const char *made_by, const char *call, bool replay)
{
	Oid			role = get_role_oid(made_by, true);
	Oid			saved_user;
	int			saved_context;
	int			nest;

	/* a replay of a dropped role's call: the owner's rights stand in */
	if (!OidIsValid(role) && replay)
	{
		ereport(NOTICE,
				(errmsg("role \"%s\" of a sharded_seq call from the coordinator no longer exists; the extension's owner runs it", made_by),
				 errdetail("The call: %s", call)));
		role = ExtensionOwner();
	}
	if (!OidIsValid(role))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role \"%s\" of a sharded_seq call from the coordinator does not exist on this node", made_by),
				 errdetail("The call: %s", call),
				 errhint("Create the role with Citus's role propagation on (citus.enable_create_role_propagation). A role renamed in another database: on the coordinator, UPDATE sharded_seq.cluster_calls SET made_by = 'new name' WHERE made_by = '%s'.", made_by)));
	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(role, saved_context | SECURITY_LOCAL_USERID_CHANGE);
	nest = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	ClusterApplying = true;
	PG_TRY();
	{
		RunSql(call, 0, NULL, NULL, SPI_OK_SELECT);
	}
	PG_FINALLY();
	{
		ClusterApplying = false;
	}
	PG_END_TRY();
	AtEOXact_GUC(true, nest);
	SetUserIdAndSecContext(saved_user, saved_context);
	CommandCounterIncrement();
}

/*
 * Serialise, on a worker, the replays of ClusterPull and the calls that
 * arrive from the coordinator, until the end of the transaction: a call
 * arriving while another session's replay is uncommitted would find no
 * object and skip it (a revoke, a change or a drop lost on that node for
 * good), and two sessions replaying at once would both create an object.
 * The statements after it take a new snapshot, which sees the other's work
 * (in read committed, as Citus runs the coordinator's calls).
 */
static void
ClusterPullLock(void)
{
	LockDatabaseObject(ExtensionRelationId, get_extension_oid("sharded_seq", false), 1,
					   ExclusiveLock);
}

/*
 * Run a call of a replay.  A change that fails here (a grant to a role
 * dropped since) is skipped with a warning, in a subtransaction: the grant
 * is moot, and one such call must not keep the node from every object.
 */
static void
ReplayCall(const char *made_by, const char *call, bool is_change)
{
	MemoryContext outer = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;

	if (!is_change)
	{
		ApplyCall(made_by, call, true);
		return;
	}
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(outer);
	PG_TRY();
	{
		ApplyCall(made_by, call, true);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(outer);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(outer);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(outer);
		CurrentResourceOwner = owner;
		ClusterApplying = false;
		ereport(WARNING,
				(errmsg("a sharded_seq call from the coordinator was skipped on this node: %s", edata->message),
				 errdetail("The call: %s", call)));
		FreeErrorData(edata);
	}
	PG_END_TRY();
}

/*
 * Record (n > 0) or forget (n = 0) which creation, the row n of
 * cluster_calls, this node's object kind name was made from (SPI
 * connected): cluster_sync() tells an object dropped and made again on the
 * coordinator from the one this node has.
 */
static void
NoteMade(const char *kind, const char *name, int32 n)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT4OID};
	Datum		args[3] = {CStringGetTextDatum(kind), CStringGetTextDatum(name), Int32GetDatum(n)};

	if (n > 0)
		RunSql("INSERT INTO sharded_seq.cluster_made (kind, name, create_n) VALUES ($1, $2, $3)"
			   " ON CONFLICT (kind, name) DO UPDATE SET create_n = EXCLUDED.create_n",
			   3, types, args, SPI_OK_INSERT);
	else
		RunSql("DELETE FROM sharded_seq.cluster_made"
			   " WHERE kind OPERATOR(pg_catalog.=) $1 AND name OPERATOR(pg_catalog.=) $2",
			   2, types, args, SPI_OK_DELETE);
}

/*
 * Replay, in order, the calls of kind's object name since its latest
 * creation (SPI connected): every one, or (ops "change") its changes only.
 * Returns how many.
 */
static uint64
ReplayObject(ObjectKind kind, const char *name, const char *ops)
{
	Oid			types[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		args[3] = {CStringGetTextDatum(KIND_TEXT(kind)), CStringGetTextDatum(name),
						   CStringGetTextDatum(ops ? ops : "")};
	SPITupleTable *calls;
	uint64		n = RunSql("SELECT made_by::pg_catalog.text, call, op, n FROM sharded_seq.cluster_calls"
						   " WHERE kind OPERATOR(pg_catalog.=) $1 AND name OPERATOR(pg_catalog.=) $2"
						   "   AND ($3 OPERATOR(pg_catalog.=) '' OR op OPERATOR(pg_catalog.=) $3)"
						   "   AND n OPERATOR(pg_catalog.>=) (SELECT pg_catalog.max(c.n) FROM sharded_seq.cluster_calls c"
						   "                                   WHERE c.kind OPERATOR(pg_catalog.=) $1 AND c.name OPERATOR(pg_catalog.=) $2"
						   "                                     AND c.op OPERATOR(pg_catalog.=) 'create')"
						   " ORDER BY n", 3, types, args, SPI_OK_SELECT);

	calls = SPI_tuptable;
	for (uint64 i = 0; i < n; i++)
	{
		char	   *op = SPI_getvalue(calls->vals[i], calls->tupdesc, 3);
		bool		isnull;

		ReplayCall(SPI_getvalue(calls->vals[i], calls->tupdesc, 1),
				   SPI_getvalue(calls->vals[i], calls->tupdesc, 2),
				   strcmp(op, "change") == 0);
		if (strcmp(op, "create") == 0)
			NoteMade(KIND_TEXT(kind), name,
					 DatumGetInt32(SPI_getbinval(calls->vals[i], calls->tupdesc, 4, &isnull)));
	}
	return n;
}

/* The creation this node's object came from (cluster_made), or 0 (unknown). */
static int32
MadeFrom(const char *kind, const char *name)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(kind), CStringGetTextDatum(name)};
	bool		isnull;

	if (RunSql("SELECT create_n FROM sharded_seq.cluster_made"
			   " WHERE kind OPERATOR(pg_catalog.=) $1 AND name OPERATOR(pg_catalog.=) $2",
			   2, types, args, SPI_OK_SELECT) == 0)
		return 0;
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* Drop this node's object kind name, as the extension's owner (SPI connected). */
static void
DropHere(ObjectKind kind, const char *name)
{
	ApplyCall(GetUserNameFromId(ExtensionOwner(), false),
			  psprintf("SELECT sharded_seq.drop_%s(%s)", KIND_TEXT(kind), quote_literal_cstr(name)),
			  true);
}

/*
 * Make this node's definitions the coordinator's (SPI connected, under
 * ClusterPullLock): create what it lacks and, unless missing_only (a
 * worker's first use), apply every change of what it has again, drop what
 * the coordinator dropped, and make again what was dropped and made again
 * there.  Citus joins no local table with a reference table placed
 * elsewhere, so each object is looked up here in turn.  Returns how many
 * objects it touched.
 */
static int32
SyncObjects(bool missing_only)
{
	SPITupleTable *objects;
	uint64		n;
	int32		touched = 0;

	/* each object's last op ('drop' for one the coordinator dropped), and its latest creation */
	n = RunSql("SELECT DISTINCT ON (kind, name) kind, name, op,"
			   "       (SELECT pg_catalog.max(c.n) FROM sharded_seq.cluster_calls c"
			   "         WHERE c.kind OPERATOR(pg_catalog.=) l.kind AND c.name OPERATOR(pg_catalog.=) l.name"
			   "           AND c.op OPERATOR(pg_catalog.=) 'create')"
			   "  FROM sharded_seq.cluster_calls l"
			   " WHERE kind OPERATOR(pg_catalog.<>) 'node'"
			   " ORDER BY kind, name, n DESC",
			   0, NULL, NULL, SPI_OK_SELECT);
	objects = SPI_tuptable;
	for (uint64 i = 0; i < n; i++)
	{
		char	   *kind_text = SPI_getvalue(objects->vals[i], objects->tupdesc, 1);
		char	   *object = SPI_getvalue(objects->vals[i], objects->tupdesc, 2);
		bool		dropped = strcmp(SPI_getvalue(objects->vals[i], objects->tupdesc, 3), "drop") == 0;
		char	   *latest = SPI_getvalue(objects->vals[i], objects->tupdesc, 4);
		ObjectKind	k = TEXT_KIND(kind_text);
		bool		here = ObjectHere(k, object);
		int32		made;

		if (missing_only && (dropped || here))
			continue;
		made = here ? MadeFrom(kind_text, object) : 0;
		if (dropped && here)
		{
			DropHere(k, object);
			NoteMade(kind_text, object, 0);
		}
		else if (!dropped && here && made > 0 && latest && made < atoi(latest))
		{
			/* dropped and made again on the coordinator while this node missed it */
			DropHere(k, object);
			ReplayObject(k, object, NULL);
		}
		else if (!dropped && !here)
			ReplayObject(k, object, NULL);
		else if (!dropped)
			ReplayObject(k, object, "change");
		else
			continue;
		touched++;
	}
	return touched;
}

/*
 * On a Citus worker, an object this node does not have: take every
 * definition this node lacks from the coordinator's calls, now (a node
 * added to the cluster has none).  Returns true if kind's name is here
 * now (the caller loads it again).
 */
bool
ClusterPull(ObjectKind kind, const char *name)
{
	OwnerContext ctx;
	bool		pulled;

	if (ClusterApplying || CitusGroup() <= 0 || !ClusterCallsStored())
		return false;
	BeginAsOwner(&ctx);
	/*
	 * Objects the coordinator had before the cluster formed reach the nodes
	 * once it makes cluster_calls a reference table: ask it to, now.  Not
	 * under the lock below, which the calls that then arrive here take.
	 */
	if (!ClusterCallsDistributed())
	{
		RunSql("SELECT pg_catalog.run_command_on_coordinator('SELECT sharded_seq.cluster_setup()')",
			   0, NULL, NULL, SPI_OK_SELECT);
		if (!ClusterCallsDistributed())
		{
			EndAsOwner(&ctx);
			return false;
		}
	}
	ClusterPullLock();
	(void) SyncObjects(true);
	/* replayed now, or by a session this one waited for */
	pulled = ObjectHere(kind, name);
	EndAsOwner(&ctx);
	return pulled;
}

/*
 * AFTER INSERT on each placement of cluster_calls: run the call on this
 * node.  An object this node has already when its creation arrives (made
 * here before the node joined, as the workaround of setting node ids by
 * hand did) is kept: its positions go on, so none of its values comes
 * back.  A change or a drop of an object this node does not have yet is
 * left to the replay at its first use (ClusterPull): Citus copies a
 * placement to a new node without firing triggers.
 */
PG_FUNCTION_INFO_V1(cluster_call_arrived);
Datum
cluster_call_arrived(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	HeapTuple	tup;
	bool		isnull;
	char	   *kind_text;
	ObjectKind	kind;
	char	   *name;
	char	   *op;
	bool		node_call;
	bool		here;
	int32		group;
	OwnerContext ctx;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) || !TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("sharded_seq.cluster_call_arrived() must be called as an AFTER INSERT row trigger"),
				 errhint("It is fired by writes to sharded_seq.cluster_calls; do not call it directly.")));
	/*
	 * The coordinator ran the call already; outside a cluster (a restore)
	 * nothing runs; a node past the last node id uses no object (its error
	 * would fail every administrative call of the cluster).
	 */
	group = CitusGroup();
	if (ClusterApplying || group <= 0 || group > SHARDED_SEQ_MAX_NODE)
		return PointerGetDatum(NULL);

	tup = trigdata->tg_trigtuple;
	desc = RelationGetDescr(trigdata->tg_relation);
	kind_text = TextDatumGetCString(heap_getattr(tup, Anum_call_kind, desc, &isnull));
	kind = TEXT_KIND(kind_text);
	node_call = strcmp(kind_text, "node") == 0;
	name = TextDatumGetCString(heap_getattr(tup, Anum_call_name, desc, &isnull));
	op = TextDatumGetCString(heap_getattr(tup, Anum_call_op, desc, &isnull));

	BeginAsOwner(&ctx);
	if (!node_call)
		ClusterPullLock();
	here = !node_call && ObjectHere(kind, name);
	if (strcmp(op, "create") == 0 && here)
		ereport(NOTICE,
				(errmsg("%s \"%s\" exists on this node already (Citus group %d): it is kept, with its positions and rows",
						kind == KIND_SEQUENCE ? "sharded sequence" : "counter", name, group),
				 errdetail("It was made here before this node joined the cluster; the coordinator's later changes apply to it.")));
	else if (node_call || strcmp(op, "create") == 0 || here)
	{
		ApplyCall(NameStr(*DatumGetName(heap_getattr(tup, Anum_call_made_by, desc, &isnull))),
				  TextDatumGetCString(heap_getattr(tup, Anum_call_call, desc, &isnull)), false);
		if (strcmp(op, "create") == 0)
			NoteMade(kind_text, name, DatumGetInt32(heap_getattr(tup, Anum_call_n, desc, &isnull)));
		else if (strcmp(op, "drop") == 0)
			NoteMade(kind_text, name, 0);
	}
	EndAsOwner(&ctx);
	return PointerGetDatum(NULL);
}

/*
 * cluster_setup(): on the coordinator of a Citus cluster, make
 * cluster_calls a reference table holding every definition (at the first
 * administrative call otherwise; a worker asks for it at its first use),
 * and give every node a copy of it.
 */
PG_FUNCTION_INFO_V1(cluster_setup);
Datum
cluster_setup(PG_FUNCTION_ARGS)
{
	OwnerContext ctx;

	if (CitusGroup() != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq.cluster_setup() runs on the coordinator of a Citus cluster"),
				 errhint("Connect to the coordinator (Citus group 0).")));
	PreventCommandIfReadOnly("sharded_seq.cluster_setup()");
	BeginAsOwner(&ctx);
	(void) ClusterCallsReady();
	EndAsOwner(&ctx);
	PG_RETURN_VOID();
}

/*
 * cluster_sync(): on a worker, make this node's definitions the
 * coordinator's: create what it lacks, apply again every change of what it
 * has (grants and revokes in order, alters), drop what the coordinator
 * dropped.  For a node that missed calls: one disabled (citus_disable_node)
 * and activated again.  Returns how many objects it touched.
 */
PG_FUNCTION_INFO_V1(cluster_sync);
Datum
cluster_sync(PG_FUNCTION_ARGS)
{
	OwnerContext ctx;
	int32		group = CitusGroup();
	int32		touched;

	if (group <= 0 || group > SHARDED_SEQ_MAX_NODE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sharded_seq.cluster_sync() runs on a worker of a Citus cluster"),
				 errhint("Connect to the worker that missed the coordinator's calls.")));
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for sharded_seq.cluster_sync()"),
				 errhint("It replays every role's calls: run it as a superuser.")));
	PreventCommandIfReadOnly("sharded_seq.cluster_sync()");
	BeginAsOwner(&ctx);
	ClusterPullLock();
	touched = SyncObjects(false);
	EndAsOwner(&ctx);
	PG_RETURN_INT32(touched);
}

/*
 * On the coordinator, after ALTER ROLE ... RENAME: the calls the role made
 * name it by its new name, in this transaction (Citus renames it on every
 * node in the same one), so that a node that replays them finds it.  This
 * database only: another database's calls keep the old name.
 */
void
ClusterRoleRenamed(const char *oldname, const char *newname)
{
	Oid			types[2] = {NAMEOID, NAMEOID};
	Datum		args[2];
	OwnerContext ctx;

	if (CitusGroup() != 0 || !OidIsValid(get_extension_oid("sharded_seq", true)) ||
		!ClusterCallsStored())
		return;
	args[0] = DirectFunctionCall1(namein, CStringGetDatum(oldname));
	args[1] = DirectFunctionCall1(namein, CStringGetDatum(newname));
	BeginAsOwner(&ctx);
	if (ClusterCallsDistributed())
		RunSql("UPDATE sharded_seq.cluster_calls SET made_by = $2"
			   " WHERE made_by OPERATOR(pg_catalog.=) $1",
			   2, types, args, SPI_OK_UPDATE);
	EndAsOwner(&ctx);
}
