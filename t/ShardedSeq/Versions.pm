# t/ShardedSeq/Versions.pm: which versions a set of install scripts provides.
# Needs no server: the TAP tests ask it of an installation (Node.pm's
# install_versions), test/versions/metadata.sh of the tree.
package ShardedSeq::Versions;

use strict;
use warnings;

# install_versions_in(DIR): from the control file and install scripts in DIR,
# (default_version, the base version, every version reached, oldest first),
# the reached ones being the base script's (sharded_seq--X.sql, of which
# there must be one, as in contrib) and each one its update scripts
# (sharded_seq--X--Y.sql) reach from it.  Dies without exactly one base
# script.
sub install_versions_in
{
	my ($dir) = @_;
	open my $fh, '<', "$dir/sharded_seq.control"
	  or die "no $dir/sharded_seq.control: $!\n";
	my ($default) = do { local $/; <$fh> } =~ /^default_version\s*=\s*'([^']+)'/m;
	close $fh;
	my (@bases, @updates);
	for (glob "$dir/sharded_seq--*.sql")
	{
		m{/sharded_seq--([^/]+)\.sql$} or next;
		my $v = $1;
		if ($v =~ /^(.+)--(.+)$/) { push @updates, [ $1, $2 ]; }
		else { push @bases, $v; }
	}
	die "want one base script sharded_seq--X.sql in $dir, found: @bases\n"
	  unless @bases == 1;
	my %reach = ($bases[0] => 1);
	for my $grew (1 .. @updates)
	{
		$reach{ $_->[1] } = 1 for grep { $reach{ $_->[0] } } @updates;
	}
	my $cmp = sub {
		my @a = split /\./, $_[0];
		my @b = split /\./, $_[1];
		while (@a || @b)
		{
			my $c = (shift(@a) // -1) <=> (shift(@b) // -1);
			return $c if $c;
		}
		return 0;
	};
	return ($default, $bases[0], sort { $cmp->($a, $b) } keys %reach);
}

1;
