"""The grader's side of the source policy: each chapter's policy and the refusals of a submission.

The rules themselves are ``coursekit/source_policy.py`` (students have them too: their visible tests read their
exercise cells against the same rules); a chapter declares what it adds or forbids as ``SOURCE_POLICY`` in
``grader/hidden/<chapter>.py``, and the release writes that policy into the notebook's metadata.
"""
from __future__ import annotations

import importlib

from coursekit.source_policy import *  # noqa: F401,F403 - the rules, under the grader's name
from coursekit.source_policy import (DEFAULT_POLICY, SourcePolicy, _Checker, policy_to_dict,  # noqa: F401
                                     refusals_under)


def policy_for(chapter: str) -> SourcePolicy:
    """A chapter's ``SOURCE_POLICY`` (``grader/hidden/<chapter>.py``), or the default one."""
    name = f"grader.hidden.{chapter}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the module exists but one of its own imports fails: not a chapter without a policy
            raise
        return DEFAULT_POLICY
    policy = getattr(module, "SOURCE_POLICY", DEFAULT_POLICY)
    return policy if isinstance(policy, SourcePolicy) else DEFAULT_POLICY


def refusals(chapter: str, setup, sources: dict[str, str | None]) -> dict[str, str]:
    """Exercise -> reason, for each exercise cell of a submission that breaches its chapter's policy."""
    return refusals_under(policy_for(chapter), setup, sources)
