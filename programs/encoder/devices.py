"""Where the encoder runs: the names :func:`device_problem` accepts (``auto``, ``cpu``, ``cuda``, ``cuda:N``). No
torch here: the option check of ``-O device=...`` runs without the extra; :func:`~halluscope.programs.encoder.model.
pick_device` turns a name into a torch device."""

from __future__ import annotations

__all__ = ["device_problem"]


def device_problem(device, options=None) -> str | None:
    """Why ``device`` is not one the encoder runs on (``auto``, ``cpu``, ``cuda``, ``cuda:N``), or None."""
    name = str(device or "auto").strip().lower()
    if name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit()):
        return None
    return f"device must be auto, cpu, cuda or cuda:N, not {device!r}"
