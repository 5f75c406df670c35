"""Scripted drafter for teaching: the real verifier, a drafter whose quality is one number.

Every call runs the real model (so calls, rows and times are counted as for the real drafter); then the
logits of each proposal row are replaced. A proposal for absolute position ``pos``, made by a row whose
last visible non-mask token sits at position ``last``, is at offset ``k = pos - last`` (1 = the next
token). It is the AR greedy reference token at ``pos`` when the row's visible tokens agree with the
reference and ``u[pos] < quality ** k``, and a wrong token otherwise. ``u`` is one seeded uniform draw
per position, so with more verified context (smaller k) the set of correct proposals only grows: the
drafter is monotone (paper Assumption 3.1) on every run, not only on average, and Theorem 3.2
(Packed-SS never needs more calls than Linear-SS) can be watched holding.

The reference is AR's greedy output for the prompt (computed once per run); at T > 0 the verified
prefix leaves it, and the scripted proposals then simply stop being accepted, as a poor drafter's would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from packed_ss.layout import CallLayout
from packed_ss.models.adapter import CallOutput

SCRIPTED_LOGIT = 30.0  # logit of the scripted proposal; every other id gets 0 (a near point mass)


class ScriptedDrafter:
    """A :class:`~packed_ss.models.DualModeModel` whose drafter rows follow a script (see module docstring).

    Args:
        base: the real model (its own adapter: this wrapper drives its cache).
        reference: prompt + AR greedy output token ids, by absolute position.
        quality: q in [0, 1]; the proposal at offset k is right with probability q**k.
        seed: seed of the per-position draws u.
    Raises: ValueError for a quality outside [0, 1].
    """

    supports_deferred_rows = False  # every row's logits come back, so proposal rows can be rewritten

    def __init__(self, base, reference: Sequence[int], quality: float, seed: int = 0):
        if not 0.0 <= quality <= 1.0:
            raise ValueError(f"drafter quality must be in [0, 1], got {quality}")
        self.base, self.reference, self.quality = base, list(reference), float(quality)
        generator = torch.Generator().manual_seed(seed)
        self._u = torch.rand(len(self.reference) + 4096, generator=generator).tolist()  # one draw per position
        for name in ("tokenizer", "mask_token_id", "eos_token_id", "bos_token_id", "vocab_size", "never_emit_ids",
                     "max_length", "device", "dtype", "drafter_lora", "adapter_note", "family"):
            setattr(self, name, getattr(base, name, None))
        self.model = base.model
        self._never = set(self.never_emit_ids or (self.mask_token_id,))

    # the adapter interface, delegated
    @property
    def cache_length(self) -> int:
        return self.base.cache_length

    def reset(self) -> None:
        self.base.reset()

    def rollback(self, keep: int) -> None:
        self.base.rollback(keep)

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.base.decode(ids)

    def token_strings(self, ids: list[int]) -> list[str]:
        return self.base.token_strings(ids)

    def forward(self, layout: CallLayout, rows: tuple[int, ...], deferred: tuple[int, ...] = (),
                adapter_rows: tuple[int, ...] = ()) -> CallOutput:
        """The real call, then the proposal rows among ``rows`` rewritten by the script."""
        out = self.base.forward(layout, rows, **({"adapter_rows": adapter_rows} if adapter_rows else {}))
        proposal = set(layout.proposal_rows)
        logits = out.logits.clone()
        for i, r in enumerate(rows):
            if r in proposal and layout.token_ids[r] == self.mask_token_id:
                logits[i] = 0.0
                logits[i, self.proposal(layout, r)] = SCRIPTED_LOGIT
        return CallOutput(logits, out.model_ms)

    def proposal(self, layout: CallLayout, row: int) -> int:
        """The scripted token of mask row ``row``: the reference token, or a wrong one (module docstring)."""
        pos = layout.position_ids[row]
        seen = [(layout.position_ids[k], t) for k, t in enumerate(layout.token_ids)
                if layout.mask[row, k] and t != self.mask_token_id]
        last = max((p for p, _ in seen), default=layout.cached - 1)
        agrees = all(p < len(self.reference) and self.reference[p] == t for p, t in seen)
        right = self.reference[pos] if pos < len(self.reference) else None
        if right is not None and agrees and self._u[pos] < self.quality ** (pos - last):
            return right
        return self._wrong(right)

    def _wrong(self, right: int | None) -> int:
        """A token other than ``right`` that a schedule may output."""
        candidate = 0 if right is None else (right + 1) % self.vocab_size
        while candidate in self._never or candidate == right:
            candidate = (candidate + 1) % self.vocab_size
        return candidate


def scripted_drafter(model, prompt_ids: Sequence[int], config, quality: float, seed: int = 0) -> ScriptedDrafter:
    """A :class:`ScriptedDrafter` over its own adapter of ``model`` for one run of ``config`` on
    ``prompt_ids``: the reference is AR's greedy output, B tokens longer than the run's limit.

    Raises: ValueError for a quality outside [0, 1]; PromptError for an empty or too long prompt.
    """
    from dataclasses import replace

    from packed_ss.engine import generate

    reference_config = replace(config, temperature=0.0, max_new_tokens=config.max_new_tokens + config.block_size,
                               drafter_lora=False)
    reference = generate(model.share(), list(prompt_ids), reference_config, "ar").token_ids
    return ScriptedDrafter(model.share(), list(prompt_ids) + list(reference), quality, seed)
