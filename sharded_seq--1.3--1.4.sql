/* sharded_seq--1.3--1.4.sql */

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
