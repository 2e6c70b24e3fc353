"""Model of the wgmma prototype's barrier protocol (bench/wgmma_gemm_proto.cu), run under random schedules on the CPU.

The prototype's variants differ in who writes the B stages: the producer warpgroup (full-tma), the consumer
warpgroups between their wgmma commit and wait_group (cdec-tma, cdec-l2-tma), or both (cdec-half-tma). This model
restates each role's sequence of mbarrier operations, shared-memory writes and wgmma issues / retirements, as in the
kernel's source, and runs it under random interleavings. It reports

- a deadlock (no role can move and some have not finished),
- a write into an A or B slot while a wgmma that reads the slot is still pending in either consumer warpgroup
  (write after read: the wgmma would read the next stage's data),
- a wgmma issued on a slot whose parts do not all hold its stage (read before write),
- an arrival on a barrier whose current phase is not the arriving stage's phase (it would count toward the wrong
  stage), and a parity wait whose phase is not the barrier's current or last completed one: two phases past it, or
  one phase ahead of the current one (either way the parity would alias).

Schedules are random but biased per run: every role and every asynchronous event source gets a speed drawn from a
wide log-uniform range, so that in many runs one warpgroup's wgmmas stay pending for long stretches while the others
race ahead (a uniform choice among the enabled moves retires pending work too soon to expose a slot hazard).

mbarrier semantics (PTX ISA, "mbarrier"): a phase completes when its pending arrival count and its transaction count
both reach zero; try_wait.parity(p) succeeds once the phase with parity p has completed, i.e. while the current phase's
parity differs from p. TMA and wgmma completions are asynchronous events: TMA may land any time after its issue, a
warpgroup's wgmma groups complete in issue order, each any time after its issue (wgmma.wait_group N blocks until at
most N of the warpgroup's groups are pending).

The roles are coarse on purpose: a warpgroup arrives with all its threads at once, as its threads execute the
arrive after the same warp-uniform control flow. What the model does not cover: the proxy fence (assumed placed
before each arrive, as in the kernel), memory ordering inside a role, warp granularity (each warp of a warpgroup
writes its own tile row and arrives by itself; the model moves a warpgroup as one actor), a consumer warpgroup
without rows (it decodes and arrives but issues no wgmma, so it only releases slots sooner), ldg-tma, the serial
variant, P = 2, 3, and the split-k / epilogue code. The arrival counts and the order of waits and arrives are
restated from the kernel's source, not derived from it: a change there needs the same change here.
"""
from __future__ import annotations

import dataclasses
import random

STAGES = 4  # A / B ring (kStages)
AHEAD = 2   # producers' load distance (kAhead)


@dataclasses.dataclass(frozen=True)
class Variant:
    """Who decodes: `producers` (the producer warpgroup decodes its share), `ctiles` > 0 (the consumers decode their
    share, `dist` stages ahead of their wgmmas). `consumer_empty_wait` False is a mutant: the decoding consumers
    skip the empty wait of the slot they decode into."""

    producers: bool
    ctiles: int = 0
    dist: int = 1
    consumer_empty_wait: bool = True
    wait_group: int = 1  # mutant when 2: the consumers release stage s - 1 with two wgmma groups still pending


FULL_TMA = Variant(producers=True)
CDEC = Variant(producers=False, ctiles=4, dist=1)
CDEC_L2 = Variant(producers=False, ctiles=4, dist=2)
CDEC_HALF = Variant(producers=True, ctiles=2, dist=1)


class ProtocolError(AssertionError):
    pass


class Barrier:
    def __init__(self, name: str, count: int):
        self.name, self.count = name, count
        self.pending, self.tx, self.done = count, 0, 0  # done = completed phases

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.done += 1
            self.pending = self.count

    def arrive(self, n: int, phase: int, who: str, tx: int = 0):
        if self.done != phase:
            raise ProtocolError(f"{who}: arrival on {self.name} for phase {phase} while its current phase is {self.done}")
        if n > self.pending:
            raise ProtocolError(f"{who}: {n} arrivals on {self.name} with {self.pending} pending")
        self.pending -= n
        self.tx += tx
        self._maybe_complete()

    def complete_tx(self, tx: int, phase: int, who: str):
        if self.done != phase:
            raise ProtocolError(f"{who}: transaction bytes on {self.name} for phase {phase}, current {self.done}")
        self.tx -= tx
        self._maybe_complete()

    def ready(self, phase: int, who: str) -> bool:
        """try_wait.parity(phase & 1) for a wait on `phase`."""
        if self.done > phase + 1:
            raise ProtocolError(f"{who}: parity wait on {self.name} phase {phase}, already {self.done} phases done")
        if self.done < phase:
            raise ProtocolError(f"{who}: parity wait on {self.name} phase {phase} while phase {self.done} is current")
        return (self.done & 1) != (phase & 1)


class Model:
    def __init__(self, v: Variant, ns: int, rng: random.Random):
        self.v, self.ns, self.rng = v, ns, rng
        arrivals = 1 + (128 if v.producers else 0) + (256 if v.ctiles else 0)
        self.full = [Barrier(f"full[{i}]", arrivals) for i in range(STAGES)]
        self.empty = [Barrier(f"empty[{i}]", 256) for i in range(STAGES)]
        # Content of each slot: A (TMA) and the B parts ("p" producers, "c0" / "c1" consumer warpgroups).
        self.parts = ["a"] + (["p"] if v.producers else []) + (["c0", "c1"] if v.ctiles else [])
        self.slot = [{q: None for q in self.parts} for _ in range(STAGES)]
        self.pending_reads: list[list[int]] = [[], []]  # per consumer WG: stages of issued, unretired wgmma groups
        self.tma_inflight: list[int] = []

    # -- shared-memory effects
    def write(self, stage: int, part: str, who: str):
        sl = stage % STAGES
        for c in (0, 1):
            for r in self.pending_reads[c]:
                if r % STAGES == sl:
                    raise ProtocolError(f"{who}: writes {part} of slot {sl} (stage {stage}) while WG{c}'s wgmma of "
                                        f"stage {r} reads it")
        self.slot[sl][part] = stage

    def issue_wgmma(self, c: int, s: int):
        sl = s % STAGES
        bad = {q: st for q, st in self.slot[sl].items() if st != s}
        if bad:
            raise ProtocolError(f"WG{c}: wgmma of stage {s} on slot {sl} holding {bad}")
        self.pending_reads[c].append(s)

    # -- roles (generators: yield a predicate that must hold before the role continues)
    def tma_issue(self, s: int, who: str):
        bar = self.full[s % STAGES]
        bar.arrive(1, s // STAGES, who, tx=1)
        self.tma_inflight.append(s)

    def producer(self):
        v, ns = self.v, self.ns
        who = "producer"
        if not v.producers:  # cdec: one thread issues A as soon as the slot is free (mma-tma's loop)
            for s in range(ns):
                u = s - STAGES
                if u >= 0:
                    yield lambda u=u: self.empty[u % STAGES].ready(u // STAGES, who)
                self.tma_issue(s, who)
            return
        for s in range(min(AHEAD, ns)):
            self.tma_issue(s, who)
        for s in range(ns):
            sl = s + AHEAD
            if sl < ns:
                u = sl - STAGES
                if u >= 0:
                    yield lambda u=u: self.empty[u % STAGES].ready(u // STAGES, who)
                self.tma_issue(sl, who)
            yield lambda: True  # the decode itself: any interleaving
            self.write(s, "p", who)
            self.full[s % STAGES].arrive(128, s // STAGES, who)

    def consumer(self, c: int):
        v, ns, L = self.v, self.ns, self.v.dist
        who = f"WG{c}"
        part = f"c{c}"
        if v.ctiles:
            for d in range(min(L, ns)):
                self.write(d, part, who)
                self.full[d % STAGES].arrive(128, d // STAGES, who)
        for s in range(ns):
            yield lambda s=s: self.full[s % STAGES].ready(s // STAGES, who)
            if v.ctiles and v.consumer_empty_wait:
                u = s + L - STAGES
                if s + L < ns and u >= 0:
                    yield lambda u=u: self.empty[u % STAGES].ready(u // STAGES, who)
            self.issue_wgmma(c, s)
            if v.ctiles and s + L < ns:
                yield lambda: True  # the decode, while the wgmmas run
                d = s + L
                self.write(d, part, who)
                self.full[d % STAGES].arrive(128, d // STAGES, who)
            yield lambda: len(self.pending_reads[c]) <= v.wait_group  # wgmma.wait_group 1
            if s > 0:
                self.empty[(s - 1) % STAGES].arrive(128, (s - 1) // STAGES, who)
        yield lambda: not self.pending_reads[c]  # wait_group 0 before the epilogue

    def run(self, max_steps: int = 100000):
        roles = {"producer": self.producer(), "WG0": self.consumer(0), "WG1": self.consumer(1)}
        waiting: dict[str, object] = {}
        for name, g in list(roles.items()):  # start each role up to its first wait
            try:
                waiting[name] = next(g)
            except StopIteration:
                del roles[name]
        # Per-run speeds (log-uniform over 1e-3 .. 1): the relative rate of each role and event source.
        speed = {k: 10 ** self.rng.uniform(-3, 0) for k in ("producer", "WG0", "WG1", "tma", "wgmma0", "wgmma1")}
        for _ in range(max_steps):
            moves = [("role", n) for n in roles if waiting[n]()]
            moves += [("tma", i) for i in range(len(self.tma_inflight))]
            moves += [("wgmma", c) for c in (0, 1) if self.pending_reads[c]]
            if not moves:
                if roles:
                    raise ProtocolError(f"deadlock: {sorted(roles)} blocked (full done "
                                        f"{[b.done for b in self.full]}, empty done {[b.done for b in self.empty]})")
                return
            weights = [speed[x] if k == "role" else speed["tma"] if k == "tma" else speed[f"wgmma{x}"]
                       for k, x in moves]
            kind, x = self.rng.choices(moves, weights)[0]
            if kind == "tma":
                s = self.tma_inflight.pop(x)
                self.write(s, "a", "TMA")
                self.full[s % STAGES].complete_tx(1, s // STAGES, "TMA")
            elif kind == "wgmma":
                self.pending_reads[x].pop(0)  # groups complete in issue order
            else:
                try:
                    waiting[x] = next(roles[x])
                except StopIteration:
                    del roles[x]
        raise ProtocolError("step limit")


def check(v: Variant, ns: int, seeds: int, seed0: int = 0) -> None:
    """Run `seeds` random schedules of `ns` stages; raises ProtocolError on the first violation."""
    for sd in range(seed0, seed0 + seeds):
        Model(v, ns, random.Random(sd)).run()


if __name__ == "__main__":
    for name, v in (("full-tma", FULL_TMA), ("cdec-tma", CDEC), ("cdec-l2-tma", CDEC_L2), ("cdec-half-tma", CDEC_HALF)):
        for ns in (1, 2, 3, 5, 9, 17):
            check(v, ns, 200)
        print(f"{name}: 1200 schedules, no violation")
