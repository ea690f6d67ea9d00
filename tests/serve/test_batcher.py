"""The batcher alone (no server, no model): batches packed by tokens in fair order (a small
request is not held up by a big one), keyed settings kept apart, cancelled jobs skipped and
their places freed, a bounded queue."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tformer.kinds.serving import Item
from tformer.serve.batcher import Batcher, QueueFull
from tformer.serve.metrics import Metrics


def _items(*lengths: int) -> list[Item]:
    return [Item(n, n, f"text{n}") for n in lengths]


def _run_batches(jobs: list[tuple[list[int], object]], max_batch_tokens: int = 10, cancel: int | None = None):
    """Submit all jobs before the loop starts; return the batches run, as payload lists."""
    seen: list[tuple[list[str], object]] = []

    def run(payloads, key):
        seen.append((list(payloads), key))
        return payloads

    async def main():
        batcher = Batcher(run, max_batch_tokens, max_wait_ms=0, max_queue=100, metrics=Metrics())
        futures = [f for lengths, key in jobs for f in batcher.submit(_items(*lengths), key)]
        if cancel is not None:
            futures[cancel].cancel()
        batcher.start()
        results = await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop()
        return results, batcher.depth

    results, depth = asyncio.run(main())
    return seen, results, depth


def test_batches_fill_the_token_budget_in_fair_order_longest_first():
    # Start tags (tokens before each input in its request): 3@0 5@3 | 4@0 | 2@0 9@2; batches
    # take them by tag, arrival breaking ties, and stop at the first input that does not fit.
    seen, results, depth = _run_batches([([3, 5], None), ([4], None), ([2, 9], None)])
    assert [b for b, _ in seen] == [["text4", "text3", "text2"], ["text9"], ["text5"]]
    assert results == ["text3", "text5", "text4", "text2", "text9"] and depth == 0


def _with_arrivals(big: int, arrivals: dict[int, list[str]], max_batch_tokens: int = 8) -> list[list[str]]:
    """The batches run (as payload lists) for one request of ``big`` 2-token texts queued at the
    start, and one-token requests that arrive while batch i is in the model (``arrivals[i]``:
    their names, one request each). Deterministic: no clock, the arrivals are queued before
    the batch they arrive during returns."""
    seen: list[list[str]] = []

    async def main():
        loop = asyncio.get_running_loop()
        batcher = Batcher(lambda p, k: p, max_batch_tokens, max_wait_ms=0, max_queue=100, metrics=Metrics())
        futures = batcher.submit([Item(2, 2, f"big{i}") for i in range(big)])
        queued = threading.Event()

        def submit(names):
            for name in names:
                futures.extend(batcher.submit([Item(1, 1, name)]))
            queued.set()

        def run(payloads, key):
            names = arrivals.get(len(seen), [])
            if names:  # this batch is in the model: the requests arrive now
                queued.clear()
                loop.call_soon_threadsafe(submit, names)
                assert queued.wait(10)
            seen.append(list(payloads))
            return payloads

        batcher.run = run
        batcher.start()
        while not all(f.done() for f in futures):  # futures grows while batches run
            await asyncio.gather(*list(futures))
        await batcher.stop()

    asyncio.run(main())
    return seen


def test_a_short_request_waits_for_the_running_batch_only():
    """A one-input request that arrives while a 12-input request's first batch runs gets a batch
    of its own next (short-request lane), not a place in the next full batch (fair order alone
    made it wait for two batches) nor after all 12 (arrival order)."""
    seen = _with_arrivals(12, {0: ["small"]})
    assert seen == [["big0", "big1", "big2", "big3"], ["small"], ["big4", "big5", "big6", "big7"],
                    ["big8", "big9", "big10", "big11"]]


def test_short_requests_arriving_all_along_do_not_starve_a_large_one():
    """Short requests arriving during every batch: short-only batches never follow each other
    while the large request waits; it gets every other batch, and the short ones that arrived
    during a short-only batch lead the next full one (fair order)."""
    seen = _with_arrivals(12, {i: [f"s{i}a", f"s{i}b"] for i in range(6)})
    assert seen[:5] == [["big0", "big1", "big2", "big3"], ["s0a", "s0b"], ["big4", "big5", "big6", "s1a", "s1b"],
                        ["s2a", "s2b"], ["big7", "big8", "big9", "s3a", "s3b"]], seen
    assert sum(p.startswith("big") for batch in seen for p in batch) == 12
    big_batches = [i for i, batch in enumerate(seen) if any(p.startswith("big") for p in batch)]
    assert all(b - a <= 2 for a, b in zip(big_batches, big_batches[1:], strict=False)), seen


def test_only_short_requests_waiting_fill_one_batch():
    """The lane splits nothing when no large job waits: short requests alone batch as before."""
    seen, _, _ = _run_batches([([1], None), ([1], None), ([1], None)], max_batch_tokens=8)
    assert [b for b, _ in seen] == [["text1", "text1", "text1"]]


def test_different_settings_never_share_a_batch():
    seen: list[tuple[list[str], str]] = []

    async def main():
        batcher = Batcher(lambda p, k: seen.append((list(p), k)) or p, 10, max_wait_ms=0, max_queue=100,
                          metrics=Metrics())
        futures = [f for n, key in [(1, "greedy"), (1, "beam"), (2, "greedy"), (8, "beam")]
                   for f in batcher.submit([Item(n, n, f"{key}{n}")], key)]
        batcher.start()
        results = await asyncio.gather(*futures)
        await batcher.stop()
        return results

    assert asyncio.run(main()) == ["greedy1", "beam1", "greedy2", "beam8"]
    assert all(p.startswith(key) for batch, key in seen for p in batch), seen
    assert sorted(p for batch, _ in seen for p in batch) == ["beam1", "beam8", "greedy1", "greedy2"]


def test_a_cancelled_job_is_skipped_and_frees_its_place():
    seen, results, depth = _run_batches([([1, 2, 3], None)], cancel=1)
    assert [b for b, _ in seen] == [["text3", "text1"]]
    assert isinstance(results[1], asyncio.CancelledError) and depth == 0


def test_the_queue_is_bounded():
    async def main():
        batcher = Batcher(lambda p, k: p, 10, max_wait_ms=0, max_queue=3, metrics=Metrics())
        batcher.submit(_items(1, 1))
        with pytest.raises(QueueFull) as e:
            batcher.submit(_items(1, 1))  # all of a request's inputs, or none
        assert batcher.depth == 2 and e.value.retry_after >= 1
        batcher.submit(_items(1))

    asyncio.run(main())


def _drained(requests: dict[str, int], budget: int, ends_during: int, drain_at: int | None = 0
             ) -> tuple[list, list]:
    """Requests (name -> number of 2-token texts) all queued; the drain starts after batch
    ``drain_at`` (0: at once; None: never, fair order throughout), and the grace period ends
    (abandon) while batch ``ends_during`` runs. (batches run, the requests answered whole)."""
    seen: list[list[str]] = []

    async def main():
        batcher = Batcher(lambda p, k: p, budget, max_wait_ms=60_000, max_queue=1000, metrics=Metrics())
        futures = {name: batcher.submit([Item(2, 2, f"{name}{i}") for i in range(n)])
                   for name, n in requests.items()}

        def run(payloads, key):
            seen.append(list(payloads))
            if drain_at and len(seen) == drain_at:
                loop.call_soon_threadsafe(batcher.drain)
            if len(seen) == ends_during:
                loop.call_soon_threadsafe(batcher.abandon)
            return payloads

        loop = asyncio.get_running_loop()
        batcher.run = run
        if drain_at == 0:
            batcher.drain()
        else:
            batcher.max_wait = 0
        batcher.start()
        done = {name: await asyncio.gather(*fs, return_exceptions=True) for name, fs in futures.items()}
        await batcher.stop()
        return [name for name, results in done.items() if not any(isinstance(r, Exception) for r in results)]

    answered = asyncio.run(main())
    return seen, answered


def test_a_drain_finishes_the_requests_with_the_least_work_left_first():
    """SIGTERM under load: in fair order every request advanced together and, when the grace
    period ended, all 16 were unfinished and got 503. Draining, the batches finish the requests
    with the least work left first: in the same 8 batches, 8 of the 16 are answered whole."""
    requests = {f"r{i:02d}-": 4 for i in range(16)}  # 16 requests of 4 texts; a batch holds 4 texts
    _, answered = _drained(requests, budget=8, ends_during=9, drain_at=None)
    assert answered == []  # fair order: every request half done, none whole
    seen, answered = _drained(requests, budget=8, ends_during=9)
    assert len(answered) == 8 and all(len({p[:4] for p in batch}) == 1 for batch in seen[:8]), seen
    _, answered = _drained(requests, budget=8, ends_during=9, drain_at=4)  # 4 batches in fair order first
    assert len(answered) == 5, answered  # each request left 3 texts: 4 more batches of 4 finish 5


def test_a_drain_takes_the_smallest_remaining_request_first():
    seen, answered = _drained({"big-": 6, "mid-": 3, "one-": 1, "two-": 2}, budget=4, ends_during=4)
    assert seen[:3] == [["one-0", "two-0"], ["two-1", "mid-0"], ["mid-1", "mid-2"]], seen
    assert answered == ["mid-", "one-", "two-"]
