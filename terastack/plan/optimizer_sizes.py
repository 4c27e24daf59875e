"""How much host memory the optimizer works in, and what a smaller window costs the step.

[Note: the optimizer's window]
The optimizer holds host memory for its own work: the gradient pool, the state
being read ahead and updated, the state on its way back to the SSD, whole
fp32 masters. The more of it, the less room for state that rests in host
memory -- but the less of it, the more of the step waits for the disk. With
updates inline on the training thread (a CPU machine) a unit's update reads
its state while compute waits, except what was read ahead during the unit's
backward: the window (``read_ahead``) bounds that, and the write-back
allowance bounds what can still be on its way when the next unit starts. So
the planner does not pick one size; it scores a few, largest first:

* ``unit``: the largest unit's whole state each way (nothing waits);
* ``layer``: the typical (median) unit's, so a decoder layer's update waits
  for nothing and only larger units (embeddings, heads) stream the rest;
* ``stream``: a fixed window (:data:`STREAM_WINDOW`) each way, large requests
  in flight while the update streams through its unit;
* ``lean stream``: the stream window with the rest lean (one unit's masters
  handed over at a time, no slack in the gradient pool); and the same
  holding no unit's masters, which the optimizer then reads again;
* ``lean``: two small chunks (:data:`LEAN_CHUNK`), one chunk read, updated
  and written at a time, taking one unit's masters from backward; and, the
  least memory, the same holding none of them.

and charges each the seconds its window leaves exposed
(:func:`exposed_state_io_s`): per unit, the state beyond the window read while
compute waits, and beyond the write-back allowance written while it waits;
and the training thread's own work per request (:data:`STATE_REQUEST_CPU_S`):
the update reads its state a window at a time and writes it an allowance at a
time, so a small window issues many more requests for the same bytes.
With the optimizer on its own thread (an accelerator) updates run beside
compute, one chunk read ahead; there are two sizes, full and lean.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from terastack.plan.llm_profile import ModelProfile, chunked_bytes, gradients_in_flight, held_bytes
from terastack.plan.optimizer_formats import ADAMW, OptimizerFormat
from terastack.plan.schedule_specs import ScheduleSpec
from terastack.tier import Tier

#: elements per optimizer chunk at most when the host budget is too small for the configured chunks
LEAN_CHUNK = 256 << 10
#: the ``stream`` window: bytes read ahead (and, again, bytes being written back) by an inline update
STREAM_WINDOW = 128 << 20
#: CPU seconds the training thread spends per state request an inline update issues, beyond the disk's time
#: (submitting it, its completion, waking the update): measured from the traces of two 3.4B steps on the 2-core
#: bench VM, a 4 MiB window against the 128 MiB one in the same run: 12.6k more requests (14.0k reads and 13.8k
#: writes against 1.4k and 1.1k), 11.5 s more of the step at fewer bytes (benchmarks/llm-scale-3b-window_2core-
#: epyc_2026-12-01.md). The probe does not measure it yet.
STATE_REQUEST_CPU_S = 4.3e-4


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerSizes:
    """Host memory the optimizer side holds for its own work, and the chunk it works in."""

    kind: str            # unit, layer, stream, lean stream, full or lean ([Note: the optimizer's window])
    grad_pool: int       # gradients in flight from backward to the optimizer
    read_ahead: int      # state chunks being updated or read ahead (inline: the window)
    writeback: int       # updated state chunks in flight back to the SSD
    masters: int         # whole fp32 masters held: handed over by backward, read, being updated or written
    chunk: int           # elements per optimizer chunk
    accumulate: int = 0  # gradient sums on the SSD being added to or written back (gradient accumulation)
    gather: int = 0      # a whole-matrix update's gather beyond the above (whole_gather_bytes)

    @property
    def host_bytes(self) -> int:
        """Host bytes all of the above take: the part of the host ledger that no resting state can use."""
        return self.grad_pool + self.read_ahead + self.writeback + self.masters + self.accumulate + self.gather


def completed_by_unit(profile: ModelProfile) -> list[list[str]]:
    """Per unit (forward order): the trainable tensors whose update it completes -- those it is the first user
    of in forward order (a tied embedding belongs to one unit)."""
    seen: set[str] = set()
    out = []
    for u in profile.units:
        mine = [t for t in dict.fromkeys(u.tensors) if profile.tensor_trainable[t] and t not in seen]
        seen.update(mine)
        out.append(mine)
    return out


def largest_trainable(profile: ModelProfile) -> int:
    """Elements of the largest trainable tensor: what the optimizer's chunks, masters and rebuilt compute copies
    are sized by. A frozen tensor has no optimizer records (under LoRA a 128k-row embedding or output head is
    frozen and would otherwise size a working set thirty times the adapters' whole state)."""
    return max((n for t, n in profile.tensor_numel.items() if profile.tensor_trainable[t]), default=1)


def tensor_state_bytes(profile: ModelProfile, schedule: ScheduleSpec, name: str, chunk: int,
                       fmt: OptimizerFormat = ADAMW) -> int:
    """Bytes of the optimizer records of trainable ``name``'s update: the format's state
    ([Note: optimizer state formats]) and the schedule's fp32 chunks besides it (the master chunk in mixed
    precision, a spilled gradient chunk)."""
    fp32_chunks = schedule.records_per_chunk(profile.mixed_precision) - 2  # less the two moments AdamW has
    return (fp32_chunks * chunked_bytes(profile.tensor_numel[name], 4, fmt.chunk_elements(chunk))
            + fmt.held_bytes(profile.shape(name), chunk, full_width=profile.full_width_state(name)))


def unit_state_bytes(profile: ModelProfile, schedule: ScheduleSpec, chunk: int,
                     fmt: OptimizerFormat = ADAMW) -> list[int]:
    """Per unit (forward order): bytes of the optimizer records of the tensors whose update it completes."""
    return [sum(tensor_state_bytes(profile, schedule, t, chunk, fmt) for t in mine)
            for mine in completed_by_unit(profile)]


def whole_gather_bytes(profile: ModelProfile, schedule: ScheduleSpec, chunk: int,
                       fmt: OptimizerFormat = ADAMW) -> int:
    """Host bytes the largest whole-matrix update of a format that updates parameters whole holds beyond the
    masters allowance (which holds an fp32 master being updated): the format's own count
    (``OptimizerFormat.gather_bytes``, the one the engine refuses a run by) of its state, master chunks, spilled
    gradient and the copies they are joined into. 0 for formats that update chunk by chunk."""
    if not fmt.whole_tensor:
        return 0
    mixed = profile.mixed_precision
    shapes = {profile.shape(t) for t, trains in profile.tensor_trainable.items() if trains}
    return max((fmt.gather_bytes(s, chunk, master_is_compute=not mixed, gradient_spilled=not schedule.backpressure)
                - (0 if mixed else held_bytes(4 * math.prod(s))) for s in shapes), default=0)


def size_candidates(profile: ModelProfile, schedule: ScheduleSpec, *, inline: bool, chunk: int,
                    passes: int, fmt: OptimizerFormat = ADAMW) -> list[OptimizerSizes]:
    """The sizes the planner scores, largest first ([Note: the optimizer's window])."""
    mixed = profile.mixed_precision
    largest = largest_trainable(profile)
    fp32_chunks = schedule.records_per_chunk(mixed) - 2  # the format's state counted apart
    # the shapes a chunk of state may belong to (the largest tensor's too: a chunk is sized by it)
    shapes = {(profile.shape(t), profile.full_width_state(t)) for t, trains in profile.tensor_trainable.items()
              if trains} | {((largest,), False)}
    unit_masters = [sum(held_bytes(profile.tensor_numel[t] * 4) for t in u.tensors if profile.tensor_trainable[t])
                    for u in profile.units]

    def sizes(kind: str, *, lean: bool, window: int | None = None, hand_over_one: bool = False) -> OptimizerSizes:
        c = fmt.chunk_elements(min(chunk, LEAN_CHUNK) if lean else chunk)
        chunk_held = min(c, largest)
        job = fp32_chunks * held_bytes(chunk_held * 4) + max(
            fmt.chunk_held_bytes(s, min(chunk_held, math.prod(s)), full_width=wide) for s, wide in shapes)
        read_ahead = 2 * job  # the chunk being updated and the one read ahead
        writeback = job if lean else read_ahead
        if window is not None:
            read_ahead = writeback = max(read_ahead, window)
        masters = 0
        if mixed:
            read_ahead += largest * profile.compute_bytes  # the compute copy rebuilt from the new master
        else:
            # [Note: optimizer chunks]: an fp32 master is one whole record: one read (or handed over) and updated
            # at a time, plus, when not lean, those backward hands over before the optimizer gets to them
            masters = held_bytes(4 * largest)
            if not lean:
                masters = schedule.masters_held(masters, unit_masters, inline=inline)
            elif hand_over_one and schedule.hands_off_masters:  # one unit's masters handed over at a time
                masters = (max([masters, *unit_masters]) if inline  # the update then reads none of them
                           else masters + max(unit_masters, default=0))
        # a format that updates chunk by chunk joins a group's chunks into runs of at most its scratch bound, and a
        # group is at most the window's chunks; one that updates parameters whole gathers the largest
        gather = (whole_gather_bytes(profile, schedule, c, fmt) if fmt.whole_tensor
                  else min(fmt.scratch_bound(), read_ahead))
        # gradient accumulation: a sum on the SSD is read, added to and written back a chunk at a time
        accumulate = 2 * held_bytes(chunk_held * 4) if passes > 1 else 0
        return OptimizerSizes(kind=kind, grad_pool=gradients_in_flight(profile, slack=not lean),
                              read_ahead=read_ahead, writeback=writeback, masters=masters, chunk=c,
                              accumulate=accumulate, gather=gather)

    if not inline:
        return [sizes("full", lean=False), sizes("lean", lean=True)]
    per_unit = [s for s in unit_state_bytes(profile, schedule, chunk, fmt) if s]
    whole = max(per_unit, default=0)
    stream = min(STREAM_WINDOW, whole)  # (a window larger than every unit holds nothing more)
    windows = {"unit": whole, "layer": int(statistics.median(per_unit)) if per_unit else 0, "stream": stream}
    out, last = [], None
    for kind, window in sorted(windows.items(), key=lambda kv: -kv[1]):
        if last is None or window < last:  # equal windows are one candidate
            out.append(sizes(kind, lean=False, window=window))
            last = window
    # the lean settings (one master, no slack in the pool, small chunks) with the stream window -- taking one
    # unit's masters from backward, or taking none and reading them again (``masters_reread`` prices that: at
    # the largest sizes the unit's masters do not fit beside the window, and re-reading them costs the step less
    # than a window too small to hide the state's reads) --
    # then the same without the window
    out += [sizes("lean stream", lean=True, window=stream, hand_over_one=True),
            sizes("lean stream, masters re-read", lean=True, window=stream),
            sizes("lean", lean=True, hand_over_one=True),
            sizes("lean, masters re-read", lean=True)]
    # inline, a unit no larger than the largest master is handed over in the room kept for reading one: then
    # the two lean settings of a window are one candidate
    seen: set = set()
    return [s for s in out if _same_sizes(s) not in seen and not seen.add(_same_sizes(s))]


def _same_sizes(s: OptimizerSizes) -> tuple:
    return (s.grad_pool, s.read_ahead, s.writeback, s.masters, s.chunk, s.accumulate, s.gather)


def exposed_state_io_s(profile: ModelProfile, schedule: ScheduleSpec, sizes: OptimizerSizes, state_home: dict,
                       *, read_bw: float, write_bw: float, fmt: OptimizerFormat = ADAMW) -> float:
    """Seconds the state's SSD traffic costs an inline update per step with these sizes: per unit, its state on
    the SSD beyond the read-ahead window (read while compute waits) and beyond the write-back allowance (written
    while it waits), and the training thread's work for each request (a window read, an allowance written). See
    [Note: the optimizer's window]."""
    read = write = requests = 0
    for mine in completed_by_unit(profile):
        on_ssd = sum(tensor_state_bytes(profile, schedule, t, sizes.chunk, fmt) for t in mine
                     if state_home.get(t) is Tier.SSD)
        read += max(0, on_ssd - sizes.read_ahead)
        write += max(0, on_ssd - sizes.writeback)
        requests += -(-on_ssd // max(sizes.read_ahead, 1)) + -(-on_ssd // max(sizes.writeback, 1))
    return read / read_bw + write / write_bw + requests * STATE_REQUEST_CPU_S


def masters_reread(profile: ModelProfile, schedule: ScheduleSpec, sizes: OptimizerSizes, state_home: dict, *,
                   inline: bool = False) -> int:
    """Bytes of fp32 masters the optimizer reads again per step because backward could not hand them over: a
    unit's masters (of tensors resting on the SSD) beyond what the masters allowance holds besides the one
    being updated (the engine's hand-over rule, ``OptimizerState.hand_over``; inline, a unit's masters that
    all fit the whole allowance are all handed over). 0 in mixed precision (the optimizer reads its master
    chunks anyway, counted with the state) and for schedules that hand nothing over (they read every master,
    counted with the state too)."""
    if profile.mixed_precision or not schedule.hands_off_masters:
        return 0
    room = sizes.masters - held_bytes(4 * largest_trainable(profile))
    out = 0
    for mine in completed_by_unit(profile):
        if inline and sum(held_bytes(4 * profile.tensor_numel[t]) for t in mine) <= sizes.masters:
            continue
        held = 0
        for t in mine:  # handed over in turn while they fit, as backward does
            nbytes = held_bytes(4 * profile.tensor_numel[t])
            if held + nbytes <= room:
                held += nbytes
            elif state_home.get(t) is Tier.SSD:
                out += nbytes
    return out
