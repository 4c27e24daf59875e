import subprocess
import sys

import pytest

from terastack.cli import main
from terastack.commands import Command, missing_extra


def test_help_lists_existing_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "bench" in out and "probe" in out


def test_bad_input_is_one_clear_line(capsys, tmp_path):
    code = main(["bench", "gemm", "--data-factor", "2", "--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--data-factor" in err and "Traceback" not in err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "terastack", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("terastack ")


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_top_level_help_imports_no_engine():
    # `terastack --help` lists every subcommand from the table alone: no engine module, no torch, no numpy.
    out = _run_python(
        "import sys\n"
        "from terastack.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'transformers', "
        "'torch_geometric') or m.startswith(('terastack.llm', 'terastack.gnn', 'terastack.disdp', "
        "'terastack.training', 'terastack.kernels', 'terastack.io', 'terastack.tiers', 'terastack.repro')))\n"
        "print('LOADED', heavy, file=sys.stderr)\n")
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stderr
    for name in ("finetune", "merge", "plan", "gnn", "dist", "repro", "bench", "probe"):
        assert f"\n    {name} " in out.stdout


def test_help_planted_import_is_seen():
    # the check above can fail: a subcommand's help does import its engine
    out = _run_python(
        "import sys\n"
        "from terastack.cli import main\n"
        "try:\n    main(['gnn', 'train', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', 'terastack.gnn.cli' in sys.modules, file=sys.stderr)\n")
    assert "LOADED True" in out.stderr
    assert "--host-cache" in out.stdout


@pytest.mark.parametrize("argv, flags", [
    (["finetune", "--help"], ["--steps", "--lora", "--device-budget"]),
    (["gnn", "train", "--help"], ["--data", "--fanouts"]),
    (["bench", "llm", "--help"], ["--json", "--systems", "--no-ablations"]),
    (["plan", "llm", "--help"], ["--model", "--seq-len", "--hardware"]),
])
def test_subcommand_help_shows_its_arguments(capsys, argv, flags):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in flags), out


def test_missing_extra_is_one_line_naming_the_install(tmp_path):
    # torch_geometric made unimportable: the subcommand is still listed, what runs without it runs (generating a
    # dataset), and what needs it says in one line which install brings it
    code = ("import sys\n"
            "sys.modules['torch_geometric'] = None\n"
            "from terastack.cli import main\n"
            "sys.exit(main({argv!r}))\n")
    listed = _run_python(code.format(argv=["--help"]))
    assert listed.returncode == 0 and "\n    gnn " in listed.stdout
    data = str(tmp_path / "graph")
    gen = _run_python(code.format(argv=["gnn", "gen", "--out", data, "--nodes", "500", "--feat-dim", "8"]))
    assert gen.returncode == 0, gen.stderr
    for argv in (["gnn", "train", "--data", data, "--epochs", "1"], ["bench", "gnn"], ["bench", "gnn", "--help"]):
        out = _run_python(code.format(argv=argv))
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "torch_geometric" in lines[0] and "pip install" in lines[0] \
            and "terastack[gnn]" in lines[0], out.stderr


def test_a_package_two_extras_install_names_the_commands_own():
    missing = ModuleNotFoundError("No module named 'transformers.models'", name="transformers.models")
    assert "pip install 'terastack[dist]'" in missing_extra(missing, Command("d", "m", "h", extra="dist"))
    assert "pip install 'terastack[llm]'" in missing_extra(missing, Command("f", "m", "h", extra="gnn"))
    assert "pip install 'terastack[llm]'" in missing_extra(missing)
    assert missing_extra(ModuleNotFoundError("No module named 'nope'", name="nope")) is None


def test_missing_package_at_run_time_names_its_extra():
    # a command reaching for an optional package while it runs (not at argument time) gets the same one line
    code = ("import sys, types\n"
            "sys.modules['peft'] = None\n"
            "mod = types.ModuleType('fake_cmd')\n"
            "mod.add_arguments = lambda p: None\n"
            "def run(args):\n    import peft\n"
            "mod.run = run\n"
            "sys.modules['fake_cmd'] = mod\n"
            "from terastack import cli\n"
            "from terastack.commands import Command\n"
            "cli.COMMANDS.append(Command('fake', 'fake_cmd', 'a command needing peft'))\n"
            "sys.exit(cli.main(['fake']))\n")
    out = _run_python(code)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "needs peft" in out.stderr and "terastack[llm]" in out.stderr
