"""The any-order model's own parallel decoding, unverified: the ``diffusion`` lane.

A SetDLM checkpoint (``model.native_decoding == "setdlm"``) decodes as SetDLM's own ``generate`` does
(:mod:`packed_ss.any_order.setdlm_native`: its timestep schedule, window and stop rule). Other any-order
models (the project's own) keep the threshold rule below, the paper's E.6 description of native decoding.

Threshold rule: each call holds N (tokens accepted by the previous call, entering the cache) and a mask at every
unresolved position of the window, each seeing only the accepted tokens. Every prediction with
probability >= ``config.confidence_threshold`` is committed, and at least the most confident one (ties:
the leftmost), in any textual order and without verification, so the output can differ from the
model's left-to-right decoding: the lane shows what speed without a verifier costs on this model.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession
from packed_ss.any_order.setdlm_native import SetDLMDiffusion
from packed_ss.records import SOURCE_DIFFUSION, IterationRecord


class ThresholdDiffusion:
    name = "diffusion"
    title = "Native any-order decoding (unverified)"
    summary = "Commits every confident prediction in the window, in any order; not lossless."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: at least one token per call; a call holds the tokens accepted by
        the previous one (at most W) and W masks."""
        return prompt_len + config.max_new_tokens * 2 * config.width

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        mask_id, threshold = session.model.mask_token_id, session.config.confidence_threshold
        first = True
        while not session.finished:
            session.begin()
            before = session.prompt_len + len(session.filled)
            order = tuple(session.window())
            layout = order_layout("ao-diffusion", session.model.cache_length, session.pending, order, {}, mask_id,
                                  checked=0, verified=0, drafted=True, prompt=session.prompt if first else ())
            rows = session.call(layout, layout.draft_rows)
            z, conf = rows.top, session.top_probs(rows)
            best = max(range(len(order)), key=lambda r: (conf[r], -r))
            chosen = [r for r in range(len(order)) if conf[r] >= threshold or r == best]
            pairs = [(order[r], z[r]) for r in chosen]
            session.settle([])
            appended, dropped = session.accept(pairs, [SOURCE_DIFFUSION] * len(pairs))
            session.pending += [(j, session.filled[j]) for j in appended]
            yield session.record(appended, dropped, prefix_len_before=before, order=order,
                                 proposals=z, proposal_positions=order, proposal_start=order[0], kept=tuple(chosen))
            first = False


class OrderDiffusion:
    """The ``diffusion`` lane: the model's own native rule (``model.native_decoding``; module docstring)."""

    name = "diffusion"
    title = "Native any-order decoding (unverified)"
    summary = "The model's own parallel decoding (SetDLM's for its checkpoints), in any order; not lossless."
    rules = {"threshold": ThresholdDiffusion(), "setdlm": SetDLMDiffusion()}

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate (the same bound under both rules)."""
        return ThresholdDiffusion.max_rows(prompt_len, config)

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        return self.rules[getattr(session.model, "native_decoding", "threshold")].iterate(session)
