"""`tformer serve`: an HTTP server for a model directory, with dynamic batching.

    tformer serve runs/my-run --port 8000          # or a BERT / sentence-transformers directory

The stack is uvicorn (the ASGI server) with Starlette (routing, requests, responses), installed
by the optional extra ``pip install 'tformer[serve]'``. Why these two: they are the
most deployed Python ASGI pair (FastAPI is Starlette underneath), both are maintained by the
Encode team with frequent releases, uvicorn brings the pieces a model server needs (httptools
and uvloop when present, graceful SIGTERM drain, a multi-process supervisor sharing one socket),
and Starlette adds no per-request validation layer: the request bodies are checked once, by
hand, in ``schema`` (FastAPI's pydantic models would check them a second time and cost time on
every request for an API of four endpoints).

Modules, in the order a request meets them:

    config.py   ServeConfig: the command's settings, checked once
    server.py   binds the socket, runs uvicorn (one process or --workers N)
    app.py      the Starlette application; Service: read, check, queue, wait, answer
    routes.py   each endpoint's body and answer (OpenAI, TEI, predict, generate)
    schema.py   request fields, checked: errors that name the field
    batcher.py  dynamic batching: a bounded queue, batches packed by length
    models.py   what the directory holds, loaded; tokenization and one batch's run
    metrics.py  Prometheus text for /metrics
"""
