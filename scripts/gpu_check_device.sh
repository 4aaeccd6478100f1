#!/bin/sh
# Run `make gpu-check` on a GPU machine without network, with what scripts/gpu_check_prepare.sh put
# in .gpu-check/ (carried with the working tree): its wheels are installed beside the machine's own
# CUDA torch (in /tmp/gpu-check-site, first on PYTHONPATH), its built-in models are used as the
# cache. Arguments go to scripts/gpu_check.py, e.g.
#   sh scripts/gpu_check_device.sh --out "$OUT/gpu-check.md"
set -eu
PY=${GPU_PYTHON:-python3}
if ls .gpu-check/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-check-site .gpu-check/wheels/*.whl
    PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH
fi
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this tree's mixrl (no install there)
export PYTHONPATH
[ -d .gpu-check/cache ] && set -- --cache "$PWD/.gpu-check/cache" "$@"
"$PY" -c "import sys, torch, transformers, trl; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__, '| cuda', torch.cuda.is_available())"
exec "$PY" scripts/gpu_check.py "$@"  # what `make gpu-check` runs (make may be missing there)
