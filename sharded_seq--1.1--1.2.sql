/* sharded_seq--1.1--1.2.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script; CREATE EXTENSION of a
   later version runs this one as ALTER EXTENSION ... UPDATE does. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.2'" to load this file. \quit

-- Adaptive counters: shards NULL means one row that grows under contention
-- (up to sharded_seq.max_counter_shards) and is folded back when idle.
-- Existing counters keep the layout they were given.
ALTER TABLE sharded_seq.counter_config ALTER COLUMN shards DROP NOT NULL;

-- Dense rows: a cold counter is one small row.  Increments prune their page
-- as they update it, so HOT updates do not need a reserve left free.
ALTER TABLE sharded_seq.counter_shards SET (fillfactor = 100);

-- maintain() finds counters with more than one row through this index.
CREATE INDEX counter_shards_multi ON sharded_seq.counter_shards (counter_id)
 WHERE shard OPERATOR(pg_catalog.<>) 0;

-- When maintain() last looked for idle rows, and the transaction counter at
-- that moment: a row not updated since then is idle.  Node-local, not dumped.
CREATE TABLE sharded_seq.maintenance (
    fold_at     timestamptz NOT NULL,
    fold_xid    bigint NOT NULL
);
INSERT INTO sharded_seq.maintenance VALUES (pg_catalog.now(), 0);
REVOKE ALL ON sharded_seq.maintenance FROM PUBLIC;

DROP FUNCTION sharded_seq.alter_counter(text, integer, text);
CREATE FUNCTION sharded_seq.alter_counter(
    name text,
    shards integer DEFAULT NULL,
    mode text DEFAULT NULL,
    adaptive boolean DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'alter_counter';
COMMENT ON FUNCTION sharded_seq.alter_counter(text, integer, text, boolean) IS 'change shard rows (up or down), mode, or adaptive growth online; the total is kept';

COMMENT ON FUNCTION sharded_seq.create_counter(text, integer, text) IS 'create a counter; NULL shards makes it adaptive (one row, more under contention)';

CREATE FUNCTION sharded_seq.maintain(
    OUT folded integer, OUT compacted integer, OUT reaped integer)
RETURNS record
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'maintain';
COMMENT ON FUNCTION sharded_seq.maintain() IS 'fold idle counter rows, gather scattered ones, reap retired sequence shards; never changes a total';
REVOKE ALL ON FUNCTION sharded_seq.maintain() FROM PUBLIC;

-- Replaced in place (columns may only be added at the end), so that views
-- of the user's built on it survive the update.
CREATE OR REPLACE VIEW sharded_seq.counters AS
SELECT c.name,
       (SELECT pg_catalog.count(*) FROM sharded_seq.counter_shards s
         WHERE s.counter_id OPERATOR(pg_catalog.=) c.id)::integer AS shards,
       c.mode,
       t.stored OPERATOR(pg_catalog.+) COALESCE(t.pending, 0) AS total,
       t.pending,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at,
       c.shards IS NULL AS adaptive
  FROM sharded_seq.counter_config c
 CROSS JOIN LATERAL (
       SELECT sharded_seq.counter_total(c.id) AS stored,
              CASE WHEN c.mode OPERATOR(pg_catalog.=) 'buffered' THEN sharded_seq.counter_pending(c.id) ELSE 0 END AS pending) t
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.counters IS 'one row per counter: its current shard rows, whether they adapt, and its total; pending is what a buffered counter holds in memcached (NULL if unreadable)';
