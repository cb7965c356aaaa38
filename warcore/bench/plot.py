"""The sweep as a picture (``warcore bench sweep --plot FILE``, ``warcore bench --plot FILE``).

matplotlib is the optional ``plot`` extra (``pip install 'warcore[plot]'``); nothing else in
warcore needs it, so it is imported only here, only when a plot is asked for.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from warcore._files import replaced_on_success

__all__ = ["load_sweep", "missing_matplotlib", "plot_sweep"]

_STYLE: dict[str, dict[str, Any]] = {
    "coarse": {"color": "#d62728", "marker": "s", "label": "coarse fence (wait_stream)"},
    "fine": {"color": "#1f77b4", "marker": "o", "lw": 2.2, "label": "fine fence (read-done event)"},
    "unsafe": {
        "color": "#7f7f7f",
        "marker": "^",
        "ls": ":",
        "label": "no fence (unsafe upper bound)",
    },
}
# Fine and unsafe lie on top of each other (that is the result); a small sideways shift keeps
# both sets of error bars visible.
_SHIFT = {"coarse": 0.0, "fine": -0.8, "unsafe": 0.8}


def missing_matplotlib() -> str | None:
    """A one-line error when matplotlib is not installed, else ``None``."""
    if importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib: pip install 'warcore[plot]' (or: pip install matplotlib)"
    return None


def load_sweep(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("benchmark") != "sweep" or "points" not in data:
        raise ValueError(f"{path}: not a sweep result (expected 'benchmark': 'sweep')")
    return data


def plot_sweep(result: dict[str, Any], path: str | Path) -> Path:
    """Draw step time against the ideal, and fine's tokens/s ratios, to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    points = result["points"]
    model = result["model"]
    x = [100 * p["fraction"] for p in points]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    _plot_step_times(ax, points, x)
    _plot_ratios(ax2, points, x)
    layer = model["modelled_layer_s"] * 1e3
    fig.suptitle(
        f"warcore bench sweep: {model['device']} device, backend {model['backend']}, "
        f"{model['requests']} requests, {model['layers']} layers x {layer:g} ms modelled, "
        f"F = {model['forward_s'] * 1e3:.1f} ms, {model['repeat']} rounds",
        fontsize=10,
    )
    fig.tight_layout()
    out = Path(path)
    try:
        with replaced_on_success(out) as part:  # never a half-drawn PNG
            fig.savefig(part, dpi=110)
    finally:
        plt.close(fig)
    return out


def _plot_step_times(ax: Any, points: list[dict[str, Any]], x: list[float]) -> None:
    """Left: each fence's step time (median, min-max) and the ideal, against the work."""
    ideal = [p["ideal_step_ms"]["median"] if p["ideal_step_ms"] else None for p in points]
    if all(v is not None for v in ideal):
        ax.plot(x, ideal, "k--", lw=1.2, label="ideal max(forward, scheduler work)")
    for name, style in _STYLE.items():
        stats = [p["fences"][name]["step_ms"] for p in points]
        med = [s["median"] for s in stats]
        err = [
            [m - s["min"] for m, s in zip(med, stats, strict=True)],
            [s["max"] - m for m, s in zip(med, stats, strict=True)],
        ]
        xs = [v + _SHIFT[name] for v in x]
        ax.errorbar(xs, med, yerr=err, capsize=3, ms=5, **({"lw": 1.6} | style))
    ax.set_xlabel("scheduler device work per step (% of the forward's time F)")
    ax.set_ylabel("step time (ms per forward, forward stream)")
    ax.set_title("Step time: the fine fence keeps the overlap the coarse fence loses")
    ax.axvspan(20, max(x + [20]), color="#1f77b4", alpha=0.05, lw=0)
    ax.set_ylim(bottom=0)
    ax.text(21, 1.5, "scheduler work >= 20% of F", fontsize=8, color="#1f77b4")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8.5)


def _plot_ratios(ax: Any, points: list[dict[str, Any]], x: list[float]) -> None:
    """Right: fine's tokens/s over unsafe's and over coarse's, within a round."""
    for key, name, style in (
        ("fine_over_unsafe_tokens_per_s", "fine / unsafe", _STYLE["unsafe"]),
        ("fine_over_coarse_tokens_per_s", "fine / coarse", _STYLE["coarse"]),
    ):
        ratios = [p[key] for p in points]
        med = [r["median"] for r in ratios]
        low = [r["median"] - r["min"] for r in ratios]
        high = [r["max"] - r["median"] for r in ratios]
        ax.errorbar(
            x,
            med,
            yerr=[low, high],
            capsize=3,
            lw=1.6,
            ms=5,
            color=style["color"],
            marker=style["marker"],
            label=f"{name} tokens/s",
        )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.97, color="#7f7f7f", lw=0.8, ls=":", label="0.97 (target: fine vs unsafe)")
    ax.axvspan(20, max(x + [20]), color="#1f77b4", alpha=0.05, lw=0)
    ax.set_xlabel("scheduler work (% of F); shaded: >= 20%")
    ax.set_ylabel("tokens/s ratio within a round (median, min-max)")
    ax.set_title("Fine fence vs the unsafe bound and the coarse fence")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8.5)
