"""One or two sentences per iteration, told from the record and specific to the schedule (paper Section 3).

What the call read, how many draft tokens were accepted (h), what was appended (A, and whether it ended
with a correction or a bonus token, or what EOS, a stop string or the limit cut), which proposals were discarded
(their positions filled) or dropped (the run stopped) and which became the next draft; at T > 0 the acceptance
probabilities of the checked draft tokens. Pure: record in, HTML out.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from packed_ss.records import SOURCE_BONUS, SOURCE_CORRECTION, IterationRecord

from components.style import marked

TokenStrings = Callable[[Sequence[int]], list[str]]


# What ended a run, as "cut at ..." / "stopped at ..." completes it (packed_ss stop reasons and the server's).
STOPPED_BY = {"limit": "the new-token limit", "eos": "EOS", "stop string": "a stop string",
              "common stop": "the race's common token count", "time limit": "the time limit"}


def _rows(record) -> str:
    """Why a Packed-SS call has the rows it has: 1 + |D| verifier rows (padded to B when the draft is padded) and B
    drafter rows (Appendix D.1); 2B with a full or padded draft."""
    if not record.old_draft or not record.calls:
        return ""
    layout = record.calls[-1].layout
    drafting = len(layout.proposal_rows)
    verify = layout.rows - drafting
    pads = verify - 1 - len(record.old_draft)
    if drafting <= 1 or pads < 0:
        return ""
    padded = f" and {pads} mask pad{'s' if pads != 1 else ''}" if pads else ""
    return (f"Its {layout.rows} rows: {verify} verifier rows (the last prefix token, the {len(record.old_draft)}-token "
            f"old draft{padded}) and {drafting} drafter rows (the last prefix token and {drafting - 1} masks); a full "
            f"draft makes 2B = {2 * drafting}. ")


def stopped_by(reason: str | None, short: bool = False) -> str:
    """What ended the run in words ("the new-token limit" for ``"limit"``, ``short``: "the limit"); the reason itself
    when unknown."""
    if short and reason == "limit":
        return "the limit"
    return STOPPED_BY.get(reason or "", reason or "the end of the run")


def _cut(record: IterationRecord) -> str:
    """What the stopping rule left out of C_t (``record.cut`` tokens): "the correction", or "2 accepted draft tokens
    and the bonus token"; empty when nothing was cut."""
    if not record.cut:
        return ""
    last = "the bonus token" if record.h == len(record.old_draft) else "the correction"
    drafts = record.cut - 1
    return (f"{drafts} accepted draft token{'s' if drafts != 1 else ''} and " if drafts else "") + last


def _quoted(strings: TokenStrings, ids: Sequence[int]) -> str:
    return " ".join(repr(s) for s in strings(list(ids))) if ids else "nothing"


def _positions(start: int, indices: Sequence[int]) -> str:
    """Absolute positions of proposal indices: "position 12" or "positions 12-14"."""
    pos = [start + i for i in indices]
    return f"position {pos[0]}" if len(pos) == 1 else f"positions {pos[0]}-{pos[-1]}"


def _verdict(record: IterationRecord, strings: TokenStrings) -> str:
    """h, A and the correction or bonus token, with acceptance probabilities at T > 0."""
    a = len(record.appended)
    last = record.appended_sources[-1] if record.appended_sources else ""
    kind = {SOURCE_CORRECTION: "a correction", SOURCE_BONUS: "a bonus token"}.get(last, "")
    end = f", the last one {kind} {_quoted(strings, record.appended[-1:])}" if kind else ""
    checked = len(record.old_draft)
    if not checked:
        text = (f"There was no draft to check: the verifier's row after the prefix gave the next token, and "
                f"A = {a} token{'s were' if a != 1 else ' was'} appended{end}.")
    else:
        text = (f"The verifier accepted h = {record.h} of the {checked} draft token{'s' if checked != 1 else ''} "
                f"and appended A = {a} token{'s' if a != 1 else ''}{end}.")
    if record.accept_probs:
        probs = ", ".join(f"{p:.2f}" for p in record.accept_probs)
        text += f" Acceptance probabilities min(1, p/Q) of the checked tokens: {probs}."
    if record.cut and checked:
        first, last = record.prefix_len_before, record.prefix_len_before + a - 1
        where = f"position {first}" if a == 1 else f"positions {first}-{last}"
        text += (f" Only {where} {'was' if a == 1 else 'were'} filled: the run stopped at "
                 f"{stopped_by(record.stop_reason)}, so {_cut(record)} {'was' if record.cut == 1 else 'were'} "
                 f"not appended.")
    return text


def _next_draft(record: IterationRecord, strings: TokenStrings) -> str:
    """Which proposals were discarded (their positions are now filled), which were dropped (past the positions
    filled when the run stopped) and which became the next draft."""
    if not record.proposals:
        return ""
    kept, start = record.kept, record.proposal_start
    filled = [i for i in record.discarded if start + i < record.prefix_len_after]
    rest = [i for i in record.discarded if start + i >= record.prefix_len_after]
    text = (f" The drafter's proposals for {_positions(start, filled)} were discarded: "
            f"{'those positions are' if len(filled) > 1 else 'that position is'} now filled." if filled else "")
    if rest:
        lead = "Those" if filled else "The drafter's proposals"
        text += (f" {lead} for {_positions(start, rest)} were dropped"
                 + (f": the run stopped at {stopped_by(record.stop_reason)}, so there is no next draft."
                    if record.stop_reason else "."))
    if kept:
        kept_ids = [record.proposals[i] for i in kept]
        text += (f" Proposals {_quoted(strings, kept_ids)} ({_positions(record.proposal_start, kept)}) "
                 f"form the next draft.")
    return text


def _mixed(record: IterationRecord, strings: TokenStrings, n: int) -> str:
    """Packed-SS + n-gram: the call's shape, the verdict, and where each next-draft token came from."""
    grams = sum(s == "n-gram" for s in record.old_draft_sources)
    lean = bool(record.calls) and record.calls[0].layout.name == "packed-verify"
    text = ("One causal call verified the old draft; its diffusion half was left out, because the draft came "
            "from an n-gram match that has mostly been accepted so far. " if lean else
            f"One call verified the old draft in causal mode and drafted from P_t-1 ({n} tokens) in diffusion "
            f"mode. ")
    if grams:
        text += f"{grams} of the {len(record.old_draft)} draft tokens came from an n-gram match. "
    return text + _verdict(record, strings) + _mixed_next(record, strings)


def _mixed_next(record: IterationRecord, strings: TokenStrings) -> str:
    """Where each token of Packed-SS + n-gram's next draft came from (or why there is none)."""
    if record.stop_reason:
        return ""
    if not record.next_draft:
        return (" Next draft: none (the drafter's proposals all fell on positions just filled, and no n-gram of "
                "the text matched), so the next call checks no draft and the verifier gives one token.")
    sources = record.next_draft_sources
    gram_ids = [t for t, s in zip(record.next_draft, sources) if s == "n-gram"]
    drafter_ids = [t for t, s in zip(record.next_draft, sources) if s != "n-gram"]
    parts = []
    if drafter_ids:
        parts.append(f"{len(drafter_ids)} from the drafter ({_quoted(strings, drafter_ids)})")
    if gram_ids:
        parts.append(f"{len(gram_ids)} copied after an earlier match of the text's last tokens "
                     f"({_quoted(strings, gram_ids)})")
    count = len(record.next_draft)
    return (f" Next draft, {count} token{'s' if count != 1 else ''}: " + " and ".join(parts) +
            "; per position the source judged likelier to be accepted (the other proposals were dropped).")


def _diffusion(record: IterationRecord, strings: TokenStrings, n: int, mask_token_id: int | None) -> str:
    """Block diffusion: which masks this call unmasked, how full the block is, and the commit when it is full."""
    chosen = sorted(record.kept)
    width = len(record.old_draft)
    open_before = sum(1 for t in record.old_draft if t == mask_token_id)
    where = ", ".join(str(record.proposal_start + i) for i in chosen)
    text = (f"One call read the block of {width} slots bidirectionally after the {n}-token prefix and unmasked "
            f"{len(chosen)} of its {open_before} open slot{'s' if open_before != 1 else ''} (position{'s' if len(chosen) != 1 else ''} "
            f"{where}: those confident enough, or else the most confident one).")
    if record.appended:
        text += (f" The block is full, so its {len(record.appended)} tokens were committed without verification "
                 f"({_quoted(strings, record.appended)}); the next call starts a new block.")
    else:
        text += " Nothing is committed until every slot of the block is filled: this method never verifies."
    return text


def narrate(record: IterationRecord, schedule: str, strings: TokenStrings, prompt_len: int,
            mask_token_id: int | None = None) -> str:
    """The narration of one iteration as an HTML paragraph (text escaped).

    Args:
        record: the iteration. schedule: its registry name. strings: token ids -> display strings.
        prompt_len: prompt length in tokens (to tell the prefill iteration apart).
        mask_token_id: the model's mask id (block diffusion counts the slots still masked).
    """
    n = record.prefix_len_before
    first = record.index == 1
    if schedule == "ar":
        text = (f"One causal call over {'the prompt' if first else 'the newest token'} predicted the next token "
                f"{_quoted(strings, record.appended)}: AR appends exactly one token per call.")
    elif schedule == "diffusion":
        text = _diffusion(record, strings, n, mask_token_id)
    elif first and schedule == "packed-mixed":
        masks = len(record.calls[0].layout.draft_rows) if record.calls else 0
        text = (f"Prefill: one call read the {prompt_len}-token prompt causally; its last row predicted the first "
                f"token {_quoted(strings, record.appended)}. In the same call {masks} masks drafted (this variant "
                f"keeps its diffusion half small); the first falls where the verifier's token goes."
                + _mixed_next(record, strings))
    elif first:
        text = (f"Prefill: one call read the {prompt_len}-token prompt causally; its last row predicted the first "
                f"token {_quoted(strings, record.appended)}.")
        if schedule != "linear":
            text += (" In the same call W + 1 masks drafted (Appendix E.2): the first falls where the verifier's "
                     "token goes, so a full draft of W tokens is left for the next call.")
        text += _next_draft(record, strings) if schedule != "linear" else " Linear-SS drafts in the next iteration."
    elif schedule == "lookup":
        found = (f"the n-gram match in the text so far gave the draft {_quoted(strings, record.old_draft)}"
                 if record.old_draft else "no n-gram of the text so far matched, so there was no draft")
        text = f"No drafter: {found}; one causal call checked it. " + _verdict(record, strings)
    elif schedule == "linear" and len(record.calls) == 1:  # shown after its drafting call only
        text = (f"Call 1 (drafting) read the newest prefix P_t-1 ({n} tokens) in diffusion mode and proposed the "
                f"draft {_quoted(strings, record.old_draft)}. Nothing is verified yet: Step again for call 2. "
                f"The next drafting call cannot start before this verification has extended the prefix.")
    elif schedule == "linear":
        text = (f"Call 1 (drafting) read the newest prefix P_t-1 ({n} tokens) and proposed the draft "
                f"{_quoted(strings, record.old_draft)}; call 2 (verification) checked it causally. ")
        text += _verdict(record, strings) + " Linear-SS needs both calls every iteration: drafting waits for the prefix."
    elif schedule == "quadratic":
        text = ("One call verified the draft and, in the same call, drafted one branch for every possible h "
                "(B branches). ") + _verdict(record, strings)
        text += f" Branch h = {record.h} was selected by this verification." + _next_draft(record, strings)
    elif schedule == "partial":
        hs = ", ".join(map(str, record.branches)) or "none"
        text = (f"One call verified the old draft, drafted from P_t-1 ({n} tokens) as Packed-SS does, and prepared "
                f"Quadratic-SS branches for the likeliest acceptance lengths only (h = {hs}). ") + _verdict(record, strings)
        text += (f" h = {record.h} had a branch, so its proposals (which saw the accepted draft tokens) became the "
                 f"next draft." if record.h in record.branches else
                 f" h = {record.h} had no branch, so the next draft is Packed-SS's.") + _next_draft(record, strings)
    elif schedule == "packed-mixed":
        text = _mixed(record, strings, n)
    else:  # packed
        text = (f"One call verified the old draft in causal mode and, in the same call, drafted from the old prefix "
                f"P_t-1 ({n} tokens) in diffusion mode. ") + _rows(record) + _verdict(record, strings) \
            + _next_draft(record, strings)
    return f'<p class="narration" data-narration="{html.escape(schedule)}">{marked(text)}</p>'
