# A memcached cluster: S1 and S2 of memcached-tier sequences and C2 of
# memcached counters when one of three servers in one
# sharded_seq.memcached_servers list is killed (SIGKILL) and restarted empty
# on its port under load.  The lost server costs only its own keys: a counter
# whose key lives on a surviving server stays exact, one whose key lived on
# the lost server loses at most what was committed around the kill, no key
# moves to another server, and the restarted server serves keys again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

# A counter on the killed server may lose what that server held unflushed:
# at most what was committed after a snapshot of the ledger that precedes a
# whole worker round (which flushed everything committed before it), the
# round itself and the kill.

my @mc = map { ShardedSeq::Memcached->new } 0 .. 2;
my $node = ssq_node(
	'main',
	preload => 1,
	conf => "sharded_seq.memcached_servers = '"
	  . join(',', map { $_->servers } @mc) . "'\n"
	  . "sharded_seq.counter_flush_interval = 1\n");
my $db = 'stress';
sub sql { return $node->safe_psql($db, $_[0]); }
sql("CREATE TABLE ledger (counter text, delta bigint, at timestamptz DEFAULT clock_timestamp())");

# ms1..msN and mc1..mcM: small leases (block 500), so new ones, whose keys
# land on every server, come all through the load; one draw publishes a
# lease, one committed increment creates a counter's key
my ($seqs, $counters) = (0, 0);
my @warm;
sub add_objects
{
	my ($nseq, $nctr) = @_;
	for (1 .. $nseq)
	{
		$seqs++;
		sql("SELECT sharded_seq.create_sequence('ms$seqs', tier => 'memcached', block => 500)");
		push @warm, "ms$seqs|" . sql("SELECT sharded_nextval('ms$seqs')");
	}
	for (1 .. $nctr)
	{
		$counters++;
		sql("SELECT sharded_seq.create_counter('mc$counters', shards => 2, mode => 'memcached')");
		sql("BEGIN; SELECT counter_incr('mc$counters', 1); INSERT INTO ledger VALUES ('mc$counters', 1); COMMIT;");
	}
	return;
}

# where(): for each counter's pending amount ("counter NAME"), each
# sequence's lease pointer ("sequence NAME") and the lease it points to
# ("lease NAME"), the index of the one server that holds its key, or "none"
# or "many".  Keys are the extension's own:
# ss:<system id>:<database oid>:<installation token, hex>:<suffix>.
sub where
{
	my %at;
	my $find = sub {
		my ($key) = @_;
		my @on = grep { defined $_->[1] } map { [ $_, $mc[$_]->get($key) ] } 0 .. 2;
		return @on == 1 ? @{ $on[0] } : (@on ? 'many' : 'none');
	};
	for my $line (split /\n/, sql(q{
WITH k AS (SELECT 'ss:' || (SELECT system_identifier FROM pg_control_system()) || ':' ||
                  (SELECT oid FROM pg_database WHERE datname = current_database()) || ':' ||
                  (SELECT to_hex(token) FROM sharded_seq.installation) AS p,
                  (SELECT timeline_id FROM pg_control_checkpoint()) AS tli)
SELECT 'counter ' || name || ' ' || p || ':ctr:' || id || ':pending' FROM sharded_seq.counter_config, k
UNION ALL
SELECT 'sequence ' || name || ' ' || p || ':seq:' || id || ':g' || generation || ':t' || tli || ':cur'
  FROM sharded_seq.sequence_config, k}))
	{
		my ($kind, $name, $key) = split / /, $line;
		my ($i, $v) = $find->($key);
		$at{"$kind $name"} = $i;
		# the lease counter: the pointer names the lease by its first value
		($at{"lease $name"}) = $find->(substr($key, 0, -3) . "L$v")
		  if $kind eq 'sequence' && defined $v;
	}
	return \%at;
}
# on(WHERE, KIND, I): the names of KIND whose key is on server I
sub on
{
	my ($at, $kind, $i) = @_;
	my @names = sort map { (split / /)[1] } grep { /^$kind / && $at->{$_} eq $i } keys %$at;
	return @names;
}

# objects until every server holds a counter key and a sequence key
add_objects(6, 12);
my $at;
for (1 .. 30)
{
	$at = where();
	my @bad = grep { $at->{$_} !~ /^\d$/ } keys %$at;
	die "keys on no server, or on several: @bad" if @bad;
	last unless grep { !on($at, 'counter', $_) || !on($at, 'sequence', $_) } 0 .. 2;
	add_objects(1, 1);
}
ok(!(grep { !on($at, 'counter', $_) || !on($at, 'sequence', $_) } 0 .. 2),
	"every server holds a counter's and a sequence's key ($seqs sequences, $counters counters)");
note("RESULT server $_: counters " . join(' ', on($at, 'counter', $_))
	  . ' | lease pointers ' . join(' ', on($at, 'sequence', $_)))
  for 0 .. 2;

# 6 sessions, 30% rolled back: draws ("NAME|value" lines), and increments,
# now and then of two counters (likely on two servers) in one transaction
srand(1);
my @scripts;
for (1 .. 6)
{
	my $sql = '';
	for my $i (1 .. 40000)
	{
		$sql .= stop_point('load') if $i % 10 == 1;
		my $end = rand() < 0.3 ? 'ROLLBACK' : 'COMMIT';
		if (rand() < 0.45)
		{
			my $s = 'ms' . (1 + int rand $seqs);
			my $n = (1, 1, 3)[ int rand 3 ];
			$sql .= "BEGIN; SELECT '$s', sharded_nextval('$s') FROM generate_series(1, $n); $end;\n";
		}
		else
		{
			$sql .= 'BEGIN; ';
			my %c = map { (1 + int rand $counters) => 1 } 1 .. (rand() < 0.2 ? 2 : 1);
			for my $c (sort keys %c)
			{
				my $d = 1 + int rand 9;
				$sql .= "SELECT counter_incr('mc$c', $d) \\g /dev/null\n"
				  . "INSERT INTO ledger VALUES ('mc$c', $d);";
			}
			$sql .= " $end;\n";
		}
	}
	push @scripts, $sql;
}

# how often KIND fell back to the database or got a memcached error; the
# worker's flushes
sub stat_sum
{
	my ($what, $kind) = @_;
	return sql("SELECT coalesce(sum($what), 0) FROM sharded_seq.memcached_stats"
		  . ($kind ? " WHERE kind = '$kind'" : ''));
}
sub wait_stat
{
	my ($what, $kind, $than, $why) = @_;
	$node->poll_query_until($db,
		"SELECT coalesce(sum($what), 0) > $than FROM sharded_seq.memcached_stats"
		  . ($kind ? " WHERE kind = '$kind'" : ''))
	  or die "timed out waiting for $why";
	return;
}

my $load = load_start($node, $db, 'load', @scripts);
# the kill comes once the worker has flushed under the load, with leases in
# use on the servers
my $flushes = stat_sum('flushes');
wait_stat('flushes', undef, $flushes, 'a flush under the load');
wait_stat('hits', 'sequence', stat_sum('hits', 'sequence'), 'draws under the load');
my $at_kill = where();
# the victim: the server holding the most leases in use
my @leases = map { scalar(my @l = on($at_kill, 'lease', $_)) } 0 .. 2;
my ($victim) = sort { $leases[$b] <=> $leases[$a] || $a <=> $b } 0 .. 2;
my %lost = map { $_ => 1 } on($at, 'counter', $victim);
note("RESULT victim server $victim, leases in use: " . join(' ', on($at_kill, 'lease', $victim)));
my $seq_misses = stat_sum('fallbacks + errors', 'sequence');
my $ctr_misses = stat_sum('fallbacks + errors', 'counter');
# what has committed by now, then a whole worker round, then the kill
my %before = map { split /\|/ } split /\n/,
  sql('SELECT counter, sum(delta) FROM ledger GROUP BY counter');
worker_round($node, $db);
$mc[$victim]->kill('KILL');
# down until sequences and counters both noticed
wait_stat('fallbacks + errors', 'sequence', $seq_misses, 'a sequence to notice the kill');
wait_stat('fallbacks + errors', 'counter', $ctr_misses, 'a counter to notice the kill');
pass('sequences and counters noticed the kill');
note('RESULT health while down: '
	  . sql("SELECT string_agg(port || ' healthy=' || healthy, ', ') FROM sharded_seq.memcached_servers()"));
$mc[$victim]->start;
# up until the restarted server holds keys again and the worker flushed
$flushes = stat_sum('flushes');
poll_until(sub { $mc[$victim]->stat_value('curr_items') > 0 }, 'keys on the restarted server');
wait_stat('flushes', undef, $flushes, 'a flush after the restart');
cmp_ok($mc[$victim]->stat_value('curr_items'), '>', 0, 'the restarted server holds keys again');
is(load_running($load), 6, 'the load ran through the kill and the restart');
stop_load($node, $db, 'load');
my ($out, $err) = load_finish($load);
is(join('', @$err), '', 'no session saw an error');

# values: per sequence, one list per session in the order it got them
my %lists;
for my $text (@$out, @warm)
{
	my %mine;
	for (split /\n/, $text)
	{
		push @{ $mine{$1} }, $2 if /^(ms\d+)\|(\d+)$/;
	}
	push @{ $lists{$_} }, $mine{$_} for keys %mine;
}
values_check("ms$_", @{ $lists{"ms$_"} }) for 1 .. $seqs;

# counters: everything flushed, then each total against its ledger
sql('SELECT sharded_seq.flush_counters()');
my ($n_surv, $n_lost, $surv_sum, $lost_sum, $lost_total) = (0) x 5;
for my $row (split /\n/, sql(qq{
SELECT c.name, c.total, coalesce(c.pending::text, 'NULL'), l.sum
  FROM sharded_seq.counters c
  JOIN (SELECT counter, sum(delta) AS sum FROM ledger GROUP BY counter) l ON l.counter = c.name
 ORDER BY c.name}))
{
	my ($name, $total, $pending, $sum) = split /\|/, $row;
	my $window = $sum - ($before{$name} // 0);
	my @fails;
	push @fails, "total $total exceeds the committed sum $sum" if $total > $sum;
	push @fails, "pending $pending after flush_counters()" if $pending ne '0';
	if ($lost{$name})
	{
		$n_lost++;
		$lost_sum += $sum;
		$lost_total += $total;
		push @fails, 'lost ' . ($sum - $total) . ", more than the $window committed after the snapshot before the worker's last round and the kill"
		  if $sum - $total > $window;
		note("RESULT $name (lost server): total $total, committed $sum, lost "
			  . ($sum - $total) . " (bound $window)");
	}
	else
	{
		$n_surv++;
		$surv_sum += $sum;
		push @fails, "its key lives on a surviving server, yet its total $total is not the committed $sum"
		  if $total != $sum;
	}
	ok(!@fails, "counter $name " . ($lost{$name} ? 'on the lost server' : 'on a surviving server'))
	  or diag(join("\n", @fails));
}
note("RESULT counters on surviving servers: $n_surv, committed $surv_sum, all exact");
note("RESULT counters on the lost server: $n_lost, committed $lost_sum, counted $lost_total, lost "
	  . ($lost_sum - $lost_total));
ok($n_surv > 0 && $n_lost > 0, 'counters on both the lost and the surviving servers');
note("RESULT stats: $_") for split /\n/, sql(q{
SELECT kind || ' hits=' || sum(hits) || ' rebuilds=' || sum(rebuilds) || ' fallbacks=' || sum(fallbacks)
       || ' errors=' || sum(errors) || ' flushes=' || sum(flushes)
  FROM sharded_seq.memcached_stats GROUP BY kind ORDER BY kind});

# the keys have not moved (a counter with no key now, having had nothing
# since its last flush, has not moved)
my $after = where();
my @moved = grep { /^counter / && $after->{$_} =~ /^\d$/ && $after->{$_} ne $at->{$_} } keys %$after;
is("@moved", '', 'no counter key moved to another server');

done_testing();
