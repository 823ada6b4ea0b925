# E7: every install of the control file's default_version holds the objects
# recorded for this PostgreSQL major in objects/objects_DEFAULT.pgMAJOR.expected
# (the golden file; the catalogs print differently on each major: views,
# the owner's rights from 17 on, row types and NOT NULL constraints):
#  (a) a fresh CREATE EXTENSION;
#  (b) every earlier version the update scripts reach from the base script,
#      installed with VERSION and brought up in one ALTER EXTENSION UPDATE;
#  (c) the base version updated one version at a time.
# Objects: what objects/objects.sql reads from the catalogs (members,
# function definitions and rights, relations, views, columns, constraints,
# indexes, triggers and when they fire, rights, comments, dumped tables).
# The install scripts are one base (sharded_seq--1.0.sql) and the update
# chain, as in contrib, so (a) and (b) run the same scripts: the golden file
# is what tells a change to the objects.  A mismatch prints the diff.  The
# scripts are the installed ones; test/versions/installed_scripts.sh checks
# that they are the tree's.
#
# To change the objects deliberately (a new version, a changed update
# script), write the golden files from a fresh install, then review the diff.
# SSQ_REGENERATE=DIR writes DIR/objects_DEFAULT.pgMAJOR.expected (=1: into
# this test's output directory, which scripts/test.sh removes when it ends),
# prints its path, and compares the installs against it.  The test runs as
# the postgres user when root, so DIR must be writable by it; in a chroot,
# its /tmp is the host's /var/cache/sharded_seq/chroot-SUITE/tmp:
#   SSQ_REGENERATE=/tmp flock /tmp/ssq-host.lock scripts/test.sh tap/same_objects
#   scripts/chroot.sh trixie env SSQ_REGENERATE=/tmp scripts/test.sh tap/same_objects
#   scripts/chroot.sh sid env SSQ_REGENERATE=/tmp scripts/test.sh tap/same_objects
#   cp /tmp/objects_*.pg15.expected /var/cache/sharded_seq/chroot-{trixie,sid}/tmp/objects_*.pg1[78].expected t/objects/
use strict;
use warnings;
use File::Basename;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('main', preload => 1, start => 0);
$node->start;

# the versions the installed base script and its update chain provide
my ($default, $base, @reach) = install_versions($node);
ok(defined $default, 'the installed control file has a default_version')
  or BAIL_OUT('no default_version');
ok((grep { $_ eq $default } @reach), "the update scripts reach $default from $base (@reach)");
is($reach[-1], $default, 'the update scripts reach no version beyond default_version');
my @older = grep { $_ ne $default } @reach;
note("RESULT base $base, update chain to @reach[1 .. $#reach]; earlier versions: "
	  . (@older ? "@older" : 'none'));

my $major = int($node->safe_psql('postgres', 'SHOW server_version_num') / 10000);
my $dir = dirname(__FILE__) . '/objects';
my $name = "objects_$default.pg$major.expected";
my $golden = "$dir/$name";
my $objects_sql = slurp_file("$dir/objects.sql");

sub objects { return $node->safe_psql($_[0], $objects_sql); }
sub extversion
{
	return $node->safe_psql($_[0],
		"SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'");
}

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION sharded_seq');
if ($ENV{SSQ_REGENERATE})
{
	$golden = ($ENV{SSQ_REGENERATE} eq '1' ? $PostgreSQL::Test::Utils::tmp_check : $ENV{SSQ_REGENERATE})
	  . "/$name";
	open my $fh, '>', $golden or die "cannot write $golden: $!";
	print $fh "# The objects of a fresh sharded_seq $default on PostgreSQL $major (t/objects/objects.sql),\n"
	  . "# which t/same_objects.pl compares every install and update against.\n"
	  . "# Regenerate only to change the objects deliberately (see that test), and review the diff.\n"
	  . objects('fresh') . "\n";
	close $fh or die "cannot write $golden: $!";
	note("RESULT regenerated $golden: copy it to t/objects/$name");
}
-f $golden or BAIL_OUT("no golden file t/objects/$name: see the comment at the top of this test");
# the golden file without its comment lines at the top
my $expected = slurp_file($golden) =~ s/\A(?:#[^\n]*\n)*//r;
chomp $expected;
my $members = () = $expected =~ /^member /mg;
cmp_ok($members, '>', 20, "the golden file lists $members members");

# compare(WHAT, DB): DB's objects against the golden file, and its version
sub compare
{
	my ($what, $db) = @_;
	my $got = objects($db);
	my $v = extversion($db);
	my $out = "$PostgreSQL::Test::Utils::tmp_check/$db.txt";
	my $exp = "$PostgreSQL::Test::Utils::tmp_check/expected.txt";
	append_to_file($exp, "$expected\n") unless -f $exp;
	append_to_file($out, "$got\n");
	my ($diff) = run_command([ 'diff', '-u', '--label', $name, '--label', $what, $exp, $out ]);
	my $lines = () = $diff =~ /^[-+]/mg;
	$lines -= 2 if $diff ne '';    # the --- and +++ lines naming the files
	note("RESULT $what: version $v, $lines lines differ from $name");
	is($v, $default, "$what: version $default");
	ok($diff eq '', "$what: the objects of $name")
	  or diag(join("\n", grep { defined } (split /\n/, $diff)[0 .. 39]));
	return;
}

# (a)
compare('a fresh CREATE EXTENSION', 'fresh');
# (b)
for my $v (@older)
{
	my $db = 'from_' . ($v =~ s/\./_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION sharded_seq VERSION '$v'");
	is(extversion($db), $v, "CREATE EXTENSION ... VERSION '$v' installs $v");
	$node->safe_psql($db, 'ALTER EXTENSION sharded_seq UPDATE');
	compare("$v updated to $default", $db);
}
# (c)
$node->safe_psql('postgres', 'CREATE DATABASE steps');
$node->safe_psql('steps', "CREATE EXTENSION sharded_seq VERSION '$base'");
for my $v (@reach[1 .. $#reach])
{
	$node->safe_psql('steps', "ALTER EXTENSION sharded_seq UPDATE TO '$v'");
	is(extversion('steps'), $v, "ALTER EXTENSION ... UPDATE TO '$v' leaves $v");
}
compare("$base updated in steps (@reach[1 .. $#reach])", 'steps');

done_testing();
