# Issue 13 on the 16-core host after the read-stream split and the AVX2 build (phases, workers,
# py-spy --idle), then issue 15's live sync twice: a cold Triton cache, then a warm one.
W=/tmp/fd; . bench/device/source.sh
C=contracts/nvfp4-experts-per-token.yaml
TIMEFORMAT="wall %R s, user %U s, sys %S s"
conv() { python3 -m fp4convert convert $W/src "$1" --contract $C --max-shard-size 500MB --json --quiet --overwrite "${@:2}" | python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
{ for args in "" "" "--workers 32" "--workers 8"; do echo "== disk $args"; { time conv $W/out $args; } 2>&1; done
  echo "== tmpfs"; { time conv /dev/shm/out; } 2>&1; rm -rf /dev/shm/out; } | tee $OUT/convert-h200.txt
timeout 60 py-spy record -r 250 --threads --idle -f raw -o $OUT/pyspy-idle.txt -- python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --json --quiet --overwrite > /dev/null 2>&1
rm -rf $W
for pass in cold warm; do
  echo "== triton cache $pass"
  timeout 200 python3 bench/live_sync.py --skip-kernels --repeat 3 2>&1 | sed -n '1,20p'
done | tee $OUT/live-sync-h200.txt
