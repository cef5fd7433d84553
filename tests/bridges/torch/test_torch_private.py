"""torch's private API: used in ``bridges/torch/_torch_private.py`` only, and each use still works with the
installed torch (these tests are the ones to read first when torch is upgraded)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from unihub.bridges.torch import _torch_private as torch_private  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[3]
PRIVATE_MODULE = PACKAGE / "bridges" / "torch" / "_torch_private.py"
#: a private attribute reached through torch (torch._C, torch.utils.data._utils, UntypedStorage._new_shared),
#: torch's reductions module, and the private names torch's internals are found by
PRIVATE_USE = re.compile(r"(?<![\w.])torch(?:\.\w+)*\._\w+|from torch[\w.]* import[^\n]*\b_\w+|\breductions\b|"
                         r"\b(?:_share_fd_cpu_|_cdata|_untyped_storage|_storage_Use_Count|_new_shared|"
                         r"_MapDatasetFetcher|_worker_loop)\b")


def _package_modules() -> list[Path]:
    """The package's own modules: not its tests, benchmarks, scripts, nor the virtualenvs beside them."""
    skipped = {"tests", "benchmarks", "scripts", "docs", "__pycache__"}
    modules = []
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d not in skipped and not d.startswith(".")]
        modules.extend(Path(root) / name for name in files if name.endswith(".py"))
    return modules


def test_torch_private_api_is_used_in_one_module_only():
    uses = {str(path.relative_to(PACKAGE)): sorted(set(PRIVATE_USE.findall(path.read_text(encoding="utf-8"))))
            for path in _package_modules() if path != PRIVATE_MODULE}
    assert {path: found for path, found in uses.items() if found} == {}
    assert PRIVATE_USE.search(PRIVATE_MODULE.read_text(encoding="utf-8"))  # the pattern does find them


def test_the_pattern_finds_each_kind_of_private_use():
    for line in ("from torch.utils.data._utils.collate import collate", "torch._C._storage_Use_Count(s._cdata)",
                 "torch.UntypedStorage._new_shared(8)", "from torch.multiprocessing import reductions",
                 "fd, n = storage._share_fd_cpu_()", "frame.f_code.co_name == '_worker_loop'"):
        assert PRIVATE_USE.search(line), line
    for line in ("torch.utils.data.get_worker_info() is None and torch.from_numpy(a)",
                 "from unihub.bridges.torch._torch_private import new_shared_storage"):
        assert not PRIVATE_USE.search(line), line


def test_collate_internals_are_torch_default_collate_s():
    from torch.utils.data import default_collate

    collate_map = torch_private.default_collate_fn_map()
    assert collate_map.get(torch.Tensor) is not None
    assert torch_private.collates_tensors_as_torch(collate_map)
    assert not torch_private.collates_tensors_as_torch({torch.Tensor: lambda batch, **_: batch})
    batch = [{"x": torch.tensor([1, 2])}, {"x": torch.tensor([3, 4])}]
    assert torch.equal(torch_private.collate(batch, collate_map)["x"], default_collate(batch)["x"])


def test_storages_are_made_shared_and_counted():
    storage = torch_private.new_shared_storage(64)
    assert storage.is_shared() and storage.nbytes() == 64
    assert torch_private.counts_storage_uses()
    alone = torch_private.storage_use_count(storage)
    view = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (64,))
    assert torch_private.storage_use_count(storage) == alone + 1
    del view
    assert torch_private.storage_use_count(storage) == alone
    typed = torch.TypedStorage(4, dtype=torch.float32)
    assert torch_private.untyped_storage(typed).data_ptr() == typed._untyped_storage.data_ptr()
    assert torch_private.untyped_storage(storage) is storage


def test_frames_outside_torch_s_loops_are_not_taken_for_them():
    frame = sys._getframe()
    assert torch_private.worker_result_queue(frame) is None
    assert torch_private.map_fetcher_collating_by_default(frame) is False
