"""Embedded model: training lowers the loss, the tokenizer round-trips, the shipped checkpoint is stable."""

import json

import numpy as np
import pytest
import torch
from conftest import EMBEDDED
from hypothesis import given, settings
from hypothesis import strategies as st

from packed_ss import DecodeConfig, generate
from packed_ss.training.train import TrainConfig, losses, make_batch, model_config, packed_mask


def test_packed_training_mask_layout():
    starts = torch.tensor([0, 0, 2, 2, 2, 2])  # offset 2, B = 4: a partial block then one full block
    mask = packed_mask(starts, 4)
    assert mask.shape == (12, 12)
    assert torch.equal(mask[:6, :6], torch.ones(6, 6, dtype=torch.bool).tril())  # clean rows: causal
    assert not mask[:6, 6:].any()  # clean rows never see noised rows
    assert torch.equal(mask[8, :6], torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool))  # clean before its block
    assert torch.equal(mask[8, 6:], torch.tensor([0, 0, 1, 1, 1, 1], dtype=torch.bool))  # its own block


def test_a_few_steps_lower_the_loss():
    from transformers import LlamaForCausalLM

    cfg = TrainConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64, seq_len=32,
                      batch_size=4, block_sizes=(4,), lr=1e-2, warmup_steps=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config(cfg, eos_id=0, mask_id=1, pad_id=2))
    rng = np.random.default_rng(0)
    stream = np.tile(np.arange(3, 40), 50).astype(np.int32)  # a learnable repeating sequence
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    fixed = make_batch(stream, cfg, 1, np.random.default_rng(1))
    before = [x.item() for x in losses(model, fixed)]
    for _ in range(30):
        ar, diff = losses(model, make_batch(stream, cfg, 1, rng))
        optimizer.zero_grad()
        (ar + diff).backward()
        optimizer.step()
    after = [x.item() for x in losses(model, fixed)]
    assert after[0] < before[0] - 0.5 and after[1] < before[1] - 0.5, (before, after)


@pytest.fixture(scope="module")
def shipped_tokenizer():
    from transformers import AutoTokenizer

    if not (EMBEDDED / "tokenizer.json").exists():
        pytest.skip("assets/model has no tokenizer yet")
    return AutoTokenizer.from_pretrained(EMBEDDED)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_tokenizer_round_trips_any_text(shipped_tokenizer, text):
    ids = shipped_tokenizer.encode(text, add_special_tokens=False)
    assert shipped_tokenizer.decode(ids) == text


def test_indentation_runs_are_single_tokens(shipped_tokenizer):
    ids = shipped_tokenizer.encode("def f():\n        return 1\n", add_special_tokens=False)
    assert any(set(t) <= {"Ġ", "Ċ"} and t.count("Ġ") >= 4 for t in shipped_tokenizer.convert_ids_to_tokens(ids))
    assert shipped_tokenizer.mask_token is not None and shipped_tokenizer.eos_token is not None


def test_shipped_model_matches_its_golden_continuation(embedded_model):
    golden = json.loads((EMBEDDED / "golden.json").read_text())
    prompt = embedded_model.encode(golden["prompt"])
    run = generate(embedded_model, prompt, DecodeConfig(max_new_tokens=len(golden["token_ids"])), "ar")
    assert list(run.token_ids) == golden["token_ids"]


def test_learning_rate_restarts_its_cosine_at_the_continued_step():
    from dataclasses import replace

    from packed_ss.training.train import learning_rate

    first = TrainConfig(lr=2e-3, min_lr_ratio=0.1, warmup_steps=10, total_steps=100)
    assert learning_rate(first, 0) == pytest.approx(2e-4)  # warm-up from step 0
    assert learning_rate(first, 100) == pytest.approx(2e-4)  # the cosine floor at the horizon
    second = replace(first, lr=1e-3, restart_step=100, total_steps=300)
    assert learning_rate(second, 100) == pytest.approx(1e-4)  # warm-up again, counted from the restart
    assert learning_rate(second, 109) == pytest.approx(1e-3)  # peak of the new cycle
    assert learning_rate(second, 200) < 1e-3
    assert learning_rate(second, 300) == pytest.approx(1e-4)  # floor of the new cycle


def test_continue_run_extends_the_stored_config(tmp_path):
    from dataclasses import asdict

    from packed_ss.training.train import continue_run, parse_setting

    cfg = TrainConfig(total_steps=50)
    (tmp_path / "config.json").write_text(json.dumps(asdict(cfg)))
    with pytest.raises(FileNotFoundError):
        continue_run(tmp_path, 10)
    torch.save({"step": 50}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError):
        continue_run(tmp_path, 0)
    with pytest.raises(ValueError):
        continue_run(tmp_path, hidden_size=64)  # the architecture is fixed
    continued = continue_run(tmp_path, 30, **dict(map(parse_setting, ["lr=5e-4", "block_sizes=4,8"])))
    stored = json.loads((tmp_path / "config.json").read_text())
    assert (continued.restart_step, continued.total_steps, continued.lr) == (50, 80, 5e-4)
    assert (stored["restart_step"], stored["total_steps"], stored["block_sizes"]) == (50, 80, [4, 8])
    assert stored["hidden_size"] == cfg.hidden_size
    kept = continue_run(tmp_path, distill_prob=1.0)  # no steps: same cycle, one setting changed
    assert (kept.restart_step, kept.total_steps, kept.distill_prob) == (50, 80, 1.0)


@pytest.mark.parametrize("text", ["lr", "hidden_size=8", "block_sizes=4,x", "block_sizes=1", "lr=fast",
                                  "objective=sideways", "max_group=1", "order_span=-1"])
def test_bad_settings_are_refused(text):
    from packed_ss.training.train import parse_setting

    with pytest.raises(ValueError):
        parse_setting(text)


def test_greedy_chains_equal_step_by_step_greedy_decoding():
    """The drafter's distillation targets: g_1..g_D after each anchor, as plain greedy decoding gives them."""
    from helpers import tiny_llama

    from packed_ss.training.train import greedy_chains

    model = tiny_llama(vocab_size=16, seed=4, logit_scale=3.0, eos=False).model
    clean = torch.randint(2, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    anchors = [np.array([0, 4, 9]), np.array([6])]
    chains = greedy_chains(model, clean, anchors, 3)
    for row, found, ids_row in zip(anchors, chains, clean):
        for a, chain in zip(row, found):
            ids = ids_row[: a + 1].tolist()
            for _ in range(3):
                with torch.no_grad():
                    ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            assert ids[a + 1:] == chain.tolist()


def test_distillation_targets_only_fully_masked_blocks():
    from helpers import tiny_llama

    from packed_ss.training.train import distill_targets

    model = tiny_llama(vocab_size=16, seed=4, logit_scale=3.0, eos=False).model
    cfg = TrainConfig(seq_len=24, batch_size=3, block_sizes=(4,), full_mask_prob=0.5, distill_prob=1.0)
    stream = np.tile(np.arange(2, 16), 20).astype(np.int32)
    batch = make_batch(stream, cfg, 1, np.random.default_rng(3))
    new = distill_targets(model, batch, cfg, np.random.default_rng(4))[4]
    anchors = batch[5]
    assert (anchors >= 0).any() and (anchors < 0).any()
    unanchored = torch.from_numpy(anchors < 0)
    assert torch.equal(new[unanchored], batch[4][unanchored])  # partial blocks keep the corpus targets
    assert ((new >= 0) == (batch[4] >= 0)).all()  # the loss covers the same positions
    from packed_ss.training.train import greedy_chains

    for i, row in enumerate(anchors):  # a mask at offset k after anchor a learns g_k(a)
        starts = np.unique(row[row >= 0])
        chains = greedy_chains(model, batch[0][i:i + 1, :cfg.seq_len], [starts], 4)[0]
        for a, chain in zip(starts, chains):
            for p in np.nonzero(row == a)[0]:
                assert new[i, p].item() == chain[p - a - 1]


def test_a_run_starts_from_a_shipped_folder(tmp_path):
    """--init-from: the shipped weights (float16, loaded as float32), tokenizer, config and step carry over."""
    from dataclasses import asdict

    from transformers import AutoTokenizer, LlamaForCausalLM

    from packed_ss.training.train import continue_run, init_run, model_config

    tokenizer = AutoTokenizer.from_pretrained("assets/model")
    cfg = TrainConfig(hidden_size=32, num_layers=1, num_heads=2, ffn_size=64, total_steps=40)
    folder = tmp_path / "shipped"
    model = LlamaForCausalLM(model_config(cfg, tokenizer.eos_token_id, tokenizer.mask_token_id,
                                          tokenizer.pad_token_id))
    model.half().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "training.json").write_text(json.dumps({"step": 40, "clean_tokens": 1000, "train_seconds": 3.0,
                                                      "config": asdict(cfg)}))
    run = tmp_path / "run"
    assert init_run(run, folder) == cfg
    state = torch.load(run / "ckpt.pt", weights_only=False)
    assert state["step"] == 40 and not state["optimizer"]["state"]  # fresh optimizer
    for name, tensor in model.state_dict().items():
        assert torch.equal(state["model"][name], tensor.float()), name
    assert (run / "tokenizer" / "tokenizer.json").exists()
    assert continue_run(run, 10, distill_prob=1.0).total_steps == 50
    with pytest.raises(FileExistsError):
        init_run(run, folder)
    with pytest.raises(FileNotFoundError):
        init_run(tmp_path / "other", tmp_path)


# --- the any-order model (packed_ss.training.order) ----------------------------------------------
ANY_ORDER = EMBEDDED.parent / "model-anyorder"


def test_order_mask_by_hand():
    """Ranks (0, 1, 3, 2): position 3 is generated before position 2; rank groups {0}, {1, 2}, {3} are the
    position groups {0}, {1, 3}, {2}. Token rows see tokens at or before them in the order; a mask sees
    the tokens of earlier groups and itself."""
    from packed_ss.training.order import order_mask

    ranks = np.array([0, 1, 3, 2])
    starts = np.array([0, 1, 1, 3])  # first rank of each rank's group
    mask = order_mask(ranks, starts).int().tolist()
    assert [row[:4] for row in mask[:4]] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 1]]
    assert all(not any(row[4:]) for row in mask[:4])  # tokens never see masks
    assert [row[:4] for row in mask[4:]] == [[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 1], [1, 0, 0, 0]]
    assert [row[4:] for row in mask[4:]] == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


def test_generation_ranks_keep_the_prompt_in_order_and_shuffle_locally():
    from packed_ss.training.order import generation_ranks

    rng = np.random.default_rng(0)
    for _ in range(20):
        ranks = generation_ranks(64, 10, 8, rng)
        assert sorted(ranks) == list(range(64)) and list(ranks[:10]) == list(range(10))
        order = np.argsort(ranks)
        assert np.all(np.abs(order - np.arange(64)) < 8)  # no token moves 8 or more places
    assert list(generation_ranks(16, 0, 0, rng)) == list(range(16))


def test_a_few_any_order_steps_lower_both_losses():
    from transformers import LlamaForCausalLM

    from packed_ss.training.order import make_order_batch, order_losses

    cfg = TrainConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64, seq_len=32,
                      batch_size=4, lr=1e-2, objective="any-order")
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config(cfg, eos_id=0, mask_id=1, pad_id=2))
    assert model.config.any_order is True
    stream = np.tile(np.arange(3, 40), 50).astype(np.int32)
    batch = lambda seed: make_order_batch(stream, 32, 4, 8, 8, 1, np.random.default_rng(seed))  # noqa: E731
    fixed = batch(1)
    before = [x.item() for x in order_losses(model, fixed)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    for step in range(40):
        single, group = order_losses(model, batch(100 + step))
        optimizer.zero_grad()
        (single + group).backward()
        optimizer.step()
    after = [x.item() for x in order_losses(model, fixed)]
    assert after[0] < before[0] - 0.5 and after[1] < before[1] - 0.5, (before, after)


def test_shipped_any_order_model_matches_its_golden_continuation():
    from packed_ss.models import DualModeModel

    if not (ANY_ORDER / "model.safetensors").exists():
        pytest.skip("assets/model-anyorder has no weights yet")
    model = DualModeModel.from_pretrained(ANY_ORDER, device="cpu", dtype="float64")
    assert model.any_order
    golden = json.loads((ANY_ORDER / "golden.json").read_text())
    run = generate(model, model.encode(golden["prompt"]), DecodeConfig(max_new_tokens=len(golden["token_ids"])), "ar")
    assert list(run.token_ids) == golden["token_ids"]
    for name in ("linear", "quadratic", "packed"):  # ltr order: the model's own left-to-right output
        config = DecodeConfig(max_new_tokens=len(golden["token_ids"]), block_size=5)
        assert list(generate(model, model.encode(golden["prompt"]), config, name).token_ids) == golden["token_ids"]
