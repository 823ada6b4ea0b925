/* sharded_seq--1.5--1.6.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script.  1.6: administration
   carried to every node of a Citus cluster. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.6'" to load this file. \quit

-- Every administrative call made on the coordinator of a Citus cluster, one
-- row per call, for each object that exists.  The coordinator's first
-- administrative call in a cluster makes it a Citus reference table: a row
-- reaches every node in the coordinator's transaction, and the trigger below
-- runs its call there.  A node with no copy yet replays an object's rows at
-- its first use of the object.  Outside Citus it stays empty.
CREATE TABLE sharded_seq.cluster_calls (
    kind     text NOT NULL CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['sequence', 'counter'])),
    name     text NOT NULL,
    n        integer NOT NULL,
    op       text NOT NULL CHECK (op OPERATOR(pg_catalog.=) ANY (ARRAY['create', 'change', 'drop'])),
    made_by  name NOT NULL,
    call     text NOT NULL,
    made_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (kind, name, n)
);
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.cluster_calls', '');
REVOKE ALL ON sharded_seq.cluster_calls FROM PUBLIC;
COMMENT ON TABLE sharded_seq.cluster_calls IS 'Citus: the administrative calls made on the coordinator that every node runs, per live object';

CREATE FUNCTION sharded_seq.cluster_call_arrived()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'cluster_call_arrived';
REVOKE ALL ON FUNCTION sharded_seq.cluster_call_arrived() FROM PUBLIC;
COMMENT ON FUNCTION sharded_seq.cluster_call_arrived() IS 'trigger: runs a call from the Citus coordinator on this node';

CREATE TRIGGER cluster_call_arrived
    AFTER INSERT ON sharded_seq.cluster_calls
    FOR EACH ROW EXECUTE FUNCTION sharded_seq.cluster_call_arrived();
