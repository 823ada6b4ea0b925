/*
 * catalog.c
 *	  Catalog access shared by sequences and counters: name and argument
 *	  validation, the extension's schema and the relation ids of its tables
 *	  (a lookup has no side effect), which schema version is installed, the
 *	  commands that change the shard table and our triggers' firing modes,
 *	  and the epoch that tells every backend when a configuration row
 *	  changed.  Privileges and acting as the owner are in privileges.c.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "nodes/parsenodes.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/fmgroids.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "common/common.h"

/*
 * Bumped whenever a relcache invalidation reaches one of our config tables
 * (or everything is reset).  Cached configuration is valid only while the
 * epoch it was loaded under is current.
 */
uint64		ConfigEpoch = 1;

/*
 * Bumped when role memberships or roles change, so that privilege checks
 * remembered per object are made again.
 */
uint64		PrivilegeEpoch = 1;

static Oid	cached_namespace = InvalidOid;
static Oid	cached_owner = InvalidOid;
static bool cached_token_valid = false;
static uint64 cached_token = 0;

/* OIDs of our tables and indexes, looked up by name on the hot paths */
#define MAX_CACHED_RELIDS 16
static struct
{
	const char *name;
	Oid			relid;
}			cached_relids[MAX_CACHED_RELIDS];
static int	n_cached_relids = 0;

static void
ConfigInvalidated(Datum arg, Oid relid)
{
	/* Cheap and conservative: any relcache change may be ours. */
	ConfigEpoch++;
	n_cached_relids = 0;
	cached_owner = InvalidOid;
	if (relid == InvalidOid)
	{
		cached_namespace = InvalidOid;
		cached_token_valid = false;
	}
}

/* A schema was created or dropped: DROP/CREATE EXTENSION makes a new install. */
static void
NamespaceInvalidated(Datum arg, int cacheid, uint32 hashvalue)
{
	ConfigEpoch++;
	n_cached_relids = 0;
	cached_namespace = InvalidOid;
	cached_owner = InvalidOid;
	cached_token_valid = false;
}

static void
RolesInvalidated(Datum arg, int cacheid, uint32 hashvalue)
{
	PrivilegeEpoch++;
}

void
CatalogInit(void)
{
	CacheRegisterRelcacheCallback(ConfigInvalidated, (Datum) 0);
	CacheRegisterSyscacheCallback(NAMESPACEOID, NamespaceInvalidated, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, RolesInvalidated, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, RolesInvalidated, (Datum) 0);
	/* a database's owner is who pg_database_owner is there */
	CacheRegisterSyscacheCallback(DATABASEOID, RolesInvalidated, (Datum) 0);
}

const char *
KindName(ObjectKind kind)
{
	return kind == KIND_SEQUENCE ? "sharded sequence" : "counter";
}

void
ValidateName(const char *name, ObjectKind kind)
{
	size_t		len = strlen(name);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("%s name must not be empty", KindName(kind)),
				 errhint("Give a name such as 'orders_id'.")));
	if (len > SHARDED_SEQ_MAX_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("%s name is too long (%zu bytes)", KindName(kind), len),
				 errhint("Use a name of at most %d bytes.", SHARDED_SEQ_MAX_NAME)));
}

/* Fetch a name argument, rejecting NULL, empty and over-long names. */
char *
NameArg(FunctionCallInfo fcinfo, int argno, ObjectKind kind)
{
	char	   *name;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s name must not be null", KindName(kind)),
				 errhint("Pass the %s's name as text.", KindName(kind))));
	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	ValidateName(name, kind);
	return name;
}

void
ValidateShards(int shards, ObjectKind kind)
{
	if (shards < 1 || shards > SHARDED_SEQ_MAX_SHARDS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("shards must be between 1 and %d, not %d",
						SHARDED_SEQ_MAX_SHARDS, shards),
				 errhint("About as many shards as concurrent writers to the %s is enough.",
						 KindName(kind))));
}

void
ValidateBlock(int block)
{
	if (block < 1 || block > SHARDED_SEQ_MAX_BLOCK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("block must be between 1 and %d, not %d",
						SHARDED_SEQ_MAX_BLOCK, block),
				 errhint("A block is how many values a session reserves at once; 100 to 10000 suits most workloads.")));
}

static Oid
ConfigNamespace(void)
{
	if (!OidIsValid(cached_namespace))
	{
		cached_namespace = get_namespace_oid(SHARDED_SEQ_SCHEMA, true);
		if (!OidIsValid(cached_namespace))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_SCHEMA),
					 errmsg("schema \"%s\" does not exist", SHARDED_SEQ_SCHEMA),
					 errhint("Run CREATE EXTENSION sharded_seq in this database.")));
	}
	return cached_namespace;
}

/* relname must be a string constant: the cache keeps the pointer. */
Oid
ConfigRelid(const char *relname)
{
	Oid			relid;

	for (int i = 0; i < n_cached_relids; i++)
		if (cached_relids[i].name == relname)
			return cached_relids[i].relid;
	relid = get_relname_relid(relname, ConfigNamespace());
	if (OidIsValid(relid) && n_cached_relids < MAX_CACHED_RELIDS)
	{
		cached_relids[n_cached_relids].name = relname;
		cached_relids[n_cached_relids].relid = relid;
		n_cached_relids++;
	}

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table %s.%s does not exist", SHARDED_SEQ_SCHEMA, relname),
				 errhint("Reinstall the extension: DROP EXTENSION sharded_seq; CREATE EXTENSION sharded_seq.")));
	return relid;
}

/* Can counter_config mark a counter adaptive (schema 1.2)? */
bool
AdaptiveCountersStored(void)
{
	return OidIsValid(get_relname_relid("maintenance", ConfigNamespace()));
}

/*
 * Does counter_config tell 'buffered' (shared memory) from 'memcached'
 * (schema 1.3)?  Before that, 'buffered' was the memcached write-behind.
 */
bool
WriteBehindModesSplit(void)
{
	return OidIsValid(get_relname_relid("workers", ConfigNamespace()));
}

/* Can node ids be claimed (schema 1.3)? */
bool
NodeClaimsStored(void)
{
	return OidIsValid(get_relname_relid("node_claims", ConfigNamespace()));
}

/* Can administration reach every node of a Citus cluster (schema 1.6)? */
bool
ClusterCallsStored(void)
{
	return OidIsValid(get_relname_relid("cluster_calls", ConfigNamespace()));
}

/* Does sequence_config have the cache column (schema 1.5)? */
bool
NodeCacheStored(void)
{
	return get_attnum(ConfigRelid("sequence_config"), "cache") != InvalidAttrNumber;
}

/* Does counter_sets count set_counter's sets (schema 1.5)? */
bool
CounterSetsStored(void)
{
	return OidIsValid(get_relname_relid("counter_sets", ConfigNamespace()));
}

/*
 * relname in the extension's schema, or InvalidOid when the extension is not
 * installed.  Never raises an error.
 */
Oid
InstalledRelid(const char *relname)
{
	Oid			namespace = get_namespace_oid(SHARDED_SEQ_SCHEMA, true);

	return OidIsValid(namespace) ? get_relname_relid(relname, namespace) : InvalidOid;
}

static Oid
RelidOf(RangeVar *rv)
{
	return rv ? RangeVarGetRelid(rv, NoLock, true) : InvalidOid;
}

/* Does a VACUUM ask for FULL (a rewrite)? */
static bool
VacuumFull(VacuumStmt *stmt)
{
	ListCell   *lc;

	foreach(lc, stmt->options)
	{
		DefElem    *opt = lfirst_node(DefElem, lc);

		if (strcmp(opt->defname, "full") == 0 && defGetBoolean(opt))
			return true;
	}
	return false;
}

/*
 * May this command change what our table relname is, so that writes can
 * escape the marks made at every write (counter_shards: the rule in
 * counter/layout.c; sequence_config: common/config_word.c)?  Trigger
 * changes, TRUNCATE (a cascade may reach it), rewrites (VACUUM FULL,
 * CLUSTER), drops, and an update of the extension.  Plain VACUUM and
 * ANALYZE change no row and are left alone.  Errs on the side of yes; costs
 * a lookup or two, and only for these commands.
 */
bool
ChangesOwnTable(Node *stmt, const char *relname)
{
	Oid			shards;
	ListCell   *lc;

	switch (nodeTag(stmt))
	{
		case T_AlterTableStmt:
		case T_TruncateStmt:
		case T_ClusterStmt:
			break;
		case T_VacuumStmt:
			if (!VacuumFull((VacuumStmt *) stmt))
				return false;
			break;
		case T_DropStmt:
			switch (((DropStmt *) stmt)->removeType)
			{
				case OBJECT_TRIGGER:
				case OBJECT_TABLE:
				case OBJECT_SCHEMA:
				case OBJECT_EXTENSION:
					break;
				default:
					return false;
			}
			break;
		case T_AlterExtensionStmt:
			return strcmp(((AlterExtensionStmt *) stmt)->extname, "sharded_seq") == 0;
		default:
			return false;
	}
	shards = InstalledRelid(relname);
	if (!OidIsValid(shards))
		return false;
	if (IsA(stmt, AlterTableStmt))
		return RelidOf(((AlterTableStmt *) stmt)->relation) == shards;
	if (IsA(stmt, TruncateStmt))
	{
		if (((TruncateStmt *) stmt)->behavior == DROP_CASCADE)
			return true;
		foreach(lc, ((TruncateStmt *) stmt)->relations)
			if (RelidOf(lfirst_node(RangeVar, lc)) == shards)
				return true;
		return false;
	}
	return true;
}

/* Is namespace the extension's schema?  Never raises an error. */
static bool
IsOurNamespace(Oid namespace)
{
	return OidIsValid(namespace) && namespace == get_namespace_oid(SHARDED_SEQ_SCHEMA, true);
}

static bool
IsOurRelation(RangeVar *rv)
{
	Oid			relid = RelidOf(rv);

	return OidIsValid(relid) && IsOurNamespace(get_rel_namespace(relid));
}

static bool
IsOurFunction(ObjectType type, ObjectWithArgs *func)
{
	Oid			funcid = LookupFuncWithArgs(type, func, true);

	return OidIsValid(funcid) && IsOurNamespace(get_func_namespace(funcid));
}

/* Does a DROP name an object in (or the whole of) the extension's schema? */
static bool
DropsOurs(DropStmt *stmt)
{
	ListCell   *lc;

	foreach(lc, stmt->objects)
	{
		Node	   *object = lfirst(lc);

		switch (stmt->removeType)
		{
			case OBJECT_EXTENSION:
			case OBJECT_SCHEMA:
				if (strcmp(strVal(object), stmt->removeType == OBJECT_EXTENSION ?
						   "sharded_seq" : SHARDED_SEQ_SCHEMA) == 0)
					return true;
				break;
			case OBJECT_TABLE:
			case OBJECT_SEQUENCE:
				if (IsOurRelation(makeRangeVarFromNameList(castNode(List, object))))
					return true;
				break;
			case OBJECT_TRIGGER:
			case OBJECT_RULE:
				/* the table's name, then the trigger's */
				if (IsOurRelation(makeRangeVarFromNameList(list_truncate(list_copy(castNode(List, object)),
																		 list_length(castNode(List, object)) - 1))))
					return true;
				break;
			case OBJECT_FUNCTION:
			case OBJECT_PROCEDURE:
			case OBJECT_ROUTINE:
				if (IsOurFunction(stmt->removeType, castNode(ObjectWithArgs, object)))
					return true;
				break;
			default:
				return false;
		}
	}
	return false;
}

/* The commands ChangesSequenceConfig looks for, whoever runs them. */
static bool
TouchesOwnObjects(Node *stmt)
{
	ListCell   *lc;

	switch (nodeTag(stmt))
	{
		case T_CreateExtensionStmt:
			return strcmp(((CreateExtensionStmt *) stmt)->extname, "sharded_seq") == 0;
		case T_AlterExtensionStmt:
			return strcmp(((AlterExtensionStmt *) stmt)->extname, "sharded_seq") == 0;
		case T_AlterExtensionContentsStmt:
			return strcmp(((AlterExtensionContentsStmt *) stmt)->extname, "sharded_seq") == 0;
		case T_CopyStmt:
			return ((CopyStmt *) stmt)->is_from && IsOurRelation(((CopyStmt *) stmt)->relation);
		case T_AlterTableStmt:
			return IsOurRelation(((AlterTableStmt *) stmt)->relation);
		case T_TruncateStmt:
			/* no table of ours references another: a cascade reaches none */
			foreach(lc, ((TruncateStmt *) stmt)->relations)
				if (IsOurRelation(lfirst_node(RangeVar, lc)))
					return true;
			return false;
		case T_ClusterStmt:
			return ((ClusterStmt *) stmt)->relation == NULL ||
				IsOurRelation(((ClusterStmt *) stmt)->relation);
		case T_VacuumStmt:
			if (!VacuumFull((VacuumStmt *) stmt))
				return false;
			if (((VacuumStmt *) stmt)->rels == NIL)
				return true;
			foreach(lc, ((VacuumStmt *) stmt)->rels)
				if (IsOurRelation(lfirst_node(VacuumRelation, lc)->relation))
					return true;
			return false;
		case T_CreateTrigStmt:
			return IsOurRelation(((CreateTrigStmt *) stmt)->relation);
		case T_RuleStmt:
			return IsOurRelation(((RuleStmt *) stmt)->relation);
		case T_CreateFunctionStmt:
			{
				char	   *fname;

				return IsOurNamespace(QualifiedNameGetCreationNamespace(((CreateFunctionStmt *) stmt)->funcname,
																		&fname));
			}
		case T_AlterFunctionStmt:
			return IsOurFunction(((AlterFunctionStmt *) stmt)->objtype,
								 ((AlterFunctionStmt *) stmt)->func);
		case T_DropStmt:
			return DropsOurs((DropStmt *) stmt);
		case T_RenameStmt:
			{
				RenameStmt *r = (RenameStmt *) stmt;

				switch (r->renameType)
				{
					case OBJECT_SCHEMA:
						return strcmp(r->subname, SHARDED_SEQ_SCHEMA) == 0;
					case OBJECT_FUNCTION:
					case OBJECT_PROCEDURE:
					case OBJECT_ROUTINE:
						return IsOurFunction(r->renameType, castNode(ObjectWithArgs, r->object));
					default:
						return r->relation != NULL && IsOurRelation(r->relation);
				}
			}
		case T_AlterObjectSchemaStmt:
			{
				AlterObjectSchemaStmt *a = (AlterObjectSchemaStmt *) stmt;

				if (strcmp(a->newschema, SHARDED_SEQ_SCHEMA) == 0)
					return true;
				if (a->relation)
					return IsOurRelation(a->relation);
				if (a->objectType == OBJECT_FUNCTION || a->objectType == OBJECT_PROCEDURE ||
					a->objectType == OBJECT_ROUTINE)
					return IsOurFunction(a->objectType, castNode(ObjectWithArgs, a->object));
				return false;
			}
		default:
			return false;
	}
}

/*
 * Could the current user change the extension's objects at all: a superuser,
 * or a role with the privileges of the role that owns its tables?  Anyone
 * else's command on them fails its own permission check (a write that a
 * granted privilege allows still marks, through the tables' triggers), and
 * must not mark first: it could hold the config lock while it waits for a
 * lock of its own, and keep every copy stale.  Never raises an error.
 */
static bool
MayAlterOwnObjects(void)
{
	Oid			relid;
	HeapTuple	tup;
	Oid			owner;

	if (superuser())
		return true;
	relid = InstalledRelid("sequence_config");
	if (!OidIsValid(relid))
		return false;			/* nothing installed, and only a superuser installs it */
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tup))
		return true;
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return has_privs_of_role(GetUserId(), owner);
}

/*
 * May this command change sequence configuration without marks of its own
 * (common/config_word.c)?  A command on a table of ours that could hide a
 * write from their triggers or replace the table (ALTER TABLE, TRUNCATE,
 * CLUSTER, VACUUM FULL, DROP, a trigger or rule made or renamed), a
 * change of a function of ours (a replaced trigger function marks
 * nothing), COPY into a table of ours, and CREATE, ALTER and DROP
 * EXTENSION, by a role that could run it.  Commands on other objects are
 * left alone, so that no role can hold every copy stale with a transaction
 * left open after DDL of its own.  Never raises an error of its own.
 */
bool
ChangesSequenceConfig(Node *stmt)
{
	return TouchesOwnObjects(stmt) && MayAlterOwnObjects();
}

/*
 * May this command change who may draw, in PostgreSQL's own catalogs: role
 * memberships (GRANT and REVOKE of a role, CREATE ROLE ... IN ROLE), a role
 * altered (SUPERUSER, INHERIT), renamed or dropped; COMMIT PREPARED, which
 * may commit one of those.  Never raises an error of its own.
 */
bool
ChangesRoles(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_GrantRoleStmt:
		case T_CreateRoleStmt:
		case T_AlterRoleStmt:
		case T_DropRoleStmt:
			return true;
		case T_RenameStmt:
			return ((RenameStmt *) stmt)->renameType == OBJECT_ROLE;
		case T_AlterOwnerStmt:
			/* a database's new owner is its pg_database_owner */
			return ((AlterOwnerStmt *) stmt)->objectType == OBJECT_DATABASE;
		case T_TransactionStmt:
			return ((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED;
		default:
			return false;
	}
}

/*
 * Is funcid our module's C function named function (as the install scripts
 * make it: same name, same C symbol, our library)?  A function replaced by
 * another, in C or not, marks nothing.
 */
static bool
IsOurCFunction(Oid funcid, const char *function)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	Form_pg_proc proc;
	bool		ours = false;

	if (!HeapTupleIsValid(tup))
		return false;
	proc = (Form_pg_proc) GETSTRUCT(tup);
	if (proc->prolang == ClanguageId && proc->pronamespace == ConfigNamespace() &&
		strcmp(NameStr(proc->proname), function) == 0)
	{
		bool		null_src;
		bool		null_bin;
		Datum		src = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_prosrc, &null_src);
		Datum		bin = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_probin, &null_bin);

		if (!null_src && !null_bin)
		{
			char	   *symbol = TextDatumGetCString(src);
			char	   *library = TextDatumGetCString(bin);

			/* as the install scripts' MODULE_PATHNAME makes it */
			ours = strcmp(symbol, function) == 0 && strcmp(library, "$libdir/sharded_seq") == 0;
			pfree(symbol);
			pfree(library);
		}
	}
	ReleaseSysCache(tup);
	return ours;
}

/*
 * The events that triggers of ours calling function cover on relid, as
 * snapshot sees pg_trigger: for each row (*row) and for each statement
 * (*stmt), as TRIGGER_TYPE_INSERT etc.  Only a trigger enabled ALWAYS, with
 * no column list and no WHEN, whose function is the extension's C function
 * of that name (IsOurCFunction), counts: a disabled one, as pg_restore --disable-triggers
 * leaves it for a moment, hides writes from the marks it makes.
 */
void
OwnTriggerEvents(Oid relid, const char *function, Snapshot snapshot, int16 *row, int16 *stmt)
{
	Relation	trigrel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;

	*row = 0;
	*stmt = 0;
	trigrel = table_open(TriggerRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_trigger_tgrelid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(trigrel, TriggerRelidNameIndexId, true, snapshot, 1, &key);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		Form_pg_trigger t = (Form_pg_trigger) GETSTRUCT(tup);

		if (t->tgenabled != TRIGGER_FIRES_ALWAYS || t->tgattr.dim1 != 0 ||
			!heap_attisnull(tup, Anum_pg_trigger_tgqual, RelationGetDescr(trigrel)) ||
			!IsOurCFunction(t->tgfoid, function))
			continue;
		if (TRIGGER_FOR_ROW(t->tgtype))
			*row |= t->tgtype;
		else
			*stmt |= t->tgtype;
	}
	systable_endscan(scan);
	table_close(trigrel, AccessShareLock);
}

/*
 * Is the safety net of kept totals in place on counter_shards: the trigger
 * rows_changed_elsewhere for every row inserted, updated or deleted, and
 * for TRUNCATE?  A schema older than 1.3 has none.
 */
bool
ShardTriggersInPlace(Oid shards_relid, Snapshot snapshot)
{
	int16		row;
	int16		stmt;
	int16		rows = TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_DELETE;

	OwnTriggerEvents(shards_relid, "rows_changed_elsewhere", snapshot, &row, &stmt);
	return (row & rows) == rows && (stmt & TRIGGER_TYPE_TRUNCATE) != 0;
}

/*
 * The extension's triggers and when each must fire.  ALTER TABLE ... ENABLE
 * TRIGGER ALL (as pg_restore --disable-triggers ends) enables every trigger
 * "on origin", which would leave writes by logical replication's apply
 * worker unmarked; RestoreTriggerModes puts them back.
 */
static const struct
{
	const char *table;
	const char *trigger;
	char		fires;
	const char *mode;
}			OwnTriggers[] =
{
	{"counter_shards", "rows_changed_elsewhere", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"counter_shards", "rows_truncated_elsewhere", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"node_claims", "claims_changed", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"counter_config", "config_replicated", TRIGGER_FIRES_ON_REPLICA, "REPLICA"},
	{"sequence_config", "sequence_arrived", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"sequence_config", "config_deleted", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"sequence_config", "config_truncated", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"sequence_shards", "shards_changed", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"sequence_shards", "shards_truncated", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"cutover_stops", "stops_changed", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
	{"cutover_stops", "stops_truncated", TRIGGER_FIRES_ALWAYS, "ALWAYS"},
};

/* Is stmt an ALTER TABLE of a table of the extension's?  Never raises an error. */
bool
AltersOwnTable(Node *stmt)
{
	Oid			relid;
	Oid			namespace;

	if (!IsA(stmt, AlterTableStmt))
		return false;
	relid = RelidOf(((AlterTableStmt *) stmt)->relation);
	namespace = get_namespace_oid(SHARDED_SEQ_SCHEMA, true);
	return OidIsValid(relid) && OidIsValid(namespace) && get_rel_namespace(relid) == namespace;
}

/*
 * After an ALTER TABLE of one of the extension's tables: every trigger of the extension that is enabled but
 * not in its own firing mode gets it back (a disabled one stays disabled,
 * as a restore in progress leaves it), with a NOTICE.  Runs as the caller,
 * who could alter the table.
 */
void
RestoreTriggerModes(void)
{
	Oid			namespace = get_namespace_oid(SHARDED_SEQ_SCHEMA, true);

	if (!OidIsValid(namespace))
		return;
	for (int i = 0; i < lengthof(OwnTriggers); i++)
	{
		Oid			relid = get_relname_relid(OwnTriggers[i].table, namespace);
		Relation	trigrel;
		SysScanDesc scan;
		ScanKeyData keys[2];
		HeapTuple	tup;
		char		enabled = TRIGGER_DISABLED;
		char	   *sql;

		if (!OidIsValid(relid))
			continue;
		trigrel = table_open(TriggerRelationId, AccessShareLock);
		ScanKeyInit(&keys[0], Anum_pg_trigger_tgrelid, BTEqualStrategyNumber, F_OIDEQ,
					ObjectIdGetDatum(relid));
		ScanKeyInit(&keys[1], Anum_pg_trigger_tgname, BTEqualStrategyNumber, F_NAMEEQ,
					CStringGetDatum(OwnTriggers[i].trigger));
		scan = systable_beginscan(trigrel, TriggerRelidNameIndexId, true, NULL, 2, keys);
		if (HeapTupleIsValid(tup = systable_getnext(scan)))
			enabled = ((Form_pg_trigger) GETSTRUCT(tup))->tgenabled;
		systable_endscan(scan);
		table_close(trigrel, AccessShareLock);
		if (enabled == TRIGGER_DISABLED || enabled == OwnTriggers[i].fires)
			continue;
		sql = psprintf("ALTER TABLE %s.%s ENABLE %s TRIGGER %s", SHARDED_SEQ_SCHEMA,
					   OwnTriggers[i].table, OwnTriggers[i].mode, OwnTriggers[i].trigger);
		ereport(NOTICE,
				(errmsg("trigger %s on %s.%s fires %s again",
						OwnTriggers[i].trigger, SHARDED_SEQ_SCHEMA, OwnTriggers[i].table,
						OwnTriggers[i].mode),
				 errdetail("ENABLE TRIGGER enables a trigger on origin only; the extension needs this one to fire %s.",
						   OwnTriggers[i].mode)));
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
			elog(ERROR, "could not run: %s", sql);
		SPI_finish();
		pfree(sql);
	}
}

/* A stored mode name, as the schema in force means it. */
CounterMode
ParseCounterMode(const char *mode, int len)
{
	if (len == 8 && memcmp(mode, "buffered", 8) == 0)
		return WriteBehindModesSplit() ? MODE_BUFFERED : MODE_MEMCACHED;
	if (len == 9 && memcmp(mode, "memcached", 9) == 0)
		return MODE_MEMCACHED;
	return MODE_EXACT;
}

/* The name a mode is stored under in the schema in force. */
const char *
StoredModeName(CounterMode mode)
{
	switch (mode)
	{
		case MODE_BUFFERED:
			return "buffered";
		case MODE_MEMCACHED:
			return WriteBehindModesSplit() ? "memcached" : "buffered";
		default:
			return "exact";
	}
}

/*
 * Does sequence_shards keep each generation's layout (schema 1.1)?  A newer
 * library may run against an older schema until ALTER EXTENSION UPDATE.
 */
bool
ShardLayoutsStored(void)
{
	return get_attnum(ConfigRelid("sequence_shards"), "gen_base") != InvalidAttrNumber;
}

/*
 * Which installation of the extension is in force: counter_config's OID, or
 * InvalidOid when the extension is not installed (say, dropped by this very
 * transaction).  Never raises an error.
 */
Oid
CurrentInstallation(void)
{
	return InstalledRelid("counter_config");
}

/* The role that owns the extension's tables, which the admin code acts as. */
Oid
ExtensionOwner(void)
{
	if (!OidIsValid(cached_owner))
	{
		HeapTuple	tup;
		Oid			relid = ConfigRelid("sequence_config");

		tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
		if (!HeapTupleIsValid(tup))
			elog(ERROR, "cache lookup failed for relation %u", relid);
		cached_owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
		ReleaseSysCache(tup);
	}
	return cached_owner;
}

/*
 * A random number drawn when the extension is created, so that memcached
 * keys of an earlier installation in the same database are never read.
 * 0 for an installation upgraded from 1.0, which keeps 1.0's keys.
 */
uint64
InstallationToken(void)
{
	if (!cached_token_valid)
	{
		Oid			relid = get_relname_relid("installation", ConfigNamespace());
		Relation	rel;
		Snapshot	snapshot;
		TableScanDesc scan;
		HeapTuple	tup;
		bool		isnull = true;
		Datum		token = 0;

		/* schema 1.0, not updated yet: 1.0's keys */
		if (!OidIsValid(relid))
			return 0;
		rel = table_open(relid, AccessShareLock);
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		scan = table_beginscan(rel, snapshot, 0, NULL);
		tup = heap_getnext(scan, ForwardScanDirection);
		if (HeapTupleIsValid(tup))
			token = heap_getattr(tup, 1, RelationGetDescr(rel), &isnull);
		table_endscan(scan);
		UnregisterSnapshot(snapshot);
		table_close(rel, AccessShareLock);
		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("table %s.installation is empty", SHARDED_SEQ_SCHEMA),
					 errhint("Reinstall the extension: DROP EXTENSION sharded_seq; CREATE EXTENSION sharded_seq.")));
		cached_token = (uint64) DatumGetInt64(token);
		cached_token_valid = true;
	}
	return cached_token;
}

void
ReportNotFound(ObjectKind kind, const char *name)
{
	if (kind == KIND_SEQUENCE)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("sharded sequence \"%s\" does not exist", name),
				 errhint("Create it with sharded_seq.create_sequence('%s'), or list the existing ones in sharded_seq.sequences.", name)));
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("counter \"%s\" does not exist", name),
			 errhint("Create it with sharded_seq.create_counter('%s'), or list the existing ones in sharded_seq.counters.", name)));
}

/*
 * Prepare (once per backend) a plan kept across transactions.  The plan
 * refers to our tables by schema-qualified name, so it follows a
 * DROP/CREATE EXTENSION through plan invalidation.
 */
SPIPlanPtr
PreparePlan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	if (*cache == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		*cache = plan;
	}
	return *cache;
}
