"""bench/mfu_flip.py: both runs of an experiment, paired by run_id; what it reports follows the mechanism."""

import importlib.util
import sys

from tests.conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("mfu_flip", ROOT / "bench" / "mfu_flip.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mfu_flip"] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_the_flip_pairs_every_run_and_the_launch_bound_tiny_model_slows_down():
    bench = _bench()
    f = bench.flip(ROOT / "experiments" / "tiny-3dc.yaml", [])
    assert not f.types_mfu and len(f.typed_s) == len(f.auto_s) > 0
    # the 4-layer model's kernels are a few microseconds each: launch-bound, far below the typed 50 % of peak
    assert max(a / t for a, t in zip(f.auto_s, f.typed_s, strict=True)) > 2
    # the reported mfu is an output: a slower iteration of the same work reports less (the WAN-bound run barely moves)
    assert all(a <= t for a, t in zip(f.auto_mfu, f.typed_mfu, strict=True)) and min(f.auto_mfu) < max(f.typed_mfu)
    assert bench.types_mfu(ROOT / "experiments" / "paper-3dc.yaml")  # it types mfu: the flip leaves it


def test_the_table_names_what_it_skips(capsys):
    _bench().main([str(ROOT / "experiments" / "multitcp.yaml")])
    out = capsys.readouterr().out
    assert out.startswith("| experiment |") and "skipped multitcp" in out
