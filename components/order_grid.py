"""The token grid and narration of one any-order iteration (paper Appendix C, Algorithm 3), as HTML.

Columns are output positions around the active window. Rows: tokens accepted before this iteration
(the prefix tail and positions already accepted out of textual order inside the window), the
verification order pi_t as rank numbers, the old draft at its positions (accepted / rejected /
unchecked, each chip carrying its rank), the verifier's predictions in rank order, the drafter's
proposals (kept or discarded), and the tokens accepted now, marked where they sit after a position that
is still unresolved. Pure rendering from an :class:`~packed_ss.records.IterationRecord` with ``order``.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from packed_ss.records import IterationRecord

from components.narration import stopped_by
from components.style import marked, source_class, visible
from components.token_grid import grid_box

TokenStrings = Callable[[Sequence[int]], list[str]]


def _chip(text: str, classes: str, title: str, rank: int | None = None) -> str:
    badge = f'<sup class="rank-badge">{rank}</sup>' if rank is not None else ""
    return f'<span class="chip {classes}" title="{html.escape(title)}">{visible(text)}{badge}</span>'


def filled_before(records: Sequence[IterationRecord], index: int) -> dict[int, int]:
    """Output position -> token accepted by the records before ``records[index]`` (dropped ones removed)."""
    filled: dict[int, int] = {}
    for r in records[:index]:
        for j in r.dropped_positions:
            filled.pop(j, None)
        filled.update(zip(r.appended_positions, r.appended))
    return filled


def _positions(ps) -> str:
    ps = list(ps)
    return f"position{'s' if len(ps) != 1 else ''} {', '.join(map(str, ps))}"


def _cut_by(record: IterationRecord) -> str:
    """What cut an iteration's accepted positions: "cut at EOS", "cut at a stop string", or, while the run goes on
    (the record names no stop reason), "cut by an end marker"."""
    reason = record.stop_reason
    return f"cut at {stopped_by(reason)}" if reason in ("eos", "stop string") else "cut by an end marker"


def _pending(record: IterationRecord) -> bool:
    """Linear-SS shown after its drafting call only: a draft, nothing verified yet."""
    return record.schedule == "linear" and not record.verifier_tokens and not record.appended


LEGEND = ('<div class="order-legend"><span class="rank">1</span> verification rank of a position · '
          '<span class="chip out-of-order">x</span> accepted while an earlier position is still open · '
          '<span class="chip mask">∅</span> no draft token yet</div>')


def order_grid_html(record: IterationRecord, before: dict[int, int], strings: TokenStrings, title: str = "",
                    tail: int = 3) -> str:
    """HTML table of one any-order iteration aligned by output position.

    Args:
        record: the iteration (``record.order`` non-empty). before: accepted tokens before it, by position
            (prompt positions included or not: only those in the shown columns are drawn).
        strings: token ids -> display strings. title: schedule title for the heading.
        tail: positions shown left of the window.
    """
    order = record.order
    rank = {j: r + 1 for r, j in enumerate(order)}
    window = [*order, *record.appended_positions, *record.proposal_positions]
    inside = [j for j in before if min(order) <= j <= max(window)]
    start, end = max(0, min(order) - tail), max(window + inside) + 1
    positions = list(range(start, end))
    h = record.h
    ids = [before[j] for j in positions if j in before] + list(record.old_draft) + list(record.verifier_tokens) \
        + list(record.proposals) + list(record.appended)
    text = dict(zip(ids, strings(ids))) if ids else {}
    accepted_now = dict(zip(record.appended_positions, zip(record.appended, record.appended_sources)))
    unresolved_after = {j for j in order if j not in accepted_now}

    def row(label: str, cells: dict[int, str], css: str) -> str:
        tds = "".join(f"<td>{cells.get(p, '')}</td>" for p in positions)
        return f'<tr class="{css}" data-row="{css}"><td class="row-label">{label}</td>{tds}</tr>'

    cells_before = {j: _chip(text[before[j]], "prefix", f"accepted earlier: token {before[j]} at position {j}")
                    for j in positions if j in before}
    cells_rank = {j: f'<span class="rank" title="verification rank {r} of position {j}">{r}</span>'
                  for j, r in rank.items()}
    native = record.schedule == "diffusion"
    pending = _pending(record)
    cells_draft = _draft_cells(record, text, rank, pending, native)
    cells_v = _verifier_cells(record, text)
    cells_z = _proposal_cells(record, text, pending, native)
    cells_out = _accepted_cells(accepted_now, unresolved_after, rank, text)
    head = "".join(f'<th class="{"pos-new" if j in rank else ""}">{j}</th>' for j in positions)
    rows = [
        f'<tr><td class="row-label">position</td>{head}</tr>',
        row("accepted before", cells_before, "prefix"),
        row("window (rank)" if native else "order π<sub>t</sub> (rank)", cells_rank, "order"),
        *([] if native else [row("draft d (call 1)" if record.schedule == "linear" else "old draft d",
                                 cells_draft, "draft"),
                             row("verifier v", cells_v, "verifier")]),
        row("predictions" if native else "proposals z", cells_z, "proposals"),
        row("committed now" if native else "accepted now", cells_out, "appended"),
    ]
    a = len(record.appended)
    outcome = ("h and A after the verification call" if pending else f"{a} committed" if native
               else f"h = {h} · A = {a}" + (f", {_cut_by(record)}" if record.cut else ""))
    heading = (f"Iteration {record.index} · {html.escape(title or record.schedule)} · "
               f"{'window' if native else 'order'} ({', '.join(map(str, order))}) · {outcome} · "
               f"{len(record.calls)} call{'s' if len(record.calls) != 1 else ''}, {record.rows} rows")
    if record.stop_reason:
        heading += f" · stopped: {html.escape(record.stop_reason)}"
    return grid_box(heading, record.index, f'<table class="token-grid order-grid">{"".join(rows)}</table>',
                    "" if native else LEGEND)


def _draft_cells(record: IterationRecord, text: dict[int, str], rank: dict[int, int], pending: bool,
                 native: bool) -> dict[int, str]:
    """The draft row: each drafted position's chip, by how far verification reached (h), by position."""
    cells = {}
    for r, (j, tok) in enumerate(zip(record.draft_positions, record.old_draft)):
        cls, what = (("", "drafted, verified by the next call") if pending else
                     ("accepted", "accepted draft") if r < record.h else
                     ("rejected", "first rejected draft token") if r == record.h else
                     ("unchecked", "not checked (after the first rejection, in rank order)"))
        cells[j] = _chip(text[tok], cls, f"rank {r + 1}: d = {tok} at position {j}: {what}", r + 1)
    if not native:
        for j in record.order[len(record.old_draft):]:
            cells[j] = _chip("∅", "mask", f"position {j} has no draft token yet", rank[j])
    return cells


def _verifier_cells(record: IterationRecord, text: dict[int, str]) -> dict[int, str]:
    """The verifier row: v at each ranked position, faded past the first rejection."""
    cells = {}
    for r, tok in enumerate(record.verifier_tokens):
        j, reached = record.order[r], r <= record.h
        cells[j] = _chip(text[tok], "reached" if reached else "faded",
                         f"rank {r + 1}: v = {tok} at position {j}: "
                         f"{'reached' if reached else 'computed, not reached'}", r + 1)
    return cells


def _proposal_cells(record: IterationRecord, text: dict[int, str], pending: bool, native: bool) -> dict[int, str]:
    """The proposals row (the native lane's predictions): kept or discarded, by position."""
    kept, cells = set(record.kept), {}
    for r, (j, tok) in enumerate(zip(record.proposal_positions, record.proposals)):
        if native:
            cls, what = (("kept", "committed: confident enough") if r in kept else
                         ("discarded", "not confident enough: the position stays open"))
        elif pending:
            cls, what = "kept", "the draft the second call verifies"
        else:
            cls, what = ("kept", "kept: next draft") if r in kept else ("discarded", "discarded: position filled now")
        cells[j] = _chip(text[tok], cls, f"z = {tok} at position {j}: {what}")
    return cells


def _accepted_cells(accepted_now: dict[int, tuple[int, str]], unresolved_after: set[int], rank: dict[int, int],
                    text: dict[int, str]) -> dict[int, str]:
    """The accepted row: each token accepted now, marked where an earlier position is still open."""
    cells = {}
    for j, (tok, source) in accepted_now.items():
        jump = any(k < j for k in unresolved_after)
        what = f"{source}: token {tok} at position {j}" + (
            ", accepted while an earlier position is still open" if jump else "")
        cells[j] = _chip(text[tok], source_class(source) + (" out-of-order" if jump else ""), what, rank.get(j))
    return cells


def narrate_order(record: IterationRecord, strings: TokenStrings, policy: str = "ltr") -> str:
    """One paragraph on what the iteration did: the order, what was checked and accepted, where (HTML).
    ``policy``: the run's order policy (``"ltr"`` or ``"confidence"``)."""
    order = record.order
    sorted_order = list(order) == sorted(order)
    how = ("textual order" if policy == "ltr" else
           "confidence order (here the same as textual order)" if sorted_order else "confidence order")
    words = [f"The window's unresolved positions were checked in {how} ({', '.join(map(str, order))})."]
    if record.schedule == "ar":
        words = [f"One mask at position {order[0]} saw the prompt and every accepted token and predicted it: "
                 f"the any-order model's own left-to-right decoding, one token per call."]
    elif record.schedule == "diffusion":
        words = [f"One mask per open position of the window ({', '.join(map(str, order))}) predicted its token "
                 f"from the accepted tokens alone; {len(record.appended)} prediction"
                 f"{'s were' if len(record.appended) != 1 else ' was'} confident enough (at least the threshold, "
                 f"or the most confident one) and committed without verification at "
                 f"{_positions(record.appended_positions)}; the other positions stay open."]
    elif _pending(record):
        origin = ("textual, as there is no earlier verification" if record.index == 1 or policy == "ltr" else
                  "fixed before this call from the previous verification's confidences")
        words = [f"Call 1 (drafting) put a mask at every open position of the window and proposed the draft; "
                 f"the order ({', '.join(map(str, order))}) is {origin}. Nothing is verified yet: Step again "
                 f"for call 2."]
    elif record.old_draft:
        accepted = record.draft_positions[: record.h]
        n = len(record.old_draft)
        words.append(f"{record.h} of {n} draft token{'s' if n != 1 else ''} matched the verifier in that order"
                     + (f" ({_positions(accepted)})" if accepted else "") + ".")
    else:
        words.append("There was no draft yet, so the verifier's prediction at the first rank was taken.")
    if record.appended and record.schedule not in ("ar", "diffusion") and not _pending(record):
        last_source = record.appended_sources[-1]
        if last_source in ("correction", "bonus", "prefill"):
            words.append(f"The verifier's token {' '.join(repr(s) for s in strings(record.appended[-1:]))} "
                         f"filled position {record.appended_positions[-1]} ({last_source}).")
    if record.appended and not _pending(record):
        jumps = [j for j in record.appended_positions if any(k < j and k not in record.appended_positions
                                                             for k in order)]
        if jumps:
            words.append(f"Accepted out of textual order: {_positions(jumps)}, while an earlier one stays open for "
                         f"a later call.")
    if record.cut and not _pending(record):
        words.append(f"The accepted tokens were {_cut_by(record)}: E moved before {record.cut} of the positions this "
                     f"call accepted, so {'it was' if record.cut == 1 else 'they were'} not kept (A = "
                     f"{len(record.appended)}).")
    if record.dropped_positions:
        words.append(f"An end marker moved E: earlier accepted {_positions(record.dropped_positions)} were dropped.")
    return f'<p class="narration" data-narration="{html.escape(record.schedule)}">{marked(" ".join(words))}</p>'
