-- The sharded_seq objects of the current database, one sorted text block per
-- kind (t/same_objects.pl): the extension's members, every
-- function's definition, rights and comment, the schema's relations (views
-- with their definition), columns and their order, constraints, indexes,
-- triggers and when they fire, the schema's rights, the tables pg_dump dumps,
-- the rights an install granted (pg_init_privs), the sequence's
-- parameters, columns' collation, storage and statistics target, row
-- security policies and rules.  A relation's options are a set: ALTER TABLE ... SET appends
-- a changed one, so an update orders them differently from a CREATE TABLE.
-- pg_dump leaves an extension's members out: the catalogs are read directly.
SET search_path = public;
SELECT 'extension ' || extname || ' schema ' || extnamespace::regnamespace || ' relocatable ' || extrelocatable
  FROM pg_extension WHERE extname = 'sharded_seq';
SELECT l FROM (SELECT 'member ' || pg_describe_object(classid, objid, objsubid) AS l
  FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'sharded_seq')
) s ORDER BY l COLLATE "C";
SELECT 'function ' || p.oid::regprocedure || ' ' || coalesce(p.proacl::text, '-') || ' '
       || coalesce(obj_description(p.oid, 'pg_proc'), '-') || E'\n' || pg_get_functiondef(p.oid)
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'sharded_seq')
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT 'schema ' || n.nspname || ' ' || coalesce(n.nspacl::text, '-') || ' '
       || coalesce(obj_description(n.oid, 'pg_namespace'), '-')
  FROM pg_namespace n WHERE n.nspname = 'sharded_seq';
SELECT 'relation ' || c.oid::regclass || ' ' || c.relkind::text || ' ' || coalesce(c.relacl::text, '-') || ' '
       || coalesce((SELECT string_agg(o, ',' ORDER BY o) FROM unnest(c.reloptions) o), '-') || ' '
       || coalesce(obj_description(c.oid, 'pg_class'), '-')
       || CASE WHEN c.relkind = 'v' THEN E'\n' || pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c WHERE c.relnamespace = 'sharded_seq'::regnamespace
 ORDER BY c.oid::regclass::text COLLATE "C";
SELECT 'storage ' || c.oid::regclass || ' persistence ' || c.relpersistence::text
       || ' replica identity ' || c.relreplident::text || ' row security ' || c.relrowsecurity
  FROM pg_class c WHERE c.relnamespace = 'sharded_seq'::regnamespace AND c.relkind IN ('r', 'p', 'S')
 ORDER BY c.oid::regclass::text COLLATE "C";
SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END || ' '
       || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-')
       || coalesce(' acl ' || a.attacl::text, '') || coalesce(' comment ' || col_description(a.attrelid, a.attnum), '')
       || ' position ' || row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum)
       || ' collation ' || coalesce(NULLIF(a.attcollation, 0)::regcollation::text, '-')
       || ' storage ' || a.attstorage::text || ' statistics ' || coalesce(a.attstattarget::text, '-')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE c.relnamespace = 'sharded_seq'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attrelid::regclass::text COLLATE "C", a.attname COLLATE "C";
SELECT l FROM (SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) AS l
  FROM pg_constraint WHERE connamespace = 'sharded_seq'::regnamespace
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'index ' || pg_get_indexdef(indexrelid) AS l
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
 WHERE c.relnamespace = 'sharded_seq'::regnamespace
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'trigger ' || tgname || ' ' || tgenabled::text || ' ' || pg_get_triggerdef(t.oid) AS l
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'sharded_seq'::regnamespace AND NOT t.tgisinternal
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'sequence ' || s.seqrelid::regclass || ' ' || format_type(s.seqtypid, NULL) || ' start ' || s.seqstart
       || ' increment ' || s.seqincrement || ' min ' || s.seqmin || ' max ' || s.seqmax
       || ' cache ' || s.seqcache || ' cycle ' || s.seqcycle AS l
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
 WHERE c.relnamespace = 'sharded_seq'::regnamespace
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'dumped ' || t.c::regclass || ' ' || coalesce(nullif(t.cond, ''), '-') AS l
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS t(c, cond)
 WHERE e.extname = 'sharded_seq'
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'initprivs ' || pg_describe_object(ip.classoid, ip.objoid, ip.objsubid) || ' ' || ip.privtype::text
       || ' ' || ip.initprivs::text AS l
  FROM pg_init_privs ip
 WHERE EXISTS (SELECT FROM pg_depend d
                WHERE d.classid = ip.classoid AND d.objid = ip.objoid AND d.objsubid = 0 AND d.deptype = 'e'
                  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'sharded_seq'))
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'policy ' || p.polrelid::regclass || ' ' || p.polname || ' ' || p.polcmd::text
       || ' permissive ' || p.polpermissive || ' roles ' || p.polroles::text
       || ' using ' || coalesce(pg_get_expr(p.polqual, p.polrelid), '-')
       || ' check ' || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '-') AS l
  FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
 WHERE c.relnamespace = 'sharded_seq'::regnamespace
) s ORDER BY l COLLATE "C";
SELECT l FROM (SELECT 'rule ' || r.ev_class::regclass || ' ' || r.rulename || ' ' || r.ev_enabled::text
       || ' ' || pg_get_ruledef(r.oid) AS l
  FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
 WHERE c.relnamespace = 'sharded_seq'::regnamespace AND r.rulename <> '_RETURN'
) s ORDER BY l COLLATE "C";
