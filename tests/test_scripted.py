"""The scripted drafter: real verifier, drafter quality set by one number, monotone on every run, so the
paper's Theorem 3.2 (Packed-SS never needs more calls than Linear-SS, greedy) can be watched holding."""

import pytest
from helpers import tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.engine import scripted_drafter
from packed_ss.schedules import SPECULATIVE


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=24, seed=5, logit_scale=3.0, eos=False)


def test_perfect_and_useless_drafters_bracket_acceptance_and_stay_lossless(model):
    prompt, config = [3, 4, 5], DecodeConfig(block_size=4, max_new_tokens=24)
    ar = generate(model, prompt, config, "ar")
    for name in SPECULATIVE:
        perfect = generate(scripted_drafter(model, prompt, config, 1.0), prompt, config, name)
        useless = generate(scripted_drafter(model, prompt, config, 0.0), prompt, config, name)
        assert perfect.token_ids == useless.token_ids == ar.token_ids, name
        assert all(r.h == len(r.old_draft) for r in perfect.records if r.verifies), name  # every draft accepted
        assert all(r.h == 0 for r in useless.records if r.verifies), name
        assert perfect.nfe < useless.nfe


@pytest.mark.parametrize("quality", [0.3, 0.6, 0.8, 0.95])
def test_theorem_3_2_packed_never_needs_more_calls_than_linear(model, quality):
    for seed in range(6):
        prompt = [3 + seed % 5, 7, 9]
        for block in (3, 4, 6):
            config = DecodeConfig(block_size=block, max_new_tokens=30)
            runs = {name: generate(scripted_drafter(model, prompt, config, quality, seed), prompt, config, name)
                    for name in ("linear", "packed")}
            # count iterations of verification (Linear-SS pays 2 calls for each, the theorem counts calls)
            assert runs["packed"].nfe <= runs["linear"].nfe, (quality, seed, block)
            assert runs["packed"].token_ids == runs["linear"].token_ids


def test_scripted_runs_count_the_real_calls_and_rows(model):
    prompt, config = [3, 4], DecodeConfig(block_size=4, max_new_tokens=10)
    scripted = generate(scripted_drafter(model, prompt, config, 0.7, 1), prompt, config, "packed")
    for record in scripted.records:
        for call in record.calls:
            assert call.model_ms > 0 and call.layout.rows >= 1
    assert scripted.rows == sum(c.layout.rows for r in scripted.records for c in r.calls)


def test_quality_out_of_range_is_refused(model):
    with pytest.raises(ValueError, match=r"drafter quality must be in \[0, 1\]"):
        scripted_drafter(model, [3], DecodeConfig(), 1.5)


def test_a_scripted_run_that_does_not_fit_names_the_tokens_asked_for_and_one_that_fits_runs():
    """156 tokens asked, "164" said: the refusal named the reference's length, a block longer than the run (issue
    54); and a run that fits the model but whose reference's extra block did not was refused."""
    from packed_ss.engine import scripted_drafter
    from packed_ss.iteration import PromptError

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)  # 512 positions
    prompt = [4] * (model.max_length - 156 - 2 * 8 + 1)  # one position short for 156 tokens
    with pytest.raises(PromptError, match=r" \+ 156 new tokens \+ 2 blocks of 8 exceeds"):
        scripted_drafter(model, prompt, DecodeConfig(block_size=8, max_new_tokens=156), 0.9)
    fits = prompt[1:]  # exactly room for the run, none for the reference's extra block
    drafter = scripted_drafter(model, fits, DecodeConfig(block_size=8, max_new_tokens=156), 0.9)
    assert len(drafter.reference) >= len(fits) + 156


def test_with_follow_the_reference_follows_the_run_after_a_divergence(model):
    """A run's verifier can part from AR's output at a near-tie (bfloat16, other row counts: issue 55, where the
    bfloat16 race measured nothing after 19-24 tokens). Emulated here by a reference that leaves AR's output at one
    position: without ``follow`` no proposal is accepted after it; with ``follow`` the reference becomes the run's
    verified prefix and AR's greedy continuation of it, so a perfect drafter is accepted again, and a second run with
    the same anchors computes nothing."""
    from packed_ss.engine import ar_continuation
    from packed_ss.models.scripted import ScriptedDrafter

    prompt, config = [3, 4, 5], DecodeConfig(block_size=4, max_new_tokens=24)
    ar = list(generate(model, prompt, config, "ar").token_ids)
    at = 6  # the reference leaves AR's output at the 7th new token
    parted = prompt + ar[:at] + [(ar[at] + 1) % 20 + 2]  # AR's output, then another token: another branch
    rest = DecodeConfig(block_size=4, max_new_tokens=len(prompt) + len(ar) + 4 - len(parted))
    reference = parted + list(generate(model, parted, rest, "ar").token_ids)  # ... and AR's greedy run of it
    past = len(prompt) + at + 1  # positions from here on come after the divergence

    def run(follow, anchors=None):
        drafter = ScriptedDrafter(model.share(), reference, 1.0, follow=ar_continuation(model) if follow else None,
                                  anchors=anchors)
        result = generate(drafter, prompt, config, "packed")
        assert list(result.token_ids) == ar  # lossless either way
        # from the second iteration past the divergence (the draft in flight then was made on the other branch)
        after = [r for r in result.records if r.verifies and r.prefix_len_before >= past + 2 and r.old_draft]
        return drafter, result, after

    _, _, stuck = run(False)
    assert stuck and all(r.h == 0 for r in stuck)
    followed, result, after = run(True)
    assert after and all(r.h == len(r.old_draft) for r in after)  # every draft accepted again
    assert followed.anchored == 1 and followed.anchor_calls > 0
    again, second, _ = run(True, followed.anchors)
    assert again.anchored == 0 and [r.h for r in second.records] == [r.h for r in result.records]
