"""A scripted LM for deterministic tests of programs and optimizers.

:class:`ScriptedEngine` is a ``dspy.LM`` engine (DSPy 3.4's ``engine=`` protocol). For every call it
reads which output fields the adapter asks for and the input field values it sent, asks a *responder*
for the outputs, and answers in the adapter's own format (JSON for ``JSONAdapter``, ``[[ ## field ## ]]``
sections for ``ChatAdapter``). It is thread-safe and counts its calls, so it can drive ``dspy.Evaluate``
and optimizers such as MIPROv2 as well as single modules.

A responder is either a callable ``responder(call: Call) -> dict`` or a dict ``{output_field: value}``
where a value may itself be a callable ``value(call) -> value``. Outputs it does not name get a
type-appropriate default ("" for text, [] for lists, ...), so scripts stay short.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import dspy
from dspy.lm15 import Message, Response, Usage

__all__ = ["Call", "ScriptedEngine", "scripted_lm"]

_OUT_BLOCK = re.compile(r"Your output fields are:\n(.*?)\n(?:All interactions|\n)", re.S)
_FIELD_LINE = re.compile(r"^\d+\. `(\w+)` \(([^)]*)\)", re.M)
_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with |\Z)", re.S)


@dataclass
class Call:
    """One LM call as the scripted engine saw it."""

    outputs: dict[str, str]  # output field name -> type as the adapter described it
    inputs: dict[str, str]  # input field name -> value (text) from the last user message
    system: str
    user: str
    temperature: float | None = None
    seed: int | None = None
    chat_format: bool = False

    def has(self, text: str) -> bool:
        """Whether ``text`` occurs anywhere in the prompt (system or last user message)."""
        return text in self.system or text in self.user


def _default(type_desc: str) -> Any:
    t = type_desc.lower()
    if t.startswith("list"):
        return []
    if t.startswith("dict"):
        return {}
    if t.startswith("bool"):
        return False
    if t.startswith("float") or t.startswith("int"):
        return 0
    return ""


@dataclass
class ScriptedEngine:
    responder: Callable[[Call], dict] | dict
    calls: list[Call] = field(default_factory=list)
    supports_response_schema = False
    supported_params = frozenset({"temperature", "max_tokens", "stop", "seed"})

    def __post_init__(self):
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(
            p.text for p in (request.system or []))
        user = request.messages[-1].text or "" if request.messages else ""
        block = _OUT_BLOCK.search(system)
        outputs = dict(_FIELD_LINE.findall(block.group(1))) if block else {}
        inputs = {k: v.strip() for k, v in _SECTION.findall(user) if k not in outputs}
        call = Call(outputs, inputs, system, user, request.config.temperature, request.config.seed,
                    chat_format="[[ ## completed ## ]]" in system)
        with self._lock:
            self.calls.append(call)
        if callable(self.responder):
            values = self.responder(call)
        else:
            values = {k: (v(call) if callable(v) else v) for k, v in self.responder.items()}
        values = {k: values.get(k, _default(t)) for k, t in outputs.items()} if outputs else dict(values)
        text = _render(values, call.chat_format)
        return Response(id=None, model="scripted", message=Message.assistant(text), finish_reason="stop",
                        usage=Usage(input_tokens=len(system + user) // 4, output_tokens=len(text) // 4,
                                    total_tokens=(len(system + user) + len(text)) // 4))

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def _render(values: dict, chat: bool) -> str:
    def dump(v):
        if hasattr(v, "model_dump"):
            return v.model_dump()
        if isinstance(v, list):
            return [dump(x) for x in v]
        return v

    if not chat:
        return json.dumps({k: dump(v) for k, v in values.items()}, ensure_ascii=False)
    parts = []
    for k, v in values.items():
        v = dump(v)
        parts.append(f"[[ ## {k} ## ]]\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}")
    parts.append("[[ ## completed ## ]]")
    return "\n\n".join(parts)


def scripted_lm(responder, model: str = "scripted/test") -> dspy.LM:
    """A ``dspy.LM`` (never cached) answering through :class:`ScriptedEngine`; ``lm.engine.calls`` logs calls."""
    return dspy.LM(model, engine=ScriptedEngine(responder), cache=False)
