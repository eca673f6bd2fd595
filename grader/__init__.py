"""Autograding for the course: release, sandboxed autograde, self-check.

Run as ``python -m grader {release,autograde,selfcheck}`` from the repository root.
This package holds the hidden tests; it is never part of what students install.
"""
