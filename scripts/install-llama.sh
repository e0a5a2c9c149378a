#!/usr/bin/env bash
# Install llama-cpp-python (the `llama` extra: the llama runtime and bench --speculative's peer) into
# the venv. PyPI ships it as a source release, and compiling llama.cpp takes minutes on 2 cores, so
# the wheel is built once per version, CPU and compiler, and kept outside the checkout in
# ${HARTONOMOUS_WHEEL_CACHE:-~/.cache/hartonomous/wheels}: a later install (a fresh clone's
# `make test`, a new venv) installs that wheel in seconds. llama.cpp compiles for the host CPU
# (GGML_NATIVE), so the CPU's flags are part of the key: a wheel never runs on a CPU it was not built
# for. Idempotent: nothing to do when the venv already imports llama_cpp.
set -euo pipefail

PY="${PY:-.venv/bin/python}"
say() { printf '[install] %s\n' "$*"; }

if "${PY}" -c "import llama_cpp" 2>/dev/null; then
  say "llama-cpp-python ready ($("${PY}" -c 'import llama_cpp; print(llama_cpp.__version__)'))"
  exit 0
fi

# The requirement, as pyproject.toml's `llama` extra states it.
SPEC="$("${PY}" - <<'EOF'
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["llama"]
print(next(r for r in extra if r.startswith("llama-cpp-python")))
EOF
)"
cpu="$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || uname -m)"
compiler="$( (c++ --version 2>/dev/null || echo none) | head -1)"
pytag="$("${PY}" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
key="$(printf '%s\n' "${SPEC}" "${cpu}" "${compiler}" "${pytag}" | sha256sum | cut -c1-16)"
CACHE="${HARTONOMOUS_WHEEL_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/hartonomous/wheels}/llama-${key}"

newest_wheel() { ls -t "${CACHE}"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true; }

# Without it the llama tests skip, and fail under CI (CI=true), where nothing may be skipped silently.
give_up() {
  if [ -n "${CI:-}" ]; then say "error: $*"; exit 1; fi
  say "warning: $*; the llama runtime's tests will skip (and fail under CI=true)"; exit 0
}

wheel="$(newest_wheel)"
if [ -z "${wheel}" ]; then
  command -v cmake >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1 \
    || give_up "building llama-cpp-python needs cmake and a C++ compiler (apt-get install cmake g++)"
  jobs="$(nproc 2>/dev/null || echo 2)"
  say "compiling llama-cpp-python (${SPEC}) once for this CPU with ${jobs} jobs: about 12 minutes on 2 cores;"
  say "the wheel is kept in ${CACHE}"
  mkdir -p "${CACHE}"
  started=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL="${jobs}" "${PY}" -m pip wheel -q --no-deps -w "${CACHE}" "${SPEC}" \
    || give_up "pip could not build llama-cpp-python (${SPEC}); its output is above"
  say "compiled in $(( $(date +%s) - started )) s"
  wheel="$(newest_wheel)"
  [ -n "${wheel}" ] || give_up "pip built no wheel into ${CACHE}"
fi
"${PY}" -m pip install -q --no-warn-conflicts "${wheel}" || give_up "pip could not install ${wheel}"
say "llama-cpp-python ready (${wheel##*/}, from ${CACHE})"
