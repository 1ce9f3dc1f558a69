#!/usr/bin/env bash
# A git checkout of Liger-Kernel made from its release on PyPI (the sdist holds its source and its tests),
# for a turbo-opt campaign on one of its Triton kernels: the benchmark that writes the frozen summary CSV
# (campaigns/external/liger_rms_norm_bench.py) is added as bench_turbo_opt.py and committed with it, and
# the checkout is installed editable where pip can do that offline (the campaign puts its src/ first on
# PYTHONPATH either way). The CUDA/CuTe sources of liger_cute_kernels are left out.
#   pip download --no-deps --no-binary :all: liger-kernel==0.8.5 -d .whl
#   scripts/liger_repo.sh .whl/liger_kernel-0.8.5.tar.gz ../liger-kernel
set -euo pipefail
sdist=$1 dest=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[ ! -e "$dest" ] || { echo "error: $dest exists" >&2; exit 2; }
mkdir -p "$dest"
tar xzf "$sdist" -C "$dest" --strip-components=1 --exclude='*/liger_cute_kernels' --exclude='*/.github'
cp "$here/campaigns/external/liger_rms_norm_bench.py" "$dest/bench_turbo_opt.py"
cd "$dest"
git init -q -b main
git add -A
git -c user.name=turbo-opt -c user.email=turbo-opt@localhost commit -qm "Liger-Kernel $(basename "$sdist" .tar.gz) from PyPI, with bench_turbo_opt.py"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>/dev/null \
  || echo "note: no editable install (offline build tools missing); the campaign imports src/ from the checkout"
echo "$dest: $(git log --oneline | head -1)"
