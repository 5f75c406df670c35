"""The task harness's report in the paper's layout: per task the absolute table (Tables 6-8: tokens, wall time
and NFE per response, throughput from aggregate totals, accuracy), the paired efficiency table (Tables 12-13:
wall-time difference Packed-SS minus baseline, throughput ratio, intervals), the accuracy table (Table 11:
paired accuracy differences, correctness labels against AR), and one table across tasks; markdown and a
self-contained HTML page. Reads only the per-task summaries, so saved ``paper.json`` renders again.
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from packed_ss.bench.report import COLORS, LABELS, _gap, _interval, _num, few_prompts_warning

BASELINES = ("linear", "quadratic", "ar", "diffusion")  # Packed-SS is compared with each that was measured


def _pct(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{100 * value:.2f}"


def _pct_interval(item: dict) -> str:
    return f"{_pct(item['estimate'])} [{_pct(item['low'])}, {_pct(item['high'])}]"


def absolute_table(entry: dict) -> tuple[str, list[str], list[list[str]], str]:
    """Tables 6-8: one row per schedule of one task."""
    summary, accuracy = entry["summary"], entry.get("accuracy") or {}
    by_acc = accuracy.get("by_schedule", {})
    best = max((s["throughput"] or 0 for s in summary["schedules"].values()), default=0)
    rows = []
    for name, s in summary["schedules"].items():
        mark = " **(best)**" if s["throughput"] and s["throughput"] == best else ""
        acc = _pct(by_acc[name]["accuracy"]) if name in by_acc else "not graded"
        rows.append([LABELS.get(name, name), _num(s["tokens_mean"], 1), _num(s["wall_mean_s"], 3),
                     _num(s["nfe_mean"], 1), _num(s["throughput"], 1) + mark, _num(s["tokens_per_nfe"], 2), acc])
    lossless = summary.get("lossless") or {}
    differing = ", ".join(f"{LABELS.get(n, n)} {c['differing']} of {c['compared']}"
                          for n, c in lossless.get("by_schedule", {}).items())
    check = f" Outputs differing from AR's, token for token: {differing}." if lossless.get("applies") else ""
    return (f"{entry['task']}: absolute measurements ({summary['meta'].get('prompts_measured', 0)} prompts)",
            ["schedule", "tokens", "wall (s)", "NFE", "tokens/s", "tokens/NFE", "accuracy (%)"], rows,
            "Tokens, wall time and NFE are means per response; tokens/s and tokens/NFE use aggregate totals." + check)


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
        out += [absolute_table(entry), efficiency_table(entry)]
        if entry.get("accuracy"):
            out.append(accuracy_table(entry))
    out.append(combined_table(report["tasks"]))
    return out


def header_lines(report: dict) -> list[str]:
    """The model's and the machine's identity and the run's settings."""
    m = report["meta"]
    return [f"model: {m.get('model')} ({m.get('model_sha256', 'n/a')}), family {m.get('family')}, {m.get('dtype')} "
            f"on {m.get('device')}",
            f"machine: {m.get('machine')}; processes: {m.get('processes', 1)}; torch {m.get('torch')}, "
            f"transformers {m.get('transformers')}",
            f"decoding: T = {m.get('temperature')}, block sizes {m.get('block_sizes')}, chat template "
            f"{'on' if m.get('chat') else 'off'}, samples {m.get('samples')}, order {m.get('order')}",
            f"created {m.get('created')}"]


def paper_markdown(report: dict) -> str:
    lines = ["# packed-ss: the paper's experiments", ""] + [f"- {line}" for line in header_lines(report)]
    for title, headers, rows, note in paper_tables(report):
        lines += ["", f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", note]
    return "\n".join(lines) + "\n"


def paper_figures(report: dict) -> list[go.Figure]:
    """Figure 3's view: per task, Packed-SS's throughput ratio to each baseline with its interval, and each
    schedule's accuracy (graded tasks)."""
    tasks = [entry["task"] for entry in report["tasks"]]
    ratios = go.Figure()
    for baseline in BASELINES:
        points = [(entry["task"], c["throughput_ratio"]) for entry in report["tasks"]
                  for c in entry["summary"]["comparisons"] if c["numerator"] == "packed" and c["denominator"] == baseline]
        if points:
            ratios.add_trace(go.Scatter(
                x=[t for t, _ in points], y=[r["estimate"] for _, r in points], mode="markers",
                name=f"Packed-SS / {LABELS.get(baseline, baseline)}", marker=dict(size=12, color=COLORS.get(baseline)),
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
                                  name=LABELS.get(name, name), marker_color=COLORS.get(name)))
    accuracy.update_layout(title="Accuracy per schedule (pass@1 or answer match, %)", yaxis_title="accuracy (%)",
                           barmode="group", height=380, template="plotly_white", yaxis=dict(range=[0, 100]))
    return [ratios, accuracy] if schedules else [ratios]


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
