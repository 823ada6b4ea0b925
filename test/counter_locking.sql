-- C1: an increment never waits while a shard is free; it waits only when
-- every shard is held; increments in opposite orders never deadlock.
BEGIN;
SELECT plan(9);
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

-- a holds one shard of lk; b must take the other without waiting
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.remote('a', $$SELECT counter_incr('lk')$$);
SELECT dblink_exec('b', 'BEGIN');
SELECT dblink_exec('b', $$SET LOCAL lock_timeout = '200ms'$$);
SELECT lives_ok($$SELECT pg_temp.remote('b', 'SELECT counter_incr(''lk'')')$$,
                'an increment takes a free shard instead of waiting for a held one');
SELECT lives_ok($$SELECT pg_temp.remote('b', 'SELECT counter_incr(''lk'', 2)')$$,
                'a second increment in the same transaction reuses its own shard');

-- now both shards are held: c has to wait, and times out
SELECT dblink_exec('c', 'BEGIN');
SELECT dblink_exec('c', $$SET LOCAL lock_timeout = '200ms'$$);
SELECT throws_ok($$SELECT pg_temp.remote('c', 'SELECT counter_incr(''lk'')')$$, '55P03', NULL,
                 'an increment waits when every shard is held');
SELECT dblink_exec('c', 'ROLLBACK');
SELECT dblink_exec('a', 'COMMIT');
SELECT dblink_exec('b', 'COMMIT');
SELECT is(counter_value('lk'), 4::bigint, 'the total is the sum of the committed increments');

-- cross order: a does x then y, b does y then x, both inside open transactions
SELECT dblink_exec('a', 'BEGIN');
SELECT dblink_exec('b', 'BEGIN');
SELECT pg_temp.remote('a', $$SELECT counter_incr('lk_x')$$);
SELECT pg_temp.remote('b', $$SELECT counter_incr('lk_y')$$);
SELECT lives_ok($$SELECT pg_temp.remote('a', 'SELECT counter_incr(''lk_y'')')$$, 'a increments y while b holds a shard of y');
SELECT lives_ok($$SELECT pg_temp.remote('b', 'SELECT counter_incr(''lk_x'')')$$, 'b increments x while a holds a shard of x: no deadlock');
SELECT lives_ok($$SELECT dblink_exec('a', 'COMMIT')$$, 'a commits');
SELECT lives_ok($$SELECT dblink_exec('b', 'COMMIT')$$, 'b commits');
SELECT is(ARRAY[counter_value('lk_x'), counter_value('lk_y')], ARRAY[2, 2]::bigint[], 'both totals are exact');

SELECT pg_temp.remote('a', format('SELECT sharded_seq.drop_counter(%L)', x)) FROM unnest(ARRAY['lk', 'lk_x', 'lk_y']) x;
SELECT dblink_disconnect(x) FROM unnest(ARRAY['a', 'b', 'c']) x;
SELECT * FROM finish();
ROLLBACK;
