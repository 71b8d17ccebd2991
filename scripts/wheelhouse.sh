#!/usr/bin/env bash
# Wheels for the images, built here with this machine's pip (its index, its certificates), so image
# builds need no network: build/wheels/<image>/ holds exactly what that image installs.
# Usage: scripts/wheelhouse.sh [PY]   (PY: the venv's python, default .venv/bin/python)
# WITH_TORCH=1 adds torch (pyproject's pin: the CPU wheel where the machine has it) to the worker image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
W=build/wheels
pin() { "$PY" -c "import tomllib,sys; d=tomllib.load(open('pyproject.toml','rb'))['project']; \
  print(next(r for r in d['dependencies'] + sum(d['optional-dependencies'].values(), []) if r.lower().startswith(sys.argv[1] + '=')))" "$1"; }
rm -rf "$W" && mkdir -p "$W"/{worker,atlas,bubbletea,testbed}
# (this machine's pip.conf names index folders that may not exist; pip warns per package about them)
pipw() { "$PY" -m pip wheel -q --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither' >&2); }
pipw --no-deps -w "$W/worker" .
cp "$W"/worker/testbed-*.whl "$W/atlas/" && cp "$W"/worker/testbed-*.whl "$W/bubbletea/"
pipw -w "$W/atlas" "$(pin pyroute2)"
if [ "${WITH_TORCH:-0}" = 1 ]; then pipw -w "$W/worker" "$(pin torch)" "$(pin numpy)"; fi  # torch_stage moves tensors as numpy bytes
pipw -w "$W/testbed" '.[dev,mininet,docker]' 'setuptools>=68' wheel
rm -f "$W"/testbed/testbed-*.whl   # the testbed image installs the project itself, editable, like make venv
for d in "$W"/*/; do echo "$d: $(ls "$d" | wc -l) wheels, $(du -sh "$d" | cut -f1)"; done
