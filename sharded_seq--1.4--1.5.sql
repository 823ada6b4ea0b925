/* sharded_seq--1.4--1.5.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script; CREATE EXTENSION of a
   later version runs this one as ALTER EXTENSION ... UPDATE does. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.5'" to load this file. \quit

------------------------------------------------------------------------------
-- the node-wide sequence cache: a column, and the functions that set it
------------------------------------------------------------------------------

-- Where a database-tier sequence's blocks live when sharded_seq is
-- preloaded: 'node' (one block in shared memory that every session of the
-- server draws from: no fsync per connection, nothing burned when a session
-- ends, values in draw order) or 'session' (a block per session, as before
-- 1.5).  Existing sequences take 'node' too: it keeps every guarantee.
ALTER TABLE sharded_seq.sequence_config
    ADD COLUMN cache text NOT NULL DEFAULT 'node';

-- create_sequence and alter_sequence take cache; a new argument is a new
-- signature, so the functions are made again, with their comments.
DROP FUNCTION sharded_seq.create_sequence(text, integer, integer, bigint, text);
CREATE FUNCTION sharded_seq.create_sequence(
    name text,
    shards integer DEFAULT NULL,
    block integer DEFAULT NULL,
    start bigint DEFAULT 1,
    tier text DEFAULT 'database',
    cache text DEFAULT 'node')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'create_sequence';
COMMENT ON FUNCTION sharded_seq.create_sequence(text, integer, integer, bigint, text, text) IS 'create a sharded sequence; NULL shards/block take sharded_seq.default_sequence_shards/default_block; cache node (one block shared by the server''s sessions, when preloaded) or session';

DROP FUNCTION sharded_seq.alter_sequence(text, integer, integer, text);
CREATE FUNCTION sharded_seq.alter_sequence(
    name text,
    shards integer DEFAULT NULL,
    block integer DEFAULT NULL,
    tier text DEFAULT NULL,
    cache text DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'alter_sequence';
COMMENT ON FUNCTION sharded_seq.alter_sequence(text, integer, integer, text, text) IS 'change shards, block, tier or cache online; later values start above everything reserved';

------------------------------------------------------------------------------
-- the cache in force and its counts, for the sequences view (at the end)
------------------------------------------------------------------------------

-- The cache a sequence is drawn with on this server, and the node cache's
-- counts for it (NULL without the node cache, that is, without preloading).
CREATE FUNCTION sharded_seq.sequence_cache(
    seq_id integer, tier text, cache text,
    OUT cache_in_force text, OUT node_cache_hits bigint,
    OUT node_cache_reservations bigint, OUT node_cache_waits bigint,
    OUT node_cache_full bigint)
RETURNS record
LANGUAGE C VOLATILE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'sequence_cache';
COMMENT ON FUNCTION sharded_seq.sequence_cache(integer, text, text) IS 'the cache a sharded sequence is drawn with on this server (node or session), and its node cache counts';

------------------------------------------------------------------------------
-- cutover across logical replication (issue 22, part 1)
------------------------------------------------------------------------------

-- A sequence whose configuration arrived by logical replication (a
-- subscription to a publisher that draws from it): this server has never
-- seen its reservations, so sharded_nextval refuses it until
-- sharded_seq.cutover() or advance_sequence() clears the mark.  A dump keeps
-- the mark (the positions are still unknown after a restore).
ALTER TABLE sharded_seq.sequence_config
    ADD COLUMN positions_unknown boolean NOT NULL DEFAULT false;

-- Sets positions_unknown on a row written by logical replication's apply
-- worker, and tells this server's sessions (ENABLE ALWAYS: it must fire
-- there; it does nothing elsewhere).
CREATE FUNCTION sharded_seq.sequence_arrived()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'sequence_arrived';
REVOKE ALL ON FUNCTION sharded_seq.sequence_arrived() FROM PUBLIC;
CREATE TRIGGER sequence_arrived
 BEFORE INSERT OR UPDATE ON sharded_seq.sequence_config
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.sequence_arrived();
ALTER TABLE sharded_seq.sequence_config ENABLE ALWAYS TRIGGER sequence_arrived;

-- A subscription made before this update copied its publisher's rows with no
-- trigger to mark them: if this database subscribes to sequence_config, every
-- row may have come from the publisher, so all are marked (the owner clears a
-- row of its own with advance_sequence).  A restored dump is not marked: it
-- carries the shard sequences' positions too.
UPDATE sharded_seq.sequence_config SET positions_unknown = true
 WHERE EXISTS (SELECT FROM pg_catalog.pg_subscription_rel r
                WHERE r.srrelid OPERATOR(pg_catalog.=) 'sharded_seq.sequence_config'::pg_catalog.regclass);

-- Servers stopped by a cutover: a row keyed by this server's system
-- identifier stops it from handing out sequence values and taking counter
-- increments.  It replicates to the subscriber, where another system
-- identifier makes it mean nothing; there, flushed_lsn tells cutover() that
-- everything the old primary committed before it has been applied.
CREATE TABLE sharded_seq.cutover_stops (
    system_identifier text PRIMARY KEY,
    stopped_at        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    flushed_lsn       pg_catalog.pg_lsn
);
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.cutover_stops', '');
REVOKE ALL ON sharded_seq.cutover_stops FROM PUBLIC;

-- The cutovers this server completed, one row per subscription: until then
-- a database that subscribes to sequence_config refuses counter increments
-- (the publisher's rows would overwrite them).  Keyed by this server's
-- system identifier too: the table replicates onwards, in a chain of
-- cutovers, and other servers' rows mean nothing here.
-- maintain() updates this one-row table: with a publication FOR ALL TABLES
-- (a cutover's), an update needs a replica identity, or fails every round.
ALTER TABLE sharded_seq.maintenance REPLICA IDENTITY FULL;

CREATE TABLE sharded_seq.cutover_done (
    system_identifier text NOT NULL,
    subscription      pg_catalog.oid NOT NULL,
    done_at           timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (system_identifier, subscription)
);
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.cutover_done', '');
REVOKE ALL ON sharded_seq.cutover_done FROM PUBLIC;

-- On the new primary, while its subscription to the old one still exists.
CREATE FUNCTION sharded_seq.cutover(
    subscription name,
    timeout interval DEFAULT '5 min',
    OUT sequence_name text,
    OUT old_high_water bigint,
    OUT new_start bigint)
RETURNS SETOF record
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'cutover';
COMMENT ON FUNCTION sharded_seq.cutover(name, interval) IS 'on a subscriber about to become the primary: stop the publisher, wait until what it committed has arrived, and start every sequence above what the publisher reserved';

-- On the old primary, called by cutover() through the subscription's
-- connection: stop this server; then its high waters, once transactions in
-- flight have ended and write-behind amounts are in their rows.
CREATE FUNCTION sharded_seq.cutover_stop()
RETURNS text
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'cutover_stop';
COMMENT ON FUNCTION sharded_seq.cutover_stop() IS 'stop this server from handing out sequence values and taking counter increments (a cutover); returns its system identifier; sharded_seq.cutover_resume() undoes it';

CREATE FUNCTION sharded_seq.cutover_source(
    OUT sequence_name text,
    OUT high_water bigint,
    OUT flushed_lsn pg_catalog.pg_lsn)
RETURNS SETOF record
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'cutover_source';
COMMENT ON FUNCTION sharded_seq.cutover_source() IS 'on a server stopped by cutover_stop(): wait for transactions in flight, flush write-behind amounts, and return each sequence''s reserved high water (a last row with a NULL name carries the position to wait for)';

CREATE FUNCTION sharded_seq.cutover_resume()
RETURNS boolean
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'cutover_resume';
COMMENT ON FUNCTION sharded_seq.cutover_resume() IS 'undo cutover_stop() on this server: it hands out values and takes increments again; true if it was stopped';

------------------------------------------------------------------------------
-- adopting a column, and giving it back (issue 22, part 2)
------------------------------------------------------------------------------

-- What each column adopt_column switched was before (none, serial, identity
-- always, identity by default), so that release_column makes it that again.
-- Keyed by attnum (a renamed column keeps its record; column_name is the
-- name at adoption, for display).  Written only by those functions, as the
-- extension's owner, which also remove the records of dropped columns; dumped.
CREATE TABLE sharded_seq.adopted_columns (
    table_name    pg_catalog.regclass NOT NULL,
    column_name   name NOT NULL,
    attnum        smallint NOT NULL,
    sequence_name text NOT NULL,
    previous      text NOT NULL
                  CHECK (previous OPERATOR(pg_catalog.=) ANY (ARRAY['none', 'serial', 'identity always', 'identity by default'])),
    adopted_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (table_name, attnum)
);
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.adopted_columns', '');
REVOKE ALL ON sharded_seq.adopted_columns FROM PUBLIC;
GRANT SELECT ON sharded_seq.adopted_columns TO PUBLIC;

-- The caller must own the table; the DDL runs with the caller's rights.
CREATE FUNCTION sharded_seq.adopt_column(
    tbl pg_catalog.regclass,
    col name,
    sequence text DEFAULT NULL,
    shards integer DEFAULT NULL,
    block integer DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'adopt_column';
COMMENT ON FUNCTION sharded_seq.adopt_column(pg_catalog.regclass, name, text, integer, integer) IS 'switch a serial, identity or plain integer/bigint column to DEFAULT sharded_nextval(sequence) in this transaction, above the column''s values and its old sequence, safe next to concurrent inserts (they wait for the table''s lock); returns the first value';

CREATE FUNCTION sharded_seq.release_column(
    tbl pg_catalog.regclass,
    col name)
RETURNS bigint
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'release_column';
COMMENT ON FUNCTION sharded_seq.release_column(pg_catalog.regclass, name) IS 'give a column adopt_column switched back to a native sequence (or its identity), above everything its sharded sequence reserved, and drop that sequence; returns the next value';

------------------------------------------------------------------------------
-- set_counter: a counter's total, set exactly at commit (issue 22)
------------------------------------------------------------------------------

-- The committed total equals total at this transaction's commit, in every
-- mode: amounts committed before are absorbed, later ones count on top.
-- Its owner, or a role with update and select on the counter, may call it.
CREATE FUNCTION sharded_seq.set_counter(name text, total bigint)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'set_counter';
COMMENT ON FUNCTION sharded_seq.set_counter(text, bigint) IS 'set a counter''s total, exactly at commit: increments committed before are absorbed, later ones count on top; owner, or update and select';

-- How many times set_counter has set each counter.  A leftover (an amount a
-- session could not hand to memcached after its commit, kept in its memory
-- until its next counter commit or its exit) records the count in force at
-- its commit; if a set committed since, the set absorbed it and it is
-- dropped instead of written.  A table of its own, node-local like a
-- session's leftovers: counter_config, which multi-primary groups publish,
-- keeps its shape, and neither pg_dump nor a subscriber carries counts that
-- only this server's sessions can hold leftovers of.  A missing row is 0.
CREATE TABLE sharded_seq.counter_sets (
    counter_id  integer PRIMARY KEY,
    sets        bigint NOT NULL
);
REVOKE ALL ON sharded_seq.counter_sets FROM PUBLIC;

------------------------------------------------------------------------------
-- monitoring a DBA can page on (issue 22)
------------------------------------------------------------------------------

-- A sequence on this server since its start (preloaded; NULL otherwise):
-- values handed out (the node cache's, and sessions' own blocks', counted
-- when a block ends or its session does), values reserved in blocks, the
-- rate of reservations over the last one to two minutes, the highest
-- local position this session's node can hand out, and the reserved high
-- water (local, as sequence_high_water).  NULL to a role that
-- may not see the sequence's positions, unless it has pg_read_all_stats.
CREATE FUNCTION sharded_seq.sequence_usage(
    seq_id integer,
    OUT handed_out bigint, OUT reserved bigint,
    OUT reserve_rate double precision, OUT local_max bigint,
    OUT high_water bigint)
RETURNS record
LANGUAGE C VOLATILE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'sequence_usage';
COMMENT ON FUNCTION sharded_seq.sequence_usage(integer) IS 'a sharded sequence on this server since its start: values handed out and reserved, reservations per second recently, the node''s highest local position, the reserved high water (local)';

-- The range a sequence can still use: up to its node's end, or the largest
-- value of the integer column adopt_column gave it (numeric arithmetic: a
-- sequence may start below zero).  runs_out_in is NULL without a recent
-- rate, or beyond a thousand years.
CREATE VIEW sharded_seq.sequence_usage AS
SELECT c.name,
       sharded_seq.node_id() AS node_id,
       u.handed_out,
       u.reserved,
       sharded_seq.node_value(h.high) AS reserved_high_water,
       sharded_seq.node_value(m.local_max) AS range_end,
       (GREATEST(h.high, 0)::double precision OPERATOR(pg_catalog./) m.local_max::double precision) AS range_used,
       u.reserve_rate,
       CASE WHEN u.reserve_rate OPERATOR(pg_catalog.>) 0
             AND ((m.local_max::numeric OPERATOR(pg_catalog.-) h.high::numeric)::double precision
                  OPERATOR(pg_catalog./) u.reserve_rate) OPERATOR(pg_catalog.<) 31557600000
            THEN pg_catalog.make_interval(secs =>
                 (m.local_max::numeric OPERATOR(pg_catalog.-) h.high::numeric)::double precision
                 OPERATOR(pg_catalog./) u.reserve_rate)
       END AS runs_out_in
  FROM sharded_seq.sequence_config c
 CROSS JOIN LATERAL sharded_seq.sequence_usage(c.id) u
 CROSS JOIN LATERAL (SELECT u.high_water AS high) h
 CROSS JOIN LATERAL (
       SELECT LEAST(u.local_max,
              (SELECT pg_catalog.min(CASE a.atttypid
                                     WHEN 'pg_catalog.int4'::pg_catalog.regtype THEN 2147483647
                                     WHEN 'pg_catalog.int2'::pg_catalog.regtype THEN 32767 END)
                 FROM sharded_seq.adopted_columns ac
                 JOIN pg_catalog.pg_attribute a
                   ON a.attrelid OPERATOR(pg_catalog.=) ac.table_name
                  AND a.attname OPERATOR(pg_catalog.=) ac.column_name
                WHERE ac.sequence_name OPERATOR(pg_catalog.=) c.name)) AS local_max) m
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequence_usage IS 'one row per sharded sequence: values handed out and reserved on this server since its start, the reserved high water, the node''s range end and the share used, reservations per second recently and when the range runs out at that rate; NULL to a role that may not see its positions (but pg_read_all_stats)';
GRANT SELECT ON sharded_seq.sequence_usage TO PUBLIC;

-- A counter's write-behind backlog: the amounts in shared memory and in
-- memcached, and a time none of them is older than.
CREATE FUNCTION sharded_seq.counter_backlog(
    counter_id integer,
    OUT pending_shared bigint, OUT pending_memcached bigint,
    OUT oldest_pending_at timestamptz)
RETURNS record
LANGUAGE C VOLATILE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'counter_backlog';
COMMENT ON FUNCTION sharded_seq.counter_backlog(integer) IS 'a counter''s committed amounts not yet in its rows, in shared memory and in memcached, and a time none of them is older than';

CREATE VIEW sharded_seq.counter_backlog AS
SELECT c.name,
       c.mode,
       b.pending_shared,
       b.pending_memcached,
       b.pending_shared OPERATOR(pg_catalog.+) b.pending_memcached AS pending,
       b.oldest_pending_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) b.oldest_pending_at AS oldest_pending_age
  FROM sharded_seq.counter_config c
 CROSS JOIN LATERAL sharded_seq.counter_backlog(c.id) b
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.counter_backlog IS 'one row per counter: committed amounts not yet in its rows (shared memory, memcached) and the age of the oldest; NULL to a role that may not read the counter (but pg_read_all_stats)';
GRANT SELECT ON sharded_seq.counter_backlog TO PUBLIC;

-- The workers view gains healthy (last column): the launcher runs; a
-- database's worker runs, finished a round within three flush intervals
-- (at least ten seconds) of now, and its last round did not fail.
CREATE OR REPLACE VIEW sharded_seq.workers AS
SELECT w.*,
       CASE WHEN w.kind OPERATOR(pg_catalog.=) 'launcher' THEN w.running
            ELSE w.running
             AND COALESCE(w.last_flush_at, w.started_at) OPERATOR(pg_catalog.>)
                 (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
                  GREATEST(
                      (COALESCE(pg_catalog.current_setting('sharded_seq.counter_flush_interval', true), '10s')::pg_catalog.interval
                          OPERATOR(pg_catalog.*) 3::double precision),
                      '10 seconds'::pg_catalog.interval))
             AND (w.last_error_at IS NULL OR w.last_error_at OPERATOR(pg_catalog.<) w.last_flush_at)
       END AS healthy
  FROM sharded_seq.worker_status() w;
COMMENT ON VIEW sharded_seq.workers IS 'the background launcher and one worker per database: running or not, last flush and amount moved, last maintain(), last error; healthy: running, a round finished within three flush intervals (at least ten seconds), and the last one did not fail';

------------------------------------------------------------------------------
-- the sequences view, last: it shows the columns the blocks above add
------------------------------------------------------------------------------

-- New columns go last: CREATE OR REPLACE keeps the others, and the users'
-- views that depend on this one.
CREATE OR REPLACE VIEW sharded_seq.sequences AS
SELECT c.name,
       c.shards,
       c.block,
       c.tier,
       c.generation,
       CASE WHEN sharded_seq.sequence_readable(c.id)
            THEN sharded_seq.node_value(c.base) END AS generation_start,
       sharded_seq.node_value(sharded_seq.sequence_high_water(c.id)) AS reserved_high_water,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at,
       sharded_seq.node_id() AS node_id,
       c.cache,
       n.cache_in_force,
       n.node_cache_hits,
       n.node_cache_reservations,
       n.node_cache_waits,
       n.node_cache_full,
       c.positions_unknown
  FROM sharded_seq.sequence_config c
 CROSS JOIN LATERAL sharded_seq.sequence_cache(c.id, c.tier, c.cache) n
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequences IS 'one row per sharded sequence; positions are values of this session''s node (node_id), NULL to a role that neither owns nor may use the sequence; cache_in_force and the node cache counts are this server''s; positions_unknown: refused until sharded_seq.cutover() or advance_sequence()';
