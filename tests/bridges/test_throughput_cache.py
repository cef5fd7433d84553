"""``unihub throughput --cache-location`` / ``reader_throughput`` with a local-disk cache: the cache's
hits, misses and bytes of the run and of the node are reported."""

from __future__ import annotations

import json
from pathlib import Path

from unihub import open_dataset, reader_throughput
from unihub.cli import main

PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"


def test_a_cached_run_reports_the_cache(tmp_path):
    cache = tmp_path / "cache"
    groups = len(open_dataset(PETASTORM).row_groups)
    args = {"cache_type": "local-disk", "cache_location": str(cache), "cache_size_limit": 2**30,
            "cache_extra_settings": {"cleanup": False}}
    # 60 rows, 150 cycles: every row group is read twice or more, the first time from the store
    first = reader_throughput(str(PETASTORM), ["id"], warmup_cycles_count=0, measure_cycles_count=150,
                              pool_type="dummy", spawn_new_process=False, reader_extra_args=args)
    reader, node = first.cache_stats["reader"], first.cache_stats["node"]
    assert reader["misses"] == reader["fetches"] == groups and reader["hits"] >= groups
    assert reader["bytes_fetched"] > 0 and reader["bytes_served"] >= reader["bytes_fetched"]
    assert node["entries"] == groups and node["fetches"] == groups
    assert reader_throughput(str(PETASTORM), ["id"], warmup_cycles_count=0, measure_cycles_count=10,
                             pool_type="dummy", spawn_new_process=False).cache_stats is None


def test_cli_prints_and_keeps_the_cache(tmp_path, capsys):
    cache = tmp_path / "cache"
    command = ["throughput", str(PETASTORM), "--field-regex", "id", "-p", "dummy", "-m", "0", "-n", "60",
               "--in-process", "--quiet", "--cache-location", str(cache)]
    assert main(command) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Average sample read rate: ")
    assert out[1].startswith(f"Cache {cache}: this run 0 hits (0 after waiting for another's fetch), ")
    assert out[2].startswith("  node (every process using it): ")
    assert main([*command, "--json"]) == 0  # a second run, from the cache the first one kept
    result = json.loads(capsys.readouterr().out)
    assert result["cache"]["reader"]["misses"] == 0 and result["cache"]["reader"]["hits"] > 0
    assert result["cache"]["node"]["hits"] == result["cache"]["reader"]["hits"]
    assert result["cache"]["location"] == str(cache)
