"""Inline SVG pictures for report.html: plain markup, no script, nothing fetched.

- headroom bars: per component, a bar per output at the largest fraction of its tolerance any
  case used (1.0 = at the bound, marked by a line); green when every case passed that output,
  red otherwise;
- error histogram: for a failing tolerance output, how many elements erred by how many ulps;
- step strip: for a stepped case, a cell per step (and layer) coloured by where it first
  diverged.

Every drawn number is also an attribute (`data-*`), so tests read the picture's numbers back
and check them against results.json.
"""

from __future__ import annotations

from html import escape

from .headroom import BOUNDS, Worst, step_of

GREEN, RED, ORANGE, GREY, INK = "#2e8540", "#c62828", "#ef9a4a", "#d0d0d0", "#333"
SCALE = 2.0  # bars are drawn up to twice the bound; beyond that the bar is clipped and says so
BAR_W, ROW_H, LABEL_W = 360, 18, 170


def headroom_bars(component: str, worst: dict[str, Worst]) -> str:
    if not worst:
        return ""
    height = ROW_H * len(worst) + 22
    width = LABEL_W + BAR_W + 150
    one = LABEL_W + BAR_W / SCALE
    parts = [
        f"<svg class='headroom' data-component='{escape(component)}' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' role='img' "
        f"aria-label='{escape(component)}: fraction of each tolerance used'>"
    ]
    for i, (output, w) in enumerate(worst.items()):
        y = 4 + i * ROW_H
        length = BAR_W * min(w.value, SCALE) / SCALE
        colour = GREEN if w.ok else RED
        label = f"{w.value:.3g}" + (" (clipped)" if w.value > SCALE else "")
        parts.append(
            f"<g class='bar' data-output='{escape(output)}' data-value='{w.value!r}' data-bound='{w.bound}' "
            f"data-ok='{str(w.ok).lower()}' data-case='{escape(w.case)}'>"
            f"<title>{escape(output)}: {w.value:.4g} of the {BOUNDS.get(w.bound, w.bound)} bound, in {escape(w.case)}</title>"
            f"<text x='{LABEL_W - 6}' y='{y + 12}' text-anchor='end' font-size='12' fill='{INK}'>{escape(output)}</text>"
            f"<rect x='{LABEL_W}' y='{y + 2}' width='{max(length, 1):.1f}' height='{ROW_H - 6}' fill='{colour}'/>"
            f"<text x='{LABEL_W + max(length, 1) + 4:.1f}' y='{y + 12}' font-size='11' fill='{INK}'>{label} "
            f"{BOUNDS.get(w.bound, w.bound)}</text></g>"
        )
    bottom = height - 16
    parts.append(
        f"<line x1='{one}' y1='0' x2='{one}' y2='{bottom}' stroke='{INK}' stroke-dasharray='3,2'/>"
        f"<text x='{one}' y='{height - 4}' text-anchor='middle' font-size='11' fill='{INK}'>1.0 = the bound</text>"
        f"<text x='{LABEL_W}' y='{height - 4}' font-size='11' fill='{INK}'>0</text></svg>"
    )
    return "".join(parts)


def _short(value: float) -> str:
    for size, suffix in ((1 << 20, "M"), (1 << 10, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}".replace("0.", ".")


def _edge_label(edges: list[float], i: int) -> str:
    """Bin i holds errors in (edges[i-1], edges[i]] ulps; it is named by its upper edge."""
    if i >= len(edges):
        return f">{_short(edges[-1])}"
    return _short(edges[i])


def ulps_histogram(case_id: str, output: str, histogram: dict) -> str:
    edges, counts = histogram["edges"], histogram["counts"]
    last = max((i for i, c in enumerate(counts) if c), default=0)
    shown = counts[: last + 1]
    top = max(shown) or 1
    bar_w, plot_h = 26, 80
    width, height = bar_w * len(shown) + 20, plot_h + 46
    parts = [
        f"<svg class='histogram' data-case='{escape(case_id)}' data-output='{escape(output)}' data-counts='{','.join(map(str, counts))}' "
        f"width='{width}' height='{height}' viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' "
        f"role='img' aria-label='{escape(output)}: elements by error in ulps'>"
    ]
    for i, count in enumerate(shown):
        h = plot_h * count / top
        x = 10 + i * bar_w
        parts.append(
            f"<g><title>{count} element(s) at {_edge_label(edges, i)} ulp</title>"
            f"<rect x='{x + 2}' y='{12 + plot_h - h:.1f}' width='{bar_w - 4}' height='{max(h, 0.5 if count else 0):.1f}' "
            f"fill='{GREEN if i == 0 else RED}'/>"
            f"<text x='{x + bar_w / 2}' y='{height - 20}' text-anchor='middle' font-size='8'>{escape(_edge_label(edges, i))}</text>"
            f"<text x='{x + bar_w / 2}' y='10' text-anchor='middle' font-size='9'>{count if count else ''}</text></g>"
        )
    parts.append(f"<text x='10' y='{height - 4}' font-size='10'>elements by |error| in ulps (up to)</text></svg>")
    return "".join(parts)


def step_cells(outputs: dict[str, dict]) -> dict[tuple[int, int | None], bool]:
    """(step, layer) -> whether every output of that cell passed; the stacked per-step outputs
    (`s03.out`) of a layered component count for no cell."""
    layered = any((step_of(n) or (0, None, ""))[1] is not None for n in outputs)
    cells: dict[tuple[int, int | None], bool] = {}
    for name, metrics in outputs.items():
        where = step_of(name)
        if where is None or (layered and where[1] is None):
            continue
        key = (where[0], where[1])
        cells[key] = cells.get(key, True) and metrics.get("ok") is not False  # a declined output fails no cell
    return cells


def step_strip(case_id: str, outputs: dict[str, dict]) -> str:
    cells = step_cells(outputs)
    if not cells:
        return ""
    steps = sorted({s for s, _ in cells})
    layers = sorted({layer for _, layer in cells}, key=lambda v: -1 if v is None else v)
    failing = sorted(k for k, ok in cells.items() if not ok)
    first = failing[0] if failing else None
    size, left, top = 18, 46, 16
    width, height = max(left + size * len(steps) + 10, 250), top + size * len(layers) + 44
    parts = [
        f"<svg class='steps' data-case='{escape(case_id)}' data-first='{_cell_name(first)}' width='{width}' "
        f"height='{height}' viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' role='img' "
        f"aria-label='{escape(case_id)}: steps by layer, coloured by first divergence'>"
    ]
    for j, layer in enumerate(layers):
        parts.append(
            f"<text x='{left - 4}' y='{top + j * size + 13}' text-anchor='end' font-size='10'>"
            f"{'all' if layer is None else f'layer {layer}'}</text>"
        )
    for i, step in enumerate(steps):
        parts.append(
            f"<text x='{left + i * size + size / 2}' y='{top - 4}' text-anchor='middle' font-size='9'>{step}</text>"
        )
        for j, layer in enumerate(layers):
            ok = cells.get((step, layer))
            state = "absent" if ok is None else "pass" if ok else "first" if (step, layer) == first else "later"
            colour = {"absent": GREY, "pass": GREEN, "first": RED, "later": ORANGE}[state]
            parts.append(
                f"<rect class='cell' data-step='{step}' data-layer='{'' if layer is None else layer}' "
                f"data-state='{state}' x='{left + i * size + 1}' y='{top + j * size + 1}' width='{size - 2}' "
                f"height='{size - 2}' fill='{colour}'><title>step {step}"
                f"{'' if layer is None else f', layer {layer}'}: {state}</title></rect>"
            )
    parts.append(
        f"<text x='4' y='{height - 20}' font-size='10'>steps across; green: matches, red: first</text>"
        f"<text x='4' y='{height - 6}' font-size='10'>divergence, orange: diverged after it</text></svg>"
    )
    return "".join(parts)


def _cell_name(cell: tuple[int, int | None] | None) -> str:
    if cell is None:
        return ""
    return f"s{cell[0]:02d}" + ("" if cell[1] is None else f".l{cell[1]}")
