-- The cache option of sharded sequences (node or session) through the API
-- and the sequences view.  scripts/test.sh runs this file twice.  Without
-- shared_preload_libraries every sequence is drawn per session
-- (cache_in_force 'session') and the node cache counts are NULL
-- (expected/sequence_cache.out); preloaded, a database-tier sequence with
-- cache 'node' is drawn from the node cache and the counts are numbers
-- (expected/sequence_cache_1.out).  t/node_cache.pl tests the node cache.
SELECT sharded_seq.create_sequence('c_default', shards => 2, block => 10);
SELECT sharded_seq.create_sequence('c_node', shards => 2, block => 10, cache => 'node');
SELECT sharded_seq.create_sequence('c_session', shards => 2, block => 10, cache => 'session');
SELECT sharded_seq.create_sequence('c_lease', tier => 'memcached', block => 10, cache => 'session');
SELECT name, tier, cache, cache_in_force, node_cache_hits, node_cache_reservations,
       node_cache_waits, node_cache_full
  FROM sharded_seq.sequences WHERE name LIKE 'c\_%' ORDER BY name;

-- bad values: SQLSTATE, message and hint
CREATE FUNCTION pg_temp.err(cmd text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; hint text;
BEGIN
    EXECUTE cmd;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RETURN st || ' ' || msg || ' HINT: ' || coalesce(hint, '(none)');
END $$;
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('c_bad', cache => 'server')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('c_bad', cache => NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_sequence('c_node', cache => 'Node')$$);
SELECT count(*) AS not_created FROM sharded_seq.sequences WHERE name = 'c_bad';

-- draws work in both modes, and increase
SELECT bool_and(d > 0) AS increasing
  FROM (SELECT v - lag(v) OVER (ORDER BY g) AS d
          FROM (SELECT g, sharded_nextval('c_node') AS v FROM generate_series(1, 25) g) x) y;
SELECT bool_and(d > 0) AS increasing
  FROM (SELECT v - lag(v) OVER (ORDER BY g) AS d
          FROM (SELECT g, sharded_nextval('c_session') AS v FROM generate_series(1, 25) g) x) y;

-- a change of cache starts a new generation above everything reserved
-- (a session's values keep increasing across it); the same cache again
-- changes nothing; NULL keeps it
SELECT sharded_nextval('c_node') AS before_switch \gset
SELECT reserved_high_water AS hw FROM sharded_seq.sequences WHERE name = 'c_node' \gset
SELECT sharded_seq.alter_sequence('c_node', cache => 'session');
SELECT cache, generation, generation_start = :hw + 1 AS starts_above_reserved
  FROM sharded_seq.sequences WHERE name = 'c_node';
SELECT sharded_nextval('c_node') > :before_switch AS above_before_switch;
SELECT sharded_seq.alter_sequence('c_node', cache => 'session');
SELECT sharded_seq.alter_sequence('c_node', block => 10);
SELECT sharded_seq.alter_sequence('c_node', cache => NULL);
SELECT cache, generation FROM sharded_seq.sequences WHERE name = 'c_node';
SELECT sharded_seq.alter_sequence('c_node', cache => 'node', block => 20);
SELECT cache, block, generation FROM sharded_seq.sequences WHERE name = 'c_node';
-- a layout change keeps the cache
SELECT sharded_seq.alter_sequence('c_session', shards => 3);
SELECT sharded_seq.advance_sequence('c_session', 1000);
SELECT cache, shards, generation FROM sharded_seq.sequences WHERE name = 'c_session';
SELECT sharded_nextval('c_session') > 1000 AS advanced;

-- the function behind the view, called directly
SELECT * FROM sharded_seq.sequence_cache(0, 'database', 'node');

SELECT sharded_seq.drop_sequence(name) FROM sharded_seq.sequences WHERE name LIKE 'c\_%' ORDER BY name;
