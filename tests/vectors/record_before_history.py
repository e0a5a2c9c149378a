"""Record what next_token returned before history atoms existed: tests/vectors/next_token_before_history.json.

The test `test_history_off_is_exactly_the_result_before_history_atoms` (tests/test_sql_next_token.py)
checks that next_token with history atoms turned off (history_weight => 0, or history_window => 0)
still returns these rows: the same token ids in the same order, probabilities within 1e-12.

How the recording was made (once; do not re-run it to make a failing test pass):
  the functions are the pre-history ht_context_centroid and ht_next_token (sql/ at commit 4217e99),
  as frozen, renamed to pg_temp.*_before_history, in tests/vectors/next_token_before_history.sql at
  commit 87f1b9d. This script reads that file from git history (`git show 87f1b9d:...`), creates the
  functions in its own session, writes the reference sets of tests/hand_sets.py inside a transaction
  that it rolls back, and calls the old functions on 20 fixed (atom set, context, sampler arguments)
  cases: per set, contexts of 1, 5, 40 and 300 tokens drawn with numpy.random.default_rng(3), with
  the four argument tuples of CALLS. `sets_digest` fingerprints the sets so the test can tell when
  they are no longer the ones recorded on.

  PYTHONPATH=. .venv/bin/python tests/vectors/record_before_history.py [--url OWNER_URL]

Without --url it starts a throwaway embedded cluster, as the tests do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import psycopg

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from recording import main  # noqa: E402
from hand_sets import add_set, reference_sets, sets_digest  # noqa: E402

FROZEN_COMMIT = "87f1b9d"
FROZEN_SQL = "tests/vectors/next_token_before_history.sql"
OUTPUT = TESTS / "vectors" / "next_token_before_history.json"
CONTEXT_LENGTHS = (1, 5, 40, 300)
CALLS = ((1.0, 40, 0.9, None, 100, 1.0), (0.7, 0, 1.0, None, 700, 1.3), (0.0, 40, 0.9, None, 30, 1.0),
         (1.5, 5, 0.8, 0.3, 50, 0.7))       # temperature, top_k, top_p, search_radius, max_neighbors, rep. penalty
BEFORE_HISTORY = (
    "SELECT h.* FROM atom_sets s, pg_temp.ht_next_token_before_history(s.id, s.kernel, s.bandwidth,"
    " pg_temp.ht_context_centroid_before_history(s.id, s.centroid_window, s.centroid_decay, %s),"
    " %s, %s, %s, %s, %s, %s, %s) h WHERE s.name = %s")


def record(url: str) -> dict:
    frozen = subprocess.run(["git", "show", f"{FROZEN_COMMIT}:{FROZEN_SQL}"], cwd=TESTS.parent,
                            capture_output=True, text=True, check=True).stdout
    sets = reference_sets()
    rng = np.random.default_rng(3)
    cases = []
    with psycopg.connect(url) as db:
        db.execute(frozen)
        for s in sets.values():
            add_set(db, s)
            for n, call in zip(CONTEXT_LENGTHS, CALLS):
                context = rng.integers(0, s.vocab_size, n).tolist()
                rows = db.execute(BEFORE_HISTORY, (context, context, *call, s.name)).fetchall()
                cases.append({"atom_set": s.name, "context": context, "temperature": call[0], "top_k": call[1],
                              "top_p": call[2], "search_radius": call[3], "max_neighbors": call[4],
                              "repetition_penalty": call[5], "rows": [list(r) for r in rows]})
        db.rollback()
    return {"what": "next_token's rows before history atoms (see tests/vectors/record_before_history.py)",
            "functions": f"{FROZEN_SQL} at commit {FROZEN_COMMIT}", "sets_digest": sets_digest(sets),
            "cases": cases}


if __name__ == "__main__":
    main(record, OUTPUT, __doc__.splitlines()[0])
