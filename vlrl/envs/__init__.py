"""vlrl environments: the contract, the registry, and the built-in envs.

Public API::

    from vlrl.envs import make_env, env_from_row, register_env, registered_envs, StepResult, Env
    from vlrl.envs import register_expert, expert_for   # SFT experts, each beside its env

Built-ins: ``maze2d/easy``, ``maze2d/hard``, ``color_square``, ``geometry``, ``gym/FrozenLake-v1``,
``gym/CliffWalking-v1``, ``gym/Taxi-v4``. Importing this package pulls in numpy and Pillow only
(no torch, no transformers; gymnasium and sympy load when an env that needs them is made).
"""

from vlrl.envs.contract import PLACEHOLDER_PROMPT, Env, EnvError, EpisodeDoneError, Message, StepResult, is_placeholder
from vlrl.envs.registry import (
    env_factory,
    env_from_row,
    expert_for,
    make_env,
    register_env,
    register_expert,
    registered_envs,
    registered_experts,
    unregister_env,
)

__all__ = [
    "PLACEHOLDER_PROMPT",
    "Env",
    "EnvError",
    "EpisodeDoneError",
    "Message",
    "StepResult",
    "env_factory",
    "env_from_row",
    "expert_for",
    "is_placeholder",
    "make_env",
    "register_env",
    "register_expert",
    "registered_envs",
    "registered_experts",
    "unregister_env",
]
