-- S1, S2, S3 and E1 at transaction boundaries: draws and every
-- administrative call on sequences crossed with ROLLBACK, ROLLBACK TO
-- SAVEPOINT, PREPARE TRANSACTION with COMMIT or ROLLBACK PREPARED, an error
-- after the call, concurrent DDL and SERIALIZABLE.  Every value any session
-- draws goes into seen, which must hold no duplicate.
BEGIN;
SELECT plan(32);
\ir boundaries_setup.psql

SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tb', shards => 2, block => 10)$$);

------------------------------------------------------------------------------
-- sequences: a layout change that does not commit
------------------------------------------------------------------------------
SELECT pg_temp.draw('a', 'tb', 3, 'start');

-- ROLLBACK of alter_sequence after drawing from the new layout
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.alter_sequence('tb', block => 5)$$);
SELECT pg_temp.draw('a', 'tb', 7, 'in rolled-back alter');
SELECT dblink_exec('a', 'ROLLBACK');
SELECT pg_temp.draw('a', 'tb', 25, 'after rolled-back alter');
SELECT pg_temp.draw('b', 'tb', 25, 'after rolled-back alter');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK of alter_sequence: no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and the altering session''s values keep increasing');
SELECT is(pg_temp.q('b', $$SELECT block FROM sharded_seq.sequences WHERE name = 'tb'$$), '10', '... and the old layout is in force');

-- ROLLBACK of advance_sequence
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.advance_sequence('tb', 1000000)$$);
SELECT ok((pg_temp.draw('a', 'tb', 4, 'in rolled-back advance'))[1] > 1000000, 'an advance takes effect inside its own transaction');
SELECT dblink_exec('a', 'ROLLBACK');
SELECT pg_temp.draw('a', 'tb', 15, 'after rolled-back advance');
SELECT pg_temp.draw('b', 'tb', 15, 'after rolled-back advance');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK of advance_sequence: no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and values keep increasing');

-- ROLLBACK TO SAVEPOINT, two changes in one transaction, then COMMIT
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.draw('a', 'tb', 2, 'before savepoint');
SELECT dblink_exec('a', 'SAVEPOINT s1');
SELECT pg_temp.x('a', $$SELECT sharded_seq.alter_sequence('tb', shards => 3)$$);
SELECT pg_temp.draw('a', 'tb', 4, 'in savepoint, first alter');
SELECT pg_temp.x('a', $$SELECT sharded_seq.alter_sequence('tb', block => 7)$$);
SELECT pg_temp.draw('a', 'tb', 9, 'in savepoint, second alter');
SELECT dblink_exec('a', 'ROLLBACK TO SAVEPOINT s1');
SELECT pg_temp.draw('a', 'tb', 12, 'after ROLLBACK TO');
SELECT dblink_exec('a', 'COMMIT');
SELECT pg_temp.draw('b', 'tb', 30, 'after ROLLBACK TO');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK TO SAVEPOINT of two alters: no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and values keep increasing');
SELECT is(pg_temp.q('b', $$SELECT shards FROM sharded_seq.sequences WHERE name = 'tb'$$), '2', '... and the layout from before the savepoint is in force');

-- an error after the call aborts the transaction
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.alter_sequence('tb', shards => 4, block => 3)$$);
SELECT pg_temp.draw('a', 'tb', 5, 'before the error');
SELECT is(pg_temp.state('a', 'SELECT 1/0'), '22012', 'an error after the call');
SELECT dblink_exec('a', 'ROLLBACK');
SELECT pg_temp.draw('a', 'tb', 10, 'after the error');
SELECT pg_temp.draw('b', 'tb', 10, 'after the error');
SELECT ok(pg_temp.no_duplicates(), 'an error after alter_sequence: no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and values keep increasing');

-- PREPARE TRANSACTION, then ROLLBACK PREPARED from another session
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.alter_sequence('tb', shards => 3, block => 4)$$);
SELECT pg_temp.draw('a', 'tb', 6, 'in prepared alter');
SELECT dblink_exec('a', $$PREPARE TRANSACTION 'tb_alter_1'$$);
SELECT dblink_exec('c', $$ROLLBACK PREPARED 'tb_alter_1'$$);
SELECT pg_temp.draw('a', 'tb', 10, 'after ROLLBACK PREPARED');
SELECT pg_temp.draw('b', 'tb', 10, 'after ROLLBACK PREPARED');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK PREPARED of alter_sequence: no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and values keep increasing');
SELECT is(pg_temp.q('b', $$SELECT shards FROM sharded_seq.sequences WHERE name = 'tb'$$), '2', '... and the old layout is in force');

-- PREPARE TRANSACTION, then COMMIT PREPARED
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.advance_sequence('tb', 2000000)$$);
SELECT pg_temp.draw('a', 'tb', 3, 'in prepared advance');
SELECT dblink_exec('a', $$PREPARE TRANSACTION 'tb_adv_1'$$);
SELECT dblink_exec('c', $$COMMIT PREPARED 'tb_adv_1'$$);
SELECT pg_temp.draw('a', 'tb', 10, 'after COMMIT PREPARED');
SELECT ok((pg_temp.draw('b', 'tb', 10, 'after COMMIT PREPARED'))[1] > 2000000, 'COMMIT PREPARED of advance_sequence takes effect everywhere');
SELECT ok(pg_temp.no_duplicates(), '... no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and values keep increasing');

-- SERIALIZABLE: the same, under the strictest isolation
SELECT dblink_exec('a', 'BEGIN ISOLATION LEVEL SERIALIZABLE');
SELECT pg_temp.x('a', $$SELECT sharded_seq.alter_sequence('tb', block => 6)$$);
SELECT pg_temp.draw('a', 'tb', 8, 'serializable alter');
SELECT dblink_exec('a', 'ROLLBACK');
SELECT dblink_exec('a', 'BEGIN ISOLATION LEVEL SERIALIZABLE');
SELECT pg_temp.draw('a', 'tb', 8, 'serializable draw');
SELECT pg_temp.draw('b', 'tb', 8, 'serializable draw');
SELECT dblink_exec('a', 'COMMIT');
SELECT ok(pg_temp.no_duplicates(), 'SERIALIZABLE: no value is handed out twice');
SELECT ok(pg_temp.session_increasing('a'), '... and values keep increasing');

-- draws are not transactional: a rolled-back draw is never handed out again
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.draw('a', 'tb', 5, 'rolled-back draw');
SELECT dblink_exec('a', 'ROLLBACK');
SELECT pg_temp.draw('b', 'tb', 40, 'after a rolled-back draw');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK of a draw gives nothing back');

------------------------------------------------------------------------------
-- sequences: administrative calls that do not commit
------------------------------------------------------------------------------
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tb_new')$$);
SELECT dblink_exec('a', 'ROLLBACK');
SELECT is(pg_temp.q('b', $$SELECT count(*) FROM sharded_seq.sequences WHERE name = 'tb_new'$$), '0', 'ROLLBACK of create_sequence leaves nothing');
SELECT is(pg_temp.state('b', $$SELECT sharded_nextval('tb_new')$$), '42704', '... and the name cannot be drawn from');

SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.drop_sequence('tb')$$);
SELECT dblink_exec('a', 'ROLLBACK');
SELECT pg_temp.draw('a', 'tb', 10, 'after rolled-back drop');
SELECT pg_temp.draw('b', 'tb', 10, 'after rolled-back drop');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK of drop_sequence: the sequence goes on, no value twice');

SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.drop_sequence('tb')$$);
SELECT dblink_exec('a', $$PREPARE TRANSACTION 'tb_drop_1'$$);
SELECT dblink_exec('c', $$ROLLBACK PREPARED 'tb_drop_1'$$);
SELECT pg_temp.draw('b', 'tb', 10, 'after rolled-back prepared drop');
SELECT ok(pg_temp.no_duplicates(), 'ROLLBACK PREPARED of drop_sequence: the sequence goes on, no value twice');

SELECT pg_temp.create_role('tb_role');
SELECT dblink_exec('a', 'BEGIN');
SELECT pg_temp.x('a', $$SELECT sharded_seq.grant_sequence('tb', 'tb_role')$$);
SELECT dblink_exec('a', 'ROLLBACK');
SELECT is(pg_temp.q('b', $$SELECT acl::text FROM sharded_seq.sequences WHERE name = 'tb'$$), NULL, 'ROLLBACK of grant_sequence grants nothing');

------------------------------------------------------------------------------
-- sequences: concurrent DDL
------------------------------------------------------------------------------
-- a session that holds a block sees a drop at once
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tb_gone', block => 100)$$);
SELECT pg_temp.draw('b', 'tb_gone', 1, 'before drop');
SELECT pg_temp.x('a', $$SELECT sharded_seq.drop_sequence('tb_gone')$$);
SELECT is(pg_temp.state('b', $$SELECT sharded_nextval('tb_gone')$$), '42704', 'a dropped sequence cannot be drawn from, even with a block in hand');
SELECT is(pg_temp.state('b', $$SELECT sharded_nextval('tb_gone')$$), '42704', '... not on a second try either');

-- damaged state is an error, never a crash
SELECT pg_temp.x('a', $$SELECT sharded_seq.create_sequence('tb_damaged')$$);
SELECT dblink_exec('a', $$DELETE FROM sharded_seq.sequence_shards WHERE seq_id = (SELECT id FROM sharded_seq.sequence_config WHERE name = 'tb_damaged')$$);
SELECT is(pg_temp.state('b', $$SELECT sharded_nextval('tb_damaged')$$), 'XX001', 'a sequence whose shard rows are missing gives an error, not a crash');
SELECT is(pg_temp.q('b', 'SELECT 1'), '1', '... and the session lives on');

------------------------------------------------------------------------------
-- privileges follow role membership at once
------------------------------------------------------------------------------
CREATE FUNCTION pg_temp.as_role(conn text, role text, cmd text) RETURNS text LANGUAGE sql AS $$
    SELECT pg_temp.state(conn, format('SET ROLE %I; %s; RESET ROLE', role, cmd))
$$;
SELECT pg_temp.create_role('tb_owner'), pg_temp.create_role('tb_member');
SELECT dblink_exec('a', 'GRANT tb_owner TO tb_member');
SELECT dblink_exec('a', $$SET ROLE tb_owner; SELECT sharded_seq.create_sequence('tb_owned'); RESET ROLE$$);
SELECT is(pg_temp.as_role('b', 'tb_member', $$SELECT sharded_nextval('tb_owned')$$), '00000', 'a member of the owning role can draw');
SELECT dblink_exec('b', 'RESET ROLE');
SELECT dblink_exec('a', 'REVOKE tb_owner FROM tb_member');
SELECT is(pg_temp.as_role('b', 'tb_member', $$SELECT sharded_nextval('tb_owned')$$), '42501', '... and cannot once the membership is revoked');
SELECT dblink_exec('b', 'RESET ROLE');

SELECT dblink_disconnect('a');
SELECT dblink_disconnect('b');
SELECT dblink_disconnect('c');
SELECT * FROM finish();
ROLLBACK;
