"""The augmented path's gate: fitted by the mixture's log-loss, stored beside the set, checked.

λ = σ(w · z + b) on standardised features; fit_gate minimises −log((1 − λ) p_exact(y) + λ p_store(y))
on calibration positions. save_gate() stores one gate per set and refuses a gate that is not one
(22023 naming the argument, nothing written); the reader may read gates, not write them.
"""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest
from scipy.special import expit

from generation_helpers import tiny_atom_set
from hartonomous.augment.gate import FEATURES, Gate, feature_row, fit_gate, mixture_loss
from hartonomous.augment.gates import load_gate, save_gate
from hartonomous.errors import UserError
from hartonomous.store import StoreStep

F = len(FEATURES)


def synthetic(n: int, seed: int, helpful: bool):
    """Positions where the store is right exactly when feature 0 (closeness) is high, or never."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, F))
    close = x[:, 0] > 0.5
    p_exact = rng.uniform(0.05, 0.6, size=n)
    p_store = np.where(close, 0.95, 0.0) if helpful else np.zeros(n)
    return x, p_exact, p_store


def test_a_fitted_gate_trusts_the_store_where_it_is_right():
    x, a, b = synthetic(3000, 0, helpful=True)
    gate = fit_gate(x, a, b)
    lam = gate.weights(x)
    close = x[:, 0] > 0.5
    assert lam[close].mean() > 0.6 > 0.2 > lam[~close].mean()
    assert gate.coefficients[0] > 0
    assert gate.calibration_loss < gate.exact_loss          # it helps where it was fitted
    # and on fresh positions from the same process
    xt, at, bt = synthetic(3000, 1, helpful=True)
    assert mixture_loss(gate.weights(xt), at, bt).mean() < -np.log(at).mean()


def test_a_store_that_never_helps_gets_almost_no_weight():
    x, a, b = synthetic(3000, 2, helpful=False)
    gate = fit_gate(x, a, b)
    assert gate.weights(x).max() < 0.02
    assert gate.calibration_loss <= gate.exact_loss + 0.01


def test_the_gradient_matches_finite_differences_at_the_optimum():
    """The fit stops where the loss no longer falls: nudging any coefficient does not lower it."""
    x, a, b = synthetic(800, 3, helpful=True)
    gate = fit_gate(x, a, b, l2=0.0)
    z = (x - np.array(gate.means)) / np.array(gate.scales)
    base = mixture_loss(gate.weights(x), a, b).mean()
    for j in range(F):
        for step in (1e-3, -1e-3):
            w = np.array(gate.coefficients)
            w[j] += step
            lam = expit(z @ w + gate.intercept)
            assert mixture_loss(lam, a, b).mean() >= base - 1e-7


def test_fit_gate_refuses_too_few_or_non_finite_positions():
    x, a, b = synthetic(10, 4, helpful=True)
    with pytest.raises(ValueError, match="at least"):
        fit_gate(x, a, b)
    x, a, b = synthetic(100, 4, helpful=True)
    x[3, 2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        fit_gate(x, a, b)


def step(ids, probs, near=0.5, mass=3.0, history=0.25, memory=0.0) -> StoreStep:
    p = np.asarray(probs, dtype=float)
    return StoreStep(prefix_length=1, token_ids=list(ids), probabilities=list(p), nearest_bandwidths=near, rung=None,
                     matched_mass=mass, candidates=len(ids), top_probability=float(p.max()),
                     entropy=float(-(p * np.log(p)).sum()), stored_share=1 - history - memory,
                     history_share=history, memory_share=memory)


def test_feature_row_reads_each_feature_from_its_source():
    exact = np.array([0.1, 0.6, 0.3])
    row = dict(zip(FEATURES, feature_row(step([1, 2], [0.75, 0.25], near=math.e ** -3), exact)))
    assert row["closeness"] == pytest.approx(3.0)
    assert row["exact_match"] == 0.0
    assert row["ln_mass"] == pytest.approx(math.log(4.0))
    assert row["store_top"] == 0.75 and row["history_share"] == 0.25 and row["memory_share"] == 0.0
    assert row["exact_top"] == 0.6
    assert row["exact_entropy"] == pytest.approx(-(exact * np.log(exact)).sum())
    assert row["agree"] == 1.0                                # both put token 1 first
    assert row["exact_on_store_top"] == pytest.approx(math.log(0.6))   # the model's p of the store's top token
    row = dict(zip(FEATURES, feature_row(step([2], [1.0], near=0.0), exact)))
    assert row["exact_match"] == 1.0 and row["agree"] == 0.0 and row["store_entropy"] == 0.0
    assert row["exact_on_store_top"] == pytest.approx(math.log(0.3))


def gate_for_tests() -> Gate:
    return Gate(FEATURES, tuple(range(F)), (1.0,) * F, (0.5,) * F, -1.0, 1.2, 1.5, 100,
                extra={"note": "hand-made"})


def test_a_saved_gate_loads_back_and_a_new_one_replaces_it(server_url):
    with tiny_atom_set(server_url) as name, psycopg.connect(server_url, autocommit=True) as conn:
        with pytest.raises(UserError, match=f"hartonomous gate fit {name}"):
            load_gate(conn, name)
        gate = gate_for_tests()
        save_gate(conn, name, gate)
        assert load_gate(conn, name) == gate
        other = Gate(FEATURES, (0.0,) * F, (2.0,) * F, (0.0,) * F, 0.5, 1.0, 1.5, 200)
        save_gate(conn, name, other)
        assert load_gate(conn, name) == other
        assert conn.execute("SELECT count(*) FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id "
                            "WHERE s.name = %s", (name,)).fetchone()[0] == 1


BAD = [
    ("atom_set", {"atom_set": "no-such-set"}, "atom_set"),
    ("coefficients", {"coefficients": [0.5] * (F - 1) + [float("nan")]}, "coefficients must be finite"),
    ("means", {"means": [0.0] * (F - 1)}, "means must hold one number per feature"),
    ("scales", {"scales": [1.0] * (F - 1) + [0.0]}, "scales must be > 0"),
    ("intercept", {"intercept": float("inf")}, "intercept must be finite"),
    ("calibration_loss", {"calibration_loss": float("nan")}, "calibration_loss must be finite"),
    ("split", {"split": "test"}, "split must be 'calibration'"),
    ("positions", {"positions": 0}, "positions must be >= 1"),
    ("features", {"features": ["a", "a"] + list(FEATURES[2:])}, "features must be"),
]


@pytest.mark.parametrize("argument, change, message", BAD, ids=[b[0] for b in BAD])
def test_save_gate_refuses_a_bad_gate_with_22023_and_writes_nothing(server_url, argument, change, message):
    with tiny_atom_set(server_url) as name, psycopg.connect(server_url, autocommit=True) as conn:
        args = {"atom_set": name, "features": list(FEATURES), "means": [0.0] * F, "scales": [1.0] * F,
                "coefficients": [0.5] * F, "intercept": 0.0, "calibration_loss": 1.0, "exact_loss": 1.2,
                "positions": 10, "split": "calibration", "version": 1}
        args.update(change)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            conn.execute("SELECT save_gate(%(atom_set)s, %(features)s::text[], %(means)s::float8[], "
                         "%(scales)s::float8[], %(coefficients)s::float8[], %(intercept)s, %(calibration_loss)s, "
                         "%(exact_loss)s, %(positions)s, %(split)s, %(version)s)", args)
        assert conn.execute("SELECT count(*) FROM augment_gates").fetchone()[0] == conn.execute(
            "SELECT count(*) FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id WHERE s.name <> %s",
            (name,)).fetchone()[0]


def test_the_reader_reads_gates_but_cannot_write_them(server_url, reader_url):
    with tiny_atom_set(server_url) as name:
        with psycopg.connect(server_url, autocommit=True) as owner:
            save_gate(owner, name, gate_for_tests())
        with psycopg.connect(reader_url, autocommit=True) as reader:
            assert load_gate(reader, name) == gate_for_tests()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                save_gate(reader, name, gate_for_tests())
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute("DELETE FROM augment_gates")


def test_a_gate_is_dropped_with_its_set(server_url):
    with tiny_atom_set(server_url) as name, psycopg.connect(server_url, autocommit=True) as conn:
        save_gate(conn, name, gate_for_tests())
        set_id = conn.execute("SELECT id FROM atom_sets WHERE name = %s", (name,)).fetchone()[0]
    with psycopg.connect(server_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM augment_gates WHERE atom_set_id = %s", (set_id,)).fetchone()[0] == 0


def test_a_gate_with_non_finite_values_cannot_be_built():
    with pytest.raises(ValueError, match="finite"):
        Gate(FEATURES, (0.0,) * F, (1.0,) * F, (math.nan,) * F, 0.0, 1.0, 1.0, 1)


def test_a_gate_of_another_version_is_refused_with_how_to_refit(server_url):
    with tiny_atom_set(server_url) as name, psycopg.connect(server_url, autocommit=True) as conn:
        old = Gate(FEATURES[:-1], (0.0,) * (F - 1), (1.0,) * (F - 1), (0.5,) * (F - 1), 0.0, 1.0, 1.5, 10, version=1)
        save_gate(conn, name, old)
        with pytest.raises(UserError, match=f"version 1.*refit it: hartonomous gate fit {name}"):
            load_gate(conn, name)
