"""SFT experts by name: they live beside their envs and register in :mod:`vlrl.envs.registry`."""

from vlrl.envs.registry import Expert, expert_for, register_expert, registered_experts

__all__ = ["Expert", "expert_for", "register_expert", "registered_experts"]
