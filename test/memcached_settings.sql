-- Settings that reach the network are superuser-only and validated in check
-- hooks; with no server set, nothing talks to the network and everything
-- still works through the database.
BEGIN;
SELECT plan(20);
LOAD 'sharded_seq';

CREATE ROLE ss_plain;
SET ROLE ss_plain;
SELECT throws_ok($$SET sharded_seq.memcached_servers = '127.0.0.1:11211'$$, '42501', NULL,
                 'an ordinary role cannot point the fast path at a server');
SELECT throws_ok($$SET sharded_seq.memcached_connect_timeout = 50$$, '42501', NULL, '... nor change the connect timeout');
SELECT throws_ok($$SET sharded_seq.memcached_poll_timeout = 50$$, '42501', NULL, '... nor the poll timeout');
SELECT throws_ok($$SET sharded_seq.counter_flush_interval = 1$$, '42501', NULL, '... nor the flush interval');
SELECT lives_ok($$SET sharded_seq.default_lease_size = 500$$, 'the default lease size is a user setting');
RESET ROLE;

SELECT throws_ok($$SET sharded_seq.memcached_servers = 'host name with spaces'$$, '22023', NULL, 'a malformed server list is refused');
SELECT throws_ok($$SET sharded_seq.memcached_servers = '127.0.0.1:99999'$$, '22023', NULL, 'a port out of range is refused');
SELECT throws_ok($$SET sharded_seq.memcached_servers = '127.0.0.1:11211,,x'$$, '22023', NULL, 'an empty item is refused');
SELECT lives_ok($$SET sharded_seq.memcached_servers = '127.0.0.1:11211,cache-2.internal:11212:2'$$, 'a superuser may set a list with weights');
RESET sharded_seq.memcached_servers;
SELECT throws_ok($$SET sharded_seq.memcached_poll_timeout = 0$$, '22023', NULL, 'a zero timeout is refused');
SELECT throws_ok($$SET sharded_seq.counter_flush_interval = -1$$, '22023', NULL, 'a negative interval is refused');
SELECT throws_ok($$SET sharded_seq.default_lease_size = 0$$, '22023', NULL, 'a zero lease is refused');

-- no server: the memcached tier and buffered counters work through the database
SELECT is(current_setting('sharded_seq.memcached_servers'), '', 'no server is set by default');
SELECT lives_ok($$SELECT sharded_seq.create_sequence('mt', tier => 'memcached', block => 50)$$, 'a memcached-tier sequence can be created');
SELECT is((SELECT shards || '/' || block || '/' || tier FROM sharded_seq.sequences WHERE name = 'mt'), '1/50/memcached',
          'it has one shard, and block is its lease size');
SELECT throws_ok($$SELECT sharded_seq.create_sequence('mt2', tier => 'memcached', shards => 4)$$, '22023', NULL,
                 'a memcached-tier sequence with several shards is refused');
SELECT is((SELECT count(DISTINCT v) FROM (SELECT sharded_nextval('mt') AS v FROM generate_series(1, 120)) s), 120::bigint,
          'with no server its values come from the database');
SELECT lives_ok($$SELECT sharded_seq.create_counter('bc', mode => 'memcached')$$, 'a memcached counter can be created');
SELECT is(counter_incr('bc', 5) + counter_incr('bc', -2), 8::bigint, 'positive and negative increments both count');
SELECT is(sharded_seq.flush_counters(), 0, 'with no server there is nothing to flush');

SELECT * FROM finish();
ROLLBACK;
