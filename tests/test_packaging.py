"""leanbatch installs like a PyTorch library: the built wheel and sdist, on a bare install.

One module-scoped build (``python -m build``: the sdist, then the wheel from it, as a package
index's users get them), then a fresh virtual environment that holds the wheel and torch and
nothing else: no numpy, no Lightning, no transformers. Torch comes from this environment through
a folder of links to exactly its own distributions (torch and what it requires), so the bare
environment is built in seconds, not by a second download of torch.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _closure(name: str) -> set[str]:
    """The installed distributions ``name`` needs (its unconditional requirements, recursively)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower()
        if key in seen:
            continue
        seen.add(key)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_distributions(names: set[str], into: Path) -> None:
    """Symlink the top-level files and folders of each distribution (code and metadata) into ``into``."""
    into.mkdir()
    for name in names:
        dist = md.distribution(name)
        for f in dist.files or []:
            top = f.parts[0]
            src = Path(dist.locate_file(top))
            dst = into / top
            if top != ".." and src.exists() and not dst.exists() and not top.endswith(".pth"):
                dst.symlink_to(src)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    torch_only = out / "torch-only"
    _link_distributions(_closure("torch"), torch_only)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "torch_only.pth").write_text(f"{torch_only}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    return {"wheel": wheel, "sdist": sdist, "venv": venv, "site": site}


def _bare(built: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(built["venv"] / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=120
    )


def test_the_bare_environment_has_torch_and_no_extra(built):
    r = _bare(
        built,
        "python",
        "-c",
        "import torch, importlib.util as u; print(u.find_spec('numpy'), u.find_spec('lightning'), u.find_spec('transformers'))",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "None", "None"]


def test_the_wheel_is_typed_and_licensed_with_the_truth_in_its_metadata(built):
    with zipfile.ZipFile(built["wheel"]) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "leanbatch/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in meta and "Requires-Python: >=3.11" in meta
    assert "Project-URL: Source, https://" in meta and "Classifier: Typing :: Typed" in meta
    description = meta.split("\n\n", 1)[1]
    links = re.findall(r"\]\(([^)\s]+)\)", description)
    assert len(links) > 10
    assert [u for u in links if not u.startswith(("https://", "#"))] == []


def test_the_sdist_ships_the_tests_whole(built):
    tracked = subprocess.run(
        ["git", "ls-files", "tests", "conftest.py", "LICENSE", "CHANGELOG.md", "CITATION.cff"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout (an unpacked sdist): nothing to compare with")
    with tarfile.open(built["sdist"]) as t:
        shipped = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert sorted(set(tracked) - shipped) == []


def test_the_command_starts_and_answers_version_without_the_bench_extra(built):
    for args in (("leanbatch", "--help"), ("python", "-m", "leanbatch", "--help")):
        r = _bare(built, *args)
        assert r.returncode == 0, r.stderr
        assert "bench" in r.stdout and "Traceback" not in r.stderr
    r = _bare(built, "leanbatch", "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"leanbatch {md.version('leanbatch')}"


def test_a_subcommand_that_needs_the_bench_extra_names_it(built):
    r = _bare(built, "leanbatch", "bench", "--quick", "--no-progress", "--out", str(built["venv"] / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert 'pip install "leanbatch[bench]"' in r.stderr


@pytest.mark.parametrize(
    ("module", "framework_name", "plain", "extra"),
    [
        ("leanbatch.lightning", "LeanBatchCallback", "WithIndex", "lightning"),
        ("leanbatch.hf", "LeanBatchTrainer", "IndexedDataset", "transformers"),
    ],
)
def test_an_adapter_without_its_framework_names_its_extra_and_keeps_its_torch_helpers(
    built, module, framework_name, plain, extra
):
    code = (
        f"import {module} as m\n"
        f"print(len(m.{plain}([1, 2])))\n"
        f"try:\n    from {module} import {framework_name}\n"
        "except ModuleNotFoundError as e:\n    print('ERR', e)\n"
    )
    r = _bare(built, "python", "-c", code)
    assert r.returncode == 0, r.stderr
    size, err = r.stdout.strip().splitlines()
    assert size == "2"
    assert err.startswith("ERR ") and f'pip install "leanbatch[{extra}]"' in err


def test_the_core_trains_on_a_bare_install(built):
    code = (
        "import torch, leanbatch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "ds = leanbatch.InfoBatch(TensorDataset(torch.randn(32, 2)), 2, seed=0)\n"
        "for e in range(2):\n"
        "    ds.set_epoch(e)\n"
        "    for (x,) in DataLoader(ds, batch_size=8, sampler=ds.sampler):\n"
        "        ds.update(x.pow(2).sum(1))\n"
        "print(ds.progress)\n"
    )
    r = _bare(built, "python", "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1.0"


def test_a_users_mypy_sees_leanbatch_types(built, tmp_path):
    user = tmp_path / "user.py"
    user.write_text("from leanbatch import cosine\n\nx: str = cosine()\n")
    ini = tmp_path / "mypy.ini"
    ini.write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ini),
            "--no-incremental",
            "--python-executable",
            str(built["venv"] / "bin" / "python"),
            str(user),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "py.typed" not in r.stdout and "missing library stubs" not in r.stdout, r.stdout
    assert "Incompatible types in assignment" in r.stdout, r.stdout
