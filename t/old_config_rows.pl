# Counters whose config rows are older than the commit log PostgreSQL
# keeps.  After enough transactions, VACUUM freezes the rows and truncates
# pg_xact; a counter's config row xid must not be looked up there again (it
# used to raise "could not access status of transaction" on every read that
# trusted remembered rows or a kept total), nor that of a counter a session
# created and then left alone.  pg_resetwal -x moves the next xid to the end
# of the second commit log segment, as after two million transactions, and
# a few thousand more cross into the third.  Without and with preload.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

for my $preload (0, 1)
{
	my $node = ssq_node("preload$preload", preload => $preload);
	my $pgdata = $node->data_dir;
	$node->safe_psql('stress', q{
SELECT sharded_seq.create_counter('pinned', shards => 4);
SELECT counter_incr('pinned', 5), counter_incr('adaptive', 7);
});
	$node->stop('fast');
	system_or_bail('pg_resetwal', '-x', '2096000', '-D', $pgdata);
	# the commit log page pg_resetwal's next xid falls in must exist
	PostgreSQL::Test::Utils::append_to_file("$pgdata/pg_xact/0001", "\0" x (8192 * 32));
	$node->start;

	# a session creates a counter, then leaves it alone
	my $s = $node->background_psql('stress', on_error_stop => 0);
	$s->query_safe("SELECT counter_incr('mine', 3)");

	my $xid = "$PostgreSQL::Test::Utils::tmp_check/xid.sql";
	PostgreSQL::Test::Utils::append_to_file($xid, "SELECT txid_current();\n") unless -e $xid;
	$node->command_ok([ 'pgbench', '-n', '-c', '2', '-t', '1300', '-f', $xid, 'stress' ],
		"preload=$preload: 2600 more transactions");
	$node->safe_psql('postgres', 'ALTER DATABASE template0 ALLOW_CONNECTIONS true');
	$node->safe_psql($_, 'VACUUM FREEZE') for qw(template0 template1 postgres stress);
	$node->safe_psql('postgres', 'ALTER DATABASE template0 ALLOW_CONNECTIONS false');
	$node->safe_psql('stress', 'CHECKPOINT');
	ok(!-e "$pgdata/pg_xact/0000" && !-e "$pgdata/pg_xact/0001",
		"preload=$preload: VACUUM FREEZE truncated the commit log past the config rows' xids");

	my $out = $node->safe_psql('stress', q{
SELECT counter_value('pinned'), counter_value('adaptive');
SELECT counter_value('pinned'), counter_value('adaptive');
SELECT counter_value('pinned'), counter_value('adaptive');
SELECT counter_incr('pinned', 1), counter_incr('adaptive', 1);
SELECT counter_value('pinned'), counter_value('adaptive');
});
	$out =~ s/\n/ /g;
	note("RESULT preload=$preload, config rows older than the commit log: $out (want 5|7 5|7 5|7 6|8 6|8)");
	is($out, '5|7 5|7 5|7 6|8 6|8', "preload=$preload: totals read and incremented");
	my $mine = $s->query(
		"SELECT 'mine ' || counter_value('mine');\nSELECT 'mine ' || counter_incr('mine', 1);");
	$s->quit;
	$mine =~ s/\n/ /g;
	note("RESULT preload=$preload, the session that created a counter, after the commit log dropped that xid: $mine (want mine 3 mine 4)");
	is($mine, 'mine 3 mine 4', "preload=$preload: the session that created a counter reads and increments it");
	is($s->{stderr}, '', "preload=$preload: without an error");

	$node->stop('fast');
}

done_testing();
