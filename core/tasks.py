"""The HalluClean tasks and their aliases: one table, used by the loaders, the programs and the CLI."""

from __future__ import annotations

__all__ = ["HALLUCLEAN_TASKS", "TASK_ALIASES", "task_key", "canonical_task"]

HALLUCLEAN_TASKS: tuple[str, ...] = ("qa", "dialogue", "summarization", "mwp", "self_contradiction")

TASK_ALIASES: dict[str, str] = {
    "qa": "qa", "question_answering": "qa",
    "da": "dialogue", "dialogue": "dialogue", "dialog": "dialogue",
    "sum": "summarization", "summarization": "summarization", "summary": "summarization",
    "mwp": "mwp", "math": "mwp", "umwp": "mwp",
    "sc": "self_contradiction", "self_contradiction": "self_contradiction", "self-contradiction": "self_contradiction",
    "contradiction": "self_contradiction",
}


def task_key(task: str | None) -> str | None:
    """``"qa"``, ``"DA"``, ``"sum"``, ``"SC"``... -> one of :data:`HALLUCLEAN_TASKS`, or None when unknown."""
    key = str(task or "").strip().lower().replace(" ", "_")
    return TASK_ALIASES.get(key)


def canonical_task(task: str | None) -> str:
    """Like :func:`task_key`, but an unknown task raises ``ValueError`` naming the valid ones."""
    key = task_key(task)
    if key is None:
        raise ValueError(f"unknown HalluClean task {task!r}; choose one of: {', '.join(HALLUCLEAN_TASKS)}")
    return key
