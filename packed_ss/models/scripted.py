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

With ``follow`` (greedy runs whose verifier may part from AR's output at a near-tie: bfloat16 calls of other row
counts), the reference follows the run instead: once the verified prefix leaves it, the rest of the reference is
AR's greedy continuation of that prefix (``follow``: :func:`packed_ss.engine.ar_continuation`, the real model),
so that acceptance stays a function of the quality alone. Each continuation is kept in ``anchors`` by its prefix: a
second run of the same lane (a timed run after an untimed one) reuses it and computes nothing. ``anchor_s`` says
how long the continuations took (decoder time outside the model calls of the run; ``anchor_calls`` how many calls).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
        follow: ``(verified prefix, n) -> (AR's greedy continuation of it, at most n tokens; model calls made)``
            (:func:`packed_ss.engine.ar_continuation`), or None: the reference stays AR's output for the prompt.
        anchors: the continuations made so far, by prefix (shared with an earlier drafter of the same script).
    Raises: ValueError for a quality outside [0, 1].
    """

    supports_deferred_rows = False  # every row's logits come back, so proposal rows can be rewritten

    def __init__(self, base, reference: Sequence[int], quality: float, seed: int = 0,
                 follow: Callable[[list[int], int], tuple[list[int], int]] | None = None, anchors: dict | None = None):
        if not 0.0 <= quality <= 1.0:
            raise ValueError(f"drafter quality must be in [0, 1], got {quality}")
        self.base, self.reference, self.quality = base, list(reference), float(quality)
        self.first_reference = list(reference)
        self.follow = follow
        self.anchors = {} if anchors is None else anchors  # verified prefix (tuple) -> the reference that follows it
        self.anchor_s, self.anchor_calls, self.anchored = 0.0, 0, 0  # time, calls and count of continuations made
        self._tokens: list[int] = []  # with follow: the token id in each cache slot (verified prefix, call's rows)
        self._agreed = 0  # with follow: the verified tokens already found to agree with the reference
        generator = torch.Generator().manual_seed(seed)
        # one draw per position, in float32 whatever torch's default dtype is (another thread's model load sets it)
        self._u = torch.rand(len(self.reference) + 4096, generator=generator, dtype=torch.float32).tolist()
        for name in ("tokenizer", "mask_token_id", "eos_token_id", "bos_token_id", "vocab_size", "never_emit_ids",
                     "max_length", "device", "dtype", "drafter_lora", "adapter_note", "family", "pads_drafts"):
            setattr(self, name, getattr(base, name, None))
        self.model = base.model
        self._never = set(self.never_emit_ids or (self.mask_token_id,))

    # the adapter interface, delegated
    @property
    def cache_length(self) -> int:
        return self.base.cache_length

    def reset(self, tokens: int = 0, block_size: int | None = None) -> None:
        self.base.reset(tokens, block_size)
        self._tokens, self._agreed = [], 0
        self.reference = list(self.first_reference)

    def rollback(self, keep: int) -> None:
        self.base.rollback(keep)
        del self._tokens[keep:]

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.base.decode(ids)

    def token_strings(self, ids: list[int]) -> list[str]:
        return self.base.token_strings(ids)

    def forward(self, layout: CallLayout, rows: tuple[int, ...], deferred: tuple[int, ...] = (),
                adapter_rows: tuple[int, ...] = ()) -> CallOutput:
        """The real call, then the proposal rows among ``rows`` rewritten by the script (vectorised: the
        rewrite is non-model decoder time, and Quadratic-SS calls hold B(B+1) rows)."""
        out = self.base.forward(layout, rows, **({"adapter_rows": adapter_rows} if adapter_rows else {}))
        if self.follow:  # only a following drafter keeps the cache's tokens (non-model time of every call)
            del self._tokens[layout.cached:]
            self._follow()
            self._tokens.extend(layout.token_ids)
        proposal = set(layout.proposal_rows)
        picked = [(i, r) for i, r in enumerate(rows) if r in proposal and layout.token_ids[r] == self.mask_token_id]
        if not picked:
            return out
        logits = out.logits.clone()
        tokens = self.proposals(layout, [r for _, r in picked])
        index = torch.tensor([i for i, _ in picked], device=logits.device)
        logits[index] = 0.0
        logits[index, torch.tensor(tokens, device=logits.device)] = SCRIPTED_LOGIT
        return CallOutput(logits, out.model_ms, recorded_ms=out.recorded_ms)

    def proposals(self, layout: CallLayout, rows: Sequence[int]) -> list[int]:
        """The scripted token of each mask row in ``rows``: the reference token, or a wrong one (module
        docstring). Shapes: K keys of the call, n rows asked for."""
        tokens = torch.tensor(layout.token_ids)  # (K,)
        positions = torch.tensor(layout.position_ids)  # (K,)
        reference = torch.tensor(self.reference + [-1])  # -1: past the reference
        refs = reference[positions.clamp(max=len(self.reference))]  # (K,) reference token at each key's position
        filled = tokens != self.mask_token_id
        visible = layout.mask[list(rows)] & filled  # (n, K) non-mask keys each row sees
        last = torch.where(visible, positions, layout.cached - 1).max(dim=1).values  # (n,)
        disagrees = (visible & (refs != tokens)).any(dim=1)  # a seen token is not the reference's
        out = []
        for row, lo, bad in zip(rows, last.tolist(), disagrees.tolist()):
            pos = layout.position_ids[row]
            right = self.reference[pos] if pos < len(self.reference) else None
            ok = right is not None and not bad and self._u[pos] < self.quality ** (pos - lo)
            out.append(right if ok else self._wrong(right))
        return out

    def _follow(self) -> None:
        """With ``follow``: where the verified prefix (the cache's tokens) has left the reference, make the reference
        that prefix and AR's greedy continuation of it, as long as the reference was (kept in ``anchors``). Only the
        tokens verified since the last check are compared."""
        verified = self._tokens
        self._agreed = min(self._agreed, len(verified))
        if len(verified) >= len(self.reference) or \
                verified[self._agreed:] == self.reference[self._agreed:len(verified)]:
            self._agreed = len(verified)
            return
        key = tuple(verified)
        if key not in self.anchors:
            import time

            started = time.perf_counter()
            continuation, calls = self.follow(list(verified), len(self.first_reference) - len(verified))
            self.anchors[key] = list(verified) + list(continuation)
            self.anchor_calls += calls
            self.anchor_s += time.perf_counter() - started
            self.anchored += 1
        self.reference = list(self.anchors[key])
        self._agreed = len(verified)

    def _wrong(self, right: int | None) -> int:
        """A token other than ``right`` that a schedule may output."""
        candidate = 0 if right is None else (right + 1) % self.vocab_size
        while candidate in self._never or candidate == right:
            candidate = (candidate + 1) % self.vocab_size
        return candidate
