"""Training batches of the any-order (SetDLM-style) model: random generation orders over the corpus.

Paper Appendix D.2 (after SetDLM's construction): every output position is represented twice, by its
token and by a mask, both with the same position id, so one forward over ``[tokens | masks]`` (2S rows,
position ids 0..S-1 twice) gives the model's prediction at each position conditioned on the tokens
earlier in a generation order:

* a token row at position i sees the token rows at or before i in the order (the way accepted tokens
  enter the KV cache during decoding: in acceptance order);
* the order is cut into consecutive groups; a mask row sees the token rows of earlier groups and
  itself, never its own token or later ones, and predicts the token at its own position (the loss is
  on mask rows only).

Groups of one give the any-order conditionals of Equation 8 (the verifier; in textual order they are
plain left-to-right decoding); longer groups give parallel predictions from a shared context (the
drafter's proposals at the unresolved positions, Algorithm 3 line 8). Orders follow decoding: a prefix
in textual order (the prompt), then each position's key is its index plus uniform noise in
``[0, order_span)``, so tokens are shuffled locally, as a window of W positions verified by confidence is.

Shape legend: N batch, S sequence length, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

LTR_SHARE = 0.25  # share of examples decoded in textual order (the ltr policy and the model's own AR)
SINGLE_GROUP_SHARE = 0.5  # share of groups of one position (verifier conditionals); the rest draft in parallel


def generation_ranks(seq: int, prompt: int, span: int, rng: np.random.Generator) -> np.ndarray:
    """Rank of each position in a generation order: textual for the first ``prompt`` positions, then
    sorted by index + U[0, span) (span 0: textual everywhere). Returns: int array (S,), a permutation."""
    keys = np.arange(seq, dtype=np.float64)
    if span > 0:
        keys[prompt:] += rng.uniform(0, span, seq - prompt)
    ranks = np.empty(seq, dtype=np.int64)
    ranks[np.argsort(keys, kind="stable")] = np.arange(seq)
    return ranks


def group_starts(seq: int, max_group: int, rng: np.random.Generator) -> np.ndarray:
    """Cut ranks 0..S-1 into consecutive groups; returns for each rank the first rank of its group (S,)."""
    starts = np.empty(seq, dtype=np.int64)
    r = 0
    while r < seq:
        size = 1 if rng.random() < SINGLE_GROUP_SHARE else int(rng.integers(2, max_group + 1))
        starts[r: r + size] = r
        r += size
    return starts


def order_mask(ranks: np.ndarray, starts: np.ndarray) -> torch.Tensor:
    """(2S, 2S) bool attention of one ``[tokens | masks]`` example (True = may attend).

    Args: ranks (S,) generation rank of each position; starts (S,) first rank of each rank's group.
    Token row i: token rows j with rank_j <= rank_i. Mask row i: token rows j with rank_j < the start of
    i's group, and itself.
    """
    seq = len(ranks)
    group = starts[ranks]  # (S,) first rank of the group holding each position
    tokens = ranks[None, :] <= ranks[:, None]
    masks = ranks[None, :] < group[:, None]
    full = np.zeros((2 * seq, 2 * seq), dtype=bool)
    full[:seq, :seq] = tokens
    full[seq:, :seq] = masks
    full[np.arange(seq, 2 * seq), np.arange(seq, 2 * seq)] = True
    return torch.from_numpy(full)


def make_order_batch(stream: np.ndarray, seq: int, batch: int, span: int, max_group: int, mask_id: int,
                     rng: np.random.Generator):
    """One batch: ``(input_ids (N, 2S), position_ids (N, 2S), mask (N, 1, 2S, 2S), targets (N, S),
    single (N, S) bool)``; ``single`` marks mask rows in a group of one (logged apart from the others)."""
    inputs, masks, targets, single = [], [], [], []
    for _ in range(batch):
        start = int(rng.integers(0, len(stream) - seq))
        tokens = stream[start: start + seq].astype(np.int64)
        ltr = rng.random() < LTR_SHARE
        ranks = generation_ranks(seq, int(rng.integers(0, seq)), 0 if ltr else span, rng)
        starts = group_starts(seq, max_group, rng)
        inputs.append(np.concatenate([tokens, np.full(seq, mask_id, dtype=np.int64)]))
        masks.append(order_mask(ranks, starts))
        targets.append(tokens)
        sizes = np.bincount(starts, minlength=seq)  # group size, indexed by the group's first rank
        single.append(sizes[starts[ranks]] == 1)
    positions = torch.arange(seq).repeat(2)[None].expand(batch, -1)
    return (torch.from_numpy(np.stack(inputs)), positions, torch.stack(masks)[:, None],
            torch.from_numpy(np.stack(targets)), torch.from_numpy(np.stack(single)))


def order_losses(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy (nats) of the mask rows in groups of one and in larger groups, from one forward."""
    input_ids, position_ids, mask, targets, single = batch
    seq = targets.shape[1]
    logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask).logits[:, seq:]
    each = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    single = single.reshape(-1)
    return each[single].mean(), each[~single].mean()


@torch.no_grad()
def evaluate_order(model, stream: np.ndarray, mask_id: int, block: int = 8, windows: int = 64,
                   seq: int = 256) -> dict:
    """Held-out figures of the any-order model, on windows of ``seq`` tokens at fixed random offsets.

    * ``ltr_loss`` / ``ltr_top1``: mask rows that see every earlier token (left-to-right conditionals,
      the verifier in textual order);
    * ``draft_top1``: a group of ``block - 1`` masks after a textual prefix (parallel drafting), top-1
      against the corpus per offset 1..B-1;
    * ``draft_greedy_match``: the same proposals against the model's own left-to-right greedy chain from
      that prefix (what ltr verification accepts), per offset, and ``draft_accept_len``, the mean
      number of leading proposals that match it.
    """
    was_training = model.training
    model.eval()
    rng = np.random.default_rng(4321)
    loss, hits, count = 0.0, 0, 0
    width = block - 1
    top1, match, blocks, accepted = np.zeros(width), np.zeros(width), 0, 0
    for _ in range(windows):
        start = int(rng.integers(0, len(stream) - seq))
        tokens = torch.from_numpy(stream[start: start + seq].astype(np.int64))
        ranks = np.arange(seq)
        ids = torch.cat([tokens, torch.full((seq,), mask_id)])[None]
        pos = torch.arange(seq).repeat(2)[None]
        logits = model(input_ids=ids, position_ids=pos,
                       attention_mask=order_mask(ranks, ranks)[None, None]).logits[0, seq:].float()
        loss += F.cross_entropy(logits, tokens, reduction="sum").item()
        hits += int((logits.argmax(-1) == tokens).sum())
        count += seq
        # drafting: one group of `width` masks after a prefix ending at a random point
        cut = int(rng.integers(8, seq - width))
        prefix = tokens[:cut]
        proposals = _parallel(model, prefix, width, mask_id)
        chain = _greedy_chain(model, prefix, width, mask_id)
        truth = tokens[cut: cut + width].numpy()
        top1 += proposals == truth
        agree = proposals == chain
        match += agree
        accepted += int(np.cumprod(agree).sum())
        blocks += 1
    model.train(was_training)
    return {"ltr_loss": loss / count, "ltr_top1": hits / count, "draft_top1": (top1 / blocks).tolist(),
            "draft_greedy_match": (match / blocks).tolist(), "draft_accept_len": accepted / blocks}


def _parallel(model, prefix: torch.Tensor, width: int, mask_id: int) -> np.ndarray:
    """Argmax at positions n..n+width-1 from masks that each see the prefix (n tokens) and themselves."""
    n = len(prefix)
    ids = torch.cat([prefix, torch.full((width,), mask_id)])[None]
    mask = torch.zeros(n + width, n + width, dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    mask[n:, :n] = True
    mask[torch.arange(n, n + width), torch.arange(n, n + width)] = True
    logits = model(input_ids=ids, position_ids=torch.arange(n + width)[None], attention_mask=mask[None, None]).logits
    return logits[0, n:].argmax(-1).numpy()


def _greedy_chain(model, prefix: torch.Tensor, width: int, mask_id: int) -> np.ndarray:
    """The model's left-to-right greedy continuation of ``prefix`` (width tokens), uncached."""
    tokens = prefix.clone()
    out = []
    for _ in range(width):
        token = int(_parallel(model, tokens, 1, mask_id)[0])
        out.append(token)
        tokens = torch.cat([tokens, torch.tensor([token])])
    return np.asarray(out)
