"""Remote pytest-xdist workers over real ssh gateways (`make test-distributed`; not part of `make test`).

An sshd of its own on loopback (a throwaway host key, client key pair and port; openssh-server is
installed by the make target where missing), the wheel installed in a fresh virtualenv
(tests/wheel_env.py), and a team project judged twice by the plugin: serially, and over two ssh
gateways (`--tx ssh=...//python=<the venv's python>`). The verdicts and messages must be the same. A
worker whose package version differs from the controller's is refused by name.
"""

from __future__ import annotations

import ctypes
import getpass
import os
import signal
import shutil
import socket
import subprocess
import time
import venv
from pathlib import Path

import pytest

from conftest import results, statuses
from test_package import MIXED
import wheel_env

installed = wheel_env.installed  # the fixture

pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("package")]

SELECT = "quant.*,topk.*,window.indices"
OTHER_VERSION = "0.0.0+other"


def _sshd_binary() -> str:
    found = shutil.which("sshd") or next(
        (p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.fail("no sshd on this machine: `make test-distributed` installs openssh-server (apt-get) and runs this")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    """The sshd ends with this process however it ends (a cancelled CI job's SIGTERM, a SIGKILL): Linux's
    PR_SET_PDEATHSIG; the fixture's teardown stops it otherwise."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def loopback_ssh(tmp_path_factory):
    """An sshd on 127.0.0.1 that lets this user in with a throwaway key; yields the ssh_config to use."""
    root = tmp_path_factory.mktemp("ssh")
    _keygen(root / "host_key")
    _keygen(root / "client_key")
    (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
    port = _free_port()
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
    )
    server = subprocess.Popen(
        [_sshd_binary(), "-D", "-e", "-f", str(root / "sshd_config")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_die_with_parent,
    )
    (root / "ssh_config").write_text(
        f"Host conformance-loopback\n  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n"
        f"  IdentityFile {root / 'client_key'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    deadline = time.monotonic() + 60
    while True:
        probe = subprocess.run(
            ["ssh", "-F", str(root / "ssh_config"), "conformance-loopback", "true"], capture_output=True, text=True
        )
        if probe.returncode == 0:
            break
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(
                f"the loopback sshd did not let us in: {probe.stderr[-1000:]}\n{server.communicate()[0][-2000:]}"
            )
        time.sleep(0.2)
    yield root / "ssh_config"
    server.terminate()
    server.wait(timeout=30)


def _gateway(ssh_config: Path, python: Path, chdir: Path) -> str:
    return f"ssh=conformance-loopback//ssh_config={ssh_config}//python={python}//chdir={chdir}"


def _other_version(installed, root: Path) -> Path:
    """A second virtualenv with the same wheel, its package claiming another version."""
    env = root / "other-env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shutil.copy(next(Path(installed.python).parents[1].glob("lib/python*/site-packages/_dependencies.pth")), site)
    proc = subprocess.run(
        [
            str(installed.python),
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(installed.wheel),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:  # the venv's own python has no pip: use this interpreter's for the target
        proc = subprocess.run(
            [
                "python3",
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                str(installed.wheel),
            ],
            capture_output=True,
            text=True,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    init = Path(site) / "v41_conformance" / "__init__.py"
    text = init.read_text()
    assert '__version__ = "' in text
    init.write_text(text.replace(text.split('__version__ = "', 1)[1].split('"', 1)[0], OTHER_VERSION, 1))
    return python


def test_two_ssh_gateways_judge_like_a_serial_run_and_another_version_is_refused_by_name(installed, loopback_ssh):
    project = installed.folder("remote")
    (project / "mixed.py").write_text(MIXED)
    (project / "conformance.yaml").write_text(
        "impls:\n  mixed:\n    python: mixed.py:Mixed\n    expectations:\n"
        "      - {pattern: 'quant.fp4_e8m0/*', status: fail, reason: 'doubles y, issue 1'}\n"
    )
    chdirs = [installed.folder(f"remote-{i}") for i in range(3)]
    (project / "mixed").mkdir()  # folders named like the implementation and the select patterns: xdist
    (project / SELECT).mkdir()  # must take neither for a path
    common = [installed.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--conformance-impl", "mixed",
              "--conformance-select", SELECT]  # fmt: skip
    gateways = ["--tx", _gateway(loopback_ssh, installed.python, chdirs[0]),
                "--tx", _gateway(loopback_ssh, installed.python, chdirs[1])]  # fmt: skip
    serial = installed.run(*common, "--conformance-report-dir", "serial", cwd=project)
    # the report dir and the config file exist (the report dir as soon as the plugin opens it): relative
    # paths, then absolute ones into the same, existing report dir
    for where in (lambda name: name, lambda name: str(project / name)):
        remote = installed.run(*common, "--conformance-report-dir", where("ssh"), "--conformance-config",
                               where("conformance.yaml"), "--dist", "load", "-v", *gateways, cwd=project)  # fmt: skip
        assert remote.returncode == 1 and "rsync root" not in remote.stdout + remote.stderr, (
            remote.stdout[-3000:] + remote.stderr[-3000:]
        )
    print(remote.stdout[-3000:])
    assert serial.returncode == remote.returncode == 1, remote.stdout[-3000:] + remote.stderr[-3000:]
    assert "[gw0] linux" in remote.stdout and "[gw1] linux" in remote.stdout, remote.stdout[-3000:]
    a, b = results(project / "serial"), results(project / "ssh")
    assert statuses(a) == statuses(b) and {"pass", "xfail", "error", "unsupported"} == set(statuses(a).values())
    assert [c["message"] for c in a["cases"]] == [c["message"] for c in b["cases"]]
    assert a["store"] == b["store"] and b["store"]["origin"] == "package"
    # one gateway whose package claims another version: refused, by its worker id and host
    other = _other_version(installed, installed.root)
    mixed = installed.run(
        *common,
        "--conformance-report-dir",
        "mixed-versions",
        "--dist",
        "load",
        "--tx",
        _gateway(loopback_ssh, installed.python, chdirs[0]),
        "--tx",
        _gateway(loopback_ssh, other, chdirs[2]),
        cwd=project,
    )
    assert mixed.returncode == 1, mixed.stdout[-3000:] + mixed.stderr[-3000:]
    refused = [c for c in results(project / "mixed-versions")["cases"] if "refused" in (c.get("message") or "")]
    assert refused and {c["status"] for c in refused} == {"error"}
    says = refused[0]["message"]
    print(says)
    assert f"this worker (gw1 on {socket.gethostname()}) runs v41-conformance {OTHER_VERSION}" in says
    assert f"the controller runs {a['versions']['harness']}" in says
