"""Plots of a comparison (matplotlib, an optional extra): Op Time against batch size per
variant, and speedup over cuDNN at the largest batch."""

from __future__ import annotations

from pathlib import Path

from .errors import ConvlabError

# The reference rows (kernels.CUDNN_ROWS: cuDNN and cuBLAS), drawn dashed and grey.
REFERENCE_PREFIXES = ("cudnn", "cublas")


def require_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConvlabError('plotting needs matplotlib: pip install -e ".[plot]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(comparison, path: Path) -> Path:
    plt = require_pyplot()
    layers = []
    for row in comparison.rows:
        if (row.layer, row.epilogue) not in layers:
            layers.append((row.layer, row.epilogue))
    fig, axes = plt.subplots(2, len(layers), figsize=(6.5 * len(layers), 10), squeeze=False)
    largest = max(comparison.batches)
    names = list(dict.fromkeys(r.variant for r in comparison.rows))
    colour = {name: plt.cm.tab20(i % 20) for i, name in enumerate(names)}
    for col, (layer, epilogue) in enumerate(layers):
        rows = [r for r in comparison.rows if (r.layer, r.epilogue) == (layer, epilogue)]
        label = rows[0].label
        ax = axes[0][col]
        for variant in dict.fromkeys(r.variant for r in rows):
            pts = sorted((r.batch, r.median_ms) for r in rows if r.variant == variant and r.valid)
            if not pts:
                continue
            style = "--" if variant.startswith(REFERENCE_PREFIXES) else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=variant,
                    color=colour[variant])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size (images)")
        ax.set_ylabel("Op Time (ms, median)")
        ax.set_title(f"{label}: {rows[0].shape.brief()}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)

        ax = axes[1][col]
        bars = [(r.variant, r.speedup_cudnn) for r in rows
                if r.batch == largest and r.valid and r.speedup_cudnn is not None]
        ax.bar([b[0] for b in bars], [b[1] for b in bars],
               color=["tab:gray" if b[0].startswith(REFERENCE_PREFIXES) else "tab:blue"
                      for b in bars])
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel(f"speedup over cuDNN fp32 at batch {largest}")
        ax.set_title(f"{label}: speedup over cuDNN (higher is better)")
        ax.tick_params(axis="x", rotation=60)
    device = (comparison.device or {}).get("name", "unknown GPU")
    fig.suptitle(f"convlab compare: {comparison.model or 'single layer'} on {device}")
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Lay out, write as PNG (making the folder) and release a figure."""
    plt = require_pyplot()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
