# C1 under load: 16 sessions make committed and rolled-back increments,
# positive and negative, with an immediate shutdown in the middle (which
# must cut every session off) and online shard changes after the restart.
# Each committed increment also writes its delta to a ledger in the same
# transaction, so each counter's final total must equal the ledger's sum
# exactly, whatever the crash cut off.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $sessions = 16;
my $node = ssq_node('main');
$node->safe_psql('stress', q{
SELECT sharded_seq.create_counter('hits', shards => 8);
CREATE TABLE ledger (counter text, delta bigint);
});

# script(TRANSACTIONS, SEED): one session's increments, 30% rolled back
sub script
{
	my ($n, $seed) = @_;
	srand($seed);
	my @names = ('hits', 'hits', 'hits', 'other');
	my @count = (1, 1, 2, 3);
	my $sql = '';
	for (1 .. $n)
	{
		$sql .= 'BEGIN;';
		for (1 .. $count[ int(rand(@count)) ])
		{
			my $name = $names[ int(rand(@names)) ];
			my $d = int(rand(16)) - 5;
			$sql .= " SELECT counter_incr('$name', $d); INSERT INTO ledger VALUES ('$name', $d);";
		}
		$sql .= rand(100) < 30 ? " ROLLBACK;\n" : " COMMIT;\n";
	}
	return $sql;
}

sub phase
{
	my ($name, $n) = @_;
	return load_start($node, 'stress', $name,
		map { script($n, "$name$_") } 1 .. $sessions);
}

# 1. increments, then an immediate shutdown mid-load (every session well
# under way: 500 lines printed, some 250 transactions)
my $p1 = phase('p1', 50000);
load_progress($p1, 500);
$node->stop('immediate');
is(load_cut_off($p1), $sessions, 'phase 1: the immediate shutdown cut every session off');
$node->start;

# 2. increments while the shard count changes online, every session
# incrementing before and after each change
my $p2 = phase('p2', 3000);
load_progress($p2, 500);
$node->safe_psql('stress', "SELECT sharded_seq.alter_counter('hits', shards => 3)");
load_progress($p2, 1500);
$node->safe_psql('stress', "SELECT sharded_seq.alter_counter('hits', shards => 16)");
load_progress($p2, 2500);
$node->safe_psql('stress', "SELECT sharded_seq.alter_counter('other', shards => 1)");
load_finish($p2);
# Transactions touch 'hits' and 'other' in random orders, and 'other' ends
# with a single shard; commits take counters in a fixed order, so no session
# may see a deadlock or any other error.
is(join('', map { $_->{err} } @$p2), '', 'phase 2: no session got an error');

my $rows = ledger_check($node, 'stress', 'after the crash and the shard changes');
is(scalar(grep { (split /\|/)[3] >= 1000 } split /\n/, $rows), 2,
	'each counter took at least 1000 committed increments');

done_testing();
