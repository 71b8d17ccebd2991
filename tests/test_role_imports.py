"""The role images carry the testbed wheel without its dependencies (workers: the standard library only;
the Atlas image: pyroute2 too), so role processes must import without pydantic, PyYAML, pandas or numpy,
and without the emulator's builder code (testbed.emu)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'pydantic', 'yaml', 'pandas', 'numpy', 'matplotlib', 'typer', 'rich'} \
                or name.startswith('testbed.emu'):  # the emulator's builder is not the roles' business
            raise ImportError('not in the role image: ' + name)
sys.meta_path.insert(0, Block())
import testbed.runtime.worker, testbed.runtime.sidecar, testbed.bubbletea.service
print('ok')
"""


def test_role_processes_import_with_the_standard_library_only():
    r = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
