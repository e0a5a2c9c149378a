"""The report's figures as PNG bytes (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import io

import numpy as np

from hartonomous.compare.fidelity import Fidelity, by_position


def _figure(width: float = 6.4, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(width, height), dpi=100)


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def histogram(series: dict[str, np.ndarray], title: str, xlabel: str, bins: int = 30,
              value_range: tuple[float, float] | None = None) -> bytes:
    """Overlaid histograms of one per-position metric (NaNs dropped, count in the legend)."""
    plt, fig, ax = _figure()
    finite = {k: np.asarray(v, dtype=float)[np.isfinite(np.asarray(v, dtype=float))] for k, v in series.items()}
    if value_range is None:
        allv = np.concatenate([v for v in finite.values() if len(v)] or [np.zeros(1)])
        lo, hi = float(allv.min()), float(allv.max())
        value_range = (lo, hi if hi > lo else lo + 1.0)
    for name, values in finite.items():
        if len(values):
            ax.hist(values, bins=bins, range=value_range, alpha=0.55, label=f"{name} (n={len(values)})")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("positions")
    if any(len(v) for v in finite.values()):
        ax.legend(fontsize=8)
    return _png(plt, fig)


def agreement_by_position(fid: Fidelity, metric: str = "top1") -> bytes:
    """Mean top-1 agreement per context-length bin (powers of two), one line per path."""
    plt, fig, ax = _figure()
    table = by_position(fid, metric)["bins"]
    labels = [f"{b['from']}" if b["to"] == b["from"] else f"{b['from']}–{b['to'] or '∞'}" for b in table]
    x = np.arange(len(table))
    for name in fid.paths:
        ax.plot(x, [b["values"][name] for b in table], marker="o", label=name)
    ax.set_xticks(x, labels, rotation=30, fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("top-1 agreement with exact")
    ax.set_title("Top-1 agreement by position in the context")
    ax.legend(fontsize=8)
    return _png(plt, fig)


JS_PATHS = ("spatial", "4-gram", "∞-gram", "knn")   # the JS histogram's paths (a few, to stay readable)


def all_figures(fid: Fidelity) -> dict[str, tuple[str, bytes]]:
    """name -> (caption, PNG) for every figure the report embeds."""
    sp = fid.paths["spatial"]
    ex = fid.exact
    sig = fid.spatial_signals
    figs = {
        "agreement_by_position": ("Top-1 agreement with the exact argmax, by context length",
                                  agreement_by_position(fid)),
        "js": ("Jensen–Shannon divergence to exact, per position (nats; ln 2 ≈ 0.693 = disjoint)",
               histogram({n: c.array("js") for n, c in fid.paths.items() if n in JS_PATHS},
                         "JS divergence to exact", "nats", value_range=(0.0, float(np.log(2))))),
        "pearson": ("Pearson correlation over the union of supports, per position",
                    histogram({"spatial": sp.array("pearson")}, "Pearson (union of supports)", "r",
                              value_range=(-1.0, 1.0))),
        "mass_covered": ("Exact probability mass covered by the spatial candidate set",
                         histogram({"spatial": sp.array("mass_covered")}, "Exact mass covered", "mass",
                                   value_range=(0.0, 1.0))),
        "exact_p_of_argmax": ("Exact probability of the spatial argmax",
                              histogram({"spatial": sp.array("exact_p_of_argmax")}, "Exact p(spatial argmax)",
                                        "probability", value_range=(0.0, 1.0))),
        "entropy": ("Shannon entropy H of each path's distribution (nats)",
                    histogram({"exact": ex.array("H"), "spatial": sig.array("H")}, "Entropy H", "nats")),
        "calibration_gap": ("Calibration gap NLL − H (spatial NLL smoothed)",
                            histogram({"exact": ex.array("calibration_gap"), "spatial": sig.array("calibration_gap")},
                                      "Calibration gap", "nats")),
    }
    return figs
