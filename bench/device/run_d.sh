# Issue 13: is the one-process conversion bound by GIL hand-offs? The per-tensor probe from 1-16
# threads, then the conversion as 1 process and as 2 / 4 local CPU ranks (torchrun, gloo).
python3 bench/device/gil_probe.py 16x64 8000; python3 bench/device/gil_probe.py 768x2048 256
W=/tmp/fd; . bench/device/source.sh
C=contracts/nvfp4-experts-per-token.yaml
summary() { python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
TIMEFORMAT="wall %R s, user %U s, sys %S s"
for n in 1 2 4 8; do
  echo "== $n ranks"
  { time torchrun --standalone --nproc-per-node $n -m fp4convert convert $W/src /dev/shm/out --contract $C --max-shard-size 500MB --json --quiet --overwrite --workers $((16 / n)) 2>/dev/null | summary; } 2>&1
  rm -rf /dev/shm/out
done
