"""The task harness's report in the paper's layout: per task the absolute table (Tables 6-8: tokens, wall time
and NFE per response, throughput from aggregate totals, accuracy with its standard error), the paired
efficiency table (Tables 12-13: wall-time difference Packed-SS minus baseline, throughput ratio, intervals),
Figure 3's ratios to Linear-SS (throughput, tokens/NFE, time/NFE of Packed-SS, Quadratic-SS and native
diffusion), the accuracy table (Table 11: paired accuracy differences, correctness labels against AR), pass@k
and GSM8K's lm-eval extractions where they apply; across tasks one table and Figure 5's timing decomposition
(F.3: each task's model and non-model time over its Linear-SS total, GSM8K and MATH-500 averaged with equal
weight); markdown and a self-contained HTML page. Reads only the per-task summaries, so saved ``paper.json``
renders again.
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from packed_ss.bench.palette import schedule_color
from packed_ss.wording import counted
from packed_ss.bench.report import LABELS, _gap, _interval, _num, few_prompts_warning

BASELINES = ("linear", "quadratic", "ar", "diffusion")  # Packed-SS is compared with each that was measured
TO_LINEAR = ("packed", "quadratic", "diffusion")  # Figure 3: ratios of each to Linear-SS
FIGURE_RATIOS = (("throughput_ratio", "throughput"), ("tokens_per_nfe_ratio", "tokens/NFE"),
                 ("time_per_nfe_ratio", "time/NFE"))
DECOMPOSED = ("gsm8k", "math500")  # F.3 averages these tasks


def _pct(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{100 * value:.2f}"


def _pct_interval(item: dict) -> str:
    return f"{_pct(item['estimate'])} [{_pct(item['low'])}, {_pct(item['high'])}]"


def _pct_se(item: dict) -> str:
    """An accuracy with its standard error, in percent: ``12.50 ± 2.10``."""
    se = item.get("stderr")
    return _pct(item["accuracy"]) + (f" ± {_pct(se)}" if se is not None and math.isfinite(se) else "")


def absolute_table(entry: dict) -> tuple[str, list[str], list[list[str]], str]:
    """Tables 6-8: one row per schedule of one task."""
    summary, accuracy = entry["summary"], entry.get("accuracy") or {}
    by_acc = accuracy.get("by_schedule", {})
    best = max((s["throughput"] or 0 for s in summary["schedules"].values()), default=0)
    rows = []
    for name, s in summary["schedules"].items():
        mark = " **(best)**" if s["throughput"] and s["throughput"] == best else ""
        acc = _pct_se(by_acc[name]) if name in by_acc else "not graded"
        rows.append([LABELS.get(name, name), _num(s["tokens_mean"], 1), _num(s["wall_mean_s"], 3),
                     _num(s["nfe_mean"], 1), _num(s["throughput"], 1) + mark, _num(s["tokens_per_nfe"], 2), acc])
    lossless = summary.get("lossless") or {}
    differing = ", ".join(f"{LABELS.get(n, n)} {c['differing']} of {c['compared']}"
                          for n, c in lossless.get("by_schedule", {}).items())
    check = f" Outputs differing from AR's, token for token: {differing}." if lossless.get("applies") and differing else ""
    skipped = summary["meta"].get("skipped_prompts") or []
    if skipped:
        check += (f" {len(skipped)} prompt{'s' if len(skipped) != 1 else ''} not measured: "
                  + "; ".join(f"{s['prompt_id']} ({s['reason']})" for s in skipped[:5])
                  + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "") + ".")
    return (f"{entry['task']}: absolute measurements ({counted(summary['meta'].get('prompts_measured', 0), 'prompt')})",
            ["schedule", "tokens", "wall (s)", "NFE", "tokens/s", "tokens/NFE", "accuracy (%) ± s.e."], rows,
            "Tokens, wall time and NFE are means per response; tokens/s and tokens/NFE use aggregate totals; "
            "s.e.: standard error over prompts (lm-eval-harness's)." + check)


def efficiency_table(entry: dict) -> tuple[str, list[str], list[list[str]], str]:
    """Tables 12-13: Packed-SS against each measured baseline, paired by prompt."""
    rows = []
    for c in entry["summary"]["comparisons"]:
        if c["numerator"] == "packed" and c["denominator"] in BASELINES:
            rows.append([f"Packed-SS vs {LABELS.get(c['denominator'], c['denominator'])}",
                         _interval(c["wall_difference_s"], 4), _interval(c["throughput_ratio"])])
    warning = few_prompts_warning(entry["summary"]["meta"].get("prompts_measured", 0))
    return (f"{entry['task']}: paired efficiency", ["comparison", "wall difference (s)", "throughput ratio"], rows,
            "Wall difference: Packed-SS minus the baseline, seconds per response; ratio: Packed-SS / baseline; "
            "brackets: 95% paired bootstrap intervals over prompts." + (f" {warning}" if warning else ""))


def ratio_table(entry: dict) -> tuple[str, list[str], list[list[str]], str] | None:
    """Figure 3: each schedule's throughput, tokens/NFE and time/NFE as ratios to Linear-SS, paired by prompt."""
    found = {c["numerator"]: c for c in entry["summary"]["comparisons"] if c["denominator"] == "linear"}
    rows = [[f"{LABELS.get(name, name)} / Linear-SS"] + [_interval(found[name][key]) for key, _ in FIGURE_RATIOS]
            for name in TO_LINEAR if name in found]
    if not rows:
        return None
    return (f"{entry['task']}: ratios to Linear-SS (Figure 3)", ["schedule"] + [label for _, label in FIGURE_RATIOS],
            rows, "Above 1 is better for throughput and tokens/NFE, below 1 for time/NFE; 95% paired intervals.")


def pass_at_k_table(entry: dict) -> tuple[str, list[str], list[list[str]], str] | None:
    """pass@k per schedule where there were several responses per prompt (E.4: 20 for HumanEval, 7 for MBPP)."""
    by_acc = (entry.get("accuracy") or {}).get("by_schedule", {})
    ks = sorted({int(k) for a in by_acc.values() for k in (a.get("pass_at_k") or {})})
    if not ks:
        return None
    rows = [[LABELS.get(name, name)] + [_pct_se({"accuracy": a["pass_at_k"][str(k)]["estimate"],
                                                 "stderr": a["pass_at_k"][str(k)]["stderr"]})
                                        if str(k) in (a.get("pass_at_k") or {}) else "n/a" for k in ks]
            for name, a in by_acc.items()]
    return (f"{entry['task']}: pass@k", ["schedule"] + [f"pass@{k} (%)" for k in ks], rows,
            "Unbiased estimator (Chen et al., 2021) averaged over prompts, ± its standard error.")


def extraction_table(entry: dict) -> tuple[str, list[str], list[list[str]], str] | None:
    """GSM8K: math-verify's verdict beside lm-eval-harness's strict-match and flexible-extract exact match."""
    by_acc = (entry.get("accuracy") or {}).get("by_schedule", {})
    if not any("strict_match" in a for a in by_acc.values()):
        return None
    rows = [[LABELS.get(name, name), _pct_se(a), _pct_se(a["strict_match"]), _pct_se(a["flexible_match"])]
            for name, a in by_acc.items() if "strict_match" in a]
    return (f"{entry['task']}: answer extraction", ["schedule", "math-verify (%)", "lm-eval strict-match (%)",
                                                    "lm-eval flexible-extract (%)"], rows,
            "strict-match needs '#### <number>' in the response (lm-eval's few-shot format; the paper's prompt asks "
            "for \\boxed{}); flexible-extract takes the last number. Both: exact match after lm-eval's normalisation.")


def decomposition_table(entries: list[dict]) -> tuple[str, list[str], list[list[str]], str] | None:
    """F.3 / Figure 5: model and non-model time over each task's Linear-SS total, GSM8K and MATH-500 averaged
    with equal weight (the tasks of :data:`DECOMPOSED` that were measured)."""
    parts = [e for e in entries if e["task"] in DECOMPOSED and e["summary"]["decomposition"]["reference"] == "linear"]
    if not parts:
        return None
    names = [n for n in parts[0]["summary"]["decomposition"]["by_schedule"]
             if all(n in e["summary"]["decomposition"]["by_schedule"] for e in parts)]
    rows = []
    for name in names:
        values = [[e["summary"]["decomposition"]["by_schedule"][name][k] for e in parts] for k in ("model", "other",
                                                                                                   "total")]
        rows.append([LABELS.get(name, name)] + [_num(sum(v) / len(v), 3) for v in values])
    tasks = " + ".join(e["task"] for e in parts)
    missing = [t for t in DECOMPOSED if t not in {e["task"] for e in parts}]
    return (f"Timing decomposition ({tasks}, fraction of Linear-SS's total)", ["schedule", "model time",
                                                                               "non-model decoder time", "total"],
            rows, "Each task's mean times over its Linear-SS mean total, then the tasks averaged with equal weight "
                  "(F.3)." + (f" {' and '.join(missing)} not measured: the paper averages both." if missing else ""))


def accuracy_table(entry: dict) -> tuple[str, list[str], list[list[str]], str]:
    """Table 11: paired accuracy differences and correctness labels against AR."""
    accuracy = entry.get("accuracy") or {}
    rows = [[f"{LABELS.get(d['a'], d['a'])} - {LABELS.get(d['b'], d['b'])}", _pct_interval(d["difference"])]
            for d in accuracy.get("differences", [])]
    labels = accuracy.get("labels", {})
    for name, item in labels.items():
        expected = "0 expected" if item["expected_zero"] else "not lossless"
        rows.append([f"{LABELS.get(name, name)}: labels differing from AR",
                     f"{item['differing']} of {item['compared']} ({expected})"])
    return (f"{entry['task']}: accuracy differences", ["comparison", "percentage points [95% interval]"], rows,
            "Paired by prompt, repeated responses of a prompt kept together. A label differs when a response is "
            "correct under one schedule and wrong under AR for the same prompt and sample.")


def combined_table(entries: list[dict]) -> tuple[str, list[str], list[list[str]], str]:
    """One row per task: Packed-SS's throughput ratio to each baseline and every schedule's accuracy."""
    rows = []
    for entry in entries:
        ratios = {c["denominator"]: c["throughput_ratio"] for c in entry["summary"]["comparisons"]
                  if c["numerator"] == "packed"}
        by_acc = (entry.get("accuracy") or {}).get("by_schedule", {})
        accuracy = ", ".join(f"{LABELS.get(n, n)} {_pct(a['accuracy'])}" for n, a in by_acc.items()) or "not graded"
        rows.append([entry["task"], str(entry["summary"]["meta"].get("prompts_measured", 0)),
                     _interval(ratios["linear"]) if "linear" in ratios else "n/a",
                     _interval(ratios["quadratic"]) if "quadratic" in ratios else "n/a",
                     _interval(ratios["ar"]) if "ar" in ratios else "n/a", accuracy])
    return ("All tasks", ["task", "prompts", "Packed-SS / Linear-SS", "Packed-SS / Quadratic-SS", "Packed-SS / AR",
                          "accuracy (%)"], rows, "Throughput ratios with 95% paired bootstrap intervals.")


def paper_tables(report: dict) -> list[tuple[str, list[str], list[list[str]], str]]:
    """Every table of the report, in order: per task absolute, efficiency, accuracy; then the combined one."""
    out = []
    for entry in report["tasks"]:
        out += [absolute_table(entry), efficiency_table(entry), ratio_table(entry)]
        if entry.get("accuracy"):
            out += [accuracy_table(entry), pass_at_k_table(entry), extraction_table(entry)]
    out += [combined_table(report["tasks"]), decomposition_table(report["tasks"])]
    return [table for table in out if table is not None]


def header_lines(report: dict) -> list[str]:
    """The model's and the machine's identity and the run's settings."""
    m = report["meta"]
    return [f"model: {m.get('model')} ({m.get('model_sha256', 'n/a')}), family {m.get('family')}, {m.get('dtype')} "
            f"on {m.get('device')}",
            f"machine: {m.get('machine')}; processes: {m.get('processes', 1)}; torch {m.get('torch')}, "
            f"transformers {m.get('transformers')}",
            f"decoding: T = {m.get('temperature')}, block sizes {m.get('block_sizes')}, --chat {m.get('chat')}, "
            f"samples {m.get('samples')}, order {m.get('order')}",
            f"created {m.get('created')}"] + [_task_line(entry) for entry in report["tasks"]]


def _task_line(entry: dict) -> str:
    """One task's data identity, chat template use and grading sandbox."""
    data = entry.get("data") or {}
    revision = f", revision {data['revision']}" if data.get("revision") else ""
    note = f"; {data['note']}" if data.get("note") else ""
    digest = (data.get("sha256") or "")[:16]
    sandbox = f"; code graded in {entry['graded_in']}" if entry.get("graded_in") else ""
    used = entry["summary"]["meta"].get("prompts_given", data.get("records", "n/a"))
    read = data.get("read", data.get("records"))
    kept = "" if read == data.get("records") else f" (of {read} read, the paper's filter kept {data.get('records')})"
    return (f"{entry['task']}: {used} of {data.get('records', 'n/a')} records{kept} from {data.get('source', 'n/a')}"
            f"{revision}, records sha256 {digest}{note}; chat template {entry.get('chat', 'n/a')}{sandbox}")


def paper_markdown(report: dict) -> str:
    lines = ["# packed-ss: the paper's experiments", ""] + [f"- {line}" for line in header_lines(report)]
    for title, headers, rows, note in paper_tables(report):
        lines += ["", f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", note]
    return "\n".join(lines) + "\n"


def linear_ratio_figure(report: dict) -> go.Figure | None:
    """Figure 3: per task, throughput, tokens/NFE and time/NFE of each schedule over Linear-SS's, with the
    paired intervals (one panel per metric)."""
    from plotly.subplots import make_subplots

    tasks = [entry["task"] for entry in report["tasks"]]
    figure = make_subplots(rows=1, cols=len(FIGURE_RATIOS), subplot_titles=[f"{label} / Linear-SS"
                                                                            for _, label in FIGURE_RATIOS])
    drawn = False
    for name in TO_LINEAR:
        for col, (key, _) in enumerate(FIGURE_RATIOS, 1):
            points = [(e["task"], c[key]) for e in report["tasks"] for c in e["summary"]["comparisons"]
                      if c["numerator"] == name and c["denominator"] == "linear"]
            if not points:
                continue
            drawn = True
            figure.add_trace(go.Scatter(
                x=[t for t, _ in points], y=[r["estimate"] for _, r in points], mode="markers",
                name=LABELS.get(name, name), legendgroup=name, showlegend=col == 1,
                marker=dict(size=11, color=schedule_color(name)),
                error_y=dict(type="data", symmetric=False, array=[_gap(r["high"], r["estimate"]) for _, r in points],
                             arrayminus=[_gap(r["estimate"], r["low"]) for _, r in points])), row=1, col=col)
            figure.add_hline(y=1, line_dash="dash", line_color="#444", row=1, col=col)
    if not drawn:
        return None
    figure.update_xaxes(categoryorder="array", categoryarray=tasks)
    figure.update_layout(title="Ratios to Linear-SS (Figure 3; 95% paired intervals)", height=400,
                         template="plotly_white", scattermode="group", legend=dict(orientation="h", y=-0.2))
    return figure


def decomposition_figure(report: dict) -> go.Figure | None:
    """Figure 5: model and non-model time over Linear-SS's total, GSM8K and MATH-500 averaged."""
    table = decomposition_table(report["tasks"])
    if table is None:
        return None
    title, _, rows, _ = table
    names = [row[0] for row in rows]
    figure = go.Figure([go.Bar(x=names, y=[float(row[1]) for row in rows], name="model execution time",
                               marker_color="#4C78A8"),
                        go.Bar(x=names, y=[float(row[2]) for row in rows], name="non-model decoder time",
                               marker_color="#F58518")])
    figure.add_hline(y=1, line_dash="dash", line_color="#444")
    figure.update_layout(title=title, barmode="stack", yaxis_title="time / Linear-SS total", height=380,
                         template="plotly_white", legend=dict(orientation="h", y=-0.2))
    return figure


def paper_figures(report: dict) -> list[go.Figure]:
    """Figure 3's view: per task, Packed-SS's throughput ratio to each baseline with its interval, every
    schedule's ratios to Linear-SS, each schedule's accuracy (graded tasks), and Figure 5's decomposition."""
    tasks = [entry["task"] for entry in report["tasks"]]
    ratios = go.Figure()
    for baseline in BASELINES:
        points = [(entry["task"], c["throughput_ratio"]) for entry in report["tasks"]
                  for c in entry["summary"]["comparisons"] if c["numerator"] == "packed" and c["denominator"] == baseline]
        if points:
            ratios.add_trace(go.Scatter(
                x=[t for t, _ in points], y=[r["estimate"] for _, r in points], mode="markers",
                name=f"Packed-SS / {LABELS.get(baseline, baseline)}",
                marker=dict(size=12, color=schedule_color(baseline)),
                error_y=dict(type="data", symmetric=False, array=[_gap(r["high"], r["estimate"]) for _, r in points],
                             arrayminus=[_gap(r["estimate"], r["low"]) for _, r in points])))
    ratios.add_hline(y=1, line_dash="dash", line_color="#444")
    ratios.update_layout(title="Throughput ratio of Packed-SS to each baseline (95% paired intervals; above 1: "
                               "Packed-SS is faster)", yaxis_title="throughput ratio", scattermode="group",
                         height=420, template="plotly_white", xaxis=dict(categoryorder="array", categoryarray=tasks))
    accuracy = go.Figure()
    schedules = dict.fromkeys(n for entry in report["tasks"] for n in (entry.get("accuracy") or {}).get("by_schedule", {}))
    for name in schedules:
        graded = [(entry["task"], entry["accuracy"]["by_schedule"][name]["accuracy"]) for entry in report["tasks"]
                  if name in (entry.get("accuracy") or {}).get("by_schedule", {})]
        accuracy.add_trace(go.Bar(x=[t for t, _ in graded], y=[100 * (a or 0) for _, a in graded],
                                  name=LABELS.get(name, name), marker_color=schedule_color(name)))
    accuracy.update_layout(title="Accuracy per schedule (pass@1 or answer match, %)", yaxis_title="accuracy (%)",
                           barmode="group", height=380, template="plotly_white", yaxis=dict(range=[0, 100]))
    extra = [linear_ratio_figure(report), accuracy if schedules else None, decomposition_figure(report)]
    return [ratios] + [figure for figure in extra if figure is not None]


def paper_html(report: dict) -> str:
    """A self-contained page (plotly.js embedded once, no network needed) with the figures and the tables."""
    plots = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_height=f"{fig.layout.height}px")
             for i, fig in enumerate(paper_figures(report))]
    parts = []
    for title, headers, rows, note in paper_tables(report):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c).replace('**(best)**', '<b>(best)</b>')}</td>"
                                        for c in row) + "</tr>" for row in rows)
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{body}</table>"
                     f"<p class='note'>{html.escape(note)}</p>")
    header = "".join(f"<li>{html.escape(line)}</li>" for line in header_lines(report))
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
             "text-align:right}td:first-child,th:first-child{text-align:left}.note{color:#555;font-size:.9em}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>packed-ss: the paper's experiments</title>"
            f"<style>{style}</style></head><body><h1>packed-ss: the paper's experiments</h1><ul>{header}</ul>"
            f"{''.join(plots)}{''.join(parts)}</body></html>")
