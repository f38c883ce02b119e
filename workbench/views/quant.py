"""Views of the quantization lab (`workbench.quant`): where a model can take which format, and at what cost.

- a layers × formats heat map of the output's SQNR with each layer alone in each format (hover: KL, the task
  metric's change, the rank);
- each weight's rounding-error histogram per format, on one shared error axis per layer;
- the outlier-channel plot: the per-channel largest |input| of the layers with the worst max/median ratio,
  before and after SmoothQuant scaling (log axis);
- the recipes' accuracy–memory–speed Pareto: weight bytes against the output's SQNR, the point's size its
  projected time, the Pareto front drawn through the recipes no other beats on both.

Every view takes the lab's DataFrames; none computes anything of its own. Names (layers, recipes) reach the page
as data fields only, so they render as text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column, gridplot
from bokeh.models import ColorBar, ColumnDataSource, Div, HoverTool, LayoutDOM, LinearColorMapper, Range1d
from bokeh.palettes import Category10_10, Viridis256
from bokeh.plotting import figure

from workbench.views._table import data_table

FORMAT_COLORS = Category10_10
"""One colour per format, in the order the formats were asked."""

RECIPE_COLUMNS = [("recipe", "recipe", None), ("sqnr", "SQNR dB", None), ("kl", "KL", "0.00000"),
                  ("metric", "metric", "0.000"), ("metric_delta", "Δ metric", "+0.000"),
                  ("weight_mb", "weights MB", "0,0.000"), ("kv_bytes_per_token", "KV B/token", "0,0"),
                  ("projected_us", "projected µs", "0,0.000"), ("measured_ms", "measured CPU ms", "0.000"),
                  ("kernel", "measured with / note", None)]
SENSITIVITY_COLUMNS = [("rank", "rank", "0"), ("layer", "layer", None), ("format", "format", None),
                       ("params", "params", "0,0"), ("sqnr_db", "SQNR dB", "0.0"), ("kl", "KL", "0.00000"),
                       ("metric_delta", "Δ metric", "+0.000")]
OUTLIER_COLUMNS = [("layer", "layer", None), ("channels", "channels", "0,0"), ("ratio", "max/median", "0,0.0"),
                   ("top", "top channels", None), ("sqnr_db", "input SQNR dB", "0.0"),
                   ("ratio_after", "max/median smoothed", "0,0.0"), ("gain_db", "SmoothQuant gain dB", "+0.0")]


def sensitivity_heatmap(layers: pd.DataFrame, *, width: int = 900) -> LayoutDOM:
    """SQNR (dB) of the output with one layer (row) alone in one format (column); darker is worse."""
    if layers.empty:
        return Div(text="No sensitivity scan: nothing to draw.", render_as_text=True)
    order = list(dict.fromkeys(layers["layer"]))
    formats = list(dict.fromkeys(layers["format"]))
    finite = layers["sqnr_db"].replace([np.inf, -np.inf], np.nan)
    low, high = float(np.nanmin(finite)), float(np.nanmax(finite))
    source = ColumnDataSource({
        "layer": layers["layer"].astype(str).to_numpy(dtype=object),
        "format": layers["format"].astype(str).to_numpy(dtype=object),
        "sqnr_db": finite.to_numpy(dtype=float), "kl": layers["kl"].to_numpy(dtype=float),
        "metric_delta": pd.to_numeric(layers.get("metric_delta"), errors="coerce").to_numpy(dtype=float)
        if "metric_delta" in layers else np.full(len(layers), np.nan),
        "rank": layers["rank"].to_numpy(dtype=int),
        "label": [f"{v:.1f}" if np.isfinite(v) else "exact" for v in finite.to_numpy(dtype=float)],
        "ink": ["black" if np.isfinite(v) and (v - low) > 0.6 * (high - low) else "white"
                for v in finite.to_numpy(dtype=float)],  # dark text on the light end of the palette
    })
    mapper = LinearColorMapper(palette=Viridis256, low=low, high=high if high > low else low + 1)
    height = min(max(22 * len(order) + 120, 220), 1400)
    fig = figure(x_range=formats, y_range=list(reversed(order)), width=min(width, max(620, 160 + 110 * len(formats))),
                 height=height, title="output SQNR (dB) with one layer alone in each format: lower is worse",
                 toolbar_location="right", tools="save")
    fig.rect(x="format", y="layer", width=1, height=1, source=source, line_color="white",
             fill_color={"field": "sqnr_db", "transform": mapper})
    fig.text(x="format", y="layer", text="label", source=source, text_align="center", text_baseline="middle",
             text_font_size="10px", text_color="ink")
    fig.add_layout(ColorBar(color_mapper=mapper, title="dB", width=10), "right")
    fig.add_tools(HoverTool(tooltips=[("layer", "@layer"), ("format", "@format"), ("SQNR", "@sqnr_db{0.0} dB"),
                                      ("KL", "@kl{0.00000}"), ("Δ metric", "@metric_delta{+0.000}"),
                                      ("rank in format", "@rank")]))
    fig.xaxis.major_label_orientation = 0.6
    fig.grid.grid_line_color = None
    return fig


def error_histograms(histograms: pd.DataFrame, *, width: int = 900, columns: int = 3) -> LayoutDOM:
    """One plot per layer: the weight's rounding error (relative to its largest |value|) per format."""
    if histograms.empty:
        return Div(text="No error histograms: no weight was quantized.", render_as_text=True)
    formats = list(dict.fromkeys(histograms["format"]))
    plots = []
    for layer, rows in histograms.groupby("layer", sort=False):
        fig = figure(width=width // columns, height=200, title=str(layer), tools="save,xwheel_zoom,reset",
                     toolbar_location=None)
        for fmt, part in rows.groupby("format", sort=False):
            color = FORMAT_COLORS[formats.index(fmt) % len(FORMAT_COLORS)]
            legend = {"legend_label": str(fmt)} if not plots else {}  # one legend, on the first plot
            source = ColumnDataSource({key: part[key].to_numpy() for key in ("left", "right", "count")})
            fig.quad(left="left", right="right", top="count", bottom=0, source=source,
                     fill_color=color, fill_alpha=0.35, line_color=color, **legend)
        fig.xaxis.axis_label = "error / max |w|"
        fig.yaxis.axis_label = "values"
        plots.append(fig)
    if plots and plots[0].legend:
        plots[0].legend.label_text_font_size = "9px"
    return gridplot(plots, ncols=columns, toolbar_location=None)


def outlier_plot(profile: pd.DataFrame, *, width: int = 900) -> LayoutDOM:
    """Per layer with outliers, each input channel's largest |value| before (bars) and after SmoothQuant (dots)."""
    if profile.empty:
        return Div(text="No activation profile: the model has no Linear inputs to show.", render_as_text=True)
    plots = []
    for layer, rows in profile.groupby("layer", sort=False):
        source = ColumnDataSource({"channel": rows["channel"].to_numpy(), "absmax": rows["absmax"].to_numpy(),
                                   "smoothed": rows["smoothed_absmax"].to_numpy()})
        positive = rows[["absmax", "smoothed_absmax"]].to_numpy()
        positive = positive[positive > 0]
        low = float(positive.min()) / 2 if positive.size else 1e-3
        fig = figure(width=width, height=220, y_axis_type="log", title=f"{layer}: largest |input| per channel",
                     tools="save,xwheel_zoom,xpan,reset", y_range=Range1d(low, float(positive.max()) * 2
                                                                      if positive.size else 1.0))
        fig.vbar(x="channel", top="absmax", bottom=low, width=0.9, source=source, color="#c44e52",
                 legend_label="before")
        fig.scatter(x="channel", y="smoothed", source=source, size=4, color="#4c72b0",
                    legend_label="after SmoothQuant (α = 0.5)")
        fig.add_tools(HoverTool(tooltips=[("channel", "@channel"), ("max |x|", "@absmax{0.000}"),
                                          ("smoothed", "@smoothed{0.000}")]))
        fig.xaxis.axis_label = "input channel"
        fig.legend.location = "top_right"
        fig.legend.label_text_font_size = "9px"
        plots.append(fig)
    return column(*plots)


def pareto_front(points: pd.DataFrame, x: str, y: str) -> np.ndarray:
    """Indices of the rows no other row beats on both: smaller `x` and larger `y`."""
    order = points.sort_values([x, y], ascending=[True, False]).index
    best, front = -np.inf, []
    for index in order:
        value = points.at[index, y]
        if value > best:
            front.append(index)
            best = value
    return np.array(front)


def recipe_pareto(recipes: pd.DataFrame, *, width: int = 900) -> LayoutDOM:
    """Weight bytes against output SQNR per recipe; size by projected time; the Pareto front as a line."""
    usable = recipes.assign(weight_mb=recipes["weight_bytes"] / 1e6)
    finite = usable["sqnr_db"].replace(np.inf, np.nan)
    usable["y"] = usable["sqnr_db"].replace(np.inf, (finite.max() if finite.notna().any() else 0) + 10)
    usable = usable[usable["y"].notna()]
    if usable.empty:
        return Div(text="No recipes to compare.", render_as_text=True)
    time = usable["projected_us"].fillna(0).to_numpy(dtype=float)
    usable["size"] = 10 + 30 * (time / time.max() if time.max() > 0 else 0)
    source = ColumnDataSource({**{key: usable[key].to_numpy(dtype=object if key == "recipe" else float)
                                  for key in ("recipe", "weight_mb", "y", "size", "projected_us", "kl")},
                               "label": [short_recipe(r) for r in usable["recipe"]]})
    right = float(usable["weight_mb"].max())
    fig = figure(width=width, height=380, title="recipes: weight memory against output SQNR (up and left is better;"
                 " point size: projected time)", tools="save,wheel_zoom,pan,reset,tap",
                 x_range=Range1d(0, right * 1.2 if right > 0 else 1))  # room for the rightmost label
    front = usable.loc[pareto_front(usable, "weight_mb", "y")]
    fig.line(front["weight_mb"], front["y"], line_color="gray", line_dash="dashed", legend_label="Pareto front")
    fig.scatter(x="weight_mb", y="y", size="size", source=source, fill_alpha=0.6, color="#4c72b0")
    fig.text(x="weight_mb", y="y", text="label", source=source, text_font_size="9px", x_offset=10, y_offset=4)
    fig.add_tools(HoverTool(tooltips=[("recipe", "@recipe"), ("weights", "@weight_mb{0,0.000} MB"),
                                      ("SQNR", "@y{0.0} dB"), ("KL", "@kl{0.00000}"),
                                      ("projected", "@projected_us{0,0.0} µs")]))
    fig.xaxis.axis_label = "weight memory (MB)"
    fig.yaxis.axis_label = "output SQNR (dB; the reference at the top)"
    fig.legend.location = "bottom_right"
    return fig


def recipes_table(recipes: pd.DataFrame, *, width: int = 900):
    """The recipes side by side: accuracy, memory, projected and measured time."""
    frame = recipes.assign(weight_mb=recipes["weight_bytes"] / 1e6,
                           sqnr=[_db_text(v) for v in recipes["sqnr_db"]])
    return data_table(frame, RECIPE_COLUMNS, width=width, height=30 + 28 * max(len(frame), 1),
                      widths={"recipe": 300, "sqnr": 60, "kl": 70, "metric": 60, "metric_delta": 60, "weight_mb": 75,
                              "kv_bytes_per_token": 75, "projected_us": 80, "measured_ms": 90, "kernel": 230},
                      hover=("recipe", "kernel"))


def _db_text(value: float) -> str:
    """An SQNR for a table: "exact" for the reference (infinite), one decimal otherwise."""
    return "exact" if value == np.inf else "-" if pd.isna(value) else f"{value:.1f}"


def short_recipe(recipe: str) -> str:
    """A recipe's label for a plot: `W:` every layer's weights, `A:` their inputs, `KV:` the KV cache, the rest as
    written."""
    for pattern, label in (("linear.weight=", "W:"), ("linear.input=", "A:"), ("*.weight=", "W:"),
                           ("*.input=", "A:"), ("kv=", "KV:")):
        recipe = recipe.replace(pattern, label)
    return recipe.replace(",", " ")


def sensitivity_table(layers: pd.DataFrame, *, width: int = 900, top: int = 20):
    """The layers whose quantization hurts most, worst first, per format."""
    frame = layers.sort_values(["rank", "format"]).head(top * max(layers["format"].nunique(), 1))
    return data_table(frame, SENSITIVITY_COLUMNS, width=width, height=min(30 + 28 * max(len(frame), 1), 440),
                      widths={"layer": 260})


def outlier_table(outliers: pd.DataFrame, smoothing: pd.DataFrame, *, width: int = 900):
    """Per layer: the outlier ratio, its input's SQNR in INT8, and what SmoothQuant scaling does to both."""
    frame = outliers.merge(smoothing[["layer", "ratio_after", "gain_db"]], on="layer", how="left")
    frame["top"] = [", ".join(str(c) for c in channels) for channels in frame["top_channels"]]
    return data_table(frame, OUTLIER_COLUMNS, width=width, height=min(30 + 28 * max(len(frame), 1), 440),
                      widths={"layer": 260})


TENSOR_COLUMNS = [("tensor", "tensor", None), ("format", "format", None), ("bits", "bits/value", "0.00"),
                  ("sqnr_db", "SQNR dB", "0.0"), ("kl", "KL", "0.00000"), ("metric_delta", "Δ metric", "+0.000"),
                  ("note", "note", None)]


def _heading(text: str, width: int) -> Div:
    return Div(text=text, render_as_text=True, width=width, styles={"font-weight": "bold", "font-size": "14px"})


def recipes_view(about: str, recipes: pd.DataFrame, *, device: str = "b200", width: int = 1100) -> LayoutDOM:
    """What the model was judged on, and the recipes side by side: the table and the Pareto."""
    return column(_heading(about, width),
                  Div(text=f"Recipes: accuracy against the fp32 model, memory, time projected on {device} (a roofline: "
                           "no kernel ran) and measured on this CPU where a real kernel exists.",
                      render_as_text=True, width=width),
                  recipes_table(recipes, width=width), recipe_pareto(recipes, width=width))


def sensitivity_view(sensitivity, *, width: int = 1100) -> LayoutDOM:
    """A sensitivity scan (`workbench.quant.lab.Sensitivity`): the heat map, the most sensitive layers, the tensor
    kinds, the outliers and the error histograms."""
    return column(_heading("Sensitivity: one layer alone in each format", width),
                  sensitivity_heatmap(sensitivity.layers, width=width),
                  sensitivity_table(sensitivity.layers, width=width),
                  _heading("Tensor kinds: one kind in each format across the whole model", width),
                  data_table(sensitivity.tensors, TENSOR_COLUMNS, width=width,
                             height=min(30 + 28 * max(len(sensitivity.tensors), 1), 440), hover=("note",)),
                  _heading("Activation outliers and SmoothQuant (α = 0.5)", width),
                  outlier_table(sensitivity.outliers, sensitivity.smoothing, width=width),
                  outlier_plot(sensitivity.profile, width=width),
                  _heading("Weight rounding error of the most sensitive layers", width),
                  error_histograms(sensitivity.histograms, width=width))


def quant_view(about: str, recipes: pd.DataFrame, sensitivity=None, *, device: str = "b200",
               width: int = 1100) -> LayoutDOM:
    """The lab's page: the recipes, then the sensitivity scan when there is one."""
    parts = [recipes_view(about, recipes, device=device, width=width)]
    if sensitivity is not None:
        parts.append(sensitivity_view(sensitivity, width=width))
    return column(*parts)
