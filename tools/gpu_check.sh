#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU: the tests of the matrix's Triton column (every
# Inductor and FlexAttention proof and guard that the `triton` lists of the manifest name) on CUDA
# tensors, so that Inductor's Triton kernels and templates run on the GPU itself, on the patched
# build. Within 10 minutes on one GPU.
#
#   tools/gpu_check.sh [BASE]        BASE: 2.13.0 (default), 2.14.0, 2.14.1 or 2.15.0; builds
#                                    .venv from PyPI's CUDA wheel (needs the network)
#   PYTHON=/path/to/python tools/gpu_check.sh [BASE]
#                                    a Python whose torch is already the patched CUDA build
#
# Not covered: the acceptance workload (its ranks use gloo on CPU tensors) and the controls.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-2.13.0}
[ -f "patches/v$base/manifest.toml" ] || { echo "symfix: no series for base $base (patches/v$base/)" >&2; exit 2; }
if [ -z "${PYTHON:-}" ]; then
  python3 tools/symfix.py wheel --base "$base" --variant pypi
  PYTHON=.venv/bin/python
fi
"$PYTHON" -c 'import torch, sys; torch.cuda.is_available() or (print("symfix: no CUDA GPU here", file=sys.stderr), sys.exit(2))'
mapfile -t ids < <(python3 -c "
import tomllib
m = tomllib.load(open('patches/v$base/manifest.toml', 'rb'))
if 'series-of' in m['base']:  # another release's fixes serve this base
    m = tomllib.load(open(f\"patches/{m['base']['series-of']}/manifest.toml\", 'rb'))
rows = m['fix'] + m.get('acceptance', [])
print('\n'.join(dict.fromkeys(t for f in rows for t in f.get('triton', []) + f.get('triton_guard', []) + f.get('triton_proof', []))))")
echo "gpu check: ${#ids[@]} tests of the v$base series on $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(), "torch", torch.__version__)')"
SYMFIX_DEVICE=cuda timeout 600 "$PYTHON" -m pytest -q -p no:cacheprovider -rfE \
  --tb=short "${ids[@]}"
