/* sharded_seq--1.0--1.1.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script; CREATE EXTENSION of a
   later version runs this one as ALTER EXTENSION ... UPDATE does. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.1'" to load this file. \quit

-- Each generation's layout is kept with its shards, because a rolled-back
-- layout change brings an older generation back (see sequence.c).  Rows of
-- the generation in force get its layout; older rows were retired by
-- committed changes and can never come back.
ALTER TABLE sharded_seq.sequence_shards
    ADD COLUMN gen_base bigint,
    ADD COLUMN gen_shards integer,
    ADD COLUMN gen_block integer;
UPDATE sharded_seq.sequence_shards s
   SET gen_base = c.base, gen_shards = c.shards, gen_block = c.block
  FROM sharded_seq.sequence_config c
 WHERE c.id OPERATOR(pg_catalog.=) s.seq_id
   AND c.generation OPERATOR(pg_catalog.=) s.generation;

-- memcached keys carry a token per installation, drawn at random.  An
-- installation that already has state in memcached (a buffered counter, a
-- memcached-tier sequence) keeps 1.0's keys (token 0) instead, so that
-- amounts buffered before the update are still flushed, and backends still
-- running the 1.0 library agree with the 1.1 ones.
CREATE TABLE sharded_seq.installation (
    token       bigint NOT NULL
);
INSERT INTO sharded_seq.installation (token)
SELECT CASE WHEN EXISTS (SELECT FROM sharded_seq.counter_config WHERE mode OPERATOR(pg_catalog.=) 'buffered')
              OR EXISTS (SELECT FROM sharded_seq.sequence_config WHERE tier OPERATOR(pg_catalog.=) 'memcached')
            THEN 0
            WHEN t OPERATOR(pg_catalog.=) 0 THEN 1
            ELSE t END
  FROM (SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text), 1, 16))::pg_catalog.bit(64)::pg_catalog.int8 AS t) r;
REVOKE ALL ON sharded_seq.installation FROM PUBLIC;

-- Views: operators qualified, so that no search_path can redirect them.
CREATE OR REPLACE VIEW sharded_seq.counters AS
SELECT c.name,
       c.shards,
       c.mode,
       t.stored OPERATOR(pg_catalog.+) COALESCE(t.pending, 0) AS total,
       t.pending,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at
  FROM sharded_seq.counter_config c
 CROSS JOIN LATERAL (
       SELECT sharded_seq.counter_total(c.id) AS stored,
              CASE WHEN c.mode OPERATOR(pg_catalog.=) 'buffered' THEN sharded_seq.counter_pending(c.id) ELSE 0 END AS pending) t
 ORDER BY c.name;

CREATE OR REPLACE VIEW sharded_seq.memcached_stats AS
SELECT s.kind,
       coalesce(q.name, c.name) AS name,
       s.hits, s.rebuilds, s.fallbacks, s.errors, s.flushes, s.scope
  FROM sharded_seq.memcached_stats_raw() s
  LEFT JOIN sharded_seq.sequence_config q
         ON s.kind OPERATOR(pg_catalog.=) 'sequence' AND q.id OPERATOR(pg_catalog.=) s.id
  LEFT JOIN sharded_seq.counter_config c
         ON s.kind OPERATOR(pg_catalog.=) 'counter' AND c.id OPERATOR(pg_catalog.=) s.id
 ORDER BY 1, 2;

COMMENT ON FUNCTION sharded_seq.flush_counters() IS 'flush every buffered counter you may increment from memcached to its shard rows now; returns how many had an amount to move';
