"""Does one address stall the others? (issue 54, item 1) Against a running app (``LOAD_URL``, default
http://127.0.0.1:7911): an attacker address keeps 4 first Steps in flight, each a fresh session running AR with the
scripted drafter on a 1,511-token prompt (Python's argparse.py, its first 5,200 characters) and 512 new tokens, so
each computes a whole AR reference run; each is sent again as soon as it is answered, refusals included. Meanwhile
a victim address sends a 4-token ``/generate`` every 2 s and a first Step of its own at 15, 45, 75 and 105 s.
``baseline`` runs the victim alone.

    python app.py --port 7911 &
    PYTHONPATH=scripts/load python scripts/load/stall.py baseline 60
    PYTHONPATH=scripts/load python scripts/load/stall.py attack 120

Prints the victim's latencies (median, max, how many over 2 s and 5 s) and what the attacker's Steps got.
"""
import argparse
import collections
import statistics
import sys
import threading
import time

import httpx
import qclient as q

ATTACKER, VICTIM = "203.0.113.66", "198.51.100.77"


def step_index() -> int:
    """The fn_index of the Step tab's Step button (api_name "step")."""
    config = httpx.get(q.BASE + "/config", timeout=30).json()
    return next(d.get("id", i) for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "step")


def refused(answer: dict) -> bool:
    return answer["kind"] in ("error", "http") or "pss-error" in str(answer["payload"])


def summary(walls: list[float]) -> str:
    if not walls:
        return "none"
    return (f"{len(walls)} calls, median {statistics.median(walls):.2f} s, max {max(walls):.2f} s, "
            f"over 2 s: {sum(w > 2 for w in walls)}, over 5 s: {sum(w > 5 for w in walls)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["baseline", "attack"])
    parser.add_argument("seconds", type=float, nargs="?", default=120.0)
    args = parser.parse_args()
    step = step_index()
    source = open(argparse.__file__, encoding="utf-8").read()[:5200]
    heavy = ["assets/model", source, "ar", 2, 0, 0, 1, 0, 512, False, "", "scripted", 0.0, "ltr", False]
    light = ["assets/model", "def fibonacci(n):\n", "packed", 8, 0, 0, 1, 0, 128, False, "", "model", 0.8, "ltr", False]
    generate = ["def f(x):", "packed", 8, 0.0, 0, 1.0, 0, 4, "", False, "", "model", 0.8, "ltr", False]
    stop, attacks, steps, lock = threading.Event(), [], [], threading.Lock()

    def attacker():
        while not stop.is_set():
            answer = q.call(step, heavy, timeout=300, address=ATTACKER)
            with lock:
                attacks.append(answer)

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(4)] if args.mode == "attack" else []
    for thread in threads:
        thread.start()
    time.sleep(8 if threads else 0)
    start = time.time()

    def victim_steps():
        for at in (15, 45, 75, 105):
            if at > args.seconds:
                return
            time.sleep(max(0.0, start + at - time.time()))
            steps.append(q.call(step, light, timeout=300, address=VICTIM))

    stepper = threading.Thread(target=victim_steps, daemon=True)
    stepper.start()
    walls, failed = [], []
    while time.time() - start < args.seconds:
        sent = time.time()
        answer = q.api_call("generate", generate, address=VICTIM)
        (walls if answer["kind"] == "complete" else failed).append(answer)
        time.sleep(max(0.0, 2 - (time.time() - sent)))
    stepper.join(timeout=300)
    stop.set()
    print(f"victim /generate: {summary([a['wall'] for a in walls])}; not complete: {len(failed)}")
    shown = [f"{s['wall']:.2f} s" + (" (refused)" if refused(s) else "") for s in steps]
    print(f"victim first Steps: {', '.join(shown)}")
    if attacks:
        done = [a for a in attacks if not refused(a)]
        why = collections.Counter(str(a["payload"])[:160] for a in attacks if refused(a)).most_common(3)
        print(f"attacker Steps answered: {len(attacks)}, computed: {len(done)} ({summary([a['wall'] for a in done])}), "
              f"refused: {len(attacks) - len(done)}")
        for text, count in why:
            print(f"  {count} x {text}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
