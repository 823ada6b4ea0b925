# test/cross_major/draw.sh: what both sides of the tests across majors do to
# a database through psql (connection from the environment, as pg_virtualenv
# sets it): draw values into table drawn, check them, and print the state a
# dump and restore must keep.  Sourced; needs $WORK.

# draw_sessions DB PHASE COUNT SEQ...: COUNT sessions at once draw from each
# sharded sequence SEQ, 300 values in committed statements and 50 in a
# rolled-back transaction; every value goes into table drawn (seq, v, phase)
# of DB, with PHASE, for check_drawn.
draw_sessions() {
    local db="$1" phase="$2" count="$3" pids=() i seq rc=0
    shift 3
    for i in $(seq 1 "$count"); do
        {
            for seq in "$@"; do
                echo "SELECT '$seq', sharded_nextval('$seq') FROM generate_series(1, 300);"
                echo "BEGIN; SELECT '$seq', sharded_nextval('$seq') FROM generate_series(1, 50); ROLLBACK;"
            done
        } | psql -qXAt -F ' ' -v ON_ERROR_STOP=1 -d "$db" \
            >"$WORK/draw.$db.$phase.$i.out" 2>"$WORK/draw.$db.$phase.$i.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc != 0 ]; then cat "$WORK/draw.$db.$phase".*.err; return 1; fi
    cat "$WORK/draw.$db.$phase".*.out | sed "s/\$/ $phase/" >"$WORK/draw.$db.$phase.all"
    psql -qX -v ON_ERROR_STOP=1 -d "$db" \
        -c "\\copy drawn FROM '$WORK/draw.$db.$phase.all' WITH (DELIMITER ' ')" >/dev/null
}

# check_drawn DB: the check of table drawn in DB (t/ShardedSeq/check_drawn.sql,
# which the TAP tests read too): one line, each sequence's figures, then OK
# or BAD for all of them.
check_drawn() {
    psql -qXAt -v ON_ERROR_STOP=1 -d "$1" -f t/ShardedSeq/check_drawn.sql
}

# state: SQL printing what a dump and restore keep (every sequence's layout
# and generation, every counter's total, and the values drawn).
state() {
    cat <<'SQL'
SELECT name || ' ' || shards || ' ' || block || ' ' || tier || ' ' || generation || ' ' || generation_start FROM sharded_seq.sequences ORDER BY name;
SELECT name || ' ' || shards || ' ' || mode || ' ' || counter_value(name) FROM sharded_seq.counters ORDER BY name;
SELECT count(*) || ' drawn, ' || count(DISTINCT (seq, v)) || ' distinct' FROM drawn;
SQL
}

totals() {
    psql -qXAt -v ON_ERROR_STOP=1 -d "$1" \
        -c "SELECT string_agg(name || '=' || counter_value(name), ' ' ORDER BY name) FROM sharded_seq.counters"
}
