"""The distributed job a process is part of: its rank and the world's size, where a framework says.

``make_reader(..., cur_shard=None, shard_count=None)`` in a job of several processes reads its rank's
shard, not the whole dataset on every rank: torch.distributed's process group once initialised,
else the ``RANK``/``WORLD_SIZE`` variables that torchrun, Accelerate, DeepSpeed and Lightning set,
else JAX's process index and count where JAX is already imported (this module imports no framework).
``UNIHUB_AUTO_SHARD=0`` turns it off (Petastorm's behaviour: every rank reads everything), as does
passing ``cur_shard=0, shard_count=1``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

#: the environment variable that turns detection off ("0", "false", "no", "off")
AUTO_SHARD_VARIABLE = "UNIHUB_AUTO_SHARD"


def detected_world() -> tuple[int, int] | None:
    """``(rank, world size)`` of the job this process is part of where it has more than one process and
    detection is on; None otherwise."""
    if os.environ.get(AUTO_SHARD_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    for found in (_torch_world(), _environment_world(), _jax_world()):
        if found is not None:
            rank, world = found
            return (rank, world) if world > 1 and 0 <= rank < world else None
    return None


def _torch_world() -> tuple[int, int] | None:
    torch: Any = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def _environment_world() -> tuple[int, int] | None:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return int(rank), int(world)
    except ValueError:
        log.warning("RANK=%r and WORLD_SIZE=%r are not integers: reading unsharded", rank, world)
        return None


def _jax_world() -> tuple[int, int] | None:
    jax: Any = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        return int(jax.process_index()), int(jax.process_count())
    except Exception:  # noqa: BLE001  (a JAX whose backend is not set up: no job to read from)
        return None


def shard_or_detected(cur_shard: int | None, shard_count: int | None) -> tuple[int | None, int | None]:
    """``(cur_shard, shard_count)`` as given, or the detected job's where neither is given."""
    if cur_shard is not None or shard_count is not None:
        return cur_shard, shard_count
    found = detected_world()
    if found is None:
        return None, None
    log.info("reading shard %d of %d: the rank and world size of this distributed job (UNIHUB_AUTO_SHARD=0, or "
             "cur_shard=0, shard_count=1, reads every row on every rank)", *found)
    return found
