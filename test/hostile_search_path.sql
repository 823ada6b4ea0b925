-- E3: a role that owns a schema puts operators of its own on search_path and
-- calls every entry point.  None of them may run with anyone else's rights.
-- Each trap function logs who ran it and, if that role is a superuser,
-- makes its owner a superuser too (the 1.0 escalation).
BEGIN;
SELECT plan(9);

CREATE ROLE ss_mallory;
CREATE ROLE ss_victim;
CREATE SCHEMA evil AUTHORIZATION ss_mallory;
GRANT USAGE ON SCHEMA evil TO PUBLIC;

SET ROLE ss_victim;
SELECT sharded_seq.create_sequence('victim_seq', shards => 2, block => 10);
SELECT sharded_seq.create_counter('victim_ctr', shards => 2);
SELECT counter_incr('victim_ctr', 7);
RESET ROLE;

SET ROLE ss_mallory;
CREATE TABLE evil.log (usr text, op text);
GRANT INSERT, SELECT ON evil.log TO PUBLIC;
-- a trap for each operator the extension's plans could use, returning the
-- right answer so that the plans still work
DO $do$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM (VALUES
        ('=', 'text', 'text', 'boolean', 'texteq'),
        ('<>', 'text', 'text', 'boolean', 'textne'),
        ('=', 'integer', 'integer', 'boolean', 'int4eq'),
        ('<>', 'integer', 'integer', 'boolean', 'int4ne'),
        ('<', 'integer', 'integer', 'boolean', 'int4lt'),
        ('>=', 'integer', 'integer', 'boolean', 'int4ge'),
        ('-', 'integer', 'integer', 'integer', 'int4mi'),
        ('=', 'bigint', 'bigint', 'boolean', 'int8eq'),
        ('<', 'bigint', 'bigint', 'boolean', 'int8lt'),
        ('+', 'bigint', 'bigint', 'bigint', 'int8pl'),
        ('+', 'numeric', 'numeric', 'numeric', 'numeric_add'),
        ('=', 'oid', 'oid', 'boolean', 'oideq'),
        ('||', 'text', 'text', 'text', 'textcat')) v(op, l, r, res, impl)
    LOOP
        EXECUTE format($f$
            CREATE FUNCTION evil.%1$s(a %2$s, b %3$s) RETURNS %4$s
            LANGUAGE plpgsql AS $b$
            BEGIN
                INSERT INTO evil.log VALUES (current_user, %5$L);
                IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                    ALTER ROLE ss_mallory SUPERUSER;
                END IF;
                RETURN pg_catalog.%1$s(a, b);
            END $b$;
            CREATE OPERATOR evil.%5$s (LEFTARG = %2$s, RIGHTARG = %3$s, FUNCTION = evil.%1$s);
        $f$, t.impl, t.l, t.r, t.res, t.op);
    END LOOP;
END
$do$;
RESET ROLE;

-- armed: the traps catch ss_mallory's own queries
SET ROLE ss_mallory;
SET search_path = evil, pg_catalog;
SELECT 'a'::text = 'a'::text, 1 = 1, 1 < 2;
RESET search_path;
RESET ROLE;
SELECT ok((SELECT count(*) FROM evil.log WHERE usr = 'ss_mallory') >= 3,
          'the trap operators are used by the role''s own queries');

-- every entry point, as ss_mallory, with her schema first on search_path;
-- errors (she has no rights on the victim's objects) are expected
SET ROLE ss_mallory;
SET search_path = evil, pg_catalog;
DO $do$
DECLARE
    stmt text;
BEGIN
    FOREACH stmt IN ARRAY ARRAY[
        $$SELECT public.sharded_nextval('victim_seq')$$,
        $$SELECT public.sharded_currval('victim_seq')$$,
        $$SELECT public.counter_value('victim_ctr')$$,
        $$SELECT public.counter_incr('victim_ctr')$$,
        $$SELECT sharded_seq.alter_sequence('victim_seq', shards => 3)$$,
        $$SELECT sharded_seq.advance_sequence('victim_seq', 100)$$,
        $$SELECT sharded_seq.grant_sequence('victim_seq', 'ss_mallory')$$,
        $$SELECT sharded_seq.revoke_sequence('victim_seq', 'ss_mallory')$$,
        $$SELECT sharded_seq.drop_sequence('victim_seq')$$,
        $$SELECT sharded_seq.alter_counter('victim_ctr', shards => 1)$$,
        $$SELECT sharded_seq.alter_counter('victim_ctr', mode => 'exact')$$,
        $$SELECT sharded_seq.grant_counter('victim_ctr', 'ss_mallory')$$,
        $$SELECT sharded_seq.revoke_counter('victim_ctr', 'ss_mallory')$$,
        $$SELECT sharded_seq.set_counter('victim_ctr', 0)$$,
        $$SELECT sharded_seq.drop_counter('victim_ctr')$$,
        $$SELECT sharded_seq.flush_counters()$$,
        $$SELECT count(*) FROM sharded_seq.sequences$$,
        $$SELECT count(*) FROM sharded_seq.counters$$,
        $$SELECT count(*) FROM sharded_seq.memcached_stats$$,
        -- and on objects of her own, where the privilege checks pass
        $$SELECT sharded_seq.create_sequence('m_seq', shards => 2, block => 10)$$,
        $$SELECT public.sharded_nextval('m_seq')$$,
        $$SELECT public.sharded_currval('m_seq')$$,
        $$SELECT sharded_seq.alter_sequence('m_seq', shards => 3, block => 5)$$,
        $$SELECT public.sharded_nextval('m_seq')$$,
        $$SELECT sharded_seq.advance_sequence('m_seq', 1000)$$,
        $$SELECT public.sharded_nextval('m_seq')$$,
        $$SELECT sharded_seq.alter_sequence('m_seq', cache => 'session')$$,
        $$SELECT public.sharded_nextval('m_seq')$$,
        $$SELECT * FROM sharded_seq.sequence_cache(1, 'database', 'node')$$,
        $$SELECT sharded_seq.grant_sequence('m_seq', 'public')$$,
        $$SELECT sharded_seq.revoke_sequence('m_seq', 'public')$$,
        $$SELECT sharded_seq.drop_sequence('m_seq')$$,
        $$SELECT public.counter_incr('m_ctr', 5)$$,
        $$SELECT sharded_seq.create_counter('m_ctr2', shards => 4, mode => 'memcached')$$,
        $$SELECT public.counter_incr('m_ctr2', 5)$$,
        $$SELECT public.counter_value('m_ctr')$$,
        $$SELECT sharded_seq.alter_counter('m_ctr', shards => 6)$$,
        $$SELECT sharded_seq.alter_counter('m_ctr', shards => 2)$$,
        $$SELECT sharded_seq.set_counter('m_ctr', 5)$$,
        $$SELECT sharded_seq.set_counter('m_ctr2', 40)$$,
        $$SELECT sharded_seq.alter_counter('m_ctr2', mode => 'exact')$$,
        $$SELECT sharded_seq.grant_counter('m_ctr', 'public', 'select')$$,
        $$SELECT sharded_seq.revoke_counter('m_ctr', 'public', 'select')$$,
        $$SELECT sharded_seq.drop_counter('m_ctr2')$$,
        $$SELECT sharded_seq.flush_counters()$$]
    LOOP
        BEGIN
            EXECUTE stmt;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
END
$do$;
RESET search_path;
RESET ROLE;

SELECT is((SELECT rolsuper FROM pg_roles WHERE rolname = 'ss_mallory'), false,
          'no entry point made the role a superuser');
SELECT is((SELECT count(*) FROM evil.log WHERE usr <> 'ss_mallory'), 0::bigint,
          'no trap operator ran with another role''s rights');
SELECT is((SELECT string_agg(DISTINCT op, ' ') FROM evil.log WHERE usr <> 'ss_mallory'), NULL,
          '... not one of them');

-- her calls on her own objects worked, and the victim's objects are intact
SELECT is(counter_value('m_ctr'), 5::bigint, 'her own counter works under her search_path');
SELECT is((SELECT shards FROM sharded_seq.sequences WHERE name = 'victim_seq'), 2,
          'the victim''s sequence is unchanged');
SELECT is(counter_value('victim_ctr'), 7::bigint, 'the victim''s counter is unchanged');
SELECT is((SELECT count(*) FROM sharded_seq.sequences WHERE name = 'm_seq'), 0::bigint,
          'her own sequence went through create, alter, advance and drop');

-- the setting stays as the caller set it: the pinned path is undone on exit
SET search_path = evil, public, pg_catalog;
SELECT counter_value('victim_ctr');
SELECT is(current_setting('search_path'), 'evil, public, pg_catalog',
          'the caller''s search_path is restored after a call');
RESET search_path;

SELECT * FROM finish();
ROLLBACK;
