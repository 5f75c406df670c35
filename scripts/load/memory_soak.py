"""Resident memory of a fresh `python app.py` under raw API calls from several addresses (issue 54, item 3).

Starts the app on a port of its own, then sends ``--calls`` raw calls in turn, each a new session (as every raw
`/gradio_api/call/...` is): three four-token `/generate` calls to one eight-token `/race` at B = 4, the addresses
told apart by `X-Forwarded-For`. Prints the server's resident memory every 100 calls.

    python scripts/load/memory_soak.py --calls 1001
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> int:
    """Resident memory of process ``pid`` in MB (/proc)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def call(port: int, name: str, data: list, address: str) -> None:
    """One raw call and its whole answer stream."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", f"/gradio_api/call/{name}", json.dumps({"data": data}),
                 {"Content-Type": "application/json", "X-Forwarded-For": address})
    event = json.loads(conn.getresponse().read())["event_id"]
    conn.request("GET", f"/gradio_api/call/{name}/{event}")
    conn.getresponse().read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1001, help="raw calls to send (default 1001)")
    parser.add_argument("--port", type=int, default=7891, help="the app's port (default 7891)")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT,
                              env=dict(os.environ, GRADIO_SERVER_PORT=str(args.port)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):  # the app answers once it has started
            try:
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=5)
                conn.request("GET", "/")
                conn.getresponse().read()
                break
            except OSError:
                time.sleep(1)
        start = time.monotonic()
        for i in range(args.calls):
            address = f"198.51.100.{i % 3 + 1}"
            if i % 4 == 3:
                call(args.port, "race", [f"def r{i}(x):", 4, 0, 0, 1, 0, 8], address)
            else:
                call(args.port, "generate", [f"def f{i}(x):", "packed", 8, 0, 0, 1, 0, 4], address)
            if i % 100 == 0:
                print(f"{i} calls: {rss_mb(server.pid)} MB ({time.monotonic() - start:.0f} s)", flush=True)
    finally:
        server.kill()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
