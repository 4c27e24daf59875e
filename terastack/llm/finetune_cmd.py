"""``terastack finetune``: fine-tune a causal LM whose training state does not fit in memory.

With no arguments it trains the built-in ``tiny-llama`` on the running Python's standard-library sources
(byte tokens), with a host budget of a quarter of the model's training state so most of it lives on the SSD.
``--data`` takes a text file, a record file of instruction or chat data (JSONL, JSON, Parquet; the loss covers
completions / assistant turns: :mod:`terastack.training.data.examples`), or ``builtin:docstrings``.

This module reads the job (:mod:`terastack.training.job`: file, flags, overrides) and hands it to the one job
runner (:mod:`terastack.training.job_runner`: model, data, schedule, loop, metrics, output, resume, Ctrl-C, the
result) with the offloaded engine (:class:`OffloadedEngine`): what is particular to this command is how the
trainer is built and what it says about its plan.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager

from terastack.units import format_bytes

COMMAND = "terastack finetune"

def add_arguments(p: argparse.ArgumentParser) -> None:
    # One flag per job setting, derived from the job's sections (terastack.training.job); each defaults to None,
    # "not given", so that a --config file's value stands unless the flag is given.
    from terastack.training.job import add_job_arguments

    p.add_argument("--config", default=None, metavar="FILE",
                   help="a YAML or TOML job file: sections of settings (training: {lr: 1e-5, epochs: 2}) or the "
                        "flags' names at the top level (lr: 1e-5); files with a trainer: table still read. Flags "
                        "given on the command line win over the file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings that win over the file and the flags, e.g. lr=1e-5 training.epochs=2 "
                        "offload.calibrate=false")
    add_job_arguments(p, skip=("disdp",))
    o = p.add_argument_group("this run")
    o.add_argument("--show-plan", action="store_true", help="print the placement plan before training")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (open in Perfetto)")


class OffloadedEngine:
    """The offloaded engine as the job runner uses it (:class:`terastack.training.job_runner.EngineChoice`)."""

    command = COMMAND

    def __init__(self, job, *, show_plan: bool = False, log=sys.stderr):
        self.job, self.show_plan, self.log = job, show_plan, log

    def trainer_config(self, start):
        """The trainer's view of the job, with what this command decides where the job leaves it unset: the
        built-in model's host budget (a quarter of its training state: most of it on the SSD) and a scratch
        store removed at the end."""
        from terastack.llm.trainer_config import TrainerConfig, builtin_model_budget
        from terastack.training.scratch_store import ScratchStore

        job = self.job
        given = builtin_model_budget(job, start.model.hf_config)
        if job.store.dirs is None:  # [Note: a scratch store's owner]: stale ones of dead jobs go first
            self.scratch = ScratchStore(prefix="terastack-finetune-", log=self.log)
            given["store_dir"] = str(self.scratch.open())
        return TrainerConfig(job, lr=start.lr, **given)

    @contextmanager
    def open(self, start):
        from terastack.llm.trainer import Trainer

        self.scratch = None
        try:
            config = self.trainer_config(start)
            model = start.model
            if start.snapshot is not None:
                trainer = Trainer.load_checkpoint(start.snapshot, config, expect_model=model.hf_config)
            elif model.model_dir is not None:
                trainer = Trainer.from_pretrained(model.model_dir, config, hf_config=model.hf_config)
            else:
                trainer = Trainer.from_config(model.hf_config, config, name=model.name)
            with trainer:
                self.announce(start, trainer)
                yield trainer
        finally:
            if self.scratch is not None:
                self.scratch.close()

    def announce(self, start, trainer) -> None:
        state = trainer.profile.state_bytes(trainer.runtime.format)   # as terastack plan llm counts it
        print(f"{COMMAND}: {start.model.name} ({trainer.profile.total_params / 1e6:.1f}M parameters, "
              f"training state {format_bytes(state)}) on {start.data.info['source']}; "
              f"device budget {format_bytes(trainer.plan.device_budget)}, host budget "
              f"{format_bytes(trainer.plan.host_budget)}; store {trainer.run_dir}", file=self.log)
        print(family_check_line(trainer, resumed=start.snapshot is not None), file=self.log)
        if self.show_plan:
            print(trainer.describe_plan(), file=self.log)
        else:
            p = trainer.plan.prediction
            print(f"plan: {p.bottleneck}-bound, predicted {p.step_s:.3f} s/step "
                  f"({p.tokens_per_s:.0f} tokens/s); --show-plan for the placement", file=self.log)

    def result(self, start, trainer, done) -> dict:
        """The plan, the ledgers' use, and the step as measured beside the step the plan predicted: the mean of
        this run's steps after the first (which warms caches and allocators), or its one step."""
        steps = [h.seconds for h in trainer.history[-len(done.losses):]] if done.losses else []
        measured = steps[1:] or steps
        return {"plan": trainer.plan.summary(), "usage": trainer.usage(),
                "predicted_step_s": trainer.plan.prediction.step_s,
                "measured_step_s": sum(measured) / len(measured) if measured else None,
                "measured_steps": len(measured)}


def family_check_line(trainer, *, resumed: bool) -> str:
    """Whether the check of the model's family ran before training, and what it found ([Note: the family
    check] in terastack.llm.engine.family_check; a family that fails it stops the run before this line)."""
    report, setting, family = trainer.family_check, trainer.config.check_family, trainer.family
    if report is not None:
        return (f"family check: passed: {family}'s streamed units equal its own modules on a probe batch "
                f"({report.unit_calls} unit calls, {report.tensors} tensors compared; largest relative difference "
                f"{report.worst:.1e}, in {report.worst_tensor or '-'}; {report.seconds:.1f} s)")
    if resumed:
        return "family check: not run again (a resumed run was checked when it started)"
    if setting == "never":
        return "family check: not run (--check-family never)"
    return f"family check: not needed: the tests verify {family} models (--check-family always runs it)"


def run(args: argparse.Namespace) -> int:
    from terastack import trace
    from terastack.training.job import job_flags, other_engine_note, resolve_job
    from terastack.training.interrupt import INTERRUPTED_EXIT, JobInterrupted, terminate_as_exit
    from terastack.training.job_runner import JobRunner, summary_lines

    job = resolve_job(file=args.config, flags=job_flags(args), overrides=args.overrides or [])
    log = sys.stderr
    note = other_engine_note(job, "disdp", command=COMMAND)  # [Note: settings of the other engine]
    if note:
        print(note, file=log)
    if args.trace:  # written at the end: refused now if it could not be ([Note: room to write])
        from terastack.disk_room import check_writable

        check_writable(args.trace, what="--trace")
    runner = JobRunner(job, OffloadedEngine(job, show_plan=args.show_plan, log=log), log=log, loop_log=log,
                       argv=getattr(args, "_argv", None))
    if args.trace:
        trace.tracer.start()
    try:
        with terminate_as_exit():   # a plain kill still removes the default store ([Note: a scratch store's owner])
            result = runner.run()
    except JobInterrupted as exc:
        print(exc, file=log)  # [Note: an interrupted run]: where the run stood and how to go on
        return INTERRUPTED_EXIT
    finally:
        if args.trace:
            trace.tracer.stop()
            print(f"trace written to {trace.tracer.save(args.trace)}", file=log)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        for line in summary_lines(result):
            print(line)
    return 0
