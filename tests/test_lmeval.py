"""packed-ss as an lm-evaluation-harness model (packed_ss.lmeval): lm-eval's own runs, on the embedded model and the
tasks in docs/lm-eval-tasks (local data, no hub), set against lm-eval's ``--model hf`` on the same weights."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is an optional extra (pip install -r requirements-lm-eval.txt)")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from packed_ss.lmeval.__main__ import with_figures  # noqa: E402
from packed_ss.lmeval.model import ModelArgumentError, PackedSSLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "docs" / "lm-eval-tasks"
EMBEDDED = str(ROOT / "assets" / "model")
LOSSLESS = ("ar", "linear", "quadratic", "packed", "packed-mixed")
GENERATION = ["python_complete", "gsm8k_sample"]


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory):
    """The shipped task YAMLs with their data paths made absolute (the tests may run from any folder)."""
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for path in TASKS.glob("*.yaml"):
        text = path.read_text().replace("docs/", f"{ROOT}/docs/")
        (folder / path.name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def tasks(task_folder):
    """One TaskManager for the module, over the shipped tasks only (lm-eval's own thousands of task files, which
    these tests never use, take about 13 s to index; the command-line test below indexes them as users do)."""
    return TaskManager(include_path=str(task_folder), include_defaults=False)


def evaluate(model, model_args, names, tasks, **options):
    options = {"limit": 3, "bootstrap_iters": 0, "log_samples": True, "device": "cpu", **options}
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=names, task_manager=tasks, **options)


def responses(results, task):
    return {s["doc_id"]: s["resps"] for s in results["samples"][task]}


def metrics(results, task):
    return {k: v for k, v in results["results"][task].items() if "," in k and "stderr" not in k}


@pytest.fixture(scope="module")
def hf_generations(tasks):
    return evaluate("hf", f"pretrained={EMBEDDED},dtype=float32", GENERATION, tasks,
                    gen_kwargs="max_gen_toks=24")


@pytest.mark.parametrize("schedule", LOSSLESS)
def test_generations_and_metrics_equal_lm_evals_hf_model(schedule, hf_generations, tasks):
    ours = evaluate("packed-ss", f"schedule={schedule},block_size=4,dtype=float32,threads=1", GENERATION, tasks,
                    gen_kwargs="max_gen_toks=24")
    for task in GENERATION:
        assert responses(ours, task) == responses(hf_generations, task), task
        assert metrics(ours, task) == metrics(hf_generations, task), task
        assert len(responses(ours, task)) == 3
    stops = [r[0][0] for r in responses(ours, "python_complete").values()]
    assert not any("\n\n" in text or "\ndef " in text for text in stops), "lm-eval's stop sequences cut the text"


def flat(value) -> list:
    """The numbers and booleans of a logged response, in order (lists of lists of [log-likelihood, greedy])."""
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in flat(item)]
    return [value]


def test_scores_equal_lm_evals_hf_model_within_float_tolerance(tasks):
    """Multiple choice (log-likelihood of each ending) and perplexity over rolling windows of 24 tokens."""
    names = ["python_choice", "python_text"]
    ours = evaluate("packed-ss", "dtype=float32,max_length=24,threads=1", names, tasks, limit=None)
    theirs = evaluate("hf", f"pretrained={EMBEDDED},dtype=float32,max_length=24", names, tasks, limit=None)
    for task in names:
        a, b = responses(ours, task), responses(theirs, task)
        assert a.keys() == b.keys() and len(a) == 8
        for doc in a:
            mine, hf = flat(a[doc]), flat(b[doc])
            assert len(mine) == len(hf) > 0
            for x, y in zip(mine, hf):
                assert x == y if isinstance(x, bool) else math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-4), (task, doc)
        for name, value in metrics(ours, task).items():
            assert math.isclose(value, metrics(theirs, task)[name], rel_tol=1e-5), (task, name)
    long = max(len(s["doc"]["text"]) for s in ours["samples"]["python_text"])
    assert long > 24, "some snippet spans more than one rolling window"


def test_a_sampled_run_is_reproducible_with_lm_evals_seeds(tasks):
    sampled = "do_sample=True,temperature=1.0,max_gen_toks=16"
    runs = [evaluate("packed-ss", "schedule=packed,block_size=4,threads=1", ["python_complete"], tasks,
                     gen_kwargs=sampled, limit=8, torch_random_seed=seed) for seed in (7, 7, 8)]
    first, again, other = (responses(r, "python_complete") for r in runs)
    assert first == again
    assert first != other, "another torch seed draws other runs"


def test_the_command_line_writes_decoding_figures_beside_lm_evals_output(tmp_path, task_folder):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "packed_ss.lmeval", "--model", "packed-ss", "--model_args",
               "schedule=packed+ar,block_size=4,threads=1", "--device", "cpu", "--include_path", str(task_folder),
               "--tasks", "python_complete", "--limit", "4", "--output_path", str(out), "--log_samples"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python_complete · packed: 4 requests" in done.stderr and "against ar:" in done.stderr
    (summary,) = (out / "packed-ss-decoding").glob("summary_*.json")
    rows = {row["schedule"]: row for row in json.loads(summary.read_text())["tasks"]}
    assert set(rows) == {"packed", "ar"} and rows["packed"]["speedup"] > 0 and rows["ar"]["speedup"] is None
    assert rows["ar"]["tokens_per_nfe"] == 1.0 and rows["packed"]["disagreements"] == 0
    assert rows["packed"]["tokens_per_nfe_ratio"] == pytest.approx(rows["packed"]["tokens_per_nfe"], rel=1e-3)
    (requests,) = (out / "packed-ss-decoding").glob("requests_*.jsonl")
    lines = [json.loads(line) for line in requests.read_text().splitlines()]
    (samples,) = out.glob("*/samples_python_complete_*.jsonl")
    keys = {(s["doc_id"], s["prompt_hash"]) for s in map(json.loads, samples.read_text().splitlines())}
    assert {(line["doc_id"], line["prompt_hash"]) for line in lines} == keys and len(lines) == 2 * len(keys)
    assert all(line["nfe"] > 0 and line["wall_s"] > 0 for line in lines)
    assert all(line["agrees"] for line in lines if not line["graded"])


def test_chat_templates_are_applied_as_lm_evals_hf_model_applies_them(tiny_model_dir, tmp_path, tasks):
    """--apply_chat_template on a tokenizer with a template: the same prompts (lm-eval logs them) and generations."""
    from transformers import AutoTokenizer

    folder = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = ("{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}"
                               "{% if add_generation_prompt %}w5{% endif %}")
    tokenizer.save_pretrained(folder)
    options = dict(apply_chat_template=True, gen_kwargs="max_gen_toks=8", limit=2)
    ours = evaluate("packed-ss", f"pretrained={folder},dtype=float32,threads=1,block_size=3", ["python_complete"],
                    tasks, **options)
    theirs = evaluate("hf", f"pretrained={folder},dtype=float32", ["python_complete"], tasks, **options)
    for mine, hf in zip(ours["samples"]["python_complete"], theirs["samples"]["python_complete"]):
        assert mine["arguments"] == hf["arguments"] and mine["arguments"][0][0].startswith("w3 ")
        assert mine["resps"] == hf["resps"]


def test_with_figures_adds_the_folder_only_for_packed_ss_with_an_output_path():
    argv = ["--model", "packed-ss", "--model_args", "schedule=ar", "--output_path", "o"]
    assert with_figures(argv)[3] == "schedule=ar,figures=o/packed-ss-decoding"
    assert with_figures(["--model=packed-ss", "--output_path=o"])[-1] == "figures=o/packed-ss-decoding"
    assert json.loads(with_figures(["--model", "packed-ss", "--model_args", '{"schedule": "ar"}', "--output_path",
                                    "o"])[3]) == {"schedule": "ar", "figures": "o/packed-ss-decoding"}
    assert with_figures(["--model", "hf", "--output_path", "o"]) == ["--model", "hf", "--output_path", "o"]
    kept = ["--model", "packed-ss", "--model_args", "figures=x", "--output_path", "o"]
    assert with_figures(kept) == kept


@pytest.mark.parametrize("args, says", [
    ({"schedul": "packed"}, "unknown model argument 'schedul' for packed-ss; valid: pretrained, schedule"),
    ({"block_size": 1}, "block size must be an integer in [2, 64], got 1"),
    ({"batch_size": 8}, "packed-ss decodes one request at a time"),
    ({"drafter": "oracle"}, "drafter 'oracle': choose one of model, scripted"),
    ({"schedule": "packed+packed"}, "name each schedule once"),
    ({"schedule": "fast"}, "unknown schedule 'fast'; choose one of ar, linear, quadratic, packed"),
    ({"max_length": 10 ** 6}, "max_length 1000000 exceeds the model's 2048 positions"),
])
def test_a_model_argument_it_cannot_honour_is_one_line_naming_the_valid_values(args, says):
    with pytest.raises(ValueError) as raised:
        PackedSSLM(**args)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_the_command_line_answers_a_bad_model_argument_in_one_line(monkeypatch, capsys):
    """lm-eval's own command line constructs the model (the figures test above runs it whole); what it raises for
    a bad argument is one line and status 2."""
    import lm_eval.__main__

    from packed_ss.lmeval.__main__ import main

    def cli():
        PackedSSLM(block_size=99)

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", cli)
    monkeypatch.setattr(sys, "argv", ["packed_ss.lmeval", "--model", "packed-ss", "--model_args", "block_size=99"])
    assert main() == 2
    assert capsys.readouterr().err == "error: block size must be an integer in [2, 64], got 99\n"


@pytest.fixture(scope="module")
def lm():
    return PackedSSLM(schedule="packed+ar", block_size=4, dtype="float32", threads=1)


def request(context, **gen_kwargs):
    return Instance(request_type="generate_until", doc={}, arguments=(context, gen_kwargs), idx=0,
                    metadata=("probe", 0, 1))


@pytest.mark.parametrize("gen_kwargs, says", [
    ({"until": ["", "x"]}, "an empty stop sequence in `until` (task probe)"),
    ({"until": "\n", "num_beams": 4}, "cannot honour (task probe): num_beams=4"),
    ({"do_sample": True, "temperature": 0.0}, "sampling needs a temperature > 0"),
    ({"max_gen_toks": 2045}, "leave no room for a context in the model's 2048 positions"),
])
def test_a_request_it_cannot_decode_is_one_line(lm, gen_kwargs, says):
    with pytest.raises(ModelArgumentError) as raised:
        lm.generate_until([request("def f(x):", **gen_kwargs)], disable_tqdm=True)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_a_context_longer_than_the_model_is_cut_from_the_left_and_harmless_settings_pass(lm):
    long = "def f(x):\n    return x\n" * 400  # about 4,000 tokens against 2,048 positions
    before = len(lm.figures)
    (text,) = lm.generate_until([request(long, until=["\n\n"], max_gen_toks=8, num_beams=1)], disable_tqdm=True)
    assert isinstance(text, str)
    made = lm.figures[before:]
    assert [f.schedule for f in made] == ["packed", "ar"]
    assert made[0].prompt_tokens == 2048 - 8 - 2 * 4 and made[1].agrees is True


def test_an_empty_context_decodes_from_the_prefix_token(lm):
    (text,) = lm.generate_until([request("", until=["\n"], max_gen_toks=4)], disable_tqdm=True)
    assert isinstance(text, str) and lm.figures[-1].prompt_tokens == 1


def test_nld_setdlm_and_scripted_drafters_decode_losslessly_through_lm_eval(nld_dir, tmp_path):
    from helpers import write_setdlm_checkpoint

    setdlm = tmp_path / "setdlm"
    setdlm.mkdir()
    write_setdlm_checkpoint(setdlm)
    cases = [
        (dict(pretrained=str(nld_dir), drafter_lora="linear_spec_lora", dtype="float64"), "w5 w6 w7 w8"),
        (dict(pretrained=str(setdlm), order="ltr", dtype="float64"), "w5 w6 w7 w8"),
        (dict(pretrained=str(setdlm), order="confidence", dtype="float64"), "w5 w6 w7 w8"),
        (dict(drafter="scripted", drafter_quality=0.7), "def f(x):"),
    ]
    for args, context in cases:
        model = PackedSSLM(schedule="packed+ar", block_size=4, threads=1, **args)
        texts = model.generate_until([request(context, until=["\n\n"], max_gen_toks=12)], disable_tqdm=True)
        assert len(texts) == 1
        packed, ar = model.figures
        compared = args.get("order") != "confidence"  # the confidence order may change the output (Appendix C)
        assert packed.agrees is None and ar.agrees is (True if compared else None), args
        assert packed.new_tokens == ar.new_tokens > 0


def test_an_any_order_model_refuses_scores_in_one_line(tiny_any_order_dir):
    model = PackedSSLM(pretrained=str(tiny_any_order_dir), schedule="ar", threads=1)
    with pytest.raises(ModelArgumentError, match="has no left-to-right causal scores"):
        model._loglikelihood_tokens([(("a", "b"), [3, 4], [5])])
