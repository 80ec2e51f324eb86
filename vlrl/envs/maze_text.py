"""The text side of maze2d: action parsers (tuple and keyword modes), prompts, and the factory.

Tuple mode follows VisGym: the policy writes ``('move', d)`` or ``('stop', 'stop')``; the last
parenthesised group in its text (at most 64 characters) goes through ``ast.literal_eval``, never
``eval``. Keyword mode (the default) follows SkyRL's instruct env: ``<action>left</action>``, last
match wins. The feedback strings are the reference's, word for word; one quirk fixed: the stop
payload must be exactly ``'stop'`` (the reference accepted any short alphanumeric string).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator, Mapping
from typing import Any, get_args

from vlrl.envs.contract import EnvError
from vlrl.envs.maze2d import ACTION_NAMES, DELTAS, STOP, Maze2DEnv, Start
from vlrl.envs.maze_solver import shortest_path_actions
from vlrl.envs.text_env import GymTextEnv, ParsedAction

# Turn budgets cover every maze's expert (moves + stop): the longest shortest paths in 20k mazes
# are 28 (easy) and 44 (hard) moves. VisGym's harness uses 20 / 30, which leaves ~6 % of easy
# mazes unsolvable (paths come in multiples of 4); pass extras {"max_turns": 20} to compare with it.
# The curriculum's small levels: every 5x5 expert is 4 moves + stop (one 2x2-cell maze shape up to
# symmetry), 7x7 experts 8-16 moves + stop (3000 mazes); their budgets leave room for a few bumps.
LEVELS = {
    "5x5": {"size": 5, "max_turns": 8},
    "7x7": {"size": 7, "max_turns": 20},
    "easy": {"size": 9, "max_turns": 30},
    "hard": {"size": 11, "max_turns": 46},
}
VISGYM_TURNS = {"easy": 20, "hard": 30}
"""VisGym's turn budgets. Solved within N turns of vlrl's budget is close to, not the same as, solved under a budget
of N (``extras={"max_turns": N}``): the step counter tells the policy how many steps remain."""
KEYWORDS = {name: action for action, name in ACTION_NAMES.items()}  # right/up/left/down/stop -> id

FORMAT_INVALID = (
    "The action format is invalid. The action should be a tuple of two elements with the first "
    "element being the action name and the second element being the action payload."
)
KEYWORD_INVALID = (
    "Action parsing failed. Could not find a valid action in your response.\nPlease end your "
    "response with <action>ACTION</action> where ACTION is one of: down, left, right, stop, up"
)

_TUPLE_QUOTED = re.compile(r"\(\s*['\"][^()]{0,60}\)")
_TUPLE_ANY = re.compile(r"\([^()]{0,62}\)")
_FENCE = re.compile(r"```[a-zA-Z]*")
_KEYWORD = re.compile(r"<action>\s*(\w{1,16})\s*</action>", re.IGNORECASE)


def _tuple_candidate(text: str) -> str:
    """The substring to literal_eval: last quoted-name group, else last short group, else the text head."""
    text = _FENCE.sub(" ", text)
    for pattern in (_TUPLE_QUOTED, _TUPLE_ANY):
        matches = pattern.findall(text)
        if matches:
            return matches[-1]
    return text.strip()[:128]  # bounded: literal_eval never sees more than this


def parse_tuple_action(text: str) -> ParsedAction:
    """VisGym tuple mode: ``('move', 0..3)`` or ``('stop', 'stop')``, with the reference feedback."""
    action = _tuple_candidate(text)
    try:
        value = ast.literal_eval(action)
    except Exception as exc:  # noqa: BLE001 — SyntaxError, ValueError, MemoryError, RecursionError: all "unparseable"
        return ParsedAction(None, feedback=f"Cannot parse action string {action!r}: {exc} so the action is invalid.")
    if not isinstance(value, tuple) or len(value) != 2:
        return ParsedAction(None, feedback=FORMAT_INVALID)
    branch, payload = value
    if branch == "move":
        if isinstance(payload, int) and not isinstance(payload, bool) and 0 <= payload <= 3:
            return ParsedAction(payload, ACTION_NAMES[payload])
    elif branch == "stop":
        if payload == "stop":
            return ParsedAction(STOP, "stop")
    else:
        return ParsedAction(
            None, feedback=f"The action name '{branch}' is not recognized in the available action space."
        )
    return ParsedAction(
        None, feedback=f"The action {payload} is not in the valid action space of {branch} so nothing is executed."
    )


def parse_keyword_action(text: str) -> ParsedAction:
    """Keyword mode: the last ``<action>KEYWORD</action>`` (case-insensitive) with a maze keyword."""
    matches = _KEYWORD.findall(text)
    if matches:
        word = matches[-1].lower()
        if word in KEYWORDS:
            return ParsedAction(KEYWORDS[word], word)
    return ParsedAction(None, feedback=KEYWORD_INVALID)


_INTRO = (
    "You are navigating a {h}x{w} maze. The maze consists of walls (gray) and paths (white). You are "
    "represented by a blue circle, and your goal is to reach the red target square.\n\n"
)

_TUPLE_BODY = """Available actions:
1. 'move': Move in one of four directions. Format: `('move', direction)` where direction is an integer:
   - 0=right, 1=up, 2=left, 3=down
2. 'stop': End the navigation session. Format: `('stop', 'stop')`

Success: You succeed if you reach the red target square.

Please respond with exactly one action and its arguments in the specified format. For example:
- To move right: `('move', 0)`
- To move up: `('move', 1)`
- To move left: `('move', 2)`
- To move down: `('move', 3)`
- To stop: `('stop', 'stop')`"""

_KEYWORD_BODY = """Available actions:
- up, down, left, right: move one square in that direction (walls block you).
- stop: end the navigation session.

Success: You succeed if you stop on the red target square.

End your response with your chosen action in this exact format: <action>ACTION</action> where ACTION is one of: \
left, right, up, down, stop."""


def maze_prompt(height: int, width: int, mode: str) -> str:
    """The task prompt: VisGym's text in tuple mode; our own, non-contradicting one in keyword mode."""
    body = _TUPLE_BODY if mode == "tuple" else _KEYWORD_BODY
    return _INTRO.format(h=height, w=width) + body


def action_text(action: int, mode: str) -> str:
    """The model text that performs ``action`` in ``mode`` (used for expert demos and tests)."""
    if mode == "tuple":
        return "('stop', 'stop')" if action == STOP else f"('move', {action})"
    return f"<action>{ACTION_NAMES[action]}</action>"


def make_maze2d(level: str, extras: Mapping[str, Any], seed: int | None) -> GymTextEnv:
    """``maze2d/<level>``. extras: ``action_mode`` ("keyword" | "tuple"), ``max_turns`` (default per level),
    ``tile`` (px per maze tile, VisGym's 25 by default), ``start`` ("corner", VisGym's, or "random": any floor
    tile, for SFT data; see :mod:`vlrl.envs.maze2d`)."""
    if level not in LEVELS:
        raise EnvError(f"unknown maze2d level {level!r}; expected one of {sorted(LEVELS)}")
    mode = str(extras.get("action_mode", "keyword"))
    if mode not in ("keyword", "tuple"):
        raise EnvError(f"maze2d action_mode must be 'keyword' or 'tuple', got {mode!r}")
    size = LEVELS[level]["size"]
    max_turns = int(extras.get("max_turns", LEVELS[level]["max_turns"]))
    tile = extras.get("tile", 25)
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 4:
        raise EnvError(f"maze2d extras tile must be an int of at least 4 (px per tile), got {tile!r}")
    start = extras.get("start", "corner")
    if start not in get_args(Start):
        raise EnvError(f"maze2d extras start must be 'corner' or 'random', got {start!r}")
    parser = parse_tuple_action if mode == "tuple" else parse_keyword_action
    # The class directly rather than gymnasium.make: no passive-checker overhead per step; the same
    # class is registered with gymnasium (vlrl/Maze2D-v0) for anyone who wants it from there.
    return GymTextEnv(
        Maze2DEnv(maze_width=size, maze_height=size, tile=tile, start=start),
        parser=parser,
        prompt=maze_prompt(size, size, mode),
        max_turns=max_turns,
        seed=seed,
        env_class=f"maze2d/{level}",
        example_actions=[action_text(a, mode) for a in ACTION_NAMES],
    )


def maze2d_expert(env: GymTextEnv, row: Mapping[str, Any]) -> Iterator[str]:
    """The SFT expert of every maze2d level (registered as ``maze2d`` in vlrl.envs.builtin): a BFS
    shortest path to the target, then stop, in the row's action format.

    Row extras ``expert_noise`` = p > 0 turn it into a recovery demonstrator (DART-style noise
    injection): at each turn, with probability p, it plays one of the moves the BFS path does not take
    (a wall bump, or a step off the path) and then recovers, so SFT sees histories with mistakes and the
    wall feedback. A detour is only taken while the turn budget still fits it, the way back and ``stop``,
    so every demonstration ends on the goal. Seeded by the row's seed: the same row, the same episode.

    Row extras ``expert_branch`` = q > 0 add the mistake a maze policy makes most (docs/maze.md item 18): at each
    turn, with probability q, it walks down a wrong branch (:func:`branch_detour`: an open move the path does not
    take, then along that corridor, and at a dead end into its wall once or more), then comes back. These turns
    are detours too; the same budget rule holds. Drawn from its own seeded stream, so ``expert_noise`` alone
    plays the episodes it played before.

    Row extras ``expert_open`` = true make each reply first name the open directions around the agent
    (:func:`open_text`, e.g. ``open: up left``), then the action: an auxiliary target that supervises reading
    the walls next to the agent, the perception the maze probes found missing (docs/maze-early.md item 7, maze.md 13).
    The parsers read the last action, so the prefix changes nothing else; the policy learns to write it too
    (about 8 more tokens a turn: ``rollout.max_tokens`` 20).
    """
    for text, _ in expert_turns(env, row):
        yield text


def expert_turns(env: GymTextEnv, row: Mapping[str, Any]) -> Iterator[tuple[str, bool]]:
    """:func:`maze2d_expert`'s turns as ``(text, detour)``: ``detour`` marks the noise moves (for a
    trainer that keeps them in the history but out of the loss)."""
    game = env.gym_env.unwrapped
    extras = row.get("extras") or {}
    mode = str(extras.get("action_mode", "keyword"))
    noise = float(extras.get("expert_noise", 0.0))
    branch = float(extras.get("expert_branch", 0.0))
    say_open = extras.get("expert_open", False)
    if not isinstance(say_open, bool):
        raise EnvError(f"maze2d extras expert_open must be true or false, got {say_open!r}")
    rng = random.Random(f"maze2d-expert-noise/{row.get('seed')}")
    branch_rng = random.Random(f"maze2d-expert-branch/{row.get('seed')}")
    queued: list[int] = []  # the rest of a branch detour under way
    while True:
        path = shortest_path_actions(game.maze_map, game.agent, game.target)
        action, detour = (path[0] if path else STOP), False
        if queued:
            action, detour = queued.pop(0), True
        elif branch > 0 and path and branch_rng.random() < branch:
            moves = branch_detour(game.maze_map, game.agent, path[0], branch_rng)
            if moves and len(moves) + len(_path_from(game, moves)) + 1 <= env.max_turns - env.turn:
                action, detour, queued = moves[0], True, moves[1:]
        elif noise > 0 and rng.random() < noise:
            move = rng.choice([a for a in DELTAS if a != action])
            if len(path_after(game.maze_map, game.agent, game.target, move)) + 2 <= env.max_turns - env.turn:
                action, detour = move, True
        text = action_text(action, mode)
        yield (open_text(game.maze_map, game.agent) + text if say_open else text), detour
        if action == STOP:
            return


def branch_detour(maze_map, agent: tuple[int, int], path_move: int, rng: random.Random, longest: int = 8) -> list[int]:
    """A walk down a wrong branch from ``agent``: an open move other than ``path_move``, then on along the corridor
    (never straight back; a random open way at a fork) for 1 to ``longest`` moves in all; where it meets a dead end,
    1 to 3 moves into its end wall (the frame stops changing, as in a policy's failed episodes). [] where every
    other move is a wall."""
    wrong = [a for a in DELTAS if a != path_move and _floor(maze_map, _next(agent, a))]
    if not wrong:
        return []
    move, cell, came, moves = rng.choice(wrong), agent, agent, []
    for _ in range(rng.randint(1, longest)):
        moves.append(move)
        came, cell = cell, _next(cell, move)
        ways = [a for a in DELTAS if _floor(maze_map, _next(cell, a)) and _next(cell, a) != came]
        if not ways:
            return moves + [move] * rng.randint(1, 3)  # straight on is the dead end's wall
        move = rng.choice(ways)
    return moves


def _next(cell: tuple[int, int], move: int) -> tuple[int, int]:
    return cell[0] + DELTAS[move][0], cell[1] + DELTAS[move][1]


def _floor(maze_map, cell: tuple[int, int]) -> bool:
    return bool(maze_map[cell] == 0)


def _path_from(game, moves: list[int]) -> list[int]:
    """The BFS path to the target after playing ``moves`` (wall bumps stay put)."""
    cell = game.agent
    for move in moves:
        cell = _next(cell, move) if _floor(game.maze_map, _next(cell, move)) else cell
    return shortest_path_actions(game.maze_map, cell, game.target)


def open_text(maze_map, agent: tuple[int, int]) -> str:
    """``open: up left`` and a newline: the moves from ``agent`` that no wall blocks, in action order (``open:
    none`` never happens in a generated maze: every floor tile has an open neighbour)."""
    names = [ACTION_NAMES[a] for a, (dr, dc) in DELTAS.items() if maze_map[agent[0] + dr, agent[1] + dc] == 0]
    return f"open: {' '.join(names) or 'none'}\n"


def path_after(maze_map, agent: tuple[int, int], target: tuple[int, int], action: int) -> list[int]:
    """The BFS path to ``target`` after playing move ``action`` from ``agent`` (a wall bump stays put)."""
    dr, dc = DELTAS[action]
    nxt = (agent[0] + dr, agent[1] + dc)
    return shortest_path_actions(maze_map, agent if maze_map[nxt] == 1 else nxt, target)
