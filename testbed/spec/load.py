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

MAX_SWEEP_POINTS = 10_000


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names the same key twice (plain YAML keeps the last one silently)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges may override on purpose
            key = self.construct_object(key_node, deep=deep)
            try:
                seen = key in first
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if seen:
                raise DuplicateKeyError(None, None, f"duplicate key {key!r} (first on line {first[key] + 1})",
                                        key_node.start_mark)
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise SpecError(str(path), f"cannot read file: {why}", "check the path") from None
    try:
        data = yaml_load(text)
    except DuplicateKeyError as e:
        mark = e.problem_mark
        raise SpecError(f"{path}:{mark.line + 1}", e.problem, "keep one of them") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise SpecError(where, f"not valid YAML ({problem})", "fix the YAML syntax") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4300 digits, nesting too deep
        raise SpecError(str(path), f"not a usable YAML value ({type(e).__name__})", "fix the value") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "top level must be a mapping", "write `key: value` lines")
    return data


def parse_value(text: str, key: str = "--set") -> Any:
    """`--set` values are YAML scalars: 10 -> int, 2.5 -> float, atlas -> str, [1,2] -> list. A value that
    is not valid YAML is an error naming the key it was meant for."""
    try:
        return yaml_load(text)
    except yaml.YAMLError as e:
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise SpecError(key, f"value {text!r} is not valid YAML ({problem})",
                        "quote it, or close its brackets: e.g. --set 'workload.pp=12'") from None
    except (ValueError, RecursionError) as e:
        raise SpecError(key, f"value {text[:40]!r} is not usable ({type(e).__name__})", "write a plain value") from None


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.0.c` in nested dicts/lists; `*` applies to every item of a list."""
    parts = dotted.split(".")

    def walk(node: Any, i: int, trail: str) -> None:
        key = parts[i]
        last = i == len(parts) - 1
        if isinstance(node, list):
            if key == "*":
                indices = range(len(node))
            elif key.isascii() and key.isdigit() and int(key) < len(node):
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


_BRANCH_NAMES = {"int", "str", "float", "bool", "CustomModel"}


def _is_branch(part: object) -> bool:
    """pydantic's union branches add noise like 'int', "literal['auto']" or 'function-after[...]' to a path."""
    branch = ("function-", "literal[", "constrained-")
    return isinstance(part, str) and (part in _BRANCH_NAMES or part.startswith(branch))


def format_validation(err: ValidationError, prefix: str = "") -> SpecError:
    errors = err.errors()
    # of a union's branch errors, the deepest is the one about the input's real shape (a custom model's field)
    # and of branches as deep, one that took the input's type over one that says "not my type" (a custom model
    # whose hidden size does not divide by its heads is not a model name)
    depth = [(len([p for p in x["loc"] if not _is_branch(p)]), not x["type"].endswith("_type")) for x in errors]
    e = errors[depth.index(max(depth))]
    loc = ".".join(str(p) for p in e["loc"] if not _is_branch(p))
    msg = e["msg"].removeprefix("Value error, ")
    field = ".".join(x for x in (prefix, loc) if x) or "spec"
    if e["type"] == "extra_forbidden":
        return SpecError(field, "unknown field", "remove it or check its spelling")
    if e["type"] == "missing":
        return SpecError(field, "required field is missing", "add it")
    if e["type"] in ("int_parsing", "int_type", "int_from_float"):
        auto = any(any(str(p).startswith("literal['auto']") for p in x["loc"]) for x in errors)
        what = "a whole number or auto" if auto else "a whole number"
        raw = e.get("input")
        if isinstance(raw, str) and _looks_like_number(raw):
            return SpecError(field, f"{raw!r} is text to YAML, not a number", f"write {what} without an exponent")
        return SpecError(field, f"{raw!r} is not {what}"[:200], f"write {what}")
    # validators that name a nested field put it first: 'links[0].between: ...'
    if ": " in msg and msg.split(": ", 1)[0].replace("[", ".").replace("]", "").replace("_", "").replace(
        ".", ""
    ).isalnum():
        sub, rest = msg.split(": ", 1)
        return SpecError(f"{field}.{sub}" if field != "spec" else sub, rest)
    return SpecError(field, msg)


def _looks_like_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def validate(model: type[BaseModel], data: dict[str, Any], prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise format_validation(err, prefix) from None


def resolve_traces(topo: Any, base: Path) -> None:
    """Link trace files named relative to the YAML that names them become absolute paths."""
    links = topo.get("links") if isinstance(topo, dict) else None
    for link in links if isinstance(links, list) else []:
        if isinstance(link, dict) and isinstance(link.get("trace"), str) and not Path(link["trace"]).is_absolute():
            link["trace"] = str((base / link["trace"]).resolve())


def load_topology(path: str | Path, sets: list[str] | None = None) -> Topology:
    data = _read_yaml(Path(path))
    resolve_traces(data, Path(path).parent)
    for s in sets or []:
        k, v = split_assignment(s)
        set_dotted(data, k, parse_value(v, k))
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
        data["topology"] = topology_file(topo, path.parent, f"next to {path}")
    else:
        resolve_traces(topo, path.parent)
    bt = data.get("bubbletea")
    if isinstance(bt, dict) and isinstance(bt.get("trace"), str) and bt["trace"] != "synthetic":
        tr = Path(bt["trace"])
        if not tr.is_absolute():
            try:
                bt["trace"] = str((path.parent / tr).resolve())
            except (OSError, ValueError):
                raise SpecError("bubbletea.trace", f"{bt['trace']!r} is not a usable path", "fix the path") from None
    fill = bt.get("fill") if isinstance(bt, dict) else None
    if (isinstance(fill, dict) and isinstance(fill.get("trace"), str) and fill["trace"] != "generator"
            and not Path(fill["trace"]).is_absolute()):
        fill["trace"] = str((path.parent / fill["trace"]).resolve())
    return data


def topology_file(name: str, base: Path, where: str) -> dict[str, Any]:
    """A topology YAML named by an experiment (relative to it) or by `--set topology=FILE` (relative to where the
    command runs), read with its trace paths made absolute."""
    try:
        tpath = (base / name).resolve()
        found = tpath.is_file()
    except (OSError, ValueError):  # e.g. a NUL byte in the name
        found = False
    if not found:
        raise SpecError("topology", f"file {name!r} not found {where}", "fix the path to the topology YAML")
    data = _read_yaml(tpath)
    resolve_traces(data, tpath.parent)
    return data


def apply_set(data: dict[str, Any], text: str) -> None:
    """One `--set key=value`; `topology=FILE` loads that topology file in place of the experiment's."""
    k, v = split_assignment(text)
    value = parse_value(v, k)
    if k == "topology" and isinstance(value, str):
        value = topology_file(value, Path.cwd(), "(a path relative to where you run the command)")
    set_dotted(data, k, value)


def expand_sweep(data: dict[str, Any], sweeps: list[str] | None = None) -> list[tuple[dict[str, Any], dict]]:
    """All sweep points: (experiment data, {key: value}) in a fixed order (cartesian product)."""
    raw = data.pop("sweep", None) or {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise SpecError("sweep", "must map dotted keys to lists of values", "write e.g. sweep: {workload.pp: [4, 8]}")
    sweep: dict[str, list[Any]] = dict(raw)
    for s in sweeps or []:
        k, v = split_assignment(s)
        values = [parse_value(x, k) for x in v.split(",") if x.strip()]
        if not values:
            raise SpecError(k, "sweep has no values", "write e.g. --sweep key=1,2,3")
        sweep[k] = values
    if not isinstance(sweep, dict) or not all(isinstance(x, list) and x for x in sweep.values()):
        raise SpecError("sweep", "must map each dotted key to a non-empty list of values",
                        "write e.g. sweep: {workload.pp: [4, 8]}")
    n = 1
    for x in sweep.values():
        n *= len(x)
    if n > MAX_SWEEP_POINTS:
        raise SpecError("sweep", f"{n:,} points (the product of every key's values)",
                        f"sweep at most {MAX_SWEEP_POINTS:,} points per run")
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
        apply_set(data, s)
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
        apply_set(data, s)
    out = []
    for d, point in expand_sweep(data, sweeps):
        out.append((validate(Experiment, d), point))
    return out


def load_cluster(path: str | Path) -> Any:
    """A cluster spec (testbed/spec/cluster.py), validated."""
    from testbed.spec.cluster import Cluster

    return validate(Cluster, _read_yaml(Path(path)), "cluster")
