"""The sglang_install role on a simulated host: the simulated SGLang stands in for the real wheel."""

from __future__ import annotations

import re
import subprocess

import pytest
from simfleet import REPO

INSTALL = REPO / 'playbooks' / 'install.yml'


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    # The role takes any package spec; a locally built wheel of the simulated server is what a
    # simulated host installs in place of the real SGLang 0.5.23.
    wheels = tmp_path_factory.mktemp('wheels')
    subprocess.run(
        [str(REPO / '.venv' / 'bin' / 'pip'), 'wheel', '--quiet', '--no-deps', '-w', str(wheels), str(REPO / 'tests' / 'simsglang')],
        check=True,
        capture_output=True,
    )
    [built] = list(wheels.glob('sglang-0.5.23-*.whl'))
    return built


def installed_version(venv) -> str:
    out = subprocess.run(
        [str(venv / 'bin' / 'python'), '-c', 'import importlib.metadata as m; print(m.version("sglang"))'], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def test_install_role_installs_the_pinned_version_once(make_host, tmp_path, wheel):
    host = make_host('gpu-a', gpu_count=1)
    venv = tmp_path / 'sglang-venv'
    playbook = tmp_path / 'install.yml'
    playbook.write_text('- hosts: gpu_servers\n  gather_facts: false\n  roles:\n    - gpufleet.sglang.sglang_install\n')
    extra = ['-e', 'sglang_install_venv=%s' % venv, '-e', 'sglang_install_package=%s' % wheel]

    first = host.playbook(playbook, *extra)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=[1-9]', first.stdout), first.stdout
    assert installed_version(venv) == '0.5.23'

    second = host.playbook(playbook, *extra)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=0', second.stdout), second.stdout

    wrong = host.playbook(playbook, *extra, '-e', 'sglang_install_version=0.5.22')
    assert wrong.returncode != 0


def test_install_check_mode_says_what_would_be_installed_and_changes_nothing(make_host, tmp_path, wheel):
    host = make_host('gpu-a', gpu_count=1)
    venv = tmp_path / 'sglang-venv'
    extra = ['-e', 'sglang_install_venv=%s' % venv, '-e', 'sglang_install_package=%s' % wheel]

    # A fresh host: check mode predicts the installation and creates nothing, not even the venv.
    fresh = host.playbook(INSTALL, '--check', *extra)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=[1-9]\d*\s+unreachable=0\s+failed=0', fresh.stdout), fresh.stdout
    assert 'would install SGLang 0.5.23 into %s (installed now: none)' % venv in fresh.stdout, fresh.stdout
    assert not venv.exists()

    installed = host.playbook(INSTALL, *extra)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert installed_version(venv) == '0.5.23'

    # Installed and matching: check mode reports no change at all.
    again = host.playbook(INSTALL, '--check', *extra)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=0\s+unreachable=0\s+failed=0', again.stdout), again.stdout
    assert 'SGLang 0.5.23 is installed in %s: nothing to do' % venv in again.stdout, again.stdout

    # Another version asked: check mode names both versions, and the installed one stays.
    other = host.playbook(INSTALL, '--check', *extra, '-e', 'sglang_install_version=0.5.24')
    assert other.returncode == 0, other.stdout + other.stderr
    assert 'would install SGLang 0.5.24 into %s (installed now: 0.5.23)' % venv in other.stdout, other.stdout
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=[1-9]', other.stdout), other.stdout
    assert installed_version(venv) == '0.5.23'
