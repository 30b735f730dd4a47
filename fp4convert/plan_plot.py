"""``plan --plot``: the layer x role grid coloured by format, with bytes per layer beside it.

matplotlib is an optional dependency (extras ``plot`` / ``dev``), imported only when a plot is
drawn; the figure is built with matplotlib's object API, so no global backend is switched.
"""

from __future__ import annotations

from pathlib import Path

from fp4convert.errors import Fp4ConvertError
from fp4convert.inventory import Role
from fp4convert.plan import Plan

__all__ = ["FORMAT_COLOURS", "PLOT_SUFFIXES", "plot_plan"]

PLOT_SUFFIXES = (".png", ".svg")

#: Cell colours; "mixed" marks a cell whose GEMM weights get more than one format, "kept" a cell
#: with only tensors a format never applies to (norms, embeddings, biases).
FORMAT_COLOURS = {
    "nvfp4": "#7b3294",
    "mxfp8": "#e08214",
    "bf16": "#4393c3",
    "mixed": "#878787",
    "kept": "#e0e0e0",
}
_GIB = 2**30
_BEFORE, _AFTER = "#d9d9d9", "#252525"


def _layer_label(layer: int | None, num_layers: int) -> str:
    if layer is None:
        return "outside layers"
    return f"{layer} (MTP)" if layer >= num_layers else str(layer)


def _cell_colour(formats: set[str]) -> str:
    if not formats:
        return FORMAT_COLOURS["kept"]
    return FORMAT_COLOURS[next(iter(formats))] if len(formats) == 1 else FORMAT_COLOURS["mixed"]


def plot_plan(plan: Plan, path: str | Path) -> Path:
    """Draw ``plan`` as a PNG or SVG file.

    Left: one row per layer (tensors outside layers first, MTP layers last), one column per role,
    each cell coloured by the format its GEMM weights get. Right: the layer's bytes before and
    after conversion.

    Args:
        plan: the plan to draw.
        path: output file; the suffix (``.png`` or ``.svg``) picks the format.

    Returns:
        The path written.

    Raises:
        Fp4ConvertError: unsupported suffix, or matplotlib is not installed.

    Example (not run: it writes an image file, with matplotlib):
        >>> plot_plan(plan, "plan.svg")  # doctest: +SKIP
        PosixPath('plan.svg')
    """
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise Fp4ConvertError(
            f"cannot draw a plot as {path.name!r}",
            hint=f"use a file name ending in {' or '.join(PLOT_SUFFIXES)}",
        )
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise Fp4ConvertError("drawing a plan needs matplotlib", hint="pip install 'fp4convert[plot]'") from exc

    grid = plan.grid()
    per_layer = plan.by_layer()
    layers = list(per_layer)
    present = {role for _, role in grid}
    roles = [role.value for role in Role if role.value in present]

    height = max(4.0, 0.16 * len(layers) + 1.8)
    figure = Figure(figsize=(4.0 + 0.55 * len(roles), height), layout="constrained")
    cells, sizes = figure.subplots(1, 2, sharey=True, width_ratios=[max(len(roles), 1), 3])
    for row, layer in enumerate(layers):
        for column, role in enumerate(roles):
            if (layer, role) in grid:
                colour = _cell_colour(grid[(layer, role)])
                cells.add_patch(matplotlib.patches.Rectangle((column, row), 1, 1, facecolor=colour, edgecolor="white"))
    cells.set_xlim(0, len(roles))
    cells.set_ylim(len(layers), 0)
    cells.set_xticks([column + 0.5 for column in range(len(roles))], roles, rotation=60, ha="right")
    step = max(1, len(layers) // 40)  # keep at most ~40 labels readable
    ticks = list(range(0, len(layers), step))
    cells.set_yticks([row + 0.5 for row in ticks], [_layer_label(layers[row], plan.num_layers) for row in ticks])
    cells.set_title(f"{plan.contract} on {plan.family}", loc="left")
    cells.tick_params(length=0)

    rows = [row + 0.5 for row in range(len(layers))]
    before = [per_layer[layer].bytes_before / _GIB for layer in layers]
    after = [per_layer[layer].bytes_after / _GIB for layer in layers]
    sizes.barh(rows, before, height=0.8, color=_BEFORE, label="bytes before")
    sizes.barh(rows, after, height=0.5, color=_AFTER, label="bytes after")
    sizes.set_xlabel("GiB per layer")
    legend = [Patch(facecolor=colour, label=name) for name, colour in FORMAT_COLOURS.items()]
    legend += [Patch(facecolor=_BEFORE, label="bytes before"), Patch(facecolor=_AFTER, label="bytes after")]
    figure.legend(handles=legend, loc="outside lower center", ncols=4, fontsize="small")

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text (searchable, testable)
        figure.savefig(path)
    return path
