"""CLI: JSON output on a model folder built in the test, and one-line errors without tracebacks."""

import json
import subprocess
import sys

import pytest
from helpers import tiny_llama

from packed_ss.cli import main
from packed_ss.config import DecodeConfig


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "packed_ss", "generate", *args], capture_output=True, text=True,
                          timeout=300)


def test_json_output(tiny_model_dir):
    out = run_cli("--model", str(tiny_model_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "9", "--json",
                  "--schedule", "packed", "--block-size", "4")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("text", "token_ids", "nfe", "wall_s", "tokens_per_nfe", "iterations"):
        assert key in data
    assert 1 <= len(data["token_ids"]) <= 9 and data["nfe"] >= 1


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
])
def test_bad_arguments_exit_with_one_line(tiny_model_dir, args, message, capsys):
    code = main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", *args])
    err = capsys.readouterr().err
    assert code != 0
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


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
    from packed_ss.model import DualModeModel, ModelLoadError, hub_unreachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent/hf-home")
    assert hub_unreachable("someone/not-cached-model")
    with pytest.raises(ModelLoadError, match="cannot be reached"):
        DualModeModel.from_pretrained("someone/not-cached-model", device="cpu")
