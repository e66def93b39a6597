"""The GPU checks run in device calls that a time limit may cut short, before pytest prints its
failures at the end: each failure's report goes to the output the moment it happens."""

from __future__ import annotations


def pytest_runtest_logreport(report):
    if report.failed:
        print(f"\n--- FAILED {report.nodeid} ({report.when}):\n{report.longreprtext[-6000:]}\n---", flush=True)
