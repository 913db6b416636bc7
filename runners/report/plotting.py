"""Plot plumbing shared by the report sections: headless pyplot, atomic PNG writes, and `Figures`, which
names each PNG, remembers it, and removes the ones a rewrite no longer draws.

matplotlib is imported on first use, never at import time: the tables need no plotting library.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results import atomic_path
from metrics import names

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
    handles, labels = legend_entries(ax)
    if handles:
        ax.legend(handles, labels, fontsize=size, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  frameon=False)


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    # No offset notation on any axis: a flat 100 % otherwise reads "1e-6 + 9.999999e1" with ticks 4…10,
    # which looks like variation where there is none.
    matplotlib.rcParams["axes.formatter.useoffset"] = False
    import matplotlib.pyplot as plt

    return plt


def metric_axis(ax: Any, which: str, key: str, label: str | None = None) -> None:
    """Label the x or y axis (`which`) of `ax` after the metric `key` (metrics/names.py) and, for a proportion,
    fix it to 0–100 whatever the data: the same value then sits at the same height on every chart, and a flat
    100 % is drawn at 100. Call it after drawing: points on the edges (0 and 100 %) are left unclipped, so a
    marker at 100 % shows whole. A metric that can dip below 0 (semantic similarity) extends the axis to its
    lower bound where the data does. `label` replaces the table's label (a chart that says more)."""
    metric = names.lookup(key)
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(metric.label if label is None else label)
    if metric.axis is None:
        return
    lo, hi = metric.axis
    data_lo = (ax.dataLim.x0 if which == "x" else ax.dataLim.y0) if ax.has_data() else lo
    if data_lo < lo and metric.bounds[0] is not None:
        lo = metric.bounds[0]
    (ax.set_xlim if which == "x" else ax.set_ylim)(lo, hi)
    for artist in [*ax.lines, *ax.collections]:
        artist.set_clip_on(False)


def coincident(points: Sequence[tuple[float, float]], tol: float = 0.05) -> list[list[int]]:
    """The indices of `points` grouped greedily, in first-seen order, with the first point of a group whose x and
    y both lie within `tol` of theirs: points of one group are drawn on top of each other."""
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(points):
        for group in groups:
            x0, y0 = points[group[0]]
            if abs(x - x0) <= tol and abs(y - y0) <= tol:
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


COUNT_LEGEND = "×n: n points drawn at one place"


def mark_coincident(ax: Any, points: Sequence[tuple[float, float]], *, legend: bool = True,
                    pixels: float = 3.0) -> list[PointLabel]:
    """The labels "×n" for each place where the markers of n > 1 of `points` lie on one another (centres within
    `pixels` on screen: 0.14 and 0.21 % on a 0–100 axis are one place), so that no point hides another unseen,
    to be placed with the figure's other point labels (save_axes / place_labels: clear of the markers and of each
    other, inside the axes); says so in the legend (`legend`). Call it once the axes' scales and limits are set."""
    ax.get_xlim(), ax.get_ylim()   # settle autoscaling before measuring on screen
    screen = [tuple(ax.transData.transform(p)) for p in points]
    shared = [g for g in coincident(screen, tol=pixels * ax.figure.dpi / 72.0) if len(g) > 1]
    if shared and legend:
        ax.plot([], [], " ", label=COUNT_LEGEND)
    return [PointLabel(*points[g[0]], f"×{len(g)}", "black") for g in shared]


def legend_entries(ax: Any) -> tuple[list[Any], list[str]]:
    """The legend's handles and labels, the "×n" note last (matplotlib lists plain lines before error bars)."""
    pairs = list(zip(*ax.get_legend_handles_labels()))
    pairs.sort(key=lambda hl: hl[1] == COUNT_LEGEND)
    return [h for h, _ in pairs], [lab for _, lab in pairs]


def crowded_ticklabels(ax: Any, *, gap: float = 4.0) -> None:
    """Blank the x tick labels that would overlap the one before them (ε = 100 and 150 on a log axis), keeping
    the first of each crowd; the ticks stay. Call it once the layout is final: it measures in display space,
    with the same width estimate as place_labels."""
    px = ax.figure.dpi / 72.0
    size = ax.xaxis.get_ticklabels()[0].get_fontsize() if ax.xaxis.get_ticklabels() else 10.0
    texts = [t.get_text() for t in ax.xaxis.get_ticklabels()]
    ticks = ax.get_xticks()
    kept_right = -float("inf")
    out = []
    for tick, text in zip(ticks, texts):
        x = ax.transData.transform((tick, 0.0))[0]
        half = 0.3 * size * px * len(text)
        if text and x - half < kept_right + gap * px:
            out.append("")
            continue
        out.append(text)
        if text:
            kept_right = x + half
    ax.set_xticks(ticks, out)


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
                  gap: float = 1.0, obstacles: Sequence[tuple[float, float, float, float]] = (),
                  bounds: tuple[float, float] = (-math.inf, math.inf)) -> list[float]:
    """Greedy vertical offsets (display units, y up) for labels whose boxes (width, height) start just right of
    and above each anchor, so that no two boxes overlap, nor a box one of the `obstacles` (x0, x1, y0, y1: the
    markers), and each stays between `bounds` (the axes' bottom and top): labels are placed top to bottom, each
    at the free height nearest its own (just below or just above a box in the way). Two labels of points drawn
    close together (ep1 at ε = 100 and 1000, one point apart) otherwise print over each other."""
    order = sorted(range(len(anchors)), key=lambda i: -anchors[i][1])
    placed: list[tuple[float, float, float, float]] = list(obstacles)   # (x0, x1, y0, y1)
    offsets = [0.0] * len(anchors)
    for i in order:
        (x, y), (w, h) = anchors[i], sizes[i]
        beside = [b for b in placed if x < b[1] + gap and b[0] < x + w + gap]   # boxes this one could touch

        def free(top: float) -> bool:
            return bounds[0] <= top - h and top <= bounds[1] and all(not (top - h < y1 and y0 < top)
                                                                      for _, _, y0, y1 in beside)

        wanted = y + h
        tops = [wanted, *(y0 - gap for _, _, y0, _ in beside), *(y1 + gap + h for _, _, _, y1 in beside)]
        fitting = [t for t in tops if free(t)]
        top = min(fitting, key=lambda t: (abs(t - wanted), -t)) if fitting else wanted
        offsets[i] = top - wanted
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
    top = ax.get_window_extent().y1
    # above the point, but never above the axes (into the title): a point at 100 % gets its label below the top
    anchors = [(x + d * px, min(y + 3 * px, top - h)) for (x, y), d, (_, h) in zip(points, dx, sizes)]
    marker = 3.5 * px   # half a marker (6-7 points across): no label lands on another point
    markers = [(x - marker, x + marker, y - marker, y + marker) for x, y in points]
    box = ax.get_window_extent()
    offsets = label_offsets(anchors, sizes, obstacles=markers, bounds=(box.y0, box.y1))
    for lab, d, dy, (_, y0), (_, y) in zip(labels, dx, offsets, points, anchors):
        moved = abs(dy) > 0.5
        # on a white ground above the error bars, which a label cannot always avoid
        ax.annotate(lab.text, (lab.x, lab.y), textcoords="offset points", xytext=(d, (y - y0 + dy) / px), fontsize=size,
                    color=lab.color, zorder=5, annotation_clip=False,
                    bbox=dict(boxstyle="square,pad=0.05", facecolor="white", edgecolor="none", alpha=0.85),
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
