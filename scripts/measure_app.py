"""Measure the app's two speed targets on this machine and print them.

1. Server-side time of one Step (engine iteration + grid/text/stats HTML + mask figure serialised as
   the page receives it), median over a run; target <= 150 ms on CPU with the embedded model at B = 8.
2. Computation time of a race of Linear, Quadratic and Packed over 128 new tokens (AR reference and
   warm-up included, each lane alone); target <= 5 s.

Optionally (``--http``) also the round trip of a Step through a launched server and gradio_client.
Numbers are distorted by anything else running on the machine (e.g. a training job).

Usage: python scripts/measure_app.py [--model assets/model] [--block-size 8] [--new-tokens 128] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure_steps(store, settings, repeats: int) -> list[tuple[float, float]]:
    """(engine ms, render ms) of every Step of ``repeats`` full step-through runs."""
    from serve.step import StepRun
    from components.step_view import step_view

    model = store.get(settings.model)
    strings = store.strings_for(model)
    times = []
    for _ in range(repeats):
        run = StepRun(settings, model)
        while True:
            start = time.perf_counter()
            advanced = run.step()
            middle = time.perf_counter()
            if not advanced:
                break
            view = step_view(run, strings, with_figure=True)
            view.figure.to_json()  # what gr.Plot sends to the page
            times.append(((middle - start) * 1000, (time.perf_counter() - middle) * 1000))
    return times


def measure_http(model_path: str, settings, steps: int) -> list[float]:
    """Round-trip ms of Steps through a launched app and gradio_client."""
    import app
    from gradio_client import Client

    demo = app.build_demo(model_path)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **app.launch_kwargs(demo))
    try:
        client = Client(url, verbose=False)
        c = settings.config
        args = ("", settings.prompt, settings.schedule, c.block_size, c.temperature, c.top_k, c.top_p, c.seed,
                c.max_new_tokens, c.drafter_lora, settings.precision, "model", 0.8, c.order)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            client.predict(*args, api_name="/step")
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        demo.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "model"))
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--schedule", default="packed")
    parser.add_argument("--prompt", default=None, help="default: HumanEval/0")
    parser.add_argument("--repeats", type=int, default=1, help="step-through runs to time")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--http", action="store_true", help="also time Steps through a launched server")
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from serve.gpu import GpuTasks
    from serve.models import ModelStore
    from serve.race import run_race
    from serve.settings import make_settings

    prompt = args.prompt
    if prompt is None:
        from packed_ss.bench.plan import humaneval_prompts

        prompt = humaneval_prompts()[0]["prompt"]
    store = ModelStore(args.model)
    start = time.perf_counter()
    model = store.get("")
    print(f"model: {args.model} on {model.device} (loaded in {time.perf_counter() - start:.1f} s), "
          f"torch threads {torch.get_num_threads()}, prompt {len(model.encode(prompt))} tokens")
    settings = make_settings("", prompt, args.schedule, args.block_size, 0.0, 0, 1.0, 0, args.new_tokens)

    times = measure_steps(store, settings, args.repeats)
    totals = [a + b for a, b in times]
    p90 = sorted(totals)[int(0.9 * (len(totals) - 1))]
    print(f"Step ({args.schedule}, B={args.block_size}, {len(times)} steps): median {statistics.median(totals):.1f} ms "
          f"server-side (engine {statistics.median(a for a, _ in times):.1f} ms + render "
          f"{statistics.median(b for _, b in times):.1f} ms), p90 {p90:.1f} ms, "
          f"first (prefill) {totals[0]:.1f} ms   [target <= 150 ms median]")

    result = run_race(GpuTasks(store), settings)
    lanes = ", ".join(f"{lane.title} {lane.total_ms / 1000:.2f} s ({lane.metrics['nfe']} NFE)" for lane in result.lanes)
    three = sum(lane.total_ms for lane in result.lanes if lane.schedule != "ar") / 1000
    print(f"Race ({args.new_tokens} new tokens, B={args.block_size}, lanes in {result.rounds} rounds of turns): the "
          f"three lanes' runs (linear, quadratic, packed) {three:.2f} s of decoding [target <= 5 s]; the "
          f"whole request with the AR lane and the warm-up {result.compute_s:.2f} s; decoder "
          f"time per lane: {lanes}; identical to AR: {result.to_json()['lossless_identical_to_ar']}; "
          f"verdict: {result.to_json()['verdict']}")

    if args.http:
        trips = measure_http(args.model, settings, 20)
        print(f"Step round trip through gradio_client: median {statistics.median(trips):.1f} ms over {len(trips)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
