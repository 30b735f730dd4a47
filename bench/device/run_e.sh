# Issue 13 after cutting GIL hand-offs per tensor (pwritev of a tensor's outputs, no torch op to
# hash/write them, small kernels keep the GIL, one budget waiter woken): probe + one process.
python3 bench/device/gil_probe.py 16x64 8000; python3 bench/device/gil_probe.py 768x2048 256
W=/tmp/fd; . bench/device/source.sh
C=contracts/nvfp4-experts-per-token.yaml
summary() { python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
TIMEFORMAT="wall %R s, user %U s, sys %S s"
for args in "" "" "--workers 8" "--workers 32"; do
  echo "== 1 process $args"
  { time python3 -m fp4convert convert $W/src /dev/shm/out --contract $C --max-shard-size 500MB --json --quiet --overwrite $args | summary; } 2>&1
done
echo "== 2 ranks"
{ time torchrun --standalone --nproc-per-node 2 -m fp4convert convert $W/src /dev/shm/out --contract $C --max-shard-size 500MB --json --quiet --overwrite --workers 8 2>/dev/null | summary; } 2>&1
timeout 60 py-spy record -r 250 --threads --idle -f raw -o $OUT/pyspy-idle.txt -- python3 -m fp4convert convert $W/src /dev/shm/out --contract $C --max-shard-size 500MB --json --quiet --overwrite > /dev/null 2>&1
rm -rf /dev/shm/out
