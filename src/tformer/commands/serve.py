"""`tformer serve MODEL_DIR_OR_RUN`: answer HTTP requests with a model, batching them.

Endpoints by what the directory holds: embeddings (a BERT-format / sentence-transformers
directory, or an embedding run): POST /v1/embeddings (OpenAI) and /embed (TEI); a
classification run: POST /predict; a seq2seq run: POST /generate; and GET /health, /info,
/metrics. Needs the `serve` extra: pip install 'tformer[serve]'. See tformer.serve.
"""

from __future__ import annotations

import argparse

from tformer.commands._inputs import add_device
from tformer.serve.config import DTYPES

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
                        help="most inputs in one request (default 256)")
    parser.add_argument("--no-truncate", dest="truncate", action="store_false",
                        help="refuse (413) inputs over --max-input-tokens instead of cutting them "
                        "(a request's truncate field decides for itself)")
    parser.add_argument("--name", default=None,
                        help="the model name in answers and /info (default: the directory's name)")


def run(args: argparse.Namespace) -> int:
    from tformer.commands._inputs import device_of
    from tformer.nn.precision import resolve_precision
    from tformer.serve.config import ServeConfig
    from tformer.serve.server import serve

    # "auto" is decided once, here, so that every worker process runs the same device and precision.
    device = device_of(args)
    config = ServeConfig(
        model=args.model, host=args.host, port=args.port, dtype=resolve_precision(args.dtype, device)[0],
        device=str(device), threads=args.threads,
        workers=args.workers, max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms,
        max_input_tokens=args.max_input_tokens, max_queue=args.max_queue,
        max_client_batch=args.max_client_batch, truncate=args.truncate, name=args.name,
    )
    return serve(config)
