#!/bin/bash
# before/after, interleaved, same command: bench-store one thread, modes normal off memory ramdisk
set -u
cd /tmp/store-exp
RECORDS=${RECORDS:-20000}
for round in 1 2; do
  for which in before after; do
    out=/tmp/store-exp/cmp-$which-$round
    rm -rf $out; mkdir -p $out/db
    nice -n 5 ./rowsync-$which bench-store --size full --modes normal,off,memory,ramdisk --records $RECORDS --threads 1 --tpcb-threads 1 --tpcb-transactions 2000 --directory $out/db --results $out/results > $out/log.txt 2>&1
    echo "$which $round exit $?" >> /tmp/store-exp/compare.status
  done
done
