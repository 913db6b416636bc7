"""Plot plumbing shared by the report sections: headless pyplot, atomic PNG writes, and `Figures`, which
names each PNG, remembers it, and removes the ones a rewrite no longer draws.

matplotlib is imported on first use, never at import time: the tables need no plotting library.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PointLabel:
    x: float
    y: float
    text: str
    color: Any


def label_offsets(anchors: Sequence[tuple[float, float]], sizes: Sequence[tuple[float, float]],
                  gap: float = 1.0) -> list[float]:
    """Greedy vertical offsets (display units, y up) for labels whose boxes (width, height) start just right of
    and above each anchor, so that no two boxes overlap: labels are placed top to bottom, and one that would
    overlap a box already placed moves down below it. Two labels of points drawn close together (ep1 at
    ε = 100 and 1000, one point apart) otherwise print over each other."""
    order = sorted(range(len(anchors)), key=lambda i: -anchors[i][1])
    placed: list[tuple[float, float, float, float]] = []   # (x0, x1, y0, y1)
    offsets = [0.0] * len(anchors)
    for i in order:
        (x, y), (w, h) = anchors[i], sizes[i]
        top = y + h
        for x0, x1, y0, y1 in sorted(placed, key=lambda b: -b[3]):
            if x < x1 and x0 < x + w and top - h < y1 and y0 < top:
                top = y0 - gap
        offsets[i] = top - (y + h)
        placed.append((x, x + w, top - h, top))
    return offsets


def place_labels(ax: Any, labels: Sequence[PointLabel], *, size: int = 6) -> None:
    """Each label just right of and above its point (left of it near the right edge); one moved down to avoid
    another gets a thin leader line."""
    if not labels:
        return
    fig = ax.figure
    px = fig.dpi / 72.0                                    # display pixels per typographic point
    right = ax.get_window_extent().x1
    # a width estimate (0.6 em a character) keeps this free of a renderer pass
    sizes = [(0.6 * size * px * len(lab.text), 1.25 * size * px) for lab in labels]
    points = [ax.transData.transform((lab.x, lab.y)) for lab in labels]
    # right of the point, or left of it where the label would cross the axes' right edge (into the legend)
    dx = [4.0 if x + 4 * px + w <= right else -4.0 - w / px for (x, _), (w, _) in zip(points, sizes)]
    anchors = [(x + d * px, y + 3 * px) for (x, y), d in zip(points, dx)]
    for lab, d, dy in zip(labels, dx, label_offsets(anchors, sizes)):
        moved = dy < -0.5
        ax.annotate(lab.text, (lab.x, lab.y), textcoords="offset points", xytext=(d, 3 + dy / px), fontsize=size,
                    color=lab.color,
                    arrowprops=dict(arrowstyle="-", lw=0.4, color=lab.color, shrinkA=0, shrinkB=2) if moved else None)


def save_axes(fig: Any, ax: Any, path: Path, title: str, *, legend_size: int = 8,
              labels: Sequence[PointLabel] = ()) -> None:
    """The common ending of a one-axes plot: a light grid on both scales, the legend outside the axes, a small
    title, the point `labels` (placed once the layout is final: they are placed in display space), then save."""
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, size=legend_size)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    place_labels(ax, labels)
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
