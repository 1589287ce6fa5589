"""The hot path's compiled modules (setup.py builds them with mypyc from their own .py files) are used
only while the build is newer than every one of their sources. mypyc compiles them as one group whose
modules call each other directly, so a single stale one would mix two versions of the code: if any
source was edited since the build, all of them are imported from source (slower, same behaviour) and
a warning says how to compile again. The build's time is that of its newest file: the group's library
(`haqueue/_hot_path__mypyc…`) holds the code, and a rebuild leaves a module's small stub untouched
when it has not changed. An installed wheel's are always used: its sources are not edited."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from types import ModuleType
from typing import Sequence

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
# Sources change only in a checkout (setup.py beside the package). An installed wheel's never do, and pip gives its
# files the install's times in no particular order: a source written after the library would look edited.
_CHECKOUT = os.path.exists(os.path.join(os.path.dirname(_PACKAGE), "setup.py"))


def _compiled_sources() -> dict[str, tuple[str, str]]:
    """Module name -> (its compiled file, its source) for every compiled module beside its source."""
    found: dict[str, tuple[str, str]] = {}
    for directory, _, files in os.walk(_PACKAGE):
        for name in files:
            if not name.endswith(_SUFFIXES):
                continue
            stem = name.split(".", 1)[0]
            source = os.path.join(directory, stem + ".py")
            if os.path.exists(source):
                relative = os.path.relpath(os.path.join(directory, stem), os.path.dirname(_PACKAGE))
                found[relative.replace(os.sep, ".")] = (os.path.join(directory, name), source)
    return found


class _SourceFirst(importlib.abc.MetaPathFinder):
    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        return importlib.util.spec_from_file_location(fullname, source) if source else None


def use_fresh_code() -> None:
    compiled = _compiled_sources() if _CHECKOUT else {}
    if not compiled:
        return
    groups = [os.path.join(_PACKAGE, name) for name in os.listdir(_PACKAGE)
              if "__mypyc" in name and name.endswith(_SUFFIXES)]
    built = max(os.path.getmtime(path) for path in groups + [binary for binary, _ in compiled.values()])
    stale = sorted(name for name, (_, source) in compiled.items() if os.path.getmtime(source) > built)
    if stale:
        sys.meta_path.insert(0, _SourceFirst({name: source for name, (_, source) in compiled.items()}))
        warnings.warn(f"haqueue: {', '.join(stale)} changed since the hot path was compiled: running it from "
                      f"source, slower; `make build` compiles it again", RuntimeWarning, stacklevel=2)


def hot_path_compiled() -> bool:
    """Whether the hot path runs compiled (for the broker's start-up line and the benchmarks)."""
    return (sys.modules[__name__.rpartition(".")[0] + ".broker.queue"].__file__ or "").endswith(_SUFFIXES)
