import subprocess
import sys

from terastack.cli import main


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
