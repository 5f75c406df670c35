"""At T > 0 every speculative schedule samples exactly the AR distribution (paper Theorem 3.3).

The first four generated tokens of a tiny model with four usable tokens (256 outcomes) are sampled
many times with one seeded generator per run; the exact AR distribution is enumerated from the model
with the same top-k/top-p warping; a chi-square goodness-of-fit test (bins with expected count < 5
pooled) must not reject at level 1e-4. A decoder whose correction ignores the stored Q fails it.
"""

import itertools

import pytest
import torch
from helpers import tiny_llama
from scipy.stats import chisquare

import packed_ss.schedules.base as base
from packed_ss import DecodeConfig, generate
from packed_ss.sampling import Verdict, sample, warp

LENGTH, RUNS, BLOCK = 4, 3000, 3
PROMPT = [2, 3]
ALPHA = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=5, seed=11, logit_scale=2.0, eos=False)


def exact_distribution(model, temperature, top_k, top_p) -> dict[tuple, float]:
    tokens = [t for t in range(model.vocab_size) if t != model.mask_token_id]
    out = {}
    with torch.no_grad():
        for seq in itertools.product(tokens, repeat=LENGTH):
            ids = torch.tensor([PROMPT + list(seq)])
            logits = model.model(input_ids=ids).logits[0, len(PROMPT) - 1: -1]
            p = warp(logits, temperature, top_k, top_p)
            out[seq] = float(torch.prod(p[torch.arange(LENGTH), torch.tensor(seq)]))
    return out


def p_value(model, name, temperature, top_k, top_p) -> float:
    exact = exact_distribution(model, temperature, top_k, top_p)
    counts = dict.fromkeys(exact, 0)
    for seed in range(RUNS):
        config = DecodeConfig(block_size=BLOCK, temperature=temperature, top_k=top_k, top_p=top_p,
                              max_new_tokens=LENGTH, seed=seed)
        counts[generate(model, PROMPT, config, name).token_ids] += 1
    big = [s for s in exact if exact[s] * RUNS >= 5]
    small = [s for s in exact if exact[s] * RUNS < 5]
    observed = [counts[s] for s in big] + [sum(counts[s] for s in small)]
    expected = [exact[s] * RUNS for s in big] + [sum(exact[s] for s in small) * RUNS]
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [e * scale for e in expected]).pvalue


@pytest.mark.parametrize("name", ["packed", "linear", "quadratic"])
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 0.85)])
def test_matches_exact_ar_distribution(model, name, top_k, top_p):
    assert p_value(model, name, 1.0, top_k, top_p) > ALPHA


def test_a_wrong_residual_is_detected(model, monkeypatch):
    """Correction drawn from p instead of norm([p - Q]+): the same test must reject."""

    def wrong(draft, stored_q, p, generator):
        p = p.double().cpu()
        for i, (token, q_i) in enumerate(zip(draft, stored_q)):
            alpha = min(1.0, float(p[i, token]) / q_i.prob(token))
            if float(torch.rand((), generator=generator, dtype=torch.float64)) >= alpha:
                return Verdict(h=i, token=sample(p[i], generator), is_bonus=False)
        return Verdict(h=len(draft), token=sample(p[len(draft)], generator), is_bonus=True)

    monkeypatch.setattr(base, "verify_sampled", wrong)
    assert p_value(model, "packed", 1.0, 0, 1.0) < ALPHA
