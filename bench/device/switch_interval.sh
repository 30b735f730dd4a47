# Issue 13: the GIL convoy. Threads waiting to re-take the GIL after each torch call dominate the
# py-spy --idle profile; CPython hands the GIL over every sys.getswitchinterval() (5 ms). One process,
# the same conversion, under several switch intervals.
W=/tmp/fd; . bench/device/source.sh
TIMEFORMAT="wall %R s, user %U s, sys %S s"
for si in 0.005 0.001 0.0002 0.00005 0.005; do
  echo "== switch interval $si"
  { time python3 -c "
import sys, json, io, contextlib
sys.setswitchinterval($si)
from fp4convert.cli import main
sys.argv = ['fp4convert', 'convert', '$W/src', '$W/out', '--contract', 'contracts/nvfp4-experts-per-token.yaml',
            '--max-shard-size', '500MB', '--json', '--quiet', '--overwrite']
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main()
    except SystemExit:
        pass
t = out.getvalue(); r = json.loads(t[t.index('{'):])
print('seconds', round(r['seconds'], 2), 'GB/s', round(r['source_bytes'] / 1e9 / r['seconds'], 2), {k: round(v, 2) for k, v in r['phases'].items()})
"; } 2>&1
done
