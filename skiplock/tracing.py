"""Optional OpenTelemetry: a span per task, its trace carried from the producer in the payload.

Through opentelemetry-api when it is installed, nothing when it is not (skiplock depends on no
part of OpenTelemetry). The producer's side: with_trace(payload) returns the payload with the
current trace context under the reserved key "_trace" (W3C traceparent/tracestate, as the
configured propagator writes them) when a span is recording; the worker's side: task_span(task)
opens a span "skiplock.task <stage>" (kind CONSUMER) whose parent is that context, with the
attributes skiplock.stage, skiplock.task_id, skiplock.attempt, from the handler's start to the
finish, fail or release; an exception the handler raises is recorded on it (status error). The key
"_trace" stays in the payload the handler sees; a payload that is an array carries none.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

TRACE_KEY = "_trace"

try:  # pragma: no cover - which branch runs depends on the environment
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    _tracer = trace.get_tracer("skiplock")
except ImportError:  # opentelemetry-api is not installed: no spans, no context
    trace = None  # type: ignore[assignment, unused-ignore]


def with_trace(payload: Any) -> Any:
    """payload (a dict) with the current trace context under "_trace"; unchanged without a context
    to carry (no OpenTelemetry, no span, an array payload)."""
    if trace is None or not isinstance(payload, dict):
        return payload
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {**payload, TRACE_KEY: carrier} if carrier else payload


def _ignore(error: BaseException) -> None:
    pass


@contextlib.contextmanager
def task_span(task: Any) -> Iterator[Callable[[BaseException], None]]:
    """A span around one task, from its take to its end, child of the context its payload
    carries; it yields a function that records a handler's exception on the span."""
    if trace is None:
        yield _ignore
        return
    carrier = task.payload.get(TRACE_KEY) if isinstance(task.payload, dict) else None
    parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
    with _tracer.start_as_current_span(f"skiplock.task {task.stage}", context=parent, kind=SpanKind.CONSUMER,
                                       attributes={"skiplock.stage": task.stage, "skiplock.task_id": task.id,
                                                   "skiplock.attempt": task.attempt},
                                       record_exception=True, set_status_on_exception=True) as span:
        def failed(error: BaseException) -> None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        yield failed
