"""Train the embedded dual-mode model: one set of weights, a causal (AR) mode and a masked-diffusion mode.

One forward per batch runs over the packed sequence ``[clean | noised]`` (2S rows) with duplicated
position ids (0..S-1 twice):

* clean rows attend causally to clean rows and give the AR loss (next-token cross-entropy);
* noised rows are cut into blocks of size B starting at a random offset; a noised row in block
  ``[s, s + B)`` sees the clean rows before ``s`` and every noised row of its own block, and each masked
  row predicts the token at its own position (masked-diffusion loss).

Two block shapes are trained, because the engine uses both (paper Appendix D.1 and E.2):
``[last verified token, MASK x (B-1)]`` (regular Packed-SS / Linear-SS drafting calls) and
``[MASK x B]`` after a causal prefix (the initial call and Quadratic-SS branches). Most blocks mask every
position after their first token, the way the drafter is used; some are masked partially, the way the
native diffusion schedule sees them. With ``distill_prob`` > 0 the fully masked blocks learn the
verifier's own greedy continuation instead of the corpus tokens (:func:`distill_targets`), which is what
greedy verification accepts.

Usage::

    python -m packed_ss.train --run runs/embedded --minutes 120          # train or resume
    python -m packed_ss.train --run runs/embedded --minutes 120 --continue-steps 1300 \
        --set lr=1e-3 --set block_sizes=4,4,8                             # a new cosine cycle after the end
    python -m packed_ss.train --run runs/embedded --minutes 100 --set distill_prob=1 --set total_steps=2050
    python -m packed_ss.train --run runs/embedded --export assets/model   # write the shipped folder
    python -m packed_ss.train --run runs/distill --init-from assets/model  # a run that starts from a shipped
        # folder (its weights, tokenizer, config and step; a fresh optimizer), then continue it as above
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from packed_ss.training.order import evaluate_order, make_order_batch, order_losses

# Shape legend: N batch, S clean length, V vocab, B block size.

DUAL, ANY_ORDER = "dual", "any-order"  # training objectives


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a training run (stored in the run folder; a resume reuses them)."""

    vocab_size: int = 4096  # byte-level BPE vocabulary, special tokens included
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    ffn_size: int = 768
    seq_len: int = 256  # S, clean tokens per example; the packed row count is 2S
    batch_size: int = 12  # N
    lr: float = 2e-3  # peak AdamW learning rate
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    warmup_steps: int = 200
    total_steps: int = 40_000  # cosine horizon; training may stop earlier and resume later
    weight_decay: float = 0.05
    block_sizes: tuple[int, ...] = (4, 8, 8, 16)  # B drawn per batch from this list
    clean_first_prob: float = 0.6  # share of blocks shaped [clean token, MASK x (B-1)]
    full_mask_prob: float = 0.8  # share of blocks masked everywhere after their clean part
    seed: int = 0
    restart_step: int = 0  # step where the current cosine cycle began (0, or where a run was continued)
    distill_prob: float = 0.0  # share of fully masked blocks whose targets are the verifier's greedy chain
    objective: str = DUAL  # DUAL (causal + diffusion modes) or ANY_ORDER (packed_ss.training.order)
    order_span: int = 8  # any-order: tokens are shuffled within this many positions of their own
    max_group: int = 8  # any-order: largest group of masks predicted in parallel


def model_config(cfg: TrainConfig, eos_id: int, mask_id: int, pad_id: int):
    """The ``transformers.LlamaConfig`` of the embedded model (mask token id stored in the config)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.ffn_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config.mask_token_id = mask_id
    if cfg.objective == ANY_ORDER:
        config.any_order = True  # the engine decodes it with the any-order schedules (Appendix C)
    return config


def block_layout(seq_len: int, block: int, offset: int) -> np.ndarray:
    """Block start for every position: blocks begin at ``offset + k * block`` (a partial one before).

    Returns: int array (S,) with the start index of the block that holds each position.
    """
    positions = np.arange(seq_len)
    starts = np.where(positions < offset, 0, offset + ((positions - offset) // block) * block)
    return starts


def packed_mask(starts: torch.Tensor, block: int) -> torch.Tensor:
    """Boolean attention mask (True = attend) of one ``[clean | noised]`` example.

    Args:
        starts: (S,) block start of each noised position.
        block: block size B.
    Returns:
        (2S, 2S) bool tensor: clean-causal | nothing ; noised->clean before block start | own block.
    """
    seq_len = starts.shape[0]
    idx = torch.arange(seq_len)
    clean_causal = idx[None, :] <= idx[:, None]  # (S, S) lower triangular
    noised_to_clean = idx[None, :] < starts[:, None]  # row sees clean keys before its block
    own_block = starts[None, :] == starts[:, None]  # bidirectional inside the block
    top = torch.cat([clean_causal, torch.zeros(seq_len, seq_len, dtype=torch.bool)], dim=1)
    bottom = torch.cat([noised_to_clean, own_block], dim=1)
    return torch.cat([top, bottom], dim=0)


def make_batch(stream: np.ndarray, cfg: TrainConfig, mask_id: int, rng: np.random.Generator):
    """Sample one training batch from the token stream.

    Returns: ``(input_ids (N, 2S), position_ids (N, 2S), mask (N, 1, 2S, 2S), ar_targets (N, S),
    diff_targets (N, S) with -100 where no loss, anchors (N, S))``. ``anchors[i, p]`` is the last clean
    position before the masks of a fully masked block holding p (the verified token the drafter continues
    from), or -1 for partially masked blocks and positions without a loss; :func:`distill_targets` uses it.
    """
    seq, batch = cfg.seq_len, cfg.batch_size
    block = int(rng.choice(cfg.block_sizes))
    inputs, masks, ar_targets, diff_targets, anchors = [], [], [], [], []
    for _ in range(batch):
        start = int(rng.integers(0, len(stream) - seq - 1))
        window = stream[start : start + seq + 1]
        clean = window[:seq]
        starts = block_layout(seq, block, int(rng.integers(0, block)))
        noised = clean.copy()
        target = np.full(seq, -100, dtype=np.int64)
        anchor = np.full(seq, -1, dtype=np.int64)
        for s in np.unique(starts):
            end = min(s + block, seq)
            first = s + 1 if rng.random() < cfg.clean_first_prob else s
            span = np.arange(first, end)
            if len(span) == 0:
                continue
            if rng.random() >= cfg.full_mask_prob:
                rate = rng.uniform(0.3, 1.0)
                chosen = span[rng.random(len(span)) < rate]
                span = chosen if len(chosen) else span[-1:]
            elif first > 0:
                anchor[span] = first - 1
            noised[span] = mask_id
            target[span] = clean[span]
        inputs.append(np.concatenate([clean, noised]))
        masks.append(packed_mask(torch.from_numpy(starts), block))
        ar_targets.append(window[1:])
        diff_targets.append(target)
        anchors.append(anchor)
    positions = torch.arange(seq).repeat(2)[None].expand(batch, -1)
    return (
        torch.from_numpy(np.stack(inputs)).long(),
        positions,
        torch.stack(masks)[:, None],
        torch.from_numpy(np.stack(ar_targets)).long(),
        torch.from_numpy(np.stack(diff_targets)).long(),
        np.stack(anchors),
    )


@torch.no_grad()
def greedy_chains(model, clean: torch.Tensor, anchors: list[np.ndarray], depth: int) -> list[np.ndarray]:
    """The verifier's greedy continuation of each anchor: ``g_1..g_depth`` after ``clean[i, :a + 1]``.

    This is what a greedy verifier accepts: a drafter whose k-th mask after anchor a predicts g_k(a) has
    its draft accepted up to the first miss (Algorithm 1 line 5). One causal forward over the clean
    rows gives g_1 at every anchor; each further forward appends one row per anchor (token g_j(a) at
    position a + j), which reads the clean tokens up to a and the anchor's earlier chain rows, through
    the KV cache. depth - 1 extra forwards of (number of anchors) rows each.

    Args:
        clean: (N, S) token ids. anchors: per example, sorted anchor positions (int array, may be empty).
        depth: chain length D >= 1.
    Returns: per example, an int array (len(anchors[i]), D) with g_1..g_D of each anchor.
    """
    from transformers import DynamicCache

    n, seq = clean.shape
    width = max(1, max(len(a) for a in anchors))
    index = torch.zeros(n, width, dtype=torch.long)  # anchor positions, padded with 0
    for i, a in enumerate(anchors):
        index[i, : len(a)] = torch.from_numpy(np.asarray(a, dtype=np.int64))
    head = model.get_output_embeddings()
    cache = DynamicCache(config=model.config)
    hidden = model.base_model(input_ids=clean, past_key_values=cache, use_cache=True).last_hidden_state
    picked = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    chain = [head(picked).argmax(-1)]  # g_1: (N, width)
    keys = torch.arange(seq)
    own = torch.eye(width, dtype=torch.bool)
    for j in range(1, depth):
        # rows of depth j see: clean keys <= anchor, their own anchor's rows of depths 1..j-1, themselves
        to_clean = keys[None, None, :] <= index[:, :, None]  # (N, width, S)
        to_chain = own.repeat(1, j)[None].expand(n, -1, -1)  # (N, width, j * width)
        mask = torch.cat([to_clean, to_chain], dim=2)[:, None]
        out = model.base_model(input_ids=chain[-1], position_ids=index + j, attention_mask=mask,
                               past_key_values=cache, use_cache=True).last_hidden_state
        chain.append(head(out).argmax(-1))
    stacked = torch.stack(chain, dim=-1).numpy()  # (N, width, D)
    return [stacked[i, : len(a)] for i, a in enumerate(anchors)]


def distill_targets(model, batch, cfg: TrainConfig, rng: np.random.Generator):
    """Replace the data targets of some fully masked blocks by the verifier's greedy chain.

    With probability ``cfg.distill_prob`` per block, each mask at offset k after the block's anchor a
    gets target g_k(a) (:func:`greedy_chains`) instead of the corpus token: the drafter then learns to
    propose what the shared-weight verifier would accept under greedy decoding.
    Returns: the batch with new diffusion targets (other tensors unchanged).
    """
    input_ids, position_ids, mask, ar_targets, diff_targets, anchors = batch
    seq = ar_targets.shape[1]
    chosen = []
    for row in anchors:
        candidates = np.unique(row[row >= 0])
        chosen.append(candidates[rng.random(len(candidates)) < cfg.distill_prob])
    if not any(len(c) for c in chosen):
        return batch
    depth = int(max((np.arange(seq) - row)[np.isin(row, c)].max(initial=1) for row, c in zip(anchors, chosen)))
    was_training = model.training
    model.eval()
    chains = greedy_chains(model, input_ids[:, :seq], chosen, depth)
    model.train(was_training)
    targets = diff_targets.clone()
    for i, (row, c, g) in enumerate(zip(anchors, chosen, chains)):
        for a, tokens in zip(c, g):
            positions = np.nonzero(row == a)[0]
            targets[i, positions] = torch.from_numpy(tokens[positions - a - 1]).long()
    return input_ids, position_ids, mask, ar_targets, targets, anchors


def losses(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """AR and masked-diffusion cross-entropy (nats) of one packed batch, in one forward."""
    input_ids, position_ids, mask, ar_targets, diff_targets = batch[:5]
    seq = ar_targets.shape[1]
    logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask).logits
    vocab = logits.shape[-1]
    ar = F.cross_entropy(logits[:, :seq].reshape(-1, vocab), ar_targets.reshape(-1))
    diff = F.cross_entropy(logits[:, seq:].reshape(-1, vocab), diff_targets.reshape(-1), ignore_index=-100)
    return ar, diff


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up then cosine decay to ``lr * min_lr_ratio``, counted from ``cfg.restart_step``."""
    local, horizon = step - cfg.restart_step, cfg.total_steps - cfg.restart_step
    if local < cfg.warmup_steps:
        return cfg.lr * (local + 1) / cfg.warmup_steps
    progress = min(1.0, (local - cfg.warmup_steps) / max(1, horizon - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model, stream: np.ndarray, mask_id: int, block: int = 8, windows: int = 64, seq_len: int = 256):
    """Held-out figures: AR loss (nats) and top-1, and drafter top-1 per offset 1..B-1.

    The drafter is measured in the regular drafting layout ``[last verified token, MASK x (B-1)]``
    with the block starting at random offsets, exactly as Packed-SS and Linear-SS call it.

    ``draft_greedy_match`` compares the same proposals with the verifier's greedy chain from the block's
    first token (:func:`greedy_chains`), which is what greedy verification accepts; ``draft_accept_len``
    is the mean number of leading proposals that match it (the expected accepted draft length).

    Returns: dict with ``ar_loss``, ``ar_top1``, ``draft_top1`` and ``draft_greedy_match`` (lists of B-1
    fractions) and ``draft_accept_len`` (tokens).
    """
    model.eval()
    rng = np.random.default_rng(1234)
    ar_loss, ar_hits, ar_count = 0.0, 0, 0
    hits = np.zeros(block - 1)
    matches = np.zeros(block - 1)
    counts = np.zeros(block - 1)
    accepted, blocks_seen = 0, 0
    for _ in range(windows):
        start = int(rng.integers(0, len(stream) - seq_len - 1))
        window = stream[start : start + seq_len + 1]
        clean = window[:seq_len]
        starts = block_layout(seq_len, block, int(rng.integers(0, block)))
        noised = clean.copy()
        offsets = np.arange(seq_len) - starts
        noised[offsets > 0] = mask_id
        ids = torch.from_numpy(np.concatenate([clean, noised])).long()[None]
        pos = torch.arange(seq_len).repeat(2)[None]
        mask = packed_mask(torch.from_numpy(starts), block)[None, None]
        logits = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits[0].float()
        targets = torch.from_numpy(window[1:]).long()
        ar_loss += F.cross_entropy(logits[:seq_len], targets, reduction="sum").item()
        ar_hits += (logits[:seq_len].argmax(-1) == targets).sum().item()
        ar_count += seq_len
        predicted = logits[seq_len:].argmax(-1).numpy()
        full_blocks = starts + block <= seq_len
        for k in range(1, block):
            sel = (offsets == k) & full_blocks
            hits[k - 1] += (predicted[sel] == clean[sel]).sum()
            counts[k - 1] += sel.sum()
        anchors = np.unique(starts[full_blocks & (offsets == 0)])
        chain = greedy_chains(model, ids[:, :seq_len], [anchors], block - 1)[0]  # (blocks, B-1)
        proposals = np.stack([predicted[a + 1: a + block] for a in anchors])
        agree = proposals == chain
        matches += agree.sum(0)
        accepted += int(np.cumprod(agree, axis=1).sum())
        blocks_seen += len(anchors)
    model.train()
    return {
        "ar_loss": ar_loss / ar_count,
        "ar_top1": ar_hits / ar_count,
        "draft_top1": (hits / np.maximum(counts, 1)).tolist(),
        "draft_greedy_match": (matches / max(1, blocks_seen)).tolist(),
        "draft_accept_len": accepted / max(1, blocks_seen),
    }


def _prepare_data(run: Path, vocab_size: int):
    """Tokenizer and token streams, built once per run folder and reused on resume."""
    from transformers import AutoTokenizer

    from packed_ss.training.corpus import load_corpus
    from packed_ss.training.tokenizer import train_tokenizer

    tok_dir = run / "tokenizer"
    train_path, held_path = run / "train_tokens.npy", run / "heldout_tokens.npy"
    if not train_path.exists():
        train_files, held_files = load_corpus()
        if (tok_dir / "tokenizer.json").exists():  # a run started from a shipped folder keeps its tokenizer
            tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        else:
            tokenizer = train_tokenizer((f.text for f in train_files), vocab_size)
            tokenizer.save_pretrained(tok_dir)
        eos = tokenizer.eos_token_id
        for files, path in ((train_files, train_path), (held_files, held_path)):
            ids: list[int] = []
            for f in files:
                ids.extend(tokenizer.encode(f.text))
                ids.append(eos)
            np.save(path, np.asarray(ids, dtype=np.int32))
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    return tokenizer, np.load(train_path), np.load(held_path)


def _save_checkpoint(run: Path, model, optimizer, step: int, tokens: int, seconds: float, rng) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "tokens": tokens,
        "seconds": seconds,
        "rng": rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
    }
    tmp = run / "ckpt.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(run / "ckpt.pt")


def export(run: Path, out: Path) -> dict:
    """Write the shipped folder: float16 safetensors, config, tokenizer and training figures.

    Returns: the training log entry written beside the weights (``training.json``).
    """
    from transformers import AutoTokenizer, LlamaForCausalLM

    cfg = _stored_config(run)
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer")
    config = model_config(cfg, tokenizer.eos_token_id, tokenizer.mask_token_id, tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    state = torch.load(run / "ckpt.pt", weights_only=False)
    model.load_state_dict(state["model"])
    out.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {"step": state["step"], "clean_tokens": state["tokens"], "train_seconds": state["seconds"],
            "config": asdict(cfg)}
    (out / "training.json").write_text(json.dumps(info, indent=2))
    _write_golden(out)
    return info


GOLDEN_PROMPT = 'def is_even(n):\n    """Return True when n is even."""\n'


def _write_golden(folder: Path, new_tokens: int = 24) -> None:
    """Store the greedy AR continuation of a fixed prompt (float64) so tests notice a changed checkpoint."""
    from packed_ss import DecodeConfig, generate
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(folder, device="cpu", dtype="float64")
    run = generate(model, model.encode(GOLDEN_PROMPT), DecodeConfig(max_new_tokens=new_tokens), "ar")
    golden = {"prompt": GOLDEN_PROMPT, "token_ids": list(run.token_ids), "text": run.text, "dtype": "float64"}
    (folder / "golden.json").write_text(json.dumps(golden, indent=2))


def evaluate_folder(folder: Path, block: int = 8, windows: int = 256) -> dict:
    """Held-out figures of a saved model: the corpus's held-out files, tokenised with its tokenizer.

    Returns: dict with parameters, ``ar_loss`` (nats/token), ``ar_top1`` and ``draft_top1`` per offset.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from packed_ss.training.corpus import load_corpus

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids: list[int] = []
    for f in load_corpus()[1]:
        ids.extend(tokenizer.encode(f.text))
        ids.append(tokenizer.eos_token_id)
    objective = ANY_ORDER if getattr(model.config, "any_order", False) else DUAL
    figures = _evaluate(model, TrainConfig(objective=objective), np.asarray(ids, dtype=np.int32),
                        tokenizer.mask_token_id, windows=windows, block=block)
    return {"parameters": sum(p.numel() for p in model.parameters()), "heldout_tokens": len(ids),
            "windows": windows, "block_size": block, **figures}


def _stored_config(run: Path) -> TrainConfig:
    stored = json.loads((run / "config.json").read_text())
    return TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})


# Stored-config fields a resumed run may change (the architecture and the data stay fixed).
MUTABLE_FIELDS = ("lr", "min_lr_ratio", "warmup_steps", "total_steps", "weight_decay", "block_sizes",
                  "clean_first_prob", "full_mask_prob", "distill_prob", "objective", "order_span", "max_group")


def parse_setting(text: str) -> tuple[str, object]:
    """``"KEY=VALUE"`` of a mutable config field, the value parsed to the field's type.

    Raises: ValueError naming the problem (unknown or fixed field, unparsable value).
    """
    key, sep, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or key not in MUTABLE_FIELDS:
        raise ValueError(f"--set takes KEY=VALUE with KEY one of {', '.join(MUTABLE_FIELDS)}, got {text!r}")
    default = getattr(TrainConfig(), key)
    try:
        if isinstance(default, tuple):
            parsed = tuple(int(b) for b in value.split(","))
            if not parsed or any(b < 2 for b in parsed):
                raise ValueError
            return key, parsed
        parsed = type(default)(value)
        if (key == "objective" and parsed not in (DUAL, ANY_ORDER)) or (key == "max_group" and parsed < 2) or (
                key == "order_span" and parsed < 0):
            raise ValueError
        return key, parsed
    except ValueError:
        wanted = {"objective": f"{DUAL} or {ANY_ORDER}", "max_group": "an integer >= 2",
                  "order_span": "an integer >= 0"}.get(key, type(default).__name__)
        if isinstance(default, tuple):
            wanted = "integers >= 2 separated by commas"
        raise ValueError(f"--set {key}: cannot read {value!r} as {wanted}") from None


def init_run(run: Path, folder: Path) -> TrainConfig:
    """Start a run folder from a shipped model folder (as :func:`export` wrote it): its float16 weights
    (loaded as float32), tokenizer, training config and step count, with a fresh optimizer (the shipped
    folder has no optimizer state). Continue it with :func:`continue_run` and :func:`train`.

    Returns: the run's config. Raises: FileExistsError when ``run`` already has a checkpoint;
    FileNotFoundError when ``folder`` has no ``training.json``.
    """
    from transformers import AutoTokenizer, LlamaForCausalLM

    if (run / "ckpt.pt").exists():
        raise FileExistsError(f"{run}/ckpt.pt exists: give a new run folder to start from {folder}")
    if not (folder / "training.json").is_file():
        raise FileNotFoundError(f"{folder}/training.json does not exist: not a folder written by --export")
    info = json.loads((folder / "training.json").read_text())
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in info["config"].items()})
    run.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(folder).save_pretrained(run / "tokenizer")
    (run / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    _save_checkpoint(run, model, optimizer, int(info["step"]), int(info["clean_tokens"]),
                     float(info["train_seconds"]), np.random.default_rng(cfg.seed + int(info["step"])))
    return cfg


def continue_run(run: Path, steps: int | None = None, **changes) -> TrainConfig:
    """Change the stored config of a run before resuming it; with ``steps``, start a new cosine cycle.

    The weights and optimizer state carry over. ``steps``: ``restart_step`` becomes the checkpoint step
    and ``total_steps`` that step + ``steps`` (warm-up, then cosine to the floor again). ``changes``:
    other fields of :data:`MUTABLE_FIELDS` (for example ``lr``, ``block_sizes``, ``distill_prob``).
    Raises: FileNotFoundError when the run has no checkpoint; ValueError for a non-positive ``steps`` or
    a field outside :data:`MUTABLE_FIELDS`.
    """
    if not (run / "ckpt.pt").exists():
        raise FileNotFoundError(f"{run}/ckpt.pt does not exist: nothing to continue")
    fixed = sorted(set(changes) - set(MUTABLE_FIELDS))
    if fixed:
        raise ValueError(f"a resumed run cannot change {', '.join(fixed)}")
    if steps is not None:
        if steps <= 0:
            raise ValueError(f"--continue-steps must be positive, got {steps}")
        step = int(torch.load(run / "ckpt.pt", weights_only=False)["step"])
        changes.update(restart_step=step, total_steps=step + steps)
    cfg = replace(_stored_config(run), **changes)
    (run / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    return cfg


def train(run: Path, minutes: float, cfg: TrainConfig, eval_every: int, save_every: int) -> None:
    """Train (or resume) for ``minutes`` of wall time, checkpointing to ``run/ckpt.pt``."""
    from tqdm import tqdm
    from transformers import LlamaForCausalLM

    run.mkdir(parents=True, exist_ok=True)
    if (run / "config.json").exists():
        cfg = _stored_config(run)
    else:
        (run / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    tokenizer, train_stream, held_stream = _prepare_data(run, cfg.vocab_size)
    mask_id = tokenizer.mask_token_id
    torch.manual_seed(cfg.seed)
    config = model_config(cfg, tokenizer.eos_token_id, mask_id, tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  betas=(0.9, 0.95))
    rng = np.random.default_rng(cfg.seed)
    step, tokens, seconds = 0, 0, 0.0
    if (run / "ckpt.pt").exists():
        state = torch.load(run / "ckpt.pt", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, tokens, seconds = state["step"], state["tokens"], state["seconds"]
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"{len(train_stream):,} training tokens, resuming at step {step}", flush=True)
    model.train()
    log = (run / "log.jsonl").open("a")
    deadline = time.monotonic() + minutes * 60
    bar = tqdm(total=int(minutes * 60), unit="s", desc="training", mininterval=10)
    begin = time.monotonic()
    while time.monotonic() < deadline and step < cfg.total_steps:
        tick = time.monotonic()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        if cfg.objective == ANY_ORDER:  # "ar": masks in groups of one; "diff": parallel groups
            batch = make_order_batch(train_stream, cfg.seq_len, cfg.batch_size, cfg.order_span, cfg.max_group,
                                     mask_id, rng)
            ar, diff = order_losses(model, batch)
        else:
            batch = make_batch(train_stream, cfg, mask_id, rng)
            if cfg.distill_prob > 0:
                batch = distill_targets(model, batch, cfg, rng)
            ar, diff = losses(model, batch)
        optimizer.zero_grad(set_to_none=True)
        (ar + diff).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        tokens += cfg.batch_size * cfg.seq_len
        seconds += time.monotonic() - tick
        bar.n = int(time.monotonic() - begin)
        bar.set_postfix(step=step, ar=f"{ar.item():.3f}", diff=f"{diff.item():.3f}", refresh=False)
        bar.update(0)
        entry = {"step": step, "tokens": tokens, "seconds": round(seconds, 1), "ar": ar.item(), "diff": diff.item()}
        if step % eval_every == 0:
            entry.update(_evaluate(model, cfg, held_stream, mask_id, windows=16))
        if step % 50 == 0 or step % eval_every == 0:
            log.write(json.dumps(entry) + "\n")
            log.flush()
        if step % save_every == 0:
            _save_checkpoint(run, model, optimizer, step, tokens, seconds, rng)
    _save_checkpoint(run, model, optimizer, step, tokens, seconds, rng)
    bar.close()
    print(json.dumps({"step": step, "tokens": tokens, **_evaluate(model, cfg, held_stream, mask_id)}), flush=True)


def _evaluate(model, cfg: TrainConfig, stream: np.ndarray, mask_id: int, windows: int = 64,
              block: int = 8) -> dict:
    """Held-out figures for the run's objective (:func:`evaluate` or :func:`evaluate_order`)."""
    if cfg.objective == ANY_ORDER:
        return evaluate_order(model, stream, mask_id, block=block, windows=windows)
    return evaluate(model, stream, mask_id, block=block, windows=windows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m packed_ss.train", description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=Path("runs/embedded"), help="checkpoint folder")
    parser.add_argument("--minutes", type=float, default=60.0, help="wall-time budget of this session")
    parser.add_argument("--export", type=Path, help="write the shipped model folder from the checkpoint and exit")
    parser.add_argument("--init-from", type=Path,
                        help="start --run (a new folder) from a shipped model folder, e.g. assets/model, and exit")
    parser.add_argument("--evaluate", type=Path, help="print held-out figures of a saved model folder and exit")
    parser.add_argument("--eval-block-size", type=int, default=8, help="B for the drafter accuracy per offset")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--continue-steps", type=int, help="resume with a new cosine cycle of this many steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"change a stored setting of the run before resuming ({', '.join(MUTABLE_FIELDS)})")
    for field, value in asdict(TrainConfig()).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.evaluate:
        print(json.dumps(evaluate_folder(args.evaluate, args.eval_block_size), indent=2))
        return
    if args.export:
        print(json.dumps(export(args.run, args.export), indent=2))
        return
    if args.init_from:
        try:
            cfg = init_run(args.run, args.init_from)
        except (FileExistsError, FileNotFoundError) as error:
            parser.error(str(error))
        print(f"{args.run} starts from {args.init_from} ({json.dumps(asdict(cfg))})")
        return
    if args.continue_steps is not None or args.set:
        try:
            continue_run(args.run, args.continue_steps, **dict(parse_setting(text) for text in args.set))
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
    overrides = {f: getattr(args, f) for f in asdict(TrainConfig()) if hasattr(args, f)}
    train(args.run, args.minutes, TrainConfig(**overrides), args.eval_every, args.save_every)


if __name__ == "__main__":
    main()
