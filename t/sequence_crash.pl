# S1 and S2 under load: 8 sessions draw at once, committing some draws and
# rolling back others, through (1) an immediate shutdown, (2) a backend
# killed with SIGKILL (crash recovery), and (3) online alter_sequence and
# advance_sequence.  Each crash must cut every session off mid-load; then
# every value any session received is checked: none repeats, and each
# session's values strictly increase.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $sessions = 8;
# a killed backend restarts the server (TAP clusters turn that off)
my $node = ssq_node('main', conf => "restart_after_crash = on\n");
$node->safe_psql('stress', q{
SELECT sharded_seq.create_sequence('s', shards => 4, block => 20);
-- the same workload on a native sequence, for comparison only
CREATE SEQUENCE native_s;
});

# script(ROLLBACK_PERCENT, TRANSACTIONS, SEED, TAG): one session's draws,
# until stop_load(TAG)
sub script
{
	my ($rb, $n, $seed, $tag) = @_;
	srand($seed);
	my @draws = (1, 1, 1, 2, 5);
	my $sql = '';
	for (1 .. $n)
	{
		$sql .= stop_point($tag) if $_ % 50 == 0;
		my $end = rand(100) < $rb ? 'ROLLBACK' : 'COMMIT';
		$sql .= "BEGIN; SELECT sharded_nextval('s') FROM generate_series(1, "
		  . $draws[ int(rand(@draws)) ] . "); $end;\n";
	}
	return $sql;
}

sub phase
{
	my ($name, $rb, $n) = @_;
	return load_start($node, 'stress', $name,
		map { script($rb, $n, "$name$_", $name) } 1 .. $sessions);
}

my @outputs;

# 1. rolled-back draws, then an immediate shutdown mid-load; beside them,
# native nextval drawn in rolled-back transactions, as its documentation warns
my $native = load_start($node, 'stress', 'native',
	"BEGIN; SELECT nextval('native_s'); ROLLBACK;\n" x 200000);
my $p1 = phase('p1', 100, 60000);
load_progress($p1, 2000);
load_progress($native, 2000);
$node->stop('immediate');
is(load_cut_off($p1), $sessions, 'phase 1: the immediate shutdown cut every session off');
load_finish($native);
push @outputs, map { $_->{out} } @$p1;
$node->start;
my $after = $node->safe_psql('stress', "SELECT nextval('native_s') FROM generate_series(1, 200)");
my %native;
$native{$_}++ for ($native->[0]{out} . "\n" . $after) =~ /^(\d+)$/mg;
note('RESULT native nextval (comparison only): '
	  . (grep { $_ > 1 } values %native)
	  . ' values handed out twice after the crash');

# 2. mixed commits and rollbacks, a backend killed with SIGKILL mid-load
my $p2 = phase('p2', 40, 60000);
load_progress($p2, 2000);
my $victim = $node->safe_psql('stress',
	"SELECT pid FROM pg_stat_activity WHERE datname = 'stress' AND backend_type = 'client backend'
	    AND pid <> pg_backend_pid() LIMIT 1");
ok(kill('KILL', $victim), "phase 2: backend $victim killed with SIGKILL");
is(load_cut_off($p2), $sessions, 'phase 2: the crash recovery cut every session off');
push @outputs, map { $_->{out} } @$p2;
$node->poll_query_until('stress', 'SELECT true') or die 'the server did not come back';

# 3. mixed load while the layout changes online, each change with every
# session drawing before and after it
my $p3 = phase('p3', 40, 30000);
load_progress($p3, 1000);
$node->safe_psql('stress', "SELECT sharded_seq.alter_sequence('s', shards => 6, block => 13)");
load_progress($p3, 3000);
$node->safe_psql('stress', "SELECT sharded_seq.advance_sequence('s', 50000000)");
load_progress($p3, 5000);
$node->safe_psql('stress', "SELECT sharded_seq.alter_sequence('s', shards => 2, block => 100)");
# every session draws well past the last change too, then stops (the rest
# of its 30,000 transactions would prove nothing more)
load_progress($p3, 7000);
stop_load($node, 'stress', 'p3');
load_finish($p3);
is(join('', map { $_->{err} } @$p3), '', 'phase 3: no session got an error');
push @outputs, map { $_->{out} } @$p3;
my $above = grep { $_ > 50000000 } map { /^(\d+)$/mg } map { $_->{out} } @$p3;
note("RESULT phase 3: $above values drawn after the online advance");
cmp_ok($above, '>', 0, 'phase 3: values were drawn after the online advance');
note($node->safe_psql('stress',
	'SELECT name, shards, block, generation, reserved_high_water FROM sharded_seq.sequences'));

values_check('every phase', @outputs);

done_testing();
