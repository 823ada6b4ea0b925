-- E1: an administrative change made in another session takes effect here at
-- once: no reconnect, no stale cache, even inside an open transaction.
BEGIN;
SELECT plan(15);
CREATE EXTENSION IF NOT EXISTS dblink;
-- runs a statement that returns rows in another session
CREATE FUNCTION pg_temp.remote(conn text, cmd text) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM dblink(conn, cmd) AS t(x text);
END $fn$;
SELECT dblink_connect('other', format('host=127.0.0.1 port=%s dbname=%s user=%s',
                      current_setting('port'), current_database(), current_user));

SELECT pg_temp.remote('other', $$SELECT sharded_seq.create_sequence('xs_seq', shards => 2, block => 100)$$);
SELECT ok(sharded_nextval('xs_seq') IS NOT NULL, 'a sequence created by another session can be drawn from at once');
SELECT sharded_nextval('xs_seq') AS v1 \gset

SELECT pg_temp.remote('other', $$SELECT sharded_seq.advance_sequence('xs_seq', 5000000)$$);
SELECT cmp_ok(sharded_nextval('xs_seq'), '>', 5000000::bigint,
              'an advance in another session discards the block cached here');

SELECT sharded_nextval('xs_seq') AS v2 \gset
SELECT pg_temp.remote('other', $$SELECT sharded_seq.alter_sequence('xs_seq', shards => 3, block => 7)$$);
SELECT is((SELECT shards FROM sharded_seq.sequences WHERE name = 'xs_seq'), 3, 'the new layout is visible');
SELECT cmp_ok(sharded_nextval('xs_seq'), '>', :v2::bigint, 'values keep increasing across the alter');
SELECT cmp_ok(sharded_currval('xs_seq'), '>=',
              (SELECT generation_start FROM sharded_seq.sequences WHERE name = 'xs_seq'),
              '... and come from the new generation');

-- a privilege change made elsewhere applies here at once
CREATE ROLE ss_xs_role;
SELECT dblink_exec('other', $$CREATE ROLE ss_xs_remote$$);
SELECT pg_temp.remote('other', $$SELECT sharded_seq.grant_sequence('xs_seq', 'ss_xs_remote')$$);
GRANT ss_xs_remote TO ss_xs_role;
SET ROLE ss_xs_role;
SELECT lives_ok($$SELECT sharded_nextval('xs_seq')$$, 'a grant made elsewhere applies at once');
RESET ROLE;
SELECT pg_temp.remote('other', $$SELECT sharded_seq.revoke_sequence('xs_seq', 'ss_xs_remote')$$);
SET ROLE ss_xs_role;
SELECT throws_ok($$SELECT sharded_nextval('xs_seq')$$, '42501', NULL, 'a revoke made elsewhere applies at once');
RESET ROLE;

SELECT pg_temp.remote('other', $$SELECT sharded_seq.drop_sequence('xs_seq')$$);
SELECT throws_ok($$SELECT sharded_nextval('xs_seq')$$, '42704', NULL, 'a sequence dropped elsewhere is gone here at once');
SELECT pg_temp.remote('other', $$SELECT sharded_seq.create_sequence('xs_seq', shards => 1, block => 5, start => 900)$$);
SELECT throws_ok($$SELECT sharded_currval('xs_seq')$$, '55000', NULL, 'a recreated sequence does not inherit this session''s currval');
SELECT cmp_ok(sharded_nextval('xs_seq'), '>=', 900::bigint, 'a recreated sequence starts at its own start');

-- counters
SELECT pg_temp.remote('other', $$SELECT sharded_seq.create_counter('xs_ctr', shards => 4)$$);
SELECT is(counter_incr('xs_ctr', 3), 3::bigint, 'a counter created elsewhere is usable at once');
SELECT pg_temp.remote('other', $$SELECT counter_incr('xs_ctr', 10)$$);
SELECT is(counter_value('xs_ctr'), 13::bigint, 'committed increments from elsewhere are counted');
SELECT pg_temp.remote('other', $$SELECT sharded_seq.alter_counter('xs_ctr', shards => 8)$$);
SELECT is(counter_incr('xs_ctr', 1), 14::bigint, 'a shard change made elsewhere keeps the total');
SELECT is((SELECT shards FROM sharded_seq.counters WHERE name = 'xs_ctr'), 8, '... and is visible');
SELECT pg_temp.remote('other', $$SELECT sharded_seq.create_counter('xs_ctr2', shards => 2)$$);
SELECT pg_temp.remote('other', $$SELECT sharded_seq.drop_counter('xs_ctr2')$$);
SELECT throws_ok($$SELECT counter_value('xs_ctr2')$$, '42704', NULL, 'a counter dropped elsewhere is gone here at once');

SELECT pg_temp.remote('other', $$SELECT sharded_seq.drop_sequence('xs_seq')$$);
SELECT dblink_disconnect('other');
SELECT * FROM finish();
ROLLBACK;
-- From PostgreSQL 16, GRANT ss_xs_remote TO ss_xs_role above locks the role
-- until this transaction ends, so the role made elsewhere is dropped after it.
DROP ROLE ss_xs_remote;
