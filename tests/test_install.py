"""The package as a user installs it: a wheel (not the editable install the suite runs from),
in a fresh virtualenv, finds everything it reads at run time and verifies a rollout file.

The wheel is built without build isolation (the suite's own setuptools: no network) from a
copy of the sources, so the checkout gets no build/ or egg-info. The fresh venv takes the
wheel alone; its dependencies (torch and the rest, gigabytes) come from the suite's venv
through a path file, which adds their directory but runs none of its .pth files, so the
editable install there stays out of sight.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "vrl", "proofs", "p2p")


def run(*argv, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:3]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_a_wheel_in_a_fresh_venv_verifies_a_rollout_file(tmp_path):
    import vrl

    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
        str(tmp_path / "dist"), str(source), cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("vrl-*.whl")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel),
        cwd=tmp_path)
    site = run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path)
    (Path(site.stdout.strip()) / "vrl-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = run(str(python), "-c", "import vrl.rollouts.profiles as p; print(p.TABLE_FILE); p.table()",
                cwd=tmp_path)
    assert where.stdout.strip().startswith(str(venv)), "the wheel's vrl, not the checkout's"

    model = vrl.load_model("tiny")
    records = vrl.generate(model, vrl.Arithmetic(digits=1), vrl.NodeKey.generate(), round_seed=bytes(32),
                           sampling=vrl.sampling_for(model, max_new_tokens=4), groups=1, group_size=2)
    vrl.write_rollouts(tmp_path / "made.vrl", records)
    verified = run(str(venv / "bin" / "vrl"), "verify", str(tmp_path / "made.vrl"), "--model", "tiny", "--json",
                   cwd=tmp_path)
    shown = json.loads(verified.stdout)
    assert (shown["accepted"], shown["rejected"]) == (2, 0), verified.stdout[:2000]
