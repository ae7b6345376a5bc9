"""Plotly figures of the report's data (data.py): drawing only, every number is computed there.

Colours: searched trials blue, baselines orange, early-stopped grey, failed red.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from autopelt.report.data import Comparison, GateMap, HistoryPoint, Pareto
from autopelt.report.importance import Importances

SEARCHED, BASELINE, STOPPED, FAILED, BEST = "#1f77b4", "#ff7f0e", "#9e9e9e", "#d62728", "#2b2b2b"
HEIGHT = 380


def _layout(fig: go.Figure, x: str, y: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(
        template="plotly_white", height=height, margin=dict(l=60, r=20, t=20, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), xaxis_title=x, yaxis_title=y,
        font=dict(family="Liberation Sans, Arial, sans-serif", size=13),
    )
    return fig


def _hover(labels: list[str], notes: list[str] | None = None) -> list[str]:
    notes = notes or [""] * len(labels)
    return [html.escape(text) + (f"<br>{html.escape(note)}" if note else "") for text, note in zip(labels, notes)]


def history_figure(points: list[HistoryPoint], metric: str) -> go.Figure:
    """Dev metric per trial; the best-so-far line counts complete full-fidelity trials only."""
    fig = go.Figure()
    groups = [
        ("searched", SEARCHED, "circle", 1.0, lambda p: p.answer and not p.baseline),
        ("baselines", BASELINE, "diamond", 1.0, lambda p: p.answer and p.baseline),
        ("stopped early / partial", STOPPED, "circle-open", 0.7, lambda p: not p.answer and p.state != "FAIL"),
    ]
    for name, colour, symbol, opacity, keep in groups:
        chosen = [p for p in points if keep(p) and p.value is not None]
        if chosen:
            fig.add_trace(go.Scatter(
                x=[p.number for p in chosen], y=[p.value for p in chosen], mode="markers", name=name,
                marker=dict(color=colour, symbol=symbol, size=9, opacity=opacity),
                hovertext=_hover([p.label for p in chosen], [p.note for p in chosen]),
                hovertemplate="%{hovertext}<br>dev %{y:.4f}<extra></extra>",
            ))
    failed = [p for p in points if p.state == "FAIL"]
    if failed:
        values = [p.value for p in points if p.value is not None]
        floor = min(values) if values else 0.0
        fig.add_trace(go.Scatter(
            x=[p.number for p in failed], y=[floor] * len(failed), mode="markers", name="failed (no metric)",
            marker=dict(color=FAILED, symbol="x", size=8), hovertext=_hover([p.label for p in failed],
                                                                            [p.note for p in failed]),
            hovertemplate="%{hovertext}<extra></extra>",
        ))
    best = [p for p in points if p.best_so_far is not None]
    if best:
        fig.add_trace(go.Scatter(
            x=[p.number for p in best], y=[p.best_so_far for p in best], mode="lines", name="best so far",
            line=dict(color=BEST, width=2, shape="hv"), hovertemplate="best so far %{y:.4f}<extra></extra>",
        ))
    return _layout(fig, "trial", f"dev {metric}")


def pareto_figure(pareto: Pareto, metric: str) -> go.Figure:
    """Dev metric against stored parameters; the front is joined, dominated trials are grey."""
    fig = go.Figure()
    hover = "%{hovertext}<br>%{x:.3g}% params, dev %{y:.4f}<extra></extra>"
    if pareto.dominated:
        fig.add_trace(go.Scatter(
            x=[p.params_pct for p in pareto.dominated], y=[p.dev for p in pareto.dominated], mode="markers",
            name="dominated", marker=dict(color=STOPPED, size=8, opacity=0.7),
            hovertext=_hover([p.label for p in pareto.dominated]), hovertemplate=hover,
        ))
    fig.add_trace(go.Scatter(
        x=[p.params_pct for p in pareto.front], y=[p.dev for p in pareto.front], mode="lines", name="Pareto front",
        line=dict(color=SEARCHED, shape="hv", width=1.5), hoverinfo="skip",
    ))
    for name, colour, keep in [("on the front: searched", SEARCHED, lambda p: not p.baseline),
                               ("on the front: baseline", BASELINE, lambda p: p.baseline)]:
        chosen = [p for p in pareto.front if keep(p)]
        if chosen:
            fig.add_trace(go.Scatter(
                x=[p.params_pct for p in chosen], y=[p.dev for p in chosen], mode="markers+text", name=name,
                marker=dict(size=11, color=colour), text=[p.baseline or f"#{p.number}" for p in chosen],
                textposition="top left", hovertext=_hover([p.label for p in chosen]), hovertemplate=hover,
            ))
    _log_axis_if_wide(fig, [p.params_pct for p in pareto.front + pareto.dominated])
    return _layout(fig, "stored parameters (% of the base model)", f"dev {metric}")


def _log_axis_if_wide(fig: go.Figure, pcts: list[float]) -> None:
    """A log x axis with 1-2-5 ticks when sizes span 10x or more."""
    low, high = min(pcts), max(pcts)
    if low <= 0 or high / low < 10:
        return
    ticks = [m * 10.0 ** e for e in range(-6, 4) for m in (1, 2, 5) if low / 1.5 <= m * 10.0 ** e <= high * 1.5]
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}%" for t in ticks])


def baselines_figure(comparison: Comparison, metric: str) -> go.Figure:
    """One bar per baseline and one for the best searched trial (drawn on top)."""
    rows = list(reversed(comparison.baselines)) + ([comparison.searched] if comparison.searched else [])
    names = [r.name if r.name != "searched" else "best searched" for r in rows]
    names = [n if r.dev is not None and r.state == "COMPLETE" else f"{n} ({r.state.lower()})"
             for n, r in zip(names, rows)]
    text = []
    for r in rows:
        if r.dev is None or r.state != "COMPLETE":
            text.append("")
            continue
        delta = f" ({r.vs_searched:+.3f})" if r.vs_searched is not None else ""
        size = f" · {r.params_pct:.3g}% params" if r.params_pct is not None else ""
        text.append(f"{r.dev:.3f}{delta}{size}")
    fig = go.Figure(go.Bar(
        y=names, x=[r.dev if r.state == "COMPLETE" else None for r in rows], orientation="h", text=text,
        textposition="auto", marker_color=[SEARCHED if r.name == "searched" else BASELINE for r in rows],
        hovertext=_hover([f"#{r.number} {r.summary}" if r.number is not None else r.name for r in rows],
                         [r.note for r in rows]),
        hovertemplate="%{hovertext}<br>dev %{x:.4f}<extra></extra>", name=f"dev {metric}",
    ))
    fig = _layout(fig, f"dev {metric}", "", height=max(220, 60 + 36 * len(rows)))
    fig.update_layout(showlegend=False, margin=dict(l=170))
    return fig


def importance_figure(importances: Importances) -> go.Figure:
    names = list(reversed(importances.values))
    fig = go.Figure(go.Bar(
        y=names, x=[importances.values[n] for n in names], orientation="h", marker_color=SEARCHED,
        texttemplate="%{x:.2f}", textposition="auto", hovertemplate="%{y}: %{x:.3f}<extra></extra>",
        name="importance",
    ))
    fig = _layout(fig, "importance (sums to 1)", "", height=max(200, 60 + 32 * len(names)))
    fig.update_layout(showlegend=False, margin=dict(l=170))
    return fig


def gates_figure(gate_map: GateMap) -> go.Figure:
    """Mean gate value per kind (rows) and layer (columns): how much of each delta UniPELT let through."""
    fig = go.Figure(go.Heatmap(
        z=gate_map.values, x=[f"layer {layer}" for layer in gate_map.layers], y=gate_map.kinds,
        zmin=0, zmax=1, colorscale="Viridis", xgap=2, ygap=2, texttemplate="%{z:.2f}",
        colorbar=dict(title=dict(text="gate"), thickness=14),
        hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>", name=f"#{gate_map.number}",
    ))
    fig = _layout(fig, "", "", height=max(200, 90 + 45 * len(gate_map.kinds)))
    fig.update_yaxes(autorange="reversed")
    return fig
