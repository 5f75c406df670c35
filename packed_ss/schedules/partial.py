"""Partial-branch SS: Packed-SS's call plus k of Quadratic-SS's branches (between the two; paper Section 5).

Each call verifies D_{t-1} in causal mode, drafts from P_{t-1} in a diffusion half as Packed-SS does, and
prepares k continuation branches as Quadratic-SS does, for the k acceptance lengths h judged most likely
(:func:`likely_lengths`). If the verification's h is one of them, that branch's proposals (conditioned on
the accepted draft tokens) form D_t, W tokens long; otherwise Packed-SS's z_t^(A+1..W) do. Every choice is
made before the call from values known then, and each draft token keeps the distribution it was drawn from,
so the schedule is lossless (greedy equal to AR, exact sampling at T > 0).

k per call: ``config.branches`` when >= 0; with -1 (auto) the k in 0..|D| + 1 that maximises the expected
tokens per millisecond (Ā + g P_hit(k)) / (tau + delta rows(k)), where tau + delta rows is the model's
fitted call cost on this machine (:func:`packed_ss.cost.call_cost`), P_hit(k) the chance that h lands on
one of the k branches, Ā the run's mean A after a Packed-SS draft and g the run's extra A after a branch
draft (both running means with a prior of 2 pseudo-iterations at A = 1 and A = 2).
Rows per call: v + B + kB (v = B padded, 1 + |D| unpadded); B(k + 2) when padded (Table 2 style).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from packed_ss.cost import call_cost
from packed_ss.layout import partial_layout, prefill_layout
from packed_ss.records import SOURCE_PREFILL, IterationRecord
from packed_ss.schedules.base import Session

PRIOR_WEIGHT = 2.0  # pseudo-iterations behind each running mean
PRIOR_A_PACKED, PRIOR_A_BRANCH = 1.0, 2.0  # prior mean A after a Packed-SS draft / after a branch draft


def length_probabilities(confidence: Sequence[float]) -> list[float]:
    """P(h = j), j = 0..|D|, if draft token i is accepted with probability ``confidence[i]``, independently:
    prod_{i<j} c_i * (1 - c_j), and prod of all for j = |D| (pure; sums to 1)."""
    out, reach = [], 1.0
    for c in confidence:
        out.append(reach * (1.0 - c))
        reach *= c
    return out + [reach]


def likely_lengths(confidence: Sequence[float], k: int) -> tuple[int, ...]:
    """The k most likely acceptance lengths (ties: the shorter), ascending."""
    probs = length_probabilities(confidence)
    ranked = sorted(range(len(probs)), key=lambda j: (-probs[j], j))
    return tuple(sorted(ranked[:k]))


def choose_k(confidence: Sequence[float], verify_rows: int, block: int, cost, mean_a: float, gain: float) -> int:
    """The k in 0..|D| + 1 maximising (mean_a + gain * P_hit(k)) / cost.ms(verify_rows + block * (1 + k))."""
    probs = sorted(length_probabilities(confidence), reverse=True)
    best, best_value, hit = 0, -1.0, 0.0
    for k in range(len(probs) + 1):
        hit = sum(probs[:k])
        value = (mean_a + gain * hit) / cost.ms(verify_rows + block * (1 + k))
        if value > best_value + 1e-12:
            best, best_value = k, value
    return best


class PartialSS:
    name = "partial"
    title = "Partial-branch SS"
    summary = "Packed-SS's call plus k of Quadratic-SS's branches (the likeliest h); k from the cost model."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: prefill + B masks, then at most L - 1 calls of B(B + 2) rows."""
        b = config.block_size
        return prompt_len + b + (config.max_new_tokens - 1) * b * (b + 2)

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        mask_id, width, config = session.model.mask_token_id, session.config.width, session.config
        block = width + 1
        pad = getattr(session.model, "pads_drafts", True)
        cost = call_cost(session.model) if config.branches < 0 else None
        draft: list[int] = []
        stored_q, conf = [], []
        sums = {"packed": [PRIOR_A_PACKED * PRIOR_WEIGHT, PRIOR_WEIGHT],
                "branch": [PRIOR_A_BRANCH * PRIOR_WEIGHT, PRIOR_WEIGHT]}
        origin = "packed"  # where the draft under verification came from
        first = True
        while not session.finished:
            session.begin()
            before, old_draft = len(session.prefix), tuple(draft)
            if first:  # Appendix E.2: prefill + W + 1 masks
                layout = prefill_layout(session.prefix, width + 1, mask_id)
                branches: tuple[int, ...] = ()
            else:
                mean_p = sums["packed"][0] / sums["packed"][1]
                gain = max(0.0, sums["branch"][0] / sums["branch"][1] - mean_p)
                verify = block if pad else 1 + len(draft)
                k = (min(config.branches, len(draft) + 1) if cost is None
                     else choose_k(conf, verify, block, cost, mean_p, gain))
                branches = likely_lengths(conf, k)
                layout = partial_layout(session.prefix[-1], draft, width, session.cached, mask_id, branches, pad=pad)
            branch_rows = tuple(r for rows in layout.branch_rows for r in rows)
            logits = session.call(layout, layout.verify_rows + layout.draft_rows, deferred=branch_rows)
            n_verify = len(layout.verify_rows)
            verdict, v, v_probs = session.verify(draft, stored_q, logits[:n_verify])
            tokens, sources = session.verdict_tokens(draft, verdict)
            if first:
                sources = [SOURCE_PREFILL]
            else:
                sums[origin][0] += verdict.h + 1
                sums[origin][1] += 1
            appended, sources = session.commit(tokens, sources)
            a = len(appended)
            if verdict.h in branches:  # Quadratic-SS's branch h: its first mask is the correction slot
                j = branches.index(verdict.h)
                q_rows = session.deferred_logits(j * block, (j + 1) * block)
                start, skip, origin = before + verdict.h, 1, "branch"
            else:  # Packed-SS's drafter half: z_t^(A+1..W)
                q_rows = logits[n_verify:]
                start, skip, origin = before, a, "packed"
            proposals = list(q_rows.top)
            kept: tuple[int, ...] = ()
            if not session.finished:
                draft, stored_q = session.propose(q_rows[skip:])
                conf = session.confidence(q_rows[skip:])
                proposals[skip:] = draft
                kept = tuple(range(skip, len(proposals)))
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=old_draft, verifier_tokens=v, verifier_probs=v_probs,
                                 accept_probs=verdict.accept_probs, proposals=tuple(proposals),
                                 proposal_start=start, kept=kept, h=verdict.h,
                                 appended=tuple(appended), appended_sources=tuple(sources),
                                 branches=branches)
            first = False
