"""The text so far with every token coloured by where it came from, and the numbers of a run.

Pure rendering from token ids, sources and records; no model calls besides the ``strings`` mapping.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from packed_ss.records import IterationRecord, RunRecord

from components.style import OPEN_SLOT, PROMPT, legend_html, marked, source_class, stats_html

TokenStrings = Callable[[Sequence[int]], list[str]]
OPEN = "open"  # the source of an open position in an any-order model's text (components.step_view)


def text_html(prompt_ids: Sequence[int], token_ids: Sequence[int], sources: Sequence[str], strings: TokenStrings,
              new_from: int | None = None, differs: Sequence[bool] = (), max_prompt_tokens: int = 200,
              prompt_text: str | None = None) -> str:
    """Prompt (muted) followed by generated tokens, each a span coloured by its source.

    Args:
        prompt_ids, token_ids: prompt and generated token ids.
        sources: one source per generated token (``packed_ss.records.SOURCE_*``, or :data:`OPEN` for a
            position an any-order model has not accepted yet: drawn as a placeholder).
        strings: maps ids to display strings.
        new_from: index of the first generated token appended by the current iteration (outlined).
        differs: per generated token, whether it differs from the reference run (wavy underline).
        max_prompt_tokens: only the last this many prompt tokens are shown (a "…" marks the cut).
        prompt_text: the prompt as typed; shown instead of its token strings (its last 4000 characters).
    Returns: an HTML ``div.token-text`` (whitespace preserved).
    """
    shown_prompt = [] if prompt_text is not None else list(prompt_ids[-max_prompt_tokens:])
    pieces = strings(shown_prompt + list(token_ids))
    out = ['<div class="token-text">']
    if prompt_text is not None:
        cut = len(prompt_text) > 4000
        shown = ("…" if cut else "") + prompt_text[-4000:]
    else:
        shown = ("…" if len(prompt_ids) > len(shown_prompt) else "") + "".join(pieces[:len(shown_prompt)])
    out.append(f'<span class="tok {source_class(PROMPT)}">{marked(shown)}</span>')
    for i, (piece, source) in enumerate(zip(pieces[len(shown_prompt):], sources)):
        if source == OPEN:  # an any-order model's position not accepted yet: a placeholder, not the mask token
            out.append(f'<span class="tok open-slot" title="open position: not accepted yet">{OPEN_SLOT}</span>')
            continue
        classes = ["tok", source_class(source)]
        if new_from is not None and i >= new_from:
            classes.append("new")
        if i < len(differs) and differs[i]:
            classes.append("diff")
        out.append(f'<span class="{" ".join(classes)}" title="{html.escape(source)} · token {token_ids[i]}">'
                   f'{marked(piece)}</span>')
    out.append("</div>")
    return "".join(out)


def text_legend(sources: Sequence[str]) -> str:
    """Legend of the sources that a schedule can produce, prompt first."""
    return legend_html([PROMPT, *sources])


def iteration_stats(record: IterationRecord, pending: bool = False, mask_token_id: int | None = None) -> str:
    """Stat cards of one iteration: h, A (block diffusion: masks unmasked, block filled, tokens committed),
    calls, rows evaluated, model ms, non-model ms. ``pending``: shown up to its first call, so h and A are
    not known yet. ``mask_token_id``: the model's mask id (block diffusion's open slots)."""
    if record.schedule == "diffusion":  # no draft is checked: what it unmasks and commits, not h or A
        filled = sum(1 for t in record.old_draft if t != mask_token_id) + len(record.kept)
        outcome = [("unmasked", "masks unmasked", str(len(record.kept))),
                   ("filled", "block filled", f"{filled} of {len(record.old_draft)}"),
                   ("A", "committed tokens", str(len(record.appended)))]
    else:
        waiting = "after call 2"
        outcome = [("h", "h (accepted draft)", waiting if pending else str(record.h)),
                   ("A", "A (advance)", waiting if pending else str(len(record.appended)))]
    return stats_html(f"Iteration {record.index}" + (" · call 1 of 2" if pending else ""), [
        *outcome,
        ("calls", "calls (NFE)", str(len(record.calls))),
        ("rows", "rows evaluated", str(record.rows)),
        ("model_ms", "model ms", f"{record.model_ms:.1f}"),
        ("other_ms", "non-model ms", f"{record.other_ms:.1f}"),
    ], "iteration")


def _has_advances(run: RunRecord) -> bool:
    """Whether mean A has anything to average: a verifying iteration, or AR past its prefill."""
    return any(r.verifies for r in run.records) or (run.schedule == "ar" and run.iterations > 1)


def run_stats(run: RunRecord, finished: bool) -> str:
    """Stat cards of the run so far: NFE, tokens, tokens/NFE, wall time, acceptance, stop reason."""
    stop = run.stop_reason if finished and run.stop_reason else "running"
    return stats_html("Run so far", [
        ("nfe", "NFE", str(run.nfe)),
        ("tokens", "tokens committed" if run.schedule == "diffusion" else "tokens", str(run.tokens)),
        ("tokens_per_nfe", "tokens / NFE", f"{run.tokens_per_nfe:.2f}"),
        ("wall_ms", "wall ms", f"{1000 * run.wall_s:.1f}"),
        ("mean_accept", "mean A (prefill excluded)",
         f"{run.mean_acceptance_length:.2f}" if _has_advances(run) else "–"),
        ("stop", "stop", stop),
    ], "run")
