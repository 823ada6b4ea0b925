-- E3: privileges work the PostgreSQL way.
BEGIN;
SELECT plan(51);

CREATE ROLE ss_owner;
CREATE ROLE ss_app;
CREATE ROLE ss_reader;
CREATE ROLE ss_stranger;
CREATE ROLE ss_both;

SET ROLE ss_owner;
SELECT sharded_seq.create_sequence('priv_seq', shards => 2, block => 10);
SELECT sharded_seq.create_counter('priv_ctr', shards => 2);
SELECT lives_ok($$SELECT sharded_nextval('priv_seq')$$, 'the owner can draw');
SELECT lives_ok($$SELECT counter_incr('priv_ctr')$$, 'the owner can increment');
RESET ROLE;

SELECT relid::text AS shard_rel FROM sharded_seq.sequence_shards LIMIT 1 \gset
SELECT id AS priv_ctr_id FROM sharded_seq.counter_config WHERE name = 'priv_ctr' \gset
SELECT id AS priv_seq_id FROM sharded_seq.sequence_config WHERE name = 'priv_seq' \gset
SET ROLE ss_owner;
SELECT isnt((SELECT reserved_high_water FROM sharded_seq.sequences WHERE name = 'priv_seq'), NULL,
            'the sequences view shows the owner its sequence''s positions');
SELECT isnt((SELECT total FROM sharded_seq.counters WHERE name = 'priv_ctr'), NULL,
            'the counters view shows the owner its counter''s total');
RESET ROLE;

SET ROLE ss_stranger;
SELECT throws_ok($$SELECT sharded_nextval('priv_seq')$$, '42501', NULL, 'a role without a grant cannot draw');
SELECT throws_ok($$SELECT sharded_currval('priv_seq')$$, '42501', NULL, '... nor read currval');
SELECT throws_ok($$SELECT sharded_seq.alter_sequence('priv_seq', shards => 3)$$, '42501', NULL, '... nor alter');
SELECT throws_ok($$SELECT sharded_seq.advance_sequence('priv_seq', 100)$$, '42501', NULL, '... nor advance');
SELECT throws_ok($$SELECT sharded_seq.drop_sequence('priv_seq')$$, '42501', NULL, '... nor drop');
SELECT throws_ok($$SELECT sharded_seq.grant_sequence('priv_seq', 'ss_stranger')$$, '42501', NULL, '... nor grant itself');
SELECT throws_ok($$SELECT counter_incr('priv_ctr')$$, '42501', NULL, 'a role without a grant cannot increment');
SELECT throws_ok($$SELECT counter_value('priv_ctr')$$, '42501', NULL, '... nor read a counter');
SELECT throws_ok($$SELECT sharded_seq.alter_counter('priv_ctr', shards => 5)$$, '42501', NULL, '... nor alter it');
SELECT throws_ok($$SELECT sharded_seq.drop_counter('priv_ctr')$$, '42501', NULL, '... nor drop it');
SELECT throws_ok($$SELECT sharded_seq.set_counter('priv_ctr', 0)$$, '42501', NULL, '... nor set it');
SELECT throws_ok($$UPDATE sharded_seq.sequence_config SET base = 0$$, '42501', NULL, 'the config tables cannot be written directly');
SELECT throws_ok($$UPDATE sharded_seq.counter_shards SET value = 0$$, '42501', NULL, 'counter shard rows cannot be written directly');
SELECT throws_ok(format('SELECT pg_catalog.setval(%L, 0)', :'shard_rel'), '42501', NULL, 'shard sequences cannot be reset directly');
SELECT throws_ok(format('SELECT pg_catalog.nextval(%L)', :'shard_rel'), '42501', NULL, 'shard sequences cannot be drawn from directly');
SELECT lives_ok($$SELECT count(*) FROM sharded_seq.sequences$$, 'anyone can list sequences');
SELECT is((SELECT total FROM sharded_seq.counters WHERE name = 'priv_ctr'), NULL,
          'the counters view lists a counter, but not its total, to a role that may not read it');
SELECT is(sharded_seq.counter_total(:priv_ctr_id), NULL, '... nor does the function behind it');
-- like pg_sequences' last_value: positions only to who may use the sequence
SELECT is((SELECT reserved_high_water FROM sharded_seq.sequences WHERE name = 'priv_seq'), NULL,
          'the sequences view lists a sequence, but not its reserved_high_water, to a role without usage');
SELECT is((SELECT generation_start FROM sharded_seq.sequences WHERE name = 'priv_seq'), NULL,
          '... nor its generation_start');
SELECT is(sharded_seq.sequence_high_water(:priv_seq_id), NULL, '... nor does the function behind them');
RESET ROLE;

SET ROLE ss_owner;
SELECT sharded_seq.grant_sequence('priv_seq', 'ss_app');
SELECT sharded_seq.grant_counter('priv_ctr', 'ss_app', 'update');
SELECT sharded_seq.grant_counter('priv_ctr', 'ss_reader', 'select');
RESET ROLE;

SET ROLE ss_app;
SELECT lives_ok($$SELECT sharded_nextval('priv_seq')$$, 'a granted role can draw');
SELECT lives_ok($$SELECT sharded_currval('priv_seq')$$, '... and read currval');
SELECT throws_ok($$SELECT sharded_seq.alter_sequence('priv_seq', shards => 3)$$, '42501', NULL, '... but usage does not allow alter');
SELECT isnt((SELECT reserved_high_water FROM sharded_seq.sequences WHERE name = 'priv_seq'), NULL,
            'usage shows a sequence''s reserved_high_water in the view');
SELECT isnt((SELECT generation_start FROM sharded_seq.sequences WHERE name = 'priv_seq'), NULL,
            '... and its generation_start');
SELECT lives_ok($$SELECT counter_incr('priv_ctr', 5)$$, 'update on a counter allows counter_incr');
SELECT throws_ok($$SELECT counter_value('priv_ctr')$$, '42501', NULL, '... but not counter_value');
RESET ROLE;

SET ROLE ss_reader;
SELECT is(counter_value('priv_ctr'), 6::bigint, 'select on a counter allows counter_value');
SELECT is((SELECT reserved_high_water FROM sharded_seq.sequences WHERE name = 'priv_seq'), NULL,
          'a grant on a counter shows no sequence''s positions');
SELECT throws_ok($$SELECT counter_incr('priv_ctr')$$, '42501', NULL, '... but not counter_incr');
RESET ROLE;

-- set_counter: the owner, or a role with both update (it overwrites) and
-- select (it fixes the total the next read shows)
SET ROLE ss_app;
SELECT throws_ok($$SELECT sharded_seq.set_counter('priv_ctr', 0)$$, '42501',
                 'permission denied for counter "priv_ctr"', 'update alone does not allow set_counter');
RESET ROLE;
SET ROLE ss_reader;
SELECT throws_ok($$SELECT sharded_seq.set_counter('priv_ctr', 0)$$, '42501', NULL, '... nor does select alone');
RESET ROLE;
SET ROLE ss_owner;
SELECT sharded_seq.grant_counter('priv_ctr', 'ss_both', 'all');
SELECT lives_ok($$SELECT sharded_seq.set_counter('priv_ctr', 100)$$, 'the owner can set its counter');
RESET ROLE;
SET ROLE ss_both;
SELECT lives_ok($$SELECT sharded_seq.set_counter('priv_ctr', 6)$$, 'update and select together allow set_counter');
SELECT is(counter_value('priv_ctr'), 6::bigint, '... which sets the total');
RESET ROLE;

SET ROLE ss_owner;
SELECT sharded_seq.revoke_sequence('priv_seq', 'ss_app');
RESET ROLE;
SET ROLE ss_app;
SELECT throws_ok($$SELECT sharded_nextval('priv_seq')$$, '42501', NULL, 'a revoke takes effect at once');
RESET ROLE;

SET ROLE ss_owner;
SELECT sharded_seq.grant_sequence('priv_seq', 'public');
RESET ROLE;
SET ROLE ss_stranger;
SELECT lives_ok($$SELECT sharded_nextval('priv_seq')$$, 'a grant to public reaches every role');
RESET ROLE;

GRANT ss_owner TO ss_app;
SET ROLE ss_app;
SELECT lives_ok($$SELECT sharded_seq.alter_sequence('priv_seq', shards => 3)$$, 'members of the owning role may alter');
RESET ROLE;

SELECT is((SELECT acl::text FROM sharded_seq.sequences WHERE name = 'priv_seq'),
          '{ss_owner=rwU/ss_owner,=U/ss_owner}', 'the grants show in the view as an aclitem[]');
SELECT is((SELECT owner::text FROM sharded_seq.counters WHERE name = 'priv_ctr'),
          'ss_owner', 'the creator owns the counter');

-- counter_incr on an unknown name makes the caller its owner
SET ROLE ss_stranger;
SELECT lives_ok($$SELECT counter_incr('stranger_ctr')$$, 'any role may create a counter by incrementing it');
RESET ROLE;
SELECT is((SELECT owner::text FROM sharded_seq.counters WHERE name = 'stranger_ctr'), 'ss_stranger', '... and owns it');

-- no SQL is built from names: hostile names are just names
SELECT lives_ok($$SELECT sharded_seq.create_sequence('x''); DROP TABLE sharded_seq.sequence_config; --')$$,
                'a name with quotes is stored as given');
SELECT ok(sharded_nextval('x''); DROP TABLE sharded_seq.sequence_config; --') IS NOT NULL, '... and drawn from as given');
SELECT has_table('sharded_seq', 'sequence_config', '... and nothing was executed');

SELECT is((SELECT count(*) FROM pg_proc p
             JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
             JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'sharded_seq'
            WHERE p.prosecdef AND NOT coalesce(array_to_string(p.proconfig, ',') LIKE '%search_path=%', false)),
          0::bigint, 'no SECURITY DEFINER function leaves search_path open');

SELECT * FROM finish();
ROLLBACK;
