"""Petastorm's own test suite, run against real Petastorm 0.13.1 and against unihub.

Petastorm's wheel ships its tests (``petastorm/tests/*.py``). This script copies them out of the
Petastorm venv (``.venv-petastorm``, built by ``benchmarks/petastorm_env.py``) and runs them twice
with pytest, one process per test file:

1. in ``.venv-petastorm``, against real Petastorm;
2. in the project's ``.venv``, against unihub through ``benchmarks/petastorm_shim/petastorm``, a
   package of pure re-exports of unihub's public names under Petastorm's module paths (no logic:
   ``tests/test_petastorm_shim.py`` guards that). The copied tests become its ``petastorm.tests``
   (and ``petastorm/test_util``, Petastorm's ``ReaderMock``, is copied beside them). A test name a
   test file imports that unihub lacks becomes a placeholder raising ``NotInUnihub`` when used
   (``petastorm_shim/conformance_plugin.py``), so it fails the tests that use it, not its file.

Both runs get ``petastorm_shim/sitecustomize.py``: the tests' spellings that this Python and NumPy 2
removed (``inspect.getargspec``, ``np.unicode_``, ``np.string_``) as aliases of what they meant.

A test is *applicable* when it passes on real Petastorm and tests public behaviour (the excluded
files and tests of Petastorm's private internals, and four whose own code needs pyarrow < 15, are
listed below, each with its reason). The
table gives how many applicable tests pass on unihub and every failure's cause (exception type and
the first line of its message), grouped::

    python benchmarks/petastorm_conformance.py                      # everything: ~15-30 min on 2 cores
    python benchmarks/petastorm_conformance.py --only test_unischema.py --only test_predicates.py
    python benchmarks/petastorm_conformance.py --json out.json --markdown out.md

Petastorm's legacy datasets (``petastorm/tests/data/legacy``) are not in the wheel; the copies in
``tests/fixtures/petastorm_legacy`` are put there when present. The real run's results are kept in
``benchmarks/results/petastorm_conformance_real.json`` and reused (``--rerun-real`` to redo them).
The two runs go side by side. One test may run ``--timeout`` seconds (default 180); a test past it fails as ``Timeout`` and the
rest of its file runs on in a new process. Spark tests run when a local Spark starts
(``SPARK_LOCAL_IP=127.0.0.1``); otherwise they are listed as not run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIM_ROOT = Path(__file__).resolve().parent / "petastorm_shim"
PETASTORM_PYTHON = REPO_ROOT / ".venv-petastorm" / "bin" / "python"
UNIHUB_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
LEGACY_DATASETS = REPO_ROOT / "tests" / "fixtures" / "petastorm_legacy"
REAL_RESULTS_CACHE = REPO_ROOT / "benchmarks" / "results" / "petastorm_conformance_real.json"
FILE_TIMEOUT_S = 900  # one pytest process, a backstop behind the per-test timeout

#: Test files of Petastorm's private internals: not applicable, never run.
EXCLUDED_FILES: dict[str, str] = {
    "test_arrow_table_serializer.py": "petastorm.reader_impl.arrow_table_serializer: the process pool's transport",
    "test_pickle_serializer.py": "petastorm.reader_impl.pickle_serializer: the process pool's transport",
    "test_shuffling_buffer.py": "petastorm.reader_impl.*shuffling_buffer classes: the readers' internals",
    "test_fs_utils.py": "imports pyarrow.filesystem (removed in pyarrow 15), s3fs and gcsfs, and drives "
                        "FilesystemResolver through petastorm.hdfs's namenode mocks (Petastorm's HDFS internals); "
                        "unihub's FilesystemResolver is checked against Petastorm's results in tests/fs/test_resolver.py",
    "test_spark_session_cli.py": "petastorm.tools.spark_session_cli: argparse helpers of Petastorm's CLIs",
    "test_benchmark.py": "petastorm.benchmark.throughput: the benchmark CLI's pools and _time_warmup_and_work",
    "test_run_in_subprocess.py": "petastorm.utils.run_in_subprocess: an internal helper",
    "test_generate_metadata.py": "petastorm.etl.petastorm_generate_metadata._main: the CLI's argparse entry",
}

_REMOVED_PYARROW = ("the test itself calls pyarrow API removed in pyarrow 15 (pq.PartitionSet, pyarrow.LocalFileSystem); "
                    "unihub needs pyarrow >= 15")
_FIELD_ORDER = "patches petastorm.unischema._UNISCHEMA_FIELD_ORDER (a private switch to alphabetical fields)"

#: Single tests of private internals or of removed pyarrow API (``file::name``, any parameters), each with its reason.
EXCLUDED_TESTS: dict[str, str] = {
    "test_copy_dataset.py::test_copy_and_overwrite_cli": "petastorm.tools.copy_dataset._main: the CLI's argparse entry",
    "test_copy_dataset.py::test_copy_some_fields_with_repartition_cli": "petastorm.tools.copy_dataset._main",
    "test_copy_dataset.py::test_copy_not_null_rows_cli": "petastorm.tools.copy_dataset._main",
    "test_end_to_end.py::test_transform_function_batched": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_basic": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_basic_longer": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_basic_shuffle_multi_partition": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_basic_longer_shuffle_multi_partition": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_basic_longer_no_overlap": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_delta_threshold": _FIELD_ORDER,
    "test_ngram_end_to_end.py::test_ngram_with_regex_fields": _FIELD_ORDER,
    "test_tf_utils.py::test_schema_to_dtype_list": f"tf_utils._schema_to_tf_dtypes; {_FIELD_ORDER}",
    "test_tf_utils.py::test_transform_function_new_field": _FIELD_ORDER,
    "test_tf_utils.py::test_transform_function_new_field_batched": _FIELD_ORDER,
    "test_tf_utils.py::test_sanitize_field_tf_types": "petastorm.tf_utils._sanitize_field_tf_types",
    "test_tf_utils.py::test_decimal_conversion": "petastorm.tf_utils._numpy_to_tf_dtypes",
    "test_tf_utils.py::test_uint16_promotion_to_int32": "petastorm.tf_utils._numpy_to_tf_dtypes",
    "test_tf_utils.py::test_unknown_type": "petastorm.tf_utils._numpy_to_tf_dtypes",
    "test_tf_utils.py::test_ngram_generator": "petastorm.tf_utils._ngrams_generator / _unflatten_and_set_shape",
    "test_reader_mock.py::ReaderMockTest::test_simple_read_tf": "petastorm.tf_utils._numpy_to_tf_dtypes",
    "test_parquet_reader.py::test_transform_spec_support_return_tensor": "patches arrow_reader_worker.ArrowReaderWorker",
    "test_parquet_reader.py::test_transform_spec_support_return_tensor_with_convert_early_to_numpy":
        "patches arrow_reader_worker.ArrowReaderWorker",
    "test_parquet_reader.py::test_shuffle_cache_num_rows_zero": "patches ArrowReaderWorker._load_rows",
    "test_parquet_reader.py::test_shuffle_cache_pyarrow_num_rows_zero": "patches ArrowReaderWorker._load_rows",
    "test_parquet_reader.py::test_convert_arrow_table_to_numpy_dict_inconsistent_list_lengths":
        "petastorm.arrow_reader_worker.convert_arrow_table_to_numpy_dict: the batch worker's internals",
    "test_parquet_reader.py::test_convert_arrow_table_to_numpy_dict_consistent_list_lengths":
        "petastorm.arrow_reader_worker.convert_arrow_table_to_numpy_dict: the batch worker's internals",
    "test_pytorch_dataloader.py::test_sanitize_pytorch_types_int8": "petastorm.pytorch._sanitize_pytorch_types",
    "test_pytorch_dataloader.py::test_torch_tensorable_types": "petastorm.pytorch._sanitize_pytorch_types",
    "test_pytorch_dataloader.py::test_load_rows_into_mem": "petastorm.pytorch._load_rows_into_mem",
    "test_disk_cache.py::test_cleanup_handles_cache_close_error":
        "patches LocalDiskCache._cache.close (its private diskcache FanoutCache)",
    "test_disk_cache.py::test_cleanup_handles_attribute_error_on_close":
        "patches LocalDiskCache._cache.close (its private diskcache FanoutCache)",
    "test_unischema.py::test_new_gt_255_compatible_namedtuple": "petastorm.unischema._new_gt_255_compatible_namedtuple",
    "test_unischema.py::test_fullmatch": "petastorm.unischema._fullmatch",
    # petastorm.spark.spark_dataset_converter's private helpers and mocks of its internals
    "test_spark_dataset_converter.py::test_set_delete_handler": "spark_dataset_converter._delete_dir_handler",
    "test_spark_dataset_converter.py::test_df_delete_caching_meta": "spark_dataset_converter._cache_df_meta_list",
    "test_spark_dataset_converter.py::test_check_url": "spark_dataset_converter._check_url",
    "test_spark_dataset_converter.py::test_make_sub_dir_url": "spark_dataset_converter._make_sub_dir_url",
    "test_spark_dataset_converter.py::test_tf_dataset_petastorm_args":
        "patches spark_dataset_converter.make_batch_reader",
    "test_spark_dataset_converter.py::test_torch_dataloader_advanced_params":
        "patches spark_dataset_converter.make_batch_reader",
    "test_spark_dataset_converter.py::test_horovod_rank_compatibility":
        "spark_dataset_converter._get_horovod_rank_and_size / _check_rank_and_size_consistent_with_horovod",
    "test_spark_dataset_converter.py::test_wait_file_available": "spark_dataset_converter._wait_file_available",
    "test_spark_dataset_converter.py::test_check_dataset_file_median_size":
        "spark_dataset_converter._check_dataset_file_median_size",
    "test_spark_dataset_converter.py::test_check_parent_cache_dir_url":
        "spark_dataset_converter._check_parent_cache_dir_url / _is_spark_local_mode",
    "test_spark_dataset_converter.py::test_get_spark_session_safe_check": "spark_dataset_converter._get_spark_session",
    "test_spark_dataset_converter.py::test_normalize_databricks_dbfs_url":
        "spark_dataset_converter._normalize_databricks_dbfs_url",
    "test_reader.py::test_disable_zmq_copy_buffers_in_reader":
        "asserts the process pool's zmq transport setting (reader.diagnostics['zmq_copy_buffers'])",
    "test_parquet_reader.py::test_results_queue_size_propagation_in_make_batch_reader":
        "reads Reader._workers_pool._results_queue_size",
    # the test's own code uses pyarrow API removed in pyarrow 15: it cannot run on the pyarrow unihub needs
    "test_unischema.py::test_arrow_schema_convertion_with_int_partitions": _REMOVED_PYARROW,
    "test_unischema.py::test_arrow_schema_convertion_with_string_partitions": _REMOVED_PYARROW,
    "test_dataset_metadata.py::test_serialize_filesystem_factory": _REMOVED_PYARROW,
    "test_end_to_end.py::test_pass_in_pyarrow_filesystem_to_materialize_dataset": _REMOVED_PYARROW,
}


@dataclass
class RunResult:
    """Outcome of every test of one run: ``{test id: (outcome, cause)}``, plus collection errors."""

    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class RealResultsCache:
    """Real Petastorm's outcomes per test file, kept across runs; they only change with the venv, so they
    are kept for one ``environment`` (the venv's ``pip freeze``: a venv without tensorflow fails its TF tests)."""

    path: Path
    environment: str
    files: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    spark: bool = True

    @classmethod
    def load(cls, path: Path, environment: str) -> RealResultsCache:
        if not path.exists():
            return cls(path, environment)
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("environment") != environment:  # another venv: its results say nothing of this one
            return cls(path, environment)
        return cls(path, environment, data["files"], data["collect_errors"], data["seconds"], data["spark"])

    def add(self, name: str, result: RunResult, spark: bool) -> None:
        """Keep one file's outcomes (called as each file ends, so an interrupted run keeps what it did)."""
        self.files[name] = {key: list(value) for key, value in result.outcomes.items()}
        self.collect_errors.pop(name, None)
        self.collect_errors.update(result.collect_errors)
        self.seconds[name] = result.seconds
        self.spark = spark
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"environment": self.environment, "files": self.files, "collect_errors": self.collect_errors,
                "seconds": self.seconds, "spark": self.spark}
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(partial, self.path)  # whole or not at all, also with two runs at once

    def result(self, files: Sequence[str]) -> RunResult:
        outcomes = {key: (value[0], value[1]) for name in files for key, value in self.files.get(name, {}).items()}
        errors = {name: cause for name, cause in self.collect_errors.items() if name in files}
        return RunResult(outcomes, errors, sum(self.seconds.get(name, 0.0) for name in files))


def venv_environment(python: Path) -> str:
    """A digest of what ``python``'s venv has installed (``pip freeze``)."""
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    return hashlib.sha256(frozen.encode()).hexdigest()[:16]


def exclusion_reason(test_id: str) -> str | None:
    """Why ``test_id`` (``file::name[params]``) is not applicable, or None."""
    file_name, _, name = test_id.partition("::")
    if file_name in EXCLUDED_FILES:
        return EXCLUDED_FILES[file_name]
    base = f"{file_name}::{name.split('[')[0]}"
    return EXCLUDED_TESTS.get(base) or EXCLUDED_TESTS.get(f"{file_name}::")


def petastorm_tests_dir(python: Path = PETASTORM_PYTHON) -> Path:
    """The ``petastorm/tests`` folder inside the Petastorm venv (found without importing Petastorm)."""
    code = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('petastorm').origin))"
    # -P: the checkout holds unihub's own petastorm/ subpackage, which would shadow Petastorm from the cwd
    out = subprocess.run([str(python), "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    return Path(out.strip()) / "tests"


def prepare_tree(workdir: Path, tests_source: Path, *, shim: bool) -> Path:
    """Lay out one run's folder; returns the folder the copied tests are in."""
    workdir.mkdir(parents=True)
    (workdir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # stops pytest's search for an ini
    (workdir / "_harness").mkdir()  # the plugin alone on PYTHONPATH: SHIM_ROOT would shadow real Petastorm
    shutil.copy2(SHIM_ROOT / "conformance_plugin.py", workdir / "_harness" / "conformance_plugin.py")
    # aliases the tests spell (inspect.getargspec, np.unicode_, np.string_), in every process of the run
    shutil.copy2(SHIM_ROOT / "sitecustomize.py", workdir / "_harness" / "sitecustomize.py")
    if shim:
        shutil.copytree(SHIM_ROOT / "petastorm", workdir / "petastorm", ignore=shutil.ignore_patterns("__pycache__"))
        tests = workdir / "petastorm" / "tests"
    else:  # a package of another name: ``petastorm`` must stay the installed one
        tests = workdir / "petastorm_tests"
    shutil.copytree(tests_source, tests, ignore=shutil.ignore_patterns("__pycache__"))
    if shim:  # Petastorm's other test helper package (ReaderMock): plain Python over numpy, no Petastorm code
        shutil.copytree(tests_source.parent / "test_util", workdir / "petastorm" / "test_util",
                        ignore=shutil.ignore_patterns("__pycache__"))
    if LEGACY_DATASETS.is_dir():
        shutil.copytree(LEGACY_DATASETS, tests / "data" / "legacy")
    return tests


def spark_starts(python: Path, env: dict[str, str]) -> bool:
    code = ("from pyspark.sql import SparkSession\n"
            "s = SparkSession.builder.master('local[1]').getOrCreate()\n"
            "assert s.range(3).count() == 3\ns.stop()\n")
    try:
        return subprocess.run([str(python), "-c", code], env=env, capture_output=True, timeout=240).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def run_environment(python: Path, workdir: Path, *, shim: bool) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(workdir / "_harness")] + ([str(workdir)] if shim else [])
    if shim and os.environ.get("PYTHONPATH"):  # a unihub checkout put first by the caller (a git worktree)
        path.append(os.environ["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(path), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=str(python),
               PYSPARK_DRIVER_PYTHON=str(python), CONFORMANCE_PLACEHOLDERS="1" if shim else "0",
               PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


#: the exit status of a pytest process whose test ran past the per-test timeout (conformance_plugin.py)
_TIMED_OUT = 3
_RANK = {"failed": 4, "passed": 3, "xpassed": 3, "xfailed": 2, "skipped": 2, "deselected": 1}


def run_file(python: Path, workdir: Path, test_file: Path, env: dict[str, str], deselect: dict[str, str],
             timeout_s: float) -> RunResult:
    """Run one test file until every collected test has an outcome (restarting after a timeout)."""
    result = RunResult()
    started = time.monotonic()
    for attempt in range(50):
        records = workdir / f"{test_file.stem}.{attempt}.jsonl"
        skip = workdir / f"{test_file.stem}.{attempt}.deselect.json"
        skip.write_text(json.dumps({**deselect, **{key: "done" for key in result.outcomes}}), encoding="utf-8")
        run_env = dict(env, CONFORMANCE_RESULTS=str(records), CONFORMANCE_DESELECT=str(skip),
                       CONFORMANCE_TIMEOUT_S=str(timeout_s))
        command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p", "conformance_plugin", "-q",
                   "--no-header", "-rN", "-W", "ignore::DeprecationWarning", str(test_file)]
        try:
            proc = subprocess.run(command, cwd=workdir, env=run_env, capture_output=True, text=True,
                                  timeout=FILE_TIMEOUT_S)
            output = (proc.stdout + proc.stderr).strip().splitlines()
            returncode, tail = proc.returncode, output[-1:]
        except subprocess.TimeoutExpired:
            output, returncode, tail = [], -1, [f"Timeout: the file ran past {FILE_TIMEOUT_S} s"]
        if not records.exists():  # pytest stopped before collecting (e.g. conftest.py failed to import)
            errors = [line[1:].strip() for line in output if line.startswith("E ")]
            result.collect_errors[test_file.name] = (errors or tail or ["?"])[-1][:300]
            break
        collected: list[str] = []
        running: str | None = None
        for entry in _read_lines(records):
            if entry.get("event") == "collected":
                collected = entry["ids"]
            elif entry.get("event") == "collect_error":
                result.collect_errors[entry["file"]] = entry["cause"]
            elif entry.get("event") == "start":
                running = entry["id"]
            elif "outcome" in entry:
                old = result.outcomes.get(entry["id"])
                if old is None or _RANK[entry["outcome"]] >= _RANK[old[0]]:
                    result.outcomes[entry["id"]] = (entry["outcome"], entry.get("cause", ""))
        missing = [test_id for test_id in collected if test_id not in result.outcomes]
        if not missing:
            break
        if running in missing:  # the process died inside this test
            cause = f"Crash: pytest ended ({returncode}) during the test: {' '.join(tail)[:200]}"
            result.outcomes[running] = ("failed", cause)
        elif returncode == _TIMED_OUT and running is not None:  # the plugin ended a test that ran too long
            continue  # the next attempt runs the tests after it
        elif returncode in (0, 1):  # pytest ended normally yet some collected tests were never reported
            for test_id in missing:
                result.outcomes[test_id] = ("failed", "not reported by pytest")
            break
        else:
            for test_id in missing:
                result.outcomes[test_id] = ("failed", f"Crash: pytest ended ({returncode}): {' '.join(tail)[:200]}")
            break
    result.seconds = time.monotonic() - started
    return result


def run_suite(python: Path, tests_source: Path, files: Sequence[str], workdir: Path, *, shim: bool,
              timeout_s: float, log: Any, after_file: Any = None) -> tuple[RunResult, bool]:
    """Run ``files`` (names in Petastorm's tests folder) in one venv; returns the results and whether Spark ran."""
    tests = prepare_tree(workdir, tests_source, shim=shim)
    env = run_environment(python, workdir, shim=shim)
    spark = spark_starts(python, env)
    if not spark:
        env["CONFORMANCE_NO_SPARK"] = "1"
    total = RunResult()
    for name in files:
        excluded = {test_id: f"excluded: {reason}" for test_id, reason in EXCLUDED_TESTS.items()
                    if test_id.startswith(f"{name}::")}
        one = run_file(python, workdir, tests / name, env, excluded, timeout_s)
        total.outcomes.update(one.outcomes)
        total.collect_errors.update(one.collect_errors)
        total.seconds += one.seconds
        passed = sum(outcome == "passed" for outcome, _ in one.outcomes.values())
        log(f"  {'unihub' if shim else 'petastorm'} {name}: {passed}/{len(one.outcomes)} passed, {one.seconds:.0f} s")
        if after_file is not None:
            after_file(name, one, spark)
    return total, spark


# ---------------------------------------------------------------------------------------------- table

_ADDRESS = re.compile(r" at 0x[0-9a-f]+|/tmp/[^\s'\"]*")


def cause_key(cause: str) -> str:
    """A failure's cause with addresses and temporary paths blanked, so equal causes group."""
    return _ADDRESS.sub("…", cause)


def build_table(real: RunResult, unihub: RunResult, files: Sequence[str], spark: dict[str, bool]) -> dict[str, Any]:
    applicable, excluded, not_applicable = [], {}, Counter()
    for test_id, (outcome, _) in sorted(real.outcomes.items()):
        reason = exclusion_reason(test_id)
        if reason is not None:
            excluded[test_id] = reason
        elif outcome == "passed":
            applicable.append(test_id)
        else:
            not_applicable[outcome] += 1
    passing, failures = [], []
    for test_id in applicable:
        outcome, cause = unihub.outcomes.get(test_id, ("failed", ""))
        if outcome == "passed":
            passing.append(test_id)
            continue
        if test_id not in unihub.outcomes:
            cause = unihub.collect_errors.get(test_id.split("::")[0], "not collected on unihub (test id differs)")
        elif outcome != "failed":
            cause = f"{outcome} on unihub: {cause}"
        failures.append({"test": test_id, "cause": cause})
    groups: dict[str, list[str]] = defaultdict(list)
    for failure in failures:
        groups[cause_key(failure["cause"])].append(failure["test"])
    not_run = sorted(test_id for test_id, (outcome, cause) in real.outcomes.items()
                     if outcome == "deselected" and "Spark" in cause)
    return {
        "files": list(files),
        "applicable": len(applicable),
        "passing": len(passing),
        "percent": round(100.0 * len(passing) / len(applicable), 1) if applicable else 0.0,
        "failing": len(failures),
        "excluded_private": len(excluded),
        "not_passing_on_petastorm": dict(not_applicable),
        "spark": spark,
        "not_run_no_spark": not_run,
        "seconds": {"petastorm": round(real.seconds), "unihub": round(unihub.seconds)},
        "collect_errors": {"petastorm": real.collect_errors, "unihub": unihub.collect_errors},
        "failure_groups": [{"cause": cause, "count": len(tests), "tests": tests}
                           for cause, tests in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))],
        "excluded": excluded,
    }


def format_text(table: dict[str, Any]) -> str:
    lines = [
        "Petastorm 0.13.1's own tests on unihub (through benchmarks/petastorm_shim)",
        f"  applicable (pass on Petastorm, public behaviour): {table['applicable']}",
        f"  passing on unihub: {table['passing']} ({table['percent']}%)",
        f"  failing on unihub: {table['failing']}",
        f"  excluded (Petastorm's private internals, removed pyarrow API): {table['excluded_private']}",
        f"  not passing on Petastorm itself: {table['not_passing_on_petastorm']}",
        f"  Spark ran: {table['spark']}" + (f"; not run without Spark: {len(table['not_run_no_spark'])}"
                                            if table["not_run_no_spark"] else ""),
    ]
    for run, errors in table["collect_errors"].items():
        lines.extend(f"  {run}: {name} did not collect: {cause}" for name, cause in errors.items())
    lines += ["", "Failures by cause:"]
    for group in table["failure_groups"]:
        lines.append(f"  [{group['count']}] {group['cause']}")
        lines.extend(f"        {test}" for test in group["tests"])
    return "\n".join(lines)


def format_markdown(table: dict[str, Any]) -> str:
    lines = [
        "| applicable | passing on unihub | % | failing | excluded (private or removed pyarrow API) |",
        "|---|---|---|---|---|",
        f"| {table['applicable']} | {table['passing']} | {table['percent']}% | {table['failing']} "
        f"| {table['excluded_private']} |",
        "",
        "| failures | cause | tests |",
        "|---|---|---|",
    ]
    for group in table["failure_groups"]:
        cause = group["cause"].replace("|", "\\|")
        tests = ", ".join(f"`{test}`" for test in group["tests"][:5]) + (" …" if group["count"] > 5 else "")
        lines.append(f"| {group['count']} | {cause} | {tests} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def select_files(tests_source: Path, only: Iterable[str]) -> list[str]:
    every = sorted(path.name for path in tests_source.glob("test_*.py"))
    chosen = [name for name in every if name not in EXCLUDED_FILES and name != "test_common.py"]
    wanted = list(only)
    if wanted:
        unknown = [name for name in wanted if name not in every]
        if unknown:
            raise SystemExit(f"not among Petastorm's tests: {', '.join(unknown)}")
        chosen = [name for name in wanted if name in every]
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="FILE",
                        help="run only this test file (repeatable), e.g. test_unischema.py")
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the table as markdown here")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one test may run (default 180)")
    parser.add_argument("--rerun-real", action="store_true", help="run real Petastorm again, not its cached results")
    parser.add_argument("--real-only", action="store_true",
                        help="only run real Petastorm on the files its cached results lack (or all, with --rerun-real)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (printed)")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if not PETASTORM_PYTHON.exists():
        raise SystemExit(f"{PETASTORM_PYTHON} is missing: build it with python benchmarks/petastorm_env.py")
    if subprocess.run([str(PETASTORM_PYTHON), "-c", "import pytest"], capture_output=True).returncode != 0:
        raise SystemExit(f"pytest is missing in the Petastorm venv: {PETASTORM_PYTHON} -m pip install pytest pillow")
    for python in (PETASTORM_PYTHON, UNIHUB_PYTHON):  # Petastorm's test_common.py needs pytz
        if subprocess.run([str(python), "-c", "import pytz, six"], capture_output=True).returncode != 0:
            raise SystemExit(f"pytz or six is missing: {python} -m pip install pytz six")
    tests_source = petastorm_tests_dir()
    files = select_files(tests_source, args.only)
    scratch = Path(tempfile.mkdtemp(prefix="petastorm_conformance_"))
    cache = RealResultsCache.load(REAL_RESULTS_CACHE, venv_environment(PETASTORM_PYTHON))
    to_run = files if args.rerun_real else [name for name in files if name not in cache.files]
    try:
        if args.real_only:
            if to_run:
                run_suite(PETASTORM_PYTHON, tests_source, to_run, scratch / "petastorm", shim=False,
                          timeout_s=args.timeout, log=log, after_file=cache.add)
            log(f"real Petastorm's results cached for {len(cache.files)} files in {REAL_RESULTS_CACHE}")
            return 0
        with ThreadPoolExecutor(max_workers=2) as pool:  # the two runs side by side: mostly Spark and waiting
            real_run = pool.submit(run_suite, PETASTORM_PYTHON, tests_source, to_run, scratch / "petastorm",
                                   shim=False, timeout_s=args.timeout, log=log, after_file=cache.add) \
                if to_run else None
            unihub, spark_unihub = run_suite(UNIHUB_PYTHON, tests_source, files, scratch / "unihub", shim=True,
                                             timeout_s=args.timeout, log=log)
            if real_run is not None:
                real_run.result()
    finally:
        if args.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    real = cache.result(files)
    table = build_table(real, unihub, files, {"petastorm": cache.spark, "unihub": spark_unihub})
    print(format_text(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1), encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(format_markdown(table) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
