"""Chat conversations to prompts, through the tokenizer's chat template.

Upstream counterpart: ``vllm/entrypoints/chat_utils.py`` (``parse_chat_messages``,
``ChatTemplateResolutionError``) and ``vllm/renderers/hf.py``
(``safe_apply_chat_template``, ``resolve_chat_template``). A chat model is still a
next-token predictor: the template turns the list of ``{"role", "content"}`` messages
into the exact text it was trained on (role markers, separators), and ends with the
marker that makes the model answer as the assistant (``add_generation_prompt``).
Upstream also handles images, audio, tools and reasoning; minivllm has text only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ConversationMessage = dict[str, str]
"""One message after parsing: ``{"role": ..., "content": <text>}``."""


class ChatTemplateResolutionError(ValueError):
    """The model has no chat template and the request gave none (an HTTP 400)."""


def _message_text(content: Any, where: str) -> str:
    """Text of a message's ``content``: a string, None, or a list of ``text`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise ValueError(f"{where}.content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ValueError(
                f"{where}.content[{j}]: only text parts are supported, got type {kind!r}"
            )
        texts.append(str(part.get("text", "")))
    # Upstream's "string" content format joins text parts with a newline.
    return "\n".join(texts)


def parse_chat_messages(messages: Sequence[Any]) -> list[ConversationMessage]:
    """Normalize messages (dicts or pydantic objects) into role/content text dicts.

    Raises:
        ValueError: A message has no role or a non-text part; the message names it
            (``messages[2].content[0]: ...``).
    """
    conversation = []
    for i, message in enumerate(messages):
        if hasattr(message, "model_dump"):
            message = message.model_dump(exclude_none=True)
        where = f"messages[{i}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where} must be an object with a 'role' string")
        conversation.append(
            {"role": message["role"], "content": _message_text(message.get("content"), where)}
        )
    return conversation


def resolve_chat_template(tokenizer: Any, chat_template: str | None) -> str:
    """The template to use: the request's own, else the tokenizer's.

    Raises:
        ChatTemplateResolutionError: Neither exists (a base model without a template).
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ChatTemplateResolutionError(
            "this model's tokenizer has no chat template (tokenizer_config.json "
            "'chat_template' or chat_template.jinja), so chat requests cannot be rendered; "
            "pass 'chat_template' or use the completions API"
        )
    return template


def apply_hf_chat_template(
    tokenizer: Any,
    conversation: list[ConversationMessage],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """Render a conversation to prompt text with ``tokenizer.apply_chat_template``.

    Raises:
        ChatTemplateResolutionError: No template (see ``resolve_chat_template``).
        ValueError: The template failed to render (a Jinja error, or the template's own
            ``raise_exception`` on, say, roles out of order).
    """
    if tokenizer is None:
        raise ChatTemplateResolutionError("this model has no tokenizer, so it cannot chat")
    template = resolve_chat_template(tokenizer, chat_template)
    try:
        return tokenizer.apply_chat_template(
            conversation,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
    except Exception as exc:  # jinja2's TemplateError and friends
        raise ValueError(f"the chat template failed to render the messages: {exc}") from exc


def render_chat_prompt(
    tokenizer: Any,
    messages: Sequence[Any],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
) -> dict[str, Any]:
    """Messages to an engine prompt ``{"prompt": text, "prompt_token_ids": [...]}``.

    The text is tokenized without adding special tokens: a chat template writes the BOS
    and role tokens itself, and a second BOS would change the model's input (upstream
    tokenizes rendered chats the same way).
    """
    conversation = parse_chat_messages(messages)
    text = apply_hf_chat_template(tokenizer, conversation, chat_template, add_generation_prompt)
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    return {"prompt": text, "prompt_token_ids": token_ids}
