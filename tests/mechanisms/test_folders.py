"""The mechanism folders and their list: everything is derived from `folders.FOLDERS`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from reconcile.mechanisms import folders, registry
from stopdesk import config
from stopdrill.drills.drivers import driver_class

ROOT = Path(__file__).resolve().parents[2]


def test_every_folder_with_an_adapter_is_listed() -> None:
    assert folders.unlisted() == []
    assert (
        sorted(config.MECHANISMS)
        == sorted(folders.FOLDERS)
        == sorted(p.parent.name for p in (ROOT / "reconcile" / "mechanisms").glob("*/adapter.py"))
    )


def test_a_folder_with_an_adapter_and_no_line_fails_naming_the_line_to_add(tmp_path: Path) -> None:
    (tmp_path / "fax").mkdir()
    (tmp_path / "fax" / "adapter.py").write_text("")
    (tmp_path / "notes").mkdir()  # no adapter.py: not a mechanism
    (problem,) = folders.unlisted(tmp_path, listed=folders.FOLDERS)
    assert "fax has an adapter.py but no line in reconcile/mechanisms/folders.py" in problem
    assert 'add `"fax": "reconcile.mechanisms.fax",` to FOLDERS' in problem


def test_start_up_refuses_an_unlisted_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fax").mkdir()
    (tmp_path / "fax" / "adapter.py").write_text("")
    monkeypatch.setattr(folders, "HERE", tmp_path)
    monkeypatch.setattr(folders.unlisted, "__defaults__", (tmp_path, None))
    with pytest.raises(ImproperlyConfigured, match=r'add `"fax": "reconcile.mechanisms.fax",`'):
        apps.get_app_config("reconcile").ready()


def test_each_listed_folder_has_an_adapter_and_a_drill_driver() -> None:
    for name in folders.FOLDERS:
        assert registry.adapter_class(name).name == name
        driver = driver_class(name)
        assert driver is not None and driver.mechanism == name


def test_the_docs_table_of_mechanisms_matches_the_list() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## How to add a mechanism", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", section, flags=re.M)
    assert [name for name, _ in rows] == list(folders.FOLDERS)
    for name, parts in rows:
        present = [part for part in folders.PARTS if folders.part(name, part) is not None]
        assert parts == ", ".join(f"`{p}`" for p in present), name
