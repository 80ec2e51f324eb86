"""vlrl: multi-turn RL post-training for vision-language models, with testable correctness.

The package root re-exports nothing heavy: importing ``vlrl`` must stay cheap so the pytest
plugin and the checks load fast. Import torch-backed parts from their modules.
"""

__version__ = "0.1.0"
