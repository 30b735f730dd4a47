# Issue 13: three rounds of one-process conversions of the 6.23 GB source (drawn first), stop 27's
# tree in _prev/ against this revision, interleaved on the same host (conv_once.py: into a fresh folder).
W=/tmp/fd; timeout 60 bash -c '. bench/device/source.sh'
cp fp4convert/formats/_native.so _prev/fp4convert/formats/_native.so
R=$PWD; conv() { timeout 30 python3 $R/bench/device/conv_once.py --fresh "$@"; }
for i in 1 2 3; do
  echo "== stop 27 (_prev)"; (cd _prev && PYTHONPATH=/tmp/site:$PWD conv)
  echo "== this revision"; conv
done
