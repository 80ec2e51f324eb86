"""vlrl: multi-turn RL post-training for vision-language models, with testable correctness.

The package root re-exports nothing heavy: importing ``vlrl`` must stay cheap so the pytest
plugin and the checks load fast. Import torch-backed parts from their modules.

Importing it installs :mod:`vlrl.torchvision_guard` (an import hook, standard library only), so
torchvision imports on the CPU machines, where its compiled ops cannot load.
"""

from vlrl.torchvision_guard import install as _install_torchvision_guard

__version__ = "0.1.0"

_install_torchvision_guard()
