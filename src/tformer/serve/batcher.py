"""Dynamic batching: inputs that arrive close together run through the model as one batch.

Every input text is a job with a future. The batch loop waits for a first job, then for up to
``max_wait`` seconds (counted from the oldest job's arrival) while fewer than ``max_batch_tokens``
tokens are waiting; it then takes jobs in fair order until the token budget is spent, sorts them
by length and runs them in the model thread. The encoder runs the real tokens only (packed, see
``tformer.nn.masks.Packing``), so the budget counts real tokens and a batch's answers are those
of each input run alone.

Fair order is start-time fair queuing over requests, counted in tokens (Goyal, Vin and Cheng
1996, "Start-time fair queueing"): a request's jobs get start tags ``V``, ``V + n_1``,
``V + n_1 + n_2``, ... where ``V`` is the largest tag the model has taken so far, and batches
take jobs by tag (arrival breaks ties). A request of 256 long texts runs in several batches; a
one-text request that arrives meanwhile gets the tag of the jobs now running, so it goes into
the next batch instead of after all 256 (plain arrival order made it wait for the whole big
request). No job starves: every tag is finite and ``V`` only grows.

Fair order alone still made a short request wait for two batches: the one in the model, then
the next, which it shared with a full budget of the large requests' texts (all-MiniLM-L6-v2,
median 2.0 batches). So short requests (at most ``max_batch_tokens / SHORT_SHARE`` tokens in
all) have a lane: when both short and other jobs wait, the next batch takes only short ones
(still in fair order), and it runs in a few milliseconds; a short request then waits about the
batch in the model, at most. Two short-only batches never follow each other while other jobs
wait, so a stream of short requests cannot starve a large one: it gets every other batch.

Draining (SIGTERM: no new requests, ``--grace-period`` seconds for those in flight), fair order
is the wrong order: it finishes every request at about the same time, so when the grace period
ends under load nearly all of them are unfinished and get 503, the ones almost done too. From
``drain()`` on, batches take the jobs of the request with the least work left first (fewest
tokens still unanswered; arrival breaks ties: shortest remaining processing time, which
completes the most requests by any deadline), and a batch no longer waits for company.

While a batch runs, new jobs queue up; under load the next batch is ready the moment the model
is free. The queue is bounded: ``submit`` refuses (``QueueFull``) jobs past ``max_queue``
waiting or running. A job whose future is cancelled (its client went away) frees its place at
once and is skipped when batches are taken.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tformer.kinds.serving import Item
from tformer.serve.metrics import Metrics

# A request of at most max_batch_tokens / SHORT_SHARE tokens is short: it gets the short lane.
SHORT_SHARE = 8


class QueueFull(Exception):
    """The queue cannot take the request's inputs; the server answers 503 + Retry-After."""

    def __init__(self, depth: int, limit: int, retry_after: int) -> None:
        super().__init__(f"queue: {depth} inputs waiting or running, at most {limit}; retry later")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server is stopping and the grace period is over: the job's client gets 503."""


@dataclass
class Request:
    """The jobs of one submit: how many tokens of them are still unanswered, and when it came."""

    tokens: int  # all of its tokens
    seq: int  # arrival order
    left: int = 0  # tokens of its jobs not yet answered (or cancelled)

    def __post_init__(self) -> None:
        self.left = self.tokens


@dataclass
class Job:
    item: Item
    key: Hashable  # jobs batch together only with the same key (e.g. generation settings)
    future: asyncio.Future
    tag: int = 0  # the fair-order start tag (see the module's docstring)
    seq: int = 0  # arrival order, which breaks ties between equal tags
    request: Request = field(default_factory=lambda: Request(0, 0))  # the request it is part of
    arrived: float = field(default_factory=time.monotonic)

    @property
    def order(self) -> tuple[int, int]:
        return self.tag, self.seq

    @property
    def request_tokens(self) -> int:
        return self.request.tokens

    @property
    def drain_order(self) -> tuple[int, int, int]:
        """While draining: the request with the least work left first, then arrival."""
        return self.request.left, self.request.seq, self.seq


class Batcher:
    """Runs ``run(payloads, key) -> results`` (one result per payload) on batches of jobs, in
    one thread of its own, so the event loop stays free to read and answer requests."""

    def __init__(self, run: Callable[[list[Any], Hashable], list[Any]], max_batch_tokens: int,
                 max_wait_ms: float, max_queue: int, metrics: Metrics,
                 thread_init: Callable[[], None] | None = None) -> None:
        self.run, self.metrics = run, metrics
        self.max_batch_tokens, self.max_queue = max_batch_tokens, max_queue
        self.max_wait = max_wait_ms / 1000
        self.short_tokens = max_batch_tokens // SHORT_SHARE  # a request this small is short
        self.depth = 0  # jobs admitted and not yet answered or cancelled
        self.seconds_per_token = 1e-4  # a running estimate, for Retry-After
        self._waiting: list[Job] = []  # sorted by Job.order
        self._virtual = 0  # V: the largest start tag taken into a batch
        self._seq = 0
        self._short_last = False  # the last batch took short requests only, past others waiting
        self._running: list[Job] = []  # the batch in the model
        self._draining = False  # SIGTERM: least work left first, no waiting for company
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tformer-model", initializer=thread_init)
        self._task: asyncio.Task | None = None

    # Admission (event loop) ---------------------------------------------------------------------
    def submit(self, items: list[Item], key: Hashable = None) -> list[asyncio.Future]:
        """Queue a request's inputs together, or none of them (QueueFull)."""
        if self.depth + len(items) > self.max_queue:
            self.metrics.rejected.inc()
            raise QueueFull(self.depth, self.max_queue, self.retry_after())
        loop = asyncio.get_running_loop()
        futures, tag = [], self._virtual
        request = Request(sum(item.n for item in items), self._seq)
        for item in items:
            job = Job(item, key, loop.create_future(), tag, self._seq, request)
            job.future.add_done_callback(lambda f, job=job: self._done(job))
            bisect.insort(self._waiting, job, key=lambda j: j.order)
            futures.append(job.future)
            tag += item.n
            self._seq += 1
        self.depth += len(items)
        self.metrics.queue_depth.set(self.depth)
        self._arrived.set()
        return futures

    def _done(self, job: Job) -> None:
        self.depth -= 1  # answered, failed or cancelled: the place is free
        job.request.left -= job.item.n
        self.metrics.queue_depth.set(self.depth)

    def retry_after(self) -> int:
        """Seconds until the queue has room, estimated from the recent cost per token."""
        waiting = sum(j.item.n for j in self._waiting if not j.future.done())
        return max(1, round(waiting * self.seconds_per_token))

    # The batch loop ---------------------------------------------------------------------------------
    async def call_in_model_thread(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the model's thread (e.g. a warm-up before serving)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def drain(self) -> None:
        """SIGTERM: from now on, batches finish the requests with the least work left first, and
        start at once (no new request is coming to share them)."""
        self._draining = True
        self._arrived.set()

    def abandon(self) -> None:
        """The drain's grace period is over: every job not yet answered fails with ShuttingDown
        (a batch in the model finishes on its own; nobody waits for it)."""
        for job in [*self._waiting, *self._running]:
            if not job.future.done():
                job.future.set_exception(ShuttingDown("server: shutting down, the grace period is over; "
                                                      "retry on another server"))
        self._waiting = []

    async def stop(self) -> None:
        """Answer what is queued (the server stops taking requests first), then stop."""
        while self.depth > 0:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            key = batch[0].key
            payloads = [j.item.payload for j in batch]
            started = time.perf_counter()
            self._running = batch
            try:
                results = await loop.run_in_executor(self._executor, self.run, payloads, key)
            except Exception as e:  # a bug or a model failure: every job of the batch hears of it
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            finally:
                self._running = []
            tokens = sum(j.item.n for j in batch)
            seconds = time.perf_counter() - started
            self.seconds_per_token = 0.8 * self.seconds_per_token + 0.2 * seconds / max(tokens, 1)
            self.metrics.observe_batch(len(batch), tokens, seconds)
            for job, result in zip(batch, results, strict=True):
                if not job.future.done():  # cancelled meanwhile: nobody is listening
                    job.future.set_result(result)

    async def _next_batch(self) -> list[Job]:
        """Wait for jobs (up to max_wait after the oldest), then take one batch of them."""
        while not self._live():
            self._arrived.clear()
            await self._arrived.wait()
        deadline = min(j.arrived for j in self._waiting) + self.max_wait
        while not self._draining and self._tokens_waiting() < self.max_batch_tokens:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                break
        if self.max_wait == 0:
            await asyncio.sleep(0)  # let requests that arrived together be admitted first
        return self._take()

    def _live(self) -> bool:
        """Drop cancelled jobs from the front; whether any job is waiting."""
        first = next((i for i, j in enumerate(self._waiting) if not j.future.done()), len(self._waiting))
        del self._waiting[:first]
        return bool(self._waiting)

    def _tokens_waiting(self) -> int:
        return sum(j.item.n for j in self._waiting if not j.future.done())

    def _take(self) -> list[Job]:
        """The first job in fair order, then later ones with its key, in that order, within the
        budget; only short requests' jobs if both short and other jobs wait and the last batch
        was not short-only (the lane: see the module's docstring); the batch sorted by length
        (longest first)."""
        if not self._live():
            return []
        jobs = [j for j in self._waiting if not j.future.done()]
        if self._draining:  # the requests nearest to done first (see the module's docstring)
            lane = sorted(jobs, key=lambda j: j.drain_order)
        else:
            short = [j for j in jobs if j.request_tokens <= self.short_tokens]
            self._short_last = bool(short) and len(short) < len(jobs) and not self._short_last
            lane = short if self._short_last else jobs
        key, budget = lane[0].key, self.max_batch_tokens
        batch, used = [], 0
        for job in lane:
            if job.key != key:
                continue
            if batch and used + job.item.n > budget:
                break  # fair order: a later, shorter job must not jump this one
            batch.append(job)
            used += job.item.n
        taken = {id(j) for j in batch}
        self._waiting = [j for j in jobs if id(j) not in taken]  # (still in fair order)
        self._virtual = max(self._virtual, *(j.tag for j in batch))
        batch.sort(key=lambda j: -j.item.n)
        return batch
