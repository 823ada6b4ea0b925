-- Bad input to counters: right SQLSTATE, lower-case message, a hint, and the
-- stored total unchanged.
CREATE FUNCTION pg_temp.err(cmd text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; hint text; detail text;
BEGIN
    EXECUTE cmd;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT, detail = PG_EXCEPTION_DETAIL;
    RETURN st || ' ' || msg
        || CASE WHEN msg ~ '^[a-z]' THEN '' ELSE ' [MESSAGE NOT LOWER-CASE]' END
        || CASE WHEN coalesce(hint, '') <> '' OR coalesce(detail, '') <> '' THEN ' [has hint]' ELSE ' [NO HINT]' END;
END $$;

SELECT sharded_seq.create_counter('c', shards => 2);
SELECT counter_incr('c', 41);

SELECT pg_temp.err($$SELECT counter_incr(NULL)$$);
SELECT pg_temp.err($$SELECT counter_incr('')$$);
SELECT pg_temp.err($$SELECT counter_incr(repeat('z', 64))$$);
SELECT pg_temp.err($$SELECT counter_incr('c', NULL)$$);
SELECT pg_temp.err($$SELECT counter_value(NULL)$$);
SELECT pg_temp.err($$SELECT counter_value('')$$);
SELECT pg_temp.err($$SELECT counter_value('missing')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter(NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('c')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', shards => 0)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', shards => -1)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', shards => 1000000)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', mode => 'fuzzy')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', mode => NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', mode => 'Buffered')$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_counter('missing', shards => 2)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_counter('c', shards => 0)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_counter('c', mode => 'sloppy')$$);
-- mode 'buffered' lives in shared memory: without shared_preload_libraries
-- it is refused, with a hint naming the setting.  scripts/test.sh runs this
-- file preloaded too (expected/counter_errors_1.out): there both calls
-- succeed, the DO block finds 'd' already made, shared memory has its slots
-- and the launcher runs; 'd' and c's mode are then undone, so that the rest
-- of this file and the next files see the same counters either way.
SELECT pg_temp.err($$SELECT sharded_seq.create_counter('d', mode => 'buffered')$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_counter('c', mode => 'buffered')$$);
SELECT pg_temp.err($$SELECT sharded_seq.flush_counters()::text$$);
DO $$
DECLARE h text;
BEGIN
    PERFORM sharded_seq.create_counter('d', mode => 'buffered');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS h = PG_EXCEPTION_HINT;
    RAISE NOTICE 'hint: %', h;
END $$;
SELECT * FROM sharded_seq.buffered_slots();
SELECT kind, running, last_error FROM sharded_seq.workers WHERE kind = 'launcher';
SELECT count(*) AS made FROM (SELECT sharded_seq.drop_counter(name) FROM sharded_seq.counters WHERE name = 'd') s;
SELECT sharded_seq.alter_counter('c', mode => 'exact');
SELECT pg_temp.err($$SELECT sharded_seq.drop_counter('missing')$$);
SELECT pg_temp.err($$SELECT sharded_seq.grant_counter('c', 'nobody_at_all')$$);
SELECT pg_temp.err($$SELECT sharded_seq.grant_counter('c', 'public', 'delete')$$);
-- a setting out of its range: PostgreSQL's own range check answers, with
-- the range in its message, and the extension adds its hint as the error is
-- reported (a PL/pgSQL handler, which catches it earlier, sees no hint)
SET sharded_seq.default_counter_shards = -1;
-- overflow: 22003, and the total is unchanged
SELECT pg_temp.err($$SELECT counter_incr('c', 9223372036854775807)$$);
SELECT counter_value('c') AS total_after_overflow;
SELECT sharded_seq.create_counter('low', shards => 1);
SELECT counter_incr('low', -9223372036854775807);
SELECT pg_temp.err($$SELECT counter_incr('low', -2)$$);
SELECT counter_value('low') AS low_unchanged;
SELECT sharded_seq.drop_counter('low');

SELECT name, shards, mode, total FROM sharded_seq.counters ORDER BY name;
SELECT counter_value('c');
SELECT sharded_seq.drop_counter('c');

-- adaptive and a fixed number of shards contradict each other: 22023
SELECT pg_temp.err($$SELECT sharded_seq.alter_counter('c', shards => 2, adaptive => true)$$);
