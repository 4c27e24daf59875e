"""Every job setting, by every command that takes a job: honoured, or refused by name.

A setting added to the job without a decision fails here. What each command does with a setting is found out, not
listed:

    finetune    a real run of finetune (two: a full fine-tune and a LoRA one) records every setting the code
                outside the job's own package reads; a setting it honours is read there. The disaggregated
                engine's section (disdp.*) it names in its note on the other engine's settings.
    dist train  honours what the shared job runner reads in those runs (terastack/training: data, schedule,
                loop, checkpoints, output; dist train runs the same runner) and what the disaggregated engine's
                code reads (its source, parsed: ``job.section.field`` and names bound to a section); refuses by
                name what its ``check_job`` refuses (a SettingError naming the setting, before any rank
                starts); names the offloaded engine's section (offload.*) in its note.
    plan llm    a setting finetune reads while it plans (the model, the profile, the budgets, the plan, the
                store's room) changes what plan llm plans (its machine and its PlanQuestion); any other setting
                leaves the plan as it is. disdp.* it names in its note.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from terastack.training.job import SECTIONS, SettingError, build_job, other_engine_note

from .test_job import NEEDS, SAMPLES

EVERY = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
#: a value other than the default for each setting (test_job's), where these checks need another: a value whose
#: effect differs from the default's on the machine planned for (a GPU: the default device, dtype and inline
#: updates there are cuda, bfloat16 and off), and paths that exist here
OVERRIDE = {"offload.device": "cpu", "store.dtype": "float32", "offload.inline_updates": True,
            "lora.base_format": "nf4", "validation.fraction": 0.5, "training.epochs": 2.0,
            "store.memory_budget": "1GiB", "training.warmup_steps": 3}


def change(path: str, tmp: Path) -> dict:
    """The settings that give ``path`` a value other than its default, with what it needs (test_job.NEEDS)."""
    if path not in SAMPLES:
        pytest.fail(f"{path}: a new setting: give it a sample in tests/training/test_job.py and decide what each "
                    "command does with it")
    value = OVERRIDE.get(path, SAMPLES[path])
    value = {"model.path": str(tmp / "other-model"), "offload.hardware": str(tmp / "other-hw.json"),
             "store.dirs": f"{tmp / 'ssd0'},{tmp / 'ssd1'}"}.get(path, value)
    return {**NEEDS.get(path, {}), path: value}


# ------------------------------------------------------------------------------------------- what finetune reads
#: functions that read every setting at once (copying, comparing, saving, checking a job): not a use of any
GENERIC = {"to_dict", "with_absolute_paths", "named_paths", "__post_init__", "__eq__", "__repr__", "replace",
           "with_settings", "asdict", "_asdict_inner", "astuple", "__hash__", "deepcopy", "__deepcopy__",
           "__reduce_ex__", "__getstate__", "other_engine_note"}
#: the functions of finetune's planning: a read inside one of them decides a plan; inside one of STEPS, not
PLANNING = {"_plan_steps", "_open_store", "make_plan", "resolve_job_model", "builtin_model_budget", "from_pretrained",
            "from_config", "trainer_config", "Trainer.__init__"}
STEPS = {"_start_runtime", "_fill", "announce", "train", "prepare", "export", "figures", "check_room", "check_writes"}
JOB_PACKAGE = str(Path(sys.modules["terastack.training.job"].__file__).parent) + "/"


class Reads:
    """Which module read each setting, and which settings were read while finetune planned."""

    def __init__(self):
        self.modules: dict[str, set[str]] = collections.defaultdict(set)
        self.planning: set[str] = set()

    def install(self, monkeypatch) -> None:
        for section, cls in SECTIONS.items():
            names = {f.name for f in dataclasses.fields(cls)}

            def getattribute(obj, attr, _names=names, _section=section):
                if attr in _names:
                    self.note(f"{_section}.{attr}", sys._getframe(1))
                return object.__getattribute__(obj, attr)

            monkeypatch.setattr(cls, "__getattribute__", getattribute)
        self.own = getattribute.__code__

    def note(self, path: str, frame) -> None:
        while frame is not None:
            code = frame.f_code
            file = code.co_filename
            if code.co_name in GENERIC or file.endswith(("copy.py", "copyreg.py")):
                return
            if code is self.own or file.startswith((JOB_PACKAGE, "<")) or file.endswith("dataclasses.py"):
                frame = frame.f_back
                continue
            self.modules[path].add(file.split("terastack/", 1)[-1])
            break
        while frame is not None:   # the innermost function that says whether this read plans or trains
            name = frame.f_code.co_qualname
            if name.rpartition(".")[2] in STEPS:
                return
            if (name in PLANNING or name.rpartition(".")[2] in PLANNING) and "/terastack/" in frame.f_code.co_filename:
                self.planning.add(path)
                return
            frame = frame.f_back


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """Two real finetune runs (a full fine-tune with validation, checkpoints, output and metrics; a LoRA one),
    every setting's reads recorded."""
    from terastack.cli import main

    from ..described_machine import write_machine
    from ..llm.test_finetune_frictions import _byte_model, _text

    tmp = tmp_path_factory.mktemp("runs")
    _byte_model(tmp / "model")
    _text(tmp / "train.txt", 600)
    base = ["finetune", "--model", str(tmp / "model"), "--data", str(tmp / "train.txt"), "--seq-len", "16",
            "--batch-size", "2", "--hardware", write_machine(tmp / "hw.json"), "--no-calibrate",
            "--device-budget", "64MiB", "--host-budget", "64MiB", "--store", str(tmp / "store")]
    recorded = Reads()
    with pytest.MonkeyPatch.context() as mp:
        recorded.install(mp)
        assert main([*base, "--steps", "2", "--val-fraction", "0.2", "--checkpoint", str(tmp / "ck"),
                     "--checkpoint-every", "1", "--output", str(tmp / "out"), "--metrics", str(tmp / "m.jsonl")]) == 0
        assert main([*base, "--steps", "1", "--lora", "2"]) == 0
    return recorded


# ------------------------------------------------------------------------------ what dist train's engine reads
def disdp_reads() -> set[str]:
    """The settings the disaggregated engine's source reads: ``X.section.field``, and ``name.field`` where
    ``name`` was bound to ``X.section`` in the same function."""
    import terastack.disdp

    out = set()
    for path in Path(terastack.disdp.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            aliases = {t.id: n.value.attr for n in ast.walk(scope) if isinstance(n, ast.Assign)
                       and isinstance(n.value, ast.Attribute) and n.value.attr in SECTIONS
                       for t in n.targets if isinstance(t, ast.Name)}
            for n in ast.walk(scope):
                if isinstance(n, ast.Attribute):
                    v = n.value
                    section = (v.attr if isinstance(v, ast.Attribute) and v.attr in SECTIONS
                               else aliases.get(v.id) if isinstance(v, ast.Name) else None)
                    if section is not None:
                        out.add(f"{section}.{n.attr}")
    return out & set(EVERY)


def refused_by(check, settings: dict) -> str | None:
    """The setting ``check`` refuses a job of ``settings`` with, by name, or None."""
    try:
        check(build_job(settings))
    except SettingError as exc:
        named = [p for p in exc.path.split("/") if p in settings]
        assert named, f"{exc.path}: refused, but named none of {sorted(settings)}"
        return named[0]
    return None


def noted(section: str, settings: dict, command: str) -> bool:
    note = other_engine_note(build_job(settings), section, command=command) or ""
    return all(p in note for p in settings if p.startswith(f"{section}."))


# ----------------------------------------------------------------------------------------------- the decisions
def decide_finetune(path, settings, reads, **_) -> str:
    if path.startswith("disdp."):
        return "named (the other engine's)" if noted("disdp", settings, "finetune") else "IGNORED"
    return "honoured" if reads.modules.get(path) else "IGNORED"


def decide_dist(path, settings, reads, engine_reads, **_) -> str:
    from terastack.disdp.job_run import check_job

    if refused_by(check_job, settings):
        return "refused"
    if path.startswith("offload."):
        return "named (the other engine's)" if noted("offload", settings, "dist train") else "IGNORED"
    runner = any(m.startswith("training/") for m in reads.modules.get(path, ()))
    return "honoured" if runner or path in engine_reads else "IGNORED"


def decide_plan(path, settings, reads, plan_inputs, **_) -> str:
    if path.startswith("disdp."):
        return "named (the other engine's)" if noted("disdp", settings, "plan llm") else "IGNORED"
    changed = plan_inputs(settings) != plan_inputs({})
    planned = path in reads.planning
    if changed == planned:
        return "planned" if planned else "not part of a plan"
    return ("CHANGES THE PLAN, finetune does not plan with it" if changed
            else "IGNORED (finetune plans with it)")


COMMANDS = {"finetune": decide_finetune, "dist train": decide_dist, "plan llm": decide_plan}


@pytest.fixture
def plan_inputs(tmp_path, cached_probe, monkeypatch):
    """What plan llm plans for a job of the base settings plus ``settings``, on this machine (a GPU one)."""
    import argparse

    from terastack.llm import plan_cmd

    from ..described_machine import TEST_MACHINE
    from ..llm.llm_helpers import make_model

    gpu = dataclasses.replace(TEST_MACHINE, gpu_name="GPU", gpu_memory_bytes=8 << 30, gpu_flops=1e13,
                              pcie_bytes_per_s=1e10, disk_bytes=1 << 40)
    Path(cached_probe).write_text(json.dumps(gpu.to_dict()))
    (tmp_path / "other-hw.json").write_text(json.dumps(dataclasses.replace(gpu, cores=8).to_dict()))
    make_model("llama", tmp_path / "model")
    make_model("llama", tmp_path / "other-model", layers=2)
    for d in ("ssd0", "ssd1"):
        (tmp_path / d).mkdir()
    args = argparse.Namespace(**{f: None for f in plan_cmd._HARDWARE_FLAGS}, time_units=False, recalibrate=False)

    def inputs(settings: dict):
        job = build_job({"model.path": str(tmp_path / "model"), **settings})
        hw = plan_cmd.resolve_hardware(args, job)
        q = plan_cmd.question(job, hw, here=plan_cmd.this_machine(args, job) or "offload.hardware" in settings)
        return (hw.to_dict(), q.profile_key(), q.planner_config(), q.budgets, q.device, q.unit_times, q.disk,
                q.inline_updates)
    return inputs


def test_every_setting_is_honoured_or_refused_by_every_command(reads, plan_inputs, tmp_path):
    engine_reads = disdp_reads()
    table, wrong = {}, []
    for path in EVERY:
        settings = change(path, tmp_path)
        for command, decide in COMMANDS.items():
            decision = decide(path, settings, reads=reads, engine_reads=engine_reads, plan_inputs=plan_inputs)
            table[path, command] = decision
            if decision.isupper() or decision.startswith(("IGNORED", "CHANGES")):
                wrong.append(f"{command}: {path}: {decision}")
    assert not wrong, "\n".join(wrong)
    # the decisions this test reads today, for the record of what it checks: the finetune runs did read something
    assert table["training.lr", "finetune"] == "honoured" and table["lora.rank", "dist train"] == "refused"
    assert table["training.batch_size", "plan llm"] == "planned" and table["training.lr", "plan llm"] == \
        "not part of a plan"

