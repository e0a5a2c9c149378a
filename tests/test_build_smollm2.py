"""Integration: token and context atom sets from the real SmolLM2 on a small slice of the default
corpus (Python stdlib docstrings), into the real database, answered by SQL next_token."""

from __future__ import annotations

import psycopg
import pytest
from optional_parts import require_smollm2

from projection.build import BuildOptions, build


@pytest.mark.integration
def test_smollm2_token_and_context_sets(server_url: str) -> None:
    from hartonomous.model import load_model, load_tokenizer

    require_smollm2()
    model, tokenizer = load_model("smollm2", "cpu"), load_tokenizer("smollm2")
    common = dict(model="smollm2", max_tokens=3000, holdout_chars=3000, replace=True)
    results = {}
    with psycopg.connect(server_url) as conn:
        for kind in ("token", "context"):
            results[kind] = build(conn, BuildOptions(name=f"smollm2-it-{kind}", kind=kind, **common),
                                  model=model, tokenizer=tokenizer)
        token, context = results["token"], results["context"]
        assert token.atoms == token.tokens == 49152
        trained = context.stats.corpus.train_tokens
        assert trained == 3000
        positions = trained - -(-trained // 512)  # every position of a 512-token chunk but the last
        assert positions < context.stats.atoms.before_merge <= 8 * positions  # soft target: the top-8 per position
        assert token.stats.holdout.text == context.stats.holdout.text  # same seed, same holdout
        # measured: LMDS on SmolLM2's 49152 x 576 embeddings keeps trustworthiness ~0.75
        assert 0.65 < token.stats.projection.trustworthiness < 0.9
        # distilled context atoms agree with the exact argmax far more often than token atoms
        assert context.stats.bandwidth.top1 > 0.1 > token.stats.bandwidth.top1
        ids = tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
        for kind in ("token", "context"):
            rows = conn.execute("SELECT token_id, probability FROM next_token(%s, atom_set => %s)",
                                (ids, f"smollm2-it-{kind}")).fetchall()
            assert rows and sum(p for _, p in rows) == pytest.approx(1.0)
