-- Every bad input gets an ERROR with the right SQLSTATE, a lower-case message
-- and a hint; nothing stored is lost.
CREATE FUNCTION pg_temp.err(cmd text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; hint text; detail text;
BEGIN
    EXECUTE cmd;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT, detail = PG_EXCEPTION_DETAIL;
    RETURN st || ' ' || msg
        || CASE WHEN msg ~ '^[a-z]' THEN '' ELSE ' [MESSAGE NOT LOWER-CASE]' END
        || CASE WHEN coalesce(hint, '') <> '' OR coalesce(detail, '') <> '' THEN ' [has hint]' ELSE ' [NO HINT]' END;
END $$;

SELECT sharded_seq.create_sequence('s', shards => 2, block => 5);
SELECT sharded_nextval('s') AS first \gset

-- names
SELECT pg_temp.err($$SELECT sharded_nextval(NULL)$$);
SELECT pg_temp.err($$SELECT sharded_currval(NULL)$$);
SELECT pg_temp.err($$SELECT sharded_nextval('')$$);
SELECT pg_temp.err($$SELECT sharded_nextval(repeat('x', 64))$$);
SELECT pg_temp.err($$SELECT sharded_nextval('missing')$$);
SELECT pg_temp.err($$SELECT sharded_currval('missing')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence(NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence(repeat('y', 100))$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('s')$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_sequence('missing', shards => 2)$$);
SELECT pg_temp.err($$SELECT sharded_seq.advance_sequence('missing', 5)$$);
SELECT pg_temp.err($$SELECT sharded_seq.drop_sequence('missing')$$);
SELECT pg_temp.err($$SELECT sharded_seq.drop_sequence(NULL)$$);

-- shards and block
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', shards => 0)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', shards => -3)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', shards => 100000)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', block => 0)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', block => -1)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', block => 2000000000)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_sequence('s', shards => 0)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_sequence('s', block => -5)$$);
-- a setting out of its range: PostgreSQL's own range check answers, with
-- the range in its message, and the extension adds its hint as the error is
-- reported (a PL/pgSQL handler, which catches it earlier, sees no hint)
SET sharded_seq.default_block = 0;
SET sharded_seq.default_sequence_shards = 5000;

-- tier, start, past
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', tier => 'redis')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', tier => NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_sequence('s', tier => 'disk')$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', start => NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.create_sequence('b', start => -9223372036854775808)$$);
SELECT pg_temp.err($$SELECT sharded_seq.advance_sequence('s', NULL)$$);
SELECT pg_temp.err($$SELECT sharded_seq.advance_sequence('s', 9223372036854775807)$$);
SELECT pg_temp.err($$SELECT sharded_seq.grant_sequence('s', 'no_such_role')$$);
SELECT pg_temp.err($$SELECT sharded_seq.grant_sequence('s', 'public', 'select')$$);
SELECT pg_temp.err($$SELECT sharded_seq.grant_sequence('s', NULL)$$);

-- none of the failures above created anything or lost anything
SELECT name, shards, block, generation FROM sharded_seq.sequences ORDER BY name;
SELECT sharded_nextval('s') > :first AS still_increasing;
SELECT sharded_seq.drop_sequence('s');
