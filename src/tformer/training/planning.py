"""A real run's plan: the data summary and this machine's speeds that tformer.training.plan's
``make_plan`` decides from, gathered from the objective and the machine, and the plan applied.

    plan, objective, speeds, data = plan_run(objective, resume, world, started, log, run_dir, device)

On a CPU a step's time is its FLOPs at the rate this machine's own training steps reached
(remembered per kind and precision with the kernel choices, tformer.nn.kernels.autotune, by every
run after its first steps), or, on a machine that has trained nothing yet, at STEP_EFFICIENCY of
the rate of a 512^3 fp32 matrix product measured once (tens of milliseconds), and in 16 bits at
fp32's over what 16 bits gain on one of the model's layers at the batch's size (timed once per
machine and shape, ``layer_seconds``: about a second for the sizing ladder's three models). The
run's first real steps then check the estimate (``replan``) and teach the cache, so a second run
plans from real steps. Off the CPU, where a small step's time is bound by kernel launches rather
than FLOPs, each model is timed on a few real steps instead.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from tformer.config.sizes import flops_per_token
from tformer.nn.devices import half_name, resolve_device
from tformer.nn.kernels import autotune
from tformer.nn.kernels.machine import free_threads, has_bf16, others_running
from tformer.storage.files import write_json_atomic
from tformer.text.tokenizer import load_tokenizer
from tformer.training.objective import Objective
from tformer.training.plan import DataSummary, make_plan
from tformer.training.precision import choose_precision, precision_why, step_class
from tformer.training.sizing import AUTO_LENGTH_LIMIT, finetune_lr, rungs_for, time_steps
from tformer.training.steps import probe_step
from tformer.training.windows import settle as settle_long_texts

# A training step's FLOP rate against a 512^3 product's, on a machine whose own steps were never
# timed: 0.56 (fp32) and 0.49 (bf16) for a d_model-128 classifier on an Intel Xeon (AMX), 1 thread.
STEP_EFFICIENCY = 0.5
STEP_OVERHEAD = 0.005  # seconds a step spends beyond its products (optimizer, Python, batching)
PRODUCT = 512
# Records of the first pool the plan's summary tokenizes at AUTO_LENGTH_LIMIT (all 4,096 of a
# pool took 6.0 s of a 3-minute fine-tune's start, quiet, 1 thread; 1,024 took 1.3).
SUMMARY_RECORDS = 1024
# A layer's attention is timed on this many tokens of this many keys (``attention_seconds``).
ATTENTION_TOKENS, ATTENTION_KEYS = 1024, 256
# A layer's step is timed on each of LAYER_TOKENS tokens, in rows of LAYER_KEYS (``layer_seconds``):
# a part a call and a part a token, in fp32 and in 16 bits (bf16 at 128 tokens: its kernels' fixed
# costs; at 512 its products).
LAYER_TOKENS = (128, 512)
LAYER_KEYS = 16


def choose_threads(config, world: int) -> tuple[object, str | None, float]:
    """(the config with its threads, why or None where given, how much slower than alone this
    process will run): one thread per core that other processes leave free, at least one. Two
    threads sharing their cores with two busy processes made a training step 2-3x slower than one
    thread did (OpenMP's threads wait for the slowest at every product)."""
    cores = torch.get_num_threads()
    if config.threads is not None or world > 1:
        return config, None, 1.0
    others = others_running(spin=True)  # (another run starting now counts this one too)
    threads = free_threads(cores, others)
    slowdown = max(1.0, (others + threads) / cores)
    if threads == cores:
        why = f"{threads}, one per core (--threads sets it)"
    else:
        why = (f"{threads} of {cores}: {others:g} threads of other processes are running on this "
               "machine's cores (--threads sets it)")
    return config.replace(threads=threads), why, slowdown


RECHECK_SECONDS = 10.0  # a run that chose its threads checks them again this often while it trains


class ThreadWatch:
    """The threads ``choose_threads`` chose, checked again after the first update and every
    RECHECK_SECONDS while the run trains (``check``): two runs started together each found the
    machine's 2 cores free, took 2 threads, then shared them at 2.1 s and 0.67 s a step. Fewer
    threads at once; more only when two checks in a row find the cores free (a run beside
    another that pauses to save or validate would otherwise change them back and forth)."""

    def __init__(self, cores: int) -> None:
        self.cores, self.due, self.wanted = cores, 0.0, None

    def check(self) -> str | None:
        """The line that says the threads changed (None where they did not, or it is not time)."""
        now = time.perf_counter()
        if now < self.due:
            return None
        self.due = now + RECHECK_SECONDS
        # (read running, as at the start: two runs side by side check at the same moments, every
        # RECHECK_SECONDS from their first updates; asleep between reads, each found the other
        # asleep, the cores free, and both took both: 947 tokens a second against 4,300 until
        # the next checks gave one back, and a test reserve timed then kept 26 s of 150 unused)
        others = others_running(samples=5, interval=0.01, spin=True)
        threads, had = free_threads(self.cores, others), torch.get_num_threads()
        if threads == had or (threads > had and self.wanted != threads):
            self.wanted = threads  # (more: once more, at the next check)
            return None
        self.wanted = None
        torch.set_num_threads(threads)
        return (f"threads: {threads} of {self.cores} from here on, not {had}: {others:g} threads "
                "of other processes are running on this machine's cores now (--threads sets it)")


def step_flops(model, kind: str, tokens: float, length: float) -> float:
    """FLOPs of one update (forward and backward: 3x the forward) on `tokens` tokens."""
    return 3.0 * flops_per_token(model, max(1, int(length)), kind) * tokens


class MachineSpeeds:
    """tformer.training.plan.Speeds for this machine as it runs now (`slowdown`: other work on
    its cores, ``choose_threads``). `objective_for(config)`: an objective, for timing real steps
    off the CPU."""

    def __init__(self, device: torch.device, slowdown: float = 1.0, objective_for=None) -> None:
        self.device, self.slowdown, self.objective_for = device, slowdown, objective_for
        self.threads: ThreadWatch | None = None  # threads the run chose, checked again as it trains

    def rate(self, kind: str, precision: str) -> tuple[float, str]:
        """(FLOP/s of a training step here, alone; where the number comes from)."""
        known = autotune.known("train-rate", f"{kind} {precision}", device=self.device)
        if known is not None:
            return 1e9 / max(known["seconds"]["gflop"], 1e-12), "this machine's own training steps"
        product = product_seconds(self.device)
        seconds = product.get(precision, product["fp32"])
        return STEP_EFFICIENCY * 2 * PRODUCT**3 / seconds, f"its {PRODUCT}^3 product's rate"

    def step_seconds(self, config, model, kind, tokens, length, precision) -> float | None:
        if self.device.type != "cpu" and self.objective_for is not None:
            return self._timed(config, precision)
        attention = self.attention(model, kind, tokens, length, precision)
        products = self.products(model, kind, tokens, length, precision)
        return (STEP_OVERHEAD + products + attention) * self.slowdown

    def products(self, model, kind: str, tokens: float, length: float, precision: str) -> float:
        """Seconds of a step's products and the work around them, alone: its FLOPs at ``rate``,
        or, in 16-bit where this machine's own steps have not said it yet, fp32's seconds over
        what 16-bit gains on a layer of this model at the batch's size (``layer_seconds``). A
        512^3 product's gain was no step's: 6.3x (AMX) put a bf16 step of a d_model-384
        classifier on 424 tokens at 82 ms where it ran 163-283 (its fp32 steps 260-360)."""
        flops = step_flops(model, kind, tokens, length)
        if precision == "fp32" or autotune.known("train-rate", f"{kind} {precision}", device=self.device):
            return flops / self.rate(kind, precision)[0]
        fixed, per_token = layer_seconds(model, "fp32", self.device)
        fixed16, per_token16 = layer_seconds(model, precision, self.device)
        gain = (fixed + per_token * tokens) / max(fixed16 + per_token16 * tokens, 1e-9)
        return flops / self.rate(kind, "fp32")[0] / max(gain, 1e-3)

    def attention(self, model, kind: str, tokens: float, length: float, precision: str) -> float:
        """Seconds of a step's attention scores beyond their products, as this machine's own
        (``attention_seconds``): a layer's score count is its tokens x keys x heads (a seq2seq
        model's decoder layers counted alike)."""
        layers = model.n_layers + (model.decoder_layers if kind == "seq2seq" else 0)
        return attention_seconds(model, precision, self.device) * layers * tokens * length * model.n_heads

    def _timed(self, config, precision: str) -> float:
        """Off the CPU: a few real steps of the model (remembered per shape)."""
        objective = self.objective_for(config)
        key = step_class(objective.model_kind, objective.model_config(), f"{config.max_tokens} tokens")
        bf16 = precision != "fp32"
        decided = autotune.recall("train-step", f"{key} {precision}", lambda: autotune.decision(
            "measured", {"step": time_steps(objective, probe_step(config, bf16, self.device)).step}),
            device=self.device)
        return decided["seconds"]["step"]

    def precision(self, config, model, kind) -> tuple[str, str, bool]:
        precision, why = choose_precision(config.precision, self.device)
        if config.precision != "auto" or precision == "fp32":
            return precision, why, False
        # The first updates alternate the two either way, so that a run's numbers do not depend on
        # what this machine remembers (a resume, or the same run again, gives the same weights).
        known = autotune.known("train-precision", precision_key(config, model, kind), {"fp32", precision},
                               self.device)
        if known is not None:
            return known["choice"], precision_why(known, precision), True
        return precision, f"{why}; the run's first updates time both precisions and keep the faster", True

    def learned(self, kind: str, precision: str, seconds: float, model, tokens: float, length: float) -> None:
        """Remember the rate a real step of the run reached (as it would run alone)."""
        flops = step_flops(model, kind, tokens, length)
        alone = max(seconds / self.slowdown - STEP_OVERHEAD, 1e-6)
        alone = max(alone - self.attention(model, kind, tokens, length, precision), 0.1 * alone)  # products'
        autotune.remember("train-rate", f"{kind} {precision}",
                          autotune.decision(precision, {"gflop": alone / (flops / 1e9)}), self.device,
                          rate=True)


def product_seconds(device: torch.device) -> dict[str, float]:
    """Seconds of a PRODUCT^3 matrix product here, fp32 and (where the CPU has bf16) bf16
    autocast: measured once per machine and remembered."""
    from tformer.nn.precision import bf16_speedup

    if device.type == "cpu" and has_bf16():
        bf16_speedup(device=device)  # measures and remembers both
        known = autotune.known("bf16-product", f"{PRODUCT}^3", device=device)
        if known is not None:
            return dict(known["seconds"])

    def fp32() -> dict:
        a = torch.randn(PRODUCT, PRODUCT, generator=torch.Generator().manual_seed(0)).to(device)
        a @ a
        times = []
        for _ in range(3):
            t = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - t)
        return autotune.decision("fp32", {"fp32": min(times)})

    return dict(autotune.recall("fp32-product", f"{PRODUCT}^3", fp32, device=device, rate=True)["seconds"])


def attention_seconds(model, precision: str, device: torch.device) -> float:
    """Seconds a layer's attention takes a score (a token, a key and a head) in a training step,
    forward and backward, beyond what its FLOPs count: the scores' mask, softmax and dropout are
    memory-bound, not products. A step's FLOPs left them out: a d_model-128 classifier's plan
    expected 263 ms a step at 512 tokens and its steps took 2,085 (its attention alone, with
    BERT's 0.1 dropout on the weights, 288 ms a layer; 55 at 64 tokens), and the run started
    again at 64 tokens. Timed once per machine on ATTENTION_TOKENS tokens of ATTENTION_KEYS keys
    with the model's heads and attention dropout in the run's precision, and remembered (a rate:
    kept for later runs only where measured with the cores free)."""
    from tformer.nn.attention import scaled_dot_product_attention

    heads, p = model.n_heads, model.attention_dropout
    width, rows = model.d_model // heads, max(ATTENTION_TOKENS // ATTENTION_KEYS, 1)
    half = precision != "fp32"
    dtype = torch.bfloat16 if half else torch.float32

    def measure() -> dict:
        g = torch.Generator().manual_seed(0)  # never the global generator
        shape = (rows, heads, ATTENTION_KEYS, width)
        q, k, v = (torch.randn(shape, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
        keys = torch.ones(rows, 1, 1, ATTENTION_KEYS, dtype=torch.bool, device=device)  # (a padding mask)
        times = []
        for _ in range(4):  # (the first: kernel creation, first touch; the fastest of the others)
            t = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
                out, _ = scaled_dot_product_attention(q, k, v, keys, dropout_p=p)
            out.float().sum().backward()
            times.append(time.perf_counter() - t)
        scores = rows * heads * ATTENTION_KEYS * ATTENTION_KEYS
        return autotune.decision("measured", {"million scores": min(times[1:]) / scores * 1e6})

    shape = f"{heads}x{width} dropout {p:g} {precision}"
    seconds = autotune.recall("train-attention", shape, measure, device=device, rate=True)["seconds"]
    return seconds["million scores"] / 1e6


def layer_seconds(model, precision: str, device: torch.device) -> tuple[float, float]:
    """(seconds a training step spends in one encoder layer a call, and a token): an
    EncoderLayer of the model's sizes, activation, norms and dropout, forward and backward in
    `precision`, timed once per machine on each of LAYER_TOKENS tokens (rows of LAYER_KEYS) and
    remembered (a rate: kept for later runs only where measured with the cores free). Its
    products at the batch's size, and the work around them that does not get faster in 16
    bits, are in it: a d_model-384 layer in bf16 on an Intel Xeon with AMX took 2.6x less than
    in fp32 at 424 tokens, where a 512^3 product took 6.3x less."""
    from tformer.nn.layers import EncoderLayer

    half = precision != "fp32"

    def measure() -> dict:
        # (dropout's masks: never the run's generator; the kernels: their defaults, no choice
        # measured for shapes the run may never see, nor its measuring allowance spent)
        with torch.random.fork_rng(devices=[]), autotune.measuring(0.0):
            torch.manual_seed(0)
            layer = EncoderLayer(model).to(device).train()
            seconds = []
            for tokens in LAYER_TOKENS:
                x = torch.randn(tokens // LAYER_KEYS, LAYER_KEYS, model.d_model, device=device)
                x.requires_grad_()
                times = []
                for _ in range(3):  # (the first: kernel creation, first touch; the faster of the others)
                    t = time.perf_counter()
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
                        out, _ = layer(x)
                    out.float().sum().backward()
                    times.append(time.perf_counter() - t)
                seconds.append(min(times[1:]))
        (few, many), (a, b) = LAYER_TOKENS, seconds
        per_token = max(b - a, 0.0) / (many - few)
        return autotune.decision("measured", {"call": max(a - few * per_token, 0.0), "token": per_token})

    norm = "pre" if model.norm_first else "post"
    shape = (f"{model.d_model}x{model.n_heads}x{model.d_ff} {model.activation} {norm}-norm "
             f"dropout {model.dropout:g}/{model.attention_dropout:g} {precision}")
    seconds = autotune.recall("train-layer", shape, measure, device=device, rate=True)["seconds"]
    return seconds["call"], seconds["token"]


def precision_key(config, model, kind: str) -> str:
    """What a run's precision decision is remembered by: the model's shape and the batch."""
    shape = (f"{config.max_tokens} tokens" if config.max_tokens
             else f"{config.batch_size} x {config.max_length}")
    if config.from_pretrained:  # its own shape, named by its directory
        shape += f", from {Path(config.from_pretrained).resolve()}"
    return step_class(kind, model, shape)


def summarize(objective: Objective) -> DataSummary:
    """The plan's view of the data: a sample's token counts at AUTO_LENGTH_LIMIT, the splits."""
    config = objective.config
    limit = AUTO_LENGTH_LIMIT
    if objective.pretrained is not None:  # its tokenizer's limit (all-MiniLM-L6-v2: 256 of 512 positions)
        limit = min(limit, load_tokenizer(objective.pretrained).max_length or limit)
    elif config.from_pretrained:  # a resumed fine-tune: its own tokenizer's (its base is not read)
        limit = min(limit, objective.tokenizer.max_length or limit)
    texts: tuple = ()
    if config.data is not None:
        wide = objective.with_config(config.replace(max_length=limit))
        pool = next(objective.source.data.epoch_pools())  # (in file order: every k-th is a sample)
        encoded = wide.encode(pool[:: max(1, len(pool) // SUMMARY_RECORDS)])
        # Each text's tokens (an example's `lengths` where it has more than two texts: a query's
        # 20 passages summed as one "text" cut at 128 made a reranking example 10x cheaper than it is)
        texts = tuple(tuple(n for n in getattr(ex, "lengths", (ex.longest, ex.cost - ex.longest)) if n > 0)
                      for ex in encoded)
    model = objective.model_config()
    if objective.base_config is not None:
        model = objective.base_config.replace(n_classes=model.n_classes, max_len=limit)
    return DataSummary(objective.model_kind, model, texts, objective.train_records or 0,
                       len(objective.examples("validation")), len(objective.examples("test")),
                       bool(config.from_pretrained), objective.predict_cost, objective.steps_factor,
                       bool(config.from_pretrained) and objective.probes_head and config.head_init == "auto")


def plan_run(objective: Objective, resume: bool, world: int, started: float, log=print,
             run_dir: Path | None = None, device=None):
    """(the plan, the objective under it, the machine's speeds, the data summary) of a run of
    `objective` (its config as given); each choice is logged as it is made."""
    config = objective.config
    device = device or resolve_device(config.device)

    def chose(what: str, why: str, note: str = "") -> None:
        log(f"{what}: {why}{note}")

    cores = torch.get_num_threads()  # (choose_threads's: one thread per core, before it chose)
    config, why_threads, slowdown = choose_threads(config, world)
    if why_threads is not None:
        torch.set_num_threads(config.threads)
        chose("threads", why_threads)
    if config.lr is None:  # resumed runs saved theirs
        config, why = finetune_lr(config, objective.model_width())
        chose("learning rate", why)
    objective = objective.with_config(config)
    if config.from_pretrained and config.pretrained_dropout and not resume:  # (given: the user knows it)
        own = objective.base_config
        chose("dropout", f"{own.dropout:g} (attention weights {own.attention_dropout:g}), the pretrained "
                         "model's own (--dropout sets it)")
    untrained = getattr(getattr(objective.source, "data", None), "untrained", None)
    if untrained and not resume:
        names = ", ".join(f"{label!r} (only in {' and '.join(splits) or 'held-out records'})"
                          for label, splits in untrained.items())
        log(f"warning: no training record has the label {names}: the model cannot learn it; add "
            "training records of it, or give --valid/--test files")
    budget = config.max_minutes * 60 - (time.perf_counter() - started) if config.max_minutes else math.inf
    speeds = MachineSpeeds(device, slowdown if device.type == "cpu" else 1.0, objective.with_config)
    if why_threads is not None and device.type == "cpu":
        speeds.threads = ThreadWatch(cores)
    data = summarize(objective)
    plan = make_plan(config, data, speeds, budget, resume, world, half_name(device), rungs_for(device))
    plan.extra.update(slowdown=speeds.slowdown, test_examples=data.test_examples)  # (check_affordable's)
    notes = {"max length": " (--max-length sets it)", "model size": " (size options turn this off)"}
    for what, why in plan.reasons:
        if what != "precision" and not resume:  # the loop prints it (a resumed run keeps its own)
            chose(what, why, notes.get(what, ""))
    if plan.config.max_length != objective.config.max_length and run_dir is not None:
        objective = objective.with_config(plan.config)
        write_json_atomic(run_dir / "data.json", objective.source.data.describe())  # resuming reads it
    objective = objective.with_config(plan.config)
    if config.data is not None and data.texts and not resume:
        objective, cut = settle_long_texts(objective, plan, data, run_dir)  # windows or cut
        if cut:
            log(cut)
    return plan, objective, speeds, data


def replanned(objective: Objective, plan, data: DataSummary, run_dir: Path | None, log=print) -> Objective:
    """The objective under a re-plan's config (tformer.training.plan.replan): at a new max
    length, long texts settled again (windows or cut) and recorded in data.json, as plan_run does."""
    length = objective.config.max_length
    objective = objective.with_config(plan.config)
    if plan.config.max_length != length and data.texts:
        objective, cut = settle_long_texts(objective, plan, data, run_dir)
        if run_dir is not None and not objective.pools:
            write_json_atomic(run_dir / "data.json", objective.source.data.describe())  # resuming reads it
        if cut:
            log(cut)
    return objective

