#!/bin/sh
# Prepare `make gpu-check` for a GPU machine WITHOUT network whose Python has CUDA torch but not
# mixrl's other dependencies (this workplace's device machine: python3 3.12 with torch, accelerate,
# peft, pyarrow, ... but no trl, hydra, datasets, math-verify, and an older transformers). Run it
# HERE, with network, from the repository root; it fills .gpu-check/ (git-ignored):
#   .gpu-check/wheels/  the pure-Python wheels of what is missing there, at the versions .venv runs
#   .gpu-check/cache/   the built-in models (mixrl model build-tiny [--bpe]), so they are not rebuilt there
# then carry .gpu-check with the working tree and run scripts/gpu_check_device.sh there
# (docs/how-to/gpu-check.md, "Check a GPU machine"). vLLM is not among the wheels (its wheel is hundreds of MB):
# where the GPU machine has no vLLM, the vLLM paths are reported as skipped.
set -eu
DEST=.gpu-check
VENV_PY=${VENV_PY:-.venv/bin/python}
TARGET_PY=${TARGET_PY:-3.12}
if [ ! -x "$VENV_PY" ]; then
    echo "error: $VENV_PY not found: run make install first (the versions come from .venv), or set VENV_PY=/path/to/python" >&2
    exit 2
fi
mkdir -p "$DEST/wheels" "$DEST/cache"
# the versions this checkout's tests run with
PINS=$("$VENV_PY" - <<'PY'
from importlib import metadata
names = ["trl", "transformers", "hydra-core", "omegaconf", "datasets", "dill", "multiprocess", "fsspec",
         "math-verify", "latex2sympy2_extended"]
print(" ".join(f"{n}=={metadata.version(n)}" for n in names))
PY
)
ANTLR=$("$VENV_PY" -c "from importlib import metadata; print(metadata.version('antlr4-python3-runtime'))")
echo "gpu-check wheels: $PINS antlr4-python3-runtime==$ANTLR"
# shellcheck disable=SC2086
"$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/wheels" $PINS
# antlr4-python3-runtime 4.9.3 (what hydra-core 1.3 needs) is published as a source archive only: build its wheel here
"$VENV_PY" -m pip wheel -q --no-deps -w "$DEST/wheels" "antlr4-python3-runtime==$ANTLR"
# the built-in models: copied from this machine's cache when built there already (same cache key), else built
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VENV_PY" - "$DEST/cache" <<'PY'
import shutil, sys
from pathlib import Path
from mixrl.models import tiny_bpe, tiny_spec
for module, name in ((tiny_spec, "tiny"), (tiny_bpe, "tiny-bpe")):
    src = module.default_path()
    dst = Path(sys.argv[1]) / name / src.name
    if module.is_complete(src) and not dst.exists():
        shutil.copytree(src, dst)
PY
MIXRL_CACHE="$PWD/$DEST/cache" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VENV_PY" -m mixrl.cli.main model build-tiny --quiet
MIXRL_CACHE="$PWD/$DEST/cache" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VENV_PY" -m mixrl.cli.main model build-tiny --bpe --quiet
du -sh "$DEST"/wheels "$DEST"/cache
