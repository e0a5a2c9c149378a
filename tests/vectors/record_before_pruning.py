"""Record what next_token, draft_tokens and generate_tokens returned before exact pruning and the
carried context state: tests/vectors/next_token_before_pruning.json.

The tests in tests/test_kernel_pruning.py check that today's functions, on both kernels, still
return these rows: every row with a non-zero probability, the same token ids in the same order,
probabilities and cumulative probabilities within 1e-12 (rows of probability exactly 0 may go), and
the same generated ids.

How the recording was made (once, at commit 2bf19a9, the last one before pruning; do not re-run it
to make a failing test pass): the PL/pgSQL reference (SET hartonomous.kernel = 'plpgsql') of that
commit, on the narrow sets of tests/hand_sets.py `pruning_sets`, written inside a transaction that
is rolled back. Per set, contexts of 2, 40, 300 and 1500 tokens drawn with
numpy.random.default_rng(5), each with the six argument tuples of CALLS (next_token); two prompts
(40 and 600 tokens) drafted for 24 steps greedy and sampled (draft_tokens); a 600-token prompt
continued for 64 tokens greedy and sampled (generate_tokens). `sets_digest` fingerprints the sets.

  PYTHONPATH=. .venv/bin/python tests/vectors/record_before_pruning.py [--url OWNER_URL]

Without --url it starts a throwaway embedded cluster, as the tests do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import psycopg

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from recording import main  # noqa: E402
from hand_sets import add_set, pruning_sets, sets_digest  # noqa: E402

RECORDED_AT = "2bf19a9"
OUTPUT = TESTS / "vectors" / "next_token_before_pruning.json"
CONTEXT_LENGTHS = (2, 40, 300, 1500)
# temperature, top_k, top_p, search_radius, max_neighbors, repetition_penalty
CALLS = ((1.0, 40, 0.9, None, 100, 1.0), (0.7, 0, 1.0, None, 600, 1.3), (0.0, 40, 0.9, None, 30, 1.0),
         (1.5, 5, 0.8, 0.3, 50, 0.7), (0.05, 0, 1.0, None, 100, 1.0), (3.0, 0, 1.0, None, 100, 0.8))
# temperature, top_k, top_p, repetition_penalty, seed
DRAWS = ((0.0, 40, 0.9, 1.0, None), (0.9, 0, 1.0, 1.2, 7))
NEXT_TOKEN = "SELECT * FROM next_token(%s, %s, %s, %s, %s, %s, %s, %s)"
DRAFT = ("SELECT step, token_id, token_ids, probabilities FROM draft_tokens(%s, 24, %s, %s, %s, NULL, 100, %s,"
         " %s, %s)")
GENERATE = "SELECT generate_tokens(%s, 64, %s, %s, %s, NULL, 100, %s, %s, %s)"


def record(url: str) -> dict:
    sets = pruning_sets()
    rng = np.random.default_rng(5)
    cases, drafts, generations = [], [], []
    with psycopg.connect(url) as db:
        db.execute("SET hartonomous.kernel = 'plpgsql'")
        for s in sets.values():
            add_set(db, s)
            for n in CONTEXT_LENGTHS:
                context = rng.integers(0, s.vocab_size, n).tolist()
                for call in CALLS:
                    rows = db.execute(NEXT_TOKEN, (context, *call[:5], s.name, call[5])).fetchall()
                    cases.append({"atom_set": s.name, "context": context, "temperature": call[0],
                                  "top_k": call[1], "top_p": call[2], "search_radius": call[3],
                                  "max_neighbors": call[4], "repetition_penalty": call[5],
                                  "rows": [list(r) for r in rows]})
            for n in (40, 600):
                prompt = rng.integers(0, s.vocab_size, n).tolist()
                for t, k, p, penalty, seed in DRAWS:
                    steps = db.execute(DRAFT, (prompt, t, k, p, s.name, penalty, seed)).fetchall()
                    drafts.append({"atom_set": s.name, "context": prompt, "temperature": t, "top_k": k,
                                   "top_p": p, "repetition_penalty": penalty, "seed": seed,
                                   "steps": [list(r) for r in steps]})
            prompt = rng.integers(0, s.vocab_size, 600).tolist()
            for t, k, p, penalty, seed in DRAWS:
                (ids,) = db.execute(GENERATE, (prompt, t, k, p, s.name, penalty, seed)).fetchone()
                generations.append({"atom_set": s.name, "context": prompt, "temperature": t, "top_k": k,
                                    "top_p": p, "repetition_penalty": penalty, "seed": seed, "generated": ids})
        db.rollback()
    return {"what": "next_token, draft_tokens and generate_tokens before exact pruning "
                    "(see tests/vectors/record_before_pruning.py)",
            "functions": f"the PL/pgSQL reference of sql/ at commit {RECORDED_AT}",
            "sets_digest": sets_digest(sets), "cases": cases, "drafts": drafts, "generations": generations}


if __name__ == "__main__":
    main(record, OUTPUT, __doc__.splitlines()[0], ("cases", "drafts", "generations"))
