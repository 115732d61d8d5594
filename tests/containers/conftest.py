"""Print the timings test_containers.py measured at the end of the run (also visible without -s)."""


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        from test_containers import TIMINGS
    except ImportError:  # imported under another name (rootdir/package layout): look it up
        import sys

        mod = next((m for n, m in sys.modules.items() if n.endswith("test_containers")), None)
        TIMINGS = getattr(mod, "TIMINGS", {})
    if TIMINGS:
        terminalreporter.section("container test host timings")
        for key, value in TIMINGS.items():
            terminalreporter.write_line(f"{key}: {value}")
