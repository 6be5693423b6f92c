"""The OpenAI-compatible API server: ``minivllm serve``.

Upstream counterpart: ``vllm/entrypoints/openai/``. ``protocol`` holds the request and
response objects (``engine_protocol`` what they share); one ``serving_*`` module per
family of routes turns a parsed request into ``AsyncLLM.generate`` calls and its outputs
back into OpenAI's shapes; ``api_server`` wires the routes, errors and authentication
into a FastAPI app.
"""
