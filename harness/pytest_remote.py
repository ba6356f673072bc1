"""The arguments an xdist worker receives: the plugin's options joined to their values.

pytest-xdist hands a worker that runs elsewhere (an ssh gateway, or any gateway with a chdir) the
controller's command line, rewriting each argument that names an existing path relative to an rsync
root, and it stops the session ("arg ... not relative to an rsync root") at one it cannot place. The
value of `--conformance-report-dir` is such an argument as soon as the folder exists (the plugin opens
it before any worker starts, and a second run finds it), and so can be a config file, a select pattern
or an implementation's path that happens to exist here. A worker does not need those values: it
judges the plan the controller sends it (`workerinput`). Joined as `--option=value`, one argument
that is no path, they pass through xdist untouched and the worker parses them as before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

# The plugin's options that take a value (harness/pytest_cases.py).
VALUE_OPTIONS = (
    "--conformance-impl",
    "--conformance-select",
    "--conformance-device",
    "--conformance-report-dir",
    "--conformance-config",
    "--conformance-tier",
    "--conformance-timeout",
)


def joined(args: tuple[str, ...] | list[str], options: tuple[str, ...] = VALUE_OPTIONS) -> tuple[str, ...]:
    """`args` with every `OPTION VALUE` pair of `options` written as the one argument `OPTION=VALUE`;
    everything else (other options, test paths, anything after `--`) as it was."""
    out: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--":
            out.append(arg)
            out.extend(rest)
            break
        if arg in options:
            value = next(rest, None)
            out.append(arg if value is None else f"{arg}={value}")  # a missing value: pytest said so already
        else:
            out.append(arg)
    return tuple(out)


def join_for_workers(config: pytest.Config) -> None:
    """Rewrite the controller's invocation arguments (what xdist sends its workers) in joined form."""
    params = config.invocation_params
    args = joined(params.args)
    if args != tuple(params.args):
        config.invocation_params = replace(params, args=args)
