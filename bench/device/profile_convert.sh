# Issue 13 on the H200 host: where one conversion process spends its time (py-spy, wall/user/sys),
# with the output on the disk and, where /dev/shm is large enough, in memory. Run after setup.sh.
set -x
df -h /tmp /dev/shm . | tee $OUT/disks.txt; nproc; free -g
W=${W:-/tmp/fd}; mkdir -p $W
python3 -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
from multi_gpu import make_source
print(make_source(Path('$W/src'), 4, 'cuda', shards=3))"
sync; sleep 2  # the source's dirty pages on the disk before anything is timed
C=contracts/nvfp4-experts-per-token.yaml
conv() { python3 -m fp4convert convert $W/src "$1" --contract $C --max-shard-size 500MB --json --quiet "${@:2}" | python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', r['seconds'], [(k, r[k]) for k in ('phases','timings') if k in r])"; }
TIMEFORMAT="wall %R s, user %U s, sys %S s"
for i in 1 2; do rm -rf $W/out; sync; { time conv $W/out; } 2>&1 | tee -a $OUT/convert-disk.txt; done
rm -rf $W/out; sync
timeout 60 py-spy record -r 200 --threads -f raw -o $OUT/pyspy-disk.txt -- python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --json --quiet > /dev/null 2>&1
rm -rf $W/out; sync
timeout 60 py-spy record -r 200 --threads --gil -f raw -o $OUT/pyspy-gil.txt -- python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --json --quiet > /dev/null 2>&1
rm -rf $W/out; sync
SHM=$(df --output=avail -B1G /dev/shm | tail -1)
if [ "$SHM" -ge 4 ]; then
  for i in 1 2; do rm -rf /dev/shm/out; { time conv /dev/shm/out; } 2>&1 | tee -a $OUT/convert-shm.txt; done
  rm -rf /dev/shm/out
  timeout 60 py-spy record -r 200 --threads -f raw -o $OUT/pyspy-shm.txt -- python3 -m fp4convert convert $W/src /dev/shm/out --contract $C --max-shard-size 500MB --json --quiet > /dev/null 2>&1
  rm -rf /dev/shm/out
fi
