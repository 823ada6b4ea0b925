-- Exact counters: API, transactional totals, online shard changes.
SELECT sharded_seq.create_counter('page:1:views', shards => 4);
SELECT name, shards, mode, total, pending FROM sharded_seq.counters;

SELECT counter_incr('page:1:views');
SELECT counter_incr('page:1:views', 10);
SELECT counter_incr('page:1:views', -3);
SELECT counter_incr('page:1:views', 0);
SELECT counter_value('page:1:views');

-- transactional: a rollback takes the increments back
BEGIN;
SELECT counter_incr('page:1:views', 100);
SELECT counter_value('page:1:views');
ROLLBACK;
SELECT counter_value('page:1:views');

-- savepoints too
BEGIN;
SELECT counter_incr('page:1:views', 5);
SAVEPOINT sp;
SELECT counter_incr('page:1:views', 1000);
ROLLBACK TO sp;
SELECT counter_incr('page:1:views', 1);
COMMIT;
SELECT counter_value('page:1:views');

-- many increments in one statement and from a trigger
SELECT count(counter_incr('page:1:views')) FROM generate_series(1, 500);
SELECT counter_value('page:1:views');
CREATE TABLE comments (id int, body text);
CREATE FUNCTION count_comment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM counter_incr('comments:total');
    RETURN NEW;
END $$;
CREATE TRIGGER comments_count AFTER INSERT ON comments FOR EACH ROW EXECUTE FUNCTION count_comment();
INSERT INTO comments SELECT g, 'c' FROM generate_series(1, 42) g;
SELECT counter_value('comments:total');

-- an unknown name is created with the default shard count on first increment
SET sharded_seq.default_counter_shards = 3;
SELECT counter_incr('auto:new', 7);
SELECT name, shards, mode, total FROM sharded_seq.counters WHERE name = 'auto:new';
RESET sharded_seq.default_counter_shards;
-- ... but not by a rolled-back increment
BEGIN;
SELECT counter_incr('auto:ghost');
ROLLBACK;
SELECT count(*) FROM sharded_seq.counters WHERE name = 'auto:ghost';

-- grow and shrink online, keeping the total
SELECT sharded_seq.alter_counter('page:1:views', shards => 16);
SELECT shards, total FROM sharded_seq.counters WHERE name = 'page:1:views';
SELECT count(counter_incr('page:1:views')) FROM generate_series(1, 50);
SELECT sharded_seq.alter_counter('page:1:views', shards => 1);
SELECT shards, total FROM sharded_seq.counters WHERE name = 'page:1:views';
SELECT counter_value('page:1:views');
SELECT counter_incr('page:1:views');
SELECT sharded_seq.alter_counter('page:1:views', shards => 5, mode => 'exact');
SELECT shards, total FROM sharded_seq.counters WHERE name = 'page:1:views';

-- a rolled-back shrink keeps the layout and the total
BEGIN;
SELECT sharded_seq.alter_counter('page:1:views', shards => 2);
ROLLBACK;
SELECT shards, total FROM sharded_seq.counters WHERE name = 'page:1:views';

-- totals beyond one shard's reach are fine while each shard fits
SELECT sharded_seq.create_counter('big', shards => 2);
SELECT counter_incr('big', 9223372036854775807);
SELECT counter_incr('big', -9223372036854775807);
SELECT counter_incr('big', -10);
SELECT counter_value('big');

-- read-only transactions can read but not increment
BEGIN READ ONLY;
SELECT counter_value('page:1:views');
SELECT counter_incr('page:1:views');
ROLLBACK;

-- shard rows take HOT updates (value is not indexed).  Options in name
-- order: installs run 1.0's script and the update chain, which appends the
-- fillfactor that 1.2 changed.
SELECT array(SELECT o FROM unnest(reloptions) o ORDER BY o COLLATE "C") AS reloptions
  FROM pg_class WHERE oid = 'sharded_seq.counter_shards'::regclass;

-- drop
SELECT sharded_seq.drop_counter('big');
SELECT counter_value('big');
SELECT count(*) FROM sharded_seq.counter_shards s
  WHERE NOT EXISTS (SELECT 1 FROM sharded_seq.counter_config c WHERE c.id = s.counter_id);
DROP TABLE comments;
DROP FUNCTION count_comment();
SELECT sharded_seq.drop_counter(name) FROM sharded_seq.counters ORDER BY name;

-- adaptive counters: one row until commits find every row busy
SELECT counter_incr('adaptive:1');
SELECT name, shards, adaptive, total FROM sharded_seq.counters WHERE name = 'adaptive:1';
SELECT sharded_seq.create_counter('adaptive:2');
SELECT sharded_seq.alter_counter('adaptive:2', shards => 3);
SELECT counter_incr('adaptive:2', 5);
SELECT name, shards, adaptive, total FROM sharded_seq.counters WHERE name = 'adaptive:2';
-- back to adaptive keeps the rows (maintain() folds them when idle) ...
SELECT sharded_seq.alter_counter('adaptive:2', adaptive => true);
SELECT name, shards, adaptive, total FROM sharded_seq.counters WHERE name = 'adaptive:2';
-- ... and pinning keeps as many as it has
SELECT sharded_seq.alter_counter('adaptive:2', adaptive => false);
SELECT name, shards, adaptive, total FROM sharded_seq.counters WHERE name = 'adaptive:2';
SELECT shard, value FROM sharded_seq.counter_shards s JOIN sharded_seq.counter_config c ON c.id = s.counter_id
 WHERE c.name = 'adaptive:2' ORDER BY shard;
-- a pinned default still exists for those who want it
SET sharded_seq.default_counter_shards = 2;
SELECT counter_incr('adaptive:3');
SELECT name, shards, adaptive FROM sharded_seq.counters WHERE name = 'adaptive:3';
RESET sharded_seq.default_counter_shards;
-- maintain() changes no total
CREATE TEMP TABLE before AS SELECT name, total FROM sharded_seq.counters;
SELECT folded, compacted FROM sharded_seq.maintain();
SELECT count(*) AS changed FROM sharded_seq.counters c JOIN before b USING (name) WHERE c.total IS DISTINCT FROM b.total;

-- a counter that counter_incr created in a rolled-back transaction is gone,
-- and the next increment in this session creates it again
BEGIN;
SELECT counter_incr('rolled:back', 5);
ROLLBACK;
SELECT counter_incr('rolled:back', 2);
SELECT counter_value('rolled:back');
BEGIN;
SAVEPOINT s;
SELECT counter_incr('rolled:back2', 5);
ROLLBACK TO s;
SELECT counter_incr('rolled:back2', 3);
COMMIT;
SELECT counter_value('rolled:back2');
