"""The bridges' documented paths, old and new, give the same objects: ``unihub.readers.pytorch`` is the package
``unihub.bridges.torch`` (every public name), ``unihub.bridges.torch.loaders`` has the loaders' names, and ``unihub.readers.tf`` is ``unihub.bridges.tf.dataset`` with README's names."""

from __future__ import annotations

import importlib

import pytest

from unihub.dependencies import is_available

#: what README and Petastorm's migration table import from the PyTorch bridge
TORCH_NAMES = ("DataLoader", "BatchedDataLoader", "InMemBatchedDataLoader", "PerRank", "LoaderStateError",
               "decimal_friendly_collate", "make_collate")
TORCH_DATASETS = ("TorchIterableDataset", "TorchMapDataset")  # built on first use: torch needed
TF_NAMES = ("make_petastorm_dataset", "make_tf_dataset", "fill_value", "output_signature", "PRESENT_SUFFIX",
            "READ_AGAIN_WARNING")


def test_old_torch_path_is_the_package():
    assert importlib.import_module("unihub.readers.pytorch") is importlib.import_module("unihub.bridges.torch")


@pytest.mark.parametrize("path", ["unihub.readers.pytorch", "unihub.bridges.torch", "unihub.bridges.torch.loaders"])
def test_torch_paths_give_the_loaders_names(path):
    module, loaders = importlib.import_module(path), importlib.import_module("unihub.bridges.torch.loaders")
    for name in TORCH_NAMES:
        assert getattr(module, name) is getattr(loaders, name), name


@pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")
@pytest.mark.parametrize("path", ["unihub.readers.pytorch", "unihub.bridges.torch"])
def test_torch_paths_give_the_datasets(path):
    datasets = importlib.import_module("unihub.bridges.torch.datasets")
    for name in TORCH_DATASETS:
        cls = getattr(importlib.import_module(path), name)
        assert cls is getattr(datasets, name) and cls.__module__ == "unihub.bridges.torch.datasets"
    with pytest.raises(AttributeError, match="no attribute 'TorchDataset'"):
        importlib.import_module(path).TorchDataset  # noqa: B018


def test_old_tf_path_has_readme_names():
    old = importlib.import_module("unihub.readers.tf")
    assert old is importlib.import_module("unihub.bridges.tf.dataset")
    plans = importlib.import_module("unihub.bridges.tf.plans")
    for name in TF_NAMES:
        assert hasattr(old, name), name
    assert old.fill_value is plans.fill_value and old.output_signature is plans.output_signature
