"""PixelRuns: a conversation's pixel rows joined a turn at a time equal ``torch.cat`` of all its images, a turn
copies only its new image, views handed out never change (branches copy), and the LRU stays within its bytes."""

from __future__ import annotations

import torch

from vlrl.render.pixel_runs import PixelRuns, same_memory


def image(seed: int, rows: int = 16) -> torch.Tensor:
    return torch.randn((rows, 12), generator=torch.Generator().manual_seed(seed))


def test_each_turn_equals_the_concatenation_and_copies_only_its_new_image(monkeypatch):
    runs, parts, keys, views = PixelRuns(), [], [], []
    copied = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a: (copied.append(src.shape[0]), real(self, src))[1])
    for turn in range(6):
        parts.append(image(turn, rows=16 + turn))
        keys.append(f"h{turn}")
        copied.clear()
        views.append(runs.concat(keys, parts))
        assert torch.equal(views[-1], torch.cat(parts))
        assert copied == [parts[-1].shape[0]]  # the new image's rows only
    for turn, view in enumerate(views):  # every earlier view kept its values
        assert torch.equal(view, torch.cat(parts[: turn + 1]))
    assert same_memory(views[-1][: views[2].shape[0]], views[2])  # a turn's earlier rows are the last turn's memory
    assert len(runs._runs) == 1  # one entry per conversation (its latest turn), charged its rows once
    assert runs._runs.bytes == views[-1].nbytes


def test_a_branch_copies_and_leaves_the_other_branchs_rows_alone():
    runs = PixelRuns()
    shared = runs.concat(["a"], [image(1)])
    again = runs.concat(["a"], [image(1)])  # GRPO's repeats render the same first turn
    assert same_memory(shared, again) and not same_memory(image(1), image(1))  # equal values, other memory
    left = runs.concat(["a", "b"], [image(1), image(2)])
    right = runs.concat(["a", "c"], [image(1), image(3)])  # the same history, another image: its own buffer
    assert torch.equal(left, torch.cat([image(1), image(2)]))
    assert torch.equal(right, torch.cat([image(1), image(3)]))
    assert torch.equal(shared, image(1))
    longer = runs.concat(["a", "b", "d"], [image(1), image(2), image(4)])
    assert torch.equal(right, torch.cat([image(1), image(3)]))  # the left branch grew; the right one is untouched
    assert torch.equal(longer, torch.cat([image(1), image(2), image(4)]))


def test_rows_of_another_kind_or_a_full_buffer_start_a_new_buffer():
    runs = PixelRuns()
    first = runs.concat(["a"], [image(1)])
    wide = torch.ones((4, 24))
    out = runs.concat(["a", "w"], [image(1), wide[:, :12].contiguous().double()])  # another dtype: copied anew
    assert out.dtype == torch.float64 and torch.equal(out, torch.cat([image(1).double(), torch.ones((4, 12))]))
    parts, keys = [image(0)], ["x0"]
    views = [runs.concat(keys, parts)]
    for turn in range(1, 80):  # past the buffer's room: regrown by a copy, earlier views intact
        parts.append(image(turn))
        keys.append(f"x{turn}")
        views.append(runs.concat(keys, parts))
    assert torch.equal(views[-1], torch.cat(parts))
    assert all(torch.equal(v, torch.cat(parts[: i + 1])) for i, v in enumerate(views))
    assert torch.equal(first, image(1))


def test_the_lru_stays_within_its_bytes_and_an_evicted_run_is_rebuilt():
    one = image(0).nbytes
    runs = PixelRuns(max_bytes=3 * one)
    for conversation in range(5):
        runs.concat([f"c{conversation}"], [image(conversation)])
    assert runs._runs.bytes <= 3 * one and len(runs._runs) == 3
    out = runs.concat(["c0", "z"], [image(0), image(9)])  # c0 was evicted: a full copy, still right
    assert torch.equal(out, torch.cat([image(0), image(9)]))
    assert runs._runs.bytes <= 3 * one


def test_keys_and_parts_must_pair():
    runs = PixelRuns()
    for keys, parts in ((["a"], []), ([], []), (["a", "b"], [image(1)])):
        try:
            runs.concat(keys, parts)
        except ValueError as exc:
            assert "key" in str(exc)
        else:
            raise AssertionError("mismatched keys and parts were accepted")
