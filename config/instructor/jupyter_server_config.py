"""`make lab-instructor`: chapter sources open as notebooks, read-only.

solutions/*.py are the chapters' only source, written by hand: a YAML header with comments,
keys in a chosen order, no jupytext metadata. JupyterLab marks a notebook changed as soon as
its kernel starts (kernelspec, language_info), and its autosave then had jupytext write the
file back in its own form: comments dropped, keys re-sorted, Unicode escaped, metadata added.
Here the contents manager reports these files as not writable, so JupyterLab neither autosaves
them nor saves them without asking, and refuses any save that reaches the server anyway.
`make lab-instructor EDIT=1` (COURSE_EDIT_SOURCES=1) allows saving them from the notebook view.
"""
import fnmatch
import os

from jupytext.async_contentsmanager import AsyncTextFileContentsManager
from tornado import web

PROTECTED = ("solutions/*.py",)


def _protected(path: str) -> bool:
    if os.environ.get("COURSE_EDIT_SOURCES") == "1":
        return False
    path = path.strip("/")
    return any(fnmatch.fnmatch(path, pattern) for pattern in PROTECTED)


class ChapterSourcesReadOnly(AsyncTextFileContentsManager):
    """Jupytext's contents manager, with the chapter sources read-only."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if _protected(path):
            model["writable"] = False
        return model

    async def save(self, model, path=""):
        if _protected(path):
            raise web.HTTPError(
                403, f"{path} is a chapter's only source and opens read-only here: saving it from the "
                     "notebook view would rewrite its header (YAML comments, key order, jupytext metadata). "
                     "Edit it in a text editor, or start `make lab-instructor EDIT=1` to save from here.")
        return await super().save(model, path)


c = get_config()  # noqa: F821 - provided by the config loader
c.ServerApp.contents_manager_class = ChapterSourcesReadOnly
