# sourced by each call script: wheels, paths; results in $R, packed into $OUT/r.tgz by pack
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { (cd $R && tar czf $OUT/r.tgz .); }
