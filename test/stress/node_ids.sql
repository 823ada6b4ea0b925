-- Node ids, on one server started with sharded_seq.node_id = 5 (run by
-- test/stress/node_ids.sh, which also gives it memcached and preloads the
-- library).  Statements commit one by one: sessions "a" and "b" (dblink) are
-- other backends of this server, started when the test says.
\set ON_ERROR_STOP 1
SELECT plan(51);
CREATE EXTENSION IF NOT EXISTS dblink;
SELECT format('host=127.0.0.1 port=%s dbname=%s user=%s',
              current_setting('port'), current_database(), current_user) AS conn \gset
\set lo 45035996273704960
\set hi 54043195528445951

-- one value from a statement in another session, or 'ERROR <sqlstate>: <message>'
CREATE FUNCTION pg_temp.q(conn text, cmd text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE v text; m text;
BEGIN
    SELECT x INTO v FROM dblink(conn, cmd) AS t(x text);
    RETURN v;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v = RETURNED_SQLSTATE, m = MESSAGE_TEXT;
    RETURN 'ERROR ' || v || ': ' || m;
END $fn$;
-- strictly increasing?
CREATE FUNCTION pg_temp.increasing(a bigint[]) RETURNS boolean LANGUAGE sql AS $$
    SELECT coalesce(bool_and(a[i] > a[i - 1]), true) FROM generate_series(2, cardinality(a)) i
$$;

SELECT is(sharded_seq.node_id(), 5, 'the session is node 5');

---------------------------------------------------------------------------
-- sequences: values in node 5's range
---------------------------------------------------------------------------
SELECT sharded_seq.create_sequence('s', shards => 4, block => 10);
SELECT is((SELECT node_id || ' ' || system_identifier || ' ' || database FROM sharded_seq.node_claims),
          '5 ' || (SELECT system_identifier FROM pg_control_system()) || ' ' || current_database(),
          'the first use claims node 5 for this system and database');
SELECT is((SELECT id % 1024 FROM sharded_seq.sequence_config WHERE name = 's'), 5,
          'a new object id is 5 + 1024k');
CREATE TEMP TABLE drawn AS SELECT g, sharded_nextval('s') AS v FROM generate_series(1, 100) g;
SELECT ok((SELECT bool_and(v BETWEEN :lo AND :hi) FROM drawn), 'every value lies in 5 * 2^53 .. 6 * 2^53 - 1');
SELECT ok(pg_temp.increasing((SELECT array_agg(v ORDER BY g) FROM drawn)), '... and they strictly increase');
SELECT is(sharded_currval('s'), (SELECT v FROM drawn WHERE g = 100), 'sharded_currval is the last value, in the node''s range');
SELECT ok((SELECT generation_start = :lo::bigint AND reserved_high_water BETWEEN (SELECT max(v) FROM drawn) AND :hi
                  AND node_id = 5 FROM sharded_seq.sequences WHERE name = 's'),
          'the sequences view shows positions as node 5''s values');
-- another session draws from node 5's range too, and never a value of ours
SELECT dblink_connect('a', :'conn');
SELECT ok((SELECT bool_and(v BETWEEN :lo AND :hi) AND count(*) = 50 AND NOT bool_or(v IN (SELECT v FROM drawn))
             FROM dblink('a', 'SELECT sharded_nextval(''s'') FROM generate_series(1, 50)') AS t(v bigint)),
          'another session''s values: node 5''s range, none of ours');
SELECT sharded_seq.alter_sequence('s', shards => 2, block => 7);
SELECT ok(sharded_nextval('s') > (SELECT max(v) FROM drawn), 'after alter_sequence, the session''s values still increase');
SELECT sharded_seq.advance_sequence('s', :lo::bigint + 1000000);
SELECT ok(sharded_nextval('s') > :lo::bigint + 1000000, 'advance_sequence(past) in the node''s range: later values are above past');
SELECT sharded_seq.advance_sequence('s', 17);
SELECT ok(sharded_nextval('s') BETWEEN :lo::bigint + 1000000 AND :hi, 'a past below the range changes nothing that matters: never backwards');
SELECT throws_ok($$SELECT sharded_seq.advance_sequence('s', 54043195528445951)$$, '22003', NULL,
                 'advance_sequence past the top of the node''s range is refused');
SELECT throws_ok($$SELECT sharded_seq.create_sequence('far', start => 54043195528445952)$$, '22003', NULL,
                 'create_sequence with a start beyond the range is refused');
SELECT sharded_seq.create_sequence('low', shards => 1, start => 12);
SELECT is(sharded_nextval('low'), :lo::bigint, 'a start below the range: values begin at the bottom of the range');
-- the top of the range: S5's error names the node's range
SELECT sharded_seq.create_sequence('edge', shards => 1, block => 1, start => :hi::bigint - 1);
SELECT is(sharded_nextval('edge'), :hi::bigint - 1, 'the last values of the range are handed out ...');
SELECT is(sharded_nextval('edge'), :hi::bigint, '... up to 6 * 2^53 - 1');
SELECT throws_ok($$SELECT sharded_nextval('edge')$$, '2200H',
                 'sharded sequence "edge" has reached the end of node 5''s range',
                 'then 2200H, naming the node''s range');
SELECT throws_ok($$SELECT sharded_nextval('edge')$$, '2200H', NULL, '... and again: nothing wraps');
-- the memcached tier: leases are local positions too
SELECT sharded_seq.create_sequence('m', tier => 'memcached', block => 100);
CREATE TEMP TABLE mdrawn AS SELECT g, sharded_nextval('m') AS v FROM generate_series(1, 300) g;
SELECT ok((SELECT bool_and(v BETWEEN :lo AND :hi) FROM mdrawn)
          AND pg_temp.increasing((SELECT array_agg(v ORDER BY g) FROM mdrawn)),
          'memcached tier: values in the node''s range, increasing');
SELECT ok((SELECT hits > 0 FROM sharded_seq.memcached_stats WHERE name = 'm'), '... served by memcached');

---------------------------------------------------------------------------
-- counters: this node's rows only; totals over every node's
---------------------------------------------------------------------------
SELECT sharded_seq.create_counter('c');
SELECT counter_incr('c', 3);
SELECT is((SELECT id % 1024 FROM sharded_seq.counter_config WHERE name = 'c'), 5, 'a counter id is 5 + 1024k');
SELECT is((SELECT array_agg(shard ORDER BY shard) FROM sharded_seq.counter_shards
            WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'c')),
          ARRAY[5120], 'a new counter''s row is node 5''s first: 5 * 1024');
-- rows of node 7, as replication would bring them
INSERT INTO sharded_seq.counter_shards
SELECT id, s, v FROM sharded_seq.counter_config, (VALUES (7168, 100), (7169, 20)) r(s, v) WHERE name = 'c';
SELECT is(counter_value('c'), 123::bigint, 'counter_value sums every node''s rows');
SELECT is(counter_incr('c', 1), 124::bigint, 'counter_incr returns the total over every node''s rows');
SELECT is((SELECT total FROM sharded_seq.counters WHERE name = 'c'), 124::bigint, '... and so does the counters view');
SELECT is((SELECT array_agg(shard || ':' || value ORDER BY shard) FROM sharded_seq.counter_shards
            WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'c')),
          ARRAY['5120:4', '7168:100', '7169:20'], 'a commit writes only node 5''s rows');
SELECT sharded_seq.alter_counter('c', shards => 3);
SELECT is((SELECT array_agg(shard || ':' || value ORDER BY shard) FROM sharded_seq.counter_shards
            WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'c')),
          ARRAY['5120:4', '5121:0', '5122:0', '7168:100', '7169:20'],
          'alter_counter lays out node 5''s rows and keeps node 7''s untouched');
SELECT is(counter_value('c'), 124::bigint, '... and the total');
-- a pinned counter: its fast read must not miss rows that other nodes add
SELECT sharded_seq.create_counter('p', shards => 2);
SELECT counter_incr('p', 5);
SELECT is(counter_value('p'), 5::bigint, 'a pinned counter, read once');
INSERT INTO sharded_seq.counter_shards
SELECT id, 7168, 40 FROM sharded_seq.counter_config WHERE name = 'p';
SELECT is(counter_value('p'), 45::bigint, '... sees a row another node added afterwards');
-- a counter created elsewhere (only node 7's row): the first commit here adds node 5's
INSERT INTO sharded_seq.counter_config (id, name, shards, mode, owner) VALUES (7 + 1024 * 900, 'from7', 2, 'exact', 'postgres');
INSERT INTO sharded_seq.counter_shards VALUES (7 + 1024 * 900, 7168, 9), (7 + 1024 * 900, 7169, 1);
SELECT counter_incr('from7', 2);
SELECT is((SELECT array_agg(shard ORDER BY shard) FROM sharded_seq.counter_shards WHERE counter_id = 7 + 1024 * 900),
          ARRAY[5120, 5121, 7168, 7169], 'a counter created on another node gets node 5''s rows at its first commit here');
SELECT is(counter_value('from7'), 12::bigint, '... and its total is exact');
-- maintain(): folds node 5's idle rows, never node 7's
SELECT sharded_seq.create_counter('a');
INSERT INTO sharded_seq.counter_shards
SELECT id, s, 1 FROM sharded_seq.counter_config, (VALUES (5121), (5122), (7168), (7169)) r(s) WHERE name = 'a';
SET sharded_seq.counter_fold_after = 1;
UPDATE sharded_seq.maintenance SET fold_at = now() - interval '1 hour';
SELECT sharded_seq.maintain();
SELECT pg_sleep(1.2);
SELECT sharded_seq.maintain();
SELECT is((SELECT array_agg(shard || ':' || value ORDER BY shard) FROM sharded_seq.counter_shards
            WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'a')),
          ARRAY['5120:2', '7168:1', '7169:1'], 'maintain() folds node 5''s idle rows and leaves node 7''s');
-- write-behind modes flush into node 5's rows
SELECT sharded_seq.create_counter('buf', mode => 'buffered');
SELECT sharded_seq.create_counter('mc', mode => 'memcached');
SELECT counter_incr('buf', 6), counter_incr('mc', 8);
SELECT sharded_seq.flush_counters();
SELECT is((SELECT array_agg(c.name || ':' || s.shard / 1024 || ':' || s.value ORDER BY c.name, s.shard)
             FROM sharded_seq.counter_shards s JOIN sharded_seq.counter_config c ON c.id = s.counter_id
            WHERE c.name IN ('buf', 'mc') AND s.value <> 0),
          ARRAY['buf:5:6', 'mc:5:8'], 'flushes of both write-behind modes land in node 5''s rows');
-- counter_incr does not create counters on a node
SELECT throws_ok($$SELECT counter_incr('nobody_made_me')$$, '42704',
                 'counter "nobody_made_me" does not exist', 'counter_incr refuses to create a counter on a node');
SELECT is((SELECT count(*) FROM sharded_seq.counter_config WHERE name = 'nobody_made_me'), 0::bigint, '... and creates nothing');

---------------------------------------------------------------------------
-- the claim: another system's claim of node 5 stops new sessions
---------------------------------------------------------------------------
SELECT is(ARRAY(SELECT t::text FROM sharded_seq.replicated_tables() t ORDER BY 1),
          ARRAY['sharded_seq.counter_config', 'sharded_seq.counter_shards', 'sharded_seq.node_claims'],
          'replicated_tables(): exactly the counters and the claims');
UPDATE sharded_seq.node_claims SET system_identifier = '4242', database = 'elsewhere' WHERE node_id = 5;
SELECT dblink_connect('b', :'conn');
SELECT matches(pg_temp.q('b', $$SELECT sharded_nextval('s')$$),
               '^ERROR 55000: sharded_seq.node_id 5 is claimed by system 4242, database "elsewhere", not by this one \(system '
               || (SELECT system_identifier FROM pg_control_system()) || ', database "' || current_database() || '"\)$',
               'a new session refuses sharded_nextval, naming both claims (55000)');
SELECT alike(pg_temp.q('b', $$SELECT counter_incr('c')$$), 'ERROR 55000: sharded_seq.node_id 5 is claimed by system 4242%',
            '... and counter_incr');
SELECT alike(pg_temp.q('b', $$SELECT sharded_seq.create_counter('c2')$$), 'ERROR 55000:%', '... and creating a counter');
SELECT alike(pg_temp.q('b', $$SELECT (sharded_seq.maintain()).folded$$), 'ERROR 55000:%', '... and maintain()');
SELECT is(pg_temp.q('b', $$SELECT counter_value('c')$$), '124', 'reads still work');
SELECT throws_like($$SELECT sharded_nextval('s')$$, '%claimed by system 4242%',
                   'a session that had checked its claim is refused too, once another system holds it');
-- the stale claim deleted: the refused session claims node 5 again at its next call
DELETE FROM sharded_seq.node_claims WHERE node_id = 5;
SELECT ok(pg_temp.q('b', $$SELECT sharded_nextval('s')$$)::bigint BETWEEN :lo AND :hi, 'once the stale claim is gone, the session draws');
SELECT is((SELECT system_identifier FROM sharded_seq.node_claims WHERE node_id = 5),
          (SELECT system_identifier::text FROM pg_control_system()), '... having claimed node 5 again');

---------------------------------------------------------------------------
-- changing node_id: new sessions take the new node's range
---------------------------------------------------------------------------
SELECT max(v) AS before_change FROM (SELECT v FROM drawn UNION ALL SELECT sharded_nextval('s')) d \gset
ALTER SYSTEM SET sharded_seq.node_id = 6;
SELECT pg_reload_conf();
SELECT pg_sleep(0.5);
SELECT dblink_connect('c', :'conn');
SELECT is(pg_temp.q('c', 'SELECT sharded_seq.node_id()'), '6', 'a session started after the reload is node 6');
SELECT ok(pg_temp.q('c', $$SELECT sharded_nextval('s')$$)::bigint BETWEEN :hi::bigint + 1 AND :hi::bigint + 9007199254740992,
          '... and draws from node 6''s range');
SELECT is((SELECT array_agg(node_id ORDER BY node_id) FROM sharded_seq.node_claims), ARRAY[5, 6],
          'node 6 is claimed too, and node 5''s claim stays this system''s');
SELECT is(sharded_seq.node_id(), 5, 'a session started before keeps node 5 ...');
SELECT ok(sharded_nextval('s') > :before_change, '... and its values keep increasing in node 5''s range');
SELECT is(pg_temp.q('a', 'SELECT sharded_seq.node_id()'), '5', '... as does every session started before the reload');
ALTER SYSTEM RESET sharded_seq.node_id;
SELECT pg_reload_conf();

SELECT * FROM finish();
