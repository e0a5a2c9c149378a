#!/usr/bin/env bash
# Install PostgreSQL 15 + PostGIS 3 + pgvector on Debian/Ubuntu. Idempotent: anything present is skipped.
# pgvector is not packaged for bookworm, so it is built from Debian's own source package (trixie).
set -euo pipefail

PG_MAJOR="${PG_MAJOR:-15}"
PG_BIN="/usr/lib/postgresql/${PG_MAJOR}/bin"
PG_CONFIG="${PG_BIN}/pg_config"
SHAREDIR="/usr/share/postgresql/${PG_MAJOR}/extension"

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }

have_postgres() { [ -x "${PG_BIN}/initdb" ] && [ -x "${PG_BIN}/postgres" ]; }
have_postgis()  { [ -f "${SHAREDIR}/postgis.control" ]; }
have_pgvector() { [ -f "${SHAREDIR}/vector.control" ]; }
have_devel()    { [ -x "${PG_CONFIG}" ] && [ -f "$("${PG_CONFIG}" --includedir-server 2>/dev/null || echo /nonexistent)/postgres.h" ]; }

# Headless Chromium for the playground's browser test: Debian's package, never a downloaded browser.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  say "installing chromium (headless browser for tests/test_playground_e2e.py)"
  as_root=""; [ "$(id -u)" -ne 0 ] && as_root="sudo"
  { $as_root apt-get update -qq \
      && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
    || say "warning: could not install chromium; the playground browser test is skipped locally and fails under CI"
fi

if have_postgres && have_postgis && have_pgvector; then
  say "PostgreSQL ${PG_MAJOR}, PostGIS and pgvector are already installed"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  die "this is not a Debian/Ubuntu system, so PostgreSQL ${PG_MAJOR} + PostGIS 3 + pgvector cannot be installed automatically. Either install them yourself, run 'docker compose up -d db' and export HARTONOMOUS_DATABASE_URL=postgresql://hartonomous:hartonomous@localhost:5432/hartonomous, or point HARTONOMOUS_DATABASE_URL at an existing server."
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "run as root or install sudo: installing system packages needs root"
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive

pkgs=()
have_postgres || pkgs+=("postgresql-${PG_MAJOR}")
have_postgis  || pkgs+=("postgresql-${PG_MAJOR}-postgis-3")
if ! have_pgvector; then
  have_devel || pkgs+=("postgresql-server-dev-${PG_MAJOR}")
  command -v make >/dev/null 2>&1 || pkgs+=("make")
  command -v gcc  >/dev/null 2>&1 || pkgs+=("gcc")
  command -v dpkg-source >/dev/null 2>&1 || pkgs+=("dpkg-dev")
fi

if [ "${#pkgs[@]}" -gt 0 ]; then
  say "installing: ${pkgs[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

if ! have_pgvector; then
  say "building pgvector from Debian's source package (not packaged for this release)"
  SRC_LIST=/etc/apt/sources.list.d/hartonomous-pgvector-src.sources
  if ! $SUDO apt-get source --print-uris pgvector >/dev/null 2>&1; then
    $SUDO tee "${SRC_LIST}" >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    $SUDO apt-get update -qq
  fi
  build="$(mktemp -d)"
  trap 'rm -rf "${build}"' EXIT
  ( cd "${build}" && apt-get source -qq --download-only pgvector >/dev/null 2>&1 \
      && dpkg-source -x --no-check ./*.dsc src >/dev/null ) \
    || die "could not fetch pgvector's source package; install pgvector for PostgreSQL ${PG_MAJOR} by hand"
  make -s -C "${build}/src" PG_CONFIG="${PG_CONFIG}" OPTFLAGS="" >/dev/null
  $SUDO make -s -C "${build}/src" PG_CONFIG="${PG_CONFIG}" install >/dev/null
  have_pgvector || die "pgvector built but vector.control is not in ${SHAREDIR}"
fi
say "PostgreSQL ${PG_MAJOR}: $("${PG_BIN}/postgres" --version)"
say "PostGIS and pgvector are installed"
