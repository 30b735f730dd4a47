# Issue 13, final one-process figures: the timeline, the phases three times, 2 ranks, and the
# --device cuda conversion compared byte for byte with the CPU one.
W=/tmp/fd; . bench/device/source.sh
A="$W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite"
python3 bench/device/trace_convert.py $A 2>&1 | tail -40
summary() { python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
for i in 1 2 3; do echo "== 1 process, run $i"; python3 -m fp4convert convert $A --json | summary; done
echo "== 1 process --workers 12"; python3 -m fp4convert convert $A --json --workers 12 | summary
echo "== 2 ranks x 8 workers"; torchrun --standalone --nproc-per-node 2 -m fp4convert convert $A --json --workers 8 2>/dev/null | summary
echo "== --device cuda"; python3 -m fp4convert convert $W/src /dev/shm/cuda --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite --json --device cuda | summary
python3 -m fp4convert convert $A
for f in /dev/shm/out/*.safetensors /dev/shm/out/model.safetensors.index.json /dev/shm/out/config.json; do cmp -s $f /dev/shm/cuda/$(basename $f) && echo "same: $(basename $f)" || echo "DIFFERENT: $(basename $f)"; done
rm -rf /dev/shm/out /dev/shm/cuda
