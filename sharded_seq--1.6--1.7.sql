/* sharded_seq--1.6--1.7.sql
   Part of the install chain, as in PostgreSQL's contrib: the base script
   sharded_seq--1.0.sql, then each update script.  1.7: every write of the
   tables that copies of sequence configuration in shared memory depend on
   is marked, by whoever makes it. */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.7'" to load this file. \quit

-- Marks the config word (src/common/config_word.c: copies of configuration
-- in shared memory made before are no longer trusted) and tells this
-- server's sessions at commit, for any row written to sequence_shards or
-- cutover_stops, any row deleted from sequence_config (sequence_arrived
-- marks the rows written to it), and any TRUNCATE of the three.  ENABLE
-- ALWAYS: by hand, by logical replication's apply worker, by a restore.
CREATE FUNCTION sharded_seq.config_changed()
RETURNS trigger
LANGUAGE C
AS 'MODULE_PATHNAME', 'config_changed';
REVOKE ALL ON FUNCTION sharded_seq.config_changed() FROM PUBLIC;

CREATE TRIGGER config_deleted
 AFTER DELETE ON sharded_seq.sequence_config
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.config_changed();
CREATE TRIGGER config_truncated
 AFTER TRUNCATE ON sharded_seq.sequence_config
 FOR EACH STATEMENT EXECUTE FUNCTION sharded_seq.config_changed();
CREATE TRIGGER shards_changed
 AFTER INSERT OR UPDATE OR DELETE ON sharded_seq.sequence_shards
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.config_changed();
CREATE TRIGGER shards_truncated
 AFTER TRUNCATE ON sharded_seq.sequence_shards
 FOR EACH STATEMENT EXECUTE FUNCTION sharded_seq.config_changed();
CREATE TRIGGER stops_changed
 AFTER INSERT OR UPDATE OR DELETE ON sharded_seq.cutover_stops
 FOR EACH ROW EXECUTE FUNCTION sharded_seq.config_changed();
CREATE TRIGGER stops_truncated
 AFTER TRUNCATE ON sharded_seq.cutover_stops
 FOR EACH STATEMENT EXECUTE FUNCTION sharded_seq.config_changed();
ALTER TABLE sharded_seq.sequence_config ENABLE ALWAYS TRIGGER config_deleted;
ALTER TABLE sharded_seq.sequence_config ENABLE ALWAYS TRIGGER config_truncated;
ALTER TABLE sharded_seq.sequence_shards ENABLE ALWAYS TRIGGER shards_changed;
ALTER TABLE sharded_seq.sequence_shards ENABLE ALWAYS TRIGGER shards_truncated;
ALTER TABLE sharded_seq.cutover_stops ENABLE ALWAYS TRIGGER stops_changed;
ALTER TABLE sharded_seq.cutover_stops ENABLE ALWAYS TRIGGER stops_truncated;
