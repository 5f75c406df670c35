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
        assert f"h = {record.h} of the {len(record.old_draft)} draft tokens" in text
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
