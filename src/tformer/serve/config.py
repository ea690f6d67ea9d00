"""The server's settings: one frozen dataclass, checked once, passed to every worker as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass

from tformer.nn.devices import check_spec
from tformer.nn.kernels.machine import check_threads

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
    device: str = "auto"  # tformer.nn.devices; every worker runs its model there
    threads: int | None = None  # all of them, shared by the workers
    workers: int = 1
    max_batch_tokens: int = 16384
    max_wait_ms: float = 0.0
    max_input_tokens: int | None = None  # the model's maximum length
    max_queue: int = 1024
    max_client_batch: int = 256
    truncate: bool = True
    name: str | None = None  # the model name in answers; default: the directory's name
    tokenization_workers: int = 2
    # The open network: timeouts (seconds), a bound on connections, the drain on SIGTERM.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: int = 5
    max_connections: int = 512
    max_connections_per_client: int | None = None  # one address's share; default a quarter
    grace_period: float = 20.0
    allowed_hosts: tuple[str, ...] = ()  # beside the bind address and localhost's names; "*": any
    cors_origins: tuple[str, ...] = ()  # none: no CORS headers (browsers refuse other origins)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_spec(self.device, "--device")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port: expected 0..65535 (0: any free port), got {self.port}")
        # JSON (a worker's settings) gives lists.
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        positive = {"--workers": self.workers, "--max-batch-tokens": self.max_batch_tokens,
                    "--max-queue": self.max_queue, "--max-client-batch": self.max_client_batch,
                    "--threads": self.threads, "--max-input-tokens": self.max_input_tokens,
                    "--tokenization-workers": self.tokenization_workers,
                    "--header-timeout": self.header_timeout, "--body-timeout": self.body_timeout,
                    "--keep-alive-timeout": self.keep_alive_timeout,
                    "--max-connections": self.max_connections,
                    "--max-connections-per-client": self.max_connections_per_client}
        for flag, value in positive.items():
            if value is not None and not value > 0:
                raise ValueError(f"{flag}: expected a positive number, got {value}")
        check_threads(self.threads)
        if self.max_wait_ms < 0:
            raise ValueError(f"--max-wait-ms: expected >= 0, got {self.max_wait_ms}")
        if self.grace_period < 0:
            raise ValueError(f"--grace-period: expected >= 0 seconds, got {self.grace_period}")
        # Limits that contradict each other: a request the server could never answer.
        if self.max_input_tokens is not None and self.max_input_tokens > self.max_batch_tokens:
            raise ValueError(f"--max-input-tokens: expected at most --max-batch-tokens "
                             f"({self.max_batch_tokens}), got {self.max_input_tokens}")
        if self.connections_per_client > self.max_connections:
            raise ValueError(f"--max-connections-per-client: expected at most --max-connections "
                             f"({self.max_connections}), got {self.max_connections_per_client}")
        if self.max_client_batch > self.max_queue:
            raise ValueError(f"--max-client-batch: expected at most --max-queue ({self.max_queue}): a "
                             f"request that large could never be queued, got {self.max_client_batch}")
        for host in self.allowed_hosts:
            if not (host == "*" or re.fullmatch(r"(\*\.)?[A-Za-z0-9.:\[\]-]+", host)):
                raise ValueError("--allowed-hosts: expected host names (example.com, *.example.com, "
                                 f"10.0.0.5 or *), got {host!r}")
        for origin in self.cors_origins:
            if not (origin == "*" or re.fullmatch(r"https?://[^/\s]+", origin)):
                raise ValueError(f"--cors-origin: expected an origin such as https://app.example.com (no "
                                 f"path) or *, got {origin!r}")

    def decide(self) -> ServeConfig:
        """This config with "auto" decided for this machine: the device, then the precision that
        runs there (tformer.nn.devices, tformer.nn.precision). `tformer serve` decides it once, where
        it starts, so that every worker runs the same device and precision (each deciding "auto"
        on its own could measure differently); /info names what runs."""
        from tformer.nn.devices import resolve_device
        from tformer.nn.precision import resolve_precision

        device = resolve_device(self.device, "--device")
        return dataclasses.replace(self, device=str(device), dtype=resolve_precision(self.dtype, device)[0])

    @property
    def decided(self) -> bool:
        return "auto" not in (self.dtype, self.device)

    @property
    def threads_per_worker(self) -> int:
        """Each worker's share of the threads (at least one)."""
        total = self.threads or os.cpu_count() or 1
        return max(1, total // self.workers)

    @property
    def connections_per_client(self) -> int:
        """One client address's share of --max-connections (default a quarter of it)."""
        return self.max_connections_per_client or max(1, self.max_connections // 4)

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
