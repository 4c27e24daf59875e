"""The reference training loop of ``terastack bench gnn`` (PyG's own: sample, fetch features, train, one batch at
a time, no pipeline) and the one model every contender starts from."""
from __future__ import annotations

import time

import torch

from terastack.gnn.sampling.sampler import epoch_batches
from terastack.gnn.storage.cache import resolve_device
from terastack.gnn.training.models import GNN, train_step
from terastack.gnn.sampling.fanouts import parse_fanouts


def plain_epoch(sampler, source, labels, model, optimizer, train_ids, *, batch_size: int, epoch: int,
                 progress: bool, label: str) -> dict:
    """The reference PyG training loop (no pipeline): sample, fetch features, train; one batch at a time."""
    from terastack.progress import Progress

    y_all = torch.from_numpy(labels).long()
    batches = epoch_batches(train_ids, batch_size, seed=sampler.config.seed, epoch=epoch)
    bar = Progress(len(batches), label=f"{label} epoch {epoch}", unit="batches", enabled=progress)
    source.new_epoch()
    losses = []
    sampling = gathering = 0.0
    started = time.perf_counter()
    for k, seeds in enumerate(batches):
        t0 = time.perf_counter()
        batch = sampler.sample(seeds, sampler.batch_rng(epoch, k), index=k, epoch=epoch)
        n_id = torch.from_numpy(batch.n_id)
        t1 = time.perf_counter()
        x = source.gather(batch.n_id, torch.empty(len(n_id), source.row_len, dtype=source.torch_dtype))
        t2 = time.perf_counter()
        losses.append(train_step(model, optimizer, on_model(model, batch.to_data(x, y_all[n_id]))))
        sampling, gathering = sampling + t1 - t0, gathering + t2 - t1
        bar.update(1, loss=losses[-1])
    bar.close()
    return {"epoch": epoch, "seconds": time.perf_counter() - started, "losses": losses,
            "sample_seconds": sampling, "gather_seconds": gathering}


def bench_device() -> torch.device:
    """Where every contender's model and batches live: the device the pipelines and the cache resolve "auto"
    to (a GPU when there is one), so that no contender mixes a CPU model with CUDA batches."""
    return resolve_device("auto")


def bench_model(args, ds, device: torch.device | None = None):
    torch.manual_seed(args.seed)  # same initial weights for every contender, on any device
    model = GNN(args.model, ds.feat_dim, args.hidden, ds.num_classes, len(parse_fanouts(args.fanouts)))
    model = model.to(bench_device() if device is None else device)
    return model, torch.optim.Adam(model.parameters(), lr=args.lr)


def on_model(model: torch.nn.Module, data):
    """``data`` (a PyG batch) on the device of ``model``'s parameters."""
    device = next(model.parameters()).device
    return data if data.x.device == device else data.to(device)
