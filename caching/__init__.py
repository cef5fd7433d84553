"""Caching any data loader (yogadl's idea): build its output once as a unihub dataset, serve it back.

``cacheable`` (:mod:`unihub.caching.cacheable`) wraps a function that returns a loader; the
first call in any process builds ``ROOT/<dataset_id>/<version>/`` (one builder, the others wait:
:mod:`unihub.caching.lease`), every later call opens it. Sources are adapted in
:mod:`unihub.caching.sources`; caches are listed and removed with :mod:`unihub.caching.store`.
"""

from __future__ import annotations

from unihub.caching.cacheable import CachedDataset, cacheable
from unihub.caching.store import CacheInfo, list_caches, remove_cache

__all__ = ["CacheInfo", "CachedDataset", "cacheable", "list_caches", "remove_cache"]
