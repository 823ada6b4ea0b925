# t/ShardedSeq/Memcached.pm: a real memcached on a free loopback port, that a
# TAP test starts, kills (with any signal) and starts again on the same port.
# Stopped when the object goes away or the test ends.
package ShardedSeq::Memcached;

use strict;
use warnings;

use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);

my @all;

# ShardedSeq::Memcached->new(port => PORT): started; PORT defaults to a free one
sub new
{
	my ($class, %opts) = @_;
	my $self = bless {
		port => $opts{port} // PostgreSQL::Test::Cluster::get_free_port(),
		pid => undef,
	}, $class;
	push @all, $self;
	$self->start;
	return $self;
}

sub port { return $_[0]->{port}; }

# the value of sharded_seq.memcached_servers for this server
sub servers { return '127.0.0.1:' . $_[0]->{port}; }

sub start
{
	my ($self) = @_;
	die "memcached already runs on port $self->{port}" if $self->{pid};
	my $pid = fork // die "fork: $!";
	if ($pid == 0)
	{
		open STDOUT, '>', '/dev/null';
		exec 'memcached', '-l', '127.0.0.1', '-p', $self->{port}, '-U', '0',
		  '-m', '64', '-t', '2'
		  or die "memcached: $!";
	}
	$self->{pid} = $pid;
	for (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		return $self if defined eval { $self->command('version') };
		usleep(100_000);
	}
	die "memcached did not start on port $self->{port}";
}

# kill(SIGNAL): stop it (TERM by default; KILL for a crash, STOP to freeze it)
sub kill
{
	my ($self, $signal) = @_;
	return unless $self->{pid};
	CORE::kill $signal // 'TERM', $self->{pid};
	return if ($signal // '') eq 'STOP';
	waitpid $self->{pid}, 0;
	$self->{pid} = undef;
	return;
}

sub cont { CORE::kill 'CONT', $_[0]->{pid} if $_[0]->{pid}; return; }

sub restart { my ($self) = @_; $self->kill; return $self->start; }

# command(TEXT): one text-protocol command, its reply up to its last line
sub command
{
	my ($self, $text) = @_;
	my $s = IO::Socket::INET->new(
		PeerAddr => '127.0.0.1',
		PeerPort => $self->{port},
		Timeout => 2) or die "memcached on port $self->{port}: $!";
	print $s "$text\r\n";
	my $reply = '';
	while (my $line = <$s>)
	{
		$reply .= $line;
		# a number ends the reply of incr and decr, not a value of get's
		last if $line =~ /^(END|STORED|NOT_STORED|DELETED|NOT_FOUND|OK|ERROR|CLIENT_ERROR.*|SERVER_ERROR.*|VERSION .*)\r\n$/
		  || ($reply eq $line && $line =~ /^\d+\r\n$/);
	}
	close $s;
	$reply =~ s/\r\n$//;
	return $reply;
}

# get(KEY): the value stored under KEY, or undef
sub get
{
	my ($self, $key) = @_;
	my $r = $self->command("get $key");
	return $r =~ /^VALUE \S+ \d+ \d+\r\n(.*?)\r\nEND$/s ? $1 : undef;
}

# stat_value(NAME): memcached's statistic NAME (curr_items, incr_hits, ...)
sub stat_value
{
	my ($self, $name) = @_;
	return $self->command('stats') =~ /^STAT \Q$name\E (\S+)\r$/m ? $1 : undef;
}

# (local $?: the waitpid in kill must not become the test's exit status)
sub DESTROY { local $?; $_[0]->kill('KILL') if $_[0]->{pid}; return; }

END { local $?; $_->kill('KILL') for grep { $_->{pid} } @all; }

1;
