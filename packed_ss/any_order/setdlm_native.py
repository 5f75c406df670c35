"""SetDLM's native decoding as SetDLM's own ``generate`` runs it, in the engine's terms.

Ported from kuleshov-group/setdlms (``src/denoiser/setdlm.py`` ``SetDLM.generate`` and ``src/denoiser/mdlm.py``
``_sample_generation_timesteps`` and ``_generate_unconditional``, the ``predict_and_noise`` strategy its
configs use), for a prompt followed by N new positions, greedy (``do_sample: false``):

1. Timesteps: t_0..t_{S-1} = linspace(1, 0, min(T, N) + 1) in float64 without the final 0 (T =
   ``num_steps``; SetDLM's harness sets T = L = N).
2. Window: the open positions among the W positions from the first open one, W = min(the noise schedule's
   window, the engine's W = B - 1) (``min(noise.compute_window_size(), max_window_size)``), processed
   left to right: one call holds N (the tokens the previous step committed, entering the cache in textual
   order, each seeing the cache and the earlier ones) and a mask per open window position, each seeing the
   cache, N and itself. The prompt is prefilled in the first call (SetDLM spends a call of its own on it).
3. Commit: every mask takes its argmax (the mask token excluded); the k most confident are kept, k =
   round(t_i N) - round(t_next N) with t_next = t_{g+1} (``first_hitting``: g tokens generated so far, so k
   grows after a step that committed several) or t_{i+1}, and 0 past the last timestep; ties keep the later
   mask (confidences sorted ascending, all but the last k re-masked); every mask whose confidence reaches
   the threshold is kept too. Nothing is verified.
4. Stopping: no end marker stops a step. After step i > 0 with i % W == 0 the engine's stop rules (EOS, stop
   strings) are checked on the committed tokens before the window's end, as SetDLM checks its stopping
   criteria there; the run also ends when no position is open or the S steps are spent (open positions are
   then left out, as SetDLM returns its tokens without the masks). The output is then cut at its first EOS
   or stop string, as SetDLM's harness splits the decoded text at them; the tokens decoded past it stay in
   the iteration records (:func:`setdlm_sequence` gives SetDLM's own return value).
5. Context: calls crop the cache from the left to SetDLM's ``length`` (:mod:`packed_ss.any_order.session`).

Shape legend: m masks in the window, N new tokens, S timesteps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession
from packed_ss.records import SOURCE_DIFFUSION, IterationRecord, RunRecord


@dataclass(frozen=True)
class SetDLMDecoding:
    """The settings of SetDLM's generation config that change its native decoding.

    Attributes:
        first_hitting: ``generation_config.first_hitting``: the next timestep is indexed by the tokens
            generated so far + 1 (true: ``configs/generation/diffusion_generation_config.yaml``'s default) or by
            the step + 1 (false: what ``bash_scripts/run_lm_eval_harness_tput.sh`` passes for the paper's
            throughput rows, where every step then commits one token plus those over the threshold).
        num_steps: ``generation_config.num_steps`` T; None: N, the harness's T = L = max_new_tokens.
    """

    first_hitting: bool = True
    num_steps: int | None = None


def timesteps(new_tokens: int, num_steps: int | None = None) -> tuple[float, ...]:
    """t_0..t_{S-1}, S = min(T, N): ``torch.linspace(1, 0, S + 1, float64)[:-1]`` (``src/denoiser/mdlm.py``
    ``_sample_generation_timesteps``, predict_and_noise: ``min(num_steps + 1, max_length + 1)`` points)."""
    count = min((num_steps or new_tokens) + 1, new_tokens + 1)
    return tuple(torch.linspace(1.0, 0.0, count, dtype=torch.float64)[:-1].tolist())


def commit_count(steps: Sequence[float], step: int, generated: int, new_tokens: int, first_hitting: bool) -> int:
    """k = round(t_i N) - round(t_next N) (``_generate_unconditional``: ``num_to_decode``; Python's round, like
    torch's, rounds half to even). t_next: t_{g+1} with ``first_hitting`` (g = ``generated``), else t_{i+1};
    0 past the last timestep (``setdlm.py`` ``generate``)."""
    following = generated + 1 if first_hitting else step + 1
    t_next = steps[following] if following < len(steps) else 0.0
    return round(steps[step] * new_tokens) - round(t_next * new_tokens)


def setdlm_confidence(logits: torch.Tensor) -> list[float]:
    """Each row's confidence as SetDLM computes it: ``exp(x - logsumexp(x))`` in float32, its largest entry.

    In float32 a row with large logits (e.g. [90, 76.8, 76]) rounds to exactly 1.0, and SetDLM commits every such
    saturated mask at a threshold of 1.0 (its generation-config default); float64 gives 0.9999973, which does not
    reach it. Args: logits (rows, vocab). Returns: one float per row."""
    if not len(logits):
        return []
    x = logits.float()
    return torch.exp(x - torch.logsumexp(x, dim=-1, keepdim=True)).amax(-1).tolist()


def commit_rule(confidence: Sequence[float], count: int, threshold: float) -> tuple[int, ...]:
    """Indices (ascending) of the m window masks SetDLM commits (``_generate_unconditional``, predict_and_noise):
    confidences sorted ascending (stable), all but the last ``count`` re-masked, so ties keep the later mask;
    every mask whose confidence reaches ``threshold`` is kept as well."""
    ascending = sorted(range(len(confidence)), key=lambda r: confidence[r])
    remasked = set(ascending[:max(len(confidence) - count, 0)])
    return tuple(r for r in range(len(confidence)) if r not in remasked or confidence[r] >= threshold)


def setdlm_window(model, config) -> int:
    """W of SetDLM's decoder: min(the noise schedule's window, B - 1) (``generate``: ``window_size``)."""
    return min(getattr(model, "native_window", None) or config.width, config.width)


def setdlm_sequence(run: RunRecord) -> tuple[int, ...]:
    """What SetDLM's ``generate`` returns after the prompt for this run: every committed token in textual order,
    including those past the EOS the engine's output is cut at (the harness cuts the decoded text there)."""
    filled = {r.proposal_positions[k]: r.proposals[k] for r in run.records for k in r.kept}
    return tuple(filled[j] for j in sorted(filled))


def end_marker(session: OrderSession, before: int) -> tuple[int, str] | None:
    """(position, reason) of the first EOS or the last token of the first stop string among the committed
    tokens before position ``before`` (textual order, open positions skipped), or None."""
    positions = sorted(j for j in session.filled if j < before)
    eos = session.model.eos_token_id
    first_eos = next((j for j in positions if session.filled[j] == eos), None)
    marker = None if first_eos is None else (first_eos, "eos")
    stops = session.config.stop_strings
    tokens = [session.filled[j] for j in positions]
    if not stops or not any(s in session.model.decode(tokens) for s in stops):
        return marker
    for k, j in enumerate(positions):
        if marker is not None and j >= marker[0]:
            break
        if any(s in session.model.decode(tokens[:k + 1]) for s in stops):
            return j, "stop string"
    return marker


class SetDLMDiffusion:
    name = "diffusion"
    title = "Native any-order decoding (unverified)"
    summary = "SetDLM's own decoding: its timestep schedule and threshold commit tokens, unverified; not lossless."

    def __init__(self, settings: SetDLMDecoding = SetDLMDecoding()):
        self.settings = settings

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: a step commits at least one token; a call holds the tokens committed by
        the previous one (at most W) and W masks."""
        return prompt_len + config.max_new_tokens * 2 * config.width

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        new_tokens = session.config.max_new_tokens
        steps = timesteps(new_tokens, self.settings.num_steps)
        width = setdlm_window(session.model, session.config)
        generated = 0
        for step in range(len(steps)):
            session.begin()
            before = session.prompt_len + len(session.filled)
            order = tuple(j for j in range(session.left, min(session.end, session.left + width - 1) + 1)
                          if j not in session.filled)
            pairs, z, chosen = self._step(session, order, step, steps, generated)
            generated += len(pairs)
            dropped = self._stop(session, step, width, last=step == len(steps) - 1)
            appended = [j for j, _ in pairs if j in session.filled]
            yield session.record(appended, dropped, prefix_len_before=before, order=order,
                                 proposals=z, proposal_positions=order, proposal_start=order[0], kept=chosen)
            if session.finished:
                return

    def _step(self, session: OrderSession, order: tuple[int, ...], step: int, steps: Sequence[float],
              generated: int) -> tuple[list[tuple[int, int]], tuple[int, ...], tuple[int, ...]]:
        """One call over the window ``order``: commit SetDLM's choice; returns (pairs, argmax z, kept ranks)."""
        layout = order_layout("ao-setdlm", session.model.cache_length, session.pending, order, {},
                              session.model.mask_token_id, checked=0, verified=0, drafted=True,
                              prompt=session.prompt if step == 0 else ())
        rows = session.call(layout, layout.draft_rows)
        z = tuple(rows.top)
        count = commit_count(steps, step, generated, session.config.max_new_tokens, self.settings.first_hitting)
        chosen = commit_rule(setdlm_confidence(rows.logits), count, session.config.confidence_threshold)
        pairs = [(order[r], z[r]) for r in chosen]
        session.settle([])
        session.commit(pairs, [SOURCE_DIFFUSION] * len(pairs))
        session.pending += pairs  # N of the next call, textual order as SetDLM's clean rows
        return pairs, z, chosen

    @staticmethod
    def _stop(session: OrderSession, step: int, width: int, last: bool) -> list[int]:
        """SetDLM's stop rule after ``step`` (module docstring, 4): halt and cut at the first end marker; returns
        the positions the cut dropped."""
        if not session.finished:
            checked = step > 0 and step % width == 0  # setdlm.py generate: "i % window_size == 0 and i > 0"
            if checked and end_marker(session, session.left + width) is not None:
                session.halt("eos")
            elif last:
                session.halt("limit")
        if not session.finished:
            return []
        found = end_marker(session, session.end + 1)
        if found is None:
            session.stop_reason = session.stop_reason or "limit"
            return []
        return session.cut(*found)
