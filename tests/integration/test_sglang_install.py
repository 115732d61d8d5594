"""The sglang_install role on a simulated host: the simulated SGLang stands in for the real wheel."""

from __future__ import annotations

import re
import subprocess

from simfleet import REPO


def test_install_role_installs_the_pinned_version_once(make_host, tmp_path):
    host = make_host('gpu-a', gpu_count=1)
    wheels = tmp_path / 'wheels'
    # The role takes any package spec; a locally built wheel of the simulated server is what a
    # simulated host installs in place of the real SGLang 0.5.23.
    subprocess.run([str(REPO / '.venv' / 'bin' / 'pip'), 'wheel', '--quiet', '--no-deps', '-w', str(wheels), str(REPO / 'tests' / 'simsglang')],
                   check=True, capture_output=True)
    [wheel] = list(wheels.glob('sglang-0.5.23-*.whl'))
    venv = tmp_path / 'sglang-venv'
    playbook = tmp_path / 'install.yml'
    playbook.write_text('- hosts: gpu_servers\n  gather_facts: false\n  roles:\n    - gpufleet.sglang.sglang_install\n')
    extra = ['-e', 'sglang_install_venv=%s' % venv, '-e', 'sglang_install_package=%s' % wheel]

    first = host.playbook(playbook, *extra)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=[1-9]', first.stdout), first.stdout
    version = subprocess.run([str(venv / 'bin' / 'python'), '-c', 'import importlib.metadata as m; print(m.version("sglang"))'],
                             check=True, capture_output=True, text=True)
    assert version.stdout.strip() == '0.5.23'

    second = host.playbook(playbook, *extra)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=0', second.stdout), second.stdout

    wrong = host.playbook(playbook, *extra, '-e', 'sglang_install_version=0.5.22')
    assert wrong.returncode != 0
