# Issue 13 with this stop's faster native kernels: the 16-thread probe, then one conversion.
python3 bench/device/gil_probe.py 768x2048 256
W=/tmp/fd; . bench/device/source.sh
for i in 1 2; do python3 -m fp4convert convert $W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite --json | python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; done
