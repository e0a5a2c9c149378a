#!/usr/bin/env bash
# The main job on the embedded database. Grows as features land; never prints success it did not earn.
set -euo pipefail
HT=.venv/bin/hartonomous
$HT db status
