# Issue 13 after the per-tensor fixes: where one process spends the shards phase on 16 cores.
W=/tmp/fd; . bench/device/source.sh
C=contracts/nvfp4-experts-per-token.yaml
TIMEFORMAT="wall %R s, user %U s, sys %S s"
conv() { python3 -m fp4convert convert $W/src "$1" --contract $C --max-shard-size 500MB --json --quiet --overwrite "${@:2}" | python3 -c "import json,sys; t=sys.stdin.read(); r=json.loads(t[t.index('{'):]); print('seconds', round(r['seconds'], 2), {k: round(v, 2) for k, v in r.get('phases', {}).items()})"; }
for args in "" "--workers 32" "--workers 8"; do echo "== disk $args"; { time conv $W/out $args; } 2>&1; done
echo "== tmpfs"; { time conv /dev/shm/out; } 2>&1; rm -rf /dev/shm/out
timeout 60 py-spy record -r 250 --threads --idle -f raw -o $OUT/pyspy-idle.txt -- python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --json --quiet --overwrite > /dev/null 2>&1
timeout 60 py-spy record -r 250 --threads --gil -f raw -o $OUT/pyspy-gil.txt -- python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --json --quiet --overwrite > /dev/null 2>&1
timeout 60 py-spy record -r 250 --threads -f raw -o $OUT/pyspy-active.txt -- python3 -m fp4convert convert $W/src $W/out --contract $C --max-shard-size 500MB --json --quiet --overwrite > /dev/null 2>&1
ls -la $OUT
