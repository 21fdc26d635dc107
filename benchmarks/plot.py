"""The benchmarks' bar charts: one way to draw a row per configuration, and the PNG of
``results/latest/classification_loaders.json``:

    python -m benchmarks.plot results/latest/classification_loaders.json

matplotlib is optional (the GPU machine need not have it): without it no PNG is written and the
JSON holds everything.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

#: bar colours by data backend (anything else is grey): the same in every chart
BACKEND_COLORS = {"dali-gpu": "#76b900", "dali-cpu": "#5a7d9a"}
GREY = "#999999"


def backend_color(backend: str) -> str:
    return BACKEND_COLORS.get(backend, GREY)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or ``None`` where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(ax, names: Sequence[str], values: Sequence[float], *, labels: Sequence[str], colors: Sequence[str] | str,
         xlabel: str, title: str, headroom: float = 1.2, log: bool = False) -> None:
    """Horizontal bars, the first row on top, each labelled at its end (``headroom`` leaves room
    for the label)."""
    drawn = ax.barh(list(names), list(values), color=colors)
    ax.bar_label(drawn, labels=list(labels), padding=3, fontsize=8)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 2, max(values) * headroom)
    else:
        ax.set_xlim(0, max(values) * headroom)
    ax.set_xlabel(xlabel)
    ax.set_title(title)


def bar_png(png: Path, names: Sequence[str], values: Sequence[float], *, width: float = 9, **kwargs) -> Path | None:
    """One chart of :func:`bars` written to ``png``; ``None`` without rows or without matplotlib."""
    plt = pyplot()
    if plt is None or not values:
        return None
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.5 * len(values)), layout="constrained")
    bars(ax, names, values, **kwargs)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def plot_classification(report: dict, png: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    loader = [r for r in report["loader"] if "img_s" in r]  # failed configurations carry "error"
    rows = report.get("train") or report.get("train_resnet50_amp", [])  # the older name in committed results
    # rows with an "error" (e.g. a loss that turned NaN) are not drawn: their speed is not training's
    train = [r for r in rows if "img_s" in r and "error" not in r and not r["name"].startswith("warm-up")]
    if not loader and not train:
        raise SystemExit(f"nothing to plot: no row of this report has a result ({len(report['loader'])} loader, "
                         f"{len(rows)} train rows)")
    panels = int(bool(loader)) + int(bool(train))  # --skip-loader / --skip-train leave one panel
    fig, axes = plt.subplots(1, panels, figsize=(8.5 * panels if loader else 13, 6), squeeze=False, layout="constrained")
    title = (f"Input pipeline, RN50 train transform, batch {report['batch_size']}\n"
             f"{report['device']}, {report['cpu_count']} CPU cores, {report['dataset']['images']:,} JPEGs")
    if loader:
        bars(axes[0][0], [r["name"] for r in loader], [r["img_s"] for r in loader],
             labels=[f"{r['img_s']:,.0f}" for r in loader], colors=[backend_color(r["backend"]) for r in loader],
             xlabel="images/s (higher is better)", title=title, headroom=1.18)
    if train:
        model = report.get("train_model", "resnet50, channels-last, AMP float16")
        bars(axes[0][-1], [r["name"] for r in train], [r["img_s"] for r in train],
             labels=[f"{r['img_s']:,.0f} img/s, wait {100 * r['data_wait_share']:.0f} %" for r in train],
             colors=BACKEND_COLORS["dali-cpu"], xlabel="images/s", headroom=1.45,
             title=(f"training steps ({model})\nand the share of time spent waiting for data" if loader else
                    f"training steps ({model}), batch {report['batch_size']}\n"
                    f"and the share of time spent waiting for data; {report['device']}, "
                    f"{report['dataset']['images']:,} JPEGs"))
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", type=Path)
    args = parser.parse_args()
    report = json.loads(args.json.read_text())
    png = args.json.with_suffix(".png")
    plot_classification(report, png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
