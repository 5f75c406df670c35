"""Engine faults of issue 11: tiny temperatures, never-emitted ids, zero-probability drafts, acceptance
statistics after EOS, and the per-run row bound every front end checks before running."""

import pytest
import torch
from helpers import ScriptedModel, tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.records import SOURCE_DRAFT
from packed_ss.sampling import SparseDist, verify_sampled, warp
from packed_ss.schedules import REGISTRY

PROMPT = [2, 3, 4]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=24, seed=5, logit_scale=2.0)


# --- temperatures between 0 and the smallest float ------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-300, 1e-308, 5e-324])
def test_warp_at_tiny_temperature_is_finite_and_greedy(temperature):
    logits = torch.tensor([[1.0, 3.0, -2.0, 2.5], [0.0, 0.0, 5.0, -1e4]])
    probs = warp(logits, temperature)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs, warp(logits, 0.0))  # one-hot on the argmax


@pytest.mark.parametrize("schedule", list(REGISTRY))
@pytest.mark.parametrize("temperature", [1e-308, 5e-324])
def test_every_schedule_runs_at_tiny_temperature_and_matches_greedy(model, schedule, temperature):
    config = DecodeConfig(block_size=4, max_new_tokens=12, temperature=temperature, seed=3)
    run = generate(model.share(), PROMPT, config, schedule)
    assert run.tokens == 12
    if schedule != "diffusion":  # block diffusion commits by confidence, which depends on T by design
        greedy = generate(model.share(), PROMPT, DecodeConfig(block_size=4, max_new_tokens=12), schedule)
        assert run.token_ids == greedy.token_ids


# --- acceptance of a zero-probability draft token ----------------------------------------------------------
def test_zero_probability_draft_token_is_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.4, 0.4]], dtype=torch.float64)
    q_without_token = SparseDist(torch.tensor([1]), torch.tensor([1.0], dtype=torch.float64))  # Q(0) = 0
    q_with_token = SparseDist.point(0)  # Q(0) = 1
    for stored in (q_without_token, q_with_token):
        for seed in range(20):
            verdict = verify_sampled([0], [stored], p, torch.Generator().manual_seed(seed))
            assert verdict.h == 0 and verdict.accept_probs == (0.0,)
            assert verdict.token != 0  # the correction comes from p, where token 0 has no mass


def test_positive_probability_draft_with_zero_q_is_accepted():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.4, 0.4]], dtype=torch.float64)
    elsewhere = SparseDist(torch.tensor([2]), torch.tensor([1.0], dtype=torch.float64))
    verdict = verify_sampled([1], [elsewhere], p, torch.Generator().manual_seed(0))
    assert verdict.h == 1 and verdict.accept_probs == (1.0,)


# --- ids the model must never emit -----------------------------------------------------------------------------
def mask_loving_model(seed: int = 1):
    """A tiny model whose LM head favours the mask token (id 1) in every row, verifier and drafter alike."""
    from helpers import tiny_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from packed_ss.models import DualModeModel

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    net = LlamaForCausalLM(config).double().eval()
    net.lm_head.register_forward_hook(lambda module, args, out: out.index_add(
        -1, torch.tensor([1]), torch.full_like(out[..., :1], 3.0)))
    return DualModeModel(net, tiny_tokenizer(16), mask_token_id=1, eos_token_id=0)


@pytest.mark.parametrize("schedule", list(REGISTRY))
@pytest.mark.parametrize("temperature", [0.0, 2.0])
def test_mask_token_is_never_emitted_or_drafted(schedule, temperature):
    model = mask_loving_model()
    for seed in range(3):
        config = DecodeConfig(block_size=4, max_new_tokens=16, temperature=temperature, seed=seed)
        run = generate(model.share(), PROMPT, config, schedule)
        assert model.mask_token_id not in run.token_ids
        for record in run.records:
            drafted = [record.proposals[i] for i in record.kept]
            assert model.mask_token_id not in drafted
            if schedule != "diffusion":  # a diffusion block's open slots hold the mask token as input
                assert model.mask_token_id not in record.old_draft


def test_vocabulary_padding_rows_are_never_emitted():
    model = mask_loving_model()
    model.never_emit_ids = (1,) + tuple(range(6, 16))  # as if the tokenizer knew only ids 0..5
    run = generate(model, PROMPT, DecodeConfig(block_size=3, max_new_tokens=20, temperature=2.0, seed=1), "packed")
    assert set(run.token_ids) <= {0, 2, 3, 4, 5}


def test_shipped_model_reported_seed_does_not_start_with_the_mask_token(embedded_model):
    """The reported CLI input: '    return ', T = 2, seed 179, 4 tokens, started with the mask token."""
    prompt = embedded_model.encode("    return ")
    for schedule in ("ar", "linear", "quadratic", "packed"):
        run = generate(embedded_model.share(), prompt, DecodeConfig(temperature=2.0, seed=179, max_new_tokens=4),
                       schedule)
        assert embedded_model.mask_token_id not in run.token_ids


# --- acceptance statistics count what was committed ------------------------------------------------------
def test_acceptance_statistics_stop_at_eos():
    """A perfect drafter proposes 7 tokens; EOS is the second, so 1 draft token and EOS are committed."""
    prompt, target = [5, 6], [7, 0, 8, 9, 10, 11, 12, 13, 14]  # 0 is EOS
    model = ScriptedModel(prompt, target, thresholds=[0] * 8)
    model.eos_token_id = 0
    for schedule in ("linear", "quadratic", "packed"):
        run = generate(model, prompt, DecodeConfig(block_size=8, max_new_tokens=32), schedule)
        assert run.token_ids[-1] == 0
        committed = sum(r.appended_sources.count(SOURCE_DRAFT) for r in run.records)
        histogram = run.acceptance_histogram
        assert sum(h * n for h, n in enumerate(histogram)) == committed
        rates = run.per_position_acceptance
        reached = sum(min(len(r.old_draft), 7) for r in run.records if r.verifies)
        assert sum(rate * reached_i for rate, reached_i in zip(rates, _reached(run))) == pytest.approx(committed)
        assert reached >= committed


def _reached(run):
    counts = [0] * (run.block_size - 1)
    for r in run.records:
        if r.verifies:
            for i in range(min(len(r.old_draft), run.block_size - 1)):
                counts[i] += 1
    return counts


# --- the work bound of a run ---------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", list(REGISTRY))
@pytest.mark.parametrize("block_size,length", [(2, 9), (4, 17), (6, 5)])
def test_rows_never_exceed_the_schedule_bound(model, schedule, block_size, length):
    for temperature in (0.0, 1.5):
        config = DecodeConfig(block_size=block_size, max_new_tokens=length, temperature=temperature, seed=4)
        run = generate(model.share(), PROMPT, config, schedule)
        assert run.rows <= REGISTRY[schedule].max_rows(len(PROMPT), config)


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_row_bound_is_reached_when_no_draft_is_ever_accepted(schedule):
    """A drafter that is always wrong makes every iteration advance one token: the worst case."""
    prompt, target = [5, 6, 7], list(range(2, 14))
    model = ScriptedModel(prompt, target, thresholds=[99] * 8)
    config = DecodeConfig(block_size=5, max_new_tokens=10)
    run = generate(model, prompt, config, schedule)
    n, b, length = len(prompt), 5, 10
    expected = {"ar": n + (length - 1), "linear": n + (length - 1) * 2 * b,
                "quadratic": n + b + (length - 1) * b * (b + 1), "packed": n + b + (length - 1) * 2 * b}
    assert run.rows == expected[schedule] == REGISTRY[schedule].max_rows(n, config)


# --- what the Python API is given -------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, config, error, match", [
    ([2, 99_999], DecodeConfig(block_size=4, max_new_tokens=4), ValueError, "token id 99999 is outside the model's vocabulary"),
    ([2, -1], DecodeConfig(block_size=4, max_new_tokens=4), ValueError, "token id -1 is outside"),
    ("w1 w2", DecodeConfig(block_size=4, max_new_tokens=4), TypeError, "prompt_ids must be a sequence of token ids"),
    ([2, 3.5], DecodeConfig(block_size=4, max_new_tokens=4), TypeError, "integer token ids, got float"),
    ([2, 3], {"block_size": 4}, TypeError, "config must be a DecodeConfig, got dict"),
])
@pytest.mark.parametrize("schedule", ["ar", "packed"])
def test_bad_python_api_inputs_get_an_error_that_says_what_is_wrong(model, prompt, config, error, match, schedule):
    with pytest.raises(error, match=match):
        generate(model, prompt, config, schedule)


def test_prompt_ids_may_be_any_integer_sequence(model):
    import numpy as np

    config = DecodeConfig(block_size=4, max_new_tokens=6)
    expected = generate(model, PROMPT, config, "packed").token_ids
    assert generate(model, np.array(PROMPT), config, "packed").token_ids == expected
    assert generate(model, torch.tensor(PROMPT), config, "packed").token_ids == expected


@pytest.mark.parametrize("seed", [-1, 2**32, 2**63 - 1])
def test_seeds_the_generator_would_alias_are_refused(seed):
    """torch's CPU generator keeps 32 bits of a seed: 2^32 gave seed 0's run. Such seeds are refused."""
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 4294967295"):
        DecodeConfig(seed=seed)


def test_distinct_seeds_give_distinct_sampled_runs(model):
    runs = {tuple(generate(model, PROMPT, DecodeConfig(block_size=4, max_new_tokens=12, temperature=1.0, seed=s),
                           "packed").token_ids) for s in (0, 1, 2**32 - 1)}
    assert len(runs) == 3
