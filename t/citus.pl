# Citus (issue 23): a coordinator and two workers on loopback, Citus built
# from ../shared/citus by scripts/setup.sh (PostgreSQL 15 only; elsewhere,
# or without the sources, this test skips).  It checks:
#  - node ids from Citus groups (group g is node g), and a setting that
#    disagrees refused;
#  - administration on the coordinator reaching every node in its
#    transaction (create, alter, advance, grant, drop, a rollback), and
#    refused on a worker;
#  - sharded_nextval wherever Citus evaluates it: the coordinator, a worker a
#    client writes to, a repartitioned INSERT ... SELECT; sessions on every
#    node at once, some rolled back, never draw one value twice (S1) and
#    each session's values increase (S2);
#  - counters: each node writes only its own rows (a trigger on a
#    distributed table counts where the shard is), every node reads the
#    exact total over the cluster, sessions on every node at once; a
#    counting trigger on a reference table refused;
#  - a worker added mid-test takes every definition before its first use,
#    and later changes; a worker removed after move_node_counts loses no
#    count, and leaves the others working.
use strict;
use warnings;

use ShardedSeq::Node;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $libdir = `pg_config --pkglibdir`;
chomp $libdir;
plan skip_all => "Citus is not installed for this PostgreSQL ($libdir/citus.so): scripts/citus.sh builds it from ../shared/citus, for PostgreSQL 15 only, and says why it did not"
  unless -f "$libdir/citus.so";

my $db = 'app';

# a node with Citus and sharded_seq preloaded (Citus first), database app
# holding the citus extension
sub citus_node
{
	my ($name) = @_;
	my $node = ssq_node(
		$name,
		start => 0,
		conf => "shared_preload_libraries = 'citus,sharded_seq'\n"
		  . "max_prepared_transactions = 100\n"
		  . "citus.max_cached_conns_per_worker = 4\n");
	# Citus's loopback connections (copying reference tables) go there too
	$node->append_conf('postgresql.conf', "citus.local_hostname = '" . $node->host . "'\n");
	$node->start;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION citus');
	return $node;
}

# Citus reaches every node through its socket directory and port
sub add_node
{
	my ($coordinator, $node) = @_;
	$coordinator->safe_psql($db,
		"SELECT citus_add_node('" . $node->host . "', " . $node->port . ')');
	return;
}

# sessions_everywhere(NODES, PER_NODE, MAKE): PER_NODE sessions on each node
# at once; session i runs the statements MAKE->(i) returns (one psql -c
# each); waits for all.  Returns the outputs and the errors of the sessions
# that failed.
sub sessions_everywhere
{
	my ($nodes, $per_node, $make) = @_;
	my (@runs, @outs, @errs);
	for my $node (@$nodes)
	{
		for (1 .. $per_node)
		{
			my $i = scalar @runs;
			($outs[$i], $errs[$i]) = ('', '');
			push @runs,
			  IPC::Run::start(
				[
					$node->installed_command('psql'), '-XAtq', '-v',
					'ON_ERROR_STOP=1', '-d', $node->connstr($db),
					map { ('-c', $_) } $make->($i)
				],
				'>', \$outs[$i], '2>', \$errs[$i]);
		}
	}
	my @failed = grep { !$runs[$_]->finish } 0 .. $#runs;
	return (\@outs, join('', map { $errs[$_] } @failed));
}

my $c = citus_node('coordinator');
my @w = map { citus_node("worker$_") } 1 .. 2;
$c->safe_psql($db,
	"SELECT citus_set_coordinator_host('" . $c->host . "', " . $c->port . ')');
add_node($c, $_) for @w;
$c->safe_psql($db, 'CREATE EXTENSION sharded_seq');
$c->safe_psql($db, 'CREATE ROLE alice; CREATE ROLE bob');

# ---- node ids from Citus groups
is(join(',', map { $_->safe_psql($db, 'SELECT sharded_seq.node_id()') } $c, @w),
	'0,1,2', 'each node takes its node id from its Citus group');

# ---- administration reaches every node, in the coordinator's transaction
$c->safe_psql(
	$db, q{
SELECT sharded_seq.create_sequence('orders_id', block => 200);
SELECT sharded_seq.create_counter('hits');
SELECT sharded_seq.grant_sequence('orders_id', 'alice');
SELECT sharded_seq.create_sequence('short_lived');
SELECT sharded_seq.drop_sequence('short_lived');
SELECT sharded_seq.alter_sequence('orders_id', block => 100);
});
my ($rc, $out, $err) = $c->psql($db,
	"BEGIN; SELECT sharded_seq.create_sequence('rolled_back'); SELECT sharded_seq.create_counter('rolled_back_too'); ROLLBACK;"
);

my $definitions = q{
SELECT string_agg(format('%s %s %s %s %s %s %s', name, shards, block, tier, cache, owner, acl), '; ' ORDER BY name)
  FROM sharded_seq.sequence_config;
SELECT string_agg(format('%s %s %s %s', name, mode, owner, acl), '; ' ORDER BY name)
  FROM sharded_seq.counter_config;
};
my $expected = $c->safe_psql($db, $definitions);
like($expected, qr/^orders_id 4 100 database node postgres \{postgres=rwU\/postgres,alice=U\/postgres\}\nhits exact postgres $/,
	'the coordinator has what it was told (and no rolled-back or dropped object)');
is($_->safe_psql($db, $definitions), $expected,
	'a worker has the same definitions, grants included') for @w;

($rc, $out, $err) = $w[0]->psql($db, "SELECT sharded_seq.create_sequence('on_a_worker')");
like($err, qr/administration runs on the Citus coordinator.*\n.*group 1.*\n.*HINT:  Run it on the coordinator/,
	'a worker refuses administration, with a hint');
($rc, $out, $err) = $w[0]->psql($db, "SELECT sharded_seq.alter_sequence('orders_id', block => 7)");
ok($rc != 0 && $w[0]->safe_psql($db, "SELECT block FROM sharded_seq.sequence_config WHERE name = 'orders_id'") == 100,
	'a refused change on a worker leaves its definition as it was');

# a node that fails the call fails the coordinator's transaction: a role
# that Citus did not create on the workers
$c->safe_psql($db,
	'SET citus.enable_create_role_propagation = off; CREATE ROLE carol');
my $acl = "SELECT acl FROM sharded_seq.sequence_config WHERE name = 'orders_id'";
my $acl_before = $c->safe_psql($db, $acl);
($rc, $out, $err) = $c->psql($db, "SELECT sharded_seq.grant_sequence('orders_id', 'carol')");
like($err, qr/role "carol" does not exist/, 'a call that fails on a worker fails on the coordinator');
is(join(' ', map { $_->safe_psql($db, $acl) } $c, @w), join(' ', ($acl_before) x 3),
	'... and changes nothing on any node');

# a counter a worker has already (made there before it joined, here by
# hand) is kept when the coordinator creates one of that name
$w[1]->safe_psql($db,
	"INSERT INTO sharded_seq.counter_config (id, name, shards, mode, owner) VALUES (99999, 'clash', 1, 'exact', 'postgres')");
($rc, $out, $err) = $c->psql($db, "SELECT sharded_seq.create_counter('clash')");
like($err, qr/counter "clash" exists on this node already \(Citus group 2\): it is kept/,
	"a creation that meets a worker's own object of that name keeps it, and says so");
is(join(',', map { $_->safe_psql($db, "SELECT count(*) FROM sharded_seq.counter_config WHERE name = 'clash'") } $c, @w)
	  . ' ' . $w[1]->safe_psql($db, "SELECT id FROM sharded_seq.counter_config WHERE name = 'clash'"),
	'1,1,1 99999', '... and every other node has it');

# ---- sharded_nextval wherever Citus evaluates it
$c->safe_psql(
	$db, q{
CREATE TABLE orders (customer int, id bigint NOT NULL DEFAULT sharded_nextval('orders_id'), v int, PRIMARY KEY (customer, id));
SELECT create_distributed_table('orders', 'customer');
INSERT INTO orders (customer, v) SELECT g % 40, g FROM generate_series(1, 400) g;
-- repartitioned: the workers evaluate the default on their shards
INSERT INTO orders (customer, v) SELECT customer + 1, v FROM orders;
});
is($c->safe_psql($db, 'SELECT count(*) = count(DISTINCT id) AND count(*) = 800 FROM orders'),
	't', 'a repartitioned INSERT ... SELECT draws distinct values');
is($c->safe_psql($db, 'SELECT string_agg(DISTINCT (id >> 53)::text, \',\' ORDER BY (id >> 53)::text) FROM orders'),
	'0,1,2', '... drawn on the coordinator and on each worker, each in its own range');
is($w[0]->safe_psql($db, "INSERT INTO orders (customer, v) VALUES (7, 1) RETURNING id >> 53"),
	'1', 'an insert sent to a worker draws there');

# COPY, through the coordinator and sent to a worker
$c->safe_psql($db, "COPY orders (customer, v) FROM STDIN;\n5\t-4\n6\t-3\n\\.\n");
$w[1]->safe_psql($db, "COPY orders (customer, v) FROM STDIN;\n5\t-2\n6\t-1\n\\.\n");
is($c->safe_psql($db, "SELECT string_agg((id >> 53)::text, ',' ORDER BY v) FROM orders WHERE v < 0"),
	'0,0,2,2', 'COPY draws on the node the client copies to');

# advance_sequence reaches every node; each advances within its own range
my $past = $w[0]->safe_psql($db, "SELECT (1::bigint << 53) + 5000000");
$c->safe_psql($db, "SELECT sharded_seq.advance_sequence('orders_id', $past)");
ok($w[0]->safe_psql($db, "SELECT sharded_nextval('orders_id') > $past") eq 't'
	  && $c->safe_psql($db, "SELECT sharded_nextval('orders_id') >> 53") eq '0',
	'advance_sequence past a value of worker 1 moves worker 1 past it, and the coordinator stays in its range');

# sessions on every node at once, each committing some inserts and rolling
# back others; every value drawn (kept or not) comes back from RETURNING
my $per_session = 15;
my ($outs, $failures) = sessions_everywhere(
	[ $c, @w ], 2,
	sub {
		my ($i) = @_;
		my @cmds;
		for my $k (1 .. $per_session)
		{
			my $ins = "INSERT INTO orders (customer, v) SELECT g % 97, $i FROM generate_series(1, 20) g RETURNING 'S$i', $k, id";
			push @cmds, $k % 5 == 0 ? ('BEGIN', $ins =~ s/'S$i'/'R$i'/r, 'ROLLBACK') : ($ins);
		}
		return @cmds;
	});
is($failures, '', 'sessions on every node ran');
my (%seen, $dup, $order_bad, %kept);
for my $i (0 .. $#$outs)
{
	my (%lo, %hi);
	for my $line (split /\n/, $outs->[$i])
	{
		my ($tag, $k, $id) = split /\|/, $line;
		$dup++ if $seen{$id}++;
		$kept{$id} = 1 if $tag =~ /^S/;
		$lo{$k} = $id if !defined $lo{$k} || $id < $lo{$k};
		$hi{$k} = $id if !defined $hi{$k} || $id > $hi{$k};
	}
	# S2: each statement of a session draws above all its earlier ones (a
	# statement's rows come back in shard order, not in draw order)
	for my $k (2 .. $per_session)
	{
		$order_bad++ unless $lo{$k} > $hi{ $k - 1 };
	}
}
is($dup // 0, 0, 'no value drawn twice across the cluster, rolled-back draws included (S1)');
is($order_bad // 0, 0, "each session's values increase (S2)");
is($c->safe_psql($db, 'SELECT count(*) FROM orders WHERE v >= 0 AND v < 6 AND id = ANY (\'{' . join(',', keys %kept) . '}\')'),
	scalar(keys %kept), 'every committed insert is there');

# ---- rights hold on the workers
($rc, $out, $err) = $w[1]->psql($db, "SET ROLE bob; SELECT sharded_nextval('orders_id')");
like($err, qr/permission denied/, 'a worker refuses a role without the grant');
is($w[1]->safe_psql($db, "SET ROLE alice; SELECT sharded_nextval('orders_id') >> 53"),
	'2', 'a worker lets the granted role draw');

# ---- a setting that disagrees with Citus is refused
$w[0]->safe_psql($db, 'ALTER SYSTEM SET sharded_seq.node_id = 9; SELECT pg_reload_conf()');
$w[0]->poll_query_until($db, "SELECT current_setting('sharded_seq.node_id') = '9'")
  or die 'the reload was not seen';
($rc, $out, $err) = $w[0]->psql($db, "SELECT sharded_nextval('orders_id')");
like($err, qr/sharded_seq.node_id is 9, but this node is Citus group 1\n.*\n.*HINT:  Remove the setting.*or set it to 1/,
	'an explicit node id that disagrees with the Citus group is refused');
$w[0]->safe_psql($db, 'ALTER SYSTEM SET sharded_seq.node_id = 1; SELECT pg_reload_conf()');
$w[0]->poll_query_until($db, "SELECT current_setting('sharded_seq.node_id') = '1'")
  or die 'the reload was not seen';
is($w[0]->safe_psql($db, "SELECT sharded_nextval('orders_id') >> 53"), '1', 'one that agrees is taken');
$w[0]->safe_psql($db, 'ALTER SYSTEM RESET sharded_seq.node_id; SELECT pg_reload_conf()');

# ---- counters across nodes
$c->safe_psql($db, "SELECT sharded_seq.create_counter('bhits', mode => 'buffered')");
($rc, $out, $err) = $w[0]->psql($db, "SELECT counter_incr('nowhere')");
like($err, qr/counter "nowhere" does not exist.*\n.*Citus cluster.*\n.*HINT:  Create it on the coordinator/,
	'counter_incr does not create a counter in a cluster, and says where to');

# a trigger on a distributed table counts on the node that holds the shard
$c->safe_psql(
	$db, q{
CREATE TABLE events (customer int, v int);
SELECT create_distributed_table('events', 'customer');
CREATE FUNCTION count_event() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM counter_incr('hits'); RETURN NEW; END $$;
SET citus.enable_unsafe_triggers = on;
CREATE TRIGGER count_event AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION count_event();
INSERT INTO events SELECT g, g FROM generate_series(1, 20) g;
});
is(join(',', map { $_->safe_psql($db, "SELECT counter_value('hits')") } $c, @w),
	'20,20,20', 'a counting trigger on a distributed table: every node reads the total');
my @parts = map { $_->safe_psql($db, "SELECT sharded_seq.counter_node_value('hits')") } $c, @w;
ok($parts[1] > 0 && $parts[2] > 0 && $parts[0] + $parts[1] + $parts[2] == 20,
	"... counted on the workers that hold the shards (@parts)");

# a reference table's trigger would fire once per node: refused
$c->safe_psql(
	$db, q{
CREATE TABLE plans (id int PRIMARY KEY);
SELECT create_reference_table('plans');
SET citus.enable_unsafe_triggers = on;
CREATE TRIGGER count_plan AFTER INSERT ON plans FOR EACH ROW EXECUTE FUNCTION count_event();
});
($rc, $out, $err) = $c->psql($db, 'INSERT INTO plans VALUES (1)');
like($err, qr/counter_incr in a write to a Citus reference table would count once per node/,
	'a counting trigger on a reference table is refused, not multiplied');
is($c->safe_psql($db, "SELECT counter_value('hits') || ' ' || (SELECT count(*) FROM plans)"), '20 0',
	'... and nothing was written or counted');

# increments on every node at once, some rolled back; every node reads the
# exact committed total of both an exact and a buffered counter
(undef, $failures) = sessions_everywhere(
	[ $c, @w ], 2,
	sub {
		map {
			my $incr = "SELECT counter_incr('hits', $_), counter_incr('bhits', 2 * $_)";
			$_ % 4 == 0 ? ('BEGIN', $incr, 'ROLLBACK') : ($incr)
		} 1 .. 20;
	});
is($failures, '', 'increments on every node ran');
# per session: 1..20 less the multiples of 4 = 210 - 60 = 150; six sessions
my $committed = 6 * 150;
# a buffered read may miss an amount a flush moves at that moment (C2,
# docs/write-behind.md: the rows are read before the slot), on any node:
# each node must come to the exact totals, and no read may pass them
my $want = (20 + $committed) . '|' . (2 * $committed);
my $sql = "SELECT counter_value('hits') || '|' || counter_value('bhits')";
ok(!(grep { !$_->poll_query_until($db, $sql, $want) } $c, @w),
	'every node reads the exact committed total over the cluster (exact and buffered)');
ok(!(grep { my ($h, $b) = split /\|/, $_->safe_psql($db, $sql); $h != 20 + $committed || $b > 2 * $committed } $c, @w),
	'... and no read passes it');
is(join(',', map { $_->safe_psql($db, "SELECT count(*) FROM sharded_seq.counter_shards s JOIN sharded_seq.counter_config c ON c.id = s.counter_id WHERE c.name = 'hits' AND s.shard / 1024 <> sharded_seq.node_id()") } $c, @w),
	'0,0,0', "each node wrote only its own rows");

# a node that does not answer makes the total fail rather than be wrong; a
# session's kept connection to a node that restarted is opened again
my $kept = $c->background_psql($db, on_error_stop => 0);
is($kept->query_safe("SELECT counter_value('hits')"), 20 + $committed, 'a session reads the total');
$w[1]->stop('fast');
($rc, $out, $err) = $c->psql($db, "SELECT counter_value('hits')");
like($err, qr/could not connect to node .* of the Citus cluster.*\n.*\n.*HINT:  A total over every node needs every node/s,
	'counter_value fails while a node is down, and says which');
$w[1]->start;
# its connection to the node is gone: the first read fails, and drops it
$kept->query("SELECT counter_value('hits')");
like($kept->{stderr}, qr/did not answer|could not send/, 'a read over a broken kept connection fails');
# (query, not query_safe: the failed read's message may reach stderr late)
is($kept->query("SELECT counter_value('hits')"), 20 + $committed,
	'... and works again once it is back, in the same session');
# a node moved to another address (citus_update_node, as in a failover)
# keeps its node id: a kept connection to the old address is not the node
my $moved = ssq_node('moved', start => 0,
	conf => "shared_preload_libraries = 'sharded_seq'\nsharded_seq.node_id = 2\n");
$moved->start;
$moved->safe_psql('postgres', "CREATE DATABASE $db");
$moved->safe_psql($db, "CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_counter('hits'); SELECT counter_incr('hits', 1000)");
my $w2id = $c->safe_psql($db, 'SELECT nodeid FROM pg_dist_node WHERE nodeport = ' . $w[1]->port);
$c->safe_psql($db, "SELECT citus_update_node($w2id, '" . $moved->host . "', " . $moved->port . ')');
is($kept->query("SELECT counter_value('hits')") . ' ' . $c->safe_psql($db, "SELECT counter_value('hits')"),
	join(' ', ($committed + 20 - $w[1]->safe_psql($db, "SELECT sharded_seq.counter_node_value('hits')") + 1000) x 2),
	"a kept connection follows a node to its new address (citus_update_node), and reads the node there");
$c->safe_psql($db, "SELECT citus_update_node($w2id, '" . $w[1]->host . "', " . $w[1]->port . ')');
# the nodes' metadata, out of sync since the update to a server without Citus
$c->safe_psql($db, 'SELECT start_metadata_sync_to_all_nodes()');
$moved->stop;
$kept->quit;

($rc, $out, $err) = $w[0]->psql($db, "SELECT sharded_seq.set_counter('hits', 0)");
like($err, qr/cannot set a counter in a Citus cluster/, 'set_counter is refused in a cluster, saying why');

# ---- a worker added later
my $w3 = citus_node('worker3');
# a session that took its node id (0) before its node joined would share
# node 0's range with every such session of every node: refused
$w3->safe_psql($db, 'CREATE EXTENSION sharded_seq');
my $early = $w3->background_psql($db, on_error_stop => 0);
$early->query_safe('SELECT sharded_seq.node_id()');
add_node($c, $w3);
my ($early_out) = $early->query("SELECT sharded_nextval('orders_id') >> 53");
like($early->{stderr}, qr/this session took node id 0, but this node is now Citus group 3/,
	"a session opened before its node joined draws nothing from node 0's range (it drew '$early_out')");
$early->quit;
is($w3->safe_psql($db, "SELECT sharded_nextval('orders_id') >> 53, sharded_seq.node_id()"),
	"3|3", 'a worker added later takes the definition at its first use, and its own node id');
$c->safe_psql($db, "SELECT sharded_seq.alter_sequence('orders_id', block => 300); SELECT sharded_seq.create_sequence('after_add')");
is($w3->safe_psql($db, $definitions), $c->safe_psql($db, $definitions),
	'... and every change made since');
is($w3->safe_psql($db, "SELECT sharded_nextval('after_add') >> 53"), '3', '... and draws from a sequence made since');

# a new worker's replay racing the coordinator's changes: a change that
# arrives while the replay is uncommitted waits for it, and is not skipped
$c->safe_psql($db, "SELECT sharded_seq.create_sequence('race', block => 10); SELECT sharded_seq.grant_sequence('race', 'alice')");
my $w4 = citus_node('worker4');
# before it joins, the fourth worker draws from a sequence of its own, with
# its future group as its node id set by hand (the workaround before 1.6)
my $group4 = $c->safe_psql($db,
	'SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM pg_catalog.pg_dist_groupid_seq');
$w4->append_conf('postgresql.conf', "sharded_seq.node_id = $group4\n");
$w4->reload;
$w4->safe_psql($db, "CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_sequence('legacy', block => 10)");
my $legacy_max = $w4->safe_psql($db, "SELECT max(sharded_nextval('legacy')) FROM generate_series(1, 25)");
add_node($c, $w4);
$c->safe_psql($db, "SELECT sharded_seq.create_sequence('legacy', block => 10)");
is($w4->safe_psql($db, "SELECT sharded_nextval('legacy') > $legacy_max AND sharded_nextval('legacy') >> 53 = $group4"),
	't', "a worker's own sequence, met by the coordinator's creation, goes on above what it drew (S1)");
# an administrative call gives the new worker its copy of cluster_calls
$c->safe_psql($db, "SELECT sharded_seq.create_sequence('placed')");
my $puller = $w4->background_psql($db);
$puller->query_safe('BEGIN');
$puller->query_safe("SELECT sharded_nextval('race')");
# a second session's first use waits for the first one's replay, then finds
# the objects there
my $puller2 = $w4->background_psql($db, on_error_stop => 0);
$puller2->query_until(qr/sent/, "\\echo sent\nSELECT sharded_nextval('race') >> 53;\n");
$w4->poll_query_until($db, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)")
  or die 'the second session never waited';
my $changer = $c->background_psql($db);
$changer->query_until(qr/sent/,
	"\\echo sent\nSELECT sharded_seq.revoke_sequence('race', 'alice'); SELECT sharded_seq.alter_sequence('race', block => 77);\n");
# the change waits on the worker (or, unfixed, has committed)
$w4->poll_query_until($db,
	"SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'object' AND NOT granted) = 2 OR EXISTS (SELECT 1 FROM sharded_seq.cluster_calls WHERE name = 'race' AND n = 3)")
  or die 'the change never reached the new worker';
$puller->query_safe('COMMIT');
$changer->query_safe('SELECT 1');
$puller2->query('SELECT 1');
is($puller2->{stderr}, '', "a second session's first use on the new worker, at the same time, draws too");
$_->quit for $puller, $puller2, $changer;
my $race = "SELECT block || ' ' || acl::text FROM sharded_seq.sequence_config WHERE name = 'race'";
is($w4->safe_psql($db, $race), $c->safe_psql($db, $race),
	'a change made while a new worker replays is applied there too (a revoke is not lost)');

# a worker of a group past 1023 (Citus never gives a group id twice) has
# no node id: it draws nothing, and leaves the others' totals and
# administration working
my $total = $c->safe_psql($db, "SELECT counter_value('hits')");
$c->safe_psql($db, "SELECT setval('pg_catalog.pg_dist_groupid_seq', 1023)");
my $w5 = citus_node('worker5');
add_node($c, $w5);
($rc, $out, $err) = $w5->psql($db, "SELECT sharded_nextval('orders_id')");
like($err, qr/Citus group 1024 has no sharded_seq node id/, 'a worker of group 1024 draws nothing');
($rc, $out, $err) = $c->psql($db, "SELECT counter_value('hits')");
is("$out$err", $total, '... and every other node still reads the total');
($rc, $out, $err) = $c->psql($db, "SELECT sharded_seq.create_sequence('past_1023')");
is($rc . $err, '0', '... and administration still works');

# a coordinator restored from a dump (pg_dump keeps cluster_calls' rows)
# into a new cluster: its first administrative call makes the calls again
my $r = citus_node('restored');
$r->safe_psql($db, q{CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_sequence('r1');
INSERT INTO sharded_seq.cluster_calls (kind, name, n, op, made_by, call)
  VALUES ('sequence', 'r1', 1, 'create', 'postgres', 'SELECT sharded_seq.create_sequence(''r1'')')});
$r->safe_psql($db, "SELECT citus_set_coordinator_host('" . $r->host . "', " . $r->port . ')');
($rc, $out, $err) = $r->psql($db, "SELECT sharded_seq.create_sequence('r2')");
is($rc . $err, '0', 'a restored coordinator in a new cluster: its first administrative call works');
is($r->safe_psql($db, "SELECT string_agg(name || ' ' || n || ' ' || op, ', ' ORDER BY name, n) FROM sharded_seq.cluster_calls"),
	'r1 1 create, r2 1 create', '... and its calls are the definitions, once each');
$r->stop;

# ---- a worker removed, its counts moved first
$w3->safe_psql($db, "SELECT counter_incr('hits', 1000); SELECT counter_incr('bhits', 7)");
my $before = $c->safe_psql($db, "SELECT counter_value('hits') || ' ' || counter_value('bhits')");
like($before, qr/^1920 1807$/, 'the new worker counts too');
is($c->safe_psql($db, "SELECT string_agg(counter || '=' || moved, ' ' ORDER BY counter) FROM sharded_seq.move_node_counts('" . $w3->host . "', " . $w3->port . ')'),
	'bhits=7 hits=1000', "move_node_counts moves a worker's counts (its write-behind amounts flushed first)");
is($c->safe_psql($db, "SELECT counter_value('hits') || ' ' || counter_value('bhits')"), $before,
	'... and every total stays as it was');
is($w3->safe_psql($db, "SELECT sharded_seq.counter_node_value('hits') || ' ' || sharded_seq.counter_node_value('bhits')"),
	'0 0', "... with nothing left on the worker");
$c->safe_psql($db, "SELECT citus_remove_node('" . $w3->host . "', " . $w3->port . ')');
is($c->safe_psql($db, "SELECT counter_value('hits') || ' ' || counter_value('bhits')"), $before,
	'the worker left, and no count was lost');
$c->safe_psql($db, "SELECT sharded_seq.create_sequence('after_remove')");
is($w[1]->safe_psql($db, "SELECT sharded_nextval('after_remove') >> 53"), '2',
	'administration goes on after a worker left');
is($c->safe_psql($db, 'SELECT count(*) = count(DISTINCT id) FROM orders'), 't', 'ids stayed distinct');

# ---- a worker that missed calls while disabled (the fourth: it holds no
# shard, so Citus lets it be disabled)
$c->safe_psql($db, "SELECT sharded_seq.create_sequence('short2'); SELECT sharded_seq.grant_sequence('short2', 'alice'); SELECT sharded_seq.create_counter('dc')");
$w4->safe_psql($db, "SELECT counter_incr('dc', 100)");
is($w4->safe_psql($db, "SET ROLE alice; SELECT sharded_nextval('short2') >> 53"), $group4, 'the fourth worker has a sequence');
$c->safe_psql($db, "SELECT citus_disable_node('" . $w4->host . "', " . $w4->port . ', synchronous => true)');
$c->safe_psql($db,
	"SELECT sharded_seq.revoke_sequence('orders_id', 'alice'); SELECT sharded_seq.drop_sequence('short2'); SELECT sharded_seq.alter_sequence('orders_id', block => 150);"
	  . " SELECT sharded_seq.drop_counter('dc'); SELECT sharded_seq.create_counter('dc', mode => 'buffered')");
$c->safe_psql($db, "SELECT citus_activate_node('" . $w4->host . "', " . $w4->port . ')');
my $state = q{SELECT string_agg(name || ' ' || block || ' ' || acl::text, '; ' ORDER BY name) FROM sharded_seq.sequence_config};
isnt($w4->safe_psql($db, $state), $c->safe_psql($db, $state), 'a worker activated again has missed the calls made meanwhile');
ok($w4->safe_psql($db, 'SELECT sharded_seq.cluster_sync()') > 0, 'cluster_sync() on it applies them');
is($w4->safe_psql($db, $state), $c->safe_psql($db, $state), '... its definitions are the coordinator\'s again (revoke, drop, alter)');
($rc, $out, $err) = $w4->psql($db, "SET ROLE alice; SELECT sharded_nextval('orders_id')");
like($err, qr/permission denied/, '... and the revoked role is refused there');
is($w4->safe_psql($db, "SELECT mode FROM sharded_seq.counter_config WHERE name = 'dc'") . ' '
	  . $c->safe_psql($db, "SELECT counter_value('dc')"),
	'buffered 0', '... and a counter dropped and made again meanwhile is the new one there (no old count)');

# ---- a role renamed: the calls it made name it by its new name everywhere
$c->safe_psql($db, "CREATE ROLE dave; SET ROLE dave; SELECT sharded_seq.create_sequence('daves')");
$c->safe_psql($db, 'ALTER ROLE dave RENAME TO dave2');
is(join(' ', map { $_->safe_psql($db, "SELECT string_agg(DISTINCT made_by, ',') FROM sharded_seq.cluster_calls WHERE name = 'daves'") } $c, $w[0]),
	'dave2 dave2', "a renamed role's calls carry its new name, so that a node replaying them finds it");

# ---- objects made before the cluster formed reach a worker at its first use
my $c2 = citus_node('coordinator2');
my $c2w = citus_node('worker2_1');
$c2->safe_psql($db,
	"CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_sequence('pre'); SELECT sharded_seq.create_counter('precnt'); SELECT counter_incr('precnt', 5)");
$c2->safe_psql($db, "SELECT citus_set_coordinator_host('" . $c2->host . "', " . $c2->port . ')');
add_node($c2, $c2w);
is($c2->safe_psql($db, "SELECT counter_value('precnt')"), '5',
	'a counter made before the cluster formed: the coordinator reads its total over the nodes');
is($c2w->safe_psql($db, "SELECT sharded_nextval('pre') >> 53"), '1',
	'a sequence made before the cluster formed draws on a worker, before any administrative call');

# a role dropped after its grant was recorded: a worker added later still
# takes every definition (the moot grant skipped, with a warning), and
# totals still read
$c2->safe_psql($db,
	"CREATE ROLE erin; SELECT sharded_seq.grant_sequence('pre', 'erin'); SELECT sharded_seq.revoke_sequence('pre', 'erin'); DROP ROLE erin");
my $c2w2 = citus_node('worker2_2');
add_node($c2, $c2w2);
($rc, $out, $err) = $c2w2->psql($db, "SELECT sharded_nextval('pre') >> 53");
is($out, '2', "a worker added after a role was dropped takes the definitions at its first use");
like($err, qr/WARNING:  a sharded_seq call from the coordinator was skipped on this node: role "erin" does not exist/,
	'... skipping the dropped role\'s grant, with a warning');
is($c2->safe_psql($db, "SELECT counter_value('precnt')"), '5', '... and the total still reads');

# a single server that drew past 2^53 before it became a coordinator: that
# sequence is not carried to the workers, whose ranges it used
my $c3 = citus_node('coordinator3');
my $c3w = citus_node('worker3_1');
$c3->safe_psql($db,
	"CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_sequence('big', start => (1::bigint << 53) + 5, shards => 1); SELECT sharded_nextval('big')");
$c3->safe_psql($db, "SELECT citus_set_coordinator_host('" . $c3->host . "', " . $c3->port . ')');
add_node($c3, $c3w);
($rc, $out, $err) = $c3->psql($db, 'SELECT sharded_seq.cluster_setup()');
like($err, qr/WARNING:  sharded sequences big are not carried to the Citus workers/,
	'a sequence that drew past 2^53 before the cluster formed is not carried to the workers, with a warning');
($rc, $out, $err) = $c3w->psql($db, "SELECT sharded_nextval('big')");
like($err, qr/sharded sequence "big" does not exist/, '... so no worker hands its values out again (S1)');
$_->stop for $c2, $c2w, $c2w2, $c3, $c3w;

# ---- node ids end at 1023: group 1023 is the last with one
my $lone = citus_node('lone');
$lone->safe_psql($db,
	"SELECT citus_set_coordinator_host('" . $lone->host . "', " . $lone->port . '); CREATE EXTENSION sharded_seq');
$lone->safe_psql($db, 'UPDATE pg_dist_local_group SET groupid = 1023');
is($lone->safe_psql($db, 'SELECT sharded_seq.node_id()'), '1023', 'Citus group 1023 is node 1023');
$lone->safe_psql($db, 'UPDATE pg_dist_local_group SET groupid = 1024');
($rc, $out, $err) = $lone->psql($db, 'SELECT sharded_seq.node_id()');
like($err, qr/Citus group 1024 has no sharded_seq node id/, 'group 1024 has no node id, and says so');

done_testing();
