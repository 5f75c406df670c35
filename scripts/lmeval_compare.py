"""lm-eval's ``--model packed-ss`` beside its own ``--model hf`` on the same weights, schedule by schedule.

For each schedule: lm-eval runs the tasks with ``--model packed-ss`` (the schedule alone, so that lm-eval grades its
text), and the script compares every logged generation and every metric with lm-eval's ``hf`` run; one more run
decodes every request with all the schedules at once (``schedule=a+b+...``) for the decoding figures against
``ar`` of the same run. Prints one markdown table. Needs the optional extra (``pip install -r
requirements-lm-eval.txt``).

Run from the repository root (the embedded model and the tasks in docs/lm-eval-tasks, nothing downloaded)::

    python scripts/lmeval_compare.py --tasks python_complete,gsm8k_sample --max-gen-toks 64 --block-size 8
"""

from __future__ import annotations

import argparse
import io
import sys
from contextlib import redirect_stderr
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import packed_ss  # noqa: E402,F401  (before torch: bounded OpenMP spin)

SCHEDULES = ("ar", "linear", "quadratic", "packed", "packed-mixed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="python_complete,gsm8k_sample")
    parser.add_argument("--max-gen-toks", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()

    import lm_eval
    from lm_eval.tasks import TaskManager

    from packed_ss.lmeval.figures import summarize
    from packed_ss.lmeval.model import PackedSSLM

    tasks = args.tasks.split(",")
    manager = TaskManager(include_path=str(ROOT / "docs" / "lm-eval-tasks"))
    options = dict(tasks=tasks, task_manager=manager, limit=args.limit, bootstrap_iters=0, log_samples=True,
                   gen_kwargs=f"max_gen_toks={args.max_gen_toks}")
    model = str(ROOT / "assets" / "model")
    hf = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32", device="cpu", **options)

    def samples(results, task):
        return {s["doc_id"]: s["resps"] for s in results["samples"][task]}

    def metrics(results, task):
        return {k: v for k, v in results["results"][task].items() if "," in k and "stderr" not in k}

    rows = []
    for schedule in SCHEDULES:
        lm = PackedSSLM(pretrained=model, schedule=schedule, block_size=args.block_size, dtype="float32",
                        threads=args.threads)
        with redirect_stderr(io.StringIO()):
            ours = lm_eval.simple_evaluate(model=lm, **options)
        for task in tasks:
            a, b = samples(ours, task), samples(hf, task)
            same = sum(a[d] == b.get(d) for d in a)
            rows.append((schedule, task, f"{same}/{len(a)}", metrics(ours, task) == metrics(hf, task),
                         ", ".join(f"{k.replace(',none', '').replace(',', ' (')}{')' if ',' in k and ',none' not in k else ''}"
                                   f" {v:.3f}" for k, v in metrics(ours, task).items())))
    lm = PackedSSLM(pretrained=model, schedule="+".join(SCHEDULES[1:] + SCHEDULES[:1]), block_size=args.block_size,
                    dtype="float32", threads=args.threads)
    with redirect_stderr(io.StringIO()):
        lm_eval.simple_evaluate(model=lm, **options)
    figures = {(r["task"], r["schedule"]): r for r in summarize(lm.figures)}

    scores = ["python_choice", "python_text"]
    score_options = dict(tasks=scores, task_manager=manager, bootstrap_iters=0, log_samples=True)
    theirs = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32,max_length=24",
                                     device="cpu", **score_options)
    lm = PackedSSLM(pretrained=model, dtype="float32", max_length=24, threads=args.threads)
    with redirect_stderr(io.StringIO()):
        ours = lm_eval.simple_evaluate(model=lm, **score_options)

    def numbers(value):
        if isinstance(value, (list, tuple)):
            return [x for item in value for x in numbers(item)]
        return [value] if isinstance(value, float) else []

    print("Scores (max_length 24, so that snippets span several rolling windows):\n")
    print("| task | requests | largest log-likelihood difference from hf | metrics (packed-ss / hf) |")
    print("|---|---|---|---|")
    for task in scores:
        a, b = samples(ours, task), samples(theirs, task)
        diffs = [abs(x - y) for d in a for x, y in zip(numbers(a[d]), numbers(b[d]))]
        both = ", ".join(f"{k.split(',')[0]} {v:.4f} / {metrics(theirs, task)[k]:.4f}"
                         for k, v in metrics(ours, task).items())
        print(f"| {task} | {len(diffs)} | {max(diffs):.2e} | {both} |")
    print()
    print(f"B = {args.block_size}, max_gen_toks {args.max_gen_toks}, {args.threads} thread(s), greedy\n")
    print("| schedule | task | generations equal to hf | metrics equal | metrics | tokens/NFE | tokens/s | "
          "throughput / ar |")
    print("|---|---|---|---|---|---|---|---|")
    for schedule, task, same, equal, values in rows:
        f = figures[(task, schedule)]
        ratio = "1 (reference)" if schedule == "ar" else f"{f['speedup']:.2f}"
        print(f"| {schedule} | {task} | {same} | {'yes' if equal else 'NO'} | {values} | {f['tokens_per_nfe']:.2f} | "
              f"{f['throughput']:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
