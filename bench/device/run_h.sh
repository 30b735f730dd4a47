# Issue 13 after the budget / large-tensor-first change: the timeline again, then the phases.
W=/tmp/fd; . bench/device/source.sh
A="$W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite"
python3 bench/device/trace_convert.py $A 2>&1 | tail -36
summary() { python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
for args in "" "" "--workers 12" "--workers 24"; do echo "== $args"; python3 -m fp4convert convert $A --json $args | summary; done
rm -rf /dev/shm/out
