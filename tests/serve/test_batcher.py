"""The batcher alone (no server, no model): batches packed by tokens in arrival order, keyed
settings kept apart, cancelled jobs skipped and their places freed, a bounded queue."""

from __future__ import annotations

import asyncio

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


def test_batches_fill_the_token_budget_in_arrival_order_longest_first():
    seen, results, depth = _run_batches([([3, 5], None), ([4], None), ([2, 9], None)])
    assert [b for b, _ in seen] == [["text5", "text3"], ["text4", "text2"], ["text9"]]
    assert results == ["text3", "text5", "text4", "text2", "text9"] and depth == 0


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
