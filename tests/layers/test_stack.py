"""The single stack contract is exhaustive: every module of stopdesk, reconcile and stopdrill
(migrations too) sits in exactly one of its layers.

import-linter's `exhaustive` option needs `containers`, and a container cannot span root packages,
so the contract in pyproject.toml has none and this test does the counting instead.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stopdesk", "reconcile", "stopdrill")
STACK = "One stack"


def stack_layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["name"].startswith(STACK)]
    assert contract["type"] == "layers"
    assert "containers" not in contract, "the stack spans root packages: no containers"
    assert "ignore_imports" not in contract
    assert set(PACKAGES) <= set(config["root_packages"])
    return [[name.strip() for name in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                if _holds_nothing(path):
                    continue  # a package of modules only (a mechanism folder): its modules have layers
                parts.pop()
            if len(parts) > 1:  # the root packages themselves hold nothing
                found.append(".".join(parts))
    return found


def _holds_nothing(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


# Where each part of a mechanism folder goes: the layer holding this module.
FOLDER_PART_LAYERS = {
    "adapter": "reconcile.mechanisms.base",
    "agent": "stopdesk.agent",
    "readiness": "reconcile.readiness",
    "sandbox": "stopdrill.sandbox",
    "drill": "stopdrill.drills",
}


def where_to_add(module: str, layers: list[list[str]]) -> str:
    """How to place a module in no layer: for a part of a mechanism folder, the exact line."""
    found = re.fullmatch(r"reconcile\.mechanisms\.\w+\.(\w+)(\..*)?", module)
    part = found[1] if found else ""
    part = next((p for p in FOLDER_PART_LAYERS if part == p or part.startswith(p + "_")), "")
    if not part:
        return module
    anchor = FOLDER_PART_LAYERS[part]
    index = next(i for i, layer in enumerate(layers) if anchor in layer)
    if part in ("sandbox", "drill"):
        index -= 1  # the folders' own layer, just above the dev package's
    name = module.split(".")[: 4 if part == "agent" else None]
    return f"{module} (add ' : {'.'.join(name)}' to the layer \"{' : '.join(layers[index])}\")"


def homes(module: str, layers: list[list[str]]) -> list[str]:
    return [name for layer in layers for name in layer if module == name or module.startswith(name + ".")]


def test_every_module_is_in_exactly_one_layer() -> None:
    layers = stack_layers()
    found = modules()
    assert len(found) > 200
    nowhere = [m for m in found if not homes(m, layers)]
    twice = {m: homes(m, layers) for m in found if len(homes(m, layers)) > 1}
    assert not nowhere, (
        f"in no layer of the '{STACK}' contract (pyproject.toml): {'; '.join(where_to_add(m, layers) for m in nowhere)}"
    )
    assert not twice, f"in more than one layer of the '{STACK}' contract: {twice}"


def test_every_layer_names_modules_that_exist() -> None:
    found = set(modules())
    missing = [
        name
        for layer in stack_layers()
        for name in layer
        if name not in found and not any(m.startswith(name + ".") for m in found)
    ]
    assert not missing, f"layers name modules that do not exist: {', '.join(missing)}"


def test_the_check_sees_a_module_left_out() -> None:
    layers = [layer for layer in stack_layers() if layer != ["stopdesk.states"]]
    assert not homes("stopdesk.states", layers)
