"""Benchmark report: markdown tables, plotly figures and a self-contained HTML page from a summary dict.

Everything here reads only the summary produced by :func:`packed_ss.bench.summary.summarize` (or its JSON), so a
saved ``summary.json`` renders the same report again. The HTML embeds plotly.js once and works offline (or links
it: ``plotlyjs="cdn"``). Schedules keep their colours and symbols of :mod:`packed_ss.bench.palette`.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import plotly.graph_objects as go

from packed_ss.bench.files import frame_text, write_texts
from packed_ss.bench.palette import schedule_color, schedule_symbol
from packed_ss.bench.run import BenchResult
from packed_ss.wording import counted

LABELS = {"ar": "AR", "linear": "Linear-SS", "quadratic": "Quadratic-SS", "packed": "Packed-SS",
          "diffusion": "Diffusion", "lookup": "Prompt lookup", "packed-mixed": "Packed-SS + n-gram",
          "partial": "Partial-branch SS", "hf-greedy": "transformers greedy", "hf-lookup": "transformers prompt lookup",
          "hf-greedy-compiled": "transformers greedy, static cache, compiled", "ar-eager": "AR, eager calls",
          "llamacpp-ar": "llama.cpp greedy", "llamacpp-lookup": "llama.cpp prompt lookup", "vllm-ar": "vLLM greedy",
          "vllm-ngram": "vLLM n-gram", "vllm-suffix": "vLLM suffix decoding",
          "vllm-linear": "Linear-SS in vLLM"}
RATIOS = (("throughput_ratio", "Throughput"), ("tokens_per_nfe_ratio", "Tokens/NFE"),
          ("time_per_nfe_ratio", "Time/NFE"))


SHORT = {"packed-mixed": "Packed+n-gram", "partial": "Partial SS", "hf-greedy": "HF greedy", "hf-lookup": "HF lookup",
         "hf-greedy-compiled": "HF compiled", "ar-eager": "AR eager", "llamacpp-ar": "llama.cpp",
         "llamacpp-lookup": "llama.cpp lookup", "vllm-ar": "vLLM", "vllm-ngram": "vLLM n-gram",
         "vllm-suffix": "vLLM suffix", "vllm-linear": "vLLM Linear", "lookup": "Lookup", "diffusion": "Diffusion", "quadratic": "Quadratic", "linear": "Linear", "packed": "Packed"}
FEW_PROMPTS = 10  # paired intervals over fewer prompts than this get a warning: they say little


def few_prompts_warning(n: int) -> str:
    """A warning when paired intervals rest on fewer than :data:`FEW_PROMPTS` prompts (else empty)."""
    if n >= FEW_PROMPTS:
        return ""
    return (f"Only {n} prompt{'s' if n != 1 else ''}: these intervals rest on too few prompts to mean much (and "
            f"timings on a shared machine are noisy); use {2 * FEW_PROMPTS} or more on a quiet machine.")


def _label(name: str) -> str:
    return LABELS.get(name, name)


def _num(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def _interval(item: dict, digits: int = 3) -> str:
    return f"{_num(item['estimate'], digits)} [{_num(item['low'], digits)}, {_num(item['high'], digits)}]"


def tables(summary: dict) -> list[tuple[str, list[str], list[list[str]], str]]:
    """The report's tables as ``(title, headers, rows, note)``, shared by the markdown and HTML views."""
    out = []
    rows = []
    ar_ms = (summary["schedules"].get("ar") or {}).get("time_per_nfe_ms")
    for name, s in summary["schedules"].items():
        cost = s["time_per_nfe_ms"] / ar_ms if ar_ms and s["time_per_nfe_ms"] is not None else None
        rows.append([_label(name), _num(s["block_size"]) if name != "ar" else "-", _num(s["examples"]),
                     _num(s["tokens_mean"], 1), _num(s["nfe_mean"], 1), _num(s["tokens_per_nfe"]), _num(cost, 2),
                     _num(s["time_per_nfe_ms"], 2), _num(s["throughput"], 1), _num(s["wall_mean_s"], 4),
                     _num(s["model_mean_s"], 4), _num(s["other_mean_s"], 4), _num(s["mean_acceptance_length"], 2),
                     _num(s["max_rows_per_call"])])
    out.append(("Per schedule", ["schedule", "B", "n", "tokens", "NFE", "tokens/NFE", "time/NFE ÷ AR", "ms/NFE",
                                 "tok/s", "wall (s)", "model (s)", "other (s)", "mean A", "rows/call"], rows,
                "n = responses; tokens, NFE and times (wall, model, other = non-model decoder time) are means per "
                "response; mean A = mean acceptance length; tokens/NFE, ms/NFE (time/NFE) and tok/s (throughput) "
                "use aggregate totals; time/NFE ÷ AR is what one call costs in AR calls (a schedule beats AR when its tokens/NFE "
                "exceeds it); rows/call is the most input rows of one call after the first iteration."))
    comparisons = summary["comparisons"]
    if comparisons:
        n = comparisons[0]["n"]
        level = round(100 * comparisons[0]["throughput_ratio"]["level"])
        rows = [[f"{_label(c['numerator'])} / {_label(c['denominator'])}", *(_interval(c[key]) for key, _ in RATIOS),
                 _interval(c["wall_difference_s"], 4)] for c in comparisons]
        out.append((f"Paired comparisons ({level}% bootstrap intervals, {n} prompts, "
                    f"{summary['config']['resamples']} resamples)",
                    ["comparison", "throughput ratio", "tokens/NFE ratio", "time/NFE ratio", "wall difference (s)"],
                    rows, (f"⚠ {few_prompts_warning(n)} " if few_prompts_warning(n) else "")
                    + "Ratios are ratios of aggregated sums over the (resampled) prompts: throughput ratio = "
                          "(Σ tokens_A / Σ wall_A) / (Σ tokens_B / Σ wall_B), likewise for tokens/NFE and "
                          "time/NFE. Wall difference = mean wall per response of A minus that of B. The same "
                          "resampled prompt indices serve every schedule and statistic (E.5)."))
    lossless = summary["lossless"]
    if lossless["applies"]:
        rows = [[_label(name), _num(c["compared"]), _num(c["differing"]),
                 "0" if c["expected_zero"] else "not lossless (reported)",
                 ", ".join(c["differing_prompts"][:5]) + (" ..." if len(c["differing_prompts"]) > 5 else "")]
                for name, c in lossless["by_schedule"].items()]
        confidence = summary["config"].get("order", "ltr") != "ltr"
        out.append(("Outputs differing from the model's own left-to-right decoding (confidence order: expected, "
                    "the order defines the conditionals)" if confidence else
                    "Lossless check: greedy outputs differing from AR",
                    ["schedule", "compared", "differing", "expected", "differing prompts"], rows,
                    "Token ids compared by hash, same prompt and sample."))
    else:
        out.append(("Lossless check", ["status"], [[f"not applied: {lossless['reason']}"]], ""))
    decomposition = summary["decomposition"]
    if decomposition["reference"]:
        rows = [[_label(name), _num(d["model"]), _num(d["other"]), _num(d["total"])]
                for name, d in decomposition["by_schedule"].items()]
        out.append((f"Timing decomposition (fraction of {_label(decomposition['reference'])}'s total)",
                    ["schedule", "model time", "non-model time", "total"], rows,
                    "Mean per-response model time and non-model decoder time divided by the reference's mean "
                    "total wall time (F.3)."))
    if summary["probe"]:
        rows = [[_label(r["schedule"]), _num(r["block_size"]), _num(r["examples"]), _num(r["tokens_per_s"], 1),
                 _num(r["wall_mean_s"], 4), _num(r["nfe_mean"], 1), _num(r["tokens_mean"], 1),
                 _num(r["tokens_per_nfe"]), _num(r["max_rows_per_call"])] for r in summary["probe"]]
        out.append(("Block-size probe (F.1)", ["schedule", "B", "responses", "tokens/s", "wall (s)", "NFE", "tokens",
                                               "tokens/NFE", "rows/call"], rows,
                    "Means per response over the same prompts; tokens/s = mean tokens / mean wall."))
    return out


def _header(summary: dict) -> list[str]:
    meta, config = summary["meta"], summary["config"]
    blocks = ", ".join(f"{_label(s)} {b}" for s, b in config["block_sizes"].items()) or "-"
    lines = [
        f"Model: `{meta.get('model', '?')}`"
        + (f" (sha256 {meta['model_sha256']})" if meta.get("model_sha256") else "")
        + f" on {meta.get('device', '?')} ({meta.get('dtype', '?')}), "
        f"{counted(meta['threads'], 'CPU thread', 'CPU threads') if isinstance(meta.get('threads'), int) else '? CPU threads'}.",
        f"Prompts: {meta.get('prompt_source') or meta.get('task') or '?'}, {meta['prompts_measured']} measured "
        f"({meta.get('prompts_given', '?')} given, {len(meta.get('skipped_prompts', []))} skipped, "
        f"{meta.get('prompts_incomplete', 0)} incomplete).",
        f"T = {config['temperature']}, samples per prompt = {config['samples']}, max new tokens = "
        f"{config['max_new_tokens']}, seed = {config['seed']}; B: {blocks}."
        + (f" Any-order model, verification order: {config.get('order', 'ltr')} (Appendix C)."
           if meta.get("any_order") else ""),
        f"Schedules measured in rotating order per prompt; warm-up run: {'yes' if config['warmup'] else 'no'}. "
        "Decoder wall time excludes model loading and tokenisation (E.5).",
    ]
    if meta.get("compiled") and meta.get("compiled_shapes"):
        shapes = ", ".join(f"{rows}x{keys}" for rows, keys in meta.get("compiled_shapes", []))
        how = ("CUDA graphs of the native forward" if meta.get("graphs") else "torch.compile") + ", static KV cache"
        lines.append(f"Model calls: compiled ({how}; shapes rows x cached keys: {shapes}); "
                     f"compile time {meta.get('compile_s_warm_up', 0):.1f} s in the warm-up, "
                     + (f"{meta.get('compile_s_in_timed_runs', 0):.1f} s recording in timed runs (before their "
                        f"clocks: rehearsals and shapes the warm-up did not meet, left out of their wall time)."
                        if meta.get("graphs") else
                        f"{meta.get('compile_s_in_timed_runs', 0):.1f} s inside timed runs (included in their wall "
                        f"time: shapes the warm-up did not meet)."))
    elif meta.get("compiled"):
        lines.append("Model calls: compiled calls were on, but no timed schedule made one.")
    elif meta.get("compile_note"):
        lines.append(f"Model calls: eager ({meta['compile_note']}).")
    elif meta.get("cache"):
        forward = {"native": "the project's native forward", "transformers": "transformers' forward"}.get(
            meta.get("forward"), "")
        lines.append(f"Model calls: eager, {meta['cache']} KV cache" + (f", {forward}." if forward else "."))
    if meta.get("machine") or meta.get("command"):
        made = f"Made on {meta.get('machine', 'an unrecorded machine')}, {str(meta.get('created', '?'))[:10]}"
        lines.append(made + (f", with `{meta['command']}`." if meta.get("command") else "."))
    if meta.get("interrupted"):
        lines.append(f"**Interrupted**: {meta['runs_done']} of {meta['runs_planned']} runs measured.")
    return lines


def summary_markdown(summary: dict) -> str:
    """The summary as markdown: header, tables with notes, definitions."""
    parts = ["# Benchmark summary", "", *[f"- {line}" for line in _header(summary)], ""]
    for title, headers, rows, note in tables(summary):
        parts += [f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        parts += ["| " + " | ".join(row) + " |" for row in rows]
        parts += ["", note, ""] if note else [""]
    parts += ["## Definitions", ""] + [f"- **{k}**: {v}" for k, v in summary["definitions"].items()] + [""]
    return "\n".join(parts)


def figures(summary: dict) -> dict[str, go.Figure]:
    """Plotly figures: ``ratios`` (with intervals), ``decomposition`` (stacked bars), ``block_size``
    (tokens/NFE against B; probe rows, or the main runs' single B per schedule without a probe)."""
    out = {}
    ratios = go.Figure()
    for c in summary["comparisons"]:  # colour: the numerator's, symbol: the denominator's (the same everywhere)
        ys = [c[key]["estimate"] for key, _ in RATIOS]
        up = [_gap(c[key]["high"], c[key]["estimate"]) for key, _ in RATIOS]
        down = [_gap(c[key]["estimate"], c[key]["low"]) for key, _ in RATIOS]
        ratios.add_trace(go.Scatter(x=[label for _, label in RATIOS], y=ys, mode="markers",
                                    name=f"{_label(c['numerator'])} / {_label(c['denominator'])}",
                                    marker=dict(size=11, color=schedule_color(c["numerator"]),
                                                symbol=schedule_symbol(c["denominator"]),
                                                line=dict(width=1, color=schedule_color(c["numerator"]))),
                                    error_y=dict(type="data", symmetric=False, array=up, arrayminus=down)))
    ratios.add_hline(y=1, line_dash="dash", line_color="#444")
    n = summary["comparisons"][0]["n"] if summary["comparisons"] else 0
    ratios.update_layout(title=f"Paired ratios with 95% bootstrap intervals ({counted(n, 'prompt')})",
                         yaxis_title="ratio", scattermode="group", height=420, template="plotly_white",
                         showlegend=True)  # also for one comparison: the legend names it
    out["ratios"] = ratios

    decomposition = go.Figure()
    everything = summary["decomposition"]["by_schedule"]
    # reference lanes timed as a whole (transformers' generate, llama.cpp) have no model / non-model split: their
    # whole time is one grey bar of its own (a legend entry without a bar read as a missing bar)
    by = {s: d for s, d in everything.items() if (d.get("model") or 0) + (d.get("other") or 0) > 0}
    unsplit = {s: d for s, d in everything.items() if s not in by and d.get("total")}
    names = [SHORT.get(s, _label(s)) for s in (*by, *unsplit)]  # short axis labels: a panel is a third of the page
    decomposition.add_trace(go.Bar(x=names, y=[d["model"] for d in by.values()] + [None] * len(unsplit),
                                   name="model time", marker_color="#1f77b4"))
    decomposition.add_trace(go.Bar(x=names, y=[d["other"] for d in by.values()] + [None] * len(unsplit),
                                   name="non-model decoder time", marker_color="#ff7f0e"))
    if unsplit:
        decomposition.add_trace(go.Bar(x=names, y=[None] * len(by) + [d["total"] for d in unsplit.values()],
                                       name="whole time (timed as one call, not split)", marker_color="#94a3b8"))
    if by:
        decomposition.add_hline(y=1, line_dash="dash", line_color="#444")
    else:
        decomposition.add_annotation(text="no decomposition:<br>it is normalised to Linear-SS,<br>which was not "
                                          "measured", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    reference = summary["decomposition"]["reference"]
    reference_name = _label(reference) if reference else "n/a (Linear-SS not measured)"
    decomposition.update_layout(barmode="stack", height=420, template="plotly_white",
                                title=f"Timing decomposition / {reference_name} total",
                                yaxis_title="time / reference total")
    out["decomposition"] = decomposition

    block = go.Figure()
    if summary["probe"]:
        shown = list(dict.fromkeys(r["schedule"] for r in summary["probe"]))
        points = {name: [(r["block_size"], r["tokens_per_nfe"]) for r in summary["probe"] if r["schedule"] == name]
                  for name in shown}
        mode = "lines+markers"
        title = "Tokens/NFE against block size (probe)"
    else:
        shown = [s for s, v in summary["schedules"].items() if s != "ar" and v["block_size"] is not None]
        points = {name: [(summary["schedules"][name]["block_size"], summary["schedules"][name]["tokens_per_nfe"])]
                  for name in shown}
        mode = "markers"
        title = "Tokens/NFE at the measured block sizes (run with --probe-block-sizes for a sweep)"
    offsets = dodges(points)  # schedules at the same B a little to the side: coinciding points stay visible
    for schedule in shown:
        block.add_trace(go.Scatter(x=[b + offsets[schedule, b] for b, _ in points[schedule]],
                                   y=[t for _, t in points[schedule]],
                                   customdata=[b for b, _ in points[schedule]], mode=mode, name=_label(schedule),
                                   line_color=schedule_color(schedule),
                                   marker=dict(size=11, color=schedule_color(schedule),
                                               symbol=schedule_symbol(schedule)),
                                   hovertemplate=f"{_label(schedule)}<br>B %{{customdata}}<br>%{{y:.3f}} tokens/NFE"
                                                 "<extra></extra>"))
    block.update_layout(title=title, xaxis_title="block size B", yaxis_title="tokens / NFE", height=420,
                        template="plotly_white")
    sizes = sorted({b for trace in block.data for b in trace.customdata})
    block.update_xaxes(tickmode="array", tickvals=sizes, ticktext=[str(b) for b in sizes])  # every B measured
    out["block_size"] = block
    return out


DODGE = 0.06  # sideways step between points at the same B, as a fraction of the axis' span of B


def dodges(points: dict[str, list[tuple[int, float]]]) -> dict[tuple[str, int], float]:
    """The sideways offset (in block sizes) of each schedule's point at each B, ``(schedule, B) -> offset``: the
    schedules measured at one B spread evenly around it (in the order given), one step of :data:`DODGE` times the
    span of B apart (at least 0.15), so equal values do not hide each other; a schedule alone at its B stays on it."""
    sizes = sorted({b for pairs in points.values() for b, _ in pairs})
    step = max(0.15, DODGE * (sizes[-1] - sizes[0])) if sizes else 0.0
    at: dict[int, list[str]] = {}
    for name, pairs in points.items():
        for b, _ in pairs:
            at.setdefault(b, []).append(name)
    return {(name, b): step * (j - (len(names) - 1) / 2) for b, names in at.items() for j, name in enumerate(names)}


def _gap(a, b) -> float:
    return a - b if a is not None and b is not None else 0.0


def _html_table(title: str, headers: list[str], rows: list[list[str]], note: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    note_html = f"<p class='note'>{html.escape(note)}</p>" if note else ""
    return f"<h2>{html.escape(title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note_html}"


PLOTLYJS = ("inline", "cdn")  # plotly.js embedded once (the file works offline), or linked from plotly's CDN


def report_html(summary: dict, plotlyjs: str = "inline") -> str:
    """The HTML report. ``plotlyjs``: "inline" (default) embeds plotly.js once, before the first figure, so the page
    needs no network (it then weighs about 4.8 MB, nearly all of it plotly.js); "cdn" links it from plotly's CDN
    instead (some 50 kB: for a server whose visitors are online, e.g. a Space). Raises: ValueError for another
    ``plotlyjs``."""
    if plotlyjs not in PLOTLYJS:
        raise ValueError(f"plotlyjs must be one of {', '.join(PLOTLYJS)}, got {plotlyjs!r}")
    header = "".join(f"<li>{html.escape(line.replace('`', '').replace('**', ''))}</li>" for line in _header(summary))
    plots = []
    for i, fig in enumerate(figures(summary).values()):
        include = (True if plotlyjs == "inline" else "cdn") if i == 0 else False  # the library once, then none
        plots.append(fig.to_html(full_html=False, include_plotlyjs=include, default_height="420px"))
    body = "".join(_html_table(*t) for t in tables(summary))
    definitions = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                          for k, v in summary["definitions"].items())
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
             "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;"
             "text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}.note{color:#555;font-size:90%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>packed-ss benchmark</title>"
            f"<style>{style}</style></head><body><h1>packed-ss benchmark</h1><ul>{header}</ul>"
            f"{''.join(plots)}{body}<h2>Definitions</h2><ul>{definitions}</ul></body></html>")


# --- output -----------------------------------------------------------------------------------------
def write_outputs(result: BenchResult, out_dir: str | Path, plotlyjs: str = "inline") -> dict[str, Path]:
    """Write examples.csv, probe.csv (if probed), summary.json, summary.md and report.html (``plotlyjs`` as
    :func:`report_html` takes it), through temporary files renamed once all are written
    (:func:`packed_ss.bench.files.write_texts`).

    Returns: ``{kind: path}`` of the files written.
    Raises: OSError when the folder cannot be created or written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"examples": out / "examples.csv", "summary_json": out / "summary.json",
             "summary_md": out / "summary.md", "report": out / "report.html"}
    texts = {"examples": frame_text(result.examples),
             "summary_json": json.dumps(result.summary, indent=2, allow_nan=False),
             "summary_md": summary_markdown(result.summary), "report": report_html(result.summary, plotlyjs)}
    if not result.probe.empty:
        paths["probe"], texts["probe"] = out / "probe.csv", frame_text(result.probe)
    write_texts([(paths[kind], texts[kind]) for kind in paths])  # all written, or none (a full disk)
    return paths
