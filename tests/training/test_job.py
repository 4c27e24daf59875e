"""The sectioned job: every setting reads the same from a flag, a file (sectioned or flat) and an override;
files in the format before sections still read, with a note; mistakes name the setting."""
import argparse
import dataclasses
import io

import pytest

from terastack.training.job import (FLAT, SECTIONS, JobConfig, SettingError, add_job_arguments, build_job,
                                    job_flags, parse_overrides, read_job_file, resolve_job, write_job_file)

#: a value other than the default for every setting (a new setting must add one: the test below checks it)
SAMPLES = {
    "model.path": "/models/m", "model.rope_scaling": ("yarn", 4.0),
    "data.path": "train.jsonl", "data.train_on_prompt": True, "data.pack": True,
    "validation.data": "val.txt", "validation.fraction": None, "validation.every": 7,
    "training.steps": 9, "training.epochs": None, "training.seq_len": 64, "training.batch_size": 3,
    "training.grad_accum": 2, "training.lr": 2e-5, "training.betas": (0.8, 0.95), "training.eps": 1e-6,
    "training.weight_decay": 0.1, "training.max_grad_norm": 1.0, "training.lr_schedule": "cosine",
    "training.warmup_steps": None, "training.warmup_ratio": 0.25, "training.min_lr": 1e-6, "training.seed": 5,
    "training.optimizer": "adamw8bit",
    "schedule.optimizer": "deferred", "schedule.active_offload": False, "schedule.activation_policy": "keep,ssd",
    "schedule.accumulation": "horizontal",
    "store.dirs": "/nvme0/a,/nvme1/b", "store.device_budget": "8MiB", "store.host_budget": 1 << 20,
    "store.memory_budget": None, "store.dtype": "bfloat16",
    "checkpoint.dir": "ck", "checkpoint.every": 4, "checkpoint.resume": "old-ck",
    "output.dir": "out", "output.metrics": "m.jsonl", "output.max_shard_size": "2GB",
    "lora.rank": 4, "lora.alpha": 16, "lora.dropout": 0.1, "lora.target_modules": "q_proj,v_proj",
    "lora.init_from": "adapter", "lora.base_format": "native",
    "offload.calibrate": False, "offload.hardware": "hw.json", "offload.device": "cpu", "offload.prefetch_depth": 2,
    "offload.inline_updates": False, "offload.state_placement": "ssd", "offload.optimizer_impl": "foreach",
    "offload.optimizer_chunk": 4096, "offload.retain_weights": False, "offload.timeout": 30.0,
    "offload.check_family": "always",
    "offload.vocab_slice": 64 << 20,
    "disdp.workers": 4, "disdp.servers": 2, "disdp.aggregator": False, "disdp.agents": "process",
    "disdp.state": "ssd", "disdp.run_dir": "runs/x", "disdp.prefetch": 3, "disdp.reshard": False,
    "disdp.timeout_s": 60.0, "disdp.threads": 2, "disdp.helper_nice": 5, "disdp.kill_at": "worker:0:3",
    "disdp.progress": False, "disdp.trace_dir": "traces", "disdp.device": "cuda",
}
GIVEN = {k: v for k, v in SAMPLES.items() if v is not None}
#: what a setting needs beside it to mean anything (alone it is refused, naming it): an adapter's settings need an
#: adapter, checkpoint.every a checkpoint directory, the export's shard size an export, min_lr a decay
NEEDS = {"checkpoint.every": {"checkpoint.dir": "ck"}, "output.max_shard_size": {"output.dir": "out"},
         "training.min_lr": {"training.lr_schedule": "cosine"},
         **{p: {"lora.rank": 4} for p in SAMPLES if p.startswith("lora.") and p != "lora.rank"}}


def in_context(path: str, value) -> dict:
    """The layer of ``path`` set to ``value``, with what it needs (:data:`NEEDS`)."""
    return {**NEEDS.get(path, {}), path: value}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_job_arguments(p)
    return p


def _flag_words(path: str, value) -> list[str]:
    flag = "--" + next(k for k, v in FLAT.items() if v == path).replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else flag.replace("--", "--no-", 1)]
    if isinstance(value, tuple):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True).strip()


def test_every_setting_has_a_sample_and_the_samples_are_not_the_defaults():
    assert set(SAMPLES) == set(FLAT.values())
    for path, value in GIVEN.items():
        assert build_job(NEEDS.get(path, {})).get(path) != build_job(in_context(path, value)).get(path), path


@pytest.mark.parametrize("path", sorted(GIVEN))
def test_flag_file_and_override_agree(path, tmp_path):
    """One setting given five ways -- a flag, a file's section, a file's flat key, an override by section and
    by flat name -- makes the same job, and that job differs from the default in that setting only."""
    value = GIVEN[path]
    section, name = path.split(".")
    flat = next(k for k, v in FLAT.items() if v == path)
    expected = build_job(in_context(path, value))
    ways = {}
    if SECTIONS[section].__dataclass_fields__[name].metadata["flag"]:
        ways["flag"] = job_flags(_parser().parse_args(_flag_words(path, value)))
    (tmp_path / "s.yaml").write_text(f"{section}:\n  {name}: {_yaml(value)}\n")
    (tmp_path / "f.yaml").write_text(f"{flat}: {_yaml(value)}\n")
    (tmp_path / "s.toml").write_text(f"[{section}]\n{name} = {_toml(value)}\n")
    ways["yaml section"] = read_job_file(tmp_path / "s.yaml")
    ways["yaml flat"] = read_job_file(tmp_path / "f.yaml")
    ways["toml section"] = read_job_file(tmp_path / "s.toml")
    ways["override section"] = parse_overrides([f"{path}={_yaml(value)}"])
    ways["override flat"] = parse_overrides([f"{flat}={_yaml(value)}"])
    for way, layer in ways.items():
        assert build_job({**NEEDS.get(path, {}), **layer}) == expected, way
    context = build_job(NEEDS.get(path, {}))
    changed = [p for p in FLAT.values() if expected.get(p) != context.get(p)]
    assert changed == [path]
    if path in NEEDS:  # alone, it is refused by its name
        with pytest.raises(SettingError, match=path):
            build_job({path: value})


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def test_layers_file_then_flags_then_overrides(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: /models/m\ntraining: {lr: 1e-5, epochs: 3, batch_size: 2}\noutput: {dir: out}\n")
    job = resolve_job(file=path, flags={"output.dir": "flagged", "training.batch_size": None},
                      overrides=["steps=7", "training.seed=3"])
    assert job.training.lr == 1e-5 and job.output.dir == "flagged"  # YAML 1.1 reads 1e-5 as a string
    assert job.training.steps == 7 and job.training.epochs is None  # an override of the length drops epochs
    assert job.training.batch_size == 2 and job.training.seed == 3
    assert resolve_job(file=path, flags={}, overrides=["epochs=1"]).training.epochs == 1.0
    # the resolved job round-trips through finetune.yaml, in sections
    write_job_file(job, tmp_path / "finetune.yaml")
    assert "training:" in (tmp_path / "finetune.yaml").read_text()
    assert resolve_job(file=tmp_path / "finetune.yaml", flags={}, overrides=[]) == job
    every = dataclasses.replace(job, lora=dataclasses.replace(job.lora, rank=2, target_modules=("q", "v")))
    write_job_file(every, tmp_path / "again.yaml")
    assert resolve_job(file=tmp_path / "again.yaml", flags={}, overrides=[]) == every


def test_a_file_of_the_old_format_reads_with_one_note(tmp_path):
    """Flat keys, the old sections with their aliases, and a trainer: table (also bare trainer fields at the top
    level): each old spelling lands on its setting and is named in one note line."""
    path = tmp_path / "old.yaml"
    path.write_text("model: /models/m\n"
                    "data: {path: train.txt, val: val.txt}\n"
                    "training: {lr: 1e-5, epochs: 3, grad_accum: 2, eval_every: 5}\n"
                    "checkpoint: {path: ck, every: 2}\n"
                    "calibrate: false\n"
                    "store_dir: /nvme/a\n"
                    "trainer:\n  host_budget: 64MiB\n  seq_len: 64\n  lr: 0.5\n  packed: true\n"
                    "  lora: {r: 2, alpha: 4}\n  optimizer_impl: single\n")
    log = io.StringIO()
    job = resolve_job(file=path, flags={}, overrides=["trainer.seed=3"], log=log)
    assert (job.model.path, job.data.path, job.validation.data) == ("/models/m", "train.txt", "val.txt")
    assert job.training.lr == 1e-5  # the job key wins over the trainer table's
    assert (job.training.epochs, job.training.grad_accum, job.validation.every) == (3, 2, 5)
    assert (job.checkpoint.dir, job.checkpoint.every) == ("ck", 2)
    assert job.offload.calibrate is False and job.offload.optimizer_impl == "single"
    assert job.store.dirs == "/nvme/a" and job.store.host_budget == 64 << 20
    assert job.training.seq_len == 64 and job.data.pack is True and job.training.seed == 3
    assert (job.lora.rank, job.lora.alpha) == (2, 4)
    notes = log.getvalue().splitlines()
    assert len(notes) == 2 and notes[0].startswith(f"note: {path}: ") and "override" in notes[1]
    for moved in ("data.val is now validation.data", "checkpoint.path is now checkpoint.dir",
                  "training.eval_every is now validation.every", "store_dir is now store.dirs",
                  "trainer.host_budget is now store.host_budget", "trainer.packed is now data.pack",
                  "trainer.lora.r is now lora.rank", "trainer.optimizer_impl is now offload.optimizer_impl"):
        assert moved in notes[0]
    assert "calibrate" not in notes[0]  # a flat name is no old spelling
    # a TOML [trainer] file (the shipped configs) is a job file too
    toml = tmp_path / "t.toml"
    toml.write_text("epochs = 2\n[trainer]\ncalibrate = false\nlr = 0.001\n")
    job = resolve_job(file=toml, flags={}, overrides=[], log=None)
    assert (job.training.epochs, job.offload.calibrate, job.training.lr) == (2.0, False, 0.001)


def test_unknown_or_bad_keys_name_the_key_and_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    for text, message in (("lr: 1e-4\nlearning_rate: 3\n", "job.yaml: unknown key 'learning_rate'"),
                          ("training: {epochz: 2}\n", "job.yaml: unknown key 'training.epochz'"),
                          ("trainer: {calibrat: false}\n", "job.yaml: unknown key 'trainer.calibrat'"),
                          ("offload: {lr: 1}\n", None)):
        path.write_text(text)
        if message is None:  # another section's setting in a section: read where it belongs, with a note
            assert read_job_file(path) == {"training.lr": 1}
            continue
        with pytest.raises(ValueError, match=message):
            read_job_file(path)
    with pytest.raises(ValueError, match=r"override 'lrr=3': unknown key 'lrr'"):
        parse_overrides(["lrr=3"])
    for text, message in (("steps: 3\nepochs: 1\n", "job.yaml: training.steps/training.epochs: give one"),
                          ("steps: three\n", "job.yaml: training.steps: must be an integer"),
                          ("betas: [0.9, 2]\n", "job.yaml: training.betas: must be two numbers"),
                          ("store: {host_budget: lots}\n", "job.yaml: store.host_budget: cannot read 'lots'"),
                          ("activation_policy: keep,swap\n", "schedule.activation_policy: 'swap' is not one"),
                          ("disdp: {agents: smartnic}\n", "disdp.agents: must be one of thread, process"),
                          ("optimizer_schedule: eager\nmax_grad_norm: 1\n",
                           "schedule.optimizer: eager updates cannot apply a global-norm clip exactly"),
                          ("schedule: {optimizer: eager, active_offload: false}\n",
                           "schedule.optimizer: eager contradicts active_offload=false")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            resolve_job(file=path, flags={}, overrides=[])
    with pytest.raises(ValueError, match="^--grad-accum: must be >= 1"):  # a flag's mistake, named as the flag
        resolve_job(file=None, flags={"training.grad_accum": 0}, overrides=[])
    with pytest.raises(SettingError, match="training.epochs: must be > 0") as info:
        JobConfig(training={"epochs": 0})
    assert info.value.path == "training.epochs"


def test_flags_are_derived_from_the_fields():
    p = _parser()
    help_text = p.format_help()
    for flag in ("--lr", "--epochs", "--store", "--save", "--val-data", "--lora", "--no-calibrate",
                 "--prefetch-depth"):
        assert flag in help_text
    assert "--workers" not in help_text  # the disaggregated engine's settings are file keys only
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "3", "--epochs", "1"])  # alternatives exclude each other
    assert job_flags(p.parse_args([])) == {}  # no flag given: nothing set
