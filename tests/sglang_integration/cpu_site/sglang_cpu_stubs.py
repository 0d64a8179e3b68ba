"""Let SGLang's Python modules import on a machine without a GPU (tests only).

SGLang's linear layers and registries are plain Python, but importing them pulls in
``torchvision`` (through SGLang's multimodal configs). PyPI ships only CUDA builds of torchvision,
whose native library cannot load next to the CPU build of torch that the tests use. When no
torchvision is installed, :func:`install` puts a placeholder package in its place: importing it
and any submodule works, every attribute is a placeholder, and calling one raises. Nothing the
W12 tests exercise calls into torchvision.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

STUBBED = ("torchvision",)


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")

    def __getitem__(self, key: object) -> _Placeholder:
        return self

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is not available in the CPU tests")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _StubFinder:
    """Import hook that answers for a stubbed package and all its submodules."""

    def find_spec(self, name: str, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__version__ = "0.0"  # transformers parses the version of what it finds


def install() -> None:
    """Stub torchvision unless a real one is installed (idempotent)."""
    if any(isinstance(finder, _StubFinder) for finder in sys.meta_path):
        return
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _StubFinder())


def uninstall() -> None:
    """Remove the stub and the placeholder modules, so later tests see no torchvision."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _StubFinder)]
    for name in [n for n, m in sys.modules.items() if isinstance(m, _StubModule)]:
        del sys.modules[name]
