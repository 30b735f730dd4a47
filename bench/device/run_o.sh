# Issue 13: workers 12 / 13 / 16 interleaved, three runs each, into a fresh DST every time (a
# conversion's usual case: --overwrite's deletion of the previous output is not in the figure).
W=/tmp/fd; . bench/device/source.sh
R=$PWD; conv() { python3 $R/bench/device/conv_once.py --fresh "$@"; }
for i in 1 2 3; do conv --workers 12; conv --workers 13; conv; done
rm -rf /dev/shm/out
