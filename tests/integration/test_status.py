"""playbooks/status.yml: one table with the GPUs and the SGLang servers of a simulated fleet."""

from __future__ import annotations

import re

from relaunch_fleet import host_vars, recap, run, server_pid, stop_all, table, write_inventory


def test_status_table_shows_gpus_servers_and_accept_length(make_host, tmp_path):
    hosts = [make_host('node-%s' % n, gpu_count=2) for n in 'ab']
    fleet = dict((h.name, host_vars(h)) for h in hosts)
    inventory = write_inventory(tmp_path / 'inventory.json', fleet)
    try:
        started = run(inventory, 'relaunch.yml', '-e', 'batch=2')
        assert started.returncode == 0, started.stdout[-4000:] + started.stderr
        out = run(inventory, 'status.yml')
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr
        assert all(c['changed'] == 0 for c in recap(out.stdout).values())
        text = out.stdout
        # Units in the headers; the server's own figures, named apart from the relaunch's smoke generation.
        lines = table(text)
        assert re.split(r'\s{2,}', lines[0]) == ['HOST', 'GPU', 'USED (MiB)', 'TOTAL (MiB)', 'HELD BY (pid, command line, MiB)'], lines
        servers = lines[lines.index('') + 1]
        assert re.split(r'\s{2,}', servers) == [
            'HOST',
            'INSTANCE',
            'PORT',
            'GPUS',
            'PID',
            'SPECULATIVE',
            'HEALTH',
            'SERVER ACCEPT (tok/step)',
            'SERVER TOK/S',
            'VERSION',
        ], lines
        for name, hvars in fleet.items():
            pid = server_pid(hvars)
            # GPU 0 holds the server's scheduler, GPU 1 nothing.
            assert re.search(r'"%s\s+0\s+\d+\s+\d+\s+pid \d+ sglang::scheduler \d+ MiB"' % name, text), text[-3000:]
            assert re.search(r'"%s\s+1\s+0\s+\d+\s+-"' % name, text), text[-3000:]
            row = re.search(r'"(%s\s+llama\s+%d\s+0\s+%d\s+EAGLE 2/1/3\s+healthy\s+[\d.]+\s+\S+\s+0\.5\.23)"' % (name, hvars['sglang_server_port'], pid), text)
            assert row, text[-3000:]
        stopped = stop_all(inventory)
        assert stopped.returncode == 0, stopped.stdout[-3000:]
        after = run(inventory, 'status.yml')
        assert re.search(r'"node-a\s+llama\s+\d+\s+0\s+-\s+EAGLE 2/1/3\s+stopped', after.stdout), after.stdout[-3000:]
    finally:
        stop_all(inventory)
