/* sharded_seq--1.4.sql */

\echo Use "CREATE EXTENSION sharded_seq" to load this file. \quit

-- Administration lives in its own schema; the user-facing functions live in
-- the extension's schema (@extschema@).
CREATE SCHEMA sharded_seq;
COMMENT ON SCHEMA sharded_seq IS 'sharded_seq administration: create, alter and inspect sharded sequences and counters';
GRANT USAGE ON SCHEMA sharded_seq TO PUBLIC;

-- Identifiers for sequences and counters.  Its value is dumped with the data.
CREATE SEQUENCE sharded_seq.object_id_seq;

-- One row per sharded sequence.  Each layout change (shards, block, advance)
-- starts a new generation above everything reserved before it.
CREATE TABLE sharded_seq.sequence_config (
    id          integer PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    shards      integer NOT NULL,
    block       integer NOT NULL,
    tier        text NOT NULL,
    generation  integer NOT NULL,
    base        bigint NOT NULL,
    owner       regrole NOT NULL,
    acl         aclitem[],
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    altered_at  timestamptz
);

-- The native sequences that hold each shard's durable reservations.  Shard i
-- of a generation counts blocks; block k of shard i covers
-- gen_base + (k * gen_shards + i) * gen_block ... + gen_block - 1.  Each row
-- keeps its generation's layout (NULL only for generations retired before
-- 1.1), because a rolled-back change brings an older generation back.
CREATE TABLE sharded_seq.sequence_shards (
    seq_id      integer NOT NULL,
    generation  integer NOT NULL,
    shard       integer NOT NULL,
    relid       regclass NOT NULL,
    gen_base    bigint,
    gen_shards  integer,
    gen_block   integer,
    PRIMARY KEY (seq_id, generation, shard)
);

-- One row per counter.  shards is the layout it was pinned at, or NULL for
-- an adaptive counter: one row that grows under contention, up to
-- sharded_seq.max_counter_shards, and is folded back by maintain().
CREATE TABLE sharded_seq.counter_config (
    id          integer PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    shards      integer,
    mode        text NOT NULL,
    owner       regrole NOT NULL,
    acl         aclitem[],
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    altered_at  timestamptz
);

-- Counter shard rows.  Dense, so that a cold counter costs about a plain
-- row: increments prune the page they update, which keeps them HOT without
-- a reserve left free, and maintain() gathers a hot counter's rows.
CREATE TABLE sharded_seq.counter_shards (
    counter_id  integer NOT NULL,
    shard       integer NOT NULL,
    value       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (counter_id, shard)
) WITH (fillfactor = 100,
        autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_vacuum_threshold = 2000,
        autovacuum_vacuum_cost_delay = 0);

-- maintain() finds counters with more than one row through this index.
-- Node n (sharded_seq.node_id) writes only rows n * 1024 + 0 .. 1023, and
-- has its first, n * 1024, whenever it has any: only the others are here.
CREATE INDEX counter_shards_extra ON sharded_seq.counter_shards (counter_id)
 WHERE (shard OPERATOR(pg_catalog.%) 1024) OPERATOR(pg_catalog.<>) 0;

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
-- node whose id another system holds refuses to draw.  Claims of one id by
-- several systems, made before they met, stand side by side and all
-- replicate; the earliest holds the id (1.4: the key was node_id alone).
CREATE TABLE sharded_seq.node_claims (
    node_id           integer NOT NULL,
    system_identifier text NOT NULL,
    database          name NOT NULL,
    claimed_at        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT node_claims_pkey PRIMARY KEY (node_id, system_identifier, database)
);

-- When maintain() last looked for idle rows, and the transaction counter at
-- that moment: a row not updated since then is idle.  Node-local, not dumped.
CREATE TABLE sharded_seq.maintenance (
    fold_at     timestamptz NOT NULL,
    fold_xid    bigint NOT NULL
);
INSERT INTO sharded_seq.maintenance VALUES (pg_catalog.now(), 0);

-- A random number per installation, in every memcached key, so that keys
-- left by an earlier installation in this database are never read.  Not
-- dumped: a restore is a new installation.
CREATE TABLE sharded_seq.installation (
    token       bigint NOT NULL
);
INSERT INTO sharded_seq.installation (token)
SELECT CASE WHEN t OPERATOR(pg_catalog.=) 0 THEN 1 ELSE t END
  FROM (SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text), 1, 16))::pg_catalog.bit(64)::pg_catalog.int8 AS t) r;

SELECT pg_catalog.pg_extension_config_dump('sharded_seq.object_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.sequence_config', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.sequence_shards', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.counter_config', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.counter_shards', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.node_claims', '');

-- State is changed only through the functions below, which check the
-- caller's rights on each object and then act as the extension's owner.
REVOKE ALL ON ALL TABLES IN SCHEMA sharded_seq FROM PUBLIC;
REVOKE ALL ON SEQUENCE sharded_seq.object_id_seq FROM PUBLIC;

------------------------------------------------------------------------------
-- Sequences
------------------------------------------------------------------------------

CREATE FUNCTION @extschema@.sharded_nextval(seq text)
RETURNS bigint
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'sharded_nextval';
COMMENT ON FUNCTION @extschema@.sharded_nextval(text) IS 'next value of a sharded sequence; never repeats, increases within a session';

CREATE FUNCTION @extschema@.sharded_currval(seq text)
RETURNS bigint
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'sharded_currval';
COMMENT ON FUNCTION @extschema@.sharded_currval(text) IS 'value sharded_nextval last returned for this sequence in this session';

CREATE FUNCTION sharded_seq.create_sequence(
    name text,
    shards integer DEFAULT NULL,
    block integer DEFAULT NULL,
    start bigint DEFAULT 1,
    tier text DEFAULT 'database')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'create_sequence';
COMMENT ON FUNCTION sharded_seq.create_sequence(text, integer, integer, bigint, text) IS 'create a sharded sequence; NULL shards/block take sharded_seq.default_sequence_shards/default_block';

CREATE FUNCTION sharded_seq.alter_sequence(
    name text,
    shards integer DEFAULT NULL,
    block integer DEFAULT NULL,
    tier text DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'alter_sequence';
COMMENT ON FUNCTION sharded_seq.alter_sequence(text, integer, integer, text) IS 'change shards, block or tier online; later values start above everything reserved';

CREATE FUNCTION sharded_seq.advance_sequence(name text, past bigint)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'advance_sequence';
COMMENT ON FUNCTION sharded_seq.advance_sequence(text, bigint) IS 'make every later value greater than past; never moves backwards';

CREATE FUNCTION sharded_seq.drop_sequence(name text)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'drop_sequence';

CREATE FUNCTION sharded_seq.grant_sequence(name text, grantee text, privilege text DEFAULT 'usage')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'grant_sequence';
COMMENT ON FUNCTION sharded_seq.grant_sequence(text, text, text) IS 'grant usage (draw and currval) on a sharded sequence to a role or PUBLIC';

CREATE FUNCTION sharded_seq.revoke_sequence(name text, grantee text, privilege text DEFAULT 'usage')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'revoke_sequence';

-- Highest value reserved so far by the current generation (NULL if none).
CREATE FUNCTION sharded_seq.sequence_high_water(seq_id integer)
RETURNS bigint
LANGUAGE C STABLE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'sequence_high_water';

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

-- 1.4: positions only to who may use the sequence, as pg_sequences shows
-- last_value.  May the caller see a sequence's positions (its owner's
-- members and holders of usage)?  sequence_high_water checks it too.
CREATE FUNCTION sharded_seq.sequence_readable(seq_id integer)
RETURNS boolean
LANGUAGE C STABLE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'sequence_readable';
COMMENT ON FUNCTION sharded_seq.sequence_readable(integer) IS 'whether the current user may see a sharded sequence''s positions: owner (or member) or usage';

CREATE VIEW sharded_seq.sequences AS
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
       sharded_seq.node_id() AS node_id
  FROM sharded_seq.sequence_config c
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequences IS 'one row per sharded sequence; positions are values of this session''s node (node_id), NULL to a role that neither owns nor may use the sequence';
GRANT SELECT ON sharded_seq.sequences TO PUBLIC;

------------------------------------------------------------------------------
-- Counters
------------------------------------------------------------------------------

CREATE FUNCTION @extschema@.counter_incr(counter text, delta bigint DEFAULT 1)
RETURNS bigint
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'counter_incr';
COMMENT ON FUNCTION @extschema@.counter_incr(text, bigint) IS 'add delta to a counter (creating it if unknown); returns the total this transaction sees';

CREATE FUNCTION @extschema@.counter_value(counter text)
RETURNS bigint
LANGUAGE C STABLE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'counter_value';
COMMENT ON FUNCTION @extschema@.counter_value(text) IS 'current total of a counter';

CREATE FUNCTION sharded_seq.create_counter(
    name text,
    shards integer DEFAULT NULL,
    mode text DEFAULT 'exact')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'create_counter';
COMMENT ON FUNCTION sharded_seq.create_counter(text, integer, text) IS 'create a counter; NULL shards makes it adaptive (one row, more under contention); mode exact, buffered (shared memory) or memcached';

CREATE FUNCTION sharded_seq.alter_counter(
    name text,
    shards integer DEFAULT NULL,
    mode text DEFAULT NULL,
    adaptive boolean DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'alter_counter';
COMMENT ON FUNCTION sharded_seq.alter_counter(text, integer, text, boolean) IS 'change shard rows (up or down), mode, or adaptive growth online; the total is kept';

CREATE FUNCTION sharded_seq.drop_counter(name text)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'drop_counter';

CREATE FUNCTION sharded_seq.grant_counter(name text, grantee text, privilege text DEFAULT 'all')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'grant_counter';
COMMENT ON FUNCTION sharded_seq.grant_counter(text, text, text) IS 'grant select (counter_value), update (counter_incr) or all on a counter';

CREATE FUNCTION sharded_seq.revoke_counter(name text, grantee text, privilege text DEFAULT 'all')
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'revoke_counter';

CREATE FUNCTION sharded_seq.flush_counters()
RETURNS integer
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'flush_counters';
COMMENT ON FUNCTION sharded_seq.flush_counters() IS 'move every write-behind amount (shared memory and memcached) of counters you may increment into their shard rows now; returns how many had an amount to move';

CREATE FUNCTION sharded_seq.maintain(
    OUT folded integer, OUT compacted integer, OUT reaped integer)
RETURNS record
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'maintain';
COMMENT ON FUNCTION sharded_seq.maintain() IS 'fold idle counter rows, gather scattered ones, reap retired sequence shards; never changes a total';
REVOKE ALL ON FUNCTION sharded_seq.maintain() FROM PUBLIC;

-- Stored total of a counter (its shard rows), and the amount waiting in
-- memcached (NULL when memcached cannot be read).
CREATE FUNCTION sharded_seq.counter_total(counter_id integer)
RETURNS bigint
LANGUAGE C STABLE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'counter_total';

CREATE FUNCTION sharded_seq.counter_pending(counter_id integer)
RETURNS bigint
LANGUAGE C VOLATILE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'counter_pending';

CREATE VIEW sharded_seq.counters AS
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
GRANT SELECT ON sharded_seq.counters TO PUBLIC;

------------------------------------------------------------------------------
-- memcached fast path: health and counts
------------------------------------------------------------------------------

CREATE FUNCTION sharded_seq.memcached_servers(
    OUT server text, OUT port integer, OUT healthy boolean, OUT detail text)
RETURNS SETOF record
LANGUAGE C VOLATILE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'memcached_servers';
COMMENT ON FUNCTION sharded_seq.memcached_servers() IS 'probe each server in sharded_seq.memcached_servers';

CREATE FUNCTION sharded_seq.memcached_stats_raw(
    OUT kind text, OUT id integer, OUT hits bigint, OUT rebuilds bigint,
    OUT fallbacks bigint, OUT errors bigint, OUT flushes bigint, OUT scope text)
RETURNS SETOF record
LANGUAGE C VOLATILE PARALLEL RESTRICTED
AS 'MODULE_PATHNAME', 'memcached_stats';

CREATE VIEW sharded_seq.memcached_stats AS
SELECT s.kind,
       coalesce(q.name, c.name) AS name,
       s.hits, s.rebuilds, s.fallbacks, s.errors, s.flushes, s.scope
  FROM sharded_seq.memcached_stats_raw() s
  LEFT JOIN sharded_seq.sequence_config q
         ON s.kind OPERATOR(pg_catalog.=) 'sequence' AND q.id OPERATOR(pg_catalog.=) s.id
  LEFT JOIN sharded_seq.counter_config c
         ON s.kind OPERATOR(pg_catalog.=) 'counter' AND c.id OPERATOR(pg_catalog.=) s.id
 ORDER BY 1, 2;
COMMENT ON VIEW sharded_seq.memcached_stats IS 'memcached fast-path hits, lease rebuilds, fallbacks to the database, errors and flushes; cluster-wide when preloaded, else this session';
GRANT SELECT ON sharded_seq.memcached_stats TO PUBLIC;

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

-- 1.4: a claim this node holds already, when replication brings it again,
-- is skipped rather than a duplicate key.  origin = none with copy_data =
-- true copies a subscriber's own claim back to it when the publisher has it
-- from the subscriber.  ENABLE REPLICA: only replication brings claims back.
CREATE FUNCTION sharded_seq.claim_received()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'claim_received';
REVOKE ALL ON FUNCTION sharded_seq.claim_received() FROM PUBLIC;
CREATE TRIGGER claim_received
 BEFORE INSERT ON sharded_seq.node_claims
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.claim_received();
ALTER TABLE sharded_seq.node_claims ENABLE REPLICA TRIGGER claim_received;
