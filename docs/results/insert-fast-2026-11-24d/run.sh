#!/bin/bash
# usage: run.sh old|new N
set -u
which=$1; n=$2
PSQL="/usr/lib/postgresql/15/bin/psql -h 127.0.0.1 -p 55441 -U postgres -d bench -X -q"
URL=postgres://postgres@127.0.0.1:55441/bench
DIR=/tmp/insertfast-bin/bench-$which-$n
rm -rf $DIR; mkdir -p $DIR
$PSQL -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
if [ "$which" = old ]; then
  $PSQL -c "DO \$\$ BEGIN IF to_regclass('rs_script') IS NOT NULL THEN DELETE FROM rs_script WHERE event = 'upload_insert_fast'; END IF; END \$\$"
fi
$PSQL -c "SELECT pg_stat_statements_reset()" > /dev/null
uptime > $DIR/load.txt
/usr/bin/time -v /tmp/insertfast-bin/rowsync-$which bench --db $URL --size standard --tests 1 --workers 4 --repeat 1 --results $DIR > $DIR/bench.log 2> $DIR/bench.err
echo "exit $?" >> $DIR/bench.log
uptime >> $DIR/load.txt
$PSQL -c "SELECT calls, round(total_exec_time)::bigint AS ms, round((total_exec_time/calls)::numeric, 3) AS ms_per_call, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 160) AS q FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 30" > $DIR/pg_stat_statements.txt
$PSQL -c "SELECT calls, round(total_exec_time)::bigint AS ms, round((total_exec_time/calls)::numeric, 3) AS ms_per_call, rows, left(regexp_replace(regexp_replace(query, 'unnest\\(.*\\) AS u', 'unnest(...) AS u'), '\s+', ' ', 'g'), 400) AS q FROM pg_stat_statements WHERE query ~ 'INSERT INTO \"purchase\"|SAVEPOINT' ORDER BY total_exec_time DESC" > $DIR/insert_statements.txt
$PSQL -c "SELECT event, script FROM rs_script WHERE script_version = 'bench' AND event LIKE 'upload_insert%'" > $DIR/insert_scripts.txt
