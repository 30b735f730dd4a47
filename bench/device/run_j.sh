# Issue 13 after the budget counts the two largest tensors on top: timeline, phases, 2 ranks.
W=/tmp/fd; . bench/device/source.sh
A="$W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite"
python3 bench/device/trace_convert.py $A 2>&1 | tail -40
summary() { python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
for i in 1 2 3; do echo "== 1 process, run $i"; python3 -m fp4convert convert $A --json | summary; done
for w in 8 12; do echo "== 1 process --workers $w"; python3 -m fp4convert convert $A --json --workers $w | summary; done
echo "== 2 ranks x 8 workers"; torchrun --standalone --nproc-per-node 2 -m fp4convert convert $A --json --workers 8 2>/dev/null | summary
rm -rf /dev/shm/out
