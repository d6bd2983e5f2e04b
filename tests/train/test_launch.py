"""mlrc.train.launch and the small pieces of mlrc.train.distributed that need no process group:
device plans, rank shares, the rank's own augmentation stream, and how a failed launch is
named (read against the rules written out by hand)."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mlrc.search.errors import INTERRUPTED, ending, rank_lost
from mlrc.search.optuna_setup import counts
from mlrc.train import distributed
from mlrc.train.launch import rank_devices
from mlrc.train.ranks import RankLost, ranks_error, record_error


def test_rank_devices():
    assert rank_devices("cpu", 3) == ["cpu"] * 3
    assert rank_devices("cpu", 2, ["cpu", "cpu", "cpu"]) == ["cpu", "cpu"]  # the first K
    with pytest.raises(ValueError, match="4 processes per trial need 4 devices, but --devices"):
        rank_devices("cpu", 4, ["cpu", "cpu"])
    with pytest.raises(ValueError, match="≥ 1"):
        rank_devices("cpu", 0)
    with pytest.raises(ValueError, match="each rank needs its own GPU, got cuda:0, cuda:0"):
        rank_devices("cpu", 2, ["cuda:0", "cuda:0"])  # refused before the GPUs are counted


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs a machine with < 2 GPUs")
def test_gpus_that_are_not_here_are_refused():
    with pytest.raises(ValueError, match="need GPUs cuda:0, cuda:1, but this machine shows"):
        rank_devices("cuda", 2)
    with pytest.raises(ValueError, match="need GPUs cuda:5, cuda:6, but this machine shows"):
        rank_devices("cpu", 2, ["cuda:5", "cuda:6", "cuda:7"])


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shares_cover_every_item_once_in_rank_order(monkeypatch, n, world):
    got = []
    for rank in range(world):
        monkeypatch.setattr(distributed, "rank_and_world", lambda r=rank: (r, world))
        got.append(list(distributed.shard(n)))
    assert sum(got, []) == list(range(n))  # contiguous, rank order, each item once
    sizes = [len(g) for g in got]
    assert max(sizes) - min(sizes) <= 1


def test_each_rank_loads_with_its_own_stream_and_the_global_one_is_left_alone(monkeypatch):
    """Under a group each rank's batches draw from (seed, rank, epoch); the global stream (the
    strategies') is where it was between batches; outside a group nothing changes."""

    def draws() -> list[float]:
        return [torch.rand(()).item() for _ in range(3)]

    def loader():  # a batch's random crops are drawn while the loader is asked for it
        for _ in range(2):
            yield draws()

    def load(rank: int, epoch: int) -> tuple[list, float]:
        monkeypatch.setattr(distributed, "is_distributed", lambda: True)
        monkeypatch.setattr(distributed, "rank_and_world", lambda: (rank, 2))
        torch.manual_seed(0)
        batches = list(distributed.rank_stream(loader(), seed=7, epoch=epoch))
        return batches, torch.rand(()).item()

    a0, after0 = load(0, 1)
    a1, after1 = load(1, 1)
    again, _ = load(0, 1)
    other_epoch, _ = load(0, 2)
    torch.manual_seed(0)
    untouched = torch.rand(()).item()
    assert a0 == again and a0 != a1 and a0 != other_epoch
    assert after0 == after1 == untouched  # the global stream did not move
    monkeypatch.setattr(distributed, "is_distributed", lambda: False)
    torch.manual_seed(0)
    plain = list(distributed.rank_stream(loader(), seed=7, epoch=1))
    torch.manual_seed(0)
    assert plain == [draws(), draws()]  # one process: the global stream itself


def failure(exitcode: int) -> SimpleNamespace:
    name = signal.Signals(-exitcode).name if exitcode < 0 else ""
    return SimpleNamespace(exitcode=exitcode, signal_name=lambda: name)


def launch_error(**failures) -> dict:
    """What the launcher says failed: rank → its exit code (negative: the signal)."""
    return {int(k.removeprefix("r")): failure(v) for k, v in failures.items()}


def test_a_killed_rank_is_named_not_the_peer_that_noticed(tmp_path: Path):
    peer = RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer")
    record_error(tmp_path / "rank0.error", peer)
    got = ranks_error(tmp_path, launch_error(r1=-9, r0=-15), 2)
    assert isinstance(got, RankLost) and str(got) == "rank 1 of 2 ended by SIGKILL"
    # the launcher's SIGTERM to a survivor is not the cause when another rank died otherwise
    got = ranks_error(tmp_path, launch_error(r0=-15, r1=-9), 2)
    assert str(got) == "rank 1 of 2 ended by SIGKILL"
    assert "killed or lost" in str(ranks_error(tmp_path, launch_error(), 2))


def test_a_rank_s_own_error_is_raised_as_it_was(tmp_path: Path):
    from mlrc.data.base import DatasetError

    record_error(tmp_path / "rank1.error", DatasetError("x.png: unreadable image"))
    got = ranks_error(tmp_path, launch_error(r1=1, r0=-15), 2)
    assert isinstance(got, DatasetError) and str(got) == "x.png: unreadable image"


def test_a_lost_rank_interrupts_and_is_not_counted():
    lost = RankLost("rank 1 of 2 ended by SIGKILL")
    assert ending(lost) == (INTERRUPTED, "interrupted: rank 1 of 2 ended by SIGKILL")
    assert rank_lost(SimpleNamespace(cause=lost)) is lost  # a Ray task's error carrying it
    assert ending(RuntimeError("boom")) == ("failed", "RuntimeError: boom")
    from optuna.trial import TrialState

    def trial(reason):
        return SimpleNamespace(state=TrialState.FAIL, user_attrs={"reason": reason})

    assert not counts(trial("interrupted: rank 1 of 2 ended by SIGKILL"))
    assert not counts(trial("interrupted"))
    assert counts(trial("RuntimeError: boom"))


def test_recorded_errors_come_back_as_their_class_or_a_runtime_error(tmp_path: Path):
    """No pickle between ranks and launcher: built-in and mlrc exceptions come back as
    themselves, any other as ``RuntimeError("Name: message")``."""
    from mlrc.config import ConfigError
    from mlrc.train.ranks import load_error

    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    for e, kind, text in [
        (KeyboardInterrupt("stop"), KeyboardInterrupt, "stop"),
        (ConfigError("study.yaml: bad"), ConfigError, "study.yaml: bad"),
        (OSError("disk full"), OSError, "disk full"),
        (Odd(1, 2), RuntimeError, "Odd: 1/2"),
    ]:
        record_error(tmp_path / "rank0.error", e)
        got = load_error(tmp_path / "rank0.error")
        assert type(got) is kind and str(got) == text
    (tmp_path / "rank1.error").write_bytes(b"\x80\x04not json")
    assert load_error(tmp_path / "rank1.error") is None


# torch's SIGCHLD handler's words (torch/csrc/DataLoader.cpp), with strsignal's signal names
KILLED_BY = "DataLoader worker (pid {}) is killed by signal: {}. "


@pytest.mark.parametrize(
    ("sig", "expected"),
    [
        (signal.SIGKILL, "interrupted: data loader process 77 ended by SIGKILL"),
        (signal.SIGTERM, "interrupted: data loader process 77 ended by SIGTERM"),
        (signal.SIGSEGV, None),  # a crash of the loader's own: the trial fails
    ],
)
def test_a_loader_killed_from_outside_interrupts_and_a_crash_fails(sig, expected):
    message = KILLED_BY.format(77, signal.strsignal(sig))
    seen = RuntimeError(message)
    try:  # raised while handling it, as torch's handler may fire in mlrc's own code
        try:
            raise seen
        except RuntimeError as e:
            raise ValueError("a database write cut short") from e
    except ValueError as outer:
        chained = outer
    for e in (seen, chained):
        if expected is None:
            assert ending(e)[0] == "failed"
        else:
            assert ending(e) == (INTERRUPTED, expected)
