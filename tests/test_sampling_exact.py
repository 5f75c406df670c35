"""At T > 0 every speculative schedule samples exactly the AR distribution (paper Theorem 3.3).

The first four generated tokens of a tiny model with four usable tokens (256 outcomes) are sampled
many times with one seeded generator per run; the exact AR distribution is enumerated from the model
with the same top-k/top-p warping; a chi-square goodness-of-fit test (bins with expected count < 5
pooled) must not reject at level 1e-4. The same chi-square check on one verification step rejects a
residual that ignores Q and a stored Q that is not the one the draft was drawn from.
"""

import itertools

import numpy as np
import pytest
import torch
from helpers import tiny_llama
from scipy.stats import chisquare

from packed_ss import DecodeConfig, generate
from packed_ss.sampling import SparseDist, Verdict, sample, verify_sampled, warp

LENGTH, RUNS, BLOCK = 4, 2000, 3
PROMPT = [2, 3]
ALPHA = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=5, seed=11, logit_scale=2.0, eos=False)


def exact_distribution(model, temperature, top_k, top_p) -> dict[tuple, float]:
    """P(first LENGTH tokens = seq) for every seq, from one transformers forward over all of them (a batch)."""
    tokens = [t for t in range(model.vocab_size) if t != model.mask_token_id]
    sequences = list(itertools.product(tokens, repeat=LENGTH))
    with torch.no_grad():
        ids = torch.tensor([PROMPT + list(seq) for seq in sequences])
        logits = model.model(input_ids=ids).logits[:, len(PROMPT) - 1: -1]  # (N, LENGTH, V)
    logits[..., list(model.never_emit_ids)] = float("-inf")  # AR never emits them (the mask token)
    out = {}
    for seq, rows in zip(sequences, logits):
        p = warp(rows, temperature, top_k, top_p)
        out[seq] = float(torch.prod(p[torch.arange(LENGTH), torch.tensor(seq)]))
    return out


def p_value(model, name, temperature, top_k, top_p, runs: int = RUNS) -> float:
    exact = exact_distribution(model, temperature, top_k, top_p)
    counts = dict.fromkeys(exact, 0)
    for seed in range(runs):
        config = DecodeConfig(block_size=BLOCK, temperature=temperature, top_k=top_k, top_p=top_p,
                              max_new_tokens=LENGTH, seed=seed)
        counts[generate(model, PROMPT, config, name).token_ids] += 1
    impossible = [s for s in exact if exact[s] == 0]  # removed by top-k/top-p: must never appear
    assert sum(counts[s] for s in impossible) == 0
    big = [s for s in exact if exact[s] * runs >= 5]
    small = [s for s in exact if 0 < exact[s] * runs < 5]
    observed = [counts[s] for s in big] + ([sum(counts[s] for s in small)] if small else [])
    expected = [exact[s] * runs for s in big] + ([sum(exact[s] for s in small) * runs] if small else [])
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [e * scale for e in expected]).pvalue


@pytest.mark.parametrize("name", ["packed", "linear", "quadratic", "lookup", "packed-mixed", "partial"])
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 0.85)])
def test_matches_exact_ar_distribution(model, name, top_k, top_p):
    assert p_value(model, name, 1.0, top_k, top_p) > ALPHA


def correction_from_p(draft, stored_q, p, generator) -> Verdict:
    """verify_sampled with one fault: the correction drawn from p, not from norm([p - Q]+) (Algorithm 2, line 7)."""
    p = p.double().numpy() if isinstance(p, torch.Tensor) else np.asarray(p, dtype=float)
    for i, (token, q_i) in enumerate(zip(draft, stored_q)):
        p_token, q_token = float(p[i, token]), q_i.prob(token)
        alpha = 0.0 if p_token <= 0 else (1.0 if q_token <= 0 else min(1.0, p_token / q_token))
        if float(torch.rand((), generator=generator, dtype=torch.float64)) >= alpha:
            return Verdict(h=i, token=sample(p[i], generator), is_bonus=False)
    return Verdict(h=len(draft), token=sample(p[len(draft)], generator), is_bonus=True)


def test_the_distribution_check_rejects_a_schedule_whose_correction_ignores_the_residual(model, monkeypatch):
    """The check above can fail: Packed-SS with that fault is rejected on 500 runs at top-k 3, top-p 0.85. (Without
    top-k/top-p the fault moves this model's 4-token distribution too little for 2,000 runs to see (p about 0.04);
    the one-step checks below reject it there.)"""
    import packed_ss.schedules.base as schedules

    monkeypatch.setattr(schedules, "verify_sampled", correction_from_p)
    assert p_value(model, "packed", 1.0, 3, 0.85, runs=500) < ALPHA


def first_token_pvalue(verify, p_row, q_drawn, q_stored, draws=20000) -> float:
    """One draft token d ~ q_drawn checked against q_stored: the emitted token must follow p."""
    gen = torch.Generator().manual_seed(0)
    p = torch.stack([p_row, p_row])  # p^(1) and the bonus row
    counts = torch.zeros(len(p_row))
    for _ in range(draws):
        d = sample(q_drawn, gen)
        verdict = verify([d], [SparseDist.from_dense(q_stored)], p, gen)
        counts[d if verdict.h == 1 else verdict.token] += 1
    keep = p_row > 0
    return chisquare(counts[keep].numpy(), (p_row[keep] * draws).numpy()).pvalue


P_ROW = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
Q_ROW = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=torch.float64)


def test_one_step_rejection_sampling_is_exact():
    assert first_token_pvalue(verify_sampled, P_ROW, Q_ROW, Q_ROW) > ALPHA
    assert first_token_pvalue(verify_sampled, P_ROW, P_ROW, P_ROW) > ALPHA  # p == Q: residual all zeros


def test_a_wrong_residual_is_detected():
    """Correction drawn from p instead of norm([p - Q]+): the same check must reject."""
    assert first_token_pvalue(correction_from_p, P_ROW, Q_ROW, Q_ROW) < ALPHA


def test_a_wrong_stored_q_is_detected():
    """Draft drawn from a top-k truncated q but checked against the untruncated q: rejected."""
    truncated = torch.tensor([0.0, 0.0, 0.125, 0.875], dtype=torch.float64)
    assert first_token_pvalue(verify_sampled, P_ROW, truncated, truncated) > ALPHA
    assert first_token_pvalue(verify_sampled, P_ROW, truncated, Q_ROW) < ALPHA
