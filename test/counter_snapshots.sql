-- counter_value follows the caller's snapshot exactly, even when the shard
-- layout changes under it: a REPEATABLE READ transaction keeps seeing the
-- total of its snapshot across a grow and a shrink made elsewhere.
BEGIN;
SELECT plan(9);
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE FUNCTION pg_temp.remote_value(conn text, cmd text) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE v bigint;
BEGIN
    SELECT x INTO v FROM dblink(conn, cmd) AS t(x bigint);
    RETURN v;
END $fn$;
SELECT format('host=127.0.0.1 port=%s dbname=%s user=%s',
              current_setting('port'), current_database(), current_user) AS conn \gset
SELECT dblink_connect('rr', :'conn');
SELECT dblink_connect('w', :'conn');

SELECT pg_temp.remote_value('w', $$SELECT count(*) FROM (SELECT sharded_seq.create_counter('snap', shards => 4)) s$$);
-- one in every shard, so that no single shard holds the total
SELECT dblink_exec('w', $$UPDATE sharded_seq.counter_shards SET value = 1
                          WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'snap')$$);
-- (the writes below: +5, a grow to 8 shards, +7, a shrink to 1)
-- the reader's fast path learns where the rows are
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 4::bigint, 'the reader sees 4');

SELECT dblink_exec('rr', 'BEGIN ISOLATION LEVEL REPEATABLE READ');
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 4::bigint, 'a repeatable-read snapshot is taken at 4');

SELECT pg_temp.remote_value('w', $$SELECT counter_incr('snap', 5)$$);
SELECT pg_temp.remote_value('w', $$SELECT count(*) FROM (SELECT sharded_seq.alter_counter('snap', shards => 8)) s$$);
SELECT pg_temp.remote_value('w', $$SELECT counter_incr('snap', 7)$$);
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 4::bigint,
          'after increments and a grow elsewhere, the snapshot still sees 4');
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 4::bigint,
          '... and again, when it knows where the rows are');

SELECT pg_temp.remote_value('w', $$SELECT count(*) FROM (SELECT sharded_seq.alter_counter('snap', shards => 1)) s$$);
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 4::bigint,
          'after a shrink elsewhere, the snapshot still sees 4');
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 4::bigint,
          '... and again, when it knows where the rows are');
SELECT dblink_exec('rr', 'COMMIT');
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 16::bigint, 'a new snapshot sees 16');
SELECT is(counter_value('snap'), 16::bigint, 'so does this session');
SELECT is(pg_temp.remote_value('rr', $$SELECT counter_value('snap')$$), 16::bigint, '... and the reader again');

SELECT pg_temp.remote_value('w', $$SELECT count(*) FROM (SELECT sharded_seq.drop_counter('snap')) s$$);
SELECT dblink_disconnect('rr');
SELECT dblink_disconnect('w');
SELECT * FROM finish();
ROLLBACK;
