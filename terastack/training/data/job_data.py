"""The data of a ``terastack finetune`` job: training rows in their epoch order, held-out rows, a description.

Text becomes token windows (:class:`terastack.training.data.epochs.TokenWindows`); a record file or ``builtin:`` set
becomes examples with a loss mask (:class:`terastack.training.data.examples.SupervisedData`). Either way micro-batch
``i`` is ``train.step_inputs(i)`` ([Note: the data order of a job] in :mod:`terastack.training.data.epochs`).
"""
from __future__ import annotations


from terastack.training.data.stdlib_corpus import load_tokens
from terastack.training.data.record_files import is_record_file
from terastack.training.data.epochs import TokenWindows, windows_of
from terastack.training.data.examples import SupervisedData, pad_batch

#: at most this many held-out rows (windows or examples) are evaluated per validation
VAL_MAX_ROWS = 64


def _with_local_data(job):
    """``job`` with ``data.path`` / ``validation.data`` Hub ids (``ORG/NAME[:split]``) replaced by their local
    record files (the validation data's split defaults to ``validation``)."""
    import copy

    from terastack.training.hf import hub

    local = {}
    for section, key, default_split in (("data", "path", "train"), ("validation", "data", "validation")):
        spec = getattr(getattr(job, section), key)
        if hub.is_hub_id(spec, sep=":") and not spec.startswith("builtin:"):
            local[section, key] = hub.data_file(spec if ":" in spec else f"{spec}:{default_split}")
    if not local:
        return job
    job = copy.copy(job)
    for (section, key), path in local.items():
        setattr(job, section, copy.copy(getattr(job, section)))
        setattr(getattr(job, section), key, path)
    return job


def is_records(path: str | None) -> bool:
    return path is not None and (path.startswith("builtin:") or is_record_file(path))


class JobData:
    """``train``: micro-batches (``step_inputs(i)``, ``seed``) over ``rows`` training rows; ``val``: held-out
    ``(input_ids, labels)`` batches; ``info``: where the data came from (checkpoints refuse other data)."""

    def __init__(self, job, tokenizer, model_dir, *, seed: int):
        """``job``: a :class:`~terastack.training.job.JobConfig` (its data, validation and training sections)."""
        # a Hub data set id becomes its local record file once, here ([Note: Hub ids] in terastack.training.hf.hub)
        job = _with_local_data(job)
        self.records = is_records(job.data.path)
        self.summary = None
        if self.records:
            options = {"pack": True} if job.data.pack else {}
            val = job.validation
            val_fraction = 0.0 if val.data else (0.05 if val.fraction is None else val.fraction)
            data = SupervisedData.load(job.data.path, tokenizer, SupervisedData.Config(
                seq_len=job.training.seq_len, train_on_prompt=job.data.train_on_prompt, val_fraction=val_fraction,
                val_max_examples=VAL_MAX_ROWS, **options))
            self.info, self.max_token, self.summary = data.info(), data.max_token_id, data.summary()
            self.train = data.batches(job.training.batch_size, seed=seed)
            self.rows = len(self.train.examples)
            self.val = data.val_batches(job.training.batch_size)
        else:
            if job.data.train_on_prompt or job.data.pack:
                flag = "train-on-prompt" if job.data.train_on_prompt else "pack"
                raise ValueError(f"--{flag}: only for record files and builtin: data sets (plain text has no prompts "
                                 "or examples)")
            tokens, self.info = load_tokens(job.data.path, model_dir)
            cut = tokens.size - int(tokens.size * (job.validation.fraction or 0))
            self.train = TokenWindows(tokens[:cut], seq_len=job.training.seq_len, batch_size=job.training.batch_size,
                                      seed=seed)
            self.rows = self.train.rows
            self.val = windows_of(tokens[cut:], job.training.seq_len, VAL_MAX_ROWS) if cut < tokens.size else []
            self.max_token = int(tokens.max())
        if job.validation.data:
            self.val = self._val_data(job, tokenizer, model_dir)
        self.val_rows = sum(ids.shape[0] for ids, _ in self.val)

    @staticmethod
    def _val_data(job, tokenizer, model_dir):
        path, seq_len, batch = job.validation.data, job.training.seq_len, job.training.batch_size
        if is_records(path):
            val = SupervisedData.load(path, tokenizer, SupervisedData.Config(
                seq_len=seq_len, train_on_prompt=job.data.train_on_prompt, val_fraction=0.0))
            rows = val.train[:VAL_MAX_ROWS]
            return [pad_batch(rows[i:i + batch], val.pad_id) for i in range(0, len(rows), batch)]
        tokens, _ = load_tokens(path, model_dir)
        return windows_of(tokens, seq_len, VAL_MAX_ROWS)
