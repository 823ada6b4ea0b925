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
-- the sequences view: the cache in force and its counts
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
       n.node_cache_full
  FROM sharded_seq.sequence_config c
 CROSS JOIN LATERAL sharded_seq.sequence_cache(c.id, c.tier, c.cache) n
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequences IS 'one row per sharded sequence; positions are values of this session''s node (node_id), NULL to a role that neither owns nor may use the sequence; cache_in_force and the node cache counts are this server''s';

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
