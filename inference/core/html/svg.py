"""Inline SVG charts for the HTML pages: grouped bars, a labelled scatter, overlaid
histograms and a reliability diagram. Each returns one `<svg>` element as text, every label
escaped; sizes are in CSS pixels and the chart scales with the page (`viewBox`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sieverag.inference.core.html.page import escape

WIDTH, HEIGHT = 520, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 56
# Colour-blind-safe (Okabe-Ito), cycled.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000")


def colour(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


def _frame(title: str, x_label: str, y_label: str, body: str, label: str) -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    return (f'<svg class="chart" role="img" aria-label="{escape(label)}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
            '>'
            f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="title">{escape(title)}'
            '</text>'
            f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>'
            f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
            f'{escape(x_label)}</text>'
            f'<text x="14" y="{TOP + plot_h / 2}" text-anchor="middle" '
            f'transform="rotate(-90 14 {TOP + plot_h / 2})">{escape(y_label)}</text>'
            f"{body}</svg>")


def _y_ticks(top: float, fmt: str = "{:.2f}") -> str:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = []
    for i in range(5):
        value = top * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{LEFT - 4}" x2="{LEFT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'class="tick"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{fmt.format(value)}</text>")
    return "".join(parts)


def _x_ticks(low: float, high: float, fmt: str = "{:.2f}") -> str:
    plot_w, bottom = WIDTH - LEFT - RIGHT, HEIGHT - BOTTOM
    parts = []
    for i in range(5):
        x = LEFT + plot_w * i / 4
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}" '
                     'class="tick"/>'
                     f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                     f"{fmt.format(low + (high - low) * i / 4)}</text>")
    return "".join(parts)


LEGEND_CHARS = 60  # a longer name is cut in the legend, whole in its tooltip


def _legend(names: Sequence[str]) -> str:
    """One line per name, top left inside the frame."""
    return "".join(f'<rect x="{LEFT + 8}" y="{TOP + 6 + 14 * i}" width="10" height="10" '
                   f'fill="{colour(i)}"/>'
                   f'<text x="{LEFT + 22}" y="{TOP + 15 + 14 * i}"><title>{escape(name)}</title>'
                   f"{escape(name if len(name) <= LEGEND_CHARS else name[:LEGEND_CHARS] + '…')}"
                   "</text>" for i, name in enumerate(names))


def grouped_bars(title: str, groups: Mapping[str, Mapping[str, float | None]],
                 series: Sequence[str], y_label: str = "") -> str:
    """One group of bars per key of `groups` (e.g. a pipeline), a bar per name in `series`
    (e.g. accuracy, F1), heights 0..1 (or the largest value); a missing value draws none."""
    values = [v for g in groups.values() for s in series if (v := g.get(s)) is not None]
    top = max([1.0, *values])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM - 14 * len(series) - 8
    slot = plot_w / max(len(groups), 1)
    bar = slot * 0.8 / max(len(series), 1)
    parts = []
    for gi, (name, figures) in enumerate(groups.items()):
        x0 = LEFT + gi * slot + slot * 0.1
        for si, key in enumerate(series):
            value = figures.get(key)
            if value is None:
                continue
            h = plot_h * value / top
            parts.append(f'<rect x="{x0 + si * bar:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" '
                         f'width="{bar * 0.95:.1f}" height="{h:.1f}" fill="{colour(si)}">'
                         f"<title>{escape(name)} {escape(key)}: {value:.3f}</title></rect>")
        parts.append(f'<text x="{x0 + slot * 0.4:.1f}" y="{HEIGHT - BOTTOM + 14}" '
                     f'text-anchor="middle">{escape(name)}</text>')
    body = _y_ticks(top * (HEIGHT - TOP - BOTTOM) / plot_h) + "".join(parts) + _legend(series)
    return _frame(title, "", y_label, body, title)


def scatter(title: str, points: Mapping[str, tuple[float, float]], x_label: str,
            y_label: str) -> str:
    """One labelled point per key (e.g. a pipeline at its cost and its accuracy); y from 0 to
    1 (or the largest value), x from 0 to the largest value."""
    if not points:
        return ""
    x_top = max(x for x, _ in points.values()) * 1.1 or 1.0
    # Headroom: a point at the top keeps its label inside the frame.
    y_top = max([1.0, *(y for _, y in points.values())]) * 1.1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = []
    for i, (name, (x, y)) in enumerate(points.items()):
        cx, cy = LEFT + plot_w * x / x_top, TOP + plot_h - plot_h * y / y_top
        # A label near the right edge goes on the point's left, inside the frame.
        anchor, dx = ("end", -7) if cx > LEFT + plot_w * 0.7 else ("start", 7)
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colour(i)}">'
                     f"<title>{escape(name)}: {x:g}, {y:.3f}</title></circle>"
                     f'<text x="{cx + dx:.1f}" y="{cy - 6:.1f}" text-anchor="{anchor}">'
                     f"{escape(name)}</text>")
    body = _y_ticks(y_top) + _x_ticks(0.0, x_top, "{:.0f}") + "".join(parts)
    return _frame(title, x_label, y_label, body, title)


def histograms(title: str, samples: Mapping[str, Sequence[float]], x_label: str,
               bins: int = 20, marker: float | None = None, marker_label: str = "") -> str:
    """Overlaid histograms (share of each sample per bin) over the samples' common range,
    with an optional vertical marker (e.g. the mean bar)."""
    everything = [v for values in samples.values() for v in values]
    if not everything:
        return ""
    low, high = min(everything), max(everything)
    if marker is not None:
        low, high = min(low, marker), max(high, marker)
    if high <= low:
        low, high = low - 0.5, high + 0.5
    width = (high - low) / bins
    shares = {}
    for name, values in samples.items():
        counts = [0] * bins
        for v in values:
            counts[min(int((v - low) / width), bins - 1)] += 1
        shares[name] = [c / max(len(values), 1) for c in counts]
    top = max(max(s) for s in shares.values()) or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM - 14 * len(samples) - 8
    parts = []
    for i, share in enumerate(shares.values()):
        for b, value in enumerate(share):
            h = plot_h * value / top
            parts.append(f'<rect x="{LEFT + plot_w * b / bins:.1f}" '
                         f'y="{HEIGHT - BOTTOM - h:.1f}" width="{plot_w / bins:.1f}" '
                         f'height="{h:.1f}" fill="{colour(i)}" fill-opacity="0.55"/>')
    if marker is not None:
        x = LEFT + plot_w * (marker - low) / (high - low)
        legend = 14 * len(samples) + 8
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + legend}" '
                     f'y2="{HEIGHT - BOTTOM}" class="marker"/>'
                     f'<text x="{x + 4:.1f}" y="{TOP + legend + 12}">{escape(marker_label)}</text>')
    labels = [f"{name} (n={len(samples[name])})" for name in samples]
    body = (_y_ticks(top * (HEIGHT - TOP - BOTTOM) / plot_h, "{:.0%}")
            + _x_ticks(low, high) + "".join(parts) + _legend(labels))
    return _frame(title, x_label, "share of the sample", body, title)


def reliability(title: str, curves: Mapping[str, Sequence[tuple[float, float, int]]]) -> str:
    """A reliability diagram: per curve, (mean predicted probability, observed frequency,
    count) per bin, against the diagonal a calibrated score would follow."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP}" '
             'class="diagonal"/>']
    for i, (name, bins) in enumerate(curves.items()):
        points = [(LEFT + plot_w * p, TOP + plot_h - plot_h * f, n) for p, f, n in bins]
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour(i)}" '
                         'stroke-width="2"/>')
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour(i)}">'
                  f"<title>{escape(name)}: {n} passages</title></circle>" for x, y, n in points]
    body = _y_ticks(1.0) + _x_ticks(0.0, 1.0) + "".join(parts) + _legend(list(curves))
    return _frame(title, "predicted P(relevant)", "observed share gold", body, title)
