"""The torch engine's batched passes (disco.models.torch_batch) and ``profile --batch`` on it, on the tiny pair: a
padded batch's rows against each sequence fed alone, cropping, the profile's rows read back as a batched grid, and
bad requests refused in one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from disco.bench import batch_profile
from disco.cli import main
from disco.costs.batched import BatchGrid, grid_from_rows, resolve_batched
from disco.errors import BenchError
from disco.models.pair import TorchSession
from disco.models.torch_batch import TorchBatch, TorchBatchError, rows_match_batch_one


def _alone(model, toks: list[int], k: int) -> torch.Tensor:
    one = TorchSession(model, torch.device("cpu"))
    one.forward(toks[:-k], 1)
    return one.forward(toks[-k:], k)[0]


def test_rows_of_one_length_are_each_sequence_alone(tiny_pair):
    prompts = [[5 + (i * (s + 3)) % 90 for i in range(20)] for s in range(3)]
    same, diff = rows_match_batch_one(tiny_pair.target, tiny_pair.device, prompts, 4)
    assert diff < 1e-4  # bit-identical here; measured, not assumed: a GEMM over 3 rows may block differently
    batch = TorchBatch(tiny_pair.target, 3, tiny_pair.device)
    batch.forward({s: p[:-4] for s, p in enumerate(prompts)})
    logits, ms = batch.forward({s: p[-4:] for s, p in enumerate(prompts)}, {s: 4 for s in range(3)})
    assert ms > 0 and set(logits) == {0, 1, 2}
    for s, p in enumerate(prompts):
        alone = _alone(tiny_pair.target, p, 4)
        assert logits[s].shape == alone.shape == (4, tiny_pair.target.config.vocab_size)
        assert torch.equal(logits[s].argmax(-1), alone.argmax(-1))


def test_left_padded_rows_keep_each_sequences_positions(tiny_pair):
    """Rows of different lengths are left-padded in their first pass: masked pads, positions from each row's first
    real token, so each row's next-token choice is its own sequence's alone (the logits within float noise)."""
    prompts = [[7 + i % 50 for i in range(n)] for n in (9, 17, 30)]
    same, diff = rows_match_batch_one(tiny_pair.target, tiny_pair.device, prompts, 3)
    assert diff < 1e-3
    batch = TorchBatch(tiny_pair.target, 3, tiny_pair.device)
    batch.forward({s: p[:-3] for s, p in enumerate(prompts)})
    assert batch.lengths == [6, 14, 27] and batch.mask.shape == (3, 27) and int(batch.mask[0].sum()) == 6
    logits, _ = batch.forward({s: p[-3:] for s, p in enumerate(prompts)}, {s: 3 for s in range(3)})
    for s, p in enumerate(prompts):
        assert torch.equal(logits[s].argmax(-1), _alone(tiny_pair.target, p, 3).argmax(-1))


def test_crop_rolls_every_row_back_alike(tiny_pair):
    batch = TorchBatch(tiny_pair.target, 2, tiny_pair.device)
    batch.forward({0: [5] * 8, 1: [6] * 8})
    first, _ = batch.forward({0: [9, 10], 1: [11, 12]}, {0: 2, 1: 2})
    batch.crop(0, 8)
    assert batch.lengths == [8, 8] and batch.cache.get_seq_length() == 8 and batch.mask.shape == (2, 8)
    again, _ = batch.forward({0: [9, 10], 1: [11, 12]}, {0: 2, 1: 2})
    assert torch.allclose(first[1], again[1], atol=1e-5)
    with pytest.raises(TorchBatchError):
        batch.forward({0: [1, 2], 1: [3]})  # after the first pass every row feeds the same count
    with pytest.raises(TorchBatchError):
        batch.forward({0: [1]})  # a padded pass feeds every row
    with pytest.raises(TorchBatchError):
        batch.crop(0, -1)
    batch.close()
    with pytest.raises(TorchBatchError):
        batch.forward({0: [1], 1: [2]})


def test_profile_batch_measures_the_torch_engine(tiny_pair):
    rows, identity = batch_profile.measure(tiny_pair, [1, 2], contexts=(8, 24), ks=(1, 2, 4), reps=1, progress=False)
    assert {r["layout"] for r in rows} == {"padded"} and set(identity) == {"padded", "padded, left-padded rows"}
    assert identity["padded"][1] < 1e-4 and identity["padded, left-padded rows"][1] < 1e-3
    kinds = {(r["role"], r["kind"], r["batch"]) for r in rows}
    assert kinds >= {("target", "step", 2), ("assistant", "step", 2), ("target", "prefill", 1), ("assistant", "prefill", 2)}
    assert all(r["ms"] > 0 for r in rows)
    grid = grid_from_rows([dict(r, batch=str(r["batch"])) for r in rows], "test")
    assert isinstance(grid, BatchGrid) and "layout padded" in grid.label
    assert grid.target_ms([2, 2], [16, 16]) > 0 and grid.assistant_ms([1], [8]) > 0
    with pytest.raises(BenchError, match="no batch layout 'streams'"):
        batch_profile.measure(tiny_pair, [1], layouts=("streams",))


def test_profile_batch_cli_on_torch_writes_a_cost_profile(tmp_path, capsys):
    out = tmp_path / "torch-batch.csv"
    assert main(["profile", "--models", "tiny", "--engine", "torch", "--batch", "1,2", "--contexts", "8",
                 "--reps", "1", "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "torch fp32 on cpu" in printed and "padded: batched rows" in printed
    assert "padded, left-padded rows: batched rows" in printed
    frame = pd.read_csv(out)
    assert list(frame.columns) == batch_profile.BATCH_CSV_COLUMNS and set(frame["layout"]) == {"padded"}
    costs = resolve_batched(str(out))
    assert isinstance(costs, BatchGrid) and costs.target_ms([1, 1], [8, 8]) > 0
    assert main(["profile", "--models", "tiny", "--engine", "torch", "--batch", "2", "--live", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--live" in err and "llamacpp" in err and len(err.splitlines()) == 1
