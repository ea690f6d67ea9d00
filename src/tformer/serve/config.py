"""The server's settings: one frozen dataclass, checked once, passed to every worker as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from tformer.devices import check_spec

# Workers started by uvicorn (spawned processes) read their settings from here.
ENV = "TFORMER_SERVE_CONFIG"
DTYPES = ("auto", "fp32", "bf16", "int8")  # tformer.nn.precision.CHOICES (this module stays light)


@dataclass(frozen=True)
class ServeConfig:
    """What `tformer serve` was told; see `tformer serve --help` for each field."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    device: str = "auto"  # tformer.devices; every worker runs its model there
    threads: int | None = None  # all of them, shared by the workers
    workers: int = 1
    max_batch_tokens: int = 16384
    max_wait_ms: float = 0.0
    max_input_tokens: int | None = None  # the model's maximum length
    max_queue: int = 1024
    max_client_batch: int = 256
    truncate: bool = True
    name: str | None = None  # the model name in answers; default: the directory's name

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_spec(self.device, "--device")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port: expected 0..65535 (0: any free port), got {self.port}")
        positive = {"--workers": self.workers, "--max-batch-tokens": self.max_batch_tokens,
                    "--max-queue": self.max_queue, "--max-client-batch": self.max_client_batch,
                    "--threads": self.threads, "--max-input-tokens": self.max_input_tokens}
        for flag, value in positive.items():
            if value is not None and value < 1:
                raise ValueError(f"{flag}: expected a positive number, got {value}")
        if self.max_wait_ms < 0:
            raise ValueError(f"--max-wait-ms: expected >= 0, got {self.max_wait_ms}")
        if self.max_input_tokens is not None and self.max_input_tokens > self.max_batch_tokens:
            raise ValueError(f"--max-input-tokens: expected at most --max-batch-tokens "
                             f"({self.max_batch_tokens}), got {self.max_input_tokens}")

    @property
    def threads_per_worker(self) -> int:
        """Each worker's share of the threads (at least one)."""
        total = self.threads or os.cpu_count() or 1
        return max(1, total // self.workers)

    @property
    def model_name(self) -> str:
        return self.name or os.path.basename(os.path.normpath(self.model))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> ServeConfig:
        raw = os.environ.get(ENV)
        if raw is None:
            raise ValueError(f"{ENV}: expected the server's settings as JSON, got nothing")
        return cls(**json.loads(raw))
