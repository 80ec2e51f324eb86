"""One checksum of a model's weights, for verifying weight syncs (trainer → engine)."""

from __future__ import annotations

import hashlib


def weights_checksum(named_parameters) -> str:
    """sha256 over every ``(name, tensor)``'s name and fp32 bytes, in name order."""
    h = hashlib.sha256()
    for name, p in sorted(named_parameters, key=lambda item: item[0]):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
