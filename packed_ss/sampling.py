"""Token selection and the acceptance rule shared by every schedule (pure functions).

Notation (paper Section 3.2, Algorithm 2): ``p`` is the verifier (causal mode) distribution at a
position, ``q`` the drafter (diffusion mode) distribution, and ``Q`` the drafter distribution STORED with
a draft token when it was drawn, possibly from an older prefix. A draft token ``d`` is accepted with
probability ``min(1, p(d) / Q(d))``; at the first rejection the correction token is drawn from the
normalised residual ``[p - Q]+``; after full acceptance the bonus token is drawn from ``p``.

Temperature 0 is greedy decoding (Algorithm 1): ``p`` and ``Q`` are point masses, acceptance is an exact
match with the verifier's argmax, and no randomness is consumed.

Shape legend: V vocabulary, R rows, K non-zero entries of a stored distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Residual mass below this is treated as zero: rejection then had probability ~0, so any choice is
# exact up to rounding; we fall back to p rather than normalise zeros into NaN.
RESIDUAL_FLOOR = 1e-12


@dataclass(frozen=True)
class SparseDist:
    """A drafter distribution Q kept as its non-zero entries only (paper Section 3.2, last paragraph).

    ``ids`` (K,) int64 token ids and ``probs`` (K,) float64 probabilities summing to 1, both on CPU.
    (Lookups run in NumPy over the same memory: per-token torch calls dominated sampled decoding on a CPU.)
    """

    ids: torch.Tensor
    probs: torch.Tensor
    full: bool = False  # every id 0..V-1 is in the support, in order (ids == arange(V)): direct indexing

    def prob(self, token: int) -> float:
        """Q(token); 0.0 for a token outside the support."""
        if self.full:
            return float(self.probs.numpy()[token]) if 0 <= token < len(self.probs) else 0.0
        hit = np.flatnonzero(self.ids.numpy() == token)
        return float(self.probs.numpy()[hit[0]]) if hit.size else 0.0

    def dense(self, vocab_size: int) -> torch.Tensor:
        """The full (V,) float64 vector."""
        return torch.from_numpy(self.dense_array(vocab_size).copy())

    def dense_array(self, vocab_size: int) -> np.ndarray:
        """The full (V,) float64 vector as a NumPy array (read-only when the support is full)."""
        if self.full and len(self.probs) == vocab_size:
            return self.probs.numpy()
        out = np.zeros(vocab_size, dtype=np.float64)
        out[self.ids.numpy()] = self.probs.numpy()
        return out

    @staticmethod
    def point(token: int) -> "SparseDist":
        """Point mass on ``token`` (a greedy draft, Section 3.2: Q collapses to the draft token)."""
        return SparseDist(torch.tensor([token]), torch.tensor([1.0], dtype=torch.float64))

    @staticmethod
    def from_dense(probs: torch.Tensor | np.ndarray) -> "SparseDist":
        """Keep the non-zero entries of a (V,) probability vector (torch or NumPy)."""
        values = probs.detach().double().cpu().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs, float)
        if np.count_nonzero(values) == values.size:  # T > 0 without top-k/top-p: nothing to drop, no copy
            return SparseDist(torch.arange(values.size), torch.from_numpy(values), full=True)
        ids = np.flatnonzero(values)
        return SparseDist(torch.from_numpy(ids), torch.from_numpy(values[ids]))


def warp(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Turn logits into the sampling distribution, applied alike to verifier and drafter rows.

    Args:
        logits: (R, V) raw scores.
        temperature: T >= 0; T == 0 gives a one-hot on the argmax (ties: lowest id).
        top_k: keep the k most likely tokens (0 = no limit).
        top_p: keep the smallest most-likely set with cumulative probability >= top_p (1.0 = no limit).
    Returns:
        (R, V) float64 probabilities on the input's device; truncated entries are exactly 0.
    Raises:
        ValueError: negative temperature, negative top_k, or top_p outside (0, 1].
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    # Subtract the maximum BEFORE dividing: every scaled score is then <= 0, so any finite T > 0 (down to
    # 5e-324) gives finite or -inf scores and never inf - inf = NaN; as T -> 0 the result tends to greedy.
    scores = logits.double()
    if temperature >= 1e-3:  # scores / T stays finite; softmax removes the maximum itself (fewer passes)
        scaled = scores / temperature
    else:
        scaled = (scores - scores.max(-1, keepdim=True).values) / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the most likely token always stays (mass_before == 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_rows(probs: torch.Tensor | np.ndarray, generator: torch.Generator) -> list[int]:
    """One token id per row of an (R, V) array of distributions (rows need not be normalised).

    Inverse CDF: one uniform u per row from ``generator`` (all R in one draw), the first id whose
    cumulative mass exceeds u times the row's total; an id of probability 0 is never drawn.
    (torch.multinomial gives the same law but took about 140 us per draw over 4,096 float64 entries on
    this project's CPU.) Raises: ValueError when a row has no positive mass."""
    values = probs.detach().double().cpu().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs, float)
    if not len(values):
        return []
    mass = np.cumsum(values, axis=1)  # (R, V)
    totals = mass[:, -1]
    if not (totals > 0).all():
        raise ValueError("cannot sample from a distribution without positive mass")
    u = torch.rand(len(values), generator=generator, dtype=torch.float64).numpy() * totals
    picks = (mass <= u[:, None]).sum(axis=1)  # first id whose cumulative mass exceeds u
    for r in np.flatnonzero(picks >= values.shape[1]):  # u rounded up to the total
        picks[r] = np.flatnonzero(values[r] > 0)[-1]
    return picks.tolist()


def sample(probs: torch.Tensor | np.ndarray, generator: torch.Generator) -> int:
    """Draw one token id from a (V,) distribution (need not be normalised) with the run's seeded generator,
    as :func:`sample_rows` does for one row. Raises: ValueError when it has no positive entry."""
    values = probs.detach().double().cpu().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs, float)
    if not values.size:
        raise ValueError("cannot sample from a distribution without positive mass")
    return sample_rows(values[None], generator)[0]


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one draft (Algorithm 1 lines 5-6, Algorithm 2 lines 5-8).

    ``h``: accepted draft tokens; ``token``: correction (``h < |D|``) or bonus (``h == |D|``) token;
    ``accept_probs``: alpha_i = min(1, p(d_i)/Q(d_i)) for the tested positions (empty when greedy).
    """

    h: int
    token: int
    is_bonus: bool
    accept_probs: tuple[float, ...] = ()


def verify_greedy(draft: list[int], verifier_argmax: list[int]) -> Verdict:
    """Greedy verification (Algorithm 1, lines 5-6, Equation 2).

    Args:
        draft: d, the |D| draft tokens.
        verifier_argmax: v, at least |D| + 1 verifier argmax tokens aligned with the draft positions.
    Returns:
        Verdict with h = length of the matching prefix and token = v^(h+1).
    """
    if len(verifier_argmax) < len(draft) + 1:
        raise ValueError(f"need {len(draft) + 1} verifier predictions, got {len(verifier_argmax)}")
    h = 0
    while h < len(draft) and draft[h] == verifier_argmax[h]:
        h += 1
    return Verdict(h=h, token=verifier_argmax[h], is_bonus=h == len(draft))


def verify_sampled(draft: list[int], stored_q: list[SparseDist], p: torch.Tensor | np.ndarray,
                   generator: torch.Generator) -> Verdict:
    """Rejection-sampling verification with the stored drafter distributions (Algorithm 2, lines 5-8).

    Args:
        draft: d, the |D| draft tokens.
        stored_q: Q, one SparseDist per draft token, the distribution it was drawn from.
        p: (|D| + 1, V) warped verifier distributions p^(1..|D|+1) (torch or NumPy).
    Returns:
        Verdict; the correction comes from norm([p - Q]+), the bonus from p^(|D|+1).
    Raises:
        ValueError: when the numbers of draft tokens, stored distributions and verifier rows disagree.
    """
    if len(stored_q) != len(draft) or p.shape[0] != len(draft) + 1:
        raise ValueError(f"draft {len(draft)}, stored Q {len(stored_q)}, verifier rows {p.shape[0]}")
    p = p.double().cpu().numpy() if isinstance(p, torch.Tensor) else np.asarray(p, float)  # (|D| + 1, V)
    alphas = []
    for i, (token, q_i) in enumerate(zip(draft, stored_q)):
        p_token, q_token = float(p[i, token]), q_i.prob(token)
        # A token the verifier gives zero probability is never accepted, whatever Q says; Q(d) = 0 < p(d)
        # cannot come from a draft drawn from Q, and is accepted as the ratio's limit (alpha = 1).
        alpha = 0.0 if p_token <= 0 else (1.0 if q_token <= 0 else min(1.0, p_token / q_token))
        alphas.append(alpha)
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u >= alpha:  # line 6: the first i with u_i >= alpha_i ends acceptance
            residual = np.clip(p[i] - q_i.dense_array(p.shape[1]), 0.0, None)  # line 7: [p - Q]+
            total = float(residual.sum())
            target = residual / total if total > RESIDUAL_FLOOR else p[i]
            return Verdict(h=i, token=sample(target, generator), is_bonus=False, accept_probs=tuple(alphas))
    return Verdict(h=len(draft), token=sample(p[len(draft)], generator), is_bonus=True,
                   accept_probs=tuple(alphas))
