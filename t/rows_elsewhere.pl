# Rows and claims written outside the engine, as logical replication's apply
# worker writes them (plain INSERT and DELETE by a superuser, with
# session_replication_role = replica), seen by sessions that had already
# read them (C3, S1 across nodes):
#   1. a node-0 session that read a counter from its remembered rows counts
#      another node's rows once they arrive;
#   2. a node-5 session that checked its claim is refused once the claim is
#      replaced by another system's, as new sessions are.
# Run twice: without the library preloaded, and preloaded.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

for my $preload (0, 1)
{
	my $node = ssq_node("elsewhere_$preload", preload => $preload);
	my $how = $preload ? 'preloaded' : 'not preloaded';
	# as the apply worker: replica role, plain DML
	my $as_replication = sub {
		my ($db, $sql) = @_;
		$node->safe_psql($db, "SET session_replication_role = replica; $sql");
	};

	note("$how: 1. another node's rows arrive at node 0");
	$node->safe_psql('stress',
		"SELECT sharded_seq.create_counter('pinned', shards => 4), sharded_seq.create_counter('adapt')");
	my $a = $node->background_psql('stress');
	for my $c (qw(pinned adapt))
	{
		$a->query_safe("SELECT counter_incr('$c', 10)");
		is($a->query_safe("SELECT counter_value('$c'); SELECT counter_value('$c')"),
			"10\n10", "$how: $c read twice (its rows remembered): 10");
	}
	$as_replication->('stress',
		'INSERT INTO sharded_seq.counter_shards SELECT id, 1024, 1000 FROM sharded_seq.counter_config');
	for my $c (qw(pinned adapt))
	{
		my $got = $a->query_safe("SELECT counter_value('$c')");
		note("RESULT $how: $c read by a session that had remembered its rows: $got (want 1010)");
		is($got, '1010', "$how: $c: the session counts node 1's row that arrived");
		is($a->query_safe("SELECT counter_incr('$c', 1)"), '1011',
			"$how: $c: counter_incr returns the total with it");
	}
	$a->quit;

	note("$how: 2. this node's claim replaced by another system's");
	$node->safe_psql('stress',
		"LOAD 'sharded_seq'; ALTER SYSTEM SET sharded_seq.node_id = 5; SELECT pg_reload_conf()");
	$node->poll_query_until('stress', "SELECT current_setting('sharded_seq.node_id', true) = '5'")
	  or die 'the reload did not reach new sessions';
	ssq_db($node, 'n5');
	$node->safe_psql('n5', "SELECT sharded_seq.create_sequence('s'), sharded_seq.create_counter('c')");
	my $b = $node->background_psql('n5', on_error_stop => 0);
	is($b->query_safe("SELECT sharded_seq.node_id(), sharded_nextval('s') >= 5 * 2^53"),
		'5|t', "$how: the session draws as node 5, having checked its claim");
	$as_replication->('n5', q{BEGIN;
DELETE FROM sharded_seq.node_claims WHERE node_id = 5;
INSERT INTO sharded_seq.node_claims VALUES (5, '7999999999999999999', 'n5', now());
COMMIT});
	my ($rc, $out, $err) = $node->psql('n5', "SELECT sharded_nextval('s')");
	like($err, qr/ERROR:.*claimed by system 7999999999999999999/, "$how: a new session is refused");
	for my $stmt ("SELECT sharded_nextval('s')", "SELECT counter_incr('c')",
		"SELECT sharded_seq.create_counter('made_while_refused')")
	{
		my ($o, $e) = bg_query($b, $stmt);
		like($e, qr/claimed by system 7999999999999999999/,
			"$how: the session that had checked its claim is refused too: $stmt");
	}
	$b->quit;
	$node->stop;
}

done_testing();
