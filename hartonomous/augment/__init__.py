"""Augmented inference: the exact model mixed with the atom store, p = (1 - λ) p_exact + λ p_store.

The store (an atom set of the user's corpus, with its memory of past generations) remembers text
the model never saw; a gate fitted on the set's calibration split says, step by step, how far to
trust it (λ). `gate` fits and applies it, `mixture` mixes the two distributions before the shared
sampler, `backend` is the engine's path, `calibrate` walks a text to collect what a fit needs.
docs/augmented.md has the definitions and the measurements.
"""
