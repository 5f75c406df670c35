"""One run per result folder, and writes that a full disk or a file-size limit cannot leave half done (issue 35,
item 6): two runs into one --out at once both exited 0 and the second's results (or a mix) remained; a full disk
gave a traceback and left a partial result set and temporary files."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from packed_ss.bench.cli import main
from packed_ss.bench.files import LOCK, OutLock
from packed_ss.bench.plan import BenchError

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "assets" / "model"
GSM8K = ROOT / "docs" / "data" / "gsm8k-sample.jsonl"


def test_a_second_lock_on_one_folder_is_refused_until_the_first_ends(tmp_path):
    first = OutLock(tmp_path / "out")
    with pytest.raises(BenchError, match=r"is in use by another run \(pid \d+\): wait for it to end, or give"):
        OutLock(tmp_path / "out")
    first.release()
    OutLock(tmp_path / "out").release()  # free again
    assert not (tmp_path / "out").exists()  # the lock made the folder and nothing was written: both gone


def test_a_refused_run_leaves_no_lock_file_in_the_users_folder(tmp_path, capsys):
    """`--max-new-tokens 1000000000` was refused only after the model had loaded, and the lock's out/.run-lock
    stayed behind (issue 54): now it is refused before anything is loaded or made, and a run refused after the lock
    (no prompt fits the model) leaves the folder as it found it."""
    out, kept = tmp_path / "new", tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    huge = ["--model", str(EMBEDDED), "--threads", "1", "--max-new-tokens", "1000000000", "--limit", "1"]
    assert main(huge + ["--out", str(out)]) == 2
    assert "even with a one-token prompt: lower --max-new-tokens to at most 2,031" in capsys.readouterr().err
    assert not out.exists()
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "x " * 5000}) + "\n")  # no prompt fits: refused once the model loaded
    for folder, why in ((out, "no prompt fits the model"), (kept, "already holds results (notes.txt)")):
        argv = ["--model", str(EMBEDDED), "--threads", "1", "--max-new-tokens", "4", "--schedules", "ar",
                "--prompts", str(prompts), "--out", str(folder)]
        assert main(argv) == 2 and why in capsys.readouterr().err  # both refused while the lock was held
    assert not out.exists()  # made for the run, removed with it
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # the user's folder as it was
    # the task runs alike: refused before anything is loaded or made
    assert main(huge + ["--task", "gsm8k", "--data", str(GSM8K), "--out", str(out)]) == 2
    assert "even with a one-token prompt" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("task", [None, "gsm8k"])
def test_a_run_into_a_folder_another_run_holds_is_refused_in_one_line(tmp_path, capsys, task):
    out = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from packed_ss.bench.files import OutLock; lock = OutLock(sys.argv[2]); "
                               "print('held', flush=True); time.sleep(120)", str(ROOT), str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["--model", str(EMBEDDED), "--threads", "1", "--max-new-tokens", "4", "--schedules", "ar",
                "--no-warmup", "--out", str(out)]
        argv += ["--task", "gsm8k", "--data", str(GSM8K), "--limit", "1"] if task else ["--limit", "1"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"error: --out {str(out)!r} is in use by another run (pid {holder.pid}): wait for it to "
                       f"end, or give another folder"), err
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing measured, nothing written
    finally:
        holder.kill()
        holder.wait()
    assert main(argv) == 0  # the holder is gone: the folder is free


def test_a_write_past_a_file_size_limit_keeps_the_old_set_and_leaves_no_temporary_file(tmp_path):
    """With ``ulimit -f 16`` a 16 KB .report.html.* temporary file stayed behind (and the set was half new)."""
    for name in ("a.md", "b.html"):
        (tmp_path / name).write_text(f"old {name}")
    script = ("import resource, signal, sys\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "from pathlib import Path\n"
              "from packed_ss.bench.files import write_texts\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\n"
              "out = Path(sys.argv[2])\n"
              "try:\n"
              "    write_texts([(out / 'a.md', 'new a'), (out / 'b.html', 'x' * 40000)])\n"
              "except OSError as error:\n"
              "    print(error.errno)\n")
    done = subprocess.run([sys.executable, "-c", script, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == str(errno.EFBIG), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.html"]  # no .b.html.* left
    assert (tmp_path / "a.md").read_text() == "old a.md" and (tmp_path / "b.html").read_text() == "old b.html"


def test_a_full_disk_during_a_task_run_is_one_line(tmp_path, capsys, monkeypatch):
    """ENOSPC in keep_settings and in the reports was a traceback."""
    import packed_ss.bench.files as files

    real = files.tempfile.NamedTemporaryFile

    def full(*args, **kwargs):
        if str(kwargs.get("prefix", "")).startswith(".paper.md"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(files.tempfile, "NamedTemporaryFile", full)
    out = tmp_path / "full"
    argv = ["--model", str(EMBEDDED), "--task", "gsm8k", "--data", str(GSM8K), "--limit", "1", "--threads", "1",
            "--max-new-tokens", "4", "--resamples", "10", "--schedules", "ar", "--no-warmup", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: cannot write to --out {str(out)!r}: No space left on device (the files written "
                       f"before are whole; nothing half-written is left)"), err[-3:]
    assert "Traceback" not in "\n".join(err)
    assert not (out / "paper.json").exists() and not list(out.rglob(".*.*"))  # the set: none of it, no temp files
    assert json.loads((out / "runs" / "gsm8k.settings.json").read_text())["data"]["sha256"]  # written before: whole
