#!/usr/bin/env bash
# The prepared GPU run: actions/s from 1K to 1M envs (CartPole, Breakout-MinAtar, Spread-8).
#
#   bash benchmarks/gpu.sh                 # from the repository root
#   OUT=/some/dir bash benchmarks/gpu.sh   # write gpu.json / gpu.md there (default benchmarks/results)
#
# Python environment, first that works:
#   1. $GPU_VENV (default /tmp/jaxsampler-gpu-venv) if its python already sees a GPU through JAX;
#   2. a new venv with the system site-packages (an image that ships JAX with CUDA): the
#      project is installed with `pip install -e . --no-deps` plus what it lacks, taken from
#      ./.whl if that folder exists (offline machines: carry the wheels there), else PyPI;
#   3. otherwise `pip install -e .` and `jax[cuda12]` pinned to the jax version the project
#      resolved to (pyproject pins jax>=0.6,<0.12; jax[cuda12]==X pulls the matching plugin).
# Extra arguments go to gpu.py (e.g. --max-width 262144, --budget-s 300).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GPU_VENV:-/tmp/jaxsampler-gpu-venv}"
PY="$VENV/bin/python"
OUT_DIR="${OUT:-benchmarks/results}"
has_gpu() { "$1" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; }
pip_src=()
[ -d .whl ] && pip_src=(--no-index --find-links .whl)

if ! { [ -x "$PY" ] && has_gpu "$PY"; }; then
    python3 -m venv --system-site-packages "$VENV"
    if has_gpu "$PY"; then
        echo "gpu.sh: using the system JAX: $("$PY" -c 'import jax; print(jax.__version__)')"
        "$PY" -m pip install -q "${pip_src[@]}" --no-deps -e .
        # What the image may lack (gymnax and its own needs); already-present ones are kept.
        "$PY" -m pip install -q "${pip_src[@]}" "gymnax>=1.0.1,<2" six msgpack httptools
    else
        "$PY" -m pip install -q "${pip_src[@]}" -e .
        JAXV="$("$PY" -c 'import jax; print(jax.__version__)')"
        "$PY" -m pip install -q "${pip_src[@]}" "jax[cuda12]==$JAXV"
    fi
fi
has_gpu "$PY" || { echo "gpu.sh: JAX in $VENV sees no GPU: $("$PY" -c 'import jax; print(jax.devices())')" >&2; exit 1; }
"$PY" -c 'import jax; print("gpu.sh: jax", jax.__version__, jax.devices())'
nvidia-smi || true
export PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu.py --out "$OUT_DIR" "$@"
