"""The package as shipped: the wheel builds, holds every subpackage, and works in a clean venv.

The wheel is built from a copy of the checkout's files (nothing is written into the checkout) with
the setuptools already installed, and installed with ``--no-deps`` into a fresh venv that sees only
the wheel's own core dependencies: they are linked from this interpreter's site-packages, so the
test needs no network and proves that ``pip install unihub`` needs nothing more (no tqdm, argcomplete,
torch, ...).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import unihub

ROOT = Path(unihub.__file__).resolve().parent
#: folders of the checkout that are not part of the package
NOT_SHIPPED = {"tests", "benchmarks", "scripts"}


def _repo_packages() -> set[str]:
    """``unihub.x.y`` for every folder of the checkout with an ``__init__.py``, but tests and benchmarks."""
    found = {"unihub"}
    for init in ROOT.rglob("__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if parts and parts[0] not in NOT_SHIPPED and not any(p.startswith(".") for p in parts):
            found.add(".".join(("unihub", *parts)))
    return found


def test_pyproject_lists_every_subpackage() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(config["tool"]["setuptools"]["packages"]) == _repo_packages()


def test_core_dependencies_are_the_array_image_and_checksum_libraries_only() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in project["dependencies"]}
    assert names == {"numpy", "pyarrow", "imagecodecs", "simplejpeg", "isal", "crc32c"}
    extras = project["optional-dependencies"]
    assert "tfrecord" not in extras and "webdataset" not in extras  # never imported by unihub; both pull torch
    assert any(d.startswith("tfrecord") for d in extras["test"]) and any(d.startswith("webdataset")
                                                                        for d in extras["test"])
    assert {re.split(r"[<>=]", d)[0] for d in extras["cli"]} == {"tqdm", "argcomplete"}


def _checkout_files() -> list[Path]:
    """The files git would ship (tracked, and new ones not ignored); every file when this is no git checkout."""
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, check=True, timeout=60).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return [p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    return [Path(name) for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("unihub-*.whl")
    return wheel


def _core_requirements(wheel: Path) -> set[str]:
    """The distributions the wheel needs without extras, with what they need in turn."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip() for line in archive.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    needed: set[str] = set()
    todo = [r for r in requires if "extra ==" not in r]
    while todo:
        name = re.split(r"[<>=!~ \[;(]", todo.pop(), maxsplit=1)[0].lower()
        if name not in needed:
            needed.add(name)
            todo += [r for r in (metadata.requires(name) or []) if ";" not in r]
    return needed


def _link_installed(names: set[str], site: Path) -> None:
    """Make ``site`` hold these installed distributions (links to their files here), and nothing else."""
    site.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            origin = Path(str(dist.locate_file(top)))
            if origin.exists() and not (site / top).exists():
                (site / top).symlink_to(origin)


@pytest.mark.slow
def test_wheel_ships_every_subpackage_and_works_in_a_clean_venv(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    shipped = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("/__init__.py") or
               n == "unihub/__init__.py"}
    assert shipped == _repo_packages()
    for path in ("unihub/py.typed", "unihub/cli/__init__.py", "unihub/cli/__main__.py", "unihub/schema/codecs/image.py",
                 "unihub/formats/tfrecord/format.py", "unihub/bridges/torch/loaders.py", "unihub/readers/pytorch.py"):
        assert path in names, path
    assert not any(set(n.split("/")[1:2]) & {"tests", "docs", "benchmarks", "scripts", "mkdocs.yml"} for n in names), names

    core = _core_requirements(wheel)
    assert {"numpy", "pyarrow", "imagecodecs", "simplejpeg", "isal"} <= core and not core & {"tqdm", "argcomplete", "torch"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    _link_installed(core, tmp_path / "core")
    Path(purelib, "core_deps.pth").write_text(str(tmp_path / "core") + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                              "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]

    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    clean["UNIHUB_DISABLE_PROGRESS_BAR"] = "0"
    version = subprocess.run([str(venv / "bin" / "unihub"), "--version"], capture_output=True, text=True,
                             env=clean, cwd=tmp_path, timeout=120)
    assert version.returncode == 0 and version.stdout == f"unihub {unihub.__version__}\n", version.stderr

    script = f"""
import json, sys
import numpy as np, pyarrow as pa
import unihub
from unihub import Unischema, UnischemaField, ScalarCodec, TensorCodec, CompressedImageCodec, write_dataset, make_reader
S = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                    UnischemaField("t", np.float32, (2, 3), TensorCodec(), False),
                    UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False)])
rows = [{{"id": i, "t": np.full((2, 3), i / 3, np.float32), "image": np.full((8, 8, 3), i, np.uint8)}}
        for i in range(20)]
write_dataset({str(tmp_path / "ds")!r}, S, rows)
with make_reader({str(tmp_path / "ds")!r}, shuffle_row_groups=False, reader_pool_type="dummy") as reader:
    got = sorted(reader, key=lambda r: r.id)
assert [r.id for r in got] == list(range(20))
assert all(np.array_equal(r.t, w["t"]) and np.array_equal(r.image, w["image"]) for r, w in zip(got, rows))
print(json.dumps({{"file": unihub.__file__, "loaded": sorted(m for m in ("tqdm", "argcomplete", "torch",
      "tensorflow", "h5py", "pyspark") if m in sys.modules)}}))
"""
    used = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=clean, cwd=tmp_path,
                          timeout=120)
    assert used.returncode == 0, used.stderr[-3000:]
    found = json.loads(used.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(purelib) and found["loaded"] == []  # the wheel's copy, nothing optional

    # the command line without tqdm or argcomplete: a conversion, progress on request as plain lines
    converted = subprocess.run([str(venv / "bin" / "unihub"), "convert", str(tmp_path / "ds"), str(tmp_path / "ds2")],
                               capture_output=True, text=True, env=clean, cwd=tmp_path, timeout=120)
    assert converted.returncode == 0 and "converted 20 rows" in converted.stderr, converted.stderr
    no_completion = subprocess.run([str(venv / "bin" / "unihub"), "completion", "bash"], capture_output=True,
                                   text=True, env=clean, cwd=tmp_path, timeout=120)
    assert no_completion.returncode == 1 and "pip install 'unihub[cli]'" in no_completion.stderr


def _package_sources() -> list[Path]:
    """Every shipped module of the checkout (not tests, benchmarks or scripts)."""
    return [p for p in ROOT.rglob("*.py") if not (set(p.relative_to(ROOT).parts[:-1]) & NOT_SHIPPED)
            and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def _extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _hints_of_require_calls() -> list[tuple[str, str]]:
    """``(where, extra)`` for every ``require(...)`` call in the package: the extra its error would name
    (``extra=`` when given, else the module's entry in :data:`unihub.dependencies.EXTRAS`)."""
    import ast

    from unihub.dependencies import EXTRAS

    found = []
    for path in _package_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"):
                continue
            given = {k.arg: k.value for k in node.keywords}
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if "extra" in given and isinstance(given["extra"], ast.Constant):
                found.append((where, given["extra"].value))
            elif node.args and isinstance(node.args[0], ast.Constant):
                module = node.args[0].value
                found.append((where, EXTRAS.get(module.split(".")[0]) or EXTRAS.get(module, "all")))
            else:  # a computed module or extra: its values must be checked where they are computed
                found.append((where, "<computed>"))
    return found


def test_every_install_hint_names_an_extra_that_exists() -> None:
    """What ``require()`` and every "pip install 'unihub[x]'" text in the package can print names a real
    extra (a hint once said ``unihub[tfrecord]``, which never existed)."""
    from unihub.dependencies import EXTRAS

    extras = _extras()
    assert set(EXTRAS.values()) <= extras, set(EXTRAS.values()) - extras
    calls = _hints_of_require_calls()
    assert len(calls) >= 20  # the scan sees the package's calls
    wrong = [(where, extra) for where, extra in calls if extra not in extras and extra != "<computed>"]
    assert not wrong, f"require() hints naming extras pyproject lacks: {wrong}"
    texts = [(str(p.relative_to(ROOT)), m) for p in _package_sources()
             for m in re.findall(r"unihub\[([A-Za-z0-9_,-]+)\]", p.read_text())]
    assert texts and not [(where, m) for where, m in texts if not set(m.split(",")) <= extras]
    # the computed ones pass their extra on from a call of their own (spark_converter._bridge)
    computed = [where for where, extra in calls if extra == "<computed>"]
    assert [where.split(":")[0] for where in computed] == ["bridges/spark/converter.py"], computed
    import ast

    bridged = [node.args[3].value for node in ast.walk(ast.parse((ROOT / "bridges/spark/converter.py").read_text()))
               if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_bridge"]
    assert bridged and set(bridged) <= extras


def test_missing_dependency_error_names_an_existing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error itself, raised for each optional framework the package maps, names an extra pyproject has."""
    import importlib

    from unihub.dependencies import EXTRAS, require
    from unihub.errors import MissingDependencyError

    extras = _extras()

    def not_installed(name: str, package: str | None = None) -> object:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(importlib, "import_module", not_installed)
    for module in EXTRAS:
        with pytest.raises(MissingDependencyError) as raised:
            require(module)
        named = re.search(r"pip install 'unihub\[([a-z0-9_-]+)\]'", str(raised.value))
        assert named and named.group(1) in extras, str(raised.value)
