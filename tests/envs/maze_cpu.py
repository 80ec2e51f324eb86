"""The maze curriculum's config on CPU for tests: the tiny model, two-row SFT steps, a few short mazes."""

from __future__ import annotations


def cpu_overrides(train_rows: int = 16) -> tuple[str, ...]:
    """``section.key=value`` overrides for ``level_config``: two rows a step, 4 eval mazes of at most 3 turns."""
    return (
        "model.device=cpu",
        "sft.rows_per_step=2",
        "optim.micro_batch_size=2",
        f"data.train_rows={train_rows}",
        "data.eval_rows=4",
        'data.extras={"expert_noise":0.0,"max_turns":3}',
    )
