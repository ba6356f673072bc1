"""Errors the harness raises at its boundaries.

`UsageError` means the user asked for something impossible (bad flag, malformed
`conformance.yaml`, unknown `--impl`): the CLI exits 2.  `GoldenError` means a golden file is
missing, corrupt or off-schema: the case that needed it is reported as `error`, the run goes on.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class for errors the harness reports to the user in one line."""


class UsageError(HarnessError):
    """A command-line or configuration mistake. Exit code 2."""


class GoldenError(HarnessError):
    """A golden file is missing, corrupt, or does not follow the schema."""


class CaseSpecError(HarnessError):
    """A `cases/*.yaml` file is malformed."""
