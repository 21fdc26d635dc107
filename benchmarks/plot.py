"""Bar chart (PNG) of ``results/classification_loaders.json``, written next to it.

    python -m benchmarks.plot results/classification_loaders.json

Kept apart from the benchmark so the GPU machine does not need matplotlib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot_classification(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loader = [r for r in report["loader"] if "img_s" in r]  # failed configurations carry "error"
    rows = report.get("train") or report.get("train_resnet50_amp", [])  # the older name in committed results
    train = [r for r in rows if "img_s" in r and not r["name"].startswith("warm-up")]
    fig, axes = plt.subplots(1, 2 if train else 1, figsize=(17 if train else 9, 6), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1]} if train else None, layout="constrained")
    ax = axes[0][0]
    names = [r["name"] for r in loader]
    values = [r["img_s"] for r in loader]
    colors = ["#76b900" if r["backend"] == "dali-gpu" else "#5a7d9a" if r["backend"] == "dali-cpu" else "#999999"
              for r in loader]
    bars = ax.barh(names, values, color=colors)
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("images/s (higher is better)")
    ax.set_title(f"Input pipeline, RN50 train transform, batch {report['batch_size']}\n"
                 f"{report['device']}, {report['cpu_count']} CPU cores, {report['dataset']['images']:,} JPEGs")
    ax.set_xlim(0, max(values) * 1.18)
    if train:
        ax = axes[0][1]
        names = [r["name"] for r in train]
        bars = ax.barh(names, [r["img_s"] for r in train], color="#5a7d9a")
        ax.bar_label(bars, labels=[f"{r['img_s']:,.0f} img/s, wait {100 * r['data_wait_share']:.0f} %" for r in train],
                     padding=3, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("images/s")
        ax.set_xlim(0, max(r["img_s"] for r in train) * 1.45)
        model = report.get("train_model", "resnet50, channels-last, AMP float16")
        ax.set_title(f"training steps ({model})\nand the share of time spent waiting for data")
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
