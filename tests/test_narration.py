"""The narrated sentence under the Step-through grid is told from the record (paper Section 3)."""

import re

import pytest
from helpers import ScriptedModel

from packed_ss import DecodeConfig, decode

from components.narration import narrate


def strings(ids):
    return [f"t{i}" for i in ids]


def records(schedule, thresholds, block=4, limit=12):
    model = ScriptedModel([3, 4], list(range(5, 40)), thresholds=thresholds, vocab_size=64)
    return list(decode(model, [3, 4], DecodeConfig(block_size=block, max_new_tokens=limit), schedule))


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_every_verifying_iteration_states_h_and_a_and_the_last_token_kind(schedule):
    for record in records(schedule, thresholds=[0, 0, 1, 9, 9, 9] + [0] * 40)[1:]:
        text = narrate(record, schedule, strings, 2)
        n = len(record.old_draft)
        assert (f"h = {record.h} of the {n} draft token{'s' if n != 1 else ''} and" in text if n
                else "There was no draft to check" in text)
        assert f"A = {len(record.appended)} token" in text
        kind = record.appended_sources[-1]
        assert ("a correction" in text) == (kind == "correction") and ("a bonus token" in text) == (kind == "bonus")


def test_packed_names_discarded_and_kept_proposals_by_position():
    record = records("packed", thresholds=[0] * 40)[2]
    text = narrate(record, "packed", strings, 2)
    dropped = [record.proposal_start + i for i in record.discarded]
    kept = [record.proposals[i] for i in record.kept]
    assert f"position{'s' if len(dropped) > 1 else ''} {dropped[0]}" in text and "now filled" in text
    assert " ".join(repr(f"t{i}") for i in kept).replace("'", "&#x27;") in text
    assert "from the old prefix" in text


def test_schedule_specific_sentences():
    linear = narrate(records("linear", [0] * 40)[1], "linear", strings, 2)
    assert "Call 1 (drafting)" in linear and "call 2 (verification)" in linear
    quadratic = records("quadratic", [0] * 40)[1]
    assert f"Branch h = {quadratic.h} was selected" in narrate(quadratic, "quadratic", strings, 2)
    assert "one token per call" in narrate(records("ar", [0])[1], "ar", strings, 2)
    assert narrate(records("packed", [0])[0], "packed", strings, 2).count("Prefill") == 1
    assert re.search(r'<p class="narration" data-narration="packed">', narrate(records("packed", [0])[0], "packed",
                                                                              strings, 2))


def test_two_source_narration_matches_the_next_draft():
    from helpers import tiny_llama

    model = tiny_llama(vocab_size=6, seed=0, logit_scale=3.0, eos=False)
    run = list(decode(model, [2, 3, 4, 2, 3, 4], DecodeConfig(block_size=6, max_new_tokens=30), "packed-mixed"))
    words = lambda ids: model.token_strings(list(ids))  # noqa: E731
    first = narrate(run[0], "packed-mixed", words, 6)
    assert f"{min(3, 5) + 1} masks drafted" in first and "W + 1" not in first
    for record in run:
        text = narrate(record, "packed-mixed", words, 6)
        grams = sum(s == "n-gram" for s in record.next_draft_sources)
        if record.stop_reason:
            continue
        if not record.next_draft:
            assert "Next draft: none" in text
        else:
            assert f"Next draft, {len(record.next_draft)} token" in text
            assert (f"{grams} copied after an earlier match" in text) == (grams > 0)


def test_packed_says_why_its_call_has_the_rows_it_has():
    """Step showed 15 rows and 12 rows where Explain says 2B = 16: the sentence names the verifier rows (1 + the old
    draft's length) and the B drafter rows, and 2B for a full draft."""
    for block in (4, 8):
        for record in records("packed", thresholds=[0, 0, 1, 9, 9, 9] + [0] * 40, block=block, limit=24)[2:]:
            text = narrate(record, "packed", strings, 2)
            layout = record.calls[-1].layout
            verify = len(layout.verify_rows)
            if record.old_draft:
                assert (f"Its {layout.rows} rows: {verify} verifier rows (the last prefix token, the "
                        f"{len(record.old_draft)}-token old draft") in text, text
                assert f"and {block} drafter rows" in text and f"2B = {2 * block}" in text
                assert verify + block == layout.rows
