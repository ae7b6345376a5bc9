"""Every module of the package imports on its own, so that the fast suite (`-m "not slow"`) touches each one even
where its behaviour is tested only by slow tests."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import autopelt

MODULES = sorted(info.name for info in pkgutil.walk_packages(autopelt.__path__, "autopelt."))


def test_the_package_has_the_modules_it_is_known_by():
    assert {"autopelt.cli", "autopelt.api", "autopelt.search.ray_backend", "autopelt.study.optuna_private",
            "autopelt.data.own_files"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no docstring saying what it is for"
