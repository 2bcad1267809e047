"""`neuron-ssp serve`: the pipeline behind an OpenAI-compatible HTTP API and SageMaker's container contract.

Modules: schemas (request bodies and their rules), requests (a body -> one GenerationRequest), text (ids ->
text pieces with origin, stop strings), worker (the one generation thread and its bounded FIFO queue), streams
(answers from a job's events), responses (OpenAI bodies and SSE chunks), sagemaker (LMI/TGI bodies), metrics
(Prometheus), gate (request ids, body limit, API key), app (routes), server (uvicorn, SIGTERM drain).
The server knows only the pipeline's public API: it runs every request as a row of the engine's loop
(`Pipeline.row_request`, `Pipeline.row_loop`), whatever the engine.
"""
