"""CLI: JSON output on a model folder built in the test, and one-line errors without tracebacks."""

import json
import subprocess
import sys

import pytest
from helpers import tiny_llama

from packed_ss.cli import main
from packed_ss.config import DecodeConfig


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """``python -m packed_ss generate ARGS --threads 1`` in this process: (exit status, stdout, stderr). One thread:
    the thread probe is the subject of tests/test_threads.py; here it would only add seconds."""
    code = main(["generate", *args, "--threads", "1"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_output(tiny_model_dir, capsys):
    code, out, err = run_cli(capsys, "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "9",
                             "--json", "--schedule", "packed", "--block-size", "4")
    assert code == 0, err
    data = json.loads(out)
    for key in ("text", "token_ids", "nfe", "wall_s", "tokens_per_nfe", "iterations"):
        assert key in data
    assert 1 <= len(data["token_ids"]) <= 9 and data["nfe"] >= 1
    # which forward ran, and each call's model time over the floor (one read of the weights, issue 55)
    assert data["path"] in ("native", "transformers") and data["graphs"] is False
    floor = data["floor"]
    assert floor["floor_ms"] > 0 and floor["median_over_floor"] > 0 and floor["max_over_floor"] >= floor["median_over_floor"]
    assert sum(1 for _ in floor["median_over_floor_by_rows"]) >= 1
    per_call = floor["over_floor_per_call"]  # every call's own ratio, the prefill first
    assert len(per_call) == len(floor["rows_per_call"]) == data["nfe"] and all(r > 0 for r in per_call)
    assert max(per_call) == floor["max_over_floor"] and floor["rows_per_call"][0] >= 3  # the prefill: the prompt


@pytest.mark.parametrize("args,message", [
    (["--schedule", "cubic"], "unknown schedule"),
    (["--block-size", "1"], "block size"),
    (["--temperature", "-0.5"], "temperature"),
    (["--max-new-tokens", "0"], "limit"),
    (["--prompt", ""], "prompt is empty"),
    (["--temperature", "inf"], "finite"),
    (["--top-p", "inf"], "top-p must be in"),
    (["--seed", str(2**70)], "seed must be an integer"),
    (["--dtype", "float8"], "--dtype"),
    (["--device", "nonsense"], "--device"),
    (["--device", "meta"], "--device"),
    (["--threads", "0"], "--threads"),
])
def test_bad_arguments_exit_with_one_line(tiny_model_dir, args, message, capsys):
    code = main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", *args])
    err = capsys.readouterr().err
    assert code != 0
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--schedule", "lookup"], "does not run on an any-order model"),
    (["--schedule", "partial"], "does not run on an any-order model"),
])
def test_a_run_refused_after_loading_prints_one_line(tiny_any_order_dir, args, message, capsys):
    """With the dynamic cache the model keeps transformers' forward, and its ``note:`` line (like the threads line)
    is printed only once the run is accepted: a refusal after loading is the one ``error:`` line (reported in
    on the any-order model)."""
    dynamic = ["--model", str(tiny_any_order_dir), "--prompt", "w1 w2", "--cache", "dynamic"]
    code = main(["generate", *dynamic, "--threads", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert err.strip().splitlines() == [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, *dynamic, "--max-new-tokens", "2")
    assert code == 0 and "note: transformers' forward" in err  # an accepted run still says which forward runs


@pytest.mark.parametrize("args,message", [
    (["--prompt", "w1", "--block-size", "2.5"], "invalid int value"),
    (["--prompt", "w1", "--unknown-flag"], "unrecognized arguments"),
    ([], "--prompt"),
])
def test_argparse_errors_are_one_line_too(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and "usage:" not in err and len(err.strip().splitlines()) == 1


def test_missing_model_folder_and_missing_mask_token(tmp_path, tiny_model_dir, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "w1"]) != 0
    assert "does not exist" in capsys.readouterr().err
    no_mask = tmp_path / "nomask"
    model = tiny_llama(vocab_size=20, seed=2)
    model.model.float().save_pretrained(no_mask)
    tok = model.tokenizer
    tok.mask_token = None
    tok.save_pretrained(no_mask)
    assert main(["generate", "--model", str(no_mask), "--prompt", "w1"]) != 0
    assert "mask token" in capsys.readouterr().err


def test_config_rejects_bad_values():
    for kwargs in ({"block_size": 1}, {"temperature": -1.0}, {"max_new_tokens": 0}, {"top_p": 0.0}, {"top_k": -1}):
        with pytest.raises(ValueError):
            DecodeConfig(**kwargs)


def test_unreachable_hub_fails_fast_with_a_clear_message(monkeypatch):
    """Offline, a hub id is looked up in the local cache only: one clear error, no retry loop."""
    from packed_ss.models import DualModeModel, ModelLoadError, hub_unreachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent/hf-home")
    assert hub_unreachable("someone/not-cached-model")
    with pytest.raises(ModelLoadError, match="cannot be reached"):
        DualModeModel.from_pretrained("someone/not-cached-model", device="cpu")


# --- issue 11: inputs that used to end in a traceback or an unclear message ------------------------------
@pytest.mark.parametrize("temperature", ["1e-308", "5e-324"])
def test_tiny_temperature_works_and_equals_greedy(tiny_model_dir, temperature, capsys):
    base = ["--model", str(tiny_model_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "8", "--json"]
    code, tiny, err = run_cli(capsys, *base, "--temperature", temperature, "--seed", "4")
    assert code == 0, err
    code, greedy, err = run_cli(capsys, *base)
    assert code == 0, err
    assert json.loads(tiny)["token_ids"] == json.loads(greedy)["token_ids"]


def test_prompt_bytes_that_are_not_utf8_are_one_line(tiny_model_dir):
    out = subprocess.run([sys.executable, "-m", "packed_ss", "generate", "--model", str(tiny_model_dir),
                          "--prompt", b"w1 \xff\xfe w2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "not valid Unicode" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_prompt_file_that_is_not_utf8_is_named(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "latin1.py"
    path.write_bytes("def café():\n".encode("latin-1"))
    code, _, err = run_cli(capsys, "--model", str(tiny_model_dir), "--prompt-file", str(path))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"prompt file {str(path)!r} is not UTF-8 text" in err


def test_huge_block_size_message_stays_short(tiny_model_dir, capsys):
    code = main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--block-size", str(10**300)])
    err = capsys.readouterr().err
    assert code == 2 and "block size" in err and "301-digit" in err and len(err) < 200


def test_whitespace_prompt_and_the_reported_mask_token_case_on_the_shipped_model(embedded_model, capsys):
    from conftest import EMBEDDED

    code, _, err = run_cli(capsys, "--model", str(EMBEDDED), "--prompt", "    ", "--max-new-tokens", "3", "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "--model", str(EMBEDDED), "--schedule", "packed", "--prompt", "    return ",
                             "--temperature", "2", "--seed", "179", "--max-new-tokens", "4", "--json")
    assert code == 0, err
    assert embedded_model.mask_token_id not in json.loads(out)["token_ids"]


@pytest.fixture
def fifo(tmp_path):
    import os

    path = tmp_path / "prompt.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("command, args, message", [
    ("generate", ["--prompt-file", "{fifo}"], "is not a regular file"),
    ("generate", ["--prompt", "x", "--threads", "100000"], "--threads must be from 1 to"),
    ("bench", ["--prompts", "{fifo}", "--out", "{tmp}/out"], "is not a regular file"),
    ("bench", ["--threads", "10000", "--out", "{tmp}/out"], "--threads must be from 1 to"),
    ("bench", ["--out", "{tmp}/" + "x" * 300], "cannot write to --out"),
])
def test_inputs_that_would_block_crash_or_trace_get_one_line(tmp_path, fifo, command, args, message):
    """A FIFO as the prompt file blocked the CLI; --threads 100000 crashed torch; a folder name too long for
    the file system gave a traceback. Each is now an error line and exit status 2, before any model loads."""
    args = [a.format(fifo=fifo, tmp=tmp_path) for a in args]
    module = ["-m", "packed_ss", "generate"] if command == "generate" else ["-m", "packed_ss.bench"]
    out = subprocess.run([sys.executable, *module, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr[-500:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr, out.stderr[-500:]


def test_a_run_that_cannot_fit_the_models_positions_is_refused_before_the_model_loads(monkeypatch, capsys):
    """`--max-new-tokens 1000000000` was refused only after loading the model and measuring threads (issue 54)."""
    import packed_ss.cli as cli

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli, "load_model", never)
    assert cli.main(["generate", "--prompt", "x", "--max-new-tokens", "1000000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: 1,000,000,000 new tokens + 2 blocks of 8 exceed the model's 2,048 positions even with a "
                   "one-token prompt: lower --max-new-tokens to at most 2,031"), err
