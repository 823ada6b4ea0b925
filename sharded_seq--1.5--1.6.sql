/* sharded_seq--1.5--1.6.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script.  1.6: administration
   carried to every node of a Citus cluster. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.6'" to load this file. \quit

-- Every administrative call made on the coordinator of a Citus cluster, one
-- row per call, for each object that exists; of a dropped object, its drop
-- alone (kind 'node': a call about one node, such as move_node_counts's,
-- deleted in the transaction that made it).  The coordinator's first
-- administrative call in a cluster makes it a Citus reference table: a row
-- reaches every node in the coordinator's transaction, and the trigger below
-- runs its call there.  A node with no copy yet replays an object's rows at
-- its first use of the object.  Outside Citus it stays empty.
CREATE TABLE sharded_seq.cluster_calls (
    kind     text NOT NULL CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['sequence', 'counter', 'node'])),
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

-- On a node of a Citus cluster: which creation (the row n of cluster_calls)
-- each of its sequences and counters was made from, so that
-- cluster_sync() tells one dropped and made again on the coordinator.
-- Node-local.
CREATE TABLE sharded_seq.cluster_made (
    kind      text NOT NULL,
    name      text NOT NULL,
    create_n  integer NOT NULL,
    PRIMARY KEY (kind, name)
);
SELECT pg_catalog.pg_extension_config_dump('sharded_seq.cluster_made', '');
REVOKE ALL ON sharded_seq.cluster_made FROM PUBLIC;
COMMENT ON TABLE sharded_seq.cluster_made IS 'Citus: the creation (cluster_calls.n) each object of this node was made from';

CREATE FUNCTION sharded_seq.cluster_call_arrived()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'cluster_call_arrived';
REVOKE ALL ON FUNCTION sharded_seq.cluster_call_arrived() FROM PUBLIC;
COMMENT ON FUNCTION sharded_seq.cluster_call_arrived() IS 'trigger: runs a call from the Citus coordinator on this node';

-- On the coordinator: carry every definition to every node now (otherwise
-- the first administrative call does, or a worker's first use asks for it).
CREATE FUNCTION sharded_seq.cluster_setup()
RETURNS void
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'cluster_setup';
COMMENT ON FUNCTION sharded_seq.cluster_setup() IS 'Citus: on the coordinator, carry every definition to every node now';

-- On a worker that missed calls (disabled, then activated again): make its
-- definitions the coordinator's.
CREATE FUNCTION sharded_seq.cluster_sync()
RETURNS integer
LANGUAGE C VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'cluster_sync';
REVOKE ALL ON FUNCTION sharded_seq.cluster_sync() FROM PUBLIC;
COMMENT ON FUNCTION sharded_seq.cluster_sync() IS 'Citus: on a worker that missed the coordinator''s calls, make its definitions the coordinator''s';

CREATE TRIGGER cluster_call_arrived
    AFTER INSERT ON sharded_seq.cluster_calls
    FOR EACH ROW EXECUTE FUNCTION sharded_seq.cluster_call_arrived();

-- A counter's part on this node only: counter_value sums it over the nodes
-- of a Citus cluster.
CREATE FUNCTION sharded_seq.counter_node_value(name text)
RETURNS bigint
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'counter_node_value';
COMMENT ON FUNCTION sharded_seq.counter_node_value(text) IS 'a counter''s total on this node only (counter_value adds every node''s in a Citus cluster)';

-- Before a worker leaves a Citus cluster: its counts move to the
-- coordinator's rows, in one distributed transaction (on the coordinator).
CREATE FUNCTION sharded_seq.move_node_counts(node_name text, node_port integer)
RETURNS TABLE (counter text, moved bigint)
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'move_node_counts';
REVOKE ALL ON FUNCTION sharded_seq.move_node_counts(text, integer) FROM PUBLIC;
COMMENT ON FUNCTION sharded_seq.move_node_counts(text, integer) IS 'Citus: move a worker''s counter counts to the coordinator''s rows before it leaves the cluster';

-- The leaving worker's part of move_node_counts (run on every node; acts on
-- the node of node_group only).
CREATE FUNCTION sharded_seq.take_node_counts(node_group integer, counts text)
RETURNS void
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'take_node_counts';
REVOKE ALL ON FUNCTION sharded_seq.take_node_counts(integer, text) FROM PUBLIC;
COMMENT ON FUNCTION sharded_seq.take_node_counts(integer, text) IS 'Citus: the leaving worker''s part of move_node_counts';

-- This node's committed count of every counter, in its own rows, after
-- flushing its write-behind amounts: what move_node_counts moves.
CREATE FUNCTION sharded_seq.node_counts()
RETURNS text
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT sharded_seq.flush_counters();
SELECT COALESCE(pg_catalog.json_object_agg(c.name, t.amount)::pg_catalog.text, '{}')
  FROM (SELECT s.counter_id, pg_catalog.sum(s.value)::pg_catalog.int8 AS amount
          FROM sharded_seq.counter_shards s
         WHERE s.shard OPERATOR(pg_catalog./) 1024 OPERATOR(pg_catalog.=) sharded_seq.node_id()
         GROUP BY s.counter_id) t
  JOIN sharded_seq.counter_config c ON c.id OPERATOR(pg_catalog.=) t.counter_id
 WHERE t.amount OPERATOR(pg_catalog.<>) 0;
$$;
REVOKE ALL ON FUNCTION sharded_seq.node_counts() FROM PUBLIC;
COMMENT ON FUNCTION sharded_seq.node_counts() IS 'Citus: this node''s committed count of every counter in its own rows (for move_node_counts)';
