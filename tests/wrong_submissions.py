"""Plausible wrong answers, one per exercise: each must lose points when autograded.

``WRONG`` maps ``(chapter, exercise)`` to the source text of a wrong exercise cell. Each chapter keeps
its own in ``wrong_submissions_<chapter>.py`` beside this file; this module only gathers them.
"""

WRONG: dict[tuple[str, str], str] = {}


def _collect() -> None:
    """Gather every chapter's ``WRONG``, in chapter order."""
    import importlib
    from pathlib import Path

    for path in sorted(Path(__file__).parent.glob("wrong_submissions_ch*.py")):
        WRONG.update(importlib.import_module(path.stem).WRONG)


_collect()
