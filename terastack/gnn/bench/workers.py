"""What the GNN benchmarks share: contenders in child processes under an RSS watchdog, and epochs timed
batch by batch.

[Note: contenders in child processes]
A contender whose memory matters (all features in RAM, an ``np.memmap`` whose page cache grows, the
out-of-core run whose peak is claimed) is built in a child process of its own and kept there (started by a fork server, a clean
process that imported torch and PyG once: nothing of the parent's memory or threads is inherited, and a
child does not pay the import again -- each spawned child did, about 6 s of CPU apiece; its peak RSS
counts the imported modules, as a spawned child's did once it had imported them): the parent asks it, through a pipe, to run an
epoch, evaluate or describe itself, one contender at a time, so that the contenders' epochs can take
turns (noise on a shared machine falls on all of them alike) while each one's peak RSS (``VmHWM``) is its
own. A watchdog thread in each child stops it with a message naming the contender when its RSS passes
the limit, before the kernel's OOM killer would decide the result; the parent then reports the child's
exit, naming the contender.

[Note: comparing the same batches]
Epochs are timed batch by batch (the time after each training step, from the epoch's start). A
contender too slow to run a whole epoch (the ``np.memmap`` baseline at scale) runs the first
``warmup + measured`` batches of the same epoch (same seeds, same random streams: the same batches);
both contenders are then compared on batches ``warmup .. warmup + measured - 1`` (its page cache has had
``warmup`` batches to fill), and its epoch is extrapolated from that window's rate, labelled so.

[Note: the np.memmap baselines]
What a user runs instead of terastack is PyG's loader over ``np.memmap`` features. Its speed depends on how
many pages are faulted in at once (terastack.gnn.storage.cache [Note: the mmap baseline's concurrency]): with the
pipeline's one gathering thread the SSD sees one request at a time; with the several loader workers users
start (``NeighborLoader(num_workers=k)``) it sees k. Every count in ``--mmap-threads`` is a contender of its
own (the same pipeline, batches, model and budget; only the gathering threads differ) and
``speedup_vs_mmap`` is against the fastest of them, the strongest form of the alternative; each one's figure
is reported beside it (``speedup_vs_mmap_by_threads``). The default, ``1,32``: one thread is the pipeline's
own; 32 was the fastest of 8, 16, 32 and 64 on a 2-core VM whose disk does 79k random 4 KiB reads/s
(docs/gnn.md, "The np.memmap baselines", has the sweep). The page cache of the features is held to the
budget in every one of them (terastack.gnn.storage.cache [Note: the mmap baseline's memory budget]).

The same window is also run with the training step left out, for terastack and every mmap contender alike
(``loader_*`` keys): the epoch of a user whose accelerator trains a batch faster than the loader delivers one.
On a CPU-only machine the training step can hide the loader's time (a step slower than either loader makes
every contender's epoch the step's): the training figure is then at most the loader figure, and the two
bracket what an accelerator's user would see.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import time
import traceback

import numpy as np

from terastack.bench_watchdog import EXIT_STATUS, RssWatchdog
from terastack.memory import peak_rss


def _serve(conn, factory: str, config: dict, rss_limit: int, name: str) -> None:
    """The child's loop: build the contender, then answer (method, kwargs) requests until told to stop."""
    with RssWatchdog(RssWatchdog.Config(limit_bytes=rss_limit, interval_s=0.2, include_self=True, on_exceed="exit",
                                        label=f"contender {name!r}")) as watchdog:
        try:
            module, _, func = factory.partition(":")
            obj = getattr(importlib.import_module(module), func)(**config)
            conn.send(("ok", {"peak_rss_bytes": peak_rss()}))
        except BaseException:  # noqa: BLE001 - reported to the parent
            conn.send(("error", traceback.format_exc()))
            return
        while True:
            request = conn.recv()
            if request is None:
                break
            method, kwargs = request
            try:
                result = getattr(obj, method)(**kwargs)
                conn.send(("ok", {**result, "peak_rss_bytes": peak_rss(), "max_sampled_rss_bytes":
                                  watchdog.max_sampled}))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
        close = getattr(obj, "close", None)
        if close is not None:
            close()


#: what the fork server imports before it forks a contender (every contender needs them)
PRELOAD = ["torch", "torch_geometric", "terastack.gnn.bench.hetero", "terastack.gnn.bench.scale"]


def _context():
    """The fork server of [Note: contenders in child processes] (started with the first contender)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_fork_server() -> None:
    """Start the fork server now, so that its imports (seconds of CPU) overlap work that is not timed, such as a
    dataset's generation, instead of delaying the first contender."""
    _context()
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _nothing() -> None:
    pass


def fork_server_ready() -> None:
    """Return once the fork server has finished its imports (it forks a first child only then), so that its CPU
    is not spent beside an epoch being timed."""
    child = _context().Process(target=_nothing, name="terastack-fork-server-ready", daemon=True)
    child.start()
    child.join()


class Contender:
    """A contender built by ``factory`` (``"module:function"``, called with ``config``) in a child process;
    see [Note: contenders in child processes]. ``call(method, **kwargs)`` returns the method's dict plus the
    child's ``peak_rss_bytes``."""

    def __init__(self, name: str, factory: str, config: dict, *, rss_limit: int, timeout_s: float = 3600.0):
        self.name, self.timeout_s = name, timeout_s
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, factory, config, rss_limit, name),
                                   name=f"terastack-bench-{name}", daemon=True)
        self.process.start()
        child.close()
        self.setup = self._answer("setting up")

    def _ended(self, what: str) -> RuntimeError:
        self.process.join(timeout=10)
        code = self.process.exitcode
        why = " (its RSS passed --rss-limit)" if code == EXIT_STATUS else ""
        return RuntimeError(f"contender {self.name!r}: its process ended with exit code {code} while {what}{why}")

    def _answer(self, what: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while not self._conn.poll(0.2):
            if not self.process.is_alive():
                raise self._ended(what)
            if time.monotonic() > deadline:
                raise TimeoutError(f"contender {self.name!r}: no answer after {self.timeout_s:g} s while {what}")
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):  # the pipe closed: the child is gone
            raise self._ended(what) from None
        if status != "ok":
            raise RuntimeError(f"contender {self.name!r} failed while {what}:\n{value}")
        return value

    def call(self, method: str, **kwargs) -> dict:
        try:
            self._conn.send((method, kwargs))
        except OSError:  # the child is gone: _answer says how it ended
            pass
        return self._answer(method)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        self._conn.close()

    def __enter__(self) -> "Contender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def window_seconds(marks: list[float], start: int, count: int) -> float:
    """Seconds that batches ``start .. start + count - 1`` took (from the end of batch ``start - 1``)."""
    end = min(len(marks), start + count)
    if end <= start:
        raise ValueError(f"window: batches {start}..{start + count - 1} were not run ({len(marks)} were)")
    return marks[end - 1] - (marks[start - 1] if start else 0.0)


def measure_window(total_batches: int, warmup: int, measured: int) -> tuple[int, int]:
    """(first batch, batch count) compared between two contenders, fitted to an epoch of ``total_batches``:
    when the epoch is shorter than ``warmup + measured``, half of it warms up and the rest is measured."""
    if warmup < 0 or measured < 1:
        raise ValueError(f"warmup, measured: need warmup >= 0 and measured >= 1, got {warmup}, {measured}")
    if warmup + measured <= total_batches:
        return warmup, measured
    start = min(warmup, total_batches // 2)
    return start, max(1, total_batches - start)


def parse_mmap_threads(text: str | None) -> list[int]:
    """``--mmap-threads`` ("1,32"): the gathering threads of each np.memmap contender, distinct, in order."""
    try:
        counts = [int(x) for x in (text or "1,32").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"mmap_threads: a comma-separated list of thread counts, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"mmap_threads: every count must be >= 1, got {text!r}")
    return list(dict.fromkeys(counts))


def mmap_name(threads: int) -> str:
    """The contender's name: ``mmap`` for the pipeline's one gathering thread, ``mmap_<k>_threads`` otherwise."""
    return "mmap" if threads == 1 else f"mmap_{threads}_threads"


def skip_step(model, optimizer, data) -> float:
    """The training step left out: the loader's own epoch ([Note: the np.memmap baselines])."""
    return 0.0


def drop_mapped_pages(array) -> None:
    """Give back the resident pages of a memory-mapped array and drop its file's page cache (a cold start
    for an ``np.memmap`` contender whose file the dataset's checks have just streamed)."""
    import mmap

    mapping = getattr(array, "_mmap", None)
    if mapping is None or not getattr(array, "filename", None):
        return
    mapping.madvise(mmap.MADV_DONTNEED)
    fd = os.open(array.filename, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_epoch(pipeline, model, optimizer, ids: np.ndarray, *, batch_size: int, epoch: int, step,
              limit: int = 0) -> dict:
    """One epoch (its first ``limit`` batches) timed batch by batch (terastack.gnn.training.train.train_epoch; see
    [Note: comparing the same batches]): ``seconds`` to the last step, and what the epoch read."""
    from terastack.gnn.training.train import train_epoch

    r = train_epoch(pipeline, model, optimizer, ids, batch_size=batch_size, epoch=epoch, limit=limit, step=step,
                    progress=False)
    return {**r, "seconds": r["marks"][-1] if r["marks"] else 0.0,
            "feature_hit_rate": r["device_hit_rate"] + r["host_hit_rate"],
            "rows_per_batch": r["rows_gathered"] / max(r["batches"], 1), "feature_ssd_bytes": r["ssd_bytes"]}


def bench_dir(args, name: str):
    """Where a benchmark's generated dataset lives: ``--dir``, else ``$TERASTACK_CACHE/<name>`` (default
    ``~/.cache/terastack/<name>``)."""
    from pathlib import Path

    if args.dir:
        return Path(args.dir)
    base = os.environ.get("TERASTACK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "terastack")
    return Path(base) / name


def generate_or_replace(generator, config: dict, *, fresh: bool = False) -> dict:
    """Run ``generator`` (a generator class) with ``config``; the benchmark's own dataset directory, made for
    other parameters, is replaced."""
    from terastack.gnn.storage.dataset import DatasetError

    try:
        return generator(generator.Config(force=fresh, **config)).run()
    except DatasetError as exc:
        if "other parameters" not in str(exc):
            raise
        return generator(generator.Config(force=True, **config)).run()


class GraphContender:
    """A benchmark contender of either graph kind, built in its child process ([Note: contenders in child
    processes]): the dataset opened with the topology its ``kind`` calls for (``terastack``: on the SSD;
    ``in_memory_pipelined``: in memory; ``mmap``: mapped), placed by the one placement call (only the feature
    source differs: the unified cache, every row in memory, an ``np.memmap`` held to ``budget``), and the model
    of the dataset's kind from the same initial weights. ``train_nodes`` > 0: the first that many training seeds."""

    TOPOLOGY = {"terastack": "ssd", "in_memory_pipelined": "memory", "mmap": "mmap"}
    FEATURES = {"terastack": "cache", "in_memory_pipelined": "memory", "mmap": "mmap"}

    def __init__(self, *, kind: str, root: str, model: str, fanouts, hidden: int, lr: float, seed: int,
                 batch_size: int, budget: int, threads: int, indptr: str = "auto", mmap_threads: int = 1,
                 train_nodes: int = 0):
        import torch

        from terastack.gnn.graph_placement import Placement
        from terastack.gnn.settings import gnn_job
        from terastack.gnn.storage.dataset import open_dataset
        from terastack.gnn.training.train import build_model

        if threads:
            torch.set_num_threads(threads)
        self.kind, self.batch_size, self.seed = kind, batch_size, seed
        ds = self.ds = open_dataset(root, topology=self.TOPOLOGY[kind], indptr=indptr, topology_budget=budget)
        self.train_ids, self.test_ids = ds.splits["train"][:train_nodes or None], ds.splits["test"]
        if kind == "mmap":
            for topo in ds.topologies.values():  # the dataset's checks streamed them: start cold
                drop_mapped_pages(topo.indptr)
                drop_mapped_pages(topo.indices)
        self.placed = Placement(ds, fanouts=fanouts, seed=seed, batch_size=batch_size, presample_epochs=1,
                                host_cache=budget, device="cpu", mmap_threads=mmap_threads,
                                seeds=self.presample_seeds(), features=self.FEATURES[kind])
        self.sampler, self.features, self.pipeline = self.placed.sampler, self.placed.features, self.placed.pipeline
        self.model = build_model(gnn_job(model=model, hidden=hidden, seed=seed), ds, self.sampler.hops)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)

    def presample_seeds(self):
        """The seeds the caches are placed from (None: the training seeds)."""
        return None

    def run(self, *, epoch: int, limit: int = 0, train: bool = True) -> dict:
        """One epoch (its first ``limit`` batches); ``train=False`` leaves the step out (the loader alone)."""
        from terastack.gnn.training.models import train_step

        r = run_epoch(self.pipeline, self.model, self.opt, self.train_ids, batch_size=self.batch_size, epoch=epoch,
                      step=train_step if train else skip_step, limit=limit)
        return {**r, "evicted_pages": sum(getattr(s, "evicted_pages", 0) for s in self.features.sources.values())}

    def accuracy(self) -> dict:
        from terastack.gnn.training.train import evaluate

        if not len(self.test_ids):
            return {"test_acc": None}
        return {"test_acc": evaluate(self.pipeline, self.model, self.test_ids, batch_size=self.batch_size)}

    def describe(self) -> dict:
        return {"info": getattr(self, "info", {}), "cache": self.features.describe(),
                "topology": self.sampler.topology.describe()}

    def close(self) -> None:
        self.placed.close()
        self.ds.close()
