"""halluscope: find and fix hallucinations in LLM answers, as DSPy programs that all speak character spans."""

from halluscope.contract import Detection, Span, Unit, to_prediction

__version__ = "0.1.0"

__all__ = ["Detection", "Span", "Unit", "to_prediction", "__version__"]
