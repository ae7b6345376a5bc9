"""The report page: the study's header, the figures of plots.py and a table of the top trials, in ONE html file.

plotly.js is inlined once in the page's head (the file must open offline, anywhere); each figure is a div
drawn by `Plotly.newPlot`. The page's frame is page.html.tmpl, beside this file.
"""

from __future__ import annotations

import html
import json
import string
from pathlib import Path

from autopelt.report import plots
from autopelt.report.contents import Header, ReportContents
from autopelt.report.data import Row
from autopelt.report.ensemble import EnsembleView

TEMPLATE = Path(__file__).with_name("page.html.tmpl")
STATE_WORDS = {"COMPLETE": "complete", "PRUNED": "stopped early", "FAIL": "failed", "RUNNING": "running",
               "WAITING": "waiting"}
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
e = html.escape


def render(contents: ReportContents, footer: str = "") -> str:
    """The whole page as text."""
    from plotly.offline import get_plotlyjs

    sections, figures = _sections(contents)
    header = contents.header
    return string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        title=e(f"autopelt report: {header.study}"), figure_count=str(figures), plotly_js=get_plotlyjs(),
        header=header_html(header, contents.ensemble), sections="\n".join(sections), footer=e(footer),
    )


def _sections(contents: ReportContents) -> tuple[list[str], int]:
    metric, counter = contents.header.dev_label or contents.header.metric, iter(range(1_000_000))

    def figure(fig, name: str) -> str:
        div_id = f"figure-{next(counter)}-{name}"
        return f'<div class="figure" data-figure="{name}">' + fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG) + "</div>"

    out = [_section(
        "Optimisation history",
        f"Dev {metric} of every finished trial by trial number. The line is the best complete, full-fidelity "
        "trial so far; hollow grey markers were stopped early (their last reported value), red crosses failed.",
        figure(plots.history_figure(contents.history, metric), "history") if contents.history
        else _note("no trial has finished yet"),
    )]
    out.append(_section(
        "Pareto front: dev metric against size",
        f"Complete, full-fidelity trials only: the front holds those no other trial beats on both dev {metric} "
        "and stored parameters. Orange points are baselines.",
        figure(plots.pareto_figure(contents.pareto, metric), "pareto") if contents.pareto.front
        else _note("no complete full-fidelity trial with a parameter count yet"),
    ))
    comparison = contents.comparison
    out.append(_section(
        "Search against baselines",
        "The best searched trial against each baseline (a paper's default delta); in brackets, the difference "
        f"in dev {metric} to the best searched trial.",
        figure(plots.baselines_figure(comparison, metric), "baselines")
        if comparison.searched or comparison.baselines else _note("no searched or baseline trial yet"),
    ))
    importances = contents.importances
    out.append(_section(
        "Hyperparameter importances",
        f"How much each searched hyperparameter mattered for dev {metric} (Optuna's default evaluator, over "
        f"{importances.trials} complete full-fidelity searched trial(s)).",
        figure(plots.importance_figure(importances), "importances") if importances.values
        else _note(importances.note or "no importances"),
    ))
    gates = "".join(
        f"<h3>{e(g.label)}</h3>" + figure(plots.gates_figure(g), "gates") for g in contents.gates
    ) or _note("no complete full-fidelity trial recorded UniPELT gate values")
    out.append(_section(
        "UniPELT gates per layer",
        "Mean gate value on the dev set (0 = the delta is shut off, 1 = fully on), for the best gated searched "
        "trial and each gated baseline.", gates,
    ))
    out.append(_section("Top trials", "Complete, full-fidelity trials, best first.",
                        rows_table(contents.top, metric, contents.header.metric) if contents.top
                        else _note("none yet")))
    return out, next(counter)


def _section(title: str, caption: str, body: str) -> str:
    return f'<section>\n<h2>{e(title)}</h2>\n<p class="caption">{e(caption)}</p>\n{body}\n</section>'


def _note(text: str) -> str:
    return f'<p class="note">{e(text)}</p>'


def header_html(header: Header, ensemble: EnsembleView | None = None) -> str:
    better = "higher" if header.maximize else "lower"
    meta = " · ".join(f"{name} <b>{e(value)}</b>" for name, value in [
        ("task", header.task), ("model", header.model), ("space", header.space),
        ("metric", f"dev {header.dev_label or header.metric} ({better} is better)"), ("protocol", header.protocol),
    ])
    counts = "".join(f'<span class="{state}">{n} {STATE_WORDS[state]}</span>' for state, n in header.states.items())
    counts += f"<span>{header.answers} at full fidelity</span>"
    parts = [f"<h1>autopelt report: {e(header.study)}</h1>", f'<p class="meta">{meta}</p>',
             f'<div class="counts">{counts}</div>', _best_html(header)]
    if header.best is not None:
        parts.append(ensemble_html(ensemble, header))
    if header.fail_reasons:
        items = "".join(f"<tr><td class='num'>{n}</td><td>{e(reason)}</td></tr>" for reason, n in header.fail_reasons)
        parts.append(f"<details><summary>why trials failed</summary><table><tr><th class='num'>trials</th>"
                     f"<th>reason</th></tr>{items}</table></details>")
    return '<header>\n' + "\n".join(parts) + '\n</header>'


def _best_html(header: Header) -> str:
    best = header.best
    if best is None:
        return '<div class="best">No trial has completed at full fidelity yet.</div>'
    kind = best.phase or (f"baseline {best.name}" if best.name != "searched" else "searched")
    of = f" ({e(best.dev_of)})" if best.dev_of else ""
    scores = [f"dev {e(header.dev_label or header.metric)} <b>{_num(best.dev)}</b>{of}"]
    if best.test is not None:
        scores.append(f"test {e(header.metric)} <b>{_num(best.test)}</b>")
    floors = header.floors
    if floors.get("dev") is not None:
        scores.append(f"one-class floor: dev {_num(floors['dev'])}"
                      + (f", test {_num(floors['test'])}" if floors.get("test") is not None else ""))
    if best.params_pct is not None:
        stored = f" ({best.params_stored:,} stored)" if best.params_stored is not None else ""
        scores.append(f"{best.params_pct:.3g}% params{stored}")
    hparams = ", ".join(f"{e(str(k))}={e(_short(v))}" for k, v in header.best_hparams.items())
    spec = json.dumps(header.best_spec, indent=1) if header.best_spec else ""
    return (f'<div class="best{" baseline" if best.name != "searched" else ""}">Best trial <b>#{best.number}</b> '
            f"({e(kind)}): <b>{e(best.summary)}</b><br>{' · '.join(scores)}"
            + (f"<br><b>{e(header.nothing_learned)}</b>" if header.nothing_learned else "")
            + (f"<br>hyperparameters: {hparams}" if hparams else "")
            + (f"<details><summary>delta spec</summary><pre>{e(spec)}</pre></details>" if spec else "") + "</div>")


def ensemble_html(view: EnsembleView | None, header: Header) -> str:
    """The study's ensemble beside the answer: its members and weights, dev and test of both, its cost."""
    if view is None:
        return _note("No ensemble: no trial folder here kept dev predictions.")
    if len(view.members) < 2:
        return _note(f"The ensemble of the study's trials (greedy selection on dev) kept one member: "
                     f"{view.members[0][0]}; the single answer stands alone.")
    metric = e(view.metric)
    single_test = view.single_test if view.single_test is not None else (header.best.test if header.best else None)
    test = (f"test {metric} <b>{_num(view.test)}</b> vs the single answer's {_num(single_test)}"
            if view.test is not None else
            "test not scored: a member kept no test predictions here (<code>autopelt export --ensemble</code> "
            f"scores it){'' if single_test is None else f'; the single answer’s test {_num(single_test)}'}")
    verdict = ("it answers the study" if view.answers else
               f"the single answer stays (the ensemble's dev gain {100 * (view.dev - view.single_dev):+.2f} is not "
               f"above the margin {100 * view.margin:.2f})")
    rows = "".join(f"<tr><td class='num'>{weight:.3f}</td><td>{e(summary)}</td><td class='num'>{_num(dev)}</td></tr>"
                   for summary, weight, dev in view.members)
    return (f'<div class="best ensemble">Ensemble of <b>{len(view.members)}</b> trials (greedy selection with '
            f"replacement, Caruana et al. 2004): dev {metric} <b>{_num(view.dev)}</b> vs the single answer's "
            f"{_num(view.single_dev)} ({e(view.single)}), measured on the dev rows that chose its members · {test}"
            f" · {view.forward_passes} forward passes an input · {e(verdict)}"
            f"<details><summary>members</summary><table><tr><th class='num'>weight</th><th>delta</th>"
            f"<th class='num'>dev {metric}</th></tr>{rows}</table></details></div>")


def rows_table(rows: list[Row], metric: str, test_metric: str | None = None) -> str:
    head = ("<tr><th class='num'>rank</th><th class='num'>trial</th><th>kind</th><th>delta</th>"
            f"<th class='num'>params %</th><th class='num'>stored</th><th class='num'>dev {e(metric)}</th>"
            f"<th class='num'>test {e(test_metric or metric)}</th><th class='num'>epochs</th>"
            "<th class='num'>seconds</th></tr>")
    body = "".join(
        f"<tr class='{'searched' if r.name == 'searched' else 'baseline'}'><td class='num'>{rank}</td>"
        f"<td class='num'>#{r.number}</td><td class='kind'>{e(r.phase or r.name)}</td><td>{e(r.summary)}</td>"
        f"<td class='num'>{'' if r.params_pct is None else f'{r.params_pct:.3g}'}</td>"
        f"<td class='num'>{'' if r.params_stored is None else f'{r.params_stored:,}'}</td>"
        f"<td class='num'>{_num(r.dev)}</td><td class='num'>{_num(r.test)}</td><td class='num'>{e(r.fidelity)}</td>"
        f"<td class='num'>{'' if r.seconds is None else f'{r.seconds:.0f}'}</td></tr>"
        for rank, r in enumerate(rows, 1)
    )
    return f"<table>{head}{body}</table>"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
