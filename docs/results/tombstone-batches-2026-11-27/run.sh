#!/bin/bash
# run.sh BIN NAME: one standard Test 1 at 4 workers, pg_stat_statements reset before and dumped after
bin=$1; name=$2
P="psql -h 127.0.0.1 -p 55433 -U postgres bench -q"
$P -c "DO \$\$ BEGIN IF to_regclass('rs_deleted_purchase') IS NOT NULL THEN DROP TABLE rs_deleted_purchase CASCADE; END IF; END \$\$;"
$P -c "select pg_stat_statements_reset()" > /dev/null
mkdir -p /tmp/ab/$name
uptime > /tmp/ab/$name/load.txt
$bin bench --db postgres://postgres@127.0.0.1:55433/bench --size standard --tests 1 --workers 4 --repeat 1 --results /tmp/ab/$name > /tmp/ab/$name/out.log 2>&1
echo "exit $?" >> /tmp/ab/$name/load.txt
uptime >> /tmp/ab/$name/load.txt
$P -Atc "select calls, round(total_exec_time::numeric,1), rows, query from pg_stat_statements order by total_exec_time desc limit 30" > /tmp/ab/$name/pg_stat_statements.txt
