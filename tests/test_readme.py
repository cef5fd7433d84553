"""README.md's ```python blocks run, in order, in one namespace, so the documentation cannot drift.

Paths are the README's and are moved into a temporary directory as the blocks run: ``/data/...``
(and ``file:///data/...``) go under it, ``s3://bucket/...`` into a bucket of the moto S3 server the
``s3_server`` fixture starts (``AWS_ENDPOINT_URL`` points at it). A few names stand for the reader's own code and data and are given
by :func:`_stand_ins` (``train_step``, ``url``, ``a``/``b``, ``files``/``decode``, ``rank``/``world``,
``s3_options``). A block that cannot run here is marked in the README by the line
``<!-- test: skip (why) -->`` right before its fence; it shows as a skipped test with that reason.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import unihub

README = Path(unihub.__file__).resolve().parent / "README.md"
_BLOCK = re.compile(r"(?:^<!-- test: skip \((?P<why>[^\n]+?)\) -->\n)?```python\n(?P<code>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int
    code: str
    skip: str | None


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [Block(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("why"))
            for m in _BLOCK.finditer(text)]


BLOCKS = readme_blocks()


def test_the_readme_has_python_examples_and_few_skips() -> None:
    assert len(BLOCKS) >= 7
    skipped = [b for b in BLOCKS if b.skip]
    assert len(skipped) <= 2 and all(len(b.skip or "") > 20 for b in skipped)  # rare, and each says why


class Session:
    """The namespace the blocks share, and which of them have run."""

    def __init__(self, root: Path, bucket: str, s3_options: dict[str, Any]) -> None:
        self.root, self.bucket = root, bucket
        self.namespace: dict[str, Any] = {"__name__": "readme", **_stand_ins(root, s3_options)}
        self.done = 0

    def localize(self, code: str) -> str:
        data = str(self.root / "data")
        code = code.replace("file:///data/", f"file://{data}/").replace('"/data/', f'"{data}/')
        return code.replace("s3://bucket/", f"s3://{self.bucket}/readme/")

    def run_until(self, index: int) -> None:
        """Run the blocks before ``index`` that have not run, then block ``index``."""
        while self.done <= index:
            block = BLOCKS[self.done]
            self.done += 1
            if block.skip:
                continue
            try:
                exec(compile(self.localize(block.code), f"README.md:{block.line}", "exec"), self.namespace)
            except Exception:  # the README's line numbers in the traceback
                pytest.fail(f"README.md block at line {block.line} failed:\n{traceback.format_exc()}")


def _stand_ins(root: Path, s3_options: dict[str, Any]) -> dict[str, Any]:
    """What the README's blocks take as the reader's own: a training step, URLs, image files, a decoder."""
    from PIL import Image

    images = root / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = []
    for i in range(1300):  # more rows than the cache example's start_offset (1200)
        path = images / f"{i:04d}.png"
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(path)
        files.append(str(path))

    def decode(path: Any) -> dict[str, Any]:
        import tensorflow as tf

        return {"image": tf.io.decode_png(tf.io.read_file(path), channels=3)}

    url = f"file://{root}/data/train"
    return {"train_step": lambda *columns: None, "url": url, "a": url, "b": url, "files": files, "decode": decode,
            "rank": 0, "world": 1, "s3_options": s3_options}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("readme")
    # the plain Parquet table the batch-reader example reads from S3
    table = pa.table({"label": pa.array(np.arange(100) % 10), "x": pa.array(np.arange(100, dtype=np.float32))})
    filesystem = s3_server.pyarrow_filesystem()
    pq.write_table(table, f"{s3_server.bucket}/readme/table/part-0.parquet", filesystem=filesystem)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)  # for the blocks that give no storage_options
        yield Session(root, s3_server.bucket, s3_server.storage_options())
    filesystem.delete_dir_contents(f"{s3_server.bucket}/readme", missing_dir_ok=True)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # the example's num_workers=4 on 2 cores
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"README.md:{b.line}" for b in BLOCKS])
def test_readme_block_runs(index: int, session: Session) -> None:
    block = BLOCKS[index]
    if block.skip:
        pytest.skip(f"README.md:{block.line}: {block.skip}")
    session.run_until(index)
