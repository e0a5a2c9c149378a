#!/usr/bin/env bash
# Build and install Citus 12.1.12 for PostgreSQL 15 from an upstream source tarball. Idempotent.
#
# Debian does not package Citus and its package repository is not reachable from the development and
# CI machines, so the tarball sits beside the checkout (../shared/vendor/ on dev machines,
# /work/shared/vendor on this CI host). Its path comes from HARTONOMOUS_CITUS_TARBALL; without it the
# two vendor folders are tried. With no tarball the script says so and exits 0 (Citus is optional:
# tests/test_citus.py skips outside CI and fails under CI=true). Users install Citus's official
# packages instead (docs/scale-out.md). The tarball is never copied into the repository.
set -euo pipefail

PG_MAJOR="${PG_MAJOR:-15}"
CITUS_VERSION="12.1.12"
PG_CONFIG="/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config"
SHAREDIR="/usr/share/postgresql/${PG_MAJOR}/extension"
HERE="$(cd "$(dirname "$0")/.." && pwd)"

say() { printf '[install-citus] %s\n' "$*"; }
die() { printf '[install-citus] error: %s\n' "$*" >&2; exit 1; }

if [ -f "${SHAREDIR}/citus.control" ]; then
  say "Citus is already installed for PostgreSQL ${PG_MAJOR} ($(grep default_version "${SHAREDIR}/citus.control"))"
  exit 0
fi

tarball="${HARTONOMOUS_CITUS_TARBALL:-}"
if [ -z "${tarball}" ]; then
  for candidate in "${HERE}/../shared/vendor/citus-${CITUS_VERSION}.tar.gz" \
                   "/work/shared/vendor/citus-${CITUS_VERSION}.tar.gz"; do
    if [ -f "${candidate}" ]; then tarball="${candidate}"; break; fi
  done
fi
if [ -z "${tarball}" ]; then
  say "no Citus tarball (set HARTONOMOUS_CITUS_TARBALL to citus-${CITUS_VERSION}.tar.gz); skipping Citus, see docs/scale-out.md"
  exit 0
fi
[ -f "${tarball}" ] || die "HARTONOMOUS_CITUS_TARBALL=${tarball} does not exist"
command -v apt-get >/dev/null 2>&1 \
  || die "not a Debian/Ubuntu system: install Citus ${CITUS_VERSION} for PostgreSQL ${PG_MAJOR} from Citus's packages (docs/scale-out.md)"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "run as root or install sudo: building Citus installs system packages"
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
deps=(postgresql-server-dev-${PG_MAJOR} liblz4-dev libzstd-dev libkrb5-dev libssl-dev libselinux1-dev
      libxslt1-dev libpam0g-dev libreadline-dev zlib1g-dev make gcc)
missing=()
for p in "${deps[@]}"; do dpkg -s "${p}" >/dev/null 2>&1 || missing+=("${p}"); done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing build dependencies: ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build="$(mktemp -d)"
trap 'rm -rf "${build}"' EXIT
say "building Citus ${CITUS_VERSION} from ${tarball} (about a minute on 2 cores)"
tar xzf "${tarball}" -C "${build}"
src="$(find "${build}" -mindepth 1 -maxdepth 1 -type d | head -n1)"
( cd "${src}" \
  && ./configure -q PG_CONFIG="${PG_CONFIG}" --without-libcurl >"${build}/configure.log" 2>&1 \
  && make -s -j"$(nproc)" >"${build}/make.log" 2>&1 ) \
  || { tail -n 30 "${build}"/*.log >&2; die "Citus did not build; see the log above"; }
$SUDO make -s -C "${src}" install >"${build}/install.log" 2>&1 \
  || { tail -n 30 "${build}/install.log" >&2; die "make install of Citus failed; see the log above"; }
[ -f "${SHAREDIR}/citus.control" ] || die "Citus built but citus.control is not in ${SHAREDIR}"
say "Citus ${CITUS_VERSION} installed for PostgreSQL ${PG_MAJOR}"
