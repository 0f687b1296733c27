#!/usr/bin/env bash
# The gpu profile on a lent accelerator (the device tool's `run`): the calibration chapter at
# Paper I's size, its record written to results/gpu/ and copied to $OUT with the executed
# notebook and the log.
#
#   here, once:  benchmarks/gpu_profile.sh prepare
#       the wheels the device's image lacks (papermill, nbformat, ipykernel and theirs, and
#       the pinned filelock, for its Python 3.12) -> .device-wheels/ (about 19 MB; ignored by
#       git through .git/info/exclude)
#   there:       benchmarks/gpu_profile.sh run
#       as the device run's command, with carry [".device-wheels"] and timeout_s 600: the
#       profile's 180 s of training (time_budget_s), the step timing, the measurements and the
#       start-up, about 5 minutes in all
#
# The image's python3 is a virtual environment of its own (/opt/torch/.venv) with PyTorch
# (CUDA), numpy, pandas and matplotlib; the wheels are unpacked to /tmp/site and reached
# through a .pth file, after the image's own packages, so that none of them is replaced; the
# pinned filelock alone goes first (the store's lease needs its 4.x). The record's provenance
# names the versions that ran. The kernels are not compiled there (ATTENTION_DYNAMICS_NATIVE=0):
# on CUDA the attention is PyTorch's either way. Commit results/gpu/ from $OUT;
# tests/test_gpu_results.py checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.device-wheels
pins() { grep -E "^($1)==" requirements.txt; }

case "${1:-}" in
prepare)
  .venv/bin/pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$WHEELS" \
    $(pins 'papermill|nbformat|ipykernel|filelock')
  grep -qx "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude
  du -sh "$WHEELS"
  ;;
run)
  [ -d "$WHEELS" ] || { echo "no $WHEELS/: run '$0 prepare' here first, then carry it" >&2; exit 2; }
  : "${OUT:?OUT must name the folder whose files come back}"
  trap 'cp -r results/gpu book/chapters-gpu "$OUT"/ 2>/dev/null || true' EXIT
  exec > >(tee "$OUT/gpu_profile.log") 2>&1
  python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
    --target /tmp/site "$WHEELS"/*.whl
  python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
    --target /tmp/site-first "$WHEELS"/filelock-*.whl
  python3 -c "import site; print('/tmp/site', file=open(site.getsitepackages()[0] + '/zz_book_wheels.pth', 'w'))"
  export PYTHONPATH="$PWD/lib:/tmp/site-first" PYTHONUNBUFFERED=1 ATTENTION_DYNAMICS_NATIVE=0 \
    ATTENTION_DYNAMICS_ARTIFACTS=/tmp/gpu-store
  python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
from filelock import SoftFileLease; import pandas, matplotlib, seaborn, scipy.stats, yaml, papermill, ipykernel; \
print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -m attention_dynamics.book --profile gpu --only wt_calibration --workers 1
  ;;
*)
  echo "usage: $0 prepare | run" >&2
  exit 2
  ;;
esac
