/*
 * adopt.c
 *	  adopt_column and release_column: move a table's column from a native
 *	  sequence (serial, identity, or none) to a sharded sequence, and back,
 *	  in one transaction, safe next to concurrent inserts.
 *
 * Both lock the table ACCESS EXCLUSIVE first: that waits for every
 * transaction that inserted (with the old default, whenever it commits) and
 * holds new inserts until the change commits; they then plan again with the
 * new default.  Only then are max(column) and the old positions read, with a
 * fresh snapshot (so READ COMMITTED only), and the new start set above both.
 * max(column) is read as the extension's owner with row security off: rows a
 * policy hides from the caller hold values too.  The DDL runs with the
 * caller's rights; a new sharded sequence is created as the table's owner
 * (who can then give the column back), and the record of what a column was
 * (adopted_columns, keyed by attnum: it survives a rename) is written as the
 * extension's owner.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_attribute.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "sequence/sequence_internal.h"

typedef enum ColumnKind
{
	COLUMN_NONE,				/* no default */
	COLUMN_SERIAL,				/* nextval() of a sequence owned by the column */
	COLUMN_IDENTITY_ALWAYS,
	COLUMN_IDENTITY_BY_DEFAULT
} ColumnKind;

/* as stored in adopted_columns.previous */
static const char *const KindNames[] = {"none", "serial", "identity always", "identity by default"};

typedef struct ColumnFacts
{
	Oid			relid;
	Oid			owner;			/* the table's */
	int16		attnum;
	char	   *table;			/* qualified and quoted */
	char	   *relname;
	Oid			nsp;
	const char *column;
	char	   *qcolumn;		/* quoted */
	Oid			type;			/* INT4OID or INT8OID */
	char		identity;		/* attidentity */
	char	   *default_expr;	/* NULL: none */
	Oid			seq;			/* the column's own sequence (serial, identity) */
	bool		nextval_of_seq; /* the default is nextval(seq) */
	char	   *sharded_name;	/* the default is sharded_nextval(this) */
	char	   *ext_schema;		/* the extension's schema, quoted */
} ColumnFacts;

/*
 * A default that draws from a sharded sequence, as pg_get_expr() prints it
 * under the pinned search_path: [1] its schema (only the extension's
 * counts), [2] the name with its quotes doubled.
 */
#define SHARDED_DEFAULT_RE "^(?:([^(]*)\\.)?sharded_nextval\\('((?:[^']|'')*)'::text\\)$"

static char *
QualifiedName(Oid relid)
{
	return quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
									  get_rel_name(relid));
}

/*
 * A serial column's sequence that another column's default draws from too:
 * the DROP after the switch would fail (2BP01).  Say so, and what to do.
 * SPI connected.
 */
static void
RefuseSharedSequence(ColumnFacts *f)
{
	Oid			types[3] = {OIDOID, OIDOID, INT2OID};
	Datum		args[3] = {ObjectIdGetDatum(f->seq), ObjectIdGetDatum(f->relid), Int16GetDatum(f->attnum)};

	if (SPI_execute_with_args("SELECT a.adrelid::pg_catalog.regclass::pg_catalog.text, t.attname::pg_catalog.text"
							  " FROM pg_catalog.pg_depend d"
							  " JOIN pg_catalog.pg_attrdef a ON a.oid OPERATOR(pg_catalog.=) d.objid"
							  " JOIN pg_catalog.pg_attribute t ON t.attrelid OPERATOR(pg_catalog.=) a.adrelid"
							  "  AND t.attnum OPERATOR(pg_catalog.=) a.adnum"
							  " WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_attrdef'::pg_catalog.regclass"
							  "   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
							  "   AND d.refobjid OPERATOR(pg_catalog.=) $1"
							  "   AND NOT (a.adrelid OPERATOR(pg_catalog.=) $2 AND a.adnum OPERATOR(pg_catalog.=) $3)"
							  " LIMIT 1", 3, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the dependencies of sequence %u", f->seq);
	if (SPI_processed == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
			 errmsg("sequence %s of column \"%s\" is also the default of column \"%s\" of relation %s",
					QualifiedName(f->seq), f->column,
					SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2),
					SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1)),
			 errdetail("adopt_column drops a serial column's sequence once the column draws from a sharded sequence."),
			 errhint("Give the other column a sequence of its own first (CREATE SEQUENCE, then ALTER TABLE ... ALTER COLUMN ... SET DEFAULT nextval(...)).")));
}

/* One value of a query run as the caller; false if NULL or no row. */
static bool
QueryInt64(const char *sql, int64 *value)
{
	bool		isnull;
	Datum		d;

	if (SPI_execute(sql, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not run \"%s\"", sql);
	if (SPI_processed == 0)
		return false;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return false;
	*value = DatumGetInt64(d);
	return true;
}

static void
RunDdl(const char *sql)
{
	if (SPI_execute(sql, false, 0) < 0)
		elog(ERROR, "could not run \"%s\"", sql);
}

/* The extension's schema, quoted as pg_get_expr() prints it. */
static char *
ExtensionSchema(void)
{
	bool		isnull;

	if (SPI_execute("SELECT pg_catalog.quote_ident(n.nspname::pg_catalog.text)"
					"  FROM pg_catalog.pg_extension e"
					"  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
					" WHERE e.extname OPERATOR(pg_catalog.=) 'sharded_seq'", false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not find the schema of extension sharded_seq");
	return TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The common prologue: check the arguments and the caller's ownership of
 * the table, lock it, and read what the column is.  Leaves SPI connected
 * (as the caller).
 */
static void
BeginColumnChange(FunctionCallInfo fcinfo, const char *function, ColumnFacts *f)
{
	static const char *sql =
		"SELECT c.relkind::pg_catalog.text,"
		"       c.relispartition OR EXISTS (SELECT FROM pg_catalog.pg_inherits i"
		"          WHERE i.inhrelid OPERATOR(pg_catalog.=) c.oid OR i.inhparent OPERATOR(pg_catalog.=) c.oid),"
		"       a.atttypid, a.attidentity::pg_catalog.text, a.attgenerated::pg_catalog.text,"
		"       pg_catalog.pg_get_expr(d.adbin, d.adrelid),"
		"       s.seq,"
		"       pg_catalog.pg_get_expr(d.adbin, d.adrelid) OPERATOR(pg_catalog.=)"
		"         pg_catalog.format('nextval(%L::regclass)', s.seq::pg_catalog.regclass),"
		"       CASE WHEN m.m[1] IS NULL OR m.m[1] OPERATOR(pg_catalog.=) $4"
		"            THEN pg_catalog.replace(m.m[2], '''''', '''') END,"
		"       a.attnum, c.relowner"
		"  FROM pg_catalog.pg_class c"
		"  JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid"
		"   AND a.attname OPERATOR(pg_catalog.=) $2 AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped"
		"  LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid OPERATOR(pg_catalog.=) c.oid"
		"   AND d.adnum OPERATOR(pg_catalog.=) a.attnum"
		"  CROSS JOIN LATERAL (SELECT pg_catalog.pg_get_serial_sequence(c.oid::pg_catalog.regclass::pg_catalog.text,"
		"          a.attname::pg_catalog.text)::pg_catalog.regclass::pg_catalog.oid AS seq) s"
		"  LEFT JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(d.adbin, d.adrelid), $3) m(m) ON true"
		" WHERE c.oid OPERATOR(pg_catalog.=) $1";
	Oid			types[4] = {OIDOID, NAMEOID, TEXTOID, TEXTOID};
	Datum		args[4];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	char		relkind;
	char	   *generated;
	Datum		d;

	for (int i = 0; i < 2; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", i == 0 ? "tbl" : "col"),
					 errhint("Pass the table and the name of its column, as in %s('orders', 'id').", function)));
	f->relid = PG_GETARG_OID(0);
	f->column = NameStr(*PG_GETARG_NAME(1));

	PreventCommandIfReadOnly(function);
	CutoverStopCheck();
	/* the snapshot must be taken after the lock: see the file's comment */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("%s cannot run in a %s transaction", function,
						IsolationIsSerializable() ? "serializable" : "repeatable read"),
				 errdetail("It must see the rows committed while it waited for the table's lock."),
				 errhint("Run it in a READ COMMITTED transaction.")));
	if (CitusGroup() >= 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s does not work in a Citus cluster", function),
				 errdetail("It would make a sequence on this node alone, and change a table that Citus keeps on every node."),
				 errhint("Create the sequence on the coordinator (sharded_seq.create_sequence, with advance_sequence past the ids in use), then ALTER TABLE ... ALTER COLUMN ... SET DEFAULT sharded_nextval(...).")));
	if (SessionNodeId() != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s works on node 0 only", function),
				 errdetail("This session draws as node %d (sharded_seq.node_id), whose values lie far above a native sequence's.",
						   SessionNodeId()),
				 errhint("Switch the column with sharded_seq.node_id = 0, before the other nodes use it.")));
	relkind = get_rel_relkind(f->relid);
	if (relkind == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table with OID %u does not exist", f->relid),
				 errhint("Pass an existing table.")));
	if (!RelationOwnedBy(f->relid, GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of table %s", get_rel_name(f->relid)),
				 errhint("Run %s as the table's owner, as ALTER TABLE requires.", function)));

	/* waits for transactions that inserted; holds new ones until commit */
	LockRelationOid(f->relid, AccessExclusiveLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(f->relid)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table with OID %u was dropped", f->relid),
				 errhint("Pass an existing table.")));
	f->table = QualifiedName(f->relid);
	f->relname = get_rel_name(f->relid);
	f->nsp = get_rel_namespace(f->relid);
	f->qcolumn = (char *) quote_identifier(f->column);

	SPI_connect();
	f->ext_schema = ExtensionSchema();
	args[0] = ObjectIdGetDatum(f->relid);
	args[1] = PointerGetDatum(PG_GETARG_NAME(1));
	args[2] = CStringGetTextDatum(SHARDED_DEFAULT_RE);
	args[3] = CStringGetTextDatum(f->ext_schema);
	if (SPI_execute_with_args(sql, 4, types, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read column \"%s\" of %s", f->column, f->table);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist", f->column, f->relname),
				 errhint("Pass the name of one of the table's columns.")));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	relkind = *TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
	if (relkind == RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s does not support partitioned tables", function),
				 errdetail("Each partition keeps a default and an identity of its own."),
				 errhint("Switch the column of the partitioned table and of each partition by hand, in one transaction that first locks the partitioned table.")));
	if (relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", f->relname),
				 errhint("Pass an ordinary table.")));
	if (DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s does not support tables in an inheritance tree or partitions", function),
				 errdetail("Rows of \"%s\" may live in other tables, with other defaults.", f->relname),
				 errhint("Switch the columns of the whole tree by hand, in one transaction that first locks every table of it.")));
	f->type = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
	f->identity = *TextDatumGetCString(SPI_getbinval(tup, desc, 4, &isnull));
	generated = TextDatumGetCString(SPI_getbinval(tup, desc, 5, &isnull));
	if (generated[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_DEFINITION),
				 errmsg("column \"%s\" of relation \"%s\" is a generated column", f->column, f->relname),
				 errhint("Pass a column that takes its values from a sequence.")));
	if (f->type != INT4OID && f->type != INT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" of relation \"%s\" is of type %s", f->column, f->relname,
						format_type_be(f->type)),
				 errhint("A sharded sequence fills bigint and integer columns only.")));
	d = SPI_getbinval(tup, desc, 6, &isnull);
	f->default_expr = isnull ? NULL : TextDatumGetCString(d);
	d = SPI_getbinval(tup, desc, 7, &isnull);
	f->seq = isnull ? InvalidOid : DatumGetObjectId(d);
	d = SPI_getbinval(tup, desc, 8, &isnull);
	f->nextval_of_seq = !isnull && DatumGetBool(d);
	d = SPI_getbinval(tup, desc, 9, &isnull);
	f->sharded_name = isnull ? NULL : TextDatumGetCString(d);
	f->attnum = DatumGetInt16(SPI_getbinval(tup, desc, 10, &isnull));
	f->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 11, &isnull));
}

/*
 * max(column), false for an empty table.  As the extension's owner with row
 * security off: a policy that hides rows from the caller (FORCE ROW LEVEL
 * SECURITY) must not hide their values; where it would still apply, the
 * query fails rather than count short.
 */
static bool
ColumnMax(ColumnFacts *f, int64 *max)
{
	OwnerContext ctx;
	bool		found;

	BeginAsOwner(&ctx);
	(void) set_config_option("row_security", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	found = QueryInt64(psprintf("SELECT pg_catalog.max(%s)::pg_catalog.int8 FROM ONLY %s",
								f->qcolumn, f->table), max);
	EndAsOwner(&ctx);
	return found;
}

/* nextval('name'::regclass) alone, as pg_get_expr() prints it */
static bool
IsPlainNextval(const char *expr)
{
	static const char prefix[] = "nextval('";
	static const char suffix[] = "'::regclass)";
	size_t		len = strlen(expr);

	return len > strlen(prefix) + strlen(suffix) &&
		strncmp(expr, prefix, strlen(prefix)) == 0 &&
		strcmp(expr + len - strlen(suffix), suffix) == 0 &&
		strchr(expr + strlen(prefix), '(') == NULL;
}

/* The default a sharded sequence gives: the function in the extension's schema. */
static char *
ShardedDefault(const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	bool		isnull;

	if (SPI_execute_with_args("SELECT pg_catalog.format('%I.sharded_nextval(%L)', n.nspname, $1)"
							  "  FROM pg_catalog.pg_extension e"
							  "  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
							  " WHERE e.extname OPERATOR(pg_catalog.=) 'sharded_seq'",
							  1, types, args, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not find the schema of extension sharded_seq");
	return TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The record of what a column was, as the extension's owner.  Records of
 * dropped tables and columns go too: nothing else removes them.
 */
static void
Record(ColumnFacts *f, const char *name, ColumnKind kind, bool keep)
{
	OwnerContext ctx;
	Oid			types[5] = {OIDOID, INT2OID, TEXTOID, TEXTOID, TEXTOID};
	Datum		args[5];
	const char *sql = keep ?
		"INSERT INTO sharded_seq.adopted_columns (table_name, attnum, column_name, sequence_name, previous)"
		" VALUES ($1::pg_catalog.regclass, $2, $3, $4, $5)"
		" ON CONFLICT (table_name, attnum) DO UPDATE"
		" SET column_name = excluded.column_name, sequence_name = excluded.sequence_name,"
		"     previous = excluded.previous, adopted_at = excluded.adopted_at" :
		"DELETE FROM sharded_seq.adopted_columns"
		" WHERE table_name OPERATOR(pg_catalog.=) $1::pg_catalog.regclass AND attnum OPERATOR(pg_catalog.=) $2";

	args[0] = ObjectIdGetDatum(f->relid);
	args[1] = Int16GetDatum(f->attnum);
	args[2] = CStringGetTextDatum(f->column);
	args[3] = CStringGetTextDatum(name);
	args[4] = CStringGetTextDatum(KindNames[kind]);
	BeginAsOwner(&ctx);
	if (SPI_execute_with_args(sql, keep ? 5 : 2, types, args, NULL, false, 0) < 0)
		elog(ERROR, "could not record column \"%s\" of %s", f->column, f->table);
	if (SPI_execute("DELETE FROM sharded_seq.adopted_columns c WHERE NOT EXISTS"
					" (SELECT FROM pg_catalog.pg_attribute a"
					"   WHERE a.attrelid OPERATOR(pg_catalog.=) c.table_name::pg_catalog.oid"
					"     AND a.attnum OPERATOR(pg_catalog.=) c.attnum AND NOT a.attisdropped)",
					false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not remove the records of dropped columns");
	EndAsOwner(&ctx);
}

/*
 * Does a column other than f's draw from sharded sequence name: by its
 * record in adopted_columns, or by a default of its own (set by hand)?
 */
static bool
SequenceUsedElsewhere(ColumnFacts *f, const char *name)
{
	Oid			types[5] = {OIDOID, INT2OID, TEXTOID, TEXTOID, TEXTOID};
	Datum		args[5];
	bool		isnull;

	args[0] = ObjectIdGetDatum(f->relid);
	args[1] = Int16GetDatum(f->attnum);
	args[2] = CStringGetTextDatum(name);
	args[3] = CStringGetTextDatum(SHARDED_DEFAULT_RE);
	args[4] = CStringGetTextDatum(f->ext_schema);
	if (SPI_execute_with_args("SELECT EXISTS (SELECT FROM sharded_seq.adopted_columns c"
							  "   WHERE c.sequence_name OPERATOR(pg_catalog.=) $3"
							  "     AND NOT (c.table_name::pg_catalog.oid OPERATOR(pg_catalog.=) $1"
							  "              AND c.attnum OPERATOR(pg_catalog.=) $2))"
							  "    OR EXISTS (SELECT FROM pg_catalog.pg_attrdef d"
							  "   CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(d.adbin, d.adrelid), $4) m(m)"
							  "   WHERE NOT (d.adrelid OPERATOR(pg_catalog.=) $1 AND d.adnum OPERATOR(pg_catalog.=) $2)"
							  "     AND (m.m[1] IS NULL OR m.m[1] OPERATOR(pg_catalog.=) $5)"
							  "     AND pg_catalog.replace(m.m[2], '''''', '''') OPERATOR(pg_catalog.=) $3)",
							  5, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not find the columns that draw from sharded sequence \"%s\"", name);
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* What the sharded sequence is, as the sequences view shows it to the caller. */
static bool
ShardedState(const char *name, int64 *start, int64 *high, int32 *shards, int32 *block,
			 Oid *owner)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	if (SPI_execute_with_args("SELECT generation_start, reserved_high_water, shards, block,"
							  "       owner::pg_catalog.oid"
							  "  FROM sharded_seq.sequences WHERE name OPERATOR(pg_catalog.=) $1",
							  1, types, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded sequence \"%s\"", name);
	if (SPI_processed == 0)
		return false;
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	*owner = DatumGetObjectId(SPI_getbinval(tup, desc, 5, &isnull));
	*start = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	d = SPI_getbinval(tup, desc, 2, &isnull);
	*high = isnull ? *start - 1 : DatumGetInt64(d);
	*shards = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
	*block = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
	return true;
}

PG_FUNCTION_INFO_V1(adopt_column);
Datum
adopt_column(PG_FUNCTION_ARGS)
{
	ColumnFacts f;
	ColumnKind	kind;
	char	   *name;
	bool		have_past = false;
	int64		past = 0;
	int64		value;
	int64		start;
	int64		high;
	int64		reach;
	int32		shards;
	int32		block;
	Oid			seq_owner;
	bool		named = !PG_ARGISNULL(2);

	BeginColumnChange(fcinfo, "sharded_seq.adopt_column", &f);
	if (f.sharded_name)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of relation \"%s\" already draws from sharded sequence \"%s\"",
						f.column, f.relname, f.sharded_name),
				 errhint("sharded_seq.release_column() gives it back to a native sequence.")));
	if (f.identity == ATTRIBUTE_IDENTITY_ALWAYS)
		kind = COLUMN_IDENTITY_ALWAYS;
	else if (f.identity == ATTRIBUTE_IDENTITY_BY_DEFAULT)
		kind = COLUMN_IDENTITY_BY_DEFAULT;
	else if (OidIsValid(f.seq) && (f.default_expr == NULL || f.nextval_of_seq))
		kind = COLUMN_SERIAL;
	else if (f.default_expr == NULL)
		kind = COLUMN_NONE;
	else
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of relation \"%s\" has a default that is not its own sequence: %s",
						f.column, f.relname, f.default_expr),
				 OidIsValid(f.seq) ?
				 errhint("Set the default back to nextval(%s) first, or drop it (ALTER TABLE %s ALTER COLUMN %s DROP DEFAULT): only the column's own sequence is switched.",
						 quote_literal_cstr(QualifiedName(f.seq)), f.table, f.qcolumn) :
				 IsPlainNextval(f.default_expr) ?
				 errhint("Make the sequence the column's own first (ALTER SEQUENCE ... OWNED BY %s.%s): it is dropped once the column draws from a sharded sequence.",
						 f.table, f.qcolumn) :
				 errhint("Drop the default first (ALTER TABLE %s ALTER COLUMN %s DROP DEFAULT).",
						 f.table, f.qcolumn)));

	/* <table>_<column>, shortened to a name's length as PostgreSQL does */
	name = named ? text_to_cstring(PG_GETARG_TEXT_PP(2))
		: makeObjectName(f.relname, f.column, NULL);
	ValidateName(name, KIND_SEQUENCE);

	/*
	 * The old sequence: locked against nextval() (which takes RowExclusive
	 * until its transaction ends) before its position is read, so nothing
	 * it hands out escapes the count; it is dropped below.  The highest
	 * value it gave: last_value ascending, its start (or a higher setval)
	 * descending, its maxvalue if it may have cycled.
	 */
	if (kind != COLUMN_NONE)
	{
		int64		cycle_max;

		LockRelationOid(f.seq, AccessExclusiveLock);
		if (QueryInt64(psprintf("SELECT s.seqmax FROM pg_catalog.pg_sequence s"
								" WHERE s.seqrelid OPERATOR(pg_catalog.=) %u AND s.seqcycle", f.seq),
					   &cycle_max) && cycle_max == PG_INT64_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
					 errmsg("sequence %s cycles up to the largest bigint", QualifiedName(f.seq)),
					 errdetail("A cycling sequence may have handed out any value up to its maxvalue."),
					 errhint("If it never wrapped around, ALTER SEQUENCE %s NO CYCLE first.", QualifiedName(f.seq))));
		have_past = QueryInt64(psprintf("SELECT CASE WHEN s.seqcycle THEN s.seqmax"
										"  WHEN s.seqincrement OPERATOR(pg_catalog.<) 0"
										"  THEN pg_catalog.int8larger(s.seqstart, l.last_value)"
										"  ELSE l.last_value END"
										"  FROM pg_catalog.pg_sequence s, %s l"
										" WHERE s.seqrelid OPERATOR(pg_catalog.=) %u",
										QualifiedName(f.seq), f.seq), &past);
	}
	if (ColumnMax(&f, &value) && (!have_past || value > past))
	{
		past = value;
		have_past = true;
	}
	if (have_past && past == PG_INT64_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("column \"%s\" of relation \"%s\" holds the largest bigint", f.column, f.relname),
				 errhint("No sequence can go above it.")));

	if (ShardedState(name, &start, &high, &shards, &block, &seq_owner))
	{
		/* a default name that clashes (t1.orders.id, t2.orders.id) */
		if (!named)
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("sharded sequence \"%s\" already exists", name),
					 errdetail("Another column may draw from it."),
					 errhint("Pass sequence => '%s' to share it, or sequence => 'another_name' for a sequence of its own.", name)));
		/* its owner could drop it and create it again lower */
		if (seq_owner != f.owner && seq_owner != GetUserId())
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("sharded sequence \"%s\" is owned by role \"%s\", neither the table's owner nor the caller",
							name, GetUserNameFromId(seq_owner, false)),
					 errdetail("Its owner could drop it and create it again lower."),
					 errhint("Pass the name of a sharded sequence the table's owner owns, or leave sequence out.")));
		/* someone else's values may come from it: it is not moved */
		if (have_past && start <= past)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("sharded sequence \"%s\" starts at %lld, not above %lld, what column \"%s\" already holds",
							name, (long long) start, (long long) past, f.column),
					 errhint("Leave sequence out to create a new one, or move it well past the column's values first with sharded_seq.advance_sequence().")));
	}
	else
	{
		Oid			types[4] = {TEXTOID, INT4OID, INT4OID, INT8OID};
		Datum		args[4];
		char		nulls[4] = {' ', ' ', ' ', ' '};
		Oid			save_user;
		int			save_context;

		args[0] = CStringGetTextDatum(name);
		for (int i = 1; i < 3; i++)
		{
			args[i] = PG_ARGISNULL(i + 2) ? (Datum) 0 : PG_GETARG_DATUM(i + 2);
			nulls[i] = PG_ARGISNULL(i + 2) ? 'n' : ' ';
		}
		args[3] = Int64GetDatum(have_past ? past + 1 : 1);
		/* as the table's owner (the caller has its rights): it can give the column back */
		GetUserIdAndSecContext(&save_user, &save_context);
		SetUserIdAndSecContext(f.owner, save_context | SECURITY_LOCAL_USERID_CHANGE);
		if (SPI_execute_with_args("SELECT sharded_seq.create_sequence(name => $1, shards => $2,"
								  " block => $3, start => $4)",
								  4, types, args, nulls, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not create sharded sequence \"%s\"", name);
		SetUserIdAndSecContext(save_user, save_context);
		if (!ShardedState(name, &start, &high, &shards, &block, &seq_owner))
			elog(ERROR, "sharded sequence \"%s\" is missing after its creation", name);
	}

	/* an integer column: the first blocks of every shard must fit */
	if (pg_add_s64_overflow(start, (int64) shards * block - 1, &reach))
		reach = PG_INT64_MAX;
	reach = Max(reach, high);
	if (f.type == INT4OID && reach > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("sharded sequence \"%s\" would hand out values up to %lld, beyond integer column \"%s\"",
						name, (long long) reach, f.column),
				 errdetail("Its values start at %lld in %d shards of blocks of %d.", (long long) start, shards, block),
				 errhint("Pass fewer shards or a smaller block (shards => 1, block => 100), or make the column bigint first.")));

	if (kind == COLUMN_SERIAL)
		RefuseSharedSequence(&f);
	if (kind == COLUMN_IDENTITY_ALWAYS || kind == COLUMN_IDENTITY_BY_DEFAULT)
		RunDdl(psprintf("ALTER TABLE %s ALTER COLUMN %s DROP IDENTITY", f.table, f.qcolumn));
	RunDdl(psprintf("ALTER TABLE %s ALTER COLUMN %s SET DEFAULT %s",
					f.table, f.qcolumn, ShardedDefault(name)));
	if (kind == COLUMN_SERIAL)
		RunDdl(psprintf("DROP SEQUENCE %s", QualifiedName(f.seq)));
	SPI_finish();
	Record(&f, name, kind, true);
	PG_RETURN_INT64(start);
}

PG_FUNCTION_INFO_V1(release_column);
Datum
release_column(PG_FUNCTION_ARGS)
{
	ColumnFacts f;
	ColumnKind	kind = COLUMN_NONE;
	Oid			types[3] = {OIDOID, INT2OID, TEXTOID};
	Datum		args[3];
	int64		past;
	int64		value;
	const char *type;
	bool		used;
	bool		owned;
	bool		isnull;

	BeginColumnChange(fcinfo, "sharded_seq.release_column", &f);
	if (f.sharded_name == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of relation \"%s\" does not draw from a sharded sequence", f.column, f.relname),
				 f.default_expr ? errdetail("Its default is %s.", f.default_expr) : errdetail("It has no default."),
				 errhint("release_column() gives back a column whose default is sharded_nextval('name').")));

	/* a native sequence is created in the table's schema, as the caller */
	args[0] = ObjectIdGetDatum(f.nsp);
	if (SPI_execute_with_args("SELECT pg_catalog.has_schema_privilege($1, 'CREATE')",
							  1, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not check the privileges on schema %u", f.nsp);
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must have create privilege on schema %s to give back column \"%s\" of relation \"%s\"",
						quote_identifier(get_namespace_name(f.nsp)), f.column, f.relname),
				 errdetail("The column gets a native sequence (or identity) of its own in the table's schema."),
				 errhint("GRANT CREATE ON SCHEMA %s to role \"%s\" first.",
						 quote_identifier(get_namespace_name(f.nsp)), GetUserNameFromId(GetUserId(), false))));

	/* what it was when adopted (none when switched by hand: a serial column now) */
	args[0] = ObjectIdGetDatum(f.relid);
	args[1] = Int16GetDatum(f.attnum);
	args[2] = CStringGetTextDatum(f.sharded_name);
	if (SPI_execute_with_args("SELECT previous FROM sharded_seq.adopted_columns"
							  " WHERE table_name OPERATOR(pg_catalog.=) $1::pg_catalog.regclass"
							  "   AND attnum OPERATOR(pg_catalog.=) $2"
							  "   AND sequence_name OPERATOR(pg_catalog.=) $3",
							  3, types, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded_seq.adopted_columns");
	if (SPI_processed == 1)
	{
		char	   *previous = TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
																  SPI_tuptable->tupdesc, 1, &isnull));

		for (int k = 0; k < (int) lengthof(KindNames); k++)
			if (strcmp(previous, KindNames[k]) == 0)
				kind = (ColumnKind) k;
	}

	/*
	 * No value it reserved, nor any in the column, comes again.  It is
	 * dropped unless another column draws from it, or it is not the caller's
	 * (adopted with someone else's sequence): then it stays.
	 */
	used = SequenceUsedElsewhere(&f, f.sharded_name);
	args[0] = CStringGetTextDatum(f.sharded_name);
	types[0] = TEXTOID;
	if (SPI_execute_with_args("SELECT owner::pg_catalog.oid FROM sharded_seq.sequences"
							  " WHERE name OPERATOR(pg_catalog.=) $1",
							  1, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read sharded sequence \"%s\"", f.sharded_name);
	if (SPI_processed == 0)
		ReportNotFound(KIND_SEQUENCE, f.sharded_name);
	owned = has_privs_of_role(GetUserId(),
							  DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)));
	past = DropSequenceHighWater(f.sharded_name, !used && owned);
	if (used || !owned)
		ereport(NOTICE,
				(errmsg("sharded sequence \"%s\" is kept", f.sharded_name),
				 errdetail(used ? "Another column draws from it." : "It is not the caller's."),
				 errhint("sharded_seq.drop_sequence('%s') drops it once nothing draws from it.", f.sharded_name)));
	if (ColumnMax(&f, &value))
		past = Max(past, value);
	past = Max(past, 0);
	type = f.type == INT4OID ? "integer" : "bigint";
	if (past >= (f.type == INT4OID ? PG_INT32_MAX : PG_INT64_MAX))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("sharded sequence \"%s\" reserved values up to %lld: no %s is above them",
						f.sharded_name, (long long) past, type),
				 errhint("Make the column bigint first, or leave it on the sharded sequence.")));

	if (kind == COLUMN_IDENTITY_ALWAYS || kind == COLUMN_IDENTITY_BY_DEFAULT)
	{
		RunDdl(psprintf("ALTER TABLE %s ALTER COLUMN %s DROP DEFAULT", f.table, f.qcolumn));
		RunDdl(psprintf("ALTER TABLE %s ALTER COLUMN %s ADD GENERATED %s AS IDENTITY (START WITH %lld)",
						f.table, f.qcolumn, kind == COLUMN_IDENTITY_ALWAYS ? "ALWAYS" : "BY DEFAULT",
						(long long) past + 1));
	}
	else
	{
		/* as serial makes it: named after the table and column, owned by the column */
		char	   *seq = quote_qualified_identifier(get_namespace_name(f.nsp),
													 ChooseRelationName(f.relname, f.column, "seq", f.nsp, false));
		Oid			owner = InvalidOid;
		HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(f.relid));

		if (HeapTupleIsValid(tup))
		{
			owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
			ReleaseSysCache(tup);
		}
		RunDdl(psprintf("CREATE SEQUENCE %s AS %s START WITH %lld", seq, type, (long long) past + 1));
		/* a member of the owning role calls: OWNED BY wants the table's owner */
		if (OidIsValid(owner) && owner != GetUserId())
			RunDdl(psprintf("ALTER SEQUENCE %s OWNER TO %s", seq,
							quote_identifier(GetUserNameFromId(owner, false))));
		RunDdl(psprintf("ALTER SEQUENCE %s OWNED BY %s.%s", seq, f.table, f.qcolumn));
		RunDdl(psprintf("ALTER TABLE %s ALTER COLUMN %s SET DEFAULT pg_catalog.nextval(%s::pg_catalog.regclass)",
						f.table, f.qcolumn, quote_literal_cstr(seq)));
	}
	SPI_finish();
	Record(&f, f.sharded_name, kind, false);
	PG_RETURN_INT64(past + 1);
}
