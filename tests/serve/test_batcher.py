"""The batcher alone (no server, no model): batches packed by tokens in fair order (a small
request is not held up by a big one), keyed settings kept apart, cancelled jobs skipped and
their places freed, a bounded queue."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tformer.serve.batcher import Batcher, QueueFull
from tformer.serve.metrics import Metrics
from tformer.serve.models import Item


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


def test_a_small_request_is_not_held_up_by_a_big_one_already_running():
    """A one-input request that arrives while a 12-input request's first batch runs goes into
    the next batch, not after all of the big request's (arrival order put it last)."""
    seen: list[list[str]] = []
    small_queued = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        batcher = Batcher(lambda payloads, key: seen.append(list(payloads)) or payloads, 8, max_wait_ms=0,
                          max_queue=100, metrics=Metrics())
        big = batcher.submit([Item(2, 2, f"big{i}") for i in range(12)])
        small: list[asyncio.Future] = []

        def submit_small():
            small.extend(batcher.submit([Item(1, 1, "small")]))
            small_queued.set()

        def run(payloads, key):
            if not seen:  # the first batch is in the model: the small request arrives now
                loop.call_soon_threadsafe(submit_small)
                assert small_queued.wait(10)
            seen.append(list(payloads))
            return payloads

        batcher.run = run
        batcher.start()
        await asyncio.gather(*big)
        await asyncio.gather(*small)
        await batcher.stop()

    asyncio.run(main())
    assert seen[0] == ["big0", "big1", "big2", "big3"]
    assert "small" in seen[1] and len(seen) == 4, seen


def test_different_settings_never_share_a_batch():
    seen, _, _ = _run_batches([([1], "greedy"), ([1], "beam"), ([2], "greedy")])
    assert seen == [(["text2", "text1"], "greedy"), (["text1"], "beam")]


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
