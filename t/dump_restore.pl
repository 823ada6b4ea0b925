# S1 and E4 across pg_dump/pg_restore: fill a table through a DEFAULT from
# several sessions, keep some counters, dump, restore into a fresh database,
# and insert more rows through the DEFAULT there from several sessions.  No
# duplicate key may occur, and every counter total and setting must survive.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('main', db => 'src');
$node->safe_psql('src', q{
CREATE ROLE ss_dump_app;
SELECT sharded_seq.create_sequence('orders_id', shards => 4, block => 50);
SELECT sharded_seq.grant_sequence('orders_id', 'ss_dump_app');
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'), note text);
SELECT sharded_seq.create_counter('views', shards => 4);
SELECT sharded_seq.create_counter('likes', shards => 2);
});

# SESSIONS sessions at once each insert ROWS rows through the DEFAULT
sub insert_load
{
	my ($db, $sessions, $rows) = @_;
	parallel_psql($node, $db,
		map {
			"INSERT INTO orders (note) SELECT 's$_' FROM generate_series(1, $rows);
			 SELECT counter_incr('views', $rows), counter_incr('likes', -$_);"
		} 1 .. $sessions);
	return;
}

insert_load('src', 6, 500);
# a layout change and an advance before the dump, so generations differ
$node->safe_psql('src',
	"SELECT sharded_seq.alter_sequence('orders_id', shards => 3, block => 70)");
insert_load('src', 4, 300);

my $state = q{
SELECT name || ' ' || shards || ' ' || block || ' ' || generation || ' ' || coalesce(acl::text, '') FROM sharded_seq.sequences;
SELECT name || ' ' || shards || ' ' || mode || ' ' || total FROM sharded_seq.counters;
};
my $before = $node->safe_psql('src', $state);

my $dump = $PostgreSQL::Test::Utils::tmp_check . '/src.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('src'), '-f', $dump ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ], 'pg_restore');
is($node->safe_psql('restored', $state), $before,
	'every sequence setting and counter total survives the restore');

# more rows through the DEFAULT in the restored database: no duplicate key
insert_load('restored', 6, 500);
is( $node->safe_psql('restored', 'SELECT count(*) || \' \' || count(DISTINCT id) FROM orders'),
	'7200 7200', 'after the restore and 3000 more inserts: 7200 rows, 7200 distinct ids');
is($node->safe_psql('restored', "SELECT counter_value('views')"), '7200',
	'the restored counter goes on from its total');

done_testing();
