#!/usr/bin/env bash
# Build and install the hartonomous_kernel extension (ext/hartonomous_kernel: next_token's hot loop
# in C) into the local PostgreSQL 15 with PGXS, as pgvector is. Idempotent: reinstalls only when the
# installed library is older than the sources. Without the server headers or a compiler it says so
# and the PL/pgSQL path runs (docs/sql.md#the-native-kernel); HARTONOMOUS_NO_KERNEL=1 skips it.
set -euo pipefail

PG_MAJOR="${PG_MAJOR:-15}"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config}"
SRC="$(cd "$(dirname "$0")/../ext/hartonomous_kernel" && pwd)"

say() { printf '[install] %s\n' "$*"; }

if [ "${HARTONOMOUS_NO_KERNEL:-0}" = "1" ]; then
  say "HARTONOMOUS_NO_KERNEL=1: the native kernel is not built; next_token runs its PL/pgSQL path"
  exit 0
fi
have_devel() { [ -x "${PG_CONFIG}" ] && [ -f "$("${PG_CONFIG}" --includedir-server 2>/dev/null || echo /nonexistent)/postgres.h" ]; }
if ! have_devel && command -v apt-get >/dev/null 2>&1; then
  as_root=""; [ "$(id -u)" -ne 0 ] && as_root="sudo"
  say "installing postgresql-server-dev-${PG_MAJOR} (headers for the native kernel)"
  { $as_root apt-get update -qq && $as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "postgresql-server-dev-${PG_MAJOR}" make gcc >/dev/null; } || true
fi
if ! have_devel \
   || ! command -v make >/dev/null 2>&1 || ! command -v gcc >/dev/null 2>&1; then
  say "warning: no PostgreSQL ${PG_MAJOR} server headers or compiler; the native kernel is not built (next_token runs its PL/pgSQL path)"
  exit 0
fi

LIB="$("${PG_CONFIG}" --pkglibdir)/hartonomous_kernel.so"
CONTROL="$("${PG_CONFIG}" --sharedir)/extension/hartonomous_kernel.control"
newest="$(find "${SRC}" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.sql' -o -name '*.control' -o -name Makefile \) -newer "${LIB}" 2>/dev/null | head -1 || true)"
# Installed scripts the sources no longer have (versions before the cut, docs/sql.md "The native
# kernel"): removed, so that the server offers no version or update path the sources do not.
stale=()
for f in "$(dirname "${CONTROL}")"/hartonomous_kernel--*.sql; do
  if [ -e "${f}" ] && [ ! -e "${SRC}/$(basename "${f}")" ]; then stale+=("${f}"); fi
done
if [ -f "${LIB}" ] && [ -f "${CONTROL}" ] && [ -z "${newest}" ] && [ "${#stale[@]}" -eq 0 ]; then
  say "the native kernel (hartonomous_kernel) is installed and up to date"
  exit 0
fi

SUDO=""
if [ ! -w "$("${PG_CONFIG}" --pkglibdir)" ]; then
  command -v sudo >/dev/null 2>&1 && SUDO="sudo"
fi
build="$(mktemp -d)"
trap 'rm -rf "${build}"' EXIT
cp "${SRC}"/Makefile "${SRC}"/*.c "${SRC}"/*.sql "${SRC}"/*.control "${build}/"
cp "${SRC}"/*.h "${build}/" 2>/dev/null || true
say "building the native kernel (ext/hartonomous_kernel) with PGXS"
make -s -C "${build}" PG_CONFIG="${PG_CONFIG}" >/dev/null
if [ "${#stale[@]}" -gt 0 ]; then
  say "removing ${#stale[@]} installed script(s) of kernel versions the sources no longer have"
  ${SUDO} rm -f "${stale[@]}"
fi
${SUDO} make -s -C "${build}" PG_CONFIG="${PG_CONFIG}" install >/dev/null
say "installed hartonomous_kernel into $("${PG_CONFIG}" --pkglibdir)"
