"""The separate Python environment the DaCe suite runs in: created once, then reused.

[Note: why a separate environment]
DaCe 1.0.2 needs ``numpy<2`` and ``networkx<3.4``; terastack itself runs on
NumPy 2 with torch. Installing DaCe into the main environment would downgrade
NumPy under torch and every engine, so the suite creates its own venv (from
the running interpreter) holding exactly :data:`REQUIREMENTS`, and runs the
kernels there in a subprocess with terastack's source on ``PYTHONPATH``. The
code it runs (``terastack.repro.dace.*``) imports only NumPy, DaCe, Numba and
mpi4py, never torch. Default location: ``$TERASTACK_DACE_ENV`` or
``~/.cache/terastack/dace-env-<hash of the requirements>``; a stamp file
records the requirements, versions and how long the install took, and an
environment whose stamp does not match is rebuilt.

System prerequisites (checked, reported when missing): a C++ compiler and
CMake (DaCe compiles generated C++); optional: OpenBLAS + LAPACKE headers
(Debian ``libopenblas-dev liblapacke-dev``; without them DaCe's matrix
products fall back to its own loops) and an MPI implementation (Debian
``openmpi-bin libopenmpi-dev``; without it the scaling runs are skipped and
reported).
"""
from __future__ import annotations

import contextlib
import ctypes.util
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from terastack.atomic import atomic_write_json
from terastack.repro.logs import last_lines

#: the tested set; dace 1.0.2 needs numpy<2 and networkx<3.4, Numba's ``@`` needs SciPy's BLAS
REQUIREMENTS = ("dace==1.0.2", "numpy==1.26.4", "networkx==3.3", "numba==0.68.1", "llvmlite==0.50.0",
                "scipy==1.17.1", "mpi4py==4.1.2")

STAMP = "terastack-env.json"
CREATING = ".terastack-creating"


class DaceUnavailable(RuntimeError):
    """The DaCe environment cannot be created or used here; the message says what is missing and how to get it."""


def default_path(requirements: tuple[str, ...] = REQUIREMENTS) -> Path:
    if os.environ.get("TERASTACK_DACE_ENV"):
        return Path(os.environ["TERASTACK_DACE_ENV"]).expanduser()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:10]
    return Path.home() / ".cache" / "terastack" / f"dace-env-{key}"


def system_prerequisites() -> dict:
    """What the machine has for DaCe (compiler, CMake) and what is optional (BLAS, MPI)."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    mpi_version = None
    if mpirun:
        try:
            out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
            mpi_version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None
        except (OSError, subprocess.TimeoutExpired):
            mpi_version = None
    return {"cxx": cxx, "cmake": shutil.which("cmake"),
            "openblas": bool(ctypes.util.find_library("openblas") or ctypes.util.find_library("blas")),
            "lapacke": bool(ctypes.util.find_library("lapacke")), "mpirun": mpirun, "mpi_version": mpi_version}


class DaceEnvironment:
    @dataclass(kw_only=True, slots=True)
    class Config:
        #: where the venv lives (default: see [Note: why a separate environment])
        path: str | None = None
        #: interpreter the venv is created from
        python: str = sys.executable
        requirements: tuple[str, ...] = REQUIREMENTS
        #: bound on venv creation + pip install (and on waiting for another process creating it)
        install_timeout_s: float = 1200.0
        extra_pip_args: tuple[str, ...] = field(default_factory=tuple)

        def __post_init__(self) -> None:
            if self.install_timeout_s <= 0:
                raise ValueError(f"install_timeout_s: must be > 0, got {self.install_timeout_s}")
            if not self.requirements:
                raise ValueError("requirements: must name at least dace")

    def __init__(self, config: Config | None = None):
        self.config = config or DaceEnvironment.Config()
        self.path = Path(self.config.path).expanduser() if self.config.path else default_path(self.config.requirements)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def stamp(self) -> dict | None:
        try:
            data = json.loads((self.path / STAMP).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _usable(self) -> dict | None:
        stamp = self.stamp()
        if (stamp is None or list(stamp.get("requirements", [])) != list(self.config.requirements)
                or (self.path / CREATING).exists() or not self.python.exists()):
            return None
        return stamp

    def ensure(self, log=lambda msg: None) -> dict:
        """The environment's stamp, creating the venv first when it is missing or stale.

        Returns the stamp plus ``"created_now"``. Raises :class:`DaceUnavailable` with the
        reason (missing compiler, pip failure with its last lines, timeout) otherwise.
        """
        prereq = system_prerequisites()
        missing = [name for name, key in (("a C++ compiler (apt-get install g++)", "cxx"),
                                          ("CMake (apt-get install cmake)", "cmake")) if not prereq[key]]
        if missing:
            raise DaceUnavailable(f"DaCe compiles C++ and needs {' and '.join(missing)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock():
            stamp = self._usable()
            if stamp is not None:
                return {**stamp, "created_now": False, "path": str(self.path), "system": prereq}
            self._remove_incomplete()
            stamp = self._create(log)
        return {**stamp, "created_now": True, "path": str(self.path), "system": prereq}

    @contextlib.contextmanager
    def _lock(self):
        """Exclusive right to create or check the environment (another process may be creating it)."""
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self.config.install_timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DaceUnavailable(f"timed out after {self.config.install_timeout_s:.0f} s waiting for "
                                              f"another process creating the DaCe environment {self.path} "
                                              f"(lock {self.path}.lock)") from None
                    time.sleep(0.5)
            yield
        finally:
            os.close(fd)    # closing the descriptor releases the lock

    def _remove_incomplete(self) -> None:
        if not self.path.exists():
            return
        ours = (self.path / CREATING).exists() or (self.path / STAMP).exists()
        if not ours and any(self.path.iterdir()):
            raise DaceUnavailable(f"{self.path} exists and is not a terastack DaCe environment (no {STAMP}); "
                                  f"remove it or choose another --dace-env")
        shutil.rmtree(self.path)

    def _create(self, log) -> dict:
        started = time.monotonic()
        deadline = started + self.config.install_timeout_s
        self.path.mkdir(parents=True)
        (self.path / CREATING).write_text("incomplete: being created by terastack\n")
        log_path = self.path / "install.log"
        log(f"creating the DaCe environment in {self.path} ({', '.join(self.config.requirements)})")
        steps = [[self.config.python, "-m", "venv", str(self.path)],
                 [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                  *self.config.extra_pip_args, *self.config.requirements]]
        with open(log_path, "w") as logf:
            for cmd in steps:
                remaining = deadline - time.monotonic()
                try:
                    proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, timeout=max(remaining, 1))
                except subprocess.TimeoutExpired:
                    raise DaceUnavailable(f"creating the DaCe environment took over {self.config.install_timeout_s:.0f}"
                                          f" s (step: {' '.join(cmd[:4])} ...); log: {log_path}") from None
                if proc.returncode != 0:
                    logf.flush()
                    tail = last_lines(log_path.read_text(), 15, skip="WARNING")
                    raise DaceUnavailable(f"`{' '.join(cmd[:5])} ...` failed with exit {proc.returncode}; "
                                          f"log: {log_path}; last lines:\n{tail}")
        install_s = time.monotonic() - started
        versions = self._versions()
        stamp = {"requirements": list(self.config.requirements), "versions": versions,
                 "install_s": round(install_s, 1), "python": self.config.python,
                 "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        atomic_write_json(self.path / STAMP, stamp)
        (self.path / CREATING).unlink()
        log(f"DaCe environment ready in {install_s:.1f} s")
        return stamp

    def _versions(self) -> dict:
        code = ("import json, importlib.metadata as m, platform\n"
                "names = ['dace', 'numpy', 'networkx', 'numba', 'llvmlite', 'scipy', 'mpi4py', 'sympy']\n"
                "v = {}\n"
                "for n in names:\n"
                "    try: v[n] = m.version(n)\n"
                "    except m.PackageNotFoundError: v[n] = None\n"
                "v['python'] = platform.python_version()\n"
                "print(json.dumps(v))\n")
        out = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise DaceUnavailable(f"the DaCe environment {self.path} does not run: {out.stderr.strip()[-500:]}")
        return json.loads(out.stdout)

    def subprocess_env(self, *, threads: int | None = None) -> dict:
        """Environment for a process in the DaCe venv: terastack's source on the path, threads fixed."""
        import terastack

        src_root = str(Path(terastack.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = src_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONWARNINGS"] = "ignore"
        # DaCe puts some per-iteration temporaries on the stack, also in OpenMP worker threads, whose
        # stacks are OMP_STACKSIZE, not the process's limit (see [Note: stack size] in suite.py).
        env.setdefault("OMP_STACKSIZE", "512M")
        if threads:
            # The same thread count for every framework: NumPy's BLAS, DaCe's OpenMP, Numba's pool.
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
                env[var] = str(threads)
        return env
