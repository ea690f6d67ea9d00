"""Decoding a trained run's own test split: `tformer generate` against CTranslate2 on the same
weights, greedy and beam 4, with each output's BLEU against the references.

    python benchmarks/decode_run.py runs/demo-en-de-...          # a run `tformer train` wrote
    python benchmarks/decode_run.py RUN --count 500 --rounds 3 --threads 2

`tformer bench --only decode-marian decode-default` times random weights whose outputs mostly
run to the length limit; a trained model stops where its translation ends, at different steps
per input, which is what the batching and the search's stopping rule are for. Here the run is
exported with `tformer export --hf` (Marian or Pegasus layout), converted with CTranslate2's own
converter, and both read the same token ids (the run's tokenizer, the source's EOS appended as
training encodes it). Each contender runs in a process of its own (CTranslate2's OpenMP runtime
slows torch in a shared one), one warm-up pass, then `--rounds` timed passes over the inputs;
contenders alternate round by round. tformer batches 32 inputs (`tformer generate`'s default),
sorted by length within windows; CTranslate2 gets max_batch_size 32, which sorts its inputs by
length too. tformer stops a batch at 2 x its longest input's tokens + 10 (at most the run's
max_new_tokens); CTranslate2 takes one bound per call: that of the longest input of all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONTENDERS = ("tformer greedy", "tformer beam 4", "CTranslate2 greedy", "CTranslate2 beam 4")


def inputs(run_dir: str, count: int) -> tuple[list[str], list[str], list[list[int]], int, int]:
    """The first `count` test examples: sources, references, encoder ids (+ EOS), the EOS id
    and the run's max_new_tokens."""
    from tformer.kinds import load_run

    run = load_run(run_dir, needs="generate", device="cpu")
    examples = run.examples("test")[:count]
    source = run.objective.source
    texts = [source.field(ex, "source") for ex in examples]
    refs = [source.field(ex, "target") for ex in examples]
    ids = [p + [source.eos_id] for p in source.pieces(texts)]
    return texts, refs, ids, source.eos_id, run.max_new_tokens


def ct2_model(run_dir: str, out: Path) -> Path:
    """The run exported with `tformer export --hf`, then converted by CTranslate2's converter
    (its Pegasus loader reads two config fields transformers 5 no longer writes; the decoder
    starts from the run's BOS, as tformer's does)."""
    hf = out / "hf"
    subprocess.run([sys.executable, "-m", "tformer", "export", run_dir, "--hf", str(hf)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = json.loads((hf / "config.json").read_text())
    if config["model_type"] == "pegasus":
        config.update(normalize_before=True, normalize_embedding=False)
        (hf / "config.json").write_text(json.dumps(config))
    import ctranslate2.converters

    ct2 = out / "ct2"
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(ct2), quantization=None)
    vocab = json.loads((ct2 / "shared_vocabulary.json").read_text())
    ct2_config = json.loads((ct2 / "config.json").read_text())
    ct2_config["decoder_start_token"] = vocab[config["decoder_start_token_id"]]
    (ct2 / "config.json").write_text(json.dumps(ct2_config))
    return ct2


def worker(args) -> None:
    """In a process of its own: one contender, a warm-up pass, then args.rounds timed passes;
    prints {"seconds": [...], "outputs": [[ids]]}."""
    spec = json.loads(Path(args.worker).read_text())
    beams = 4 if "beam" in spec["name"] else 1
    if spec["name"].startswith("tformer"):
        import torch

        from tformer.kinds import load_run
        from tformer.nn.kernels.allocator import keep_freed_memory

        keep_freed_memory()  # as the command line does
        torch.set_num_threads(spec["threads"])
        run = load_run(spec["run"], needs="generate", device="cpu")
        objective, source = run.objective, run.objective.source
        examples = source.inputs(spec["texts"], objective.inputs)

        def once():
            with torch.inference_mode():
                return objective.predict(run.model, examples, batch_size=32, beam_size=beams)
    else:
        import ctranslate2

        vocab = json.loads((Path(spec["ct2"]) / "shared_vocabulary.json").read_text())
        index = {t: i for i, t in enumerate(vocab)}
        translator = ctranslate2.Translator(spec["ct2"], device="cpu", inter_threads=1,
                                            intra_threads=spec["threads"])
        batch = [[vocab[i] for i in ids] for ids in spec["ids"]]
        # tformer's limit per batch: 2 x the longest input + 10, at most max_new_tokens.
        limit = min(2 * max(map(len, spec["ids"])) + 10, spec["max_new_tokens"])

        def once():
            results = translator.translate_batch(batch, beam_size=beams, max_batch_size=32,
                                                 max_decoding_length=limit, length_penalty=1.0,
                                                 return_end_token=True)
            return [[index[t] for t in r.hypotheses[0]] for r in results]
    outputs = once()
    seconds = []
    for _ in range(spec["rounds"]):
        start = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, "outputs": outputs}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?")
    parser.add_argument("--count", type=int, default=500, help="test examples (default 500)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if not args.run:
        parser.error("run: expected a run directory written by `tformer train`")
    import sacrebleu

    texts, refs, ids, eos, max_new = inputs(args.run, args.count)
    try:
        import ctranslate2  # noqa: F401 (optional: tformer[bench])
        contenders = CONTENDERS
    except ImportError:
        contenders = CONTENDERS[:2]
        print("CTranslate2 skipped: it is not installed (pip install 'tformer[bench]')")
    with tempfile.TemporaryDirectory(prefix="tformer-decode-run-") as tmp:
        ct2 = ct2_model(args.run, Path(tmp)) if len(contenders) > 2 else None
        results = {}
        for name in contenders:
            spec = {"name": name, "run": args.run, "texts": texts, "ids": ids, "ct2": str(ct2),
                    "threads": args.threads, "rounds": args.rounds, "max_new_tokens": max_new}
            path = Path(tmp) / "spec.json"
            path.write_text(json.dumps(spec))
            done = subprocess.run([sys.executable, __file__, "--worker", str(path)], check=True,
                                  capture_output=True, text=True)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    from tformer.kinds import load_run

    source = load_run(args.run, needs="generate", device="cpu").objective.source

    def text(out: list[int]) -> str:
        return source.decode(out[:-1] if out and out[-1] == eos else out)

    from tformer.commands.benchmarking.harness import cpu_info

    model, isa = cpu_info()
    print(f"CPU: {model} ({', '.join(isa)}); {args.threads} threads; {args.run}: {len(texts)} test inputs, "
          f"{args.rounds} rounds each after a warm-up")
    print("| contender | seconds (median) | inputs/s | t / t_tformer (same search) | "
          "BLEU | outputs as tformer's |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    median = {n: sorted(r["seconds"])[len(r["seconds"]) // 2] for n, r in results.items()}
    for name, r in results.items():
        ours = "tformer beam 4" if "beam" in name else "tformer greedy"
        same = sum(a == b for a, b in zip(r["outputs"], results[ours]["outputs"], strict=True))
        bleu = sacrebleu.corpus_bleu([text(o) for o in r["outputs"]], [refs]).score
        print(f"| {name} | {median[name]:.2f} | {len(texts) / median[name]:.0f} | "
              f"{median[name] / median[ours]:.2f}x | {bleu:.2f} | {same}/{len(texts)} |")


if __name__ == "__main__":
    main()
