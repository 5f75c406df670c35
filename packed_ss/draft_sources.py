"""Choosing where each next-draft token comes from: the diffusion drafter or an n-gram match (pure functions).

Packed-SS's next draft D_t normally holds the drafter's proposals z_t^(A+1..W), made from the old prefix
P_{t-1} in the same call that verified D_{t-1} (Algorithm 1 line 10). Once that call has returned, P_t is
known, so an n-gram match in P_t (prompt lookup, :func:`packed_ss.schedules.lookup.ngram_match`) costs no
model call and may reach further: up to W tokens. This module decides, position by position and before
the call that will verify the draft, which source to take:

* the drafter's token at draft position i is judged by its confidence: max_x q_i(x), the probability its
  (warped) distribution gives its most likely token, independent of the token actually drawn;
* an n-gram token is judged by the run's acceptance rate of earlier n-gram tokens with the same match
  length n (Laplace estimate (accepted + 1) / (tested + 2), counted from the verifications so far);
* an n-gram token at position i only continues the text it was copied from, so it is a candidate only
  while every chosen token before it equals the n-gram's own; the higher score wins, ties go to the
  n-gram token (it needs no drafter row).

Losslessness: every choice depends only on P_t, on past verifications and on the draft tokens chosen
before position i, never on the token drawn at i. So the token at i is distributed as the stored Q of its
source: the drafter's warped q_i for a drafter token, a point mass for an n-gram token (a deterministic
function of P_t), and Algorithm 2's acceptance test min(1, p/Q) with residual [p - Q]+ stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SOURCE_DRAFTER = "drafter"  # a diffusion proposal z_t
SOURCE_NGRAM = "n-gram"  # copied from the text after an earlier match of the prefix's last n tokens


@dataclass(frozen=True)
class NgramRates:
    """Acceptance counts of n-gram draft tokens in one run, by match length n (index n; index 0 unused).

    ``accepted[n]`` n-gram tokens of match length n were accepted out of ``tested[n]`` the verifier
    reached (a token after the first rejection is not tested).
    """

    accepted: tuple[int, ...]
    tested: tuple[int, ...]

    @staticmethod
    def empty(max_ngram: int) -> "NgramRates":
        return NgramRates((0,) * (max_ngram + 1), (0,) * (max_ngram + 1))

    def rate(self, n: int) -> float:
        """Estimated probability that an n-gram token of match length n is accepted (prior 1/2)."""
        return (self.accepted[n] + 1) / (self.tested[n] + 2)

    def updated(self, sources: Sequence[str], n: int, h: int) -> "NgramRates":
        """Counts after verifying a draft with these ``sources`` (one per token) whose n-gram tokens had
        match length ``n``, of which the first ``h`` tokens were accepted. Positions 0..h were tested."""
        reached = sources[: h + 1]
        tested = sum(s == SOURCE_NGRAM for s in reached)
        accepted = sum(s == SOURCE_NGRAM for s in reached[:h])
        if not tested:
            return self
        acc, tst = list(self.accepted), list(self.tested)
        acc[n] += accepted
        tst[n] += tested
        return NgramRates(tuple(acc), tuple(tst))


def mix_sources(drafter: Sequence[int], confidence: Sequence[float], gram: Sequence[int],
                gram_rate: float) -> list[str]:
    """The source of each next-draft position (module docstring's rule).

    Args:
        drafter: the drafter's tokens for the next draft positions (W - A of them, Packed-SS's D_t).
        confidence: max_x q_i(x) for each of them, in [0, 1].
        gram: the n-gram match's tokens for the same positions onward (up to W), empty without a match.
        gram_rate: estimated acceptance probability of an n-gram token of this match's length.
    Returns:
        One of SOURCE_DRAFTER / SOURCE_NGRAM per draft position, max(len(drafter), len(gram)) long at
        most; shorter when the n-gram no longer continues the chosen tokens past the drafter's last one.
    Raises:
        ValueError: when ``confidence`` does not have one value per drafter token.
    """
    if len(confidence) != len(drafter):
        raise ValueError(f"{len(drafter)} drafter tokens but {len(confidence)} confidences")
    sources: list[str] = []
    gram_alive = True  # every chosen token so far equals the n-gram's own
    for i in range(max(len(drafter), len(gram))):
        gram_ok = gram_alive and i < len(gram)
        drafter_ok = i < len(drafter)
        if gram_ok and (not drafter_ok or gram_rate >= confidence[i]):
            sources.append(SOURCE_NGRAM)
        elif drafter_ok:
            sources.append(SOURCE_DRAFTER)
            gram_alive = gram_ok and drafter[i] == gram[i]
        else:
            break
    return sources
