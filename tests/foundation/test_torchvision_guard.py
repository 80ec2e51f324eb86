"""``import vlrl`` makes torchvision importable where its compiled ops cannot load (no site-packages edit).

A stand-in torchvision reproduces the failure exactly: no C++ ops (``extension._has_ops()`` False) and
an unconditional ``register_fake("torchvision::nms")`` in ``_meta_registrations``, as in the
torchvision 0.28 wheel on the CPU machines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FAKE = {
    "__init__.py": "from . import extension\nfrom . import _meta_registrations\n",
    "extension.py": "def _has_ops():\n    return False\n",
    "_meta_registrations.py": (
        "import torch\n\n"
        "@torch.library.register_fake('torchvision::nms')\n"
        "def meta_nms(dets, scores, iou_threshold):\n    return dets.new_empty(0, dtype=torch.long)\n\n"
        "@torch.library.register_fake('torchvision::qnms')\n"
        "def meta_qnms(dets, scores, iou_threshold):\n    return dets.new_empty(0, dtype=torch.long)\n"
    ),
}


def _run(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    pkg = tmp_path / "torchvision"
    pkg.mkdir(exist_ok=True)
    for name, text in FAKE.items():
        (pkg / name).write_text(text)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_without_the_guard_torchvision_fails_to_import(tmp_path):
    out = _run(tmp_path, "import torchvision")
    assert out.returncode != 0 and "operator torchvision::nms does not exist" in out.stderr


def test_import_vlrl_first_makes_torchvision_import(tmp_path):
    code = (
        "import vlrl, torch, torchvision; print(torchvision.__file__); print(torch.ops.torchvision.nms.default._schema)"
    )
    out = _run(tmp_path, code)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path) in out.stdout and "nms(Tensor dets, Tensor scores, float iou_threshold)" in out.stdout


def test_the_real_torchvision_imports_and_transforms_work():
    code = (
        "import vlrl, torch; from torchvision.transforms.v2 import functional as F; "
        "print(tuple(F.resize(torch.zeros(3, 8, 8), [4, 4]).shape))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "(3, 4, 4)", out.stderr
