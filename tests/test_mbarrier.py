"""``reference.simulators.mbarrier``: the mbarrier parity rule (PTX ``mbarrier.try_wait.parity``) and the FA3 ping-pong
protocol model of lecture 6 section 10 (the kernel's phase formulas pass; wrong ones hang or race)."""
import numpy as np
import pytest

from reference.simulators import mbarrier as mb


def test_fresh_barrier_passes_parity_1_and_blocks_parity_0():
    bar = mb.MBarrier("b", count=2)
    assert bar.passes(1) and not bar.passes(0)
    assert not bar.arrive() and not bar.passes(0)      # one of two arrivals: phase 0 not complete
    assert bar.arrive() and bar.passes(0) and not bar.passes(1)
    with pytest.raises(ValueError, match="parity"):
        bar.passes(2)
    with pytest.raises(ValueError, match="count"):
        mb.MBarrier("b", count=0)


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("turns", [False, True])
def test_kernel_phases_run_every_tile_in_turn(stages, turns):
    n = int(np.random.default_rng().integers(1, 9))
    ev = mb.run_pingpong(n, stages, turns=turns)
    issues = [(e.agent, e.detail) for e in ev if e.action == "issue"]
    assert len(issues) == 2 * (n + 1)
    loads = [e.detail for e in ev if e.action == "load"]
    assert loads == [f"{kind}_{t} -> slot {t % stages}" for t in range(n) for kind in ("K", "V")]
    if turns:
        assert [a for a, _ in issues] == ["WG0", "WG1"] * (n + 1)


@pytest.mark.parametrize("bad", [
    dict(turn_phase_fn=lambda r, wg: (r & 1) ^ wg),              # swapped: WG1 goes first
    dict(turn_phase_fn=lambda r, wg: 0),                           # nobody may start
    dict(turn_phase_fn=lambda r, wg: 1),                           # no ordering at all
    dict(empty_phase_fn=lambda t, s: (t // s) & 1),                # first pass not free: hang
    dict(ready_phase_fn=lambda t, s: ((t // s) & 1) ^ 1),          # reads a slot before its copy landed
])
def test_wrong_phases_deadlock_or_race(bad):
    with pytest.raises(mb.ProtocolError):
        mb.run_pingpong(4, 2, **bad)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n_tiles"):
        mb.run_pingpong(0)
    with pytest.raises(ValueError, match="stages"):
        mb.run_pingpong(3, stages=0)
