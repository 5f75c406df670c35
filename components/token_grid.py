"""The per-iteration token grid of the paper's Figure 2, as HTML.

Columns are absolute token positions. Rows, top to bottom: the tail of the verified prefix P_{t-1}, the
old draft d (accepted / rejected / unchecked), the verifier predictions v (reached rows solid, rows
computed but not reached faded), the drafter's proposals z (kept ones become the next draft, discarded
ones are struck through), the tokens appended to the prefix coloured by source, and a bar spanning the
advance A. Where EOS, a stop string or the limit cut the iteration (``record.cut``), A counts only the tokens
appended, the bar names the cut, verifier rows past it are drawn as not reached and proposals past it as dropped
because the run stopped. A schedule that mixes draft sources (Packed-SS + n-gram) adds the next draft D_t with each
token's source, and marks the old draft's n-gram tokens. Pure rendering: every value comes from an :class:`~packed_ss.records.IterationRecord`.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from packed_ss.records import SOURCE_CORRECTION, SOURCES, IterationRecord

from components.narration import stopped_by
from components.style import OPEN_SLOT, PROMPT, legend_html, source_class, visible

TokenStrings = Callable[[Sequence[int]], list[str]]


def _chip(text: str, classes: str, title: str) -> str:
    return f'<span class="chip {classes}" title="{html.escape(title)}">{visible(text)}</span>'


def _is_prefill(record: IterationRecord) -> bool:
    return bool(record.calls) and record.calls[0].layout.name.startswith("prefill")


def _proposal(i: int, pos: int, kept: set[int], filled_to: int, stop_reason: str | None,
              next_sources: dict[int, str]) -> tuple[str, str]:
    """Chip class and hover text of proposal z(i + 1) at ``pos`` of a speculative schedule."""
    if i in kept:
        return "kept", "kept: next draft"
    if pos < filled_to:
        return "discarded", f"discarded: position {pos} was just filled by this iteration's accepted tokens"
    if stop_reason:
        return "dropped", f"dropped: the run stopped at {stopped_by(stop_reason)}, so there is no next draft"
    if next_sources.get(pos) == "n-gram":  # Packed-SS + n-gram: the next draft took the n-gram's token here
        return "replaced", "replaced: the n-gram match's token looked likelier here (it is the next draft's)"
    return "discarded", "discarded"


def _diffusion_proposal(i: int, chosen: set[int], block: Sequence[int], mask_token_id: int) -> tuple[str, str]:
    """Chip class and hover text of block diffusion's guess for slot i: unmasked by this call, or not."""
    if i in chosen:
        return "unmasked", "unmasked now: confident enough (or the most confident open slot)"
    if i < len(block) and block[i] != mask_token_id:
        return "faded", "this slot was unmasked by an earlier call"
    return "stillmasked", "not confident enough yet: the slot stays masked"


def diffusion_outcome(record: IterationRecord, mask_token_id: int) -> str:
    """What one block-diffusion call did: masks unmasked, and the block's fill (or its commit)."""
    block = list(record.old_draft)
    unmasked = len(record.kept)
    filled = sum(1 for t in block if t != mask_token_id) + unmasked
    if record.appended:
        return f"{unmasked} unmasked · block full: {len(record.appended)} tokens committed"
    return f"{unmasked} mask{'s' if unmasked != 1 else ''} unmasked · block {filled} of {len(block)} filled"


def grid_html(record: IterationRecord, sequence: Sequence[int], strings: TokenStrings, mask_token_id: int,
              title: str = "", tail: int = 6) -> str:
    """HTML table of one iteration aligned by position (Figure 2).

    Args:
        record: the iteration to draw.
        sequence: token ids of the run (prompt + generated), at least ``record.prefix_len_before`` long.
        strings: maps token ids to their display strings (one per id).
        mask_token_id: id drawn as a mask chip (Packed-SS's padded draft slots, where the call holds them).
        title: schedule name for the heading.
        tail: how many prefix tokens to show before the first new position.
    Returns: an HTML fragment (``div.token-grid-wrap``) whose structure depends only on B and the schedule.
    """
    before = record.prefix_len_before
    start = max(0, before - tail)
    prefix = list(sequence[start:before])
    draft = list(record.old_draft)
    prefill = _is_prefill(record)
    held = len(record.calls[0].layout.verify_rows) - 1 if record.calls else 0  # draft slots of the call
    if not prefill and len(draft) < held:  # any call whose verify rows hold padded slots
        draft += [mask_token_id] * (held - len(draft))  # D̄: the padded slots the call really holds
    v, z = list(record.verifier_tokens), list(record.proposals)
    appended = list(record.appended)
    after = record.prefix_len_after
    nxt = list(record.next_draft)
    ends = [before + len(draft), before + len(v), record.proposal_start + len(z), before + len(appended), before + 1,
            after + len(nxt)]
    end = max(ends)
    positions = list(range(start, end))
    ids = prefix + draft + v + z + appended + nxt
    text = dict(zip(ids, strings(ids))) if ids else {}
    verified = bool(v) and not prefill  # a draft was checked in this iteration
    kept = set(record.kept)
    next_sources = dict(zip(range(after, after + len(nxt)), record.next_draft_sources))

    def row(label: str, cells: dict[int, str], css: str = "") -> str:
        tds = "".join(f"<td>{cells.get(p, '')}</td>" for p in positions)
        return f'<tr class="{css}" data-row="{css or label}"><td class="row-label">{label}</td>{tds}</tr>'

    cells_prefix = {}
    for i, tok in enumerate(prefix):
        pos = start + i
        cls = "prefix last-prefix" if pos == before - 1 else "prefix"
        cells_prefix[pos] = _chip(text[tok], cls, f"prefix token {tok} at position {pos}")
    cells_draft = {before + i: _draft_chip(i, tok, text, mask_token_id, verified, record)
                   for i, tok in enumerate(draft)}
    diffusion = record.schedule == "diffusion"
    cells_v = _verifier_cells(record, before, text)
    cells_z = {}
    for i, tok in enumerate(z):
        pos = record.proposal_start + i
        cls, what = (_diffusion_proposal(i, kept, draft, mask_token_id) if diffusion
                     else _proposal(i, pos, kept, before + len(appended), record.stop_reason, next_sources))
        cells_z[pos] = _chip(text[tok], cls, f"z({i + 1}) = {tok} at position {pos}: {what}")
    cells_out = {before + i: _chip(text[tok], source_class(source), f"{source}: token {tok} at position {before + i}")
                 for i, (tok, source) in enumerate(zip(appended, record.appended_sources))}
    cells_next = {after + i: _chip(text[tok], "ngram" if next_sources[after + i] == "n-gram" else "kept",
                                   f"D_t({i + 1}) = {tok} at position {after + i}: from the {next_sources[after + i]}")
                  for i, tok in enumerate(nxt)}
    head = "".join(f'<th class="{"pos-new" if p >= before else ""}">{p}</th>' for p in positions)
    adv_cells = _advance_cells(record, positions, verified, diffusion)
    # Linear-SS verifies the draft its own first call just made; the others verify last call's draft.
    draft_label = ("block before this call" if diffusion else "draft d (call 1)" if record.schedule == "linear"
                   else "old draft d")
    rows = [
        f'<tr><td class="row-label">position</td>{head}</tr>',
        row("prefix P<sub>t-1</sub>", cells_prefix, "prefix"),
        row(draft_label, cells_draft, "draft"),
        *([] if diffusion else [row("verifier v", cells_v, "verifier")]),
        row("drafter's guesses z" if diffusion else "proposals z", cells_z, "proposals"),
        row("committed" if diffusion else "appended", cells_out, "appended"),
        f'<tr class="sep" data-row="advance"><td class="row-label">advance</td>{"".join(adv_cells)}</tr>',
        *([row("next draft D<sub>t</sub>", cells_next, "next-draft")] if nxt else []),
    ]
    return grid_box(_heading(record, title, bool(draft), prefill, mask_token_id), record.index,
                    f'<table class="token-grid">{"".join(rows)}</table>{_residual_note(record, text)}')


def grid_box(heading: str, index: int, body: str, key: str = "") -> str:
    """One iteration's grid (HTML): its heading and ``key`` above the box that scrolls sideways
    (``div.token-grid-wrap``, holding ``body``), so a grid wider than a phone's screen scrolls without its heading
    (scrolled with it, it read "3 · A = 4 · 1 call, 15")."""
    return (f'<div class="token-grid-box"><div class="token-grid-head">{heading}</div>{key}'
            f'<div class="token-grid-wrap" data-iteration="{index}">{body}</div></div>')


def _verifier_cells(record: IterationRecord, before: int, text: dict[int, str]) -> dict[int, str]:
    """The verifier row: v(i) at position ``before`` + i with its probability, faded past the first rejection and
    past the cut (a row whose position the run stopped before is not reached)."""
    cells = {}
    for i, tok in enumerate(record.verifier_tokens):
        pos, reached = before + i, i <= record.h and i < record.advance
        prob = f", p = {record.verifier_probs[i]:.3f}" if i < len(record.verifier_probs) else ""
        what = ("reached" if reached else "computed, not reached" if i > record.h
                else f"computed, not reached: the run stopped at {stopped_by(record.stop_reason)} before position {pos}")
        cells[pos] = _chip(text[tok], "reached" if reached else "faded",
                           f"v({i + 1}) = {tok} at position {pos}{prob}: {what}")
    return cells


def _residual_note(record: IterationRecord, text: dict[int, str]) -> str:
    """Why the appended correction differs from the verifier's own token v at the first rejected position (sampling
    only: at T > 0 the correction is drawn from the residual distribution, Algorithm 2 line 7); empty otherwise."""
    h, v, out = record.h, list(record.verifier_tokens), list(record.appended)
    if _is_prefill(record) or not (h < len(v) and h < len(out)) or v[h] == out[h]:
        return ""
    if h >= len(record.appended_sources) or record.appended_sources[h] != SOURCE_CORRECTION:
        return ""
    pos = record.prefix_len_before + h
    return (f'<div class="grid-note" data-note="residual">At position {pos} the verifier row shows '
            f'“{visible(text[v[h]])}” but “{visible(text[out[h]])}” was appended: at T &gt; 0 the '
            f'correction token is drawn again, from the residual distribution [p − Q]<sub>+</sub> (the verifier\'s '
            f'p with the drafter\'s Q taken out, Algorithm 2 line 7), while v shows the verifier\'s most likely token '
            f'(its argmax). Drawing it so keeps the output distributed exactly as AR\'s.</div>')


def _draft_chip(i: int, tok: int, text: dict[int, str], mask_token_id: int, verified: bool,
                record: IterationRecord) -> str:
    """The chip of draft token d(i + 1) of ``record``: mask slot, draft, or accepted (cut past the stopping index) /
    first rejected / not checked."""
    h, old_sources, pos = record.h, record.old_draft_sources, record.prefix_len_before + i
    if tok == mask_token_id:
        cls, what = "mask", "mask slot"
    elif not verified:
        cls, what = "", "draft"
    elif i < h:
        cls, what = "accepted", ("accepted draft" if i < record.advance else
                                 f"accepted draft, not appended: the run stopped at {stopped_by(record.stop_reason)}")
    elif i == h:
        cls, what = "rejected", "first rejected draft token"
    else:
        cls, what = "unchecked", "not checked (after the first rejection)"
    label = "MASK" if tok == mask_token_id else text[tok]
    if i < len(old_sources) and old_sources[i] == "n-gram":
        cls, what = f"{cls} ngram".strip(), f"{what} (from an n-gram match)"
    return _chip(label, cls, f"d({i + 1}) = {tok} at position {pos}: {what}")


def advance_label(record: IterationRecord, verified: bool, diffusion: bool) -> str:
    """The advance bar's text: "A = 4 (h = 3 + correction)"; at a cut "A = 3: cut at the limit, h was 3 of 6"
    (nothing after the accepted draft tokens was appended); block diffusion: the committed block."""
    a, h = record.advance, record.h
    if diffusion:
        label = f"block committed: {a} tokens"
        return label + (f", cut at {stopped_by(record.stop_reason, short=True)}" if record.cut else "")
    if record.cut:
        checked = len(record.old_draft)
        return (f"A = {a}: cut at {stopped_by(record.stop_reason, short=True)}"
                + (f", h was {h} of {checked}" if verified else ""))
    what = "bonus" if record.appended_sources[-1:] == ("bonus",) else "correction"
    return f"A = {a}" + (f" (h = {h} + {what})" if verified and a > 1 else "")


def _advance_cells(record: IterationRecord, positions: Sequence[int], verified: bool, diffusion: bool) -> list[str]:
    """The advance row: one cell spanning the appended tokens (:func:`advance_label`), empty cells elsewhere."""
    before, a = record.prefix_len_before, record.advance
    cells = []
    i = 0
    while i < len(positions):
        pos = positions[i]
        if a and pos == before:
            span = min(a, len(positions) - i)
            label = advance_label(record, verified, diffusion)
            cells.append(f'<td class="advance" colspan="{span}">{html.escape(label)}</td>')
            i += span
        else:
            cells.append("<td></td>")
            i += 1
    return cells


def _heading(record: IterationRecord, title: str, drafted: bool, prefill: bool, mask_token_id: int) -> str:
    """The grid's heading: iteration, schedule, outcome (h and A, or what block diffusion did), calls and rows."""
    diffusion = record.schedule == "diffusion"
    calls = len(record.calls)
    # A draft not verified yet (Linear-SS shown after its drafting call) has no h or A to report.
    pending = drafted and not record.verifier_tokens and not record.appended and not diffusion
    outcome = (diffusion_outcome(record, mask_token_id) if diffusion
               else "h and A after the verification call" if pending
               else f"h = {record.h} · A = {record.advance}" + (f", cut at {stopped_by(record.stop_reason, short=True)}" if record.cut else ""))
    heading = (f"Iteration {record.index} · {html.escape(title or record.schedule)} · {outcome} · "
               f"{calls} call{'s' if calls != 1 else ''}, {record.rows} rows")
    if prefill:
        heading += " · prefill"
    if record.stop_reason:
        heading += f" · stopped: {html.escape(record.stop_reason)}"
    return heading


def empty_grid_html(message: str = "Press Step to run the first iteration.") -> str:
    """Placeholder shown before the first iteration (same wrapper class as a real grid)."""
    return f'<div class="token-grid-wrap" data-iteration="0"><div class="pss-note">{html.escape(message)}</div></div>'


def grid_legend_html() -> str:
    """Static key of the grid's chip styles and the text colours."""
    keys = [("accepted", "ok", "accepted draft"), ("rejected", "x", "first rejected"),
            ("unchecked", "u", "not checked"), ("reached", "v", "verifier row reached"), ("faded", "v", "computed, not reached"),
            ("kept", "z", "kept as next draft"), ("discarded", "z", "discarded (its position is now filled)"),
            ("dropped", "z", "dropped (the run stopped)"),
            ("ngram", "g", "from an n-gram match (Packed-SS + n-gram)"),
            ("replaced", "z", "replaced by the n-gram's token (Packed-SS + n-gram)"),
            ("unmasked", "z", "unmasked by this call (block diffusion)"),
            ("stillmasked", "z", "still masked (block diffusion)"), ("mask", "MASK", "empty slot")]
    chips = " · ".join(f'<span class="chip {cls}">{text}</span> {label}' for cls, text, label in keys)
    chips += (" · in chips: · space, ⏎ newline, ⇥ tab, ∅ empty token · in the text: "
              f'<span class="tok open-slot">{OPEN_SLOT}</span> a position not accepted yet (any-order models)')
    return f'<div class="legend">{chips}</div>' + legend_html([PROMPT, *SOURCES])
