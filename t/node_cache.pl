# The node-wide sequence cache (preloaded; cache 'node', the default): S1,
# S2 and the order it adds.
#   1. Short connections one after the other: their values strictly
#      increase and follow each other, so N connections of one value each
#      spread over less than 2 blocks + N; none waits for a reservation.
#      The node cache counts are shown only to who may use the sequence.
#   2. One reservation shared by every waiter: a reservation held at wait
#      point node-cache-reserve while 6 sessions ask for their first value;
#      the 5 others wait for it on its lock (pg_locks) and then take the
#      next values of the one block reserved.
#   3. Load: long sessions (committed and rolled-back draws) and thousands
#      of short connections (pgbench -C), an immediate shutdown in the
#      middle, then alter_sequence and advance_sequence in the middle of
#      more; short connections one after the other between the steps.  No
#      value twice, each long session's values increasing, the sequential
#      connections' values increasing throughout, and every value drawn by a
#      connection that began after advance_sequence above its past.  A clean
#      restart burns at most two blocks (the rest of the block, and the
#      prefetched one).
#   4. A synchronous standby: while it confirms, connections one after the
#      other take consecutive values from the blocks it confirmed.  Then it is
#      promoted: the standby's WAL receiver is stopped
#      while sessions draw through the node cache, the primary crashes and
#      the standby is promoted; it must hand out none of the primary's
#      values (a block is used only once the standby confirmed it).
#   5. A node cache with room for 2 sequences, 3 drawn in turn: a sequence
#      that finds no room draws per session (counted), an idle entry goes to
#      the next sequence that needs one, and sessions whose entry went to
#      another sequence attach again; no value twice, each session's
#      increasing.
#   6. Synchronous standbys come into force after the node reserved a block:
#      the block was confirmed by no standby, so a new connection must not
#      take a value from it (it waits for the standby, which is down, and
#      times out) instead of handing out a value a promoted standby would
#      hand out again.
#   7. A configuration whose generation went back by hand: a block of the
#      older generation is not published; the session draws per session
#      rather than reserving block after block.
#   8. Block numbers wrap: values go on across the wrap, without gaps.
#   9. Runs: a transaction that draws alone takes 16 tickets with one add.
#      A value drawn by another session meanwhile lies above them (the rest
#      of the run is a gap) and ends the run: the first transaction's next
#      value is above that one.  A transaction that ends gives its run's rest
#      back, a value per transaction takes no run, alter_sequence ends a
#      run at once, and a run that holds the low-water mark asks for the
#      next block even if another session's draw ends it first.
#  10. A full node cache: the sweep that looks for an idle entry does not
#      take one a transaction draws from with a run (its state stays).
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

# the advisory lock class of a sequence's node cache reservation
# (SHARDED_SEQ_LOCK_CLASS, id, 3)
use constant LOCK_CLASS => 0x53534551;

my $node = ssq_node('main', preload => 1);
worker_settled($node, 'stress');
$node->safe_psql('stress', q{
SELECT sharded_seq.create_sequence('s', shards => 4, block => 100);
SELECT sharded_seq.create_sequence('w', shards => 4, block => 100);
CREATE TABLE short_drawn (v bigint);
});

sub sql { return $node->safe_psql('stress', $_[0]); }

# sequential(N, SEQ): N connections one after the other, a value each
sub sequential
{
	my ($n, $seq) = @_;
	return map { sql("SELECT sharded_nextval('$seq')") } 1 .. $n;
}

sub increasing
{
	my @v = @_;
	for my $i (1 .. $#v)
	{
		return "$v[$i] after $v[$i - 1]" if $v[$i] <= $v[ $i - 1 ];
	}
	return '';
}

sub stats
{
	my ($seq) = @_;
	return sql("SELECT cache_in_force || ' hits=' || node_cache_hits || ' reservations='
	              || node_cache_reservations || ' waits=' || node_cache_waits || ' full=' || node_cache_full
	              FROM sharded_seq.sequences WHERE name = '$seq'");
}

# ---- 1. short connections one after the other ----
my @first = sequential(250, 's');
is(increasing(@first), '', '250 sequential connections: each value above the one before');
my $spread = $first[-1] - $first[0] + 1;
note("RESULT 250 one-value connections spread over $spread values (block 100); " . stats('s'));
cmp_ok($spread, '<=', 2 * 100 + 250, 'their values spread over at most 2 blocks + 250');
is(sql("SELECT cache_in_force FROM sharded_seq.sequences WHERE name = 's'"), 'node',
	'the sequence is drawn through the node cache');
# like the positions: how fast others draw is shown only to who may use it
sql("CREATE ROLE nc_stranger; CREATE ROLE nc_app");
sql("SELECT sharded_seq.grant_sequence('s', 'nc_app')");
my $counts = "SELECT coalesce(node_cache_hits::text, 'null') || ' ' || coalesce(node_cache_reservations::text, 'null')
	|| ' ' || coalesce(node_cache_waits::text, 'null') || ' ' || coalesce(node_cache_full::text, 'null')";
is(sql("SET ROLE nc_stranger; $counts FROM sharded_seq.sequences WHERE name = 's'"), 'null null null null',
	'the view shows no node cache counts to a role without usage');
my $s_id = sql("SELECT id FROM sharded_seq.sequence_config WHERE name = 's'");
is(sql("SET ROLE nc_stranger; $counts FROM sharded_seq.sequence_cache($s_id, 'database', 'node')"),
	'null null null null', '... nor does the function behind it');
like(sql("SET ROLE nc_app; $counts FROM sharded_seq.sequences WHERE name = 's'"), qr/^[1-9]\d* [1-9]\d* \d+ \d+$/,
	'usage shows them');

# the node's block is left at once for a newer generation: a connection that
# begins after advance_sequence or alter_sequence draws above what they start at
sql("SELECT sharded_seq.advance_sequence('s', 1000000)");
my ($advanced) = sequential(1, 's');
cmp_ok($advanced, '>', 1000000, 'the first connection after advance_sequence draws above its past');
my $hw = sql("SELECT reserved_high_water FROM sharded_seq.sequences WHERE name = 's'");
sql("SELECT sharded_seq.alter_sequence('s', block => 50)");
my ($altered) = sequential(1, 's');
cmp_ok($altered, '>', $hw, 'the first connection after alter_sequence draws above everything reserved');
push @first, $advanced, $altered;

# ---- 2. one reservation for every waiter ----
my $hold = wait_point_hold($node, 'stress', 'node-cache-reserve');
my $burst = load_start($node, 'stress', 'burst', ("SELECT sharded_nextval('w');\n") x 6);
my $reserver = wait_point_reached($node, 'stress', 'node-cache-reserve');
my $waiting = "SELECT count(*) FROM pg_catalog.pg_locks l JOIN sharded_seq.sequence_config c
                 ON l.objid = c.id::oid AND c.name = 'w'
                WHERE l.locktype = 'advisory' AND l.classid = " . LOCK_CLASS . "::oid
                  AND l.objsubid = 3 AND NOT l.granted";
ok($node->poll_query_until('stress', "SELECT ($waiting) = 5"),
	'5 sessions wait on the reservation lock while one reserves');
wait_point_release($hold);
load_finish($burst);
my @burst = sort { $a <=> $b } map { $_->{out} =~ /^(\d+)$/mg } @$burst;
is("@burst", '1 2 3 4 5 6', 'the 6 sessions took the first 6 values of the one block reserved');
is(sql("SELECT node_cache_reservations || '/' || node_cache_waits FROM sharded_seq.sequences WHERE name = 'w'"),
	'1/5', 'one reservation, 5 callers waited for it');
note('RESULT burst of 6 first calls: ' . stats('w'));

# ---- 3. load, an immediate shutdown, alter and advance ----
my $dir = $PostgreSQL::Test::Utils::tmp_check;
PostgreSQL::Test::Utils::append_to_file("$dir/short.pgbench",
	"INSERT INTO short_drawn VALUES (sharded_nextval('s'));\n");

sub short_connections
{
	my ($n, $log) = @_;
	return IPC::Run::start(
		[
			$node->installed_command('pgbench'), '-n', '-C', '-c', '4', '-j', '2',
			'-t', int($n / 4), '-f', "$dir/short.pgbench", $node->connstr('stress')
		],
		'>', $log, '2>&1');
}

# a long session: transactions of a few draws, a fifth rolled back
sub long_script
{
	my ($tag, $seed) = @_;
	srand($seed);
	my $sql = '';
	for (1 .. 20000)
	{
		$sql .= stop_point($tag) if $_ % 50 == 0;
		my $end = rand(5) < 1 ? 'ROLLBACK' : 'COMMIT';
		$sql .= "BEGIN; SELECT sharded_nextval('s') FROM generate_series(1, " . (1 + int(rand(4))) . "); $end;\n";
	}
	return $sql;
}

my @long;
my @seq_all = @first;
my $short_total = 0;

# 3a. the load, cut off by an immediate shutdown.  The long sessions start
# once the short connections are under way (these need far longer to draw a
# value each), so that both are still running when the server stops.
my $p1 = short_connections(2000, "$dir/pgbench1.log");
$node->poll_query_until('stress', 'SELECT count(*) >= 600 FROM short_drawn')
  or die 'the short connections did not start';
my $l1 = load_start($node, 'stress', 'long1', map { long_script('l1', $_) } 1 .. 3);
load_progress($l1, 300);
push @seq_all, sequential(10, 's');
$node->stop('immediate');
$p1->finish;
is(load_cut_off($l1), 3, 'the immediate shutdown cut the long sessions off');
push @long, map { $_->{out} } @$l1;
$node->start;
my $cut = sql('SELECT count(*) FROM short_drawn');
note("RESULT $cut short connections committed their value before the immediate shutdown");
push @seq_all, sequential(10, 's');

# 3b. more load; the layout changes, then the sequence is advanced.  The
# short connections run until 100 of them drew after the advance (they are
# stopped then: a fixed count of them either ended before the advance or
# went on long after it)
my $l2 = load_start($node, 'stress', 'long2', map { long_script('l2', $_) } 4 .. 6);
my $p2 = short_connections(100000, "$dir/pgbench2.log");
load_progress($l2, 300);
my $at_alter = sql('SELECT count(*) FROM short_drawn');
sql("SELECT sharded_seq.alter_sequence('s', shards => 3, block => 37)");
push @seq_all, sequential(10, 's');
load_progress($l2, 600);
$node->poll_query_until('stress', "SELECT count(*) > $at_alter FROM short_drawn")
  or die 'the short connections stalled';
sql("SELECT sharded_seq.advance_sequence('s', 50000000)");
my $at_advance = sql('SELECT count(*) FROM short_drawn');
my @after_advance = sequential(10, 's');
push @seq_all, @after_advance;
my $below = grep { $_ <= 50000000 } @after_advance;
is($below, 0, 'connections that began after advance_sequence drew above its past');
$node->poll_query_until('stress', "SELECT count(*) >= $at_advance + 100 FROM short_drawn")
  or die 'the short connections stalled';
$p2->signal('INT');
$p2->finish;
note('RESULT short connections: ' . ($at_advance - $at_alter)
	  . ' drew between the alter and the advance, at least 100 after it');
stop_load($node, 'stress', 'l2');
load_finish($l2);
is(join('', map { $_->{err} } @$l2), '', 'the long sessions got no error');
push @long, map { $_->{out} } @$l2;
$short_total = sql('SELECT count(*) FROM short_drawn');
cmp_ok($short_total, '>=', $at_advance + 100, "$short_total short connections drew a value each");

note('RESULT load: ' . stats('s'));

# 3c. a clean restart burns at most the rest of the block and the prefetched one
my @before_restart = sequential(3, 's');
$node->restart;
my @after_restart = sequential(3, 's');
push @seq_all, @before_restart, @after_restart;
my $restart_gap = $after_restart[0] - $before_restart[-1];
# burned: the values between the last before and the first after that nobody
# handed out (a long session that drew blocks of its own, as one does when
# its value from the node would not be above its last, handed some out)
my %handed = map { $_ => 1 } (map { /^(\d+)$/mg } @long), @seq_all,
  split(/\n/, sql('SELECT v FROM short_drawn'));
my $burned = grep { !$handed{$_} } $before_restart[-1] + 1 .. $after_restart[0] - 1;
note("RESULT a clean restart: the next value came $restart_gap after the last, $burned values between burned (block 37)");
note("before @before_restart after @after_restart");
cmp_ok($burned, '<=', 2 * 37, 'a clean restart burned at most two blocks');

is(increasing(@seq_all), '', scalar(@seq_all)
	  . ' sequential connections across the shutdown, alter and advance: each value above the one before');
my @short = split /\n/, sql('SELECT v FROM short_drawn');
values_check('long sessions, short connections (one value each) and sequential connections',
	@long, map { [$_] } @short, @seq_all);

# ---- 4. a synchronous standby promoted ----
my $primary = ssq_node(
	'primary',
	preload => 1,
	allows_streaming => 1,
	conf => "synchronous_commit = on\nwal_sender_timeout = 0\nrestart_after_crash = on\n");
# one shard, blocks of 20: a WAL record of the shard reserves 32 blocks
# ahead, so the stalled sessions ask for far more than that (the test would
# not bite otherwise: the standby knows the blocks a record reserved ahead)
$primary->safe_psql('stress', "SELECT sharded_seq.create_sequence('f', shards => 1, block => 20)");
my $standby = sync_standby($primary);

my @pvals = map { $primary->safe_psql('stress', "SELECT sharded_nextval('f')") } 1 .. 30;
# blocks the standby confirmed serve every connection: none burns a block
is(increasing(@pvals), '', '30 connections with the standby in sync: each value above the one before');
is($pvals[-1] - $pvals[0] + 1, 30, '... and they follow each other (blocks of 20): no block burned per connection');
my @sessions = map { $primary->background_psql('stress', on_error_stop => 0) } 1 .. 4;
my %got;
for my $i (0 .. $#sessions)
{
	# an open transaction: a result comes back without waiting for a commit
	$sessions[$i]->query_safe("SET application_name = 'f$i'; BEGIN");
	$got{$i} = $sessions[$i]->query_safe("SELECT sharded_nextval('f') FROM generate_series(1, 5)");
}
$primary->safe_psql('stress', 'CHECKPOINT');
$primary->wait_for_catchup($standby, 'flush', $primary->lsn('flush'));
my $walrcv = $standby->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
ok($walrcv, 'the standby has a WAL receiver');
kill 'STOP', $walrcv;
for my $i (0 .. $#sessions)
{
	my $out = $sessions[$i]->query_until(qr/^sent\n/m,
		"\\echo sent\nSELECT sharded_nextval('f') FROM generate_series(1, 400);\n");
	$got{$i} .= "\n$out";
}
ok( $primary->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name ~ '^f[0-9]\$' AND state = 'active'
		    AND wait_event IS DISTINCT FROM 'SyncRep' AND wait_event_type IS DISTINCT FROM 'Lock'"),
	'with the standby stalled, the sessions wait for a confirmed block (or its lock)');
note('RESULT stalled: ' . $primary->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE wait_event = 'SyncRep') || ' waiting for the standby, '
	        || count(*) FILTER (WHERE wait_event_type = 'Lock') || ' for the reservation'
	   FROM pg_stat_activity WHERE application_name ~ '^f[0-9]\$'"));
$primary->stop('immediate');
kill 'KILL', $walrcv;
kill 'CONT', $walrcv;
for my $i (0 .. $#sessions)
{
	eval { $sessions[$i]->{run}->finish; };
	$got{$i} .= "\n" . $sessions[$i]{stdout};
}
$standby->poll_query_until('postgres', 'SELECT true');
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the standby was promoted');

my @pre = (@pvals, map { /^(\d+)$/mg } values %got);
my ($max_pre) = sort { $b <=> $a } @pre;
my @post;
while (!@post || $post[-1] <= $max_pre)
{
	push @post, map { $standby->safe_psql('stress', "SELECT sharded_nextval('f')") } 1 .. 20;
	push @post, split /\n/, $standby->safe_psql('stress',
		"SELECT sharded_nextval('f') FROM generate_series(1, 200)");
}
my %seen = map { $_ => 1 } @pre;
my $reissued = grep { $seen{$_} } @post;
note('RESULT failover: ' . scalar(@pre) . " values drawn on the primary (up to $max_pre), "
	  . scalar(@post) . " on the promoted standby, $reissued of them handed out again");
is($reissued, 0, 'the promoted standby handed out none of the primary\'s values');
values_check('the primary\'s sessions and connections', [@pvals], map { $got{$_} } sort keys %got);

# ---- 5. a full node cache ----
# small_cache(NAME, BLOCK): a node with room for 2 sequences, and 3 of them
sub small_cache
{
	my ($name, $block) = @_;
	my $n = ssq_node($name, preload => 1, conf => "sharded_seq.node_cache_sequences = 2\n");
	$n->safe_psql('stress', join('', map { "SELECT sharded_seq.create_sequence('$_', block => $block);\n" } qw(a b c)));
	return $n;
}
my $small = small_cache('small', 10);
sub ssql { return $small->safe_psql('stress', $_[0]); }
sub cache_rows
{
	return ssql("SELECT string_agg(name || ':' || cache_in_force || ' full=' || node_cache_full
	               || ' reservations=' || node_cache_reservations, ', ' ORDER BY name) FROM sharded_seq.sequences");
}
ssql("SELECT sharded_nextval('a'), sharded_nextval('b')");
ssql("SELECT sharded_nextval('c')");
like(cache_rows(), qr/^a:node full=0 reservations=1, b:node full=0 reservations=1, c:session full=1 reservations=0$/,
	'the third sequence found no room and drew per session');
# the sweep that found no room noted a's and b's positions; neither moved since
ssql("SELECT sharded_nextval('c')");
like(cache_rows(), qr/c:node full=1 reservations=1$/,
	'an entry idle since the last sweep went to the sequence that needed one');

# three sessions draw the three in turn, in different orders
my @order = (('a') x 6, ('b') x 6, ('c') x 6);
my @orders = ([@order], [ reverse @order ], [ map { ($_) x 6 } qw(b c a) ]);
my @turn = parallel_psql($small, 'stress',
	map { [ map { "SELECT sharded_nextval('$_') FROM generate_series(1, 25)" } @$_ ] } @orders);
note('RESULT a node cache with room for 2 sequences, 3 drawn in turn: ' . cache_rows());
my %per;
for my $i (0 .. $#orders)
{
	my @lines = split /\n/, $turn[$i];
	for my $k (0 .. $#{ $orders[$i] })
	{
		push @{ $per{ $orders[$i][$k] }[$i] }, @lines[ $k * 25 .. $k * 25 + 24 ];
	}
}
values_check("sequence $_ drawn through a full node cache", @{ $per{$_} }) for qw(a b c);

# ---- 6. synchronous standbys come into force after a block was reserved ----
my $syncn = ssq_node('syncn', preload => 1, allows_streaming => 1);
$syncn->safe_psql('stress', "SELECT sharded_seq.create_sequence('y', block => 1000)");
is($syncn->safe_psql('stress', "SELECT sharded_nextval('y')"), '1',
	'the node reserved a block with no synchronous standby named');
$syncn->safe_psql('postgres',
	"ALTER SYSTEM SET synchronous_standby_names = 's1'; SELECT pg_reload_conf()");
# in force once a commit waits for the standby (s1 never connects); the
# waiting backend is let go afterwards
my $in_force = 0;
for my $i (1 .. 60)
{
	$syncn->psql('postgres', "CREATE TABLE in_force_$i ()", timeout => 1, timed_out => \my $timed_out);
	$in_force = $syncn->safe_psql('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'") eq 't';
	last if $in_force;
}
$syncn->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
ok($in_force, 'synchronous standbys are in force');
my @handed;
for (1 .. 3)
{
	my ($rc, $out, $err) = $syncn->psql('stress',
		"SET statement_timeout = '2s'; SELECT sharded_nextval('y')");
	push @handed, $out if $out =~ /^\d+$/;
}
is("@handed", '', 'new connections take no value from the block the standby never confirmed');
$syncn->stop('immediate');

# ---- 7. a hand-edited configuration with an older generation ----
my $gen = ssq_node('gen', preload => 1);
$gen->safe_psql('stress', q{
SELECT sharded_seq.create_sequence('g', shards => 1, block => 10);
SELECT sharded_nextval('g');
SELECT sharded_seq.alter_sequence('g', block => 11);
SELECT sharded_nextval('g');
});
# the generation goes back by hand: the node's entry is of a newer one
$gen->safe_psql('stress', q{
UPDATE sharded_seq.sequence_config SET generation = generation - 1, block = 10 WHERE name = 'g'});
my @g = split /\n/, $gen->safe_psql('stress', "SELECT sharded_nextval('g') FROM generate_series(1, 30)");
is(scalar(@g), 30, 'a session drew 30 values under the hand-edited generation');
cmp_ok($gen->safe_psql('stress', "SELECT node_cache_reservations FROM sharded_seq.sequences WHERE name = 'g'"),
	'<', 10, 'a block of the older generation is not reserved again and again');
$gen->stop;

# ---- 8. block numbers wrap (the state keeps 24 bits of them) ----
# A test-build setting starts every entry 6 blocks before the wrap.
my $wrap = ssq_node('wrap', preload => 1,
	conf => "sharded_seq.test_node_first_block = " . ((1 << 24) - 6) . "\n");
sub wsql { return $wrap->safe_psql('stress', $_[0]); }
wsql("SELECT sharded_seq.create_sequence('wr', shards => 1, block => 10)");
my @w = split /\n/, wsql("SELECT sharded_nextval('wr') FROM generate_series(1, 200)");
is(increasing(@w), '', 'one session drew 200 values across the wrap of block numbers, increasing');
is($w[-1] - $w[0] + 1, 200, '... with no gap: every block after the wrap was served');
my @wc = map { wsql("SELECT sharded_nextval('wr')") } 1 .. 30;
is(increasing(@w, @wc), '', '30 connections after the wrap: each value above the one before');
cmp_ok($wc[-1] - $w[0] + 1, '<=', 230 + 2 * 10, '... and they burn no block each');
my $whits = wsql("SELECT node_cache_hits FROM sharded_seq.sequences WHERE name = 'wr'");
note("RESULT across the wrap of block numbers: values $w[0]..$wc[-1], node cache hits $whits");
cmp_ok($whits, '>=', 200, 'the node cache kept serving after the wrap');
$wrap->stop;

# ---- 9. runs: a transaction that draws alone takes 16 tickets with one add ----
# Section header at the top.  Counts are exact: after 16 adds in a row in
# one transaction that found the state where its last one left it, every
# add takes 16 tickets, so a transaction that drew 100 values alone holds 13
# (its first add finds nothing of its own: 17 single, then 83 from runs).
sql("SELECT sharded_seq.create_sequence('r', shards => 2, block => 1000)");
my $alone = $node->background_psql('stress');
sub alone_draw { return bg_query($alone, "SELECT max(v) FROM (SELECT sharded_nextval('r') v FROM generate_series(1, $_[0])) x"); }
$alone->query_safe('BEGIN');
my $a1 = alone_draw(100);
my $b1 = sql("SELECT sharded_nextval('r')");
cmp_ok($b1, '>', $a1, 'a value drawn while a transaction holds a run lies above the run\'s values');
is($b1 - $a1 - 1, 13, '... the 13 tickets left of the run are a gap');
my $a2 = alone_draw(1);
cmp_ok($a2, '>', $b1, 'the transaction that held the run draws again: above the other session\'s value (its run ended)');
my $a3 = alone_draw(100);
$alone->query_safe('COMMIT');
my $c1 = sql("SELECT sharded_nextval('r')");
is(increasing($a1, $b1, $a2, $a3, $c1), '', 'the values so far follow draw order');
is($c1, $a3 + 1, 'a transaction that held a run and ended burns nothing: the next value follows its last');
# a session that draws a value per transaction takes no run: no gap for others
my @single = map { scalar(alone_draw(1)) } 1 .. 40;
my $c2 = sql("SELECT sharded_nextval('r')");
is($c2, $single[-1] + 1, '40 transactions of one value each in one session: the next session\'s value follows');
# a new generation ends a run at once
$alone->query_safe('BEGIN');
my $a4 = alone_draw(100);
sql("SELECT sharded_seq.alter_sequence('r', shards => 3)");
my $a5 = alone_draw(1);
cmp_ok($a5, '>', $a4 + 15, 'after alter_sequence the transaction holding a run draws from the new generation, not its run');
my $c3 = sql("SELECT sharded_nextval('r')");
cmp_ok($c3, '>', $a5, '... and a new connection then draws above it');
$alone->query_safe('COMMIT');
# a run that holds the block's low-water mark asks for the next block when
# it is taken: here another session's draw ends it before the mark (offset
# 499 of 1000) is handed out.  498 draws: 17 single, then runs of 16 from
# offset 17, the last one taken at offset 497.
sql("SELECT sharded_seq.create_sequence('m', shards => 1, block => 1000)");
$alone->query_safe('BEGIN');
my $m1 = bg_query($alone, "SELECT max(v) - min(v) + 1 FROM (SELECT sharded_nextval('m') v FROM generate_series(1, 498)) x");
my $m2 = sql("SELECT sharded_nextval('m')");
is($m1, 498, 'a transaction drew 498 values of a fresh sequence alone');
cmp_ok($m2, '>', 500, '... another session\'s value ended its run past the low-water mark');
ok($node->poll_query_until('stress', "SELECT node_cache_reservations >= 2 FROM sharded_seq.sequences WHERE name = 'm'"),
	'the next block was reserved although nobody handed out the mark');
$alone->query_safe('COMMIT');
$alone->quit;

# ---- 10. the sweep leaves an entry a run draws from ----
# Room for 2 sequences.  A transaction draws 'a' from a run, which leaves
# the state where it was; meanwhile two sweeps pass (new connections asking
# room for 'c'): the second must take 'b', idle, and not 'a'.
my $sw = small_cache('sweep', 1000);
sub swsql { return $sw->safe_psql('stress', $_[0]); }
my $runner = $sw->background_psql('stress');
sub run_draw { return scalar(bg_query($runner, "SELECT max(v) FROM (SELECT sharded_nextval('a') v FROM generate_series(1, $_[0])) x")); }
$runner->query_safe('BEGIN');
my $s1 = run_draw(20);		# 17 single, 3 of a run of 16
swsql("SELECT sharded_nextval('b')");
swsql("SELECT sharded_nextval('c')");	# the first sweep notes a's and b's states
my $s2 = run_draw(1);		# from the run: a's state stays
swsql("SELECT sharded_nextval('c')");	# the second sweep
my $s3 = run_draw(1);
$runner->query_safe('COMMIT');
$runner->quit;
is("$s2 $s3", ($s1 + 1) . ' ' . ($s1 + 2), 'a transaction drawing from a run keeps its entry: the sweep took the idle one');
like(swsql("SELECT string_agg(name || ':' || cache_in_force, ' ' ORDER BY name) FROM sharded_seq.sequences"),
	qr/^a:node b:\w+ c:node$/, '... and the third sequence has a node cache entry now');
$sw->stop;

done_testing();
