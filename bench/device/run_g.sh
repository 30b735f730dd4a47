# Issue 13: the one-process timeline on 16 cores (bench/device/trace_convert.py), default budget and a larger one.
W=/tmp/fd; . bench/device/source.sh
A="$W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite"
python3 bench/device/trace_convert.py $A 2>&1 | tail -36
TRACE_BUDGET_MB=2048 python3 bench/device/trace_convert.py $A 2>&1 | tail -36
rm -rf /dev/shm/out
