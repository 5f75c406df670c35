"""Do slow upload bodies cost the server anything before their checks pass? Against a running app (``LOAD_URL``,
default http://127.0.0.1:7911): an attacker address opens ``--bodies`` upload requests (POST /gradio_api/upload,
multipart, Content-Length given) and sends their bodies slowly: ``drip`` sends ``--chunk`` bytes every ``--every``
seconds, ``stall`` sends all but the last 16 bytes at once and then nothing. Meanwhile a victim address sends a
4-token ``/generate`` every second and a small upload of its own every 10 s, and the server's resident memory (its
process and children) is read every half second.

    python app.py --port 7911 --threads 1 &
    PYTHONPATH=scripts/load python scripts/load/slow_uploads.py drip --seconds 45
    PYTHONPATH=scripts/load python scripts/load/slow_uploads.py stall --seconds 45

Prints how each slow body ended (the server's answer and when), the victim's latencies and uploads, and the
server's memory before, at its peak and at the end.
"""
import argparse
import collections
import socket
import statistics
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx
import psutil
import qclient as q

ATTACKER, VICTIM = "203.0.113.66", "198.51.100.77"
BOUNDARY = "slowbodyboundary"
TAIL = 16  # bytes a stalled body never sends


def multipart(size: int, name: str = "p.jsonl") -> bytes:
    """One upload request's body: a file part of ``size`` bytes (one JSON line repeated)."""
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode()
    line = b'{"prompt": "def f(x):"}\n'
    data = (line * (size // len(line) + 1))[:size]
    return head + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def server_pid(url: str) -> int:
    """The pid of the process listening on ``url``'s port."""
    port = urlsplit(url).port
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    sys.exit(f"no process of yours listens on port {port}: start the app first, or pass --pid")


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children, in MB."""
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


def slow_body(url: str, mode: str, size: int, chunk: int, every: float, seconds: float, ends: list, lock) -> None:
    """One upload whose body arrives slowly and goes on arriving after the server answers (as a hostile client
    would): notes (seconds until the server answered, its status line, seconds until it closed the connection or
    None when it was still open ``seconds`` + 30 s after the start)."""
    parts = urlsplit(url)
    body = multipart(size)
    head = (f"POST /gradio_api/upload HTTP/1.1\r\nHost: {parts.netloc}\r\nX-Forwarded-For: {ATTACKER}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    start = time.time()
    answered, status, closed = None, "no answer", None
    try:
        sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        sock.sendall(head)
        sent = len(body) - TAIL if mode == "stall" else 0
        sock.sendall(body[:sent])
        sock.settimeout(every)
        while closed is None and time.time() - start < seconds + 30:
            try:
                answer = sock.recv(4096)
            except (socket.timeout, TimeoutError):
                if mode == "drip" and sent < len(body) - TAIL:
                    sock.sendall(body[sent:sent + chunk])
                    sent += chunk
                continue
            if not answer:
                closed = time.time() - start
            elif answered is None:
                answered, status = time.time() - start, answer.split(b"\r\n", 1)[0].decode("latin-1")
        sock.close()
    except OSError as error:  # the server reset the connection
        closed = time.time() - start
        status = status if answered is not None else f"connection error: {error}"
    with lock:
        ends.append((answered, status, closed))


def victim_upload() -> str:
    """A small upload from the victim's address: its status and how long it took."""
    sent = time.time()
    try:
        r = httpx.post(q.API + "/upload", headers={"X-Forwarded-For": VICTIM}, timeout=60,
                       files={"files": ("v.jsonl", b'{"prompt": "def g(y):"}\n')})
        return f"{r.status_code} in {time.time() - sent:.2f} s"
    except httpx.HTTPError as error:
        return f"{type(error).__name__} in {time.time() - sent:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["drip", "stall", "baseline"])
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the victim measures (default 45)")
    parser.add_argument("--bodies", type=int, default=16, help="slow upload bodies at once (default 16)")
    parser.add_argument("--size", type=int, default=2 * 2**20 - 4096,
                        help="bytes of each body's file (default just under the 2 MB file limit)")
    parser.add_argument("--chunk", type=int, default=64, help="drip: bytes sent at a time (default 64)")
    parser.add_argument("--every", type=float, default=0.5, help="drip: seconds between chunks (default 0.5)")
    parser.add_argument("--pid", type=int, default=None, help="the server's pid (default: whoever listens)")
    args = parser.parse_args()
    pid = args.pid or server_pid(q.BASE)
    before = rss_mb(pid)
    samples, ends, lock, stop = [], [], threading.Lock(), threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(rss_mb(pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    bodies = [threading.Thread(target=slow_body, daemon=True,
                               args=(q.BASE, args.mode, args.size, args.chunk, args.every, args.seconds, ends, lock))
              for _ in range(args.bodies if args.mode != "baseline" else 0)]
    for body in bodies:
        body.start()
    time.sleep(2 if bodies else 0)  # the bodies are on their way
    start = time.time()
    walls, failed, uploads = [], [], []
    generate = ["def f(x):", "packed", 8, 0.0, 0, 1.0, 0, 4]
    while time.time() - start < args.seconds:
        sent = time.time()
        if len(walls) % 10 == 0:
            uploads.append(victim_upload())
        answer = q.api_call("generate", generate, address=VICTIM)
        (walls if answer["kind"] == "complete" else failed).append(answer)
        time.sleep(max(0.0, 1 - (time.time() - sent)))
    for body in bodies:
        body.join(timeout=60)
    stop.set()
    sampler.join()
    after = rss_mb(pid)
    print(f"mode {args.mode}: {len(bodies)} slow bodies of {args.size:,} bytes from {ATTACKER}")
    for status, count in collections.Counter(status for _, status, _ in ends).most_common():
        when = [answered for answered, st, _ in ends if st == status and answered is not None]
        print(f"  {count} x {status!r}" + (f" after {min(when):.1f}-{max(when):.1f} s" if when else ""))
    closed = [c for _, _, c in ends if c is not None]
    print(f"  connections closed by the server: {len(closed)}"
          + (f" (after {min(closed):.1f}-{max(closed):.1f} s)" if closed else "")
          + f"; still open {args.seconds + 30:.0f} s after the start: {len(ends) - len(closed)}")
    if walls:
        times = [a["wall"] for a in walls]
        print(f"victim /generate: {len(times)} calls, median {statistics.median(times):.2f} s, "
              f"max {max(times):.2f} s; not complete: {len(failed)}")
    print(f"victim uploads: {', '.join(uploads)}")
    print(f"server memory: {before:.0f} MB before, {max(samples):.0f} MB at most, {after:.0f} MB after "
          f"({len(samples)} samples)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
