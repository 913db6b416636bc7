"""Plot plumbing shared by the report sections: headless pyplot, atomic PNG writes, and `Figures`, which
names each PNG, remembers it, and removes the ones a rewrite no longer draws.

matplotlib is imported on first use, never at import time: the tables need no plotting library.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.results import atomic_path

PNG_PREFIX = "report_"  # PNGs this command owns in the output dir (stale ones are removed on rewrite)
DASHES = ("--", ":", "-.", (0, (6, 2, 1, 2)), (0, (1, 3)))  # distinct reference-line styles
# Series styles: tab10's colours with 7 markers. 7 and 10 are coprime, so series i gets colour i mod 10 and
# marker i mod 7, and the first 70 series of a figure differ in their (colour, marker) pair.
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
N_STYLES = 70


def series_style(i: int) -> dict[str, Any]:
    """Colour and marker of a figure's i-th series (matplotlib keyword arguments), distinct for i < 70."""
    from matplotlib import colormaps

    colors = colormaps["tab10"].colors
    return {"color": colors[i % len(colors)], "marker": MARKERS[i % len(MARKERS)]}


def legend_outside(ax: Any, *, size: int = 8) -> None:
    """The legend to the right of the axes, so it never covers a curve (save's bbox_inches keeps it in)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> None:
    """The figure as a PNG, written atomically (a reader never sees half an image), then closed."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)


def save_axes(fig: Any, ax: Any, path: Path, title: str, *, legend_size: int = 8) -> None:
    """The common ending of a one-axes plot: a light grid on both scales, the legend outside the axes, a small
    title, then save."""
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, size=legend_size)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    save(fig, path)


class Figures:
    """The PNGs of one report: `figure(...)` draws one and returns the markdown that shows it."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.written: list[Path] = []

    def __call__(self, kind: str, i: int, item: Any, plot: Callable[[Any, Path], None], alt: str) -> list[str]:
        """Draw `item` (a table or group with .slug and .title) into its PNG next to report.md, remember the
        file, and return the markdown that shows it."""
        png = self.out / f"{PNG_PREFIX}{kind}_{i}_{item.slug}.png"
        plot(item, png)
        self.written.append(png)
        return [f"![{alt}: {item.title}]({png.name})", ""]

    def remove_stale(self) -> None:
        """Delete this command's PNGs from an earlier report that this one did not draw."""
        keep = {p.name for p in self.written}
        for stale in self.out.glob(f"{PNG_PREFIX}*.png"):
            if stale.name not in keep:
                stale.unlink()
