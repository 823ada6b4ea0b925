-- C1: increments take no row lock during the transaction; at commit they
-- never wait while a shard is free, wait only when every shard is held, and
-- increments in opposite orders never deadlock.
BEGIN;
SELECT plan(12);
CREATE EXTENSION IF NOT EXISTS dblink;
-- runs a statement that returns rows in another session
CREATE FUNCTION pg_temp.remote(conn text, cmd text) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM dblink(conn, cmd) AS t(x text);
END $fn$;
SELECT format('host=127.0.0.1 port=%s dbname=%s user=%s',
              current_setting('port'), current_database(), current_user) AS conn \gset
SELECT dblink_connect('a', :'conn');
SELECT dblink_connect('b', :'conn');
SELECT dblink_connect('c', :'conn');
-- never hang the suite: any wait longer than this fails the statement
SELECT dblink_exec(x, $$SET lock_timeout = '3s'$$) FROM unnest(ARRAY['a', 'b', 'c']) x;

SELECT pg_temp.remote('a', $$SELECT sharded_seq.create_counter('lk', shards => 2)$$);
SELECT pg_temp.remote('a', $$SELECT sharded_seq.create_counter('lk_x', shards => 2)$$);
SELECT pg_temp.remote('a', $$SELECT sharded_seq.create_counter('lk_y', shards => 2)$$);
SELECT id AS lk FROM sharded_seq.counter_config WHERE name = 'lk' \gset

-- during the transaction no shard row is locked
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.remote('a', $$SELECT counter_incr('lk')$$);
SELECT is((SELECT n FROM dblink('c', format('SELECT count(*) FROM (SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = %s FOR UPDATE SKIP LOCKED) s', :lk)) AS t(n bigint)),
          2::bigint, 'an open transaction that incremented holds no shard row');
SELECT dblink_exec('b', 'BEGIN');
SELECT dblink_exec('b', $$SET LOCAL lock_timeout = '200ms'$$);
SELECT lives_ok($$SELECT pg_temp.remote('b', 'SELECT counter_incr(''lk'', 2)')$$,
                'a concurrent increment does not wait');
SELECT lives_ok($$SELECT dblink_exec('b', 'COMMIT')$$, '... nor does its commit');
SELECT lives_ok($$SELECT dblink_exec('a', 'COMMIT')$$, 'the first transaction commits too');
SELECT is(counter_value('lk'), 3::bigint, 'the total is the sum of the committed increments');

-- every shard held: a commit has to wait, and times out
SELECT dblink_exec('c', 'BEGIN');
SELECT pg_temp.remote('c', format('SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = %s FOR UPDATE', :lk));
SELECT dblink_exec('b', 'BEGIN');
SELECT dblink_exec('b', $$SET LOCAL lock_timeout = '200ms'$$);
SELECT pg_temp.remote('b', $$SELECT counter_incr('lk')$$);
SELECT throws_ok($$SELECT dblink_exec('b', 'COMMIT')$$, '55P03', NULL,
                 'a commit waits when every shard is held');
SELECT dblink_exec('c', 'ROLLBACK');

-- one shard held, the other free: the commit takes the free one at once
SELECT dblink_exec('c', 'BEGIN');
SELECT pg_temp.remote('c', format('SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = %s AND shard = 0 FOR UPDATE', :lk));
SELECT dblink_exec('b', 'BEGIN');
SELECT dblink_exec('b', $$SET LOCAL lock_timeout = '200ms'$$);
SELECT pg_temp.remote('b', $$SELECT counter_incr('lk', 10)$$);
SELECT lives_ok($$SELECT dblink_exec('b', 'COMMIT')$$, 'a commit skips a held shard while another is free (shard 0 held)');
SELECT dblink_exec('c', 'ROLLBACK');
SELECT dblink_exec('c', 'BEGIN');
SELECT pg_temp.remote('c', format('SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = %s AND shard = 1 FOR UPDATE', :lk));
SELECT dblink_exec('b', 'BEGIN');
SELECT dblink_exec('b', $$SET LOCAL lock_timeout = '200ms'$$);
SELECT pg_temp.remote('b', $$SELECT counter_incr('lk', 100)$$);
SELECT lives_ok($$SELECT dblink_exec('b', 'COMMIT')$$, '... (shard 1 held)');
SELECT dblink_exec('c', 'ROLLBACK');
SELECT is(counter_value('lk'), 113::bigint, 'the timed-out commit added nothing; the others did');

-- cross order: a does x then y, b does y then x, both inside open transactions
SELECT dblink_exec('a', 'BEGIN');
SELECT dblink_exec('b', 'BEGIN');
SELECT pg_temp.remote('a', $$SELECT counter_incr('lk_x')$$);
SELECT pg_temp.remote('b', $$SELECT counter_incr('lk_y')$$);
SELECT pg_temp.remote('a', $$SELECT counter_incr('lk_y')$$);
SELECT pg_temp.remote('b', $$SELECT counter_incr('lk_x')$$);
SELECT lives_ok($$SELECT dblink_exec('a', 'COMMIT')$$, 'a commits after x then y');
SELECT lives_ok($$SELECT dblink_exec('b', 'COMMIT')$$, 'b commits after y then x: no deadlock');
SELECT is(ARRAY[counter_value('lk_x'), counter_value('lk_y')], ARRAY[2, 2]::bigint[], 'both totals are exact');

SELECT pg_temp.remote('a', format('SELECT sharded_seq.drop_counter(%L)', x)) FROM unnest(ARRAY['lk', 'lk_x', 'lk_y']) x;
SELECT dblink_disconnect(x) FROM unnest(ARRAY['a', 'b', 'c']) x;
SELECT * FROM finish();
ROLLBACK;
