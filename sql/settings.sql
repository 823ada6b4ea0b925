-- Settings live under the reserved sharded_seq. prefix.  They exist once the
-- library is loaded: by shared_preload_libraries, or by any first call.
-- scripts/test.sh runs this file both ways: the settings that size shared
-- memory (buffered_slots, node_cache_sequences, shared_totals) are context
-- postmaster when the library is preloaded (expected/settings_1.out), and
-- sighup when it loads later, where changing them does nothing.
LOAD 'sharded_seq';
SELECT name, setting, min_val, max_val, context, short_desc
  FROM pg_settings WHERE name LIKE 'sharded_seq.%' ORDER BY name;
-- the prefix is reserved: a misspelt setting is rejected
SET sharded_seq.no_such_setting = 1;
SET sharded_seq.default_block = 250;
SHOW sharded_seq.default_block;
RESET sharded_seq.default_block;
-- out-of-range values are refused by PostgreSQL's own range check (22023),
-- whose message names the range that pg_settings shows
SET sharded_seq.default_block = 0;
SET sharded_seq.default_counter_shards = 2000;
SET sharded_seq.default_sequence_shards = -1;
SET sharded_seq.default_lease_size = 100000001;
SHOW sharded_seq.default_sequence_shards;
-- the node id belongs to the server (postgresql.conf or ALTER SYSTEM, then a
-- reload); a session cannot set it, and node 0 is a single node
SET sharded_seq.node_id = 1;
SELECT sharded_seq.node_id();
SELECT * FROM sharded_seq.replicated_tables() ORDER BY 1::text;
