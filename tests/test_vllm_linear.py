"""Linear-SS inside vLLM (packed_ss/vllm_side/linear_ss_proposer.py), checked against the engine's own Linear-SS.

The proposer runs in vLLM's process on vLLM's own layers. Here it is driven without vLLM: a stand-in gives a
transformers Llama the interface of vLLM's (fused ``qkv_proj`` returning ``(out, bias)``, ``rotary_emb(positions, q,
k)``, ``compute_logits``) and a loop plays vLLM's part (verify greedily, commit, ask for the next drafts with
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``). Where vLLM's environment is installed, the last
test runs the real thing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import tiny_llama, write_lora_adapter
from packed_ss import DecodeConfig, decode
from packed_ss.layout import draft_layout, verify_layout
from packed_ss.sampling import warp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packed_ss" / "vllm_side"))
import cpu_sampling_fix  # noqa: E402
from linear_ss_proposer import LinearSSProposer  # noqa: E402  (vLLM imports it by module path from that folder)

EMBEDDED = ROOT / "assets" / "model"


class Linear:
    """A transformers linear layer (or several, concatenated) answering ``(output, bias)`` as vLLM's do."""

    def __init__(self, *layers):
        self.layers = layers

    def __call__(self, x):
        return torch.cat([layer(x) for layer in self.layers], dim=-1), None


class VllmShapedLlama:
    """A transformers ``LlamaForCausalLM`` seen through the attributes the proposer uses of vLLM's Llama."""

    def __init__(self, hf):
        self.model = SimpleNamespace(embed_tokens=hf.model.embed_tokens, norm=hf.model.norm, layers=[])
        rope = hf.model.rotary_emb
        for layer in hf.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            heads, kv_heads = hf.config.num_attention_heads, hf.config.num_key_value_heads
            head_dim = hf.config.hidden_size // heads

            def rotary(positions, q, k, rope=rope, head_dim=head_dim):
                cos, sin = rope(q, positions[None])
                cos, sin = cos[0][:, None], sin[0][:, None]

                def turn(x):
                    x = x.reshape(len(positions), -1, head_dim)
                    half = torch.cat([-x[..., head_dim // 2:], x[..., : head_dim // 2]], dim=-1)
                    return (x * cos + half * sin).reshape(len(positions), -1)

                return turn(q), turn(k)

            def act_fn(x):
                half = x.shape[-1] // 2
                return torch.nn.functional.silu(x[..., :half]) * x[..., half:]

            shaped_mlp = SimpleNamespace(gate_up_proj=Linear(mlp.gate_proj, mlp.up_proj), act_fn=act_fn,
                                         down_proj=Linear(mlp.down_proj))
            self.model.layers.append(SimpleNamespace(
                input_layernorm=layer.input_layernorm, post_attention_layernorm=layer.post_attention_layernorm,
                mlp=_Mlp(shaped_mlp),
                self_attn=SimpleNamespace(qkv_proj=Linear(attn.q_proj, attn.k_proj, attn.v_proj), o_proj=Linear(attn.o_proj),
                                          rotary_emb=rotary, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                          scaling=head_dim ** -0.5, q_size=heads * head_dim,
                                          kv_size=kv_heads * head_dim)))
        self.compute_logits = hf.lm_head


class _Mlp:
    def __init__(self, parts):
        self.gate_up_proj, self.act_fn, self.down_proj = parts.gate_up_proj, parts.act_fn, parts.down_proj

    def __call__(self, h):
        return self.down_proj(self.act_fn(self.gate_up_proj(h)[0]))[0]


class Runner:
    """Plays vLLM's runner: it loads the proposer (the proposer finds it as its caller) and keeps the batch's
    per-row temperatures and request ids, and the draft probabilities the proposer hands over."""

    def __init__(self, temperatures, req_ids):
        self.input_batch = SimpleNamespace(temperature_cpu=np.array(temperatures, dtype=np.float32),
                                           req_ids=list(req_ids))
        self._draft_probs = None
        self._draft_prob_req_ids = None

    def load(self, proposer, target):
        proposer.load_model(target)


def _proposer(model, width: int, log: Path | None = None, monkeypatch=None, runner=None) -> LinearSSProposer:
    if log is not None:
        monkeypatch.setenv("PACKED_SS_PROPOSER_LOG", str(log))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=width),
                             model_config=SimpleNamespace(hf_config=SimpleNamespace(mask_token_id=model.mask_token_id),
                                                          max_model_len=400, seed=0))
    proposer = LinearSSProposer(config)
    target = VllmShapedLlama(model.model)
    if runner is not None:
        runner.load(proposer, target)
    else:
        proposer.load_model(target)
    return proposer


def _greedy_next(model, tokens: list[int]) -> torch.Tensor:
    """The verifier's argmax after each position of ``tokens`` (a plain causal forward, no cache)."""
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([tokens])).logits[0].argmax(-1)


def _vllm_loop(model, proposer, prompts: list[list[int]], new_tokens: int, shuffle_at: int | None = None):
    """vLLM's part, greedy: prefill, then per step verify each row's draft, commit the accepted tokens and the
    correction or bonus token, and ask the proposer for the next drafts. ``shuffle_at``: the step at which the batch's
    rows are reversed (vLLM moves requests between rows when it condenses its batch)."""
    sequences = [list(p) for p in prompts]
    limits = [len(p) + new_tokens for p in prompts]
    sampled = []
    for seq in sequences:  # the prefill step
        seq.append(int(_greedy_next(model, seq)[-1]))
        sampled.append([seq[-1]])
    step = 0
    while any(len(seq) < limit for seq, limit in zip(sequences, limits)):
        step += 1
        if step == shuffle_at:
            sequences, sampled, limits = sequences[::-1], sampled[::-1], limits[::-1]
        buffer = np.zeros((len(sequences), 400), dtype=np.int64)
        for row, seq in enumerate(sequences):
            buffer[row, :len(seq)] = seq
        lengths = np.array([len(seq) for seq in sequences])
        drafts = proposer.propose(sampled, lengths, buffer)
        sampled = []
        for seq, draft, limit in zip(sequences, drafts, limits):
            if len(seq) >= limit:
                sampled.append([])
                continue
            top = _greedy_next(model, seq + draft)[len(seq) - 1:].tolist()
            h = next((i for i, (d, v) in enumerate(zip(draft, top)) if d != v), len(draft))
            accepted = (draft[:h] + [top[h]])[: limit - len(seq)]
            seq.extend(accepted)
            sampled.append(accepted)
    return sequences


def _engine_drafts(model, prompt: list[int], width: int, new_tokens: int) -> tuple[list[int], dict]:
    """The engine's Linear-SS run: its tokens, and its draft for each prefix it drafted from."""
    records = list(decode(model, prompt, DecodeConfig(block_size=width + 1, max_new_tokens=new_tokens), "linear"))
    tokens = list(prompt) + [t for r in records for t in r.appended]
    return tokens, {tuple(tokens[: r.prefix_len_before]): list(r.old_draft) for r in records[1:]}


def test_the_proposer_drafts_what_the_engines_linear_ss_drafts_call_for_call_on_a_batch_whose_rows_move(
        tmp_path, monkeypatch):
    """Three prompts decoded together, greedy, W = 3, the batch's rows reversed at step 3 (the caches follow their
    requests by content): every draft the engine's Linear-SS made is the proposer's draft for the same prefix, and
    the outputs are AR's."""
    model = tiny_llama(vocab_size=32, seed=11, logit_scale=4.0, eos=False)
    prompts, width, new = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14]], 3, 14
    log = tmp_path / "drafts.jsonl"
    proposer = _proposer(model, width, log, monkeypatch)
    outputs = _vllm_loop(model, proposer, prompts, new, shuffle_at=3)[::-1]
    logged = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        logged[tuple(entry["prefix"])] = entry["draft"]
    compared = 0
    for prompt, output in zip(prompts, outputs):
        tokens, drafts = _engine_drafts(model, prompt, width, new)
        ar = list(prompt) + [t for r in decode(model, prompt, DecodeConfig(max_new_tokens=new), "ar")
                             for t in r.appended]
        assert output == tokens == ar
        for prefix, draft in drafts.items():
            assert logged[prefix] == draft, prefix
            compared += 1
    assert compared >= 12


def test_each_prefix_token_is_computed_once_per_request(tmp_path, monkeypatch):
    """The proposer extends its cache by the tokens committed since its last draft only: over a run, the rows it
    computes are the prefix (once) plus B rows per draft."""
    model = tiny_llama(vocab_size=32, seed=11, logit_scale=4.0, eos=False)
    proposer = _proposer(model, 3)
    rows = []
    original = proposer._draft

    def counted(cache, prefix, temperature):
        rows.append(len(prefix) - 1 - len(cache.tokens) + 1 + proposer.width)
        return original(cache, prefix, temperature)

    proposer._draft = counted
    (output,) = _vllm_loop(model, proposer, [[3, 4, 5, 6]], 12)
    last_prefix = max(proposer.caches.values(), key=lambda c: len(c.tokens))
    assert sum(rows) == len(last_prefix.tokens) + len(rows) * (1 + proposer.width)
    assert last_prefix.tokens == output[: len(last_prefix.tokens)]


def test_requests_with_one_prompt_in_one_batch_share_its_keys_once_and_keep_caches_of_their_own():
    """Three requests of the same prompt decoded together (as 1,200 were in vLLM): the first computes the prompt's
    keys, the others copy them (no prompt row computed twice), each keeps a cache of its own, and all three get the
    engine's Linear-SS drafts and AR's tokens."""
    model = tiny_llama(vocab_size=32, seed=11, logit_scale=4.0, eos=False)
    proposer = _proposer(model, 3)
    extended = []
    original = proposer._draft

    def counted(cache, prefix, temperature):
        extended.append(len(prefix) - 1 - len(cache.tokens))
        return original(cache, prefix, temperature)

    proposer._draft = counted
    prompt = [3, 4, 5, 6, 7, 8]
    outputs = _vllm_loop(model, proposer, [prompt] * 3, 10)
    tokens, _ = _engine_drafts(model, prompt, 3, 10)
    assert outputs == [tokens] * 3
    assert extended[:3] == [len(prompt), 0, 0]  # the first step: prompt and first token, then two copies
    assert len({id(cache) for cache in proposer.caches.values()}) == 3


def test_at_t_above_0_the_proposer_draws_from_the_engines_drafter_distribution_and_hands_it_to_the_verifier():
    """T = 0.8 on one row, greedy on the other: the sampled row's q is the engine's drafting call's warped
    distribution on the same prefix, its draft comes from q's support, and the runner holds q for vLLM's rejection
    sampler (greedy rows as point masses on their drafts)."""
    model = tiny_llama(vocab_size=32, seed=5, logit_scale=2.0, eos=False)
    runner = Runner([0.8, 0.0], ["a", "b"])
    proposer = _proposer(model, 3, runner=runner)
    prefixes = [[3, 4, 5, 6, 7], [8, 9, 10]]
    buffer = np.zeros((2, 400), dtype=np.int64)
    for row, prefix in enumerate(prefixes):
        buffer[row, :len(prefix)] = prefix
    drafts = proposer.propose([[7], [10]], np.array([5, 3]), buffer)
    q = runner._draft_probs
    assert runner._draft_prob_req_ids == ["a", "b"] and q.shape == (2, 3, 32)
    # the engine's drafting call on the first prefix: the cache holds the prefix less its last token
    prefix = prefixes[0]
    model.reset(64, 4)
    model.forward(verify_layout(prefix[:-1], [], 0), ())
    model.rollback(len(prefix) - 1)
    layout = draft_layout(prefix[-1], 3, len(prefix) - 1, model.mask_token_id)
    logits = model.forward(layout, layout.draft_rows).logits.clone()
    logits[:, model.mask_token_id] = float("-inf")
    engine_q = warp(logits, 0.8)
    assert torch.allclose(q[0].double(), engine_q, atol=1e-6)
    assert all(engine_q[i, token] > 0 for i, token in enumerate(drafts[0]))
    assert torch.equal(q[1], torch.nn.functional.one_hot(torch.tensor(drafts[1]), 32).float())


def test_a_drafter_lora_changes_the_draft_rows_only_as_in_the_engine(tmp_path, monkeypatch):
    """A peft LoRA on o_proj and down_proj of a Llama folder: the proposer's drafts equal the engine's Linear-SS
    drafts with the same adapter (it touches the draft block only), and differ from the drafts without it."""
    from packed_ss.models import DualModeModel

    base = tiny_llama(vocab_size=32, seed=11, logit_scale=4.0, eos=False)
    folder = tmp_path / "model"
    base.model.save_pretrained(folder)
    base.tokenizer.save_pretrained(folder) if hasattr(base.tokenizer, "save_pretrained") else None
    state = {name: tensor for name, tensor in base.model.state_dict().items()}
    write_lora_adapter(tmp_path / "lora", state, rank=4, alpha=8, targets=("o_proj", "down_proj"))
    monkeypatch.setenv("PACKED_SS_DRAFTER_LORA", str(tmp_path / "lora"))
    adapted = DualModeModel.from_pretrained(str(folder), device="cpu", dtype="float64",
                                            drafter_lora=str(tmp_path / "lora"))
    prompt, width, new = [3, 4, 5, 6], 3, 10
    config = DecodeConfig(block_size=width + 1, max_new_tokens=new, drafter_lora=True)
    records = list(decode(adapted, prompt, config, "linear"))
    tokens = prompt + [t for r in records for t in r.appended]
    proposer = _proposer(base, width, tmp_path / "log.jsonl", monkeypatch)
    assert proposer.lora is not None
    _vllm_loop(base, proposer, [prompt], new)
    entries = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    logged = {tuple(entry["prefix"]): entry["draft"] for entry in entries}
    plain = {tuple(tokens[: r.prefix_len_before]): list(r.old_draft)
             for r in decode(base, prompt, DecodeConfig(block_size=width + 1, max_new_tokens=new), "linear")}
    with_adapter = {tuple(tokens[: r.prefix_len_before]): list(r.old_draft) for r in records[1:]}
    assert all(logged[prefix] == draft for prefix, draft in with_adapter.items())
    assert any(plain.get(prefix) not in (None, draft) for prefix, draft in with_adapter.items())
    for entry in entries:  # and the drafter's confidence, to rounding: the cached prefix rows never saw the adapter
        prefix = entry["prefix"]
        adapted.reset(64, 4)
        adapted.forward(verify_layout(prefix[:-1], [], 0), ())
        adapted.rollback(len(prefix) - 1)
        layout = draft_layout(prefix[-1], width, len(prefix) - 1, adapted.mask_token_id)
        logits = adapted.forward(layout, layout.draft_rows, adapter_rows=layout.proposal_rows).logits.clone()
        logits[:, adapted.mask_token_id] = float("-inf")
        assert torch.allclose(torch.softmax(logits, -1).amax(-1), torch.tensor(entry["q_max"], dtype=logits.dtype),
                              atol=1e-9), prefix


def test_the_correction_of_vllms_cpu_expansion_repeats_each_requests_value_per_token():
    """vLLM's contract: x = [a, b, c] over cumulative counts [2, 5, 6] gives [a, a, b, b, b, c], replace_from values
    replaced; a module whose expansion returns other values (vLLM 0.32.0's CPU build returns its uninitialised output)
    is found faulty and corrected, a sound one is left alone."""
    got = cpu_sampling_fix.expand_batch_to_tokens(torch.tensor([0.7, 0.0, 1.3]), torch.tensor([2, 5, 6]), 6,
                                                  replace_from=0.0, replace_to=1.0)
    assert got.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    assert cpu_sampling_fix.expand_batch_to_tokens(torch.tensor([5, 7], dtype=torch.int32), torch.tensor([0, 3]),
                                                   3).tolist() == [7, 7, 7]
    broken = SimpleNamespace(expand_batch_to_tokens=lambda x, cu, n, *a: x.new_empty(n).fill_(float("nan")))
    sound = SimpleNamespace(expand_batch_to_tokens=cpu_sampling_fix.expand_batch_to_tokens)
    assert cpu_sampling_fix.faulty(broken) and not cpu_sampling_fix.faulty(sound)


def test_a_model_without_a_mask_token_is_refused_in_one_line():
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3),
                             model_config=SimpleNamespace(hf_config=SimpleNamespace(), max_model_len=64, seed=0))
    with pytest.raises(ValueError, match="no mask_token_id: Linear-SS drafts with the mask token"):
        LinearSSProposer(config)


def _vllm_here() -> bool:
    from packed_ss.vllm_lanes import env_python, vllm_problem

    return env_python().exists() and vllm_problem() is None


@pytest.mark.slow
@pytest.mark.skipif(not _vllm_here(), reason="vLLM's environment is not installed (bash scripts/make_vllm_env.sh)")
def test_in_vllm_the_proposer_is_lossless_and_drafts_as_the_engines_linear_ss_greedy_and_at_t_above_0(tmp_path):
    """The embedded model in float32, B = 8, in vLLM's own process:
    - greedy, three prompts as one batch: AR's tokens, and the engine's Linear-SS drafts call for call, vLLM's
      accepted drafts equal to the engine's h summed;
    - T = 1: the drafter's distribution equals the engine's drafting call's on every prefix vLLM drafted from, and
      vLLM's sampler received it;
    - T = 1, 400 requests of 2 new tokens: the pairs (t1, t2), t2 verified from a draft, follow the model's own
      distribution (chi-square over pairs with an expected count of at least 5, the rest pooled)."""
    from scipy.stats import chisquare
    from tokenizers import Tokenizer

    from packed_ss.models import DualModeModel
    from packed_ss.vllm_lanes import VllmWorker

    model = DualModeModel.from_pretrained(EMBEDDED, device="cpu", dtype="float32")
    tokenizer = Tokenizer.from_file(str(EMBEDDED / "tokenizer.json"))
    prompts = [tokenizer.encode(text).ids for text in ("def fibonacci(n):\n", "import os\n\ndef list_files(path):\n",
                                                         "class Stack:\n    def push(self, item):\n")]
    log = tmp_path / "drafts.jsonl"
    lane = VllmWorker(EMBEDDED, "float32", "linear", 7, 512, 1, proposer_log=log)
    try:
        answer = lane.generate_batch(prompts, 48)
        log_lines = log.read_text().splitlines()
        entries = [json.loads(line) for line in log_lines]
        logged = {tuple(e["prefix"]): e["draft"] for e in entries}
        accepted = 0
        for prompt, output in zip(prompts, answer["token_ids"]):
            config = DecodeConfig(block_size=8, max_new_tokens=48)
            ar = [t for r in decode(model, prompt, config, "ar") for t in r.appended]
            records = list(decode(model, prompt, config, "linear"))
            tokens = prompt + [t for r in records for t in r.appended]
            assert output == ar == tokens[len(prompt):]
            for r in records[1:]:
                assert logged[tuple(tokens[: r.prefix_len_before])] == list(r.old_draft)
            accepted += sum(r.h for r in records[1:])
        assert answer["accepted"] == accepted

        done = len(log_lines)
        lane.generate_batch(prompts, 24, temperature=1.0, seed=3)
        sampled = [json.loads(line) for line in log.read_text().splitlines()[done:]]
        assert sampled and all(e["q_to_verifier"] for e in sampled)
        for entry in sampled[::5]:
            prefix = entry["prefix"]
            model.reset(len(prefix) + 16, 8)
            model.forward(verify_layout(prefix[:-1], [], 0), ())
            model.rollback(len(prefix) - 1)
            layout = draft_layout(prefix[-1], 7, len(prefix) - 1, model.mask_token_id)
            logits = model.forward(layout, layout.draft_rows).logits.clone()
            logits[:, model.mask_token_id] = float("-inf")
            assert torch.allclose(torch.softmax(logits.double(), -1).amax(-1),
                                  torch.tensor(entry["q_max"], dtype=torch.float64), atol=1e-4), prefix

        prompt = tokenizer.encode("x = ").ids  # a prompt whose next two tokens are spread enough to test
        pairs = lane.generate_batch([prompt] * 1200, 2, temperature=1.0, seed=11)["token_ids"]
    finally:
        lane.close()
    observed, wanted = _pair_cells(model, prompt, [tuple(p) for p in pairs])
    assert len(observed) >= 6, "the test has no power on this prompt"
    assert chisquare(observed, wanted).pvalue > 1e-3


def _pair_cells(model, prompt: list[int], pairs: list[tuple[int, int]]) -> tuple[list[int], list[float]]:
    """Observed and expected counts of (t1, t2) at T = 1 under the model's own distribution: the pairs expected at
    least 5 times, each first token's other pairs pooled when expected at least 5 times, and the rest pooled."""
    with torch.no_grad():
        first = torch.softmax(model.model(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1)
        cells: dict = {}
        for t1 in sorted({pair[0] for pair in pairs}):
            second = torch.softmax(model.model(input_ids=torch.tensor([prompt + [t1]])).logits[0, -1].double(), -1)
            expected = first[t1] * second * len(pairs)
            big = {t2 for t2 in (expected >= 5).nonzero().flatten().tolist()}
            for t2 in big:
                cells[(t1, t2)] = float(expected[t2])
            rest = float(expected.sum()) - sum(cells[(t1, t2)] for t2 in big)
            if rest >= 5:
                cells[(t1, None)] = rest
    counts: dict = {}
    for t1, t2 in pairs:
        key = (t1, t2) if (t1, t2) in cells else (t1, None) if (t1, None) in cells else None
        counts[key] = counts.get(key, 0) + 1
    keys = list(cells)
    observed = [counts.get(key, 0) for key in keys] + [counts.get(None, 0)]
    wanted = [cells[key] for key in keys] + [len(pairs) - sum(cells.values())]
    return observed, wanted


def test_an_nld_checkpoint_exported_for_vllm_decodes_as_the_checkpoint_itself(tmp_path):
    """``python -m packed_ss.vllm_export`` on a tiny NLD checkpoint (NLD's names, yarn rope, the Llama-4 query scaling
    from position 64): the folder it writes is a Ministral3 causal LM that keeps the mask id and the query scaling, and
    the engine's Linear-SS on it gives the NLD checkpoint's tokens and drafts on a prompt that crosses position 64."""
    from helpers import write_nld_checkpoint
    from packed_ss.models import DualModeModel
    from packed_ss.vllm_export import main

    write_nld_checkpoint(tmp_path / "nld", head_dim=64, hidden_size=64)
    assert main([str(tmp_path / "nld"), str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["Ministral3ForCausalLM"] and config["mask_token_id"] == 100
    assert config["llama_4_scaling"] == {"original_max_position_embeddings": 64, "beta": 0.1}
    assert main([str(tmp_path / "nld"), str(tmp_path / "out")]) == 2  # a folder holding a checkpoint is kept
    prompt, config = [1] + [5 + (i * 7) % 90 for i in range(70)], DecodeConfig(block_size=4, max_new_tokens=12)
    runs = []
    for folder in (tmp_path / "nld", tmp_path / "out"):
        model = DualModeModel.from_pretrained(str(folder), device="cpu", dtype="float32")
        runs.append([(r.appended, r.old_draft) for r in decode(model, prompt, config, "linear")])
    assert runs[0] == runs[1]


@pytest.mark.slow
@pytest.mark.skipif(not _vllm_here(), reason="vLLM's environment is not installed (bash scripts/make_vllm_env.sh)")
def test_in_vllm_an_exported_nld_checkpoint_decodes_as_the_engine_does_past_its_query_scaling_window(tmp_path):
    """A tiny NLD checkpoint (query scaling from position 64) exported for vLLM: greedy, B = 4, a 71-token prompt,
    vLLM with the proposer gives the engine's Linear-SS tokens on the NLD checkpoint itself."""
    from helpers import write_nld_checkpoint
    from packed_ss.models import DualModeModel
    from packed_ss.vllm_export import export_for_vllm
    from packed_ss.vllm_lanes import VllmWorker

    write_nld_checkpoint(tmp_path / "nld", head_dim=64, hidden_size=64)
    export_for_vllm(tmp_path / "nld", tmp_path / "out")
    prompt = [1] + [5 + (i * 7) % 90 for i in range(70)]
    model = DualModeModel.from_pretrained(str(tmp_path / "nld"), device="cpu", dtype="float32")
    engine = [t for r in decode(model, prompt, DecodeConfig(block_size=4, max_new_tokens=40), "linear")
              for t in r.appended]
    lane = VllmWorker(tmp_path / "out", "float32", "linear", 3, 256, 1)
    try:
        assert lane.generate(prompt, 40)["token_ids"] == engine
    finally:
        lane.close()
