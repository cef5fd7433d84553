"""unihub side by side with today's peers at their best, on the same content, in one run (issues 15, 39).

Content: ``--rows`` (100,000) rows of a ``--side`` x ``--side`` (64) JPEG (quality 90, 4:2:0, gradients +
noise so that decoding costs what real photos cost) + int64 label + float32[16], written once as
``content.npz`` and then in each tool's own format, cached under ``--data``
(``benchmarks/data/peers_<rows>[_<side>px]/``, git-ignored). Every contender reads one epoch in batches
of 64 and delivers decoded uint8 HWC images (torch tensors; tf tensors for the tf.data side), decoded by
simplejpeg (libjpeg-turbo; tf.data: TensorFlow's libjpeg-turbo, ``INTEGER_ACCURATE``).

Each peer is configured as its own docs recommend for speed and given the parallelism unihub uses (two
decode threads or two worker processes, whichever it supports; round 1 sweeps its settings and keeps its
best): Lance's scanner and ``LanceDataset`` decode with 1 or 2 threads (shuffled: ``ShardedBatchSampler
(randomize=True)``), ``SafeLanceDataset`` in ``get_safe_loader`` with 0-2 workers; HF datasets with 0 or 2
workers or a 2-thread transform; LitData and MosaicML Streaming (``CHUNK``-sized chunks/shards, like
unihub's row groups), WebDataset with 0-2 workers; Ray Data over one Parquet file per ``CHUNK``; tf.data
batched or per-record decode, deterministic or not. MosaicML Streaming imports torchvision, whose only
wheel for torch 2.13.0 needs CUDA: ``peers_env.py`` gives its venv a stand-in with what ``streaming`` imports.

Each run is a fresh subprocess in the contender's own venv (``peers_env.py`` builds the peers'
under ``benchmarks/.venvs/``; unihub and tf.data use this one), driven by ``peers_side.py``;
this process polls ``/proc`` every 20 ms for the RSS of that process and all its descendants.
PSS (forked workers share pages that RSS counts twice) comes from one more, untimed run of each
contender, reading ``smaps_rollup`` every 100 ms (``--quick``: in the timed run). Per run: rows/s from
creating the pipeline (imports, and Ray's ``ray.init``, excluded), **steady-state** rows/s (between the
batches crossing 10% and 90% of the epoch), time to first batch, and **CPU per 1,000 rows** (user + system seconds of the whole process tree,
workers included) and the part of it that is not JPEG decode (the decoder's own CPU per image, measured by
the decode-limit contender, subtracted). CPU is steadier than wall time on a shared machine. Later rounds
run each contender's best setting, all alternated; figures are min / median / max.

Targets (issue 39), evaluated in the output on the medians: each unihub torch path, shuffled and not,
>= 1.25x the fastest peer in steady-state rows/s and <= 0.5x that peer's non-decode CPU per row;
``make_tf_dataset`` >= 1.25x tf.data's best pipeline; (issue 15) time to first batch <= the fastest
peer's, peak RSS <= the lowest peer's x 1.2.

    python benchmarks/peers.py [--rounds 5] [--rows 100000] [--side 64] [--only unihub,tfdata,lance,...]
    python benchmarks/peers.py --quick       # 2k rows, 1 round, only the peers whose venvs exist; a smoke run:
                                             # sweeps try 2 settings, PSS is read in the timed run
    python benchmarks/peers.py --prepare     # build the venvs, write the content and every copy, stop
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers_env  # noqa: E402
from peers_side import CHUNK, decode, load_content, probe_digest  # noqa: E402

PROBES, POLL_S = 8, 0.02
FRONT_LOADED = 0.25  # a first batch after this share of the epoch: no steady state to measure (Tally.front_loaded)


@dataclass(frozen=True)
class Contender:
    """One way to read the content: which pipeline, in which venv, on which copy, with which settings."""

    label: str
    tool: str          # a peers_side.PIPELINES key
    family: str        # --only key: unihub, tfdata or a peers_env.PEERS name
    fmt: str           # a peers_side.WRITERS key
    options: dict[str, Any] = field(default_factory=dict)   # workers, threads, variant, ... (peers_side's job)
    shuffle: int = 0
    sweep: tuple[dict[str, Any], ...] = ()   # the options tried in round 1 (a peer's best is kept)

    @property
    def is_peer(self) -> bool:
        return self.family != "unihub"

    @property
    def setting(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.options.items()) or "defaults"


def _workers(*counts: int) -> tuple[dict[str, Any], ...]:
    return tuple({"workers": n} for n in counts)


def contenders(shuffle: int) -> list[Contender]:
    """All contenders, unshuffled and shuffled (``shuffle`` rows of buffer, or the tool's own shuffle)."""
    base = [
        Contender("unihub BatchedDataLoader(make_batch_reader)", "unihub_batched", "unihub", "unihub"),
        Contender("unihub DataLoader(make_reader)", "unihub_rows", "unihub", "unihub"),
        Contender("unihub TorchIterableDataset, torch DataLoader(2 workers)", "unihub_iterable", "unihub", "unihub",
                  {"workers": 2}),
        Contender("unihub TorchMapDataset, torch DataLoader(2 workers)", "unihub_map", "unihub", "unihub",
                  {"workers": 2}),
        Contender("unihub make_tf_dataset", "unihub_tf", "unihub", "unihub"),
        Contender("tf.data TFRecord, parallel parse + decode_jpeg", "tfdata", "tfdata", "tfrecord",
                  sweep=({"variant": "batch"}, {"variant": "record"},
                         {"variant": "batch", "nondeterministic": True},
                         {"variant": "record", "nondeterministic": True})),
        Contender("Lance to_batches + decode", "lance", "lance", "lance", sweep=({"threads": 1}, {"threads": 2})),
        Contender("Lance torch LanceDataset", "lance_torch", "lance", "lance",
                  sweep=({"threads": 1}, {"threads": 2})),
        Contender("Lance SafeLanceDataset, get_safe_loader", "lance_safe", "lance", "lance", sweep=_workers(0, 1, 2)),
        Contender("HF datasets + transform", "hf", "hf", "hf",
                  sweep=({"workers": 0}, {"workers": 0, "threads": 2}, {"workers": 2})),
        Contender("LitData StreamingDataset", "litdata", "litdata", "litdata", sweep=_workers(0, 1, 2)),
        Contender("MosaicML StreamingDataset", "mosaic", "mosaic", "mosaic", sweep=_workers(0, 1, 2)),
        Contender("WebDataset WebLoader", "wds", "wds", "wds", sweep=_workers(0, 1, 2)),
        Contender("Ray Data map_batches + iter_torch_batches", "ray", "ray", "parquet"),
    ]
    no_shuffle = {"lance"}  # Lance's scanner has no shuffle; its torch datasets do
    return base + [replace(c, label=c.label + ", shuffled", shuffle=shuffle) for c in base if c.tool not in no_shuffle]


# --------------------------------------------------------------------------- content and copies
def make_content(path: Path, rows: int, side: int = 64) -> Path:
    """``rows`` JPEGs of ``side`` x ``side`` with gradients and noise, labels, vectors (``vec[0]`` = the row's
    index): written once."""
    if path.exists():
        return path
    import simplejpeg

    rng = np.random.default_rng(15)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    blobs = []
    for _ in range(rows):
        a, b, c, f = rng.uniform(-1, 1, (4, 3, 1, 1)).astype(np.float32)
        image = 128 + 90 * (a * xx + b * yy) + 40 * np.sin(6 * f * (xx + c * yy) + c)
        image = image + rng.normal(0, 12, (3, side, side))
        hwc = np.ascontiguousarray(np.clip(image, 0, 255).astype(np.uint8).transpose(1, 2, 0))
        blobs.append(simplejpeg.encode_jpeg(hwc, quality=90, colorspace="RGB", colorsubsampling="420"))
    offsets = np.zeros(rows + 1, np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    vecs = rng.standard_normal((rows, 16)).astype(np.float32)
    vecs[:, 0] = np.arange(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, offsets=offsets, blob=np.frombuffer(b"".join(blobs), np.uint8),
             labels=rng.integers(0, 1000, rows).astype(np.int64), vecs=vecs)
    tmp.rename(path)
    return path


def child_env(python: Path) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    if python == Path(sys.executable):
        import unihub

        env["PYTHONPATH"] = os.pathsep.join([str(Path(unihub.__file__).resolve().parent.parent),
                                             env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    else:
        env.pop("PYTHONPATH", None)
    return env


def copy_name(fmt: str) -> str:
    """The copy's folder: unihub's is named after the writers' default row-group size it is written with,
    LitData's, MosaicML's and Ray's Parquet after their chunk size (an older copy is not reused)."""
    if fmt == "unihub":
        from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB

        return f"unihub-rg{DEFAULT_ROW_GROUP_SIZE_MB:g}mb"
    return f"{fmt}-{CHUNK.lower()}" if fmt in ("litdata", "mosaic", "parquet") else fmt


def ensure_copy(fmt: str, python: Path, content: Path, root: Path) -> Path:
    """The content in ``fmt``, written once by the tool itself into ``root/fmt`` (atomically: a temp folder
    renamed); unihub's copy is named after the writers' default row-group size, which it is written with."""
    target = root / copy_name(fmt)
    if target.exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{fmt}-", dir=root))
    try:
        with tempfile.TemporaryDirectory(prefix="uh-peers-") as scratch:
            env = dict(child_env(python), TMPDIR=scratch, HOME=scratch)
            out = subprocess.run([str(python), str(HERE / "peers_side.py"), "write", fmt, str(content), str(tmp)],
                                 capture_output=True, text=True, env=env, timeout=1800, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"writing the {fmt} copy failed: {last_line(out.stderr)}")
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


# --------------------------------------------------------------------------- memory of a process tree
def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree(root: int) -> list[int]:
    tree, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, ()))
    return out


def _kib(pid: int, pss: bool) -> int:
    try:
        if pss:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                return next((int(ln.split()[1]) for ln in f if ln.startswith("Pss:")), 0)
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


def run_child(python: Path, job: dict[str, Any], timeout: float, side: Path = HERE / "peers_side.py",
              pss: bool = True) -> dict[str, Any]:
    """Run one job of ``side`` (``peers_side.py``) in a fresh process; its JSON result with
    ``peak_rss_mib`` and (with ``pss``) ``peak_pss_mib`` of the process tree. Reading PSS walks the
    processes' page tables (~3 ms a process here) and slowed a 2-worker loader by 3-6% at 100 ms:
    timed runs leave it out."""
    with tempfile.TemporaryDirectory(prefix="uh-peers-") as scratch:
        job = dict(job, scratch=scratch)
        env = dict(child_env(python), TMPDIR=scratch, HOME=scratch)
        proc = subprocess.Popen([str(python), str(side), json.dumps(job)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        peak_rss = peak_pss = 0
        pids: list[int] = []
        deadline, tick = time.monotonic() + timeout, 0
        while proc.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(proc.pid, 9)
                proc.wait()
                return {"error": f"timed out after {timeout:.0f}s"}
            if tick % 5 == 0:  # the tree (a scan of /proc) and PSS every 100 ms, RSS every 20 ms
                pids = _tree(proc.pid)
                if pss:
                    peak_pss = max(peak_pss, sum(_kib(p, True) for p in pids))
            peak_rss = max(peak_rss, sum(_kib(p, False) for p in pids))
            tick += 1
            time.sleep(POLL_S)
        stdout, stderr = proc.communicate()
        try:
            os.killpg(proc.pid, 9)  # a worker the tool left behind (Ray's, say) goes with its session
        except ProcessLookupError:
            pass
    if proc.returncode != 0 or not stdout.strip():
        return {"error": f"exit {proc.returncode}: {last_line(stderr)}"}
    result = _last_json(stdout)
    if result is None:  # nothing parses: a failed run, not a failed benchmark
        return {"error": f"no result after exit 0: {last_line(stdout)}"}
    result.update(peak_rss_mib=peak_rss / 1024, peak_pss_mib=peak_pss / 1024 if pss else None)
    return result


def _last_json(stdout: str) -> dict[str, Any] | None:
    """The last line of ``stdout`` that is a JSON object: the side's result, even where a tool printed after it
    (Ray's raylet warns on stdout about the worker processes it started)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# --------------------------------------------------------------------------- the run
@dataclass
class Tally:
    """What the rounds gathered for one contender (or why it could not run)."""

    contender: Contender
    runs: list[dict[str, Any]]
    error: str | None = None
    tried: str = ""
    pss_mib: float = float("nan")  # peak PSS, from a run of its own after the timed rounds

    def stat(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.runs if r.get(key) is not None]

    def median(self, key: str) -> float:
        values = self.stat(key)
        return statistics.median(values) if values else float("nan")

    def rates(self) -> list[float]:
        return [r["rows"] / r["seconds"] for r in self.runs]

    def rate(self) -> float:
        """Median rows/s over the whole epoch, from creating the pipeline."""
        return statistics.median(self.rates()) if self.runs else float("nan")

    def front_loaded(self) -> bool:
        """Whether the first batch came after ``FRONT_LOADED`` of the epoch: the rows after it then come from
        work done before it (Ray Data decodes ahead into its object store), and the rate between the 10th and
        90th percentile of the rows is not the pipeline's steady state."""
        return bool(self.runs) and self.median("ttfb") > FRONT_LOADED * statistics.median(r["seconds"] for r in self.runs)

    def steady(self) -> float:
        """Median steady-state rows/s (10th to 90th percentile of the epoch's rows), or the epoch's rate for a
        front-loaded contender: what targets compare."""
        return self.rate() if self.front_loaded() else self.median("steady")

    def cpu_ms(self) -> list[float]:
        """CPU ms of the process tree per 1,000 rows, per run."""
        return [1e6 * r["cpu_s"] / r["rows"] for r in self.runs if r.get("cpu_s") is not None]

    def non_decode_ms(self, decode_ms: float) -> float:
        """Median CPU ms per 1,000 rows beyond the JPEG decode's own ``decode_ms``."""
        values = self.cpu_ms()
        return statistics.median(values) - decode_ms if values else float("nan")


@dataclass
class Setup:
    """Where every contender's python and copy are, and how a run is asked for."""

    pythons: dict[str, Path | str]
    copies: dict[str, Path | str]
    probes: list[int]
    side: int

    def job(self, c: Contender) -> dict[str, Any]:
        url = self.copies[c.fmt]
        data = f"file://{url}" if c.family == "unihub" else str(url)
        return {"tool": c.tool, "data": data, "workers": 0, **c.options, "shuffle": c.shuffle,
                "probes": self.probes, "side": self.side}


def prepare(args: Any, only: set[str], content: Path, root: Path, probes: list[int]) -> tuple[list[Tally], Setup]:
    """Every contender's tally, its peer's venv built (or the reason it is not) and its copy written."""
    pythons: dict[str, Path | str] = {"unihub": Path(sys.executable), "tfdata": Path(sys.executable)}
    for name in peers_env.PEERS:
        if only and name not in only:
            continue
        if args.quick and name not in peers_env.existing_peers():
            continue
        try:
            pythons[name] = peers_env.ensure_peer_venv(name)
        except peers_env.PeerUnavailable as exc:
            pythons[name] = f"install failed: {exc}"
    tallies = [Tally(c, []) for c in contenders(args.shuffle)
               if c.family in pythons and (not only or c.family in only) and not (args.unshuffled and c.shuffle)]
    copies: dict[str, Path | str] = {}
    for t in tallies:
        python = pythons[t.contender.family]
        if isinstance(python, str):
            t.error = python
            continue
        if t.contender.fmt not in copies:
            try:
                copies[t.contender.fmt] = ensure_copy(t.contender.fmt, python, content, root)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                copies[t.contender.fmt] = f"writing its copy failed: {exc}"
        if isinstance(copies[t.contender.fmt], str):
            t.error = str(copies[t.contender.fmt])
    return tallies, Setup(pythons, copies, probes, args.side)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="100,000 (2,000 with --quick)")
    ap.add_argument("--side", type=int, default=64, help="image side in pixels (64; 256 for the large-image run)")
    ap.add_argument("--rounds", type=int, default=None, help="5 (1 with --quick)")
    ap.add_argument("--shuffle", type=int, default=4096, help="shuffle buffer rows for every shuffled contender")
    ap.add_argument("--only", default="", help="comma-separated families: unihub, tfdata, " + ", ".join(peers_env.PEERS))
    ap.add_argument("--data", type=Path, default=None, help="cache folder (default benchmarks/data/peers_<rows>)")
    ap.add_argument("--quick", action="store_true",
                    help="2k rows, 1 round, no venv building, sweeps of 2 settings, PSS read in the timed run")
    ap.add_argument("--unshuffled", action="store_true", help="leave out the shuffled contenders")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--prepare", action="store_true", help="only build the venvs and write the content and copies")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's result here")
    args = ap.parse_args(argv)
    args.rows = args.rows or (2_000 if args.quick else 100_000)
    args.rounds = args.rounds or (1 if args.quick else 5)
    only = {f for f in args.only.split(",") if f}
    t_start = time.perf_counter()
    root = args.data or HERE / "data" / (f"peers_{args.rows}" + (f"_{args.side}px" if args.side != 64 else ""))
    root.mkdir(parents=True, exist_ok=True)
    content = make_content(root / "content.npz", args.rows, args.side)
    blobs, labels, vecs = load_content(content)
    rng = np.random.default_rng(0)
    probes = sorted(int(i) for i in rng.choice(args.rows, PROBES, replace=False))
    expected = {str(i): probe_digest(decode(blobs[i]), vecs[i]) for i in probes}
    label_sum = int(labels.sum())
    del blobs
    tallies, setup = prepare(args, only, content, root, probes)
    if args.prepare:
        print("\n".join(f"{t.contender.label}: {t.error or 'ready'}" for t in tallies))
        return 0

    def once(t: Tally) -> None:
        python = setup.pythons[t.contender.family]
        assert isinstance(python, Path)
        result = run_child(python, setup.job(t.contender), args.timeout, pss=args.quick)
        if "error" in result:
            t.error = result["error"]
        elif result["rows"] != args.rows or result["label_sum"] != label_sum:
            t.error = f"wrong content: {result['rows']} rows, label sum {result['label_sum']} (want {label_sum})"
        else:
            result["same_pixels"] = result["digests"] == expected
            t.runs.append(result)
        print(f"  {t.contender.label} ({t.contender.setting}): " + (
            t.error or f"{result['rows'] / result['seconds']:,.0f} rows/s, steady {result['steady'] or 0:,.0f}, "
            f"CPU {1e6 * result['cpu_s'] / result['rows']:,.0f} ms/1k rows, first batch {result['ttfb']:.2f}s, "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB"), file=sys.stderr, flush=True)

    def sweep(t: Tally) -> None:
        """Round 1 of a contender with settings to try: each once, the best (steady rows/s) kept. A shuffled
        contender takes its unshuffled twin's best, so that both tables compare one configuration."""
        c = t.contender
        twin = next((u for u in tallies if u.contender.tool == c.tool and not u.contender.shuffle), t)
        trials = (twin.contender.options,) if c.shuffle and twin is not t else c.sweep
        if args.quick:  # a smoke run: the sweep is still one (a choice between two), at half the runs
            trials = trials[:2]
        best = None
        for options in trials:
            trial = Tally(replace(c, options=dict(options)), [])
            once(trial)
            t.tried += f"{trial.contender.setting}: {'failed' if trial.error else f'{trial.steady():,.0f}'}; "
            if trial.runs and (best is None or trial.steady() > best.steady()):
                best = trial
        if best is None:
            t.error = trial.error
        else:
            t.contender, t.runs = best.contender, best.runs

    limits: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
        limits.append(run_child(Path(sys.executable), {"tool": "decode_limit", "source": str(content)}, args.timeout))
        # unshuffled first: a peer's best setting in round 1 is then used for its shuffled runs
        for t in sorted(tallies, key=lambda t: t.contender.shuffle > 0):
            if not t.error:
                sweep(t) if rnd == 0 and t.contender.sweep else once(t)
    measure_pss(tallies, setup, args)
    print_report(tallies, limits, args, time.perf_counter() - t_start)
    if args.json:
        args.json.write_text(json.dumps({"limits": limits, "contenders": [
            {"label": t.contender.label, "setting": t.contender.options, "tried": t.tried, "error": t.error,
             "pss_mib": t.pss_mib, "runs": t.runs} for t in tallies]}, indent=1))
    return 0


def measure_pss(tallies: list[Tally], setup: Setup, args: Any) -> None:
    """Each contender's peak PSS: from one more, untimed run (reading PSS slows a run by a few percent); with
    ``--quick`` (a smoke run, its timings not for comparing) from the timed run that read it, saving a run each."""
    if args.quick:
        for t in tallies:
            if t.runs:
                t.pss_mib = max(float(run.get("peak_pss_mib") or float("nan")) for run in t.runs)
        return
    print("memory: a run of each contender reading PSS (untimed)", file=sys.stderr, flush=True)
    for t in tallies:
        python = setup.pythons[t.contender.family]
        if t.runs and isinstance(python, Path):
            t.pss_mib = float(run_child(python, setup.job(t.contender), args.timeout).get("peak_pss_mib")
                              or float("nan"))


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):,.0f} / **{statistics.median(values):,.0f}** / {max(values):,.0f}"


@dataclass
class Limit:
    """The decode-limit contender's medians: images/s on one core and on every core, and CPU ms per 1,000 images
    decoding on every core (as the contenders do)."""

    one_core: float
    every: float
    cores: int
    decoder: str
    decode_ms: float

    @classmethod
    def of(cls, limits: list[dict[str, Any]]) -> Limit:
        good = [lim for lim in limits if "one_core" in lim]
        if not good:
            return cls(float("nan"), float("nan"), os.cpu_count() or 1, "?", float("nan"))
        return cls(statistics.median([lim["one_core"] for lim in good]),
                   statistics.median([lim["all_cores"] for lim in good]), good[0]["cores"], good[0]["decoder"],
                   1e6 * statistics.median([lim["cpu_per_image_all_cores"] for lim in good]))

    @property
    def rate(self) -> float:
        return self.one_core * self.cores


def print_report(tallies: list[Tally], limits: list[dict[str, Any]], args: Any, seconds: float) -> None:
    """The markdown table (steady-state ratios vs the fastest peer, CPU per row) and the targets, ok or MISSED."""
    ok = [t for t in tallies if t.runs]
    peers = [t for t in ok if t.contender.is_peer]
    fastest = max(peers, key=Tally.steady) if peers else None
    limit = Limit.of(limits)
    print(f"\n## unihub vs peers: {args.rows:,} rows of {args.side}x{args.side} JPEG + int64 + float32[16], batch 64, "
          f"one epoch, {limit.cores} cores, {args.rounds} round(s), shuffle buffer {args.shuffle:,}\n")
    print(f"Decode limit ({limit.decoder}): one core {limit.one_core:,.0f} images/s x {limit.cores} = "
          f"**{limit.rate:,.0f}**; measured with one thread per core: {limit.every:,.0f}; "
          f"{limit.decode_ms:,.1f} CPU ms per 1,000 images (on every core).\n")
    print("| contender | steady rows/s min / **median** / max | vs fastest peer | epoch rows/s | of decode limit "
          "| CPU ms / 1k rows (non-decode) | peak RSS MiB (PSS) | first batch s | same content | setting |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in sorted(tallies, key=lambda t: (t.contender.shuffle > 0, -t.steady() if t.runs else 0)):
        print(_row(t, fastest, limit))
    print_targets(ok, fastest, limit)
    print("\nVersions: " + "; ".join(f"{n}: {peers_env.versions(n)}" for n in peers_env.PEERS if peers_env.versions(n)))
    print(f"\n({seconds:.0f} s; peak RSS: the sum of VmRSS over the run's process tree, polled from /proc every "
          f"{POLL_S * 1000:.0f} ms; PSS from smaps_rollup every {POLL_S * 5000:.0f} ms in "
          f"{'the timed run (--quick)' if args.quick else 'one more, untimed run'})")


def _row(t: Tally, fastest: Tally | None, limit: Limit) -> str:
    c = t.contender
    if not t.runs:
        return f"| {c.label} | failed: {t.error} | | | | | | | | |"
    ratio = f"{t.steady() / fastest.steady():.2f}x" if fastest else "-"
    same = "yes" if all(r["same_pixels"] for r in t.runs) else "pixels differ"
    cpu = statistics.median(t.cpu_ms())
    note = f"{c.setting} (round 1: {t.tried.rstrip('; ')})" if t.tried else c.setting
    if t.front_loaded():
        note += "; first batch after a quarter of the epoch: its epoch rate is compared"
    if t.error:  # rounds after a failed one are not run
        note = f"{note}; {len(t.runs)} round(s), then failed: {t.error}"
    return (f"| {c.label} | {_fmt(t.stat('steady'))} | {ratio} | {t.rate():,.0f} | {t.steady() / limit.rate:.2f} | "
            f"{cpu:,.1f} ({cpu - limit.decode_ms:,.1f}) | {t.median('peak_rss_mib'):,.0f} ({t.pss_mib:,.0f}) | "
            f"{t.median('ttfb'):.2f} | {same} | {note} |")


def _verdict(flag: bool) -> str:
    return "ok" if flag else "MISSED"


def print_targets(ok: list[Tally], fastest: Tally | None, limit: Limit) -> None:
    """Issue 39's targets on the medians: steady-state rows/s and non-decode CPU per row against the fastest
    peer; make_tf_dataset against tf.data's best; then issue 15's first batch and peak RSS."""
    print("\nTargets (issue 39; steady-state rows/s, CPU per 1,000 rows of the process tree):\n")
    unihub = [t for t in ok if not t.contender.is_peer]
    if fastest is None:
        print("- no peer ran: the targets against peers cannot be evaluated")
        return
    peer_cpu = fastest.non_decode_ms(limit.decode_ms)
    print(f"- fastest peer: {fastest.contender.label} ({fastest.contender.setting}), {fastest.steady():,.0f} rows/s "
          f"steady, non-decode CPU {peer_cpu:,.1f} ms / 1k rows, first batch {fastest.median('ttfb'):.2f}s")
    for t in unihub:
        if t.contender.tool == "unihub_tf":
            continue
        r = t.steady() / fastest.steady()
        cpu = t.non_decode_ms(limit.decode_ms)
        print(f"- {t.contender.label}: {r:.2f}x >= 1.25x {_verdict(r >= 1.25)}; non-decode CPU {cpu:,.1f} ms "
              f"<= 0.5 x {peer_cpu:,.1f} {_verdict(cpu <= 0.5 * peer_cpu)}")
    for shuffled in (False, True):
        ours = [t for t in unihub if t.contender.tool == "unihub_tf" and (t.contender.shuffle > 0) == shuffled]
        theirs = [t for t in ok if t.contender.tool == "tfdata" and (t.contender.shuffle > 0) == shuffled]
        if ours and theirs:
            r = ours[0].steady() / theirs[0].steady()
            print(f"- make_tf_dataset{', shuffled' if shuffled else ''} >= 1.25x tf.data's best pipeline "
                  f"({theirs[0].contender.setting}): {r:.2f}x {_verdict(r >= 1.25)}")
    lowest_rss = min(t.median("peak_rss_mib") for t in ok if t.contender.is_peer)
    for t in unihub:
        rss, ttfb = t.median("peak_rss_mib"), t.median("ttfb")
        print(f"- {t.contender.label}: peak RSS {rss:,.0f} <= {lowest_rss * 1.2:,.0f} MiB "
              f"{_verdict(rss <= lowest_rss * 1.2)}; first batch {ttfb:.2f}s <= {fastest.median('ttfb'):.2f}s "
              f"{_verdict(ttfb <= fastest.median('ttfb'))}")


if __name__ == "__main__":
    raise SystemExit(main())
