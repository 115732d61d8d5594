"""A process tree shaped like an SGLang server, for the GPU-layer tests.

    python fake_launcher.py STATE_DIR READY_FILE GPU:MIB [GPU:MIB ...]

The process retitles itself like SGLang's launcher, starts one `sglang::scheduler_TP<i>` holder per
GPU:MIB pair, a `sglang::detokenizer` that holds no GPU memory, and a helper that holds no GPU
memory and whose title matches nothing (like the multiprocessing resource tracker), writes their
pids to READY_FILE and waits. All of them are its children and share its session and process
group, as SGLang's children do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from setproctitle import setproctitle

DETOKENIZER = 'import signal, sys; from setproctitle import setproctitle; setproctitle("sglang::detokenizer"); print("ready", flush=True); signal.pause()'


def main() -> None:
    state_dir, ready_file, *specs = sys.argv[1:]
    setproctitle('python3 -m sglang.launch_server --model-path /models/fake --tp-size %d' % len(specs))
    children = []
    for rank, spec in enumerate(specs):
        gpu, mib = spec.split(':')
        marker = '%s.tp%d' % (ready_file, rank)
        children.append(
            subprocess.Popen(
                [
                    sys.executable,
                    '-m',
                    'simgpu.hold',
                    '--state-dir',
                    state_dir,
                    '--gpu',
                    gpu,
                    '--mib',
                    mib,
                    '--title',
                    'sglang::scheduler_TP%d' % rank,
                    '--ready-file',
                    marker,
                ]
            )
        )
        while not os.path.exists(marker):
            if children[-1].poll() is not None:
                sys.exit('holder for %s failed' % spec)
            time.sleep(0.01)
    detokenizer = subprocess.Popen([sys.executable, '-c', DETOKENIZER], stdout=subprocess.PIPE)
    assert detokenizer.stdout is not None
    if detokenizer.stdout.readline().strip() != b'ready':
        sys.exit('detokenizer failed')
    helper = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])
    tmp = ready_file + '.tmp'
    with open(tmp, 'w') as f:
        f.write('launcher=%d\nhelper=%d\ndetokenizer=%d\nschedulers=%s\n' % (os.getpid(), helper.pid, detokenizer.pid, ','.join(str(c.pid) for c in children)))
    os.replace(tmp, ready_file)
    signal.pause()


if __name__ == '__main__':
    main()
