"""Front ends that turn requests from outside into engine calls.

Upstream counterpart: ``vllm/entrypoints/``. ``openai/`` is the OpenAI-compatible HTTP
server (``minivllm serve``); ``chat_utils`` renders chat conversations into prompts for
both the server and ``LLM.chat``.
"""
