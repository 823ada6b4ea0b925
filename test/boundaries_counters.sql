-- C1 and E1 at transaction boundaries: increments, reads and every
-- administrative call on counters crossed with ROLLBACK, ROLLBACK TO
-- SAVEPOINT, PREPARE TRANSACTION with COMMIT or ROLLBACK PREPARED, an error
-- after the call, concurrent DDL (alter, drop, VACUUM FULL, CLUSTER, an added
-- index, DROP and CREATE EXTENSION) and SERIALIZABLE.
BEGIN;
SELECT plan(33);
\ir boundaries_setup.psql

------------------------------------------------------------------------------
-- counters
------------------------------------------------------------------------------
-- the first object, so that after DROP and CREATE EXTENSION its successor
-- gets the same id (ids start again at 1)
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tr', shards => 2, block => 10)$$);
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc', shards => 3)$$);
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc_buf', shards => 1, mode => 'memcached')$$);
-- a counter's total read by session b; NULL if it cannot be read
CREATE FUNCTION pg_temp.val(name text) RETURNS bigint LANGUAGE sql AS $$
    SELECT CASE WHEN v LIKE 'ERROR%' THEN NULL ELSE v::bigint END
      FROM pg_temp.q('b', format('SELECT counter_value(%L)', name)) v
$$;

SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 5)$$);
SELECT dblink_exec('a', 'ROLLBACK');
SELECT is(pg_temp.val('tc'), 0::bigint, 'ROLLBACK: an increment does not count');

SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 1)$$);
SELECT dblink_exec('a', 'SAVEPOINT s');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 10)$$);
SELECT dblink_exec('a', 'ROLLBACK TO SAVEPOINT s');
SELECT dblink_exec('a', 'SAVEPOINT s2');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 100)$$);
SELECT dblink_exec('a', 'RELEASE SAVEPOINT s2');
SELECT is(pg_temp.q('a', $$SELECT counter_value('tc')$$)::bigint, 101::bigint, 'a transaction sees its own increments, less the rolled-back savepoint');
SELECT dblink_exec('a', 'COMMIT');
SELECT is(pg_temp.val('tc'), 101::bigint, 'ROLLBACK TO SAVEPOINT takes back only that savepoint''s increments');

SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 7)$$);
SELECT is(pg_temp.state('a', 'SELECT 1/0'), '22012', 'an error after the increment');
SELECT dblink_exec('a', 'ROLLBACK');
SELECT is(pg_temp.val('tc'), 101::bigint, '... and the increment does not count');

-- two-phase commit, exact and memcached (no memcached server here: the rows)
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 3), counter_incr('tc_buf', 4)$$);
SELECT dblink_exec('a', $$PREPARE TRANSACTION 'tc_1'$$);
SELECT is(pg_temp.val('tc'), 101::bigint, 'a prepared increment is not counted yet');
SELECT dblink_exec('c', $$COMMIT PREPARED 'tc_1'$$);
SELECT is(pg_temp.val('tc'), 104::bigint, 'COMMIT PREPARED counts it, exact');
SELECT is(pg_temp.val('tc_buf'), 4::bigint, '... and memcached');
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 3), counter_incr('tc_buf', 4)$$);
SELECT dblink_exec('a', $$PREPARE TRANSACTION 'tc_2'$$);
SELECT dblink_exec('c', $$ROLLBACK PREPARED 'tc_2'$$);
SELECT is(pg_temp.val('tc'), 104::bigint, 'ROLLBACK PREPARED does not count it, exact');
SELECT is(pg_temp.val('tc_buf'), 4::bigint, '... nor memcached');

-- one counter, increments of both signs on a memcached counter, one commit
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_buf', -1), counter_incr('tc_buf', 5)$$);
SELECT is(pg_temp.state('a', 'COMMIT'), '00000', 'a memcached counter with increments of both signs commits');
SELECT is(pg_temp.val('tc_buf'), 8::bigint, '... and counts their sum once');

-- drop_counter in a rolled-back savepoint keeps the transaction's increments
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 3)$$);
SELECT dblink_exec('a', 'SAVEPOINT d');
SELECT pg_temp.x('a', $$SELECT sharded_seq.drop_counter('tc')$$);
SELECT dblink_exec('a', 'ROLLBACK TO SAVEPOINT d');
SELECT dblink_exec('a', 'COMMIT');
SELECT is(pg_temp.val('tc'), 107::bigint, 'drop_counter in a rolled-back savepoint forgets nothing');

-- drop_counter that commits with increments pending in the same transaction
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc_tmp')$$);
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_tmp', 3), counter_incr('tc', 1)$$);
SELECT pg_temp.x('a', $$SELECT sharded_seq.drop_counter('tc_tmp')$$);
SELECT is(pg_temp.state('a', 'COMMIT'), '00000', 'a transaction that increments and then drops a counter commits');
SELECT is(pg_temp.val('tc'), 108::bigint, '... with its other increments');

-- a counter dropped by another session before commit: the whole transaction rolls back
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc_victim')$$);
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 1), counter_incr('tc_buf', 1), counter_incr('tc_victim', 1)$$);
SELECT pg_temp.x('b', $$SELECT sharded_seq.drop_counter('tc_victim')$$);
SELECT is(pg_temp.state('a', 'COMMIT'), '42704', 'a counter dropped before commit fails the commit');
SELECT is(pg_temp.val('tc') * 1000 + pg_temp.val('tc_buf'), 108008::bigint, '... and none of its increments count');

-- merged savepoints that overflow are an error, not a wrapped total
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc_big', shards => 2)$$);
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_big', -9000000000000000000)$$);
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_big', 9000000000000000000)$$);
SELECT dblink_exec('a', 'SAVEPOINT o');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_big', 9000000000000000000)$$);
SELECT dblink_exec('a', 'RELEASE SAVEPOINT o');
SELECT is(pg_temp.state('a', 'COMMIT'), '22003', 'savepoints whose sum overflows a bigint fail the commit with 22003');
SELECT is(pg_temp.val('tc_big'), -9000000000000000000::bigint, '... and the stored total is unchanged and readable');

-- concurrent increments under SERIALIZABLE: counter_incr returns the total
-- its transaction sees, so SSI may fail one of two overlapping commits with
-- 40001; whatever commits counts exactly once, whatever fails counts not at all
SELECT dblink_exec('a', 'BEGIN ISOLATION LEVEL SERIALIZABLE');
SELECT dblink_exec('b', 'BEGIN ISOLATION LEVEL SERIALIZABLE');
SELECT pg_temp.q('a', $$SELECT counter_incr('tc', 2)$$);
SELECT pg_temp.q('b', $$SELECT counter_incr('tc', 3)$$);
SELECT pg_temp.state('a', 'COMMIT') AS ser_a, pg_temp.state('b', 'COMMIT') AS ser_b \gset
SELECT dblink_exec('b', 'ROLLBACK');
SELECT ok(:'ser_a' IN ('00000', '40001') AND :'ser_b' IN ('00000', '40001') AND '00000' IN (:'ser_a', :'ser_b'),
          'SERIALIZABLE increments of one counter: each commits or fails with 40001');
SELECT is(pg_temp.val('tc'), 108 + CASE WHEN :'ser_a' = '00000' THEN 2 ELSE 0 END
                                 + CASE WHEN :'ser_b' = '00000' THEN 3 ELSE 0 END::bigint,
          '... and exactly the committed ones count');
SELECT pg_temp.val('tc') AS tc_base \gset

-- a shard change made while a transaction holds increments
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 5)$$);
SELECT pg_temp.x('b', $$SELECT sharded_seq.alter_counter('tc', shards => 1)$$);
SELECT dblink_exec('a', 'COMMIT');
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 5)$$);
SELECT pg_temp.x('b', $$SELECT sharded_seq.alter_counter('tc', shards => 6)$$);
SELECT dblink_exec('a', 'COMMIT');
SELECT is(pg_temp.val('tc'), :tc_base + 10::bigint, 'increments committed across a shrink and a grow all count');

-- VACUUM FULL and CLUSTER move the rows a transaction remembered
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc_filler_' || g, shards => 16) FROM generate_series(1, 300) g$$);
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_counter('tc_far', shards => 2)$$);
SELECT pg_temp.x('a', $$SELECT sharded_seq.drop_counter('tc_filler_' || g) FROM generate_series(1, 300) g$$);
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_far', 2)$$);
SELECT dblink_exec('b', 'VACUUM FULL sharded_seq.counter_shards');
SELECT is(pg_temp.state('a', 'COMMIT'), '00000', 'a commit after VACUUM FULL moved the counter''s rows succeeds');
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc_far', 3)$$);
SELECT dblink_exec('b', 'CLUSTER sharded_seq.counter_shards USING counter_shards_pkey');
SELECT is(pg_temp.state('a', 'COMMIT'), '00000', '... and after CLUSTER');
SELECT is(pg_temp.val('tc_far'), 5::bigint, '... and both increments count');

-- an index added by an administrator is kept up to date by non-HOT updates
SELECT dblink_exec('b', 'CREATE EXTENSION IF NOT EXISTS amcheck');
SELECT dblink_exec('b', 'CREATE INDEX tc_value_idx ON sharded_seq.counter_shards (value)');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 1) FROM generate_series(1, 3)$$);
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 1)$$);
SELECT dblink_exec('a', 'COMMIT');
SELECT is(pg_temp.state('b', $$SELECT bt_index_check('sharded_seq.tc_value_idx', true)$$), '00000',
          'every index of the shard table holds every row version an increment made');
SELECT is(pg_temp.q('b', $$SET enable_seqscan = off; SELECT sum(value) FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'tc') AND value > -1000000$$)::bigint,
          :tc_base + 14::bigint, '... and an index scan of it finds the total');
SELECT dblink_exec('b', 'DROP INDEX sharded_seq.tc_value_idx');

------------------------------------------------------------------------------
-- DROP EXTENSION and CREATE EXTENSION under a session that has state
------------------------------------------------------------------------------
SELECT pg_temp.draw('b', 'tr', 3, 'before reinstall');
SELECT pg_temp.q('b', $$SELECT counter_value('tc')$$);
SELECT dblink_exec('a', 'DROP EXTENSION sharded_seq CASCADE');
SELECT dblink_exec('a', 'CREATE EXTENSION sharded_seq');
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tr', shards => 1, block => 1000)$$);
SELECT is(pg_temp.state('b', $$SELECT sharded_nextval('tr')$$), '00000', 'after DROP and CREATE EXTENSION, an existing session draws without reconnecting');
SELECT is(pg_temp.q('b', $$SELECT sharded_nextval('tr')$$), '2', '... from the new sequence, not a block of the old one');
SELECT is(pg_temp.state('b', $$SELECT counter_incr('tc')$$), '00000', '... and increments');
SELECT is(pg_temp.state('a', $$SELECT sharded_seq.create_counter('tc2')$$), '00000', 'the session that reinstalled works too');

-- increments on both sides of a reinstall in one transaction: counter ids
-- start again at 1, so the new 'tc' has the old one's id
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 5)$$);
SELECT dblink_exec('a', 'DROP EXTENSION sharded_seq CASCADE');
SELECT dblink_exec('a', 'CREATE EXTENSION sharded_seq');
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tr')$$);
SELECT pg_temp.x('a', $$SELECT counter_incr('tc', 3)$$);
SELECT is(pg_temp.state('a', 'COMMIT'), '00000', 'a transaction that increments, reinstalls and increments again commits');
SELECT is(pg_temp.q('b', $$SELECT id || ' ' || counter_value('tc') FROM sharded_seq.counter_config WHERE name = 'tc'$$), '2 3',
          '... and only the new installation''s increment counts, in the counter with the old one''s id');

SELECT dblink_disconnect('a');
SELECT dblink_disconnect('b');
SELECT dblink_disconnect('c');
SELECT * FROM finish();
ROLLBACK;
