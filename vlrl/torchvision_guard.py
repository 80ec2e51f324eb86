"""Let ``import torchvision`` work where its compiled ops cannot load, without editing site-packages.

The CPU machines pair torch 2.13.0+cpu with torchvision 0.28.0 from PyPI (no ``+cpu`` build of it
resolves there), whose ``_C.so`` is CUDA-linked and fails to load. torchvision then skips its C++
ops — vlrl needs only its Python transforms, the image-processor backend transformers and vLLM use —
but ``torchvision/_meta_registrations.py`` still calls ``torch.library.register_fake`` for
``torchvision::nms`` / ``qnms`` unconditionally, which raises ``operator torchvision::nms does not
exist`` and aborts the import.

:func:`install` (run by ``import vlrl``) adds an import hook that, right before that module runs and
only when torchvision itself reports no ops, defines the two operator *schemas* (no kernels: calling
them still fails, as every torchvision C++ op does here), so the registrations succeed. Where the
ops load (CUDA hosts, a matching CPU wheel) it does nothing. Standard library only until torchvision
is imported: ``import vlrl`` stays cheap.
"""

from __future__ import annotations

import importlib.machinery
import sys

TARGET = "torchvision._meta_registrations"
SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY: list[object] = []  # the torch.library fragment must outlive the call, or its definitions go away


def define_missing_ops() -> list[str]:
    """Define the schemas of the ops ``_meta_registrations`` needs, if torchvision has no ops; returns those defined."""
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops():
        return []
    missing = [name for name in SCHEMAS if not _op_exists(torch, name)]
    if missing:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for name in missing:
            lib.define(SCHEMAS[name])
        _LIBRARY.append(lib)
    return missing


def _op_exists(torch, name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


class _Loader:  # duck-typed (importlib.abc costs ~7 ms to import)
    """torchvision's own loader for ``_meta_registrations``, with the missing schemas defined first."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        define_missing_ops()
        self.inner.exec_module(module)


class TorchvisionGuard:
    """A ``sys.meta_path`` finder that answers only for ``torchvision._meta_registrations``."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once). A torchvision imported before it is unaffected."""
    if not any(isinstance(f, TorchvisionGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionGuard())


SITECUSTOMIZE = (
    '"""Written by vlrl.torchvision_guard: vlrl\'s torchvision guard in every Python a CPU vLLM server starts."""\n'
    "from vlrl.torchvision_guard import install\n\ninstall()\n"
)


def guard_site(site) -> str:
    """Write a ``sitecustomize`` that installs the guard into the directory ``site`` (a ``pathlib.Path``, made if
    needed) and return it as a string, for ``PYTHONPATH``: the interpreters vLLM starts itself get the guard too."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return str(site)
