-- t/ShardedSeq/check_drawn.sql: the check of table drawn (seq text, v bigint,
-- phase text), the values of sharded sequences handed out 'before' and
-- 'after' some event (an update, a dump and restore).  One line: each
-- sequence's figures, then OK when, for every sequence, no value repeats and every 'after' value is
-- above every 'before' value of the same shard (block k of shard i starts at
-- base + (k * shards + i) * block, so a value's shard is known), hence above
-- every 'before' value for a one-shard sequence.  Values of different shards
-- interleave by design.  Every sequence must have values of both phases, and
-- still be in the generation the values came from.  Read by Node.pm's
-- check_drawn and by test/cross_major/draw.sh's.
WITH d AS (
    SELECT d.seq, d.v, d.phase, ((d.v - s.generation_start) / s.block) % s.shards AS shard
      FROM drawn d JOIN sharded_seq.sequences s ON s.name = d.seq),
per_shard AS (
    SELECT seq, shard,
           count(*) FILTER (WHERE phase = 'before') AS nb,
           max(v) FILTER (WHERE phase = 'before') AS maxb,
           count(*) FILTER (WHERE phase = 'after') AS na,
           min(v) FILTER (WHERE phase = 'after') AS mina
      FROM d GROUP BY seq, shard),
per_seq AS (
    SELECT d.seq, max(s.shards) AS shards, count(*) AS n, count(*) - count(DISTINCT v) AS dup,
           count(*) FILTER (WHERE phase = 'before') AS nb,
           max(v) FILTER (WHERE phase = 'before') AS maxb,
           count(*) FILTER (WHERE phase = 'after') AS na,
           min(v) FILTER (WHERE phase = 'after') AS mina
      FROM d JOIN sharded_seq.sequences s ON s.name = d.seq GROUP BY d.seq)
SELECT string_agg(format('%s (%s shards): %s values, %s repeated, max before %s, min after %s, later values above the earlier ones in %s of %s shards used before and after',
                         q.seq, q.shards, q.n, q.dup, q.maxb, q.mina,
                         (SELECT count(*) FROM per_shard p WHERE p.seq = q.seq AND p.nb > 0 AND p.na > 0 AND p.mina > p.maxb),
                         (SELECT count(*) FROM per_shard p WHERE p.seq = q.seq AND p.nb > 0 AND p.na > 0)), '; ' ORDER BY q.seq)
       || CASE WHEN bool_and(q.dup = 0 AND q.nb > 0 AND q.na > 0
                             AND NOT EXISTS (SELECT FROM per_shard p WHERE p.seq = q.seq
                                              AND p.nb > 0 AND p.na > 0 AND NOT p.mina > p.maxb)
                             AND (q.shards > 1 OR q.mina > q.maxb))
               THEN ' OK' ELSE ' BAD' END
  FROM per_seq q;
