"""One contender in its own process, timed call by call from the parent (interleaved rounds).

Runtimes keep thread pools, allocators and CPU-dispatch state per process, so each contender of
the peer workloads lives in a process of its own, with the same thread count. The parent starts
them one after the other, each running its first call alone, collects that output from each (to
check it before timing), then asks for one timed call at a time, so ``harness.measure`` can
interleave them in rounds as it does in-process ones.

Protocol (one JSON line per reply on the process's original stdout; library chatter goes to
stderr): start -> {"ready": true, "output": FILE, "note": ...} or {"skip": REASON};
"run" -> {"wall": s, "cpu": s}; "profile" -> {"parts": {part: s}} (one untimed call under
torch.profiler, ``breakdown.time_parts``; {} for a contender that is not tformer's);
"quit" or end of input -> exit. FILE is .npy (encoder outputs)
or .json (the "decode" task's token ids, a list per row).

    python -m tformer.commands.benchmarking.worker '{"name": ..., "task": "sentences"|"batch"|"decode", ...}'
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tformer.commands.benchmarking import peers
from tformer.commands.benchmarking.harness import Measured


# The child ----------------------------------------------------------------------------------------
def main(spec: dict) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # replies; stdout proper -> stderr
    os.dup2(2, 1)

    def reply(**kw):
        proto.write(json.dumps(kw) + "\n")

    if spec["task"] == "decode":  # a seq2seq peer (decode_peers.py), not an encoder contender
        from tformer.commands.benchmarking.ct2_decode import ct2_decoder

        call = ct2_decoder(spec)
        output = Path(spec["work"]) / f"out-{spec['index']}.json"
        output.write_text(json.dumps(call()))
        reply(ready=True, output=str(output), note="")
        _serve(call, reply, profiled=False)
        return
    contender = peers.BY_NAME[spec["name"]]
    paths = peers.Paths(*(Path(spec[k]) for k in ("model", "onnx", "work")))
    try:
        runner = contender.load(paths, spec["threads"])
    except peers.Unavailable as e:
        reply(skip=f"skipped: {e}")
        return
    if spec["task"] == "sentences":
        texts = json.loads(Path(spec["inputs"]).read_text())
        if runner.encode is not None:
            call = lambda: runner.encode(texts)  # noqa: E731
        else:
            from tformer.text.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(paths.model)
            call = lambda: peers.encode_with(runner.forward, tokenizer, texts)  # noqa: E731
    else:
        data = np.load(spec["inputs"])
        ids, mask, types = data["ids"], data["mask"], data["types"]
        call = lambda: runner.forward(ids, mask, types)  # noqa: E731
    output = Path(spec["work"]) / f"out-{spec['index']}.npy"
    t = time.perf_counter()
    np.save(output, np.asarray(call(), dtype=np.float32))
    first = f"first call {time.perf_counter() - t:.1f} s (compiling)" if "compiled" in spec["name"] else ""
    reply(ready=True, output=str(output), note="; ".join(n for n in (runner.note, first) if n))
    _serve(call, reply, profiled=spec["name"].startswith("tformer"))


def _serve(call, reply, profiled: bool) -> None:
    """Answer each "run" line with one timed call, "profile" with where a call's time goes;
    stop at anything else or end of input."""
    for line in sys.stdin:
        if line.strip() == "profile":
            from tformer.commands.benchmarking.breakdown import time_parts

            reply(parts=time_parts(call) if profiled else {})
            continue
        if line.strip() != "run":
            break
        c0, t0 = time.process_time(), time.perf_counter()
        call()
        t1, c1 = time.perf_counter(), time.process_time()
        reply(wall=t1 - t0, cpu=c1 - c0)


# The parent ---------------------------------------------------------------------------------------
class Worker:
    """A contender process, started and run once: the constructor returns when its first call
    is done, so that no two start at once. A start-up runs the first call, where tformer
    measures its kernel choices (tformer.nn.kernels.autotune) and remembers them: measured beside
    another process's start-up, they timed the contention (8-24 ms medians for a 0.1 ms
    kernel), and the timed rounds ran what the contention chose. ``ready`` gives the output."""

    def __init__(self, spec: dict, env: dict[str, str]):
        self.name = spec["name"]
        self.log = Path(spec["work"]) / f"log-{spec['index']}.txt"
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tformer.commands.benchmarking.worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, bufsize=1)
        try:
            self._first: dict | RuntimeError = self._read()
        except RuntimeError as e:  # raised by ready(), where the caller reports it
            self._first = e

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self._log.flush()
            tail = [ln for ln in self.log.read_text().strip().splitlines() if ln.strip()][-1:]
            raise RuntimeError(f"worker exited ({self.proc.returncode}): {' '.join(tail)[-200:]}")
        return json.loads(line)

    def ready(self) -> dict:
        """{"output": np.ndarray (or the .json's value), "note": str} or {"skip": reason};
        RuntimeError if it died."""
        msg = self._first
        if isinstance(msg, RuntimeError):
            raise msg
        if "skip" in msg:
            self.close()
            return msg
        path = Path(msg["output"])
        output = json.loads(path.read_text()) if path.suffix == ".json" else np.load(path)
        return {"output": output, "note": msg["note"]}

    def __call__(self) -> Measured:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        msg = self._read()
        return Measured(msg["wall"], msg["cpu"])

    def parts(self) -> dict[str, float]:
        """Seconds of one untimed call per part (``breakdown.time_parts``); {} for a peer."""
        self.proc.stdin.write("profile\n")
        self.proc.stdin.flush()
        return self._read()["parts"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start(names: list[str], task: str, inputs: Path, paths, threads: int) -> tuple[dict, dict]:
    """Start a worker per contender that can run here, one after the other; returns (workers,
    skipped: name -> reason)."""
    workers, skipped = {}, {}
    for i, name in enumerate(names):
        c = peers.BY_NAME[name]
        if c.package and importlib.util.find_spec(c.package) is None:
            skipped[name] = f"skipped: {c.package} is not installed (pip install tformer[bench])"
            continue
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.update({k: os.environ.get(k, v) for k, v in c.env.items()})  # the caller's values win
        spec = {"name": name, "task": task, "inputs": str(inputs), "threads": threads, "index": i,
                "model": str(paths.model), "onnx": str(paths.onnx), "work": str(paths.work)}
        workers[name] = Worker(spec, env)
    return workers, skipped


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
