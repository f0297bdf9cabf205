"""The pieces of the peer snapshots, one process: the placement of copies, the recovery plan,
the snapshot file, a node's store, and a round trip of a trainer's state through them."""

from __future__ import annotations

import itertools

import pytest
import torch

from bloomline.common.errors import UserError
from bloomline.trainer.snapshots.placement import Placement
from bloomline.trainer.snapshots.recovery_plan import plan_recovery
from bloomline.trainer.snapshots.shard_file import ShardHeader, crc32, plan_slots, tensor_views
from bloomline.trainer.snapshots.store import HostStore


@pytest.mark.parametrize("world,per_node", [(4, 2), (8, 4), (16, 8), (6, 2), (2, 1)])
def test_no_node_holds_the_only_copy_of_a_shard(world, per_node):
    """Bug: a rank's peer is on its own node (a lost machine takes both copies), two ranks
    send to one peer while another keeps nothing (peer_of not a permutation), or a rank's
    source is not the rank whose peer it is (the replica exchange would pair the wrong
    ranks and hang)."""
    places = [Placement(r, world, per_node) for r in range(world)]
    peers = [p.peer_of(p.rank) for p in places]
    assert sorted(peers) == list(range(world))
    for p in places:
        assert p.node_of(p.peer_of(p.rank)) != p.node
        assert p.source_of(p.peer_of(p.rank)) == p.rank


def test_one_node_has_no_peer_and_a_bad_node_size_is_refused():
    """Bug: on one node a rank "replicates" to a rank of the same machine (memory spent for
    no protection), or a node size that does not divide the world is taken (copies would land
    on the wrong ranks)."""
    assert Placement(1, 4, 4).peer_of(1) is None
    with pytest.raises(UserError, match="checkpoint.snapshot_ranks_per_node 3: 3 ranks per "
                                        "node do not divide the 4 ranks"):
        Placement.of_run(0, 4, 3)


def _holdings(placement_world: int, per_node: int, steps: list[int], lost_nodes=()):
    """What each rank reports after rounds ``steps``: its node's own and copy files."""
    hosts = [f"n{r // per_node}" for r in range(placement_world)]
    files = {h: set() for h in hosts}
    for r in range(placement_world):
        p = Placement(r, placement_world, per_node)
        for step in steps:
            files[hosts[r]].add((0, step, r))
            if p.peer_of(r) is not None:
                files[hosts[p.peer_of(r)]].add((0, step, r))
    for node in lost_nodes:
        files[f"n{node}"] = set()
    return hosts, [sorted(files[h]) for h in hosts]


def test_the_plan_takes_the_newest_step_every_shard_has_and_who_sends_what():
    """Bug: the plan takes a step some shard lacks, makes a rank read a copy its node does not
    hold, or sends a shard its node still has: node 1 of 2 lost -> ranks 2 and 3 get step 6
    from ranks 0 and 1 (node 0 kept their copies); the others read their own."""
    hosts, held = _holdings(4, 2, [4, 6], lost_nodes=[1])
    plan, why = plan_recovery(hosts, held, newest_checkpoint=3)
    assert why == "" and (plan.timeline, plan.step) == (0, 6)
    assert plan.transfers == [(0, 2), (0, 3)]  # node 0's first rank sends both
    assert [plan.local(r) for r in range(4)] == [True, True, False, False]


def test_the_plan_falls_back_when_a_shard_or_the_timeline_says_so():
    """Bug: with both copies of a shard lost the plan restores the others from a step the lost
    one cannot join, a snapshot older than the newest checkpoint wins over it, or a
    snapshot of a timeline a rollback left is restored (the step numbers of the new
    timeline are lower)."""
    hosts, held = _holdings(4, 2, [6], lost_nodes=[0, 1])
    assert plan_recovery(hosts, held, None) == (None, "no snapshot survived")
    # a shard whose two copies are gone at step 8, all at 6: step 6
    hosts, held = _holdings(4, 2, [6, 8])
    held = [[item for item in h if item[1:] != (8, 1)] for h in held]
    plan, _ = plan_recovery(hosts, held, None)
    assert plan.step == 6
    held = [[item for item in h if item[2] != 1] for h in held]
    plan, why = plan_recovery(hosts, held, None)
    assert plan is None and "step 8 lacks rank 1: both nodes that held it were lost" in why
    hosts, held = _holdings(4, 2, [6])
    plan, why = plan_recovery(hosts, held, newest_checkpoint=9)
    assert plan is None and "older than the newest checkpoint (step 9)" in why
    newer = [h + [(1, 2, r) for r in range(4)] for h in held]
    assert plan_recovery(hosts, newer, None)[0].timeline == 1


def _header(data: torch.Tensor, slots, step=6) -> ShardHeader:
    return ShardHeader(1, step, 0, 4, "pp1 x dp2 x tp2", 0.0, data.numel(), crc32(data),
                       slots, {"optim.param_groups.w.lr": 0.1}, {"step": step}, {})


def test_a_snapshot_file_round_trips_bit_for_bit_and_refuses_damage(tmp_path):
    """Bug: a tensor comes back shifted or in another dtype (the aligned offsets, bf16 as
    bytes), a partial file is listed as a snapshot, pruning keeps the wrong round, or a file
    damaged in memory loads without a word (the CRC)."""
    tensors = {"model.w": torch.randn(3, 5), "model.b": torch.randn(7).bfloat16(),
               "optim.state.w.step": torch.tensor(4.0), "optim.mask": torch.tensor([True])}
    slots, size = plan_slots(tensors)
    data = torch.zeros(size, dtype=torch.uint8)
    for name, view in tensor_views(data, slots).items():
        view.copy_(tensors[name])
    store = HostStore(tmp_path, tmp_path / "run", "job", "host")
    for step in (4, 6):
        store.write(_header(data, slots, step), data, "own")
    (store.folder / ".shard00001-step00000008-t0-own.snap.partial").write_bytes(b"x")
    assert [(h.step, h.shard, h.kind) for h in store.holdings()] == [(4, 1, "own"),
                                                                      (6, 1, "own")]
    store.prune(1, "own", keep=1)
    [newest] = store.holdings()
    header, back = store.read(newest.path)
    assert header.step == 6 and header.values == {"optim.param_groups.w.lr": 0.1}
    for name, view in tensor_views(back, header.slots).items():
        assert view.dtype == tensors[name].dtype
        assert torch.equal(view, tensors[name]), name
    raw = bytearray(newest.path.read_bytes())
    raw[-1] ^= 0x10
    newest.path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="does not match its CRC"):
        store.read(newest.path)


@pytest.mark.slow
def test_a_trainer_state_restores_bit_for_bit_from_its_local_pieces(corpus, tmp_path,
                                                                    make_config):
    """Bug: the snapshot's state misses a tensor the next steps read (Adam's moments or step,
    the fp32 masters), or restoring it leaves the optimizer with the checkpoint path's
    hyper-parameters but other moments: two steps, a snapshot of the state, two more steps;
    then restore the snapshot into a fresh trainer and take the same two steps: the losses
    and weights must equal bit for bit."""
    from bloomline.trainer.loop import Trainer
    from bloomline.trainer.snapshots.local_state import flat_state, restore_state

    cfg = make_config(corpus, tmp_path / "run")
    first = Trainer(cfg, log=lambda *_: None)
    batches = [[torch.randint(0, 127, (2, 33)) for _ in range(2)] for _ in range(4)]
    for micro in batches[:2]:
        first.train_step(micro, 1e-3)
    tensors, values, _ = flat_state(first.model, first.optimizer)
    saved = {name: t.clone() for name, t in tensors.items()}
    assert any(".exp_avg" in name for name in saved) and any(".step" in name for name in saved)
    want = [first.train_step(micro, 1e-3)["loss"] for micro in batches[2:]]
    second = Trainer(cfg, log=lambda *_: None)
    restore_state(second.model, second.optimizer, saved, dict(values))
    got = [second.train_step(micro, 1e-3)["loss"] for micro in batches[2:]]
    assert got == want
    a, b = first.full_model_state(), second.full_model_state()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="missing"):
        restore_state(second.model, second.optimizer,
                      dict(itertools.islice(saved.items(), 1)), dict(values))


@pytest.mark.slow
def test_one_process_restart_recovers_and_a_first_start_clears_stale_snapshots(
        corpus, tmp_path, make_config, monkeypatch):
    """Bug: snapshots are taken without a restart to use them, a restarted process ignores its
    own node's snapshot, a finished run leaves its snapshots in memory, or a new launch
    (restart count 0) restores the snapshot an earlier job left: a run fails at step 5
    (snapshots every 2 steps) -> the restart goes on from step 4 and ends with the losses of
    a run that never failed; a first start of another job deletes what was left."""
    import json

    from bloomline.trainer.loop import Trainer

    def losses(run_dir):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}

    shm = tmp_path / "shm"
    settings = {"train": {"train_samples": 32, "log_interval": 1},
                "checkpoint": {"snapshot_interval": 2, "snapshot_dir": str(shm)}}
    Trainer(make_config(corpus, tmp_path / "straight", **settings), log=lambda *_: None).run()
    assert not shm.exists()  # no restarts (TORCHELASTIC_MAX_RESTARTS unset): none taken
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("BLOOMLINE_FAULTS", "error@step:step=5:attempt=0")
    cfg = make_config(corpus, tmp_path / "failed", **settings)
    with pytest.raises(RuntimeError, match="injected fault"):
        Trainer(cfg, log=lambda *_: None).run()
    assert [p.name for p in shm.rglob("*.snap")] == ["shard00000-step00000004-t0-own.snap"]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    lines = []
    Trainer(cfg, log=lines.append).run()
    assert any(line.startswith("recovered step 4 from peer snapshots") for line in lines), lines
    assert losses(tmp_path / "failed") == losses(tmp_path / "straight")
    assert not list(shm.rglob("*.snap"))  # the finished run deleted its snapshots
    # a snapshot an earlier job left (a failed run whose restarts were spent)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    stale = HostStore(shm, cfg.train.run_dir, "job0", "host").folder / "x.snap"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job2")
    monkeypatch.delenv("BLOOMLINE_FAULTS")
    Trainer(make_config(corpus, cfg.train.run_dir, **{**settings, "train": {
        "train_samples": 40, "log_interval": 1}}), log=lambda *_: None).run()
    assert not stale.exists()


def test_auto_waits_after_the_next_step_only_while_a_round_fits_in_a_step(tmp_path):
    """Bug: a round slower than a step stalls the step after every snapshot (a small model's
    fast steps waiting seconds for the replication each time), or ``step`` mode gives up the
    bound of ``snapshot_interval`` lost steps: auto waits after the next step while the last
    round took less than a step, else before the next round, and says so once."""
    from bloomline.trainer.config import Config
    from bloomline.trainer.snapshots.peer_snapshots import PeerSnapshots

    cfg, lines = Config(), []
    snapshots = PeerSnapshots(cfg, tmp_path, None, None, 0, 1, "", lines.append)
    assert snapshots.settles_next_step(0.5)  # no round measured yet
    snapshots.last_round_seconds = 0.2
    assert snapshots.settles_next_step(0.5)
    snapshots.last_round_seconds = 2.0
    assert not snapshots.settles_next_step(0.5) and not snapshots.settles_next_step(0.5)
    assert len(lines) == 1 and lines[0].startswith(
        "peer snapshots: a round takes 2.00 s, longer than a step (0.50 s): the run waits for "
        "it before the next round instead of after the next step (no stall; a failure during "
        "a round loses up to 19 steps instead of 10)"), lines
    cfg.checkpoint.snapshot_wait = "step"
    bound = PeerSnapshots(cfg, tmp_path, None, None, 0, 1, "", print)
    bound.last_round_seconds = 2.0
    assert bound.settles_next_step(0.5)
