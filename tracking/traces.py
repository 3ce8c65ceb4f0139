"""``--trace``: every LM call of a DSPy program recorded as an MLflow trace, credentials redacted.

    with lm_tracing(True, experiment="halluscope/spans/de", tracking_uri=None) as session:
        run_eval(program, examples)            # one trace per item: module -> predictor -> adapter -> LM spans
    session.count()                            # traces recorded

MLflow's DSPy autologging (``mlflow.dspy.autolog``, a DSPy callback) opens a span for each module, predictor,
adapter format/parse and LM call, with its inputs (the prompt messages) and outputs (the completion), so a user
can open an item in the UI (``halluscope ui`` -> the experiment -> Traces) and read every stage. Nothing is
pickled. Before a span is exported a span processor runs :func:`halluscope.core.redact.redact_obj` over its inputs,
outputs and attributes (API keys, tokens, ``user:pass@`` in URLs, the values of secret environment variables);
MLflow itself already drops ``api_key``/``api_base`` from the LM attributes.

Off by default: tracing costs time (see BENCHMARKS.md) and fills the store. Each trace is tagged with
``halluscope.session`` (one id per command) and ``halluscope.kind``, so one command's traces can be filtered.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Iterator

from halluscope.tracking.runs import open_client, get_experiment_id
from halluscope.core.redact import redact_obj

__all__ = ["TraceSession", "lm_tracing", "redact_span"]

logger = logging.getLogger(__name__)


def redact_span(span) -> None:
    """MLflow span processor: redact the span's inputs, outputs and string attributes in place."""
    if span.inputs is not None:
        span.set_inputs(redact_obj(span.inputs))
    if span.outputs is not None:
        span.set_outputs(redact_obj(span.outputs))
    for key, value in list((span.attributes or {}).items()):
        if key.startswith("mlflow.span") and key not in ("mlflow.spanInputs", "mlflow.spanOutputs"):
            continue  # MLflow's own bookkeeping (ids, types)
        cleaned = redact_obj(value)
        if cleaned != value:
            span.set_attribute(key, cleaned)


def _tagger(tags: dict[str, str]):
    """A span processor that tags the trace when its root span ends (before the trace is exported)."""
    from mlflow.tracing.trace_manager import InMemoryTraceManager

    def tag(span) -> None:
        if span.parent_id is not None:
            return
        with InMemoryTraceManager.get_instance().get_trace(span.trace_id) as trace:
            if trace is not None:
                trace.info.tags.update(tags)

    return tag


@dataclass
class TraceSession:
    """Where one command's traces went."""

    session: str
    experiment_id: str
    tracking_uri: str

    def count(self) -> int:
        """Traces recorded by this session so far."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.tracking_uri)
        return len(client.search_traces(locations=[self.experiment_id], max_results=10000,
                                        filter_string=f"tags.`halluscope.session` = '{self.session}'"))


@contextlib.contextmanager
def lm_tracing(enabled: bool, *, experiment: str, tracking_uri: str | None = None, kind: str = "evaluate",
               during_compile: bool = False) -> Iterator[TraceSession | None]:
    """Record MLflow traces of every DSPy module and LM call made inside the block (``enabled``), else nothing.

    ``during_compile`` also traces the calls an optimizer makes while compiling (``optimize --trace``).
    MLflow's tracing writes to the *global* tracking URI and experiment: both are set for the block and
    restored after it."""
    if not enabled:
        yield None
        return
    import dspy
    import mlflow  # heavy (about 2 s): only with --trace
    import mlflow.dspy
    from mlflow.dspy.callback import MlflowCallback
    from mlflow.tracking import _tracking_service

    client, uri = open_client(tracking_uri)
    exp_id = get_experiment_id(client, experiment, uri)
    session = TraceSession(session=uuid.uuid4().hex[:12], experiment_id=exp_id, tracking_uri=uri)
    tags = {"halluscope.session": session.session, "halluscope.kind": kind}

    old_uri = _tracking_service.utils._tracking_uri  # None when unset: restored as is, not as a resolved value
    old_exp = mlflow.tracking.fluent._active_experiment_id
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=exp_id)
    config = mlflow.tracing.configure(span_processors=[redact_span, _tagger(tags)])
    track_usage = dspy.settings.get("track_usage")
    mlflow.dspy.autolog(log_traces=True, log_traces_from_compile=during_compile, log_traces_from_eval=True,
                        silent=True)
    logger.info("tracing LM calls into %s (experiment %s, session %s)", uri, experiment, session.session)
    try:
        # autolog adds its callback to DSPy's global settings, which an enclosing dspy.context() hides: add it here
        callbacks = list(dspy.settings.get("callbacks") or [])
        if not any(isinstance(c, MlflowCallback) for c in callbacks):
            callbacks.append(MlflowCallback())
        with dspy.context(callbacks=callbacks):
            yield session
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)
        dspy.settings.configure(track_usage=track_usage)
        config.__exit__(None, None, None)
        try:
            mlflow.flush_trace_async_logging()
        except Exception as e:  # tracing never takes a run down
            logger.warning("flushing MLflow traces failed: %s", e)
        _tracking_service.utils._tracking_uri = old_uri
        mlflow.tracking.fluent._active_experiment_id = old_exp
