-- sharded_seq.set_counter in one session (issue 22, part 4): the total at
-- commit, this transaction's own increments (those before the call are
-- absorbed, those after count on top), rollback, savepoints, PREPARE, the
-- errors (SQLSTATE, lower-case message, a hint).  Concurrent increments are
-- t/set_counter.pl's.
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

-- each layout and mode this server has ('buffered' needs preloading)
SELECT sharded_seq.create_counter('s1');
SELECT sharded_seq.create_counter('s4', shards => 4);
SELECT sharded_seq.create_counter('sm', mode => 'memcached');
SELECT counter_incr(c, 40) FROM unnest(ARRAY['s1', 's4', 'sm']) c;

-- set in a transaction of its own: the total, whatever was there
SELECT sharded_seq.set_counter(c, 1000) FROM unnest(ARRAY['s1', 's4']) c;
-- a 'memcached' counter while no memcached server is set: refused, and so is
-- leaving the mode; amounts memcached may hold would count on top later
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('sm', 1000)$$);
SELECT pg_temp.err($$SELECT sharded_seq.alter_counter('sm', mode => 'exact')$$);
SELECT c, counter_value(c) FROM unnest(ARRAY['s1', 's4', 'sm']) c;
-- all of it in one row, the others 0 (the layout is kept)
SELECT c.name, count(*), sum(s.value), count(*) FILTER (WHERE s.value <> 0) AS nonzero
  FROM sharded_seq.counter_shards s JOIN sharded_seq.counter_config c ON c.id = s.counter_id
 WHERE c.name IN ('s1', 's4', 'sm') GROUP BY 1 ORDER BY 1;
-- negative totals and the bigint ends are totals too
SELECT sharded_seq.set_counter('s1', -5);
SELECT counter_value('s1');
SELECT sharded_seq.set_counter('s1', 9223372036854775807);
SELECT counter_value('s1');
SELECT sharded_seq.set_counter('s1', -9223372036854775808);
SELECT counter_value('s1');
SELECT sharded_seq.set_counter('s1', 0);
SELECT counter_value('s1');

-- this transaction's increments: before the call absorbed, after it on top
BEGIN;
SELECT counter_incr('s4', 7);
SELECT sharded_seq.set_counter('s4', 100);
SELECT counter_value('s4');
SELECT counter_incr('s4', 5);
COMMIT;
SELECT counter_value('s4');

-- twice in one transaction: the last one counts
BEGIN;
SELECT sharded_seq.set_counter('s4', 1);
SELECT counter_incr('s4', 2);
SELECT sharded_seq.set_counter('s4', 50);
SELECT counter_incr('s4', 3);
COMMIT;
SELECT counter_value('s4');

-- rolled back: nothing changes
BEGIN;
SELECT sharded_seq.set_counter('s4', 999);
SELECT counter_value('s4');
ROLLBACK;
SELECT counter_value('s4');

-- a rolled-back savepoint takes the set back, and keeps the increments
-- made before it
BEGIN;
SELECT counter_incr('s4', 10);
SAVEPOINT a;
SELECT sharded_seq.set_counter('s4', 500);
SELECT counter_incr('s4', 1);
ROLLBACK TO SAVEPOINT a;
SELECT counter_value('s4');
COMMIT;
SELECT counter_value('s4');

-- a released savepoint keeps the set
BEGIN;
SAVEPOINT a;
SELECT sharded_seq.set_counter('s4', 600);
RELEASE SAVEPOINT a;
SELECT counter_incr('s4', 1);
COMMIT;
SELECT counter_value('s4');

-- an increment rolled back to a savepoint after the set never counts
BEGIN;
SELECT sharded_seq.set_counter('s4', 700);
SAVEPOINT b;
SELECT counter_incr('s4', 40);
ROLLBACK TO SAVEPOINT b;
COMMIT;
SELECT counter_value('s4');

-- a counter created in the same transaction
BEGIN;
SELECT counter_incr('fresh', 3);
SELECT sharded_seq.set_counter('fresh', 30);
COMMIT;
SELECT counter_value('fresh');

-- PREPARE TRANSACTION is refused (and the transaction rolled back)
BEGIN;
SELECT sharded_seq.set_counter('s1', 12345);
PREPARE TRANSACTION 'set_counter';
SELECT counter_value('s1');

-- errors
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('missing', 1)$$);
SELECT pg_temp.err($$SELECT sharded_seq.set_counter(NULL, 1)$$);
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('', 1)$$);
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('s1', NULL)$$);
-- out of range only with this transaction's increments, which it absorbs
BEGIN;
SELECT counter_incr('s1', -1);
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('s1', 9223372036854775807)$$);
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('s1', 1)$$);
ROLLBACK;
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT sharded_seq.set_counter('s1', 1)$$);
ROLLBACK;
SELECT counter_value('s1');

SELECT sharded_seq.drop_counter(c) FROM unnest(ARRAY['s1', 's4', 'sm', 'fresh']) c;
