"""The `conformance` command (also `python -m v41_conformance`).

Exit codes: 0 everything passed; 1 a case failed, drifted or a floor was missed; 2 a usage or
configuration error (bad flag, malformed conformance.yaml, unknown --impl, a report dir in use);
130 / 143 a run stopped by SIGINT / SIGTERM (the reports hold what ran, the rest is `not_run`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
from pathlib import Path

import click

from .errors import HarnessError, UsageError
from .ids import parse_select


def _config(
    path: str | None, tier: str = "small", goldens: str | None = None, cases: str | None = None, validate: bool = True
):
    """conformance.yaml (its `goldens:` and `cases:` relative to its own folder), then --tier, then
    --goldens / --cases (relative to the current directory). `validate`: every tolerance resolved
    (which imports the component registry, and so torch)."""
    from .config import load_config

    config = load_config(Path(path) if path else None)
    if validate:
        config.validate()
    if goldens:
        config = dataclasses.replace(config, goldens=Path(goldens).resolve())
    if cases:
        config = dataclasses.replace(config, cases=Path(cases).resolve())
    return config.for_tier(tier)


def _fail_usage(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


config_option = click.option(
    "--config", "config_path", default=None, help="path to conformance.yaml (default: search upwards)"
)
select_option = click.option(
    "--select", "-s", multiple=True, help="shell-style patterns over case ids (repeat or comma separate)"
)


def store_options(fn):
    fn = click.option(
        "--cases",
        "cases_dir",
        default=None,
        type=click.Path(file_okay=False),
        help="case files (default: conformance.yaml's cases:, relative to that file)",
    )(fn)
    return click.option(
        "--goldens",
        "goldens_dir",
        default=None,
        type=click.Path(file_okay=False),
        help="the golden store (default: conformance.yaml's goldens:, relative to that file)",
    )(fn)


tier_option = click.option(
    "--tier",
    default="small",
    show_default=True,
    help="small (the goldens in git) or production (built locally, pinned by SHA-256)",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="v41-conformance")
def main() -> None:
    """Golden-data conformance harness for DeepSeek-V4.1 compressed attention."""


STANDALONE = {"process": False}  # this process is the `conformance` command itself (not a host calling main)


def entry() -> None:
    """The `conformance` command (and `python -m v41_conformance`): the CLI in a process of its own
    (so its fork server may be a fork of it: `forkserver.warm_up`), then an exit that skips tearing
    the interpreter down. With torch loaded, the teardown (every module and object freed, its
    libraries unloaded) takes longer than judging a small case; everything a run leaves behind
    (reports, printed output, the fork server's socket folder) is done by then, and the exit
    handlers still run."""
    STANDALONE["process"] = True
    from .allocator import keep_freed_memory

    keep_freed_memory()  # before torch allocates anything, for this process and the children it forks
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    import atexit
    import threading

    if threading.active_count() != 1:  # a thread still running: the ordinary exit waits for it
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        click.echo(code, err=True)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)


@main.command()
@click.option(
    "--impl",
    required=True,
    help="reference, a name from conformance.yaml, an entry point, pkg.mod:attr or file.py:attr",
)
@select_option
@click.option(
    "--report-dir",
    default="reports/latest",
    show_default=True,
    type=click.Path(file_okay=False),
    help="where the reports go; one run at a time per folder",
)
@click.option(
    "-n",
    "workers",
    default="0",
    show_default=True,
    help="cases at once, each in an isolation child of this run's own process: a number or auto "
    "(with --no-isolate: pytest-xdist workers)",
)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N")
@click.option("--timeout", type=float, default=None, help="seconds per case (default: conformance.yaml's timeout)")
@click.option("--no-isolate", is_flag=True, help="run the implementation in the worker itself (faster, not crash-safe)")
@click.option(
    "--diagnosis-budget",
    type=int,
    default=None,
    help="re-runs of the reference per failing case for naming known porting bugs (default 64, "
    "production tier 8; 0: no diagnosis)",
)
@click.option("--shard", default=None, help="I/N: run only shard I of N (deterministic split by case id)")
@click.option("--pytest-args", default="", help="extra pytest arguments, e.g. \"--tx ssh=host//python=python3\"")
@click.option(
    "--baseline",
    default=None,
    type=click.Path(),
    help="a report dir or results.json of an earlier run: the reports add what changed since (see `diff`)",
)
@tier_option
@store_options
@config_option
def run(
    impl,
    select,
    report_dir,
    workers,
    device,
    timeout,
    no_isolate,
    diagnosis_budget,
    shard,
    pytest_args,
    baseline,
    tier,
    goldens_dir,
    cases_dir,
    config_path,
):
    """Run an implementation against the goldens and write the conformance report."""
    from .adapters.loader import locate, resolve

    try:  # a typo in --impl is reported before torch is imported
        config = _config(config_path, tier, goldens_dir, cases_dir, validate=False)
        locate(resolve(impl, config))
    except HarnessError as exc:
        _fail_usage(exc)
    if not no_isolate:
        from .forkserver import warm_up

        # in a process of its own, torch is imported here, once: the fork server is a fork of this process
        warm_up(here=STANDALONE["process"])
    from .report import render_table
    from .session import RunOptions
    from .session import run as run_session

    try:
        config.validate()
        _check_device(device)
        _check_run_flags(workers, timeout, Path(report_dir), config)
        if diagnosis_budget is not None and diagnosis_budget < 0:
            raise UsageError(
                f"--diagnosis-budget {diagnosis_budget!r}: expected a whole number of re-runs >= 0 (0 turns it off)"
            )
        options = RunOptions(
            impl=impl,
            select=parse_select(select),
            report_dir=Path(report_dir),
            workers=str(workers),
            device=device,
            timeout=timeout,
            isolate=not no_isolate,
            shard=_parse_shard(shard),
            diagnosis_budget=diagnosis_budget,
            pytest_args=tuple(shlex.split(pytest_args)),
            config_path=config_path,
            tier=tier,
            stores=(goldens_dir, cases_dir),
            baseline=Path(baseline) if baseline else None,
        )
        doc = run_session(config, options)  # writes the reports while it holds the report dir
    except HarnessError as exc:
        _fail_usage(exc)
    click.echo(render_table(doc))
    if doc.get("baseline"):
        from .report.changes import render_diff_text

        click.echo(render_diff_text(doc["baseline"]))
    click.echo(f"reports: {Path(report_dir) / 'results.json'}, summary.md, junit.xml, report.html")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a") as fh:
            fh.write((Path(report_dir) / "summary.md").read_text())
    sys.exit(doc["exit_code"])


def _check_run_flags(workers: str, timeout: float | None, report_dir: Path, config) -> None:
    if not (workers in ("auto", "logical") or (workers.isdigit())):
        raise UsageError(f"-n {workers!r}: expected a number of workers >= 0, or auto")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--timeout {timeout!r}: expected a positive number of seconds per case")
    where = report_dir.resolve()
    for protected, what in ((config.goldens, "the golden store"), (config.cases, "the case files")):
        protected = protected.resolve()
        if where == protected or protected in where.parents:
            raise UsageError(
                f"--report-dir {report_dir} lies inside {what} ({protected}); pick a folder of its own, "
                "such as reports/<impl>"
            )


def _parse_shard(shard: str | None):
    if not shard:
        return None
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        raise UsageError(f"--shard {shard!r}: expected I/N, for example 1/4") from None
    if not (count >= 1 and 1 <= index <= count):
        raise UsageError(f"--shard {shard!r}: need 1 <= I <= N")
    return index, count


def _check_device(device: str) -> None:
    """A usable --device, asked of a throwaway child (`v41_conformance.device_check`): this process never
    initialises the CUDA driver, which would leave every child forked from it unable to use CUDA."""
    if device == "cpu":
        return
    if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise UsageError(f"--device {device!r}: expected cpu, cuda or cuda:N")
    from .device_check import problem, visible_devices

    why = problem(device, visible_devices())
    if why:
        raise UsageError(f"--device {device}: {why}; run on a GPU machine or use --device cpu")


@main.command()
@select_option
@click.option(
    "--check", is_flag=True, help="regenerate in memory and report drift against the frozen goldens; write nothing"
)
@tier_option
@store_options
@config_option
def generate(select, check, tier, goldens_dir, cases_dir, config_path):
    """Write goldens from the reference (or, with --check, prove they still match it)."""
    from .generate import generate as run_generate
    from .generate import print_progress

    import torch

    if tier == "small":  # the small tier's reference is many tiny ops: threads only add synchronisation
        torch.set_num_threads(1)
    try:
        config = _config(config_path, tier, goldens_dir, cases_dir)
        if not check:
            _refuse_packaged(config)
        report = run_generate(config, parse_select(select), check=check, progress=print_progress())
    except HarnessError as exc:
        _fail_usage(exc)
    if select and not (report.written or report.unchanged or report.drift or report.errors):
        click.echo(
            f"error: no case matches --select {','.join(select)!r}; `conformance list` shows the case ids", err=True
        )
        sys.exit(1)
    for case_id, problem in report.errors.items():
        click.echo(f"ERROR {case_id}: {problem}", err=True)
    for case_id, drift in report.drift.items():
        click.echo(f"DRIFT {case_id}: {drift}")
    if check:
        click.echo(
            f"checked {len(report.unchanged) + len(report.drift)} golden(s): {len(report.unchanged)} identical, "
            f"{len(report.drift)} drifted, {len(report.errors)} error(s)"
        )
    else:
        click.echo(
            f"wrote {len(report.written)}, unchanged {len(report.unchanged)}, removed {len(report.removed)}, "
            f"errors {len(report.errors)}"
        )
    sys.exit(0 if report.ok else 1)


def _refuse_packaged(config) -> None:
    """The small tier installed with the package is the package's: `generate` writes a store of yours."""
    from .store import origin

    if config.tier == "small" and origin(config.goldens) == "package":
        raise UsageError(
            f"{config.goldens} is the golden store installed with the package, which "
            "`conformance generate` does not rewrite; point `goldens:` (and `cases:`) in your "
            "conformance.yaml, or --goldens, at a folder of your own"
        )


@main.command(name="check-protocol")
@click.option("--impl", "impl_name", default=None, help="a subprocess implementation named in conformance.yaml")
@click.option(
    "--batch", is_flag=True, help="with a COMMAND: drive `COMMAND serve` (default: `COMMAND run` per request)"
)
@config_option
@click.argument("command", nargs=-1)
def check_protocol(impl_name, batch, config_path, command):
    """Check how a program reads the subprocess protocol, before its numbers: every tensor dtype and
    param type round-trips through its `protocol.echo` (docs/subprocess-protocol.md).

    \b
    conformance check-protocol -- target/release/my-port
    conformance check-protocol --impl my-rust-port
    """
    from .adapters.subprocess_adapter import SubprocessAdapter
    from .protocol_check import check_program

    try:
        if bool(impl_name) == bool(command):
            raise UsageError("give a program after `--` (conformance check-protocol -- COMMAND ...) or --impl NAME")
        if impl_name:
            config = _config(config_path)
            conf = config.impls.get(impl_name)
            if not conf or "command" not in conf:
                raise UsageError(
                    f"--impl {impl_name!r}: check-protocol needs an impls entry with `command:` in {config.path}"
                )
            adapter = SubprocessAdapter.from_conf(impl_name, conf, config.root)
        else:
            adapter = SubprocessAdapter.from_conf(
                "check-protocol", {"command": list(command), "batch": batch}, Path.cwd()
            )
    except HarnessError as exc:
        _fail_usage(exc)
    try:
        findings, checked = check_program(adapter)
    finally:
        adapter.close(kill=True)
    for finding in findings:
        click.echo(finding.line())
    if findings:
        click.echo(
            f"{len(findings)} problem(s) in {checked} item(s) sent; the catalogue (conformance list --components) "
            "and docs/subprocess-protocol.md give every encoding"
        )
        sys.exit(1)
    click.echo(f"protocol ok: {checked} tensors and params over 2 requests came back bit for bit")


@main.command()
@tier_option
@store_options
@config_option
def verify(tier, goldens_dir, cases_dir, config_path):
    """Check every golden against MANIFEST.json and the schema."""
    from .generate import verify as run_verify
    from .golden import read_manifest

    try:
        config = _config(config_path, tier, goldens_dir, cases_dir)
        problems = run_verify(config)
        count = len(set(read_manifest(config.goldens, drop_invalid=True)))
    except HarnessError as exc:
        _fail_usage(exc)
    for case_id, problem in problems.items():
        click.echo(f"BAD {case_id}: {problem}")
    click.echo(f"verified {count} manifest entr{'y' if count == 1 else 'ies'}: {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


@main.command(name="list")
@select_option
@click.option(
    "--components",
    "only_components",
    is_flag=True,
    help="the component catalogue: inputs, returns, compared outputs, params, dims",
)
@click.option("--json", "as_json", is_flag=True, help="with --components: machine-readable")
@click.option("--markdown", "as_markdown", is_flag=True, help="with --components: docs/catalogue.md")
@click.option("--spaces", "only_spaces", is_flag=True, help="what `conformance fuzz` samples, per component")
@tier_option
@store_options
@config_option
def list_cases(
    select, only_components, as_json, as_markdown, only_spaces, tier, goldens_dir, cases_dir, config_path
) -> None:
    """List cases, or (--components) the component catalogue, or (--spaces) the fuzz spaces."""
    if only_spaces:
        from .fuzz_sample import selected_spaces

        for name, space in selected_spaces(parse_select(select)).items():
            click.echo(f"{name:<22} {space.note}")
        return
    from .cases import load_cases
    from .catalogue import catalogue, render_markdown, render_text
    from .known import components

    try:
        config = _config(config_path, tier, goldens_dir, cases_dir)
        registry = components()
        if only_components:
            doc = catalogue(config, registry)
            if as_json:
                click.echo(json.dumps(doc, indent=1))
            else:
                click.echo(render_markdown(doc) if as_markdown else render_text(doc), nl=False)
            return
        specs = load_cases(config.cases, parse_select(select))
    except HarnessError as exc:
        _fail_usage(exc)
    by_component: dict[str, int] = {}
    for spec in specs:
        click.echo(spec.id)
        by_component[spec.component] = by_component.get(spec.component, 0) + 1
    click.echo(f"{len(specs)} case(s) in {len(by_component)} component(s)", err=True)


@main.command()
@click.argument("case_ids", nargs=-1, required=True)
@click.option(
    "--dump",
    "dump_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="write each call's request (and the reference's response) as a subprocess program gets them; "
    "with several cases, one folder <component>__<case> each",
)
@click.option("--values", default=6, show_default=True, help="values shown per tensor")
@tier_option
@store_options
@config_option
def show(case_ids, dump_dir, values, tier, goldens_dir, cases_dir, config_path):
    """Print cases: params, and every tensor's name, dtype, shape and first values."""
    from .show import dump_requests, render_case

    try:
        config = _config(config_path, tier, goldens_dir, cases_dir)
        for case_id in case_ids:
            click.echo(render_case(config, case_id, values), nl=False)
            if dump_dir:
                folder = Path(dump_dir) / (case_id.replace("/", "__") if len(case_ids) > 1 else "")
                calls = dump_requests(config, case_id, folder)
                click.echo(f"wrote {len(calls)} request(s) and response(s) to {folder} (calls.json lists them)")
    except HarnessError as exc:
        _fail_usage(exc)


@main.command()
@click.argument("report_dir", type=click.Path(file_okay=False))
def report(report_dir):
    """Re-render summary.md, junit.xml, report.html and the table from REPORT_DIR/results.json."""
    from .report import read_results, render_table, write_reports

    try:
        doc = read_results(Path(report_dir))
    except HarnessError as exc:
        _fail_usage(exc)
    write_reports(doc, Path(report_dir))
    click.echo(render_table(doc))
    sys.exit(doc["exit_code"])


@main.command()
@click.option("--impl", required=True, help="as for `run`")
@select_option
@click.option(
    "--budget", "budget_s", type=float, default=None, help="seconds to spend sampling and judging (default 60)"
)
@click.option(
    "--cases", "case_count", type=int, default=None, help="sample exactly this many cases instead of a budget"
)
@click.option("--seed", default=0, show_default=True, type=int, help="the same seed samples the same cases everywhere")
@click.option(
    "--index",
    "case_index",
    type=int,
    default=None,
    help="re-create only case INDEX of the seed (printed with a failure)",
)
@click.option("--promote", is_flag=True, help="add each shrunk failing case to cases/ and write its golden")
@click.option("--shrink-seconds", default=60.0, show_default=True, help="time to spend shrinking failures")
@click.option("--report-dir", default="reports/fuzz", show_default=True, type=click.Path(file_okay=False))
@click.option("-n", "workers", default="0", show_default=True, help="parallel isolation children: a number or auto")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N")
@click.option("--timeout", type=float, default=None, help="seconds per case (default: conformance.yaml's timeout)")
@click.option("--no-isolate", is_flag=True, help="run the implementation in this process (faster, not crash-safe)")
@config_option
def fuzz(
    impl,
    select,
    budget_s,
    case_count,
    seed,
    case_index,
    promote,
    shrink_seconds,
    report_dir,
    workers,
    device,
    timeout,
    no_isolate,
    config_path,
):
    """Judge an implementation on fresh cases sampled from every component's space.

    Cases are built by the reference at once and judged exactly like goldens; a failure is shrunk
    to a small case printed as a case-file entry (`--promote` adds it to cases/ with its golden).
    Exit 0 when nothing failed, 1 when something did, 2 on a usage error."""
    if not no_isolate:
        from .forkserver import warm_up

        warm_up(here=STANDALONE["process"])
    from .fuzz import FuzzOptions
    from .fuzz import fuzz as run_fuzz
    from .report import render_table
    from .report.fuzzing import render_fuzz_text

    try:
        config = _config(config_path)
        _check_device(device)
        _check_run_flags(workers, timeout, Path(report_dir), config)
        if budget_s is not None and case_count is not None:
            raise UsageError("give --budget SECONDS or --cases N, not both")
        if (budget_s is not None and not budget_s > 0) or (case_count is not None and case_count < 1):
            raise UsageError("--budget must be positive seconds and --cases at least 1")
        options = FuzzOptions(
            impl=impl,
            select=parse_select(select),
            report_dir=Path(report_dir),
            seed=seed,
            budget_s=60.0 if budget_s is None and case_count is None else budget_s,
            cases=1 if case_index is not None else case_count,
            index=case_index,
            workers=str(workers),
            isolate=not no_isolate,
            timeout=timeout,
            device=device,
            config_path=config_path,
            promote=promote,
            shrink_s=shrink_seconds,
        )
        doc = run_fuzz(config, options)
    except HarnessError as exc:
        _fail_usage(exc)
    click.echo(render_table(doc))
    click.echo(render_fuzz_text(doc))
    click.echo(f"reports: {Path(report_dir) / 'results.json'}, summary.md, junit.xml, report.html")
    sys.exit(doc["exit_code"])


@main.command()
@click.argument("base", type=click.Path())
@click.argument("new", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text", show_default=True)
@click.option(
    "--fail-on",
    type=click.Choice(["regressions", "new-failures", "any"]),
    default="regressions",
    show_default=True,
    help="what exits 1: a case that passed and now does not (and a floor newly "
    "missed); also a new or regenerated case that fails; or NEW not passing at all",
)
def diff(base, new, fmt, fail_on):
    """What changed from run BASE to run NEW (each a report dir or a results.json).

    Exit 0 when nothing regressed (even if some cases still fail), 1 on a regression (see
    --fail-on), 2 when a report cannot be read."""
    from .diff import diff_results
    from .report import read_results
    from .report.changes import render_diff_markdown, render_diff_text

    try:
        result = diff_results(read_results(Path(base)), read_results(Path(new)), base, new)
    except HarnessError as exc:
        _fail_usage(exc)
    if fmt == "json":
        click.echo(json.dumps(result, indent=1))
    else:
        click.echo((render_diff_markdown if fmt == "markdown" else render_diff_text)(result), nl=False)
    sys.exit(result["gates"][fail_on])


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.argument("parts", nargs=-1, required=True, type=click.Path())
@config_option
def merge(out, parts, config_path):
    """Merge the report dirs of one run's shards (or of several machines) into OUT.

    Checks that every shard is there exactly once and that no case was judged twice, enforces
    the case floors on the union, writes every report format and OUT/output.log. Exits like
    `run`: 0 when the merged run passes, 1 otherwise, 2 when a part cannot be read."""
    from .merge import merge_results
    from .report import read_results, render_table, write_reports
    from .rundir import RunDir

    try:
        out_dir = Path(out)
        for part in parts:
            if Path(part).resolve() in (out_dir.resolve(), (out_dir / "results.json").resolve()):
                raise UsageError(f"{part}: OUT must be a folder of its own, not one of the parts")
        docs = [(part, read_results(Path(part))) for part in parts]
        merged = merge_results(docs, _floors(config_path))
        with RunDir(out_dir):
            write_reports(merged, out_dir)
            _merge_logs(parts, out_dir)
    except HarnessError as exc:
        _fail_usage(exc)
    click.echo(render_table(merged))
    click.echo(f"merged {len(parts)} part(s) into {out_dir / 'results.json'}, summary.md, junit.xml, report.html")
    sys.exit(merged["exit_code"])


def _floors(config_path: str | None) -> dict[str, int]:
    """Each component's case floor from conformance.yaml when there is one (the parts record the
    floors they ran with, and those win); the registry's own floors otherwise."""
    from .known import components

    registry = components()
    try:
        config = _config(config_path)
    except HarnessError:
        if config_path:
            raise
        return {name: c.floor for name, c in registry.items()}
    return {name: config.floor(c) for name, c in registry.items()}


def _merge_logs(parts, out_dir: Path) -> None:
    """The parts' output.log files in one, and the whole output of their long cases beside it."""
    import shutil

    from .golden import write_atomic
    from .rundir import OUTPUT_DIR, OUTPUT_LOG

    chunks = []
    for part in parts:
        log = Path(part) / OUTPUT_LOG
        if Path(part).is_dir() and log.exists():
            chunks.append(f"===== {part} =====\n".encode() + log.read_bytes())
        whole = Path(part) / OUTPUT_DIR
        if Path(part).is_dir() and whole.is_dir():
            shutil.copytree(whole, out_dir / OUTPUT_DIR, dirs_exist_ok=True)
    if chunks:
        write_atomic(out_dir / OUTPUT_LOG, b"\n".join(chunks))


if __name__ == "__main__":
    main()
