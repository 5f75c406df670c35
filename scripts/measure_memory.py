"""Peak resident memory of the app per request kind, measured in the server's own process (Linux).

Usage: ``python scripts/measure_memory.py [--threads 2] [--json docs/figures/memory.json]``. Starts the app on the embedded model on
127.0.0.1, sends each kind of request through ``gradio_client``, and prints for each: the resident
memory before it (MB), the peak during it above that level (from VmHWM, reset before each request through
/proc/self/clear_refs), and the resident memory left afterwards above the level before; and the request's wall time as the client saw it (seconds).
``--json`` writes the same table for docs/app.md (``python -m packed_ss.bench.tables`` draws it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status_mb(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak resident set size (VmHWM)
        f.write("5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/memory.json)")
    args = parser.parse_args()
    import gc

    import torch
    from gradio_client import Client

    import app
    from serve.limits import release_memory

    torch.set_num_threads(args.threads)
    demo = app.build_demo()
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **app.launch_kwargs(demo))
    client = Client(url, verbose=False)
    prompt = "def fibonacci(n):\n"
    long_prompt = "import os\n" + "x = os.path.join('a', 'b')\n" * 130  # about 1,800 tokens
    kinds = [
        ("warm-up (first generate, loads the model)", lambda: client.predict(prompt, max_new_tokens=8,
                                                                            api_name="/generate")),
        ("20 Steps, Packed-SS, B = 8", lambda: [client.predict("", prompt, "packed", 8, 0.0, 0, 1.0, 0, 128, False, "", "model", 0.8,
                                                                "ltr", False, api_name="/step") for _ in range(20)]),
        ("generate, Packed-SS, B = 8, 128 tokens", lambda: client.predict(prompt, api_name="/generate")),
        ("race, B = 8, 128 tokens (default)", lambda: client.predict(prompt, api_name="/race")),
        ("race + AR + diffusion, B = 8, 512 tokens", lambda: client.predict(prompt, max_new_tokens=512,
                                                                           lanes="ar,diffusion", api_name="/race")),
        ("race, B = 32, 80 tokens (1,056-row Quadratic calls)", lambda: client.predict(
            prompt, block_size=32, max_new_tokens=80, api_name="/race")),
        ("race, 1,800-token prompt, B = 8, 32 tokens", lambda: client.predict(long_prompt, max_new_tokens=32,
                                                                              api_name="/race")),
    ]
    print("| request | resident before (MB) | peak above it (MB) | left after (MB) | request time (s) |")
    print("|---|---|---|---|---|")
    rows = []
    for label, request in kinds:
        gc.collect()
        release_memory()
        before = _status_mb("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        request()
        seconds = time.perf_counter() - start
        peak = _status_mb("VmHWM")
        gc.collect()
        release_memory()
        after = _status_mb("VmRSS")
        print(f"| {label} | {before:.0f} | {peak - before:.0f} | {after - before:+.0f} | {seconds:.2f} |", flush=True)
        rows.append([label, before, peak - before, after - before, seconds])
    demo.close()
    if args.json:
        from packed_ss.bench.grid import Column, save

        save(args.json, [Column("request"), Column("resident before (MB)", 0), Column("peak above it (MB)", 0),
                         Column("left after (MB)", 0), Column("request time (s)", 2)], rows,
             note=f"the server's own process, embedded model, CPU, {args.threads} torch threads, each request alone")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
