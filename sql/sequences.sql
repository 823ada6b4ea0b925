-- Sharded sequences, database tier: API, DEFAULT use, rollbacks, currval,
-- alter, advance and drop.
CREATE TEMP TABLE seen (n serial, v bigint);

SELECT sharded_seq.create_sequence('orders_id', shards => 4, block => 10);
SELECT name, shards, block, tier, generation, generation_start, reserved_high_water
  FROM sharded_seq.sequences;

-- currval before any nextval in this session is an error, like currval()
SELECT sharded_currval('orders_id');

-- values strictly increase within the session and stay inside one block
INSERT INTO seen (v) SELECT sharded_nextval('orders_id') FROM generate_series(1, 25);
-- (seen.n records the order in which the values were drawn)
SELECT count(*) = count(DISTINCT v) AS unique_values,
       bool_and(v > 0) AS positive
  FROM seen;
SELECT bool_and(d > 0) AS strictly_increasing_in_draw_order
  FROM (SELECT v - lag(v) OVER (ORDER BY n) AS d FROM seen) s WHERE d IS NOT NULL;
SELECT sharded_currval('orders_id') = (SELECT max(v) FROM seen) AS currval_is_last;

-- a rolled-back draw is never handed out again, and currval keeps it
BEGIN;
SELECT sharded_nextval('orders_id') AS rolled_back \gset
ROLLBACK;
SELECT sharded_currval('orders_id') = :rolled_back AS currval_survives_rollback;
CREATE TEMP TABLE after_rollback AS
  SELECT sharded_nextval('orders_id') AS v FROM generate_series(1, 30);
SELECT count(*) FILTER (WHERE v = :rolled_back) AS reissued,
       min(v) > :rolled_back AS later_values_above_rolled_back
  FROM after_rollback;
INSERT INTO seen (v) SELECT v FROM after_rollback;
INSERT INTO seen (v) VALUES (:rolled_back);

-- use as a column DEFAULT
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'), note text);
INSERT INTO orders (note) SELECT 'n' || g FROM generate_series(1, 100) g;
SELECT count(*), count(DISTINCT id) FROM orders;
SELECT count(*) AS overlap_with_earlier_draws FROM orders o JOIN seen s ON s.v = o.id;

-- the view reports what has been reserved
SELECT reserved_high_water >= (SELECT max(id) FROM orders) AS high_water_covers_values
  FROM sharded_seq.sequences WHERE name = 'orders_id';

-- alter: new layout starts above everything reserved so far; values keep increasing
SELECT max(id) AS before_alter FROM orders \gset
SELECT reserved_high_water AS hw_before FROM sharded_seq.sequences WHERE name = 'orders_id' \gset
SELECT sharded_seq.alter_sequence('orders_id', shards => 2, block => 50);
SELECT shards, block, generation, generation_start = :hw_before + 1 AS starts_above_reserved
  FROM sharded_seq.sequences WHERE name = 'orders_id';
SELECT sharded_nextval('orders_id') > :hw_before AS after_alter_above_reserved;
-- altering to the same layout changes nothing
SELECT sharded_seq.alter_sequence('orders_id', shards => 2);
SELECT generation FROM sharded_seq.sequences WHERE name = 'orders_id';
-- only the current generation's shards remain once nobody uses the old ones
SELECT count(*) AS shard_relations
  FROM pg_class WHERE relkind = 'S' AND relname LIKE 'seq\_%'
   AND relnamespace = 'sharded_seq'::regnamespace;

-- advance: every later value is greater than past; it never moves backwards
SELECT sharded_seq.advance_sequence('orders_id', 1000000);
SELECT sharded_nextval('orders_id') > 1000000 AS advanced;
SELECT sharded_seq.advance_sequence('orders_id', 5);
SELECT sharded_nextval('orders_id') > 1000000 AS never_backwards;

-- start and negative ranges
SELECT sharded_seq.create_sequence('from_minus', shards => 1, block => 3, start => -5);
SELECT sharded_nextval('from_minus') FROM generate_series(1, 7);

-- default shards and block come from the settings
SET sharded_seq.default_sequence_shards = 3;
SET sharded_seq.default_block = 7;
SELECT sharded_seq.create_sequence('defaults');
SELECT shards, block FROM sharded_seq.sequences WHERE name = 'defaults';
RESET sharded_seq.default_sequence_shards;
RESET sharded_seq.default_block;

-- drop: later calls fail, and the name can be reused
SELECT sharded_seq.drop_sequence('defaults');
SELECT sharded_nextval('defaults');
SELECT sharded_currval('defaults');
SELECT sharded_seq.create_sequence('defaults', shards => 1, block => 1);
SELECT sharded_currval('defaults');
SELECT sharded_nextval('defaults'), sharded_nextval('defaults');

-- a rolled-back create leaves nothing behind
BEGIN;
SELECT sharded_seq.create_sequence('ghost');
ROLLBACK;
SELECT count(*) FROM sharded_seq.sequences WHERE name = 'ghost';

-- a rolled-back alter leaves the old layout in force
SELECT generation AS gen_before FROM sharded_seq.sequences WHERE name = 'orders_id' \gset
BEGIN;
SELECT sharded_seq.alter_sequence('orders_id', shards => 8);
ROLLBACK;
SELECT generation = :gen_before AS unchanged, shards FROM sharded_seq.sequences WHERE name = 'orders_id';
SELECT sharded_nextval('orders_id') > 1000000 AS still_working;

-- exhaustion raises 2200H and never wraps
SELECT sharded_seq.create_sequence('tiny', shards => 1, block => 2, start => 9223372036854775805);
SELECT sharded_nextval('tiny');
SELECT sharded_nextval('tiny');
SELECT sharded_nextval('tiny');
SELECT sharded_nextval('tiny');
\set VERBOSITY sqlstate
SELECT sharded_nextval('tiny');
\set VERBOSITY default

-- read-only transactions are refused, like nextval()
BEGIN READ ONLY;
SELECT sharded_nextval('orders_id');
ROLLBACK;

DROP TABLE orders;
SELECT sharded_seq.drop_sequence(name) FROM sharded_seq.sequences ORDER BY name;
SELECT count(*) AS leftover_shards
  FROM pg_class WHERE relkind = 'S' AND relnamespace = 'sharded_seq'::regnamespace
   AND relname <> 'object_id_seq';
