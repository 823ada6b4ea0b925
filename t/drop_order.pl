# drop_counter() writes its changes in the order a subscriber must apply
# them: the counter_config row first, then the counter's shard rows, as
# alter_counter locks them (config row, then rows).  In the other order, a
# subscriber's apply worker locks shard rows before the config row and can
# deadlock with an alter_counter running there.  Read from a logical
# decoding slot, for a counter of each mode.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('main', preload => 1, allows_streaming => 'logical');

for my $mode ('exact', 'buffered', 'memcached')
{
	$node->safe_psql('stress', qq{
SELECT sharded_seq.create_counter('c_$mode', shards => 3, mode => '$mode');
SELECT counter_incr('c_$mode', 5);
SELECT pg_create_logical_replication_slot('s_$mode', 'test_decoding');
});
	$node->safe_psql('stress', "SELECT sharded_seq.drop_counter('c_$mode')");
	my $order = $node->safe_psql('stress', qq{
SELECT string_agg(CASE WHEN data LIKE 'table sharded_seq.counter_config: DELETE%' THEN 'config'
                       WHEN data LIKE 'table sharded_seq.counter_shards: DELETE%' THEN 'shard' END, ' ' ORDER BY ordinality)
  FROM pg_logical_slot_get_changes('s_$mode', NULL, NULL) WITH ORDINALITY
 WHERE data LIKE 'table sharded_seq.counter_%: DELETE%'});
	$node->safe_psql('stress', "SELECT pg_drop_replication_slot('s_$mode')");
	note("RESULT drop_counter of a '$mode' counter decodes as: $order");
	is($order, 'config shard shard shard',
		"drop_counter('c_$mode') writes the config row before its 3 shard rows");
}

done_testing();
