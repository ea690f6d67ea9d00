"""`tformer serve MODEL_DIR_OR_RUN`: answer HTTP requests with a model, batching them.

The protocols real clients speak, by what the directory holds: embeddings (a BERT-format /
sentence-transformers directory, or an embedding run): OpenAI's POST /v1/embeddings and TEI's
/embed, / and /tokenize; a classification run: TEI's /predict and /; a seq2seq run: TGI's
/generate and /, OpenAI's /v1/completions; and GET /health, /info, /metrics, /v1/models.
Needs the `serve` extra: pip install 'tformer[serve]'. See docs/serving.md and tformer.serve.
"""

from __future__ import annotations

import argparse
import os

from tformer.commands._inputs import add_device
from tformer.serve.config import DTYPES

# Packed batches give the encoder a new row count almost every batch, and oneDNN (and ideep,
# torch's layer over it) keep compiled kernels per shape, up to 1024 of each by default. Measured
# (all-MiniLM-L6-v2, 64 clients, 2 threads): RSS grew for 3 minutes, 388 -> 923 MiB, before it
# levelled; with 16 kept it was 640 MiB after a minute and 640-705 MiB to the end of a 10-minute
# soak, texts/s the same within noise (docs/serving.md, Memory).
KERNEL_CACHE = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16", "LRU_CACHE_CAPACITY": "16"}

HELP = "serve a model over HTTP (embeddings, classification, generation) with dynamic batching"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL_DIR_OR_RUN",
                        help="a BERT-format / sentence-transformers directory, "
                        "or a run of `tformer train --data`")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="inference precision, as for `tformer embed` (default auto: bf16 where "
                        "the device computes it natively and it is measured faster, else fp32)")
    add_device(parser)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in all, shared among the workers (default: every core)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes behind the one port, each with its share of --threads (default 1)")
    parser.add_argument("--max-batch-tokens", type=int, default=16384,
                        help="most real tokens in one model batch (default 16384)")
    parser.add_argument("--max-wait-ms", type=float, default=0.0,
                        help="how long the first input of a batch waits for others to join it "
                        "(default 0: a batch starts as soon as the model is free, with every input "
                        "that arrived while it was busy)")
    parser.add_argument("--max-input-tokens", type=int, default=None,
                        help="most tokens of one input (default: the model's maximum length)")
    parser.add_argument("--max-queue", type=int, default=1024,
                        help="most inputs waiting or running; more are refused with 503 (default 1024)")
    parser.add_argument("--max-client-batch", type=int, default=256,
                        help="most inputs in one request (default 256); a body may hold this many times "
                        "--max-input-tokens commas outside strings (values), plus 64 (413 past that)")
    parser.add_argument("--no-truncate", dest="truncate", action="store_false",
                        help="refuse (413) inputs over --max-input-tokens (or read only in part: no cut "
                        "in sight by 256 characters a token) instead of cutting them "
                        "(a request's truncate field decides for itself)")
    parser.add_argument("--name", default=None,
                        help="the model name in answers and /info (default: the directory's name)")
    parser.add_argument("--tokenization-workers", type=int, default=2,
                        help="threads that tokenize requests, off the event loop (default 2); as many "
                        "again tokenize bodies over 64 KiB, so that large requests never hold up small ones")
    net = parser.add_argument_group("the open network")
    net.add_argument("--allowed-hosts", nargs="+", default=[], metavar="HOST",
                     help="Host header names accepted beside --host and localhost's names "
                     "(example.com, *.example.com, or * for any); others get 400")
    net.add_argument("--cors-origin", dest="cors_origins", action="append", default=[], metavar="ORIGIN",
                     help="an origin whose web pages may call the server (repeatable; default none: "
                     "no CORS headers)")
    net.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds a request's headers may take to arrive (default 10): then 408, closed")
    net.add_argument("--body-timeout", type=float, default=30.0,
                     help="seconds a request's body may take after its headers, and an answer the "
                     "client leaves unread (default 30)")
    net.add_argument("--keep-alive-timeout", type=int, default=5,
                     help="seconds an idle connection stays open between requests (default 5)")
    net.add_argument("--max-connections", type=int, default=512,
                     help="open connections per worker; more get 503 and are closed (default 512)")
    net.add_argument("--max-connections-per-client", type=int, default=None,
                     help="open connections from one client address, per worker; more get 503 and are "
                     "closed (default a quarter of --max-connections; behind a proxy, which is one "
                     "address for all its clients, set it to --max-connections)")
    net.add_argument("--grace-period", type=float, default=20.0,
                     help="on SIGTERM, seconds the requests in the model get to finish (default 20); "
                     "then they get 503")


def run(args: argparse.Namespace) -> int:
    for name, value in KERNEL_CACHE.items():  # before this process's first oneDNN call; a user's own stays
        os.environ.setdefault(name, value)
    from tformer.serve.config import ServeConfig
    from tformer.serve.server import serve

    config = ServeConfig(
        model=args.model, host=args.host, port=args.port, dtype=args.dtype, device=args.device,
        threads=args.threads,
        workers=args.workers, max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms,
        max_input_tokens=args.max_input_tokens, max_queue=args.max_queue,
        max_client_batch=args.max_client_batch, truncate=args.truncate, name=args.name,
        tokenization_workers=args.tokenization_workers, allowed_hosts=tuple(args.allowed_hosts),
        cors_origins=tuple(args.cors_origins), header_timeout=args.header_timeout,
        body_timeout=args.body_timeout, keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client, grace_period=args.grace_period,
    )
    # "auto" is decided once, here, so that every worker process runs the same device and precision.
    return serve(config.decide())
