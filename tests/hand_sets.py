"""Hand-made atom sets for the SQL next_token tests, and writing them into the database.

`reference_sets` are the random sets tests/test_sql_next_token.py checks SQL against (and that
tests/vectors/record_before_history.py recorded the pre-history function on); `sets_digest`
fingerprints their arrays, so a recording made from them can tell when they are no longer the
same (a NumPy whose generator streams changed, an edited seed).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import psycopg

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
from reference_next_token import AtomSetData


def add_set(db: psycopg.Connection, s: AtomSetData) -> int:
    """Write `s` (with its own history weight and window) and return its atom_set id."""
    spec = AtomSetSpec(name=s.name, model="test", vocab_size=s.vocab_size, embedding_dim=3,
                       projection="hand-made", kind="token", kernel=s.kernel, bandwidth=s.bandwidth,
                       centroid_window=s.window, centroid_decay=s.decay)
    tokens = TokenRows(np.arange(s.vocab_size), [None] * s.vocab_size, s.token_positions)
    atoms = AtomRows(s.atom_tokens, s.atom_positions, s.atom_weights, sources=s.atom_sources)
    set_id = write_atom_set(db, spec, tokens, atoms).atom_set_id
    db.execute("UPDATE atom_sets SET history_weight = %s, history_window = %s WHERE id = %s",
               (s.history_weight, s.history_window, set_id))
    return set_id


def random_set(name: str, seed: int, **params) -> AtomSetData:
    """50 tokens and 600 atoms at uniform random positions in the unit cube, weights in [0.2, 2]."""
    rng = np.random.default_rng(seed)
    vocab, atoms = 50, 600
    return AtomSetData(name=name, token_positions=rng.random((vocab, 3)),
                       atom_tokens=rng.integers(0, vocab, atoms), atom_positions=rng.random((atoms, 3)),
                       atom_weights=rng.uniform(0.2, 2.0, atoms), **params)


def reference_sets() -> dict[str, AtomSetData]:
    """Random sets; between them every kind of centroid window the history keys handle.

    gauss: no window, decay 1 (keys read the whole context); expo: window 3, decay 0.6 (the set's
    own history atoms on); steep: no window but decay e^-100, so weights beyond 3 steps back count
    as 0 (the effective window is 4, and the keys are summed in blocks of 4 positions); slow:
    window 6, decay 0.9; long: window 20 (keys from running sums, not from a moving frame), decay
    e^-10 (blocks of 31 positions).
    """
    return {
        "gauss": random_set("sqltest_gauss", 1, kernel="gaussian", bandwidth=0.15),
        "expo": random_set("sqltest_expo", 2, kernel="exponential", bandwidth=0.1, window=3, decay=0.6,
                           history_weight=1.5, history_window=8),
        "steep": random_set("sqltest_steep", 3, kernel="gaussian", bandwidth=0.2, decay=math.exp(-100)),
        "slow": random_set("sqltest_slow", 4, kernel="exponential", bandwidth=0.3, window=6, decay=0.9),
        "long": random_set("sqltest_long", 5, kernel="gaussian", bandwidth=0.25, window=20, decay=math.exp(-10)),
    }



def pruning_sets() -> dict[str, AtomSetData]:
    """Random sets with narrow kernels, where most history atoms of a long context lie so far from
    the centroid that the native kernel's exact pruning skips them (tests/vectors/
    record_before_pruning.py recorded next_token on them before pruning existed).

    narrow_gauss: the real sets' key (window 3, decay 0.01) with a bandwidth of 0.01 in the unit
    cube; narrow_expo: the exponential kernel, a short history window and a history weight below
    1; repeats: window 1 and decay 1, so a key is its token's position and repeated tokens give
    history atoms at exactly one distance (ties), with a 12-token vocabulary.
    """
    def narrow(name: str, seed: int, vocab: int = 50, **params) -> AtomSetData:
        rng = np.random.default_rng(seed)
        return AtomSetData(name=name, token_positions=rng.random((vocab, 3)),
                           atom_tokens=rng.integers(0, vocab, 600), atom_positions=rng.random((600, 3)),
                           atom_weights=rng.uniform(0.2, 2.0, 600), **params)

    return {
        "narrow_gauss": narrow("prunetest_gauss", 11, kernel="gaussian", bandwidth=0.01, window=3,
                               decay=0.01, history_weight=1.0, history_window=512),
        "narrow_expo": narrow("prunetest_expo", 12, kernel="exponential", bandwidth=0.0005, window=3,
                              decay=0.01, history_weight=0.5, history_window=64),
        "repeats": narrow("prunetest_repeats", 13, vocab=12, kernel="gaussian", bandwidth=0.02, window=1,
                          decay=1.0, history_weight=2.0, history_window=4096),
    }

def sets_digest(sets: dict[str, AtomSetData]) -> str:
    """SHA-256 over every set's name, parameters and arrays (float64 / int64 bytes), in key order."""
    h = hashlib.sha256()
    for key in sorted(sets):
        s = sets[key]
        h.update(repr((key, s.name, s.kernel, s.bandwidth, s.window, s.decay, s.history_weight,
                       s.history_window)).encode())
        for array, dtype in ((s.token_positions, np.float64), (s.atom_tokens, np.int64),
                             (s.atom_positions, np.float64), (s.atom_weights, np.float64)):
            h.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    return h.hexdigest()
