"""Native block diffusion: no verifier; the drafter fills a block over several calls.

Each block of W positions follows the verified prefix. Each call evaluates ``[P^(n), slots]`` in
diffusion mode (uncached prefix rows before it in causal mode) and commits every still-masked slot
whose prediction has probability >= the confidence threshold, and at least the most confident one.
When the block is full its tokens are appended without any check, so the output can differ from AR:
this lane shows what speed without verification costs.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from packed_ss.layout import diffusion_layout
from packed_ss.records import SOURCE_DIFFUSION, IterationRecord
from packed_ss.sampling import sample, warp
from packed_ss.schedules.base import Session


class Diffusion:
    name = "diffusion"
    title = "Block diffusion"
    summary = "Fills a block over several confident steps, no verification: fast but not lossless."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: at least one slot is committed per call (at most L calls); a call
        holds the uncached prefix tail (the prompt, or a finished block of W plus one token) and W slots."""
        w = config.width
        return prompt_len + w + (config.max_new_tokens - 1) * (2 * w + 1)

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        c = session.config
        mask_id = session.model.mask_token_id
        block: list[int | None] = []
        while not session.finished:
            session.begin()
            if not block:
                block = [None] * min(c.width, c.max_new_tokens - session.generated)
            before, old = len(session.prefix), tuple(mask_id if t is None else t for t in block)
            tail = session.prefix[session.cached:]
            layout = diffusion_layout(tail, list(old), session.cached)
            logits = session.call(layout, layout.draft_rows)
            probs = (torch.from_numpy(logits.probs) if logits.probs is not None  # T > 0: warped with the call
                     else warp(logits.logits, 1.0, c.top_k, c.top_p).cpu())
            if c.greedy:
                tokens = probs.argmax(-1)
            else:
                tokens = torch.tensor([sample(row, session.generator) for row in probs])
            confidence = probs.gather(-1, tokens[:, None])[:, 0]
            open_slots = [i for i, t in enumerate(block) if t is None]
            chosen = [i for i in open_slots if confidence[i] >= c.confidence_threshold]
            if not chosen:
                chosen = [max(open_slots, key=lambda i: float(confidence[i]))]
            for i in chosen:
                block[i] = int(tokens[i])
            appended: list[int] = []
            if all(t is not None for t in block):
                appended, _ = session.commit(list(block), [SOURCE_DIFFUSION] * len(block))
                block = []
            session.rollback(before - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=old, proposals=tuple(tokens.tolist()), proposal_start=before,
                                 kept=tuple(sorted(chosen)), appended=tuple(appended),
                                 appended_sources=(SOURCE_DIFFUSION,) * len(appended))
