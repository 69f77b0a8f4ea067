#!/usr/bin/env bash
# The prepared GPU run (~8 min): actions/s from 1K to 1M envs (CartPole, Breakout-MinAtar,
# Spread-8), then the host side (issue 28): sample_batch() and sample() + reading every episode
# against the bare rollout, CartPole-v1 random policy at 64K, 256K and 1M envs.
#
#   bash benchmarks/gpu.sh                 # from anywhere; runs in the repository root
#   OUT=/some/dir bash benchmarks/gpu.sh   # write gpu.json / gpu.md there (default benchmarks/results)
#   bash benchmarks/gpu.sh --max-width 262144 --budget-s 300   # extra arguments go to gpu.py
#   bash benchmarks/gpu.sh --parts host --sampler-kwargs '{"prefetch": true}'   # host side only
#
# It runs `python -m benchmarks.gpu` from the repository root (the scripts are a package).
#
# The Python that runs it, the first of:
#   1. $GPU_VENV (default /tmp/jaxsampler-gpu-venv) if its JAX already sees a GPU;
#   2. python3 itself if its JAX sees a GPU (an image that ships JAX with CUDA): the project
#      is used from this checkout (PYTHONPATH) and the packages it lacks are installed with
#      --no-deps into $GPU_SITE (default /tmp/jaxsampler-gpu-site);
#   3. a new venv at $GPU_VENV with `pip install -e .` and `jax[cuda12]` pinned to the jax
#      version the project resolved to (pyproject pins jax>=0.6,<0.12; jax[cuda12]==X pulls
#      the matching CUDA plugin and libraries).
# Offline machines: put wheels in ./.whl and every install reads only them
# (--no-index --find-links .whl). For case 2 the project needs, beyond JAX/flax/numpy:
# gymnax, gymnasium, farama-notifications, httptools, msgpack, six, seaborn, matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GPU_VENV:-/tmp/jaxsampler-gpu-venv}"
SITE="${GPU_SITE:-/tmp/jaxsampler-gpu-site}"
OUT_DIR="${OUT:-benchmarks/results}"
has_gpu() { "$1" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null; }
pip_src=()
[ -d .whl ] && pip_src=(--no-index --find-links .whl)

if [ -x "$VENV/bin/python" ] && has_gpu "$VENV/bin/python"; then
    PY="$VENV/bin/python"
elif has_gpu python3; then
    PY=python3
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    missing=()
    for pair in gymnax:gymnax gymnasium:gymnasium farama_notifications:farama-notifications \
        httptools:httptools msgpack:msgpack six:six seaborn:seaborn matplotlib:matplotlib; do
        python3 -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "gpu.sh: installing into $SITE: ${missing[*]}"
        python3 -m pip install -q "${pip_src[@]}" --no-deps --target "$SITE" "${missing[@]}"
    fi
else
    python3 -m venv "$VENV"
    PY="$VENV/bin/python"
    "$PY" -m pip install -q "${pip_src[@]}" -e .
    JAXV="$("$PY" -c 'import jax; print(jax.__version__)')"
    "$PY" -m pip install -q "${pip_src[@]}" "jax[cuda12]==$JAXV"
fi
has_gpu "$PY" || {
    echo "gpu.sh: JAX sees no GPU: $("$PY" -c 'import jax; print(jax.devices())' 2>&1 | tail -1)" >&2
    exit 1
}
"$PY" -c 'import jax, jaxsampler; print("gpu.sh: jax", jax.__version__, jax.devices(), jaxsampler.__file__)'
nvidia-smi || true
export PYTHONUNBUFFERED=1
exec "$PY" -m benchmarks.gpu --out "$OUT_DIR" "$@"
