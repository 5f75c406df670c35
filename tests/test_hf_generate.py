"""The schedules behind transformers' ``generate`` (packed_ss.hf_generate): greedy runs equal transformers' own greedy
decoding on the embedded model, the figures come back with ``return_dict_in_generate``, a checkpoint's
``custom_generate/`` folder runs them, and what the engine cannot honour is one ValueError."""

import functools
import shutil
import sys
from pathlib import Path

import pytest
import torch

import packed_ss
from packed_ss import DecodeConfig
from packed_ss.hf_generate import SpeculativeDecoderOnlyOutput, write_custom_generate
from packed_ss.models import DualModeModel, ModelLoadError

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "assets" / "model"
PROMPT = "def fibonacci(n):\n"
NEW = 40  # tokens per run: long enough for every schedule to accept several drafts on the embedded model
SCHEDULES = ("ar", "linear", "quadratic", "packed")


@pytest.fixture(scope="module")
def hf():
    """The embedded model as transformers loads it (float32, CPU), its tokenizer and the prompt's inputs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(EMBEDDED, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED)
    return model, tokenizer, tokenizer(PROMPT, return_tensors="pt")


@pytest.fixture(scope="module")
def greedy(hf):
    """transformers' own greedy decoding of the prompt: (1, P + NEW) ids."""
    model, _, inputs = hf
    return model.generate(**inputs, do_sample=False, max_new_tokens=NEW)


def run(hf, **settings):
    model, _, inputs = hf
    return model.generate(**inputs, custom_generate=packed_ss.custom_generate, **{"max_new_tokens": NEW, **settings})


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_greedy_schedules_equal_transformers_greedy(hf, greedy, schedule):
    out = run(hf, schedule=schedule, block_size=8)
    assert out.dtype == torch.long and out.shape == greedy.shape  # (1, P + N): no EOS within NEW tokens here
    assert torch.equal(out, greedy)


def test_the_dict_output_carries_the_sequences_and_the_runs_figures(hf, greedy):
    out = run(hf, schedule="packed", return_dict_in_generate=True)
    from transformers.generation import GenerateDecoderOnlyOutput

    assert isinstance(out, SpeculativeDecoderOnlyOutput) and isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, greedy) and out.scores is None
    assert out.nfe == out.metrics["nfe"] == sum(len(record.calls) for record in out.records)
    assert out.nfe < NEW  # drafts were accepted: fewer model calls than tokens
    assert out.tokens_per_nfe == pytest.approx(NEW / out.nfe)
    assert out.mean_acceptance_length > 1 and out.metrics["schedule"] == "packed"
    assert out.metrics["token_ids"] == greedy[0, -NEW:].tolist() and out.metrics["text"] == ""  # no tokenizer given


def test_a_bound_tokenizer_gives_the_text(hf, greedy):
    model, tokenizer, inputs = hf
    out = model.generate(**inputs, custom_generate=functools.partial(packed_ss.custom_generate, tokenizer=tokenizer),
                         max_new_tokens=NEW, return_dict_in_generate=True)
    assert out.metrics["text"] == tokenizer.decode(greedy[0, -NEW:].tolist())


def test_the_generation_configs_eos_ends_the_run_as_in_transformers(hf, greedy):
    model, _, inputs = hf
    prompt_len = inputs["input_ids"].shape[1]
    eos = int(greedy[0, prompt_len + 10])  # a token transformers' greedy run writes: the run stops there
    ours = run(hf, schedule="packed", eos_token_id=eos)
    theirs = model.generate(**inputs, do_sample=False, max_new_tokens=NEW, eos_token_id=eos)
    assert torch.equal(ours, theirs) and ours.shape[1] < greedy.shape[1] and int(ours[0, -1]) == eos


def test_sampling_settings_reach_the_engine(hf, greedy):
    # top_k=1 leaves one token to sample: the greedy run, whatever the seed
    assert torch.equal(run(hf, schedule="packed", do_sample=True, top_k=1, seed=3), greedy)
    first = run(hf, schedule="packed", do_sample=True, temperature=1.5, top_k=0, seed=7)
    assert torch.equal(first, run(hf, schedule="packed", do_sample=True, temperature=1.5, top_k=0, seed=7))
    assert not torch.equal(first, greedy)  # at T = 1.5 over the whole vocabulary the run leaves the greedy one


@pytest.mark.parametrize("settings, words", [
    ({"schedule": "nope"}, ("'nope'", "ar", "packed", "quadratic")),
    ({"schedule": 3}, ("schedule must be a name",)),
    ({"block_size": 1}, ("block size", "[2, 64]")),
    ({"order": "random"}, ("order", "ltr", "confidence")),
    ({"num_beams": 2}, ("num_beams=2", "one sequence")),
    ({"repetition_penalty": 1.3}, ("RepetitionPenaltyLogitsProcessor", "temperature, top_k and top_p")),
    ({"max_time": 10.0}, ("MaxTimeCriteria",)),
    ({"return_dict_in_generate": True, "output_scores": True}, ("output_scores",)),
    ({"eos_token_id": [0, 2]}, ("one end-of-sequence id", "[0, 2]")),
])
def test_what_the_engine_cannot_honour_is_one_value_error(hf, settings, words):
    with pytest.raises(ValueError) as error:
        run(hf, **settings)
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message


def test_more_than_one_sequence_or_padding_is_refused(hf):
    model, tokenizer, _ = hf
    two = torch.tensor([[533, 293, 10], [533, 293, 11]])
    with pytest.raises(ValueError, match=r"one sequence at a time: input_ids has shape \(2, 3\)"):
        model.generate(input_ids=two, custom_generate=packed_ss.custom_generate, max_new_tokens=4)
    padded = {"input_ids": two[:1], "attention_mask": torch.tensor([[0, 1, 1]])}
    with pytest.raises(ValueError, match="padding"):
        model.generate(**padded, custom_generate=packed_ss.custom_generate, max_new_tokens=4)


def test_a_model_without_a_mask_token_is_refused_in_one_line():
    from helpers import tiny_llama

    network = tiny_llama(vocab_size=24).model  # a plain causal LM: no mask_token_id in its config
    with pytest.raises(ModelLoadError) as error:
        network.generate(input_ids=torch.tensor([[3, 4, 5]]), custom_generate=packed_ss.custom_generate,
                         max_new_tokens=4)
    assert isinstance(error.value, ValueError) and "\n" not in str(error.value)
    assert "not a dual-mode model" in str(error.value) and "mask_token_id" in str(error.value)
    # the same network with its mask id named decodes
    out = network.generate(input_ids=torch.tensor([[3, 4, 5]]), custom_generate=packed_ss.custom_generate,
                           max_new_tokens=4, mask_token_id=1, eos_token_id=None)
    assert out.shape == (1, 7)


def test_an_any_order_network_runs_the_any_order_schedules_as_packed_ss_generate_does():
    from helpers import tiny_any_order

    model = tiny_any_order(vocab_size=24, seed=3)  # DualModeModel: mask 1, EOS 0; its network says any_order
    settings = DecodeConfig(block_size=4, max_new_tokens=12, order="confidence")
    ours = packed_ss.generate(model, [5, 6, 7], settings, "packed")
    out = model.model.generate(input_ids=torch.tensor([[5, 6, 7]]), custom_generate=packed_ss.custom_generate,
                               schedule="packed", block_size=4, order="confidence", max_new_tokens=12,
                               mask_token_id=1, eos_token_id=0)
    assert out[0, 3:].tolist() == list(ours.token_ids)
    with pytest.raises(ValueError, match="does not run on an any-order model"):
        model.model.generate(input_ids=torch.tensor([[5, 6, 7]]), custom_generate=packed_ss.custom_generate,
                             schedule="lookup", max_new_tokens=4, mask_token_id=1)


def test_an_nld_network_loaded_by_packed_ss_equals_transformers_greedy(nld_model):
    network = nld_model.model  # Ministral3ForCausalLM; from_pretrained put the mask id into its config
    ids = torch.tensor([[nld_model.bos_token_id, 5, 9, 14]])
    theirs = network.generate(input_ids=ids, do_sample=False, max_new_tokens=16)
    for schedule in ("linear", "packed"):
        assert torch.equal(network.generate(input_ids=ids, custom_generate=packed_ss.custom_generate,
                                            schedule=schedule, max_new_tokens=16), theirs)


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A copy of the embedded model carrying custom_generate/generate.py; transformers copies that module into
    a modules cache of this test's own (not the user's ~/.cache)."""
    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # transformers appends its modules cache
    folder = tmp_path / "checkpoint"
    shutil.copytree(EMBEDDED, folder)
    written = write_custom_generate(folder)
    assert written == folder / "custom_generate" / "generate.py" and "checkpoint_generate" in written.read_text()
    return folder


def test_a_checkpoints_custom_generate_folder_runs_the_schedules(checkpoint, hf, greedy):
    from transformers import AutoModelForCausalLM

    _, tokenizer, inputs = hf
    # loaded with trust_remote_code, the checkpoint's generate is packed-ss's
    own = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, trust_remote_code=True)
    assert torch.equal(own.generate(**inputs, schedule="quadratic", max_new_tokens=NEW), greedy)
    # a model loaded without it runs the folder's generate when asked to
    model = hf[0]
    out = model.generate(**inputs, custom_generate=str(checkpoint), trust_remote_code=True, schedule="linear",
                         max_new_tokens=NEW, tokenizer=tokenizer, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy)
    assert out.metrics["text"] == tokenizer.decode(greedy[0, -NEW:].tolist())  # the tokenizer reached the run
    with pytest.raises(ValueError) as error:
        model.generate(**inputs, custom_generate=str(checkpoint), trust_remote_code=True, blok_size=4)
    assert "'blok_size'" in str(error.value) and "block_size" in str(error.value)
    with pytest.raises(ValueError, match="cannot use streamer"):
        model.generate(**inputs, custom_generate=str(checkpoint), trust_remote_code=True, streamer=object())
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        own.generate(**inputs, schedule="nope", max_new_tokens=4)


def test_the_folder_is_written_into_checkpoints_only(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint folder"):
        write_custom_generate(tmp_path)
    assert not (tmp_path / "custom_generate").exists()


def test_wrapping_needs_no_tokenizer_but_text_does(hf):
    model, tokenizer, _ = hf
    bare = DualModeModel.wrap(model)
    assert (bare.mask_token_id, bare.eos_token_id, bare.never_emit_ids) == (1, 0, (1,))
    with pytest.raises(ValueError, match="without a tokenizer"):
        bare.decode([5])
    assert DualModeModel.wrap(model, tokenizer=tokenizer).decode([533, 293]) == tokenizer.decode([533, 293])
