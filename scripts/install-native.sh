#!/usr/bin/env bash
# The int4 runtime's native forward (hartonomous/runtimes/native/int4_forward.cpp): compiled once per
# venv, torch and CPU with the system's C++ compiler against the venv's torch (no pip, no build
# isolation), ~30-60 s on 2 cores; later runs find it built and return at once. A missing compiler or
# a failed build is one line: the int4 runtime keeps its Python forward (the tests fail under CI).
set -u
PY=${PY:-.venv/bin/python}
if ! "$PY" -m hartonomous.runtimes.native_build; then
    echo "[install] native int4 forward: not built; the int4 runtime keeps its Python forward"
fi
exit 0
