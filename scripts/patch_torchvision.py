"""Make ``import torchvision`` work where its compiled ops cannot load (idempotent).

torchvision's ``_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` / ``qnms``
unconditionally; without the C++ ops that raises ``operator torchvision::nms does not exist``.
We only need torchvision's Python transforms (the image-processor backend), so the two
registrations are skipped when the ops are missing.
"""

import importlib.util
import pathlib
import re
import sys

spec = importlib.util.find_spec("torchvision")
if spec is None or spec.origin is None:
    sys.exit("torchvision is not installed")
path = pathlib.Path(spec.origin).parent / "_meta_registrations.py"
text = path.read_text()
pattern = re.compile(r'^@torch\.library\.register_fake\(("torchvision::[a-z_]*")\)$', re.M)
patched = pattern.sub(r"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))",
                      text)
if patched != text:
    path.write_text(patched)
    print(f"patched {path}")
