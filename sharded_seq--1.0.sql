/* sharded_seq--1.0.sql
   The base script: every version installs as this script followed by the
   update scripts sharded_seq--X--Y.sql up to it, as PostgreSQL's contrib
   modules do (CREATE EXTENSION runs the chain itself). */

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
-- base + (k * shards + i) * block ... + block - 1.
CREATE TABLE sharded_seq.sequence_shards (
    seq_id      integer NOT NULL,
    generation  integer NOT NULL,
    shard       integer NOT NULL,
    relid       regclass NOT NULL,
    PRIMARY KEY (seq_id, generation, shard)
);

-- One row per counter.
CREATE TABLE sharded_seq.counter_config (
    id          integer PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    shards      integer NOT NULL,
    mode        text NOT NULL,
    owner       regrole NOT NULL,
    acl         aclitem[],
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    altered_at  timestamptz
);

-- Counter shard rows.  value is not indexed and the fill factor leaves room,
-- so increments are HOT updates that stay on their page.
CREATE TABLE sharded_seq.counter_shards (
    counter_id  integer NOT NULL,
    shard       integer NOT NULL,
    value       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (counter_id, shard)
) WITH (fillfactor = 20,
        autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_vacuum_threshold = 2000,
        autovacuum_vacuum_cost_delay = 0);

SELECT pg_catalog.pg_extension_config_dump('sharded_seq.object_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.sequence_config', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.sequence_shards', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.counter_config', '');
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.counter_shards', '');

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

CREATE VIEW sharded_seq.sequences AS
SELECT c.name,
       c.shards,
       c.block,
       c.tier,
       c.generation,
       c.base AS generation_start,
       sharded_seq.sequence_high_water(c.id) AS reserved_high_water,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at
  FROM sharded_seq.sequence_config c
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequences IS 'one row per sharded sequence';
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
COMMENT ON FUNCTION sharded_seq.create_counter(text, integer, text) IS 'create a counter; NULL shards takes sharded_seq.default_counter_shards';

CREATE FUNCTION sharded_seq.alter_counter(
    name text,
    shards integer DEFAULT NULL,
    mode text DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'alter_counter';
COMMENT ON FUNCTION sharded_seq.alter_counter(text, integer, text) IS 'change shard count (up or down) or mode online; the total is kept';

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
COMMENT ON FUNCTION sharded_seq.flush_counters() IS 'flush every buffered counter from memcached to its shard rows now; returns how many had an amount to move';

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
       c.shards,
       c.mode,
       t.stored + coalesce(t.pending, 0) AS total,
       t.pending,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at
  FROM sharded_seq.counter_config c
 CROSS JOIN LATERAL (
       SELECT sharded_seq.counter_total(c.id) AS stored,
              CASE WHEN c.mode = 'buffered' THEN sharded_seq.counter_pending(c.id) ELSE 0 END AS pending) t
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.counters IS 'one row per counter; pending is what a buffered counter holds in memcached (NULL if unreadable)';
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
  LEFT JOIN sharded_seq.sequence_config q ON s.kind = 'sequence' AND q.id = s.id
  LEFT JOIN sharded_seq.counter_config c ON s.kind = 'counter' AND c.id = s.id
 ORDER BY 1, 2;
COMMENT ON VIEW sharded_seq.memcached_stats IS 'memcached fast-path hits, lease rebuilds, fallbacks to the database, errors and flushes; cluster-wide when preloaded, else this session';
GRANT SELECT ON sharded_seq.memcached_stats TO PUBLIC;
