"""The served model names: ``GET /v1/models`` and the ``model`` field check.

Upstream counterpart: ``vllm/entrypoints/openai/models/serving.py``
(``OpenAIServingModels``). A server runs one model, known by one or more names
(``--served-model-name``, else the model path); a request naming any other model gets
a 404, as OpenAI answers for a model that does not exist. Upstream also serves LoRA
adapters under their own names; minivllm has none.
"""

from __future__ import annotations

from http import HTTPStatus

from minivllm.entrypoints.openai.protocol import (
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
)


class OpenAIServingModels:
    """The names the server answers to.

    Args:
        served_model_names: The first is the name responses carry.
        model_path: Where the weights came from (the cards' ``root``).
        max_model_len: Shown in each card.
    """

    def __init__(self, served_model_names: list[str], model_path: str, max_model_len: int):
        if not served_model_names:
            raise ValueError("served_model_names must name at least one model")
        self.served_model_names = list(served_model_names)
        self.model_path = model_path
        self.max_model_len = max_model_len

    def model_name(self) -> str:
        """The name every response's ``model`` field carries."""
        return self.served_model_names[0]

    def is_base_model(self, model_name: str | None) -> bool:
        """Whether a request's ``model`` field names this server's model (omitted is fine)."""
        return not model_name or model_name in self.served_model_names

    async def check_model(self, model_name: str | None) -> ErrorResponse | None:
        """None when the model is served, else the 404 error to return."""
        if self.is_base_model(model_name):
            return None
        return ErrorResponse(
            error=ErrorInfo(
                message=f"The model `{model_name}` does not exist; this server serves "
                f"{', '.join(repr(n) for n in self.served_model_names)}.",
                type="NotFoundError",
                param="model",
                code=int(HTTPStatus.NOT_FOUND),
            )
        )

    async def show_available_models(self) -> ModelList:
        """The body of ``GET /v1/models``: one card per served name."""
        return ModelList(
            data=[
                ModelCard(id=name, root=self.model_path, max_model_len=self.max_model_len)
                for name in self.served_model_names
            ]
        )
