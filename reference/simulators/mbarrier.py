"""A pure-Python model of Hopper mbarriers and of the warp-specialised FA3 forward's barrier protocol.

``reference.triton.hopper.flash_gluon``'s ``fwd_ws_persistent_kernel`` (FA3, Shah et al. 2024, section 3.1 and
Algorithm 1's producer/consumer split) synchronises three agents through mbarriers: a producer warp that
TMA-copies K_t and V_t into a ``STAGES``-slot ring, and two consumer warpgroups that multiply them. Each slot
has a "ready" barrier (count 1: the copy engine completes it when the bytes land) and an "empty" barrier
(count 2: both consumers arrive once they no longer read the slot). With ``pingpong`` the consumers also pass a
pair of "turn" barriers (count 1) so that their matmul issues alternate (FA3 section 3.1, "pingpong
scheduling").

The mbarrier semantics modelled (PTX ISA, ``mbarrier.try_wait.parity``): a barrier counts phases ``k = 0, 1, ...``;
``arrive`` lowers the pending count and, at zero, completes phase ``k`` (``k += 1``, count reset). ``wait(P)``
returns once the phase of parity ``P`` has completed, i.e. iff ``k & 1 != P``: a fresh barrier (``k = 0``) lets
``wait(1)`` through at once ("the phase before the first counts as complete") and blocks ``wait(0)``.

``run_pingpong(n_tiles, ...)`` runs the protocol with given phase formulas, round-robin, and returns the trace,
or raises ``ProtocolError`` on a deadlock (every agent blocked), a consumer reading a slot that does not hold its
tile (the producer overwrote it too early), or matmul rounds that do not alternate. Lecture 6 section 10 draws
its trace; the phase formulas below are the kernel's.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class ProtocolError(RuntimeError):
    """The modelled kernel would hang (deadlock) or race (a slot overwritten, turns out of order)."""


@dataclass
class MBarrier:
    name: str
    count: int
    phase: int = 0                 # phases completed so far
    pending: int = field(default=-1)

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"MBarrier {self.name}: count must be >= 1, got {self.count}")
        self.pending = self.count

    def arrive(self) -> bool:
        """One arrival; True when it completes the current phase."""
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count
            return True
        return False

    def passes(self, parity: int) -> bool:
        """``mbarrier.try_wait.parity``: the phase of parity ``parity`` has completed."""
        if parity not in (0, 1):
            raise ValueError(f"parity must be 0 or 1, got {parity!r}")
        return (self.phase & 1) != parity


def ready_phase(t: int, stages: int) -> int:
    """Parity a consumer waits for on slot ``t % stages``'s ready barrier: the ``t // stages``-th fill."""
    return (t // stages) & 1


def empty_phase(t: int, stages: int) -> int:
    """Parity the producer waits for on the empty barrier before the ``t // stages``-th fill of its slot: one less
    than the fill number, so the first pass (fresh barrier, parity 1 "complete") is free."""
    return ((t // stages) & 1) ^ 1


def turn_phase(r: int, wg: int) -> int:
    """Parity consumer ``wg`` waits for on ``turn[wg]`` before its matmul round ``r``. WG 0's round ``r`` follows WG
    1's round ``r - 1`` (round 0 passes a fresh barrier: parity 1); WG 1's round ``r`` follows WG 0's round ``r``."""
    return (r & 1) ^ (1 - wg)


@dataclass
class Event:
    step: int
    agent: str
    action: str                    # "wait", "arrive", "load", "issue", "read"
    barrier: str = ""
    parity: int | None = None
    phase_after: int | None = None
    detail: str = ""


def _producer(n_tiles, stages, bars, slots, empty_phase_fn):
    for t in range(n_tiles):
        s = t % stages
        for kind in ("K", "V"):
            yield ("wait", bars[f"{kind} empty[{s}]"], empty_phase_fn(t, stages))
            slots[(kind, s)] = t
            yield ("load", bars[f"{kind} ready[{s}]"], f"{kind}_{t} -> slot {s}")


def _consumer(wg, n_tiles, stages, bars, slots, turns, ready_phase_fn, turn_phase_fn):
    """FA3 Algorithm 2 per consumer: round 0 issues S_0; round j (1..n-1) issues S_j and P_{j-1}V_{j-1}; round n
    issues the last P V. A K slot is released once S_j retired, a V slot once its P V retired."""
    def turn(r):
        if turns:
            yield ("wait", bars[f"turn[{wg}]"], turn_phase_fn(r, wg))

    def pass_turn():
        if turns:
            yield ("arrive", bars[f"turn[{1 - wg}]"], "")

    for r in range(n_tiles + 1):
        if r < n_tiles:
            yield ("wait", bars[f"K ready[{r % stages}]"], ready_phase_fn(r, stages))
        if r >= 1:
            yield ("wait", bars[f"V ready[{(r - 1) % stages}]"], ready_phase_fn(r - 1, stages))
        yield from turn(r)
        what = ([f"S_{r}"] if r < n_tiles else []) + ([f"P_{r - 1}V_{r - 1}"] if r >= 1 else [])
        if r < n_tiles and slots.get(("K", r % stages)) != r:
            raise ProtocolError(f"WG{wg} reads K slot {r % stages} for tile {r} but it holds tile "
                                f"{slots.get(('K', r % stages))}")
        if r >= 1 and slots.get(("V", (r - 1) % stages)) != r - 1:
            raise ProtocolError(f"WG{wg} reads V slot {(r - 1) % stages} for tile {r - 1} but it holds tile "
                                f"{slots.get(('V', (r - 1) % stages))}")
        yield ("issue", None, f"round {r}: " + " + ".join(what))
        yield from pass_turn()
        if r < n_tiles:
            yield ("arrive", bars[f"K empty[{r % stages}]"], "")
        if r >= 1:
            yield ("arrive", bars[f"V empty[{(r - 1) % stages}]"], "")


def run_pingpong(n_tiles: int = 4, stages: int = 2, turns: bool = True, ready_phase_fn=ready_phase,
                 empty_phase_fn=empty_phase, turn_phase_fn=turn_phase, max_steps: int = 10_000) -> list[Event]:
    """Run producer, WG0 and WG1 over ``n_tiles`` key/value tiles; return the events in the order they happened.

    Scheduling is adversarial in a simple way: agents run round-robin one action at a time, so a consumer that
    could run ahead does. Raises ``ProtocolError`` on a deadlock, an early overwrite or out-of-order turns.
    """
    if not isinstance(n_tiles, int) or n_tiles < 1:
        raise ValueError(f"n_tiles must be a positive int, got {n_tiles!r}")
    if stages not in (1, 2, 3, 4):
        raise ValueError(f"stages must be 1..4, got {stages!r}")
    bars = {}
    for kind in ("K", "V"):
        for s in range(stages):
            bars[f"{kind} ready[{s}]"] = MBarrier(f"{kind} ready[{s}]", 1)
            bars[f"{kind} empty[{s}]"] = MBarrier(f"{kind} empty[{s}]", 2)
    for w in range(2):
        bars[f"turn[{w}]"] = MBarrier(f"turn[{w}]", 1)
    slots: dict = {}
    agents = {"producer": _producer(n_tiles, stages, bars, slots, empty_phase_fn),
              "WG0": _consumer(0, n_tiles, stages, bars, slots, turns, ready_phase_fn, turn_phase_fn),
              "WG1": _consumer(1, n_tiles, stages, bars, slots, turns, ready_phase_fn, turn_phase_fn)}
    pending = {name: next(gen) for name, gen in agents.items()}
    events: list[Event] = []
    issues: list[tuple[str, int]] = []
    step = 0
    while pending:
        progressed = False
        for name in list(pending):
            act = pending[name]
            kind, bar, arg = act
            if kind == "wait":
                if not bar.passes(arg):
                    continue
                events.append(Event(step, name, "wait", bar.name, arg, bar.phase))
            elif kind in ("arrive", "load"):
                bar.arrive()
                events.append(Event(step, name, kind, bar.name, None, bar.phase, arg))
            else:
                events.append(Event(step, name, "issue", detail=arg))
                issues.append((name, int(arg.split()[1].rstrip(":"))))
            step += 1
            progressed = True
            try:
                pending[name] = next(agents[name])
            except StopIteration:
                del pending[name]
            if step > max_steps:
                raise ProtocolError("no end after max_steps actions")
        if not progressed:
            stuck = ", ".join(f"{n} waits on {a[1].name} for parity {a[2]} (phases completed: {a[1].phase})"
                              for n, a in pending.items())
            raise ProtocolError(f"deadlock: {stuck}")
    if turns:
        want = [(f"WG{w}", r) for r in range(n_tiles + 1) for w in (0, 1)]
        if issues != want:
            raise ProtocolError(f"matmul rounds out of turn: {issues[:8]} ... (want WG0 r0, WG1 r0, WG0 r1, ...)")
    return events
