# Issue 22 part 2: adopt_column and release_column under load.  8 sessions
# insert without pause into a table with a serial column and one with an
# identity column (some of their transactions hold a row for a moment, so
# that an insert made with the old default commits after the switch began)
# while both columns are adopted, given back and adopted again.  No session
# may see an error (lock_timeout is unset: an insert waits for the switch's
# lock, the documented wait), every id is unique, and each column ends as it
# should.  SSQ_ADOPT_RECIPE=1 switches the columns with the three statements
# the README used to give instead (create, advance past max(id), set the
# default): then the inserts made between the advance and the default take
# values the sharded sequence hands out again, a duplicate key.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $recipe = $ENV{SSQ_ADOPT_RECIPE};
my $node = ssq_node('main', preload => 1);
my $db = 'stress';
sub sql { return $node->safe_psql($db, $_[0]); }

sql(q{
CREATE TABLE s (id serial PRIMARY KEY, v int);
CREATE TABLE i (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int);
INSERT INTO s (v) SELECT g FROM generate_series(1, 500) g;
INSERT INTO i (v) SELECT g FROM generate_series(1, 500) g;
});

# each session: single inserts, and transactions that insert, wait a little
# and insert again, with the ids they got one a line
my @scripts;
for my $k (1 .. 8)
{
	my $sql = '';
	for my $n (1 .. 20000)
	{
		$sql .= stop_point('load') if $n % 10 == 1;
		$sql .= $n % 3
		  ? "INSERT INTO s (v) VALUES ($k) RETURNING 's', id;\nINSERT INTO i (v) VALUES ($k) RETURNING 'i', id;\n"
		  : "BEGIN;\nINSERT INTO s (v) SELECT $k FROM generate_series(1, 3) RETURNING 's', id;\n"
		  . "SELECT pg_sleep(0.003);\nINSERT INTO i (v) VALUES ($k) RETURNING 'i', id;\n"
		  . "SELECT pg_sleep(0.002);\nINSERT INTO s (v) VALUES ($k) RETURNING 's', id;\nCOMMIT;\n";
	}
	push @scripts, $sql;
}
my $load = load_start($node, $db, 'ins', @scripts);
my $lines = 50;
load_progress($load, $lines);

# let the load add rows to both tables before the next step
sub more_rows
{
	my $n = sql("SELECT (SELECT count(*) FROM s) || ',' || (SELECT count(*) FROM i)");
	my ($s, $i) = split /,/, $n;
	$node->poll_query_until($db,
		"SELECT (SELECT count(*) FROM s) > $s + 200 AND (SELECT count(*) FROM i) > $i + 100")
	  or die 'the load stopped inserting';
	return;
}

sub adopt
{
	my ($t) = @_;
	return sql("SELECT sharded_seq.adopt_column('$t', 'id')") unless $recipe;
	# the old recipe, with the inserts it races with let in between
	sql("SELECT sharded_seq.create_sequence('${t}_id')");
	my $past = sql("SELECT max(id) FROM $t");
	sql("SELECT sharded_seq.advance_sequence('${t}_id', $past)");
	$node->poll_query_until($db, "SELECT max(id) > $past FROM $t");
	sql(($t eq 'i' ? "ALTER TABLE i ALTER COLUMN id DROP IDENTITY; " : '')
		  . "ALTER TABLE $t ALTER COLUMN id SET DEFAULT sharded_nextval('${t}_id')");
	return $past + 1;
}

sub default_of
{
	my ($t) = @_;
	return sql("SELECT coalesce(pg_get_expr(d.adbin, d.adrelid), 'identity ' || a.attidentity::text)"
		  . " FROM pg_attribute a LEFT JOIN pg_attrdef d ON (d.adrelid, d.adnum) = (a.attrelid, a.attnum)"
		  . " WHERE a.attrelid = '$t'::regclass AND a.attname = 'id'");
}

# 1. adopt both columns while the load inserts
for my $t ('s', 'i')
{
	more_rows();
	my $start = adopt($t);
	like(default_of($t), qr/sharded_nextval\('${t}_id'::text\)/, "$t.id was adopted under load (first value $start)");
}
more_rows();

# 2. give them back
unless ($recipe)
{
	for my $t ('s', 'i')
	{
		# max(id) under the switch's lock, before any insert takes the new default
		my ($next, $max) = split /\n/,
		  sql("BEGIN; SELECT sharded_seq.release_column('$t', 'id'); SELECT max(id) FROM $t; COMMIT;");
		cmp_ok($next, '>', $max, "$t.id was given back under load, starting at $next, above max(id) $max");
		more_rows();
	}
	is(default_of('s'), q{nextval('s_id_seq'::regclass)}, 's.id is serial again');
	is(default_of('i'), 'identity a', 'i.id is GENERATED ALWAYS AS IDENTITY again');
	is(sql("SELECT count(*) FROM sharded_seq.sequences WHERE name IN ('s_id', 'i_id')"),
		'0', 'their sharded sequences are dropped');

	# 3. and adopt them again
	for my $t ('s', 'i')
	{
		my $start = adopt($t);
		like(default_of($t), qr/sharded_nextval/, "$t.id was adopted again under load (first value $start)");
		more_rows();
	}
}

stop_load($node, $db, 'load');
my ($out, $err) = load_finish($load);
my @errors = grep { /\S/ } @$err;
is(scalar @errors, 0, 'no insert saw an error (the only wait is the lock)')
  or diag(substr(join('', @errors), 0, 2000));
my (%seen, @dups);
for my $o (@$out)
{
	for my $row ($o =~ /^([si]\|\d+)$/mg)
	{
		push @dups, $row if $seen{$row}++;
	}
}
is(scalar @dups, 0, 'no id came back twice to the sessions') or diag("@dups[0 .. min(9, $#dups)]");
for my $t ('s', 'i')
{
	is(sql("SELECT count(*) - count(DISTINCT id) FROM $t"), '0', "every id of $t is unique");
}
note('RESULT rows: ' . sql("SELECT (SELECT count(*) FROM s) || ' in s, ' || (SELECT count(*) FROM i) || ' in i'"));

sub min { return $_[0] < $_[1] ? $_[0] : $_[1]; }

$node->stop;
done_testing();
