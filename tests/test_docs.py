"""The ```python blocks of README.md and of every page under docs/ run as tests, so the documentation cannot drift.

Each page's blocks run in order, in one namespace of their own (a page is read top to bottom). Paths are the
page's and are moved into a temporary directory of the page as the blocks run: ``/data/...`` (and
``file:///data/...``) go under it, ``s3://bucket/...`` into a folder of the page in a bucket of the moto S3 server
the ``s3_server`` fixture starts (``AWS_ENDPOINT_URL`` points at it; ``s3://bucket/table`` is a plain Parquet table
there). A few names stand for the reader's own code and data and are given by :func:`_stand_ins`: ``url`` (a dataset
of 1,000 rows written as guide/writing.md writes one: ``id``, a 64×64×3 PNG ``image``, ``embedding``, ``boxes``,
``caption``, ``label``), ``train_step``, ``a``/``b`` (two such datasets), ``files``/``decode`` (PNG files and a
tf.data decoder), ``rank``/``world``, ``s3_options``. A block that cannot run here is marked by the line
``<!-- test: skip (why) -->`` right before its fence; it shows as a skipped test with that reason.

Besides running them, every ``unihub`` name the pages use is imported (:func:`test_every_unihub_name_the_docs_use_exists`):
the modules and names of ``from unihub... import ...`` and ``import unihub...`` in python blocks and code spans,
and dotted names such as ``unihub.images.decoders.MAX_IMAGE_PIXELS``, skipped blocks included.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shutil
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import unihub
from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset

ROOT = Path(unihub.__file__).resolve().parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"(?:^<!-- test: skip \((?P<why>[^\n]+?)\) -->\n)?```python\n(?P<code>.*?)^```", re.S | re.M)
#: inline code spans and fenced blocks of any language, for the names they use
_CODE = re.compile(r"```[^\n]*\n(?P<block>.*?)^```|`(?P<span>[^`\n]+)`", re.S | re.M)
_DOTTED = re.compile(r"(?<![\w./-])unihub(?:\.[A-Za-z_]\w*)+")
#: dotted names in the pages that are not Python names: metadata keys of the Parquet footer, a Spark conf key
NOT_PYTHON_NAMES = frozenset({"unihub.unischema", "unihub.extra", "unihub.spark.converter.parentCacheDirUrl"})


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int
    code: str
    skip: str | None


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def page_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [Block(page_name(path), text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("why"))
            for m in _BLOCK.finditer(text)]


BLOCKS = {page_name(path): page_blocks(path) for path in PAGES}
ALL_BLOCKS = [block for blocks in BLOCKS.values() for block in blocks]


def test_the_readme_has_python_examples_and_few_skips() -> None:
    readme = BLOCKS["README.md"]
    assert len(readme) >= 5
    assert len([b for b in readme if b.skip]) <= 2


def test_the_readme_stays_a_front_page() -> None:
    """README.md is what, install, the commands, an example per job and links (issue 38: ~250 lines at most);
    the rest belongs in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move the detail to a page under docs/"


def test_the_readmes_links_into_the_repository_resolve() -> None:
    """README.md is read on its own (GitHub, PyPI), outside the docs build that checks the pages' links."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert len(targets) >= 10
    missing = sorted({t for t in targets if t and not (ROOT / t).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_skip_says_why() -> None:
    vague = [f"{b.page}:{b.line}" for b in ALL_BLOCKS if b.skip is not None and len(b.skip) <= 20]
    assert not vague, f"a skip's reason must say why the block cannot run here: {vague}"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    """.ci/run calls the test command README.md gives: the two may not drift apart."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("bash scripts/setup.sh")]
    assert len(ci) == 1
    assert ci[0] in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()


class Session:
    """The namespace one page's blocks share, and which of them have run."""

    def __init__(self, page: str, root: Path, bucket: str, stand_ins: dict[str, Any]) -> None:
        self.page, self.root, self.bucket = page, root, bucket
        self.namespace: dict[str, Any] = {"__name__": page.replace("/", ".").removesuffix(".md"), **stand_ins}
        self.done = 0

    def localize(self, code: str) -> str:
        data = str(self.root / "data")
        code = code.replace("file:///data/", f"file://{data}/").replace('"/data/', f'"{data}/')
        return code.replace("s3://bucket/", f"s3://{self.bucket}/docs/{slug(self.page)}/")

    def run_until(self, index: int) -> None:
        """Run the page's blocks before ``index`` that have not run, then block ``index``."""
        blocks = BLOCKS[self.page]
        while self.done <= index:
            block = blocks[self.done]
            self.done += 1
            if block.skip:
                continue
            try:
                exec(compile(self.localize(block.code), f"{block.page}:{block.line}", "exec"), self.namespace)
            except Exception:  # the page's line numbers in the traceback
                pytest.fail(f"{block.page} block at line {block.line} failed:\n{traceback.format_exc()}")


def slug(page: str) -> str:
    return re.sub(r"\W", "-", page.removesuffix(".md"))


def example_schema() -> Unischema:
    """guide/writing.md's schema: what ``url`` holds."""
    return Unischema("Schema", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
        UnischemaField("embedding", np.float32, (128,), TensorCodec(), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
        UnischemaField("caption", np.str_, (), ScalarCodec(pa.string()), True),
        UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
    ])


def write_example(path: Path, rows: int = 1000) -> None:
    rng = np.random.default_rng(0)
    write_dataset(path, example_schema(), ({
        "id": i, "image": rng.integers(0, 255, (64, 64, 3), np.uint8), "embedding": rng.random(128, np.float32),
        "boxes": rng.random((int(rng.integers(0, 5)), 4), np.float32), "caption": None, "label": i % 10,
    } for i in range(rows)))


def write_images(folder: Path, count: int = 1300) -> list[str]:
    """PNG files for the caching examples: more than the cache example's start_offset (1200)."""
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = []
    for i in range(count):
        path = folder / f"{i:04d}.png"
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(path)
        files.append(str(path))
    return files


def _stand_ins(root: Path, example: Path, files: list[str], s3_options: dict[str, Any]) -> dict[str, Any]:
    """What the blocks take as the reader's own: a dataset, a training step, image files, a decoder."""
    shutil.copytree(example, root / "example")  # a page may add to its dataset (an index): a copy of its own

    def decode(path: Any) -> dict[str, Any]:
        import tensorflow as tf

        return {"image": tf.io.decode_png(tf.io.read_file(path), channels=3)}

    url = f"file://{root}/example"
    return {"train_step": lambda *columns: None, "url": url, "a": url, "b": url, "files": files, "decode": decode,
            "rank": 0, "world": 1, "s3_options": s3_options}


@pytest.fixture(scope="module")
def session_of(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[Callable[[str], Session]]:
    """One session per page, made when the page's first block runs."""
    shared = tmp_path_factory.mktemp("docs-shared")
    example = shared / "example"
    write_example(example)
    files = write_images(shared / "images")
    filesystem = s3_server.pyarrow_filesystem()
    sessions: dict[str, Session] = {}

    def session(page: str) -> Session:
        if page not in sessions:
            root = tmp_path_factory.mktemp(slug(page))
            # the plain Parquet table the batch-reader examples read from S3
            table = pa.table({"label": pa.array(np.arange(100) % 10),
                              "x": pa.array(np.arange(100, dtype=np.float32))})
            pq.write_table(table, f"{s3_server.bucket}/docs/{slug(page)}/table/part-0.parquet", filesystem=filesystem)
            sessions[page] = Session(page, root, s3_server.bucket,
                                     _stand_ins(root, example, files, s3_server.storage_options()))
        patch.chdir(sessions[page].root)
        return sessions[page]

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)  # for the blocks that give no storage_options
        yield session
    filesystem.delete_dir_contents(f"{s3_server.bucket}/docs", missing_dir_ok=True)


PARAMS = [(page, index) for page, blocks in BLOCKS.items() for index in range(len(blocks))]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # the examples' num_workers=4 on 2 cores
@pytest.mark.parametrize(("page", "index"), PARAMS, ids=[f"{p}:{BLOCKS[p][i].line}" for p, i in PARAMS])
def test_docs_block_runs(page: str, index: int, session_of: Callable[[str], Session]) -> None:
    block = BLOCKS[page][index]
    if block.skip:
        pytest.skip(f"{page}:{block.line}: {block.skip}")
    session_of(page).run_until(index)


# --- every unihub name the pages use exists ---------------------------------------------------------------------


@dataclass(frozen=True)
class Name:
    where: str  # page:line
    module: str
    attribute: str | None  # None: the module itself


def _imports(code: str) -> Iterator[tuple[str, str | None]]:
    """(module, name) of each unihub import in ``code``; nothing when it is not Python."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "unihub" and not node.level:
            for alias in node.names:
                yield node.module, None if alias.name == "*" else alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "unihub":
                    yield alias.name, None


def names_used(text: str, page: str) -> list[Name]:
    """The unihub modules and names a page imports or names in its code (blocks and spans)."""
    found: list[Name] = []
    for match in _CODE.finditer(text):
        code = match.group("block") if match.group("block") is not None else match.group("span")
        where = f"{page}:{text.count(chr(10), 0, match.start()) + 1}"
        found += [Name(where, module, name) for module, name in _imports(code)]
        found += [Name(where, dotted, None) for dotted in _DOTTED.findall(code) if dotted not in NOT_PYTHON_NAMES]
    return found


def resolves(name: Name) -> bool:
    """Whether ``name`` imports: a module, a module's attribute, or a dotted path ending in attributes."""
    parts = name.module.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:] + ([name.attribute] if name.attribute else []):
            if not hasattr(target, attribute):
                try:  # a submodule not imported by its package yet
                    target = importlib.import_module(f"{target.__name__}.{attribute}")
                    continue
                except (ImportError, AttributeError):
                    return False
            target = getattr(target, attribute)
        return True
    return False


def test_every_unihub_name_the_docs_use_exists() -> None:
    names = [name for path in PAGES for name in names_used(path.read_text(encoding="utf-8"), page_name(path))]
    assert len(names) >= 20  # the pages do name the API
    missing = sorted({f"{n.where}: {n.module}{'.' + n.attribute if n.attribute else ''}" for n in names
                      if not resolves(n)})
    assert not missing, "names the docs use that unihub lacks:\n" + "\n".join(missing)


def test_the_name_check_fails_on_a_missing_name() -> None:
    """The check above can fail: a page naming a function that does not exist is caught, in every form."""
    text = ("```python\nfrom unihub import make_reader, no_such_function\nimport unihub.no_such_module\n```\n"
            "Call `unihub.readers.no_such_name()` or `from unihub.store import nothing_here`; "
            "`unihub.extra` is a metadata key.\n")
    found = names_used(text, "probe.md")
    assert {(n.module, n.attribute) for n in found if not resolves(n)} == {
        ("unihub", "no_such_function"), ("unihub.no_such_module", None), ("unihub.readers.no_such_name", None),
        ("unihub.store", "nothing_here")}
    assert {(n.module, n.attribute) for n in found if resolves(n)} == {("unihub", "make_reader"), ("unihub.store", None)}


def test_sphinx_roles_in_docstrings_render_as_what_sphinx_prints():
    """The API reference's Griffe extension (docs/sphinx_roles.py): a role is a code span, never literal text."""
    spec = importlib.util.spec_from_file_location("sphinx_roles", ROOT / "docs" / "sphinx_roles.py")
    assert spec is not None and spec.loader is not None
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    text = (":class:`~unihub.readers.reader.Reader` from :func:`make_reader`, :py:meth:`Reader.stop`, "
            ":mod:`unihub.bridges.torch`, :class:`the reader <unihub.readers.reader.Reader>`, ``:class:`` alone")
    assert roles.render_roles(text) == ("`Reader` from `make_reader`, `Reader.stop`, `unihub.bridges.torch`, "
                                        "`the reader`, ``:class:`` alone")
