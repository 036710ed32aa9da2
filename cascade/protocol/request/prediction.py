"""Predicted Outputs, as OpenAI's API states them: the client sends the text it expects back
(``prediction: {"type": "content", "content": "..." | [{"type": "text", "text": "..."}]}``),
the server drafts from it (``cascade.core.proposers.prediction``), and the usage reports how
much of it the completion kept (``completion_tokens_details``).

The output never depends on the prediction (it is a draft: verified like any other); only
speed and the usage counts do. Refused (HTTP 400, gRPC INVALID_ARGUMENT, naming the field)
where OpenAI refuses it: with n > 1, log-probabilities, positive presence or frequency
penalties, and tools; and with a drafting method that does not draft from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from cascade.protocol.methods import PREDICTION_METHODS
from cascade.protocol.limits import RequestInvalid

if TYPE_CHECKING:  # its module imports this one (through cascade.protocol.request.options)
    from cascade.protocol.request.mapping import GenerationRequest as Request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Prediction(_Strict):
    """OpenAI's ``prediction`` object (static content, its only type)."""

    type: Literal["content"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


def with_prediction(request: Request, prediction: Prediction | None,
                    tokenize: Callable[[str], list[int]], max_tokens: int,
                    unsupported: Sequence[tuple[str, bool]] = ()) -> Request:
    """The request drafting from ``prediction`` (tokenized; at most ``max_tokens`` tokens, the
    model's context); ``unsupported``: (field, is set) pairs a prediction cannot go with
    besides the penalties. RequestInvalid names what to change."""
    if prediction is None:
        return request
    sampling = request.sampling
    refused = [*unsupported, ("presence_penalty", sampling.presence_penalty > 0),
               ("frequency_penalty", sampling.frequency_penalty > 0)]
    for field, is_set in refused:
        if is_set:
            raise RequestInvalid(f"Invalid value for 'prediction': predicted outputs cannot be "
                                 f"used with '{field}' (as in OpenAI's API); leave one of them "
                                 f"out.", "prediction")
    if request.draft.method not in PREDICTION_METHODS:
        raise RequestInvalid(f"Invalid value for 'draft_method': a prediction is drafted from "
                             f"by {' or '.join(sorted(PREDICTION_METHODS))} (the default), not "
                             f"'{request.draft.method}'.", "draft_method")
    tokens = tuple(tokenize(prediction.text))
    if len(tokens) > max_tokens:
        raise RequestInvalid(f"Invalid value for 'prediction': {len(tokens)} tokens, longer "
                             f"than the model's context ({max_tokens}); send a shorter one.",
                             "prediction")
    return replace(request, draft=replace(request.draft, prediction=tokens))


def shared_runs(prediction: Sequence[int], completion: Sequence[int]) -> list:
    """The runs of tokens the completion shares with the prediction, in order (the longest
    matching blocks, as a diff finds them): ``difflib.Match(a, b, size)``, ``a`` in the
    prediction, ``b`` in the completion."""
    matcher = SequenceMatcher(None, list(prediction), list(completion), autojunk=False)
    return matcher.get_matching_blocks()


def prediction_usage(prediction: Sequence[int], completion: Sequence[int]) -> dict[str, int]:
    """OpenAI's ``completion_tokens_details`` counts: the prediction's tokens that appear in
    the completion (``shared_runs``), and the rest."""
    accepted = sum(block.size for block in shared_runs(prediction, completion))
    return {"accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": len(prediction) - accepted}
