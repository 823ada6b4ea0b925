/* sharded_seq--1.2--1.3.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script; CREATE EXTENSION of a
   later version runs this one as ALTER EXTENSION ... UPDATE does. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.3'" to load this file. \quit

-- The memcached write-behind of 1.0-1.2 keeps its guarantees under a new
-- name; 'buffered' now means shared memory, flushed by the background worker.
UPDATE sharded_seq.counter_config SET mode = 'memcached'
 WHERE mode OPERATOR(pg_catalog.=) 'buffered';

COMMENT ON FUNCTION sharded_seq.create_counter(text, integer, text) IS 'create a counter; NULL shards makes it adaptive (one row, more under contention); mode exact, buffered (shared memory) or memcached';
COMMENT ON FUNCTION sharded_seq.flush_counters() IS 'move every write-behind amount (shared memory and memcached) of counters you may increment into their shard rows now; returns how many had an amount to move';

-- Node n (sharded_seq.node_id) writes only rows n * 1024 + 0 .. 1023, and
-- has its first, n * 1024, whenever it has any: maintain() finds counters
-- with several rows on a node through the others.
DROP INDEX sharded_seq.counter_shards_multi;
CREATE INDEX counter_shards_extra ON sharded_seq.counter_shards (counter_id)
 WHERE (shard OPERATOR(pg_catalog.%) 1024) OPERATOR(pg_catalog.<>) 0;

-- pending now covers both write-behind modes.  Replaced in place, so that
-- views of the user's built on it survive the update.
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
              sharded_seq.counter_pending(c.id) AS pending) t
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.counters IS 'one row per counter: its current shard rows, whether they adapt, and its total; pending is what is committed but not yet in the rows, in shared memory or memcached (NULL if unreadable)';

------------------------------------------------------------------------------
-- write-behind counters and the background worker (1.3)
------------------------------------------------------------------------------

-- What the background workers are doing: a launcher row, then one row per
-- database served.  Readable by pg_monitor members, as pg_stat_activity is.
CREATE FUNCTION sharded_seq.worker_status(
    OUT kind text, OUT database name, OUT pid integer, OUT running boolean,
    OUT started_at timestamptz, OUT last_flush_at timestamptz,
    OUT last_flush_amount bigint, OUT last_flush_counters integer,
    OUT flushed_total bigint, OUT last_maintain_at timestamptz,
    OUT last_error text, OUT last_error_at timestamptz)
RETURNS SETOF record
LANGUAGE C VOLATILE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'worker_status';
REVOKE ALL ON FUNCTION sharded_seq.worker_status() FROM PUBLIC;

CREATE VIEW sharded_seq.workers AS
SELECT * FROM sharded_seq.worker_status();
COMMENT ON VIEW sharded_seq.workers IS 'the background launcher and one worker per database: running or not, last flush and amount moved, last maintain(), last error';
REVOKE ALL ON sharded_seq.workers FROM PUBLIC;
GRANT SELECT ON sharded_seq.workers TO pg_monitor;
GRANT EXECUTE ON FUNCTION sharded_seq.worker_status() TO pg_monitor;

-- The shared-memory slot table of mode 'buffered': slots in use, in all,
-- and commits that found it full (and went to the rows instead).
CREATE FUNCTION sharded_seq.buffered_slots(
    OUT used integer, OUT total integer, OUT refused bigint)
RETURNS record
LANGUAGE C VOLATILE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'buffered_slots';
COMMENT ON FUNCTION sharded_seq.buffered_slots() IS 'slots of mode ''buffered'' in use and in all (sharded_seq.buffered_slots), and commits that found none free';

------------------------------------------------------------------------------
-- several primaries: node ids and what a replication group publishes (1.3)
------------------------------------------------------------------------------

-- Logical replication's apply worker fires this (ENABLE REPLICA) when a
-- counter's configuration changed on another node, so that this node's
-- sessions stop using what they cached.
CREATE FUNCTION sharded_seq.config_replicated()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'config_replicated';
REVOKE ALL ON FUNCTION sharded_seq.config_replicated() FROM PUBLIC;
CREATE TRIGGER config_replicated
 AFTER UPDATE OR DELETE ON sharded_seq.counter_config
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.config_replicated();
ALTER TABLE sharded_seq.counter_config ENABLE REPLICA TRIGGER config_replicated;

-- Which system and database holds each node id (sharded_seq.node_id > 0).
-- Published with the counters, so that every node sees every claim, and a
-- node whose id another system holds refuses to draw.
CREATE TABLE sharded_seq.node_claims (
    node_id           integer PRIMARY KEY,
    system_identifier text NOT NULL,
    database          name NOT NULL,
    claimed_at        timestamptz NOT NULL DEFAULT pg_catalog.now()
);
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.node_claims', '');
REVOKE ALL ON sharded_seq.node_claims FROM PUBLIC;

-- The value a local position stands for on this session's node (itself on
-- node 0; NULL outside the node's range).
CREATE FUNCTION sharded_seq.node_value(local bigint)
RETURNS bigint
LANGUAGE C STABLE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'node_value';

CREATE FUNCTION sharded_seq.node_id()
RETURNS integer
LANGUAGE C STABLE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'node_id';
COMMENT ON FUNCTION sharded_seq.node_id() IS 'the node id this session draws values and writes counter rows as: sharded_seq.node_id at its first use of a sequence or counter';

-- Positions as values of this session's node, and which node that is.
-- Replaced in place, so that views of the user's built on it survive.
CREATE OR REPLACE VIEW sharded_seq.sequences AS
SELECT c.name,
       c.shards,
       c.block,
       c.tier,
       c.generation,
       sharded_seq.node_value(c.base) AS generation_start,
       sharded_seq.node_value(sharded_seq.sequence_high_water(c.id)) AS reserved_high_water,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at,
       sharded_seq.node_id() AS node_id
  FROM sharded_seq.sequence_config c
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequences IS 'one row per sharded sequence; positions are values of this session''s node (node_id)';

-- The extension's tables a multi-primary replication group must publish
-- (both ways, with origin = none).  Sequences and everything else in the
-- schema are node-local and must not be published.
CREATE FUNCTION sharded_seq.replicated_tables()
RETURNS SETOF regclass
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
VALUES ('sharded_seq.counter_config'::pg_catalog.regclass),
       ('sharded_seq.counter_shards'::pg_catalog.regclass),
       ('sharded_seq.node_claims'::pg_catalog.regclass)
$$;
COMMENT ON FUNCTION sharded_seq.replicated_tables() IS 'the extension''s tables a multi-primary replication group must publish; nothing node-local';

-- Rows of counter_shards written, and claims changed, other than
-- by the engine (logical replication's apply worker, a superuser by hand):
-- sessions stop reading rows from remembered places, and check claims again.
-- ENABLE ALWAYS: it fires in the apply worker too.
CREATE FUNCTION sharded_seq.rows_changed_elsewhere()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'rows_changed_elsewhere';
REVOKE ALL ON FUNCTION sharded_seq.rows_changed_elsewhere() FROM PUBLIC;
CREATE TRIGGER rows_changed_elsewhere
 AFTER INSERT OR UPDATE OR DELETE ON sharded_seq.counter_shards
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.rows_changed_elsewhere();
ALTER TABLE sharded_seq.counter_shards ENABLE ALWAYS TRIGGER rows_changed_elsewhere;
CREATE TRIGGER rows_truncated_elsewhere
 AFTER TRUNCATE ON sharded_seq.counter_shards
 FOR EACH STATEMENT EXECUTE FUNCTION sharded_seq.rows_changed_elsewhere();
ALTER TABLE sharded_seq.counter_shards ENABLE ALWAYS TRIGGER rows_truncated_elsewhere;
CREATE TRIGGER claims_changed
 AFTER INSERT OR UPDATE OR DELETE ON sharded_seq.node_claims
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.rows_changed_elsewhere();
ALTER TABLE sharded_seq.node_claims ENABLE ALWAYS TRIGGER claims_changed;
