/* sharded_seq--1.3--1.4.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script; CREATE EXTENSION of a
   later version runs this one as ALTER EXTENSION ... UPDATE does. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.4'" to load this file. \quit

------------------------------------------------------------------------------
-- node_claims: claims of one node id by several systems stand side by side
------------------------------------------------------------------------------

-- Two servers that claimed one id before they met both replicate their
-- claims, and the earliest holds the id on every node (1.3's key, node_id
-- alone, stopped replication on the second claim instead).  One statement:
-- the table is never without a key, so a publication of it keeps its replica
-- identity (DEFAULT: the primary key, now the three columns).  Existing
-- claims are kept.
ALTER TABLE sharded_seq.node_claims
    DROP CONSTRAINT node_claims_pkey,
    ADD CONSTRAINT node_claims_pkey PRIMARY KEY (node_id, system_identifier, database);

-- A claim this node holds already, when replication brings it again, is
-- skipped rather than a duplicate key.  origin = none with copy_data = true
-- copies a subscriber's own claim back to it when the publisher has it from
-- the subscriber.  ENABLE REPLICA: only replication brings claims back.
CREATE FUNCTION sharded_seq.claim_received()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'claim_received';
REVOKE ALL ON FUNCTION sharded_seq.claim_received() FROM PUBLIC;
CREATE TRIGGER claim_received
 BEFORE INSERT ON sharded_seq.node_claims
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.claim_received();
ALTER TABLE sharded_seq.node_claims ENABLE REPLICA TRIGGER claim_received;

------------------------------------------------------------------------------
-- the sequences view: positions only to roles that may use the sequence
------------------------------------------------------------------------------

-- Sequence positions only to who may use the sequence, as pg_sequences shows
-- last_value: generation_start and reserved_high_water are NULL to a role
-- that neither owns the sequence (nor is a member of its owner) nor holds
-- usage.  The 1.4 library's sequence_high_water checks it too.  CREATE OR
-- REPLACE keeps the columns, and the users' views that depend on this one.
CREATE FUNCTION sharded_seq.sequence_readable(seq_id integer)
RETURNS boolean
LANGUAGE C STABLE PARALLEL RESTRICTED STRICT
AS 'MODULE_PATHNAME', 'sequence_readable';
COMMENT ON FUNCTION sharded_seq.sequence_readable(integer) IS 'whether the current user may see a sharded sequence''s positions: owner (or member) or usage';

CREATE OR REPLACE VIEW sharded_seq.sequences AS
SELECT c.name,
       c.shards,
       c.block,
       c.tier,
       c.generation,
       CASE WHEN sharded_seq.sequence_readable(c.id)
            THEN sharded_seq.node_value(c.base) END AS generation_start,
       sharded_seq.node_value(sharded_seq.sequence_high_water(c.id)) AS reserved_high_water,
       c.owner,
       c.acl,
       c.created_at,
       c.altered_at,
       sharded_seq.node_id() AS node_id
  FROM sharded_seq.sequence_config c
 ORDER BY c.name;
COMMENT ON VIEW sharded_seq.sequences IS 'one row per sharded sequence; positions are values of this session''s node (node_id), NULL to a role that neither owns nor may use the sequence';
