"""What the Step view says of an iteration that EOS, a stop string or the new-token limit cut: A is the tokens
appended and the cut is named, verifier rows past the cut are not reached, proposals past it are dropped because the
run stopped, and the sentence names only the positions actually filled."""

import re

from helpers import ScriptedModel

from packed_ss import DecodeConfig, decode

from components.narration import narrate
from components.token_grid import grid_html

PROMPT = [3, 4]
TARGET = list(range(5, 40))  # the verifier's output: token 5 at position 2, 6 at 3, ...


def strings(ids):
    return [f"t{i}" for i in ids]


def run(thresholds, limit, eos=None, stop_strings=()):
    model = ScriptedModel(PROMPT, TARGET, thresholds=thresholds, vocab_size=64)
    model.eos_token_id = eos
    config = DecodeConfig(block_size=8, max_new_tokens=limit, stop_strings=stop_strings)
    records = list(decode(model, PROMPT, config, "packed"))
    return records, PROMPT + [t for r in records for t in r.appended]


def chips(html: str, row: str) -> dict[int, tuple[str, str]]:
    """Position -> (chip classes, hover text) of one grid row."""
    body = re.search(rf'data-row="{row}">(.*?)</tr>', html).group(1)
    found = re.findall(r'<span class="chip ([^"]*)" title="([^"]*)">', body)
    return {int(re.search(r"at position (\d+)", title).group(1)): (cls, title) for cls, title in found}


def advance_label(html: str) -> str:
    return re.search(r'<td class="advance" colspan="(\d+)">([^<]*)</td>', html).group(2)


def test_the_limit_iteration_of_the_issue_is_told_as_it_was_committed():
    """B = 8, limit 5: the third iteration accepts h = 3 of 6 draft tokens with room for 3 tokens; the correction
    is cut, so A = 3 (positions 4-6) and nothing at position 7 or later was reached or filled."""
    records, sequence = run([0, 1, 1, 1, 1, 9, 9, 9, 9, 9] + [9] * 30, limit=5)
    last = records[-1]
    before = last.prefix_len_before
    assert (last.index, before, last.h, len(last.old_draft), last.advance, last.cut) == (3, 4, 3, 6, 3, 1)
    html = grid_html(last, sequence, strings, ScriptedModel.mask_token_id, "Packed-SS")
    assert "h = 3 · A = 3, cut at the limit" in html and "stopped: limit" in html
    assert advance_label(html) == "A = 3: cut at the limit, h was 3 of 6"
    assert "correction" not in advance_label(html)
    verifier = chips(html, "verifier")
    assert [p for p, (cls, _) in verifier.items() if cls == "reached"] == [4, 5, 6]
    assert verifier[7][0] == "faded" and "the run stopped at the new-token limit" in verifier[7][1]
    assert all(cls == "faded" for p, (cls, _) in verifier.items() if p >= 7)
    proposals = chips(html, "proposals")
    assert {p for p, (cls, _) in proposals.items() if cls == "discarded"} == {4, 5, 6}
    dropped = {p for p, (cls, _) in proposals.items() if cls == "dropped"}
    assert dropped == set(range(7, 11)) and all("the run stopped" in proposals[p][1] for p in dropped)
    assert not any("filled" in proposals[p][1] for p in dropped)
    assert sorted(chips(html, "appended")) == [4, 5, 6]
    text = narrate(last, "packed", strings, len(PROMPT))
    assert "h = 3 of the 6 draft tokens and appended A = 3 tokens" in text
    assert "Only positions 4-6 were filled: the run stopped at the new-token limit, so the correction was not" in text
    assert "positions 4-6 were discarded: those positions are now filled" in text
    assert "Those for positions 7-10 were dropped: the run stopped at the new-token limit" in text
    assert "4-10" not in text and "fewer tokens" not in text


def test_a_cut_through_accepted_draft_tokens_names_them_and_the_bonus():
    """Every draft token right: iteration 2 accepts h = 7 of 7, but the limit leaves room for 4 tokens, so 3 accepted
    draft tokens and the bonus token are cut."""
    records, sequence = run([0] * 40, limit=5)
    last = records[-1]
    assert (last.h, last.advance, last.cut) == (7, 4, 4)
    html = grid_html(last, sequence, strings, ScriptedModel.mask_token_id, "Packed-SS")
    assert advance_label(html) == "A = 4: cut at the limit, h was 7 of 7"
    drafts = chips(html, "draft")
    assert all(cls == "accepted" for cls, _ in drafts.values())  # h counts them: the verifier accepted all 7
    assert all("not appended" in drafts[p][1] for p in range(7, 10)) and "not appended" not in drafts[6][1]
    assert [p for p, (cls, _) in chips(html, "verifier").items() if cls == "reached"] == [3, 4, 5, 6]
    text = narrate(last, "packed", strings, len(PROMPT))
    assert "so 3 accepted draft tokens and the bonus token were not appended" in text


def test_eos_and_a_stop_string_name_their_cut():
    eos_records, eos_sequence = run([0] * 40, limit=20, eos=TARGET[4])  # EOS at position 6
    last = eos_records[-1]
    assert (last.stop_reason, last.advance, last.cut, last.appended[-1]) == ("eos", 4, 4, TARGET[4])
    html = grid_html(last, eos_sequence, strings, ScriptedModel.mask_token_id, "Packed-SS")
    assert advance_label(html) == "A = 4: cut at EOS, h was 7 of 7"
    assert "the run stopped at EOS" in narrate(last, "packed", strings, len(PROMPT))
    stop_records, stop_sequence = run([0] * 40, limit=20, stop_strings=("9 10",))  # tokens 9, 10 at positions 6, 7
    last = stop_records[-1]
    assert (last.stop_reason, last.advance, last.cut) == ("stop string", 5, 3)
    html = grid_html(last, stop_sequence, strings, ScriptedModel.mask_token_id, "Packed-SS")
    assert advance_label(html) == "A = 5: cut at a stop string, h was 7 of 7"
    assert "so 2 accepted draft tokens and the bonus token were not appended" in narrate(last, "packed", strings, 2)


def test_an_iteration_that_was_not_cut_keeps_its_correction_or_bonus():
    """The limit met exactly (nothing left out) and every iteration before the last: no cut is named."""
    records, sequence = run([0, 1, 1, 1, 1, 9, 9, 9, 9, 9] + [9] * 30, limit=6)  # room for h + 1 = 4 at the end
    last = records[-1]
    assert (last.stop_reason, last.cut, last.advance) == ("limit", 0, 4)
    for record in records:
        html = grid_html(record, sequence, strings, ScriptedModel.mask_token_id, "Packed-SS")
        assert "cut at" not in html and "not reached: the run stopped" not in html
        assert "was not appended" not in narrate(record, "packed", strings, len(PROMPT))
        if record is not last:  # the run goes on: no proposal is dropped for a stop
            assert all(cls != "dropped" for cls, _ in chips(html, "proposals").values())
    assert advance_label(grid_html(last, sequence, strings, 1, "Packed-SS")) == "A = 4 (h = 3 + correction)"


def test_an_any_order_iteration_names_the_positions_its_end_marker_cut():
    """Any order (Appendix C): EOS accepted at position 6 before the window's position 7 moves E to 6; the pair at 7,
    accepted in the same call, is cut: A = 1 and the grid and its sentence say so."""
    from helpers import tiny_any_order

    from components.order_grid import filled_before, narrate_order, order_grid_html

    model = tiny_any_order(vocab_size=8, seed=0)
    model.eos_token_id = 0
    records = list(decode(model, [2], DecodeConfig(block_size=4, max_new_tokens=12, order="confidence"), "packed"))
    last = records[-1]
    assert (last.cut, last.advance, last.appended_positions, last.stop_reason) == (1, 1, (6,), "eos")
    html = order_grid_html(last, filled_before(records, len(records) - 1), strings)
    assert "A = 1, cut at EOS" in html
    text = narrate_order(last, strings, "confidence")
    assert "The accepted tokens were cut at EOS: E moved before 1 of the positions this call accepted, so it was " \
           "not kept (A = 1)." in text
