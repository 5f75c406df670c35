"""Greedy outputs that leave AR's: where, AR's top-2 margin there, near-tie or bug (race badge, API,
benchmark lossless check)."""

from dataclasses import replace

import torch
from helpers import tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.divergence import NEAR_TIE_LOGITS, Divergence, divergence, first_difference


def test_first_difference_counts_a_length_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_margin_is_ar_top2_gap_at_the_first_difference():
    model = tiny_llama(vocab_size=16, seed=1, logit_scale=3.0, eos=False)
    prompt = [3, 4, 5]
    ar = list(generate(model, prompt, DecodeConfig(max_new_tokens=8), "ar").token_ids)
    other = ar[:4] + [(ar[4] + 1) % 14 + 2] + ar[5:]
    found = divergence(model, prompt, ar, other)
    with torch.no_grad():
        logits = model.model(input_ids=torch.tensor([prompt + ar[:4]])).logits[0, -1]
    logits[list(model.never_emit_ids)] = float("-inf")
    top = logits.topk(2).values
    assert found.index == 4 and found.ar_token == ar[4] and found.other_token == other[4]
    assert abs(found.margin - float(top[0] - top[1])) < 1e-9
    assert found.dtype == "float64" and found.threshold == NEAR_TIE_LOGITS[torch.float64]
    assert not found.near_tie and "bug" in found.verdict()
    assert divergence(model, prompt, ar, ar) is None


def test_race_badge_tells_a_near_tie_from_a_bug():
    from components.race_panel import badge_html
    from serve.lanes import lane_from_run

    model = tiny_llama(vocab_size=16, seed=1, logit_scale=3.0, eos=False)
    ar = generate(model, [3, 4], DecodeConfig(max_new_tokens=6), "ar")
    packed = generate(model, [3, 4], DecodeConfig(max_new_tokens=6), "packed")
    flipped = replace(packed, token_ids=packed.token_ids[:2] + (9 if packed.token_ids[2] != 9 else 10,)
                      + packed.token_ids[3:])
    ref = lane_from_run(ar, "AR", ar.token_ids, shown=False)
    lane = lane_from_run(flipped, "Packed-SS", ar.token_ids)
    tie = Divergence(2, ar.token_ids[2], flipped.token_ids[2], 0.125, 0.5, "bfloat16")
    html_tie = badge_html([ref, replace(lane, divergence=tie)], greedy=True)
    assert 'data-badge="near-tie"' in html_tie and "not a bug" in html_tie and "✗" not in html_tie
    bug = replace(tie, margin=3.0)
    html_bug = badge_html([ref, replace(lane, divergence=bug)], greedy=True)
    assert 'data-badge="differs"' in html_bug and "engine bug" in html_bug


def test_benchmark_lossless_check_reports_margins_and_near_ties():
    import pandas as pd

    from packed_ss.bench.summary import lossless_check

    rows = [dict(prompt_index=0, sample=0, schedule=s, prompt_id="p0", token_hash=h)
            for s, h in (("ar", "a"), ("packed", "b"), ("linear", "a"))]
    differences = [{"schedule": "packed", "prompt_id": "p0", "sample": 0,
                    **Divergence(3, 5, 6, 0.25, 0.5, "bfloat16").as_dict()}]
    result = lossless_check(pd.DataFrame(rows), ["ar", "linear", "packed"], 0.0, differences)
    packed = result["by_schedule"]["packed"]
    assert packed["differing"] == 1 and packed["near_ties"] == 1
    assert packed["differences"][0]["margin_logits"] == 0.25 and packed["differences"][0]["index"] == 3
    assert result["by_schedule"]["linear"]["differing"] == 0 and result["by_schedule"]["linear"]["near_ties"] == 0

