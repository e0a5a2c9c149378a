"""Risk-scored adaptive sampling (the original geometry-aware inference design, seed 002).

Each step's risk (the atom set's predictor: hartonomous/risk.py, read through the backend's
`signals`) picks the step's sampler:

    risk <  explore_risk                  standard:  top_p = standard_p, the config's temperature
    explore_risk <= risk < cautious_risk  explore:   top_p = explore_p, temperature = explore_temp
    risk >= cautious_risk                 cautious, by cautious_mode:
        flatten  top_p = 0.99, temperature = 2.0 (the original's constants)
        signal   the standard sampler, and the step's event says `mode = "cautious"` (the caller
                 decides what an uncertain token means)
        abstain  no token: the generation stops with finish_reason "abstain"

top-k and the repetition penalty stay the config's. GenerationConfig (hartonomous/generation_config.py)
holds and validates the options, CAUTIOUS_MODES included; this module only applies them.
"""

from __future__ import annotations

from dataclasses import replace

from hartonomous.generation_config import GenerationConfig, SamplerArgs

FLATTEN_P, FLATTEN_TEMPERATURE = 0.99, 2.0


def step_sampler(config: GenerationConfig, risk: float) -> tuple[str, SamplerArgs | None]:
    """(mode, sampler) of one step: mode is standard | explore | cautious | abstain; no sampler to abstain."""
    base = config.sampler
    if risk < config.explore_risk:
        return "standard", replace(base, top_p=config.standard_p)
    if risk < config.cautious_risk:
        return "explore", replace(base, top_p=config.explore_p, temperature=config.explore_temp)
    if config.cautious_mode == "flatten":
        return "cautious", replace(base, top_p=FLATTEN_P, temperature=FLATTEN_TEMPERATURE)
    if config.cautious_mode == "signal":
        return "cautious", replace(base, top_p=config.standard_p)
    return "abstain", None
