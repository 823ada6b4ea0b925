# E4 and E7 for node_claims across ALTER EXTENSION ... UPDATE from 1.3 to
# 1.4, whose key goes from node_id alone to (node_id, system_identifier,
# database), on a database that publishes node_claims.  The 1.4 library
# claims a node id on the 1.3 schema; after the update every claim is kept,
# the publication still lets claims be deleted (the table kept a replica
# identity), a second system's claim of the same id stands beside this one's
# and, dated earlier, refuses this server; and node_claims (columns,
# constraints, indexes, triggers, replica identity) and claim_received() are
# those of a fresh 1.4.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

# not preloaded: the library is loaded by the first call in each session
my $node = ssq_node('main', start => 0, conf => "sharded_seq.node_id = 3\n");
$node->start;
is($node->safe_psql('postgres', "LOAD 'sharded_seq'; SHOW sharded_seq.node_id"),
	'3', 'the server has node id 3');
my $sysid = $node->safe_psql('postgres', 'SELECT system_identifier FROM pg_control_system()');

sub claims
{
	return $node->safe_psql($_[0],
		q{SELECT string_agg(node_id || '/' || system_identifier || '/' || database || '/' || claimed_at, ' '
		                    ORDER BY node_id, system_identifier) FROM sharded_seq.node_claims});
}

$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', q{
CREATE EXTENSION sharded_seq VERSION '1.3';
SELECT sharded_seq.create_sequence('s');
SELECT sharded_nextval('s');
INSERT INTO sharded_seq.node_claims VALUES (9, '42', 'elsewhere', '2020-01-01 00:00:00+00');
SET client_min_messages = error;  -- wal_level is minimal here: the publication is only looked at
CREATE PUBLICATION claims FOR TABLE sharded_seq.node_claims;
});
my $before = claims('old');
note("RESULT claims on 1.3, the first made by the 1.4 library: $before");
like($before, qr{^3/$sysid/old/\S+ \S+ 9/42/elsewhere/},
	'on 1.3, the 1.4 library claimed node 3 beside the other claim');

$node->safe_psql('old', "ALTER EXTENSION sharded_seq UPDATE TO '1.4'");
is(claims('old'), $before, 'claims kept across the update');
is( $node->safe_psql('old',
		"SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'node_claims_pkey'"),
	'PRIMARY KEY (node_id, system_identifier, database)',
	"node_claims' key is the three columns");
is($node->psql('old', 'DELETE FROM sharded_seq.node_claims WHERE node_id = 9'),
	0, 'a claim of the published table can be deleted after the update (it has a replica identity)');
is($node->safe_psql('old', "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'claims'"),
	'1', 'the publication kept node_claims');

# another system's claim of node 3, dated earlier, beside this one's
$node->safe_psql('old',
	"INSERT INTO sharded_seq.node_claims VALUES (3, '42', 'elsewhere', '2020-01-01 00:00:00+00')");
my ($ret, $out, $err) = $node->psql('old', "\\set VERBOSITY verbose\nSELECT sharded_nextval('s')");
like($err,
	qr/ERROR:  55000: sharded_seq\.node_id 3 is claimed by system 42, database "elsewhere", earlier than by this one \(system $sysid, database "old"\)/,
	'an earlier claim of node 3 beside this one\'s refuses this server');
$node->safe_psql('old',
	"DELETE FROM sharded_seq.node_claims WHERE node_id = 3 AND system_identifier = '42'");
is($node->safe_psql('old', "SELECT sharded_nextval('s') >> 53"),
	'3', 'the earlier claim deleted, this server draws');

# the same objects as a fresh 1.4
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION sharded_seq');
my $describe = q{
SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE attrelid = 'sharded_seq.node_claims'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum;
SELECT 'constraint ' || conname || ' ' || contype::text || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE conrelid = 'sharded_seq.node_claims'::regclass ORDER BY conname;
SELECT 'index ' || pg_get_indexdef(indexrelid) || ' ' || indisprimary || ' ' || indisreplident
  FROM pg_index WHERE indrelid = 'sharded_seq.node_claims'::regclass ORDER BY 1;
SELECT 'trigger ' || pg_get_triggerdef(oid) || ' ' || tgenabled::text
  FROM pg_trigger WHERE tgrelid = 'sharded_seq.node_claims'::regclass ORDER BY tgname;
SELECT 'replica identity ' || relreplident::text FROM pg_class WHERE oid = 'sharded_seq.node_claims'::regclass;
SELECT 'function ' || p.oid::regprocedure || ' ' || prosrc || ' ' || probin || ' ' || coalesce(proacl::text, '') || ' '
       || (SELECT count(*) FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
  FROM pg_proc p WHERE proname = 'claim_received' AND pronamespace = 'sharded_seq'::regnamespace;
};
my $fresh = $node->safe_psql('fresh', $describe);
is($node->safe_psql('old', $describe), $fresh, "node_claims after the update equals a fresh 1.4's");
note("RESULT node_claims after the update equals a fresh 1.4's: "
	  . scalar(split /\n/, $fresh) . ' catalog lines');

done_testing();
