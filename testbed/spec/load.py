"""YAML loading, dotted overrides (`--set a.b.0.c=v`, `*` for every list item) and one-line errors."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from testbed.errors import SpecError
from testbed.spec.experiment import Experiment
from testbed.spec.topology import Topology


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(str(path), f"cannot read file: {e.strerror}", "check the path") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError(where, f"not valid YAML ({getattr(e, 'problem', e)})", "fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "top level must be a mapping", "write `key: value` lines")
    return data


def parse_value(text: str) -> Any:
    """`--set` values are YAML scalars: 10 -> int, 2.5 -> float, atlas -> str, [1,2] -> list."""
    return yaml.safe_load(text)


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.0.c` in nested dicts/lists; `*` applies to every item of a list."""
    parts = dotted.split(".")

    def walk(node: Any, i: int, trail: str) -> None:
        key = parts[i]
        last = i == len(parts) - 1
        if isinstance(node, list):
            if key == "*":
                indices = range(len(node))
            elif key.isdigit() and int(key) < len(node):
                indices = [int(key)]
            else:
                raise SpecError(dotted, f"{trail or 'top'} is a list of {len(node)}; use an index or *")
            for j in indices:
                if last:
                    node[j] = value
                else:
                    walk(node[j], i + 1, f"{trail}.{j}")
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                if key not in node or node[key] is None:
                    node[key] = {}
                walk(node[key], i + 1, f"{trail}.{key}".lstrip("."))
        else:
            raise SpecError(dotted, f"{trail} is a value, not a mapping or list", "shorten the key")

    walk(data, 0, "")


def format_validation(err: ValidationError, prefix: str = "") -> SpecError:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
    # pydantic's union branches add noise like 'int' / 'constrained-int' to the path
    loc = ".".join(p for p in loc.split(".") if p not in {"int", "str", "constrained-int", "literal['auto']"})
    msg = e["msg"].removeprefix("Value error, ")
    field = ".".join(x for x in (prefix, loc) if x) or "spec"
    if e["type"] == "extra_forbidden":
        return SpecError(field, "unknown field", "remove it or check its spelling")
    if e["type"] == "missing":
        return SpecError(field, "required field is missing", "add it")
    # validators that name a nested field put it first: 'links[0].between: ...'
    if ": " in msg and msg.split(": ", 1)[0].replace("[", ".").replace("]", "").replace("_", "").replace(
        ".", ""
    ).isalnum():
        sub, rest = msg.split(": ", 1)
        return SpecError(f"{field}.{sub}" if field != "spec" else sub, rest)
    return SpecError(field, msg)


def validate(model: type[BaseModel], data: dict[str, Any], prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise format_validation(err, prefix) from None


def load_topology(path: str | Path, sets: list[str] | None = None) -> Topology:
    data = _read_yaml(Path(path))
    for s in sets or []:
        k, v = split_assignment(s)
        set_dotted(data, k, parse_value(v))
    return validate(Topology, data, "topology")


def split_assignment(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise SpecError(text, "expected key=value", "write e.g. --set workload.pp=8")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def experiment_data(path: str | Path) -> dict[str, Any]:
    """Raw experiment dict with the topology inlined (paths are relative to the experiment file)."""
    path = Path(path)
    data = _read_yaml(path)
    topo = data.get("topology")
    if isinstance(topo, str):
        tpath = (path.parent / topo).resolve()
        if not tpath.exists():
            raise SpecError("topology", f"file {topo!r} not found next to {path}", "fix the relative path")
        data["topology"] = _read_yaml(tpath)
    bt = data.get("bubbletea")
    if isinstance(bt, dict) and isinstance(bt.get("trace"), str) and bt["trace"] != "synthetic":
        tr = Path(bt["trace"])
        if not tr.is_absolute():
            bt["trace"] = str((path.parent / tr).resolve())
    return data


def expand_sweep(data: dict[str, Any], sweeps: list[str] | None = None) -> list[tuple[dict[str, Any], dict]]:
    """All sweep points: (experiment data, {key: value}) in a fixed order (cartesian product)."""
    sweep: dict[str, list[Any]] = dict(data.pop("sweep", None) or {})
    for s in sweeps or []:
        k, v = split_assignment(s)
        values = [parse_value(x) for x in v.split(",") if x.strip()]
        if not values:
            raise SpecError(k, "sweep has no values", "write e.g. --sweep key=1,2,3")
        sweep[k] = values
    keys = list(sweep)
    points = []
    for combo in itertools.product(*(sweep[k] for k in keys)) if keys else [()]:
        d = copy.deepcopy(data)
        for k, v in zip(keys, combo, strict=True):
            set_dotted(d, k, v)
        points.append((d, dict(zip(keys, combo, strict=True))))
    return points


def resolved_spec(path: str | Path, sets: list[str] | None = None, sweeps: list[str] | None = None) -> dict:
    """The experiment as run, defaults filled in and the sweep included (what results/<x>/spec.yaml records)."""
    data = experiment_data(path)
    for s in sets or []:
        k, v = split_assignment(s)
        set_dotted(data, k, parse_value(v))
    sweep = dict(data.get("sweep") or {})
    for s in sweeps or []:
        k, v = split_assignment(s)
        sweep[k] = [parse_value(x) for x in v.split(",") if x.strip()]
    data["sweep"] = sweep
    try:
        return validate(Experiment, data).model_dump(mode="json")
    except SpecError:  # only the swept points need to be valid
        return data


def load_experiment(
    path: str | Path, sets: list[str] | None = None, sweeps: list[str] | None = None
) -> list[tuple[Experiment, dict]]:
    """Load an experiment, apply --set, expand --sweep; every point is validated before anything runs."""
    data = experiment_data(path)
    for s in sets or []:
        k, v = split_assignment(s)
        set_dotted(data, k, parse_value(v))
    out = []
    for d, point in expand_sweep(data, sweeps):
        out.append((validate(Experiment, d), point))
    return out
