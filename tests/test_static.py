"""The static KV cache and compiled calls (packed_ss.models.static): rollback, padding, shapes, fallback."""

import random
import warnings

import pytest
import torch
from helpers import tiny_llama

from packed_ss.config import DecodeConfig
from packed_ss.cost import PROBE_ROWS
from packed_ss.engine import generate
from packed_ss.layout import packed_layout, prefill_layout
from packed_ss.models import DualModeModel, ModelLoadError
from packed_ss.models.static import padded_rows
from packed_ss.schedules import LOSSLESS

EVERY = ("ar",) + LOSSLESS


def test_padded_row_counts_keep_the_papers_shapes_and_round_the_rest_up():
    assert [padded_rows(r, 4) for r in (1, 2, 4, 5, 8, 9, 20)] == [1, 4, 4, 8, 8, 12, 20]
    assert padded_rows(2 * 32, 32) == 64 and padded_rows(8 * 9, 8) == 72 and padded_rows(31, 32) == 32
    with pytest.raises(ValueError):
        padded_rows(0, 4)


def test_static_rollback_gives_the_dynamic_caches_logits_on_random_accept_reject_sequences():
    static = tiny_llama(seed=3, logit_scale=3.0)
    dynamic = DualModeModel(static.model, static.tokenizer, 1, 0, cache="dynamic")
    assert static.cache_kind == "static" and dynamic.cache_kind == "dynamic"
    rng = random.Random(0)
    prompt = [rng.randrange(2, 24) for _ in range(9)]
    for model in (static, dynamic):
        model.reset(9 + 200, 5)
        layout = prefill_layout(prompt, 0, 1)
        model.forward(layout, layout.verify_rows)
        model.rollback(len(prompt) - 1)
    prefix = list(prompt)
    for _ in range(40):
        draft = [rng.randrange(2, 24) for _ in range(rng.randrange(0, 5))]
        layout = packed_layout(prefix[-1], draft, 4, len(prefix) - 1, 1, pad=rng.random() < 0.5)
        rows = layout.verify_rows + layout.draft_rows
        a, b = static.forward(layout, rows).logits, dynamic.forward(layout, rows).logits
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        accepted = rng.randrange(0, len(draft) + 1)  # h accepted draft tokens, then the correction
        prefix += draft[:accepted] + [int(a[accepted].argmax())]
        for model in (static, dynamic):
            model.rollback(len(prefix) - 1)
        assert static.cache_length == dynamic.cache_length == len(prefix) - 1
        if len(prefix) > 150:
            break


def test_the_static_cache_grows_inside_a_run_and_keeps_the_prefix():
    """Quadratic-SS's B(B + 1)-row calls do not fit a cache sized for prefix + new tokens + 2 blocks."""
    static, dynamic = tiny_llama(seed=5), tiny_llama(seed=5, cache="dynamic")
    config = DecodeConfig(block_size=16, max_new_tokens=30)
    assert generate(static, [3, 4, 5], config, "quadratic").token_ids == generate(dynamic, [3, 4, 5], config,
                                                                                   "quadratic").token_ids
    assert static.static.capacity > 256


def test_compile_is_refused_where_the_static_cache_cannot_be_used():
    model = tiny_llama()
    with pytest.raises(ModelLoadError, match="static cache"):
        DualModeModel(model.model, model.tokenizer, 1, 0, cache="dynamic", compiled=True)
    with pytest.raises(ValueError, match="cache must be one of"):
        DualModeModel(model.model, model.tokenizer, 1, 0, cache="paged")


def _broken_compiler(fn, **options):
    def run(*args, **kwargs):
        raise RuntimeError("C++ compile error: cannot find cc1plus\nsecond line")
    return run


def test_a_compile_failure_falls_back_to_eager_calls_with_one_warning(monkeypatch):
    reference = tiny_llama(seed=4, logit_scale=3.0)
    config = DecodeConfig(block_size=4, max_new_tokens=12)
    want = generate(reference, [5, 6, 7], config, "packed").token_ids
    monkeypatch.setattr(torch, "compile", _broken_compiler)
    model = tiny_llama(seed=4, logit_scale=3.0, compiled=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = generate(model, [5, 6, 7], config, "packed").token_ids
    assert got == want and not model.compiled
    assert model.compile_note.startswith("torch.compile failed (RuntimeError: C++ compile error") and \
        "\n" not in model.compile_note
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [model.compile_note]
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        shared = model.share()
    assert not shared.compiled and shared.compile_note == model.compile_note and not again  # said once

    def refuses(fn, **options):
        raise RuntimeError("no backend")
    monkeypatch.setattr(torch, "compile", refuses)
    with warnings.catch_warnings(record=True) as set_up:
        warnings.simplefilter("always")
        other = tiny_llama(seed=4, logit_scale=3.0, compiled=True)
        assert generate(other, [5, 6, 7], config, "packed").token_ids == want
    assert [str(w.message) for w in set_up if issubclass(w.category, RuntimeWarning)] == [other.compile_note]
    assert "no backend" in other.compile_note


@pytest.mark.slow
def test_every_schedule_on_the_compiled_path_gives_the_compiled_ars_tokens_with_few_shapes():
    """Tiny float64 model, B = 4: greedy outputs equal compiled AR's (and eager AR's); each run adds at most
    two compiled shapes (Partial-branch SS: one per branch count k = 0..W and its cost probe's row counts)."""
    compiled = tiny_llama(seed=6, logit_scale=3.0, compiled=True)
    assert compiled.path == "native"
    eager = DualModeModel(compiled.model, compiled.tokenizer, 1, 0)
    prompt = [4, 9, 2, 7, 3]
    config = DecodeConfig(block_size=4, max_new_tokens=24)
    ar = generate(compiled, prompt, config, "ar").token_ids
    assert ar == generate(eager, prompt, config, "ar").token_ids
    for name in EVERY:
        before = len(compiled.static.shapes)
        assert generate(compiled, prompt, config, name).token_ids == ar, name
        bound = 4 + len(PROBE_ROWS) if name == "partial" else 2
        assert len(compiled.static.shapes) - before <= bound, (name, compiled.static.shapes)
    assert compiled.compiled and compiled.compile_note is None
    assert len(compiled.static.shapes) <= 12, compiled.static.shapes
    shared, spent = compiled.share(), compiled.static.compile_s
    assert generate(shared, prompt, config, "packed").token_ids == ar
    assert shared.static.compile_s == 0 and compiled.static.compile_s == spent  # its shapes were compiled already
    assert all(rows == 1 or rows % 4 == 0 for rows, _ in compiled.static.shapes)


@pytest.mark.slow
def test_the_shipped_model_compiled_gives_ars_tokens(embedded_model):
    """float32 compiled against float64 eager would differ at near-ties; both are float64 here."""
    compiled = DualModeModel(embedded_model.model, embedded_model.tokenizer, embedded_model.mask_token_id,
                             embedded_model.eos_token_id, compiled=True)
    prompt = embedded_model.encode("def add(a, b):\n    return")
    config = DecodeConfig(block_size=4, max_new_tokens=16)
    ar = generate(embedded_model, prompt, config, "ar").token_ids
    for name in ("ar", "packed"):  # the rest, each on the tiny model (test above): each shape compiles for seconds
        assert generate(compiled, prompt, config, name).token_ids == ar, name
    assert compiled.compiled and {rows for rows, _ in compiled.static.shapes} <= {1, 4, 8}


def test_compile_with_the_dynamic_cache_is_one_line_from_the_cli_and_the_benchmark(tiny_model_dir, capsys, tmp_path):
    from packed_ss.bench.cli import main as bench_main
    from packed_ss.cli import main as cli_main

    assert cli_main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--compile", "--cache",
                     "dynamic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the static cache" in err[0]
    assert bench_main(["--model", str(tiny_model_dir), "--compile", "--cache", "dynamic", "--limit", "1",
                       "--out", str(tmp_path / "out")]) == 2  # not the project's bench-out (it may hold results)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the static cache" in err[0]


def test_the_app_store_loads_compiled_models_and_keeps_serving_when_compiling_fails(tiny_model_dir, monkeypatch):
    from serve.models import ModelStore
    from serve.options import app_parser

    args = app_parser().parse_args(["--compile", "--cache", "static"])
    assert args.compile and args.cache == "static"
    monkeypatch.setattr(torch, "compile", _broken_compiler)
    store = ModelStore(str(tiny_model_dir), device="cpu", compiled=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = store.get(str(tiny_model_dir))  # its warm-up met the failure: eager from then on
    assert not model.compiled and "C++ compile error" in model.compile_note
    ids = model.encode("w1 w2")
    assert generate(model.share(), ids, DecodeConfig(block_size=4, max_new_tokens=6), "packed").tokens == 6


@pytest.mark.slow
def test_the_benchmarks_compiled_reference_rows(tiny_model_dir, tmp_path):
    """``ar-eager`` beside compiled AR and transformers' static-cache compiled ``generate``: same tokens as AR,
    compile time reported apart (every shape met in the warm-up, the probe's B = 3 included: reported, its
    compile time fell inside the probe's runs). float64: float32's GEMM tuning would double the compile time here
    (test_native compiles float32)."""
    import json

    from packed_ss.bench.cli import main as bench_main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2 w3"}\n{"prompt": "w4 w5"}\n')
    out = tmp_path / "out"
    assert bench_main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--schedules",
                       "ar,ar-eager,packed,hf-greedy-compiled", "--block-size", "4", "--max-new-tokens", "8",
                       "--threads", "1", "--compile", "--resamples", "200", "--probe-block-sizes", "3",
                       "--dtype", "float64",
                       "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    meta = summary["meta"]
    assert meta["compiled"] and meta["cache"] == "static" and meta["compile_s_in_timed_runs"] == 0
    assert meta["compile_s_warm_up"] > 0 and [1, 256] in meta["compiled_shapes"]
    by_schedule = summary["lossless"]["by_schedule"]
    assert {name: row["differing"] for name, row in by_schedule.items()} == {
        "ar-eager": 0, "packed": 0, "hf-greedy-compiled": 0}
    assert "Model calls: compiled" in (out / "summary.md").read_text()


def test_compile_settings_from_the_environment_and_the_app_are_checked(monkeypatch, capsys, tiny_model_dir):
    """Reported: PACKED_SS_COMPILE=on was silently ignored and could not be overridden; the app started with
    --compile --cache dynamic and showed visitors an operator's error."""
    from packed_ss.cli import compile_from_env, main as cli_main
    from serve.options import app_parser, options_problem

    for value, wanted in (("on", True), ("1", True), ("TRUE", True), ("0", False), ("off", False), ("", None)):
        monkeypatch.setenv("PACKED_SS_COMPILE", value)
        assert compile_from_env() is wanted
    monkeypatch.setenv("PACKED_SS_COMPILE", "2")
    assert cli_main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1"]) == 2
    assert "PACKED_SS_COMPILE='2'" in capsys.readouterr().err
    monkeypatch.setenv("PACKED_SS_COMPILE", "1")
    args = app_parser().parse_args(["--cache", "dynamic"])
    assert "needs the static cache" in options_problem(args, [])
    assert options_problem(app_parser().parse_args(["--cache", "dynamic", "--no-compile"]), []) is None


def test_a_failing_compiled_reference_row_is_one_line_before_anything_is_measured(tiny_model_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    """Reported: with no working C++ compiler, hf-greedy-compiled crashed the benchmark with a traceback."""
    import packed_ss.hf_reference as reference
    from packed_ss.bench.cli import main as bench_main

    monkeypatch.setattr(reference, "compiled_generate_options", lambda model, tokens: {"cache_implementation": "nope"})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2 w3"}\n')
    for warm in ([], ["--no-warmup"]):  # failing in the warm-up or in the first timed run
        code = bench_main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--schedules",
                           "ar,hf-greedy-compiled", "--max-new-tokens", "4", "--out", str(tmp_path / "out"), *warm])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and err.count("error:") == 1
        assert "error: hf-greedy-compiled: transformers' generate failed (ValueError" in err
        assert not (tmp_path / "out" / "summary.json").exists()
