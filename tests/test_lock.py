"""CI installs what was tested: every pip install of the Makefile takes its versions from lock/, the lock
pins every dependency pyproject.toml declares, and this environment runs the locked versions.

An upstream release must not change a result between two runs of one commit; `make lock` updates
lock/ on purpose (README, Development).
"""

from __future__ import annotations

import re
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def makefile() -> tuple[dict[str, str], dict[str, list[str]]]:
    """The Makefile's `NAME := value` variables and each target's recipe lines."""
    variables, recipes, target = {}, {}, None
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("\t") and target is not None:
            recipes[target].append(line.strip())
        elif m := re.match(r"^([A-Z_0-9]+)\s*[:?]?=\s*(.*?)\s*$", line):
            variables[m[1]] = m[2]
        elif m := re.match(r"^([^\s#=][^:=]*):(?!=)", line):
            target = m[1].strip()
            recipes[target] = []
        elif not line.startswith("\t"):
            target = None
    return variables, recipes


def expand(text: str, variables: dict[str, str]) -> str:
    for _ in range(5):  # variables made of variables
        text = re.sub(r"\$\(([A-Z_0-9]+)\)", lambda m: variables.get(m[1], m[0]), text)
    return text


def lock_pins() -> dict[str, str]:
    variables, _ = makefile()
    pins = {}
    for line in (REPO / variables["LOCK"]).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = PIN.match(line.strip())
            assert m, f"{variables['LOCK']}: {line!r} is not an exact pin (name==version); run `make lock`"
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def test_every_pip_install_of_the_makefile_uses_the_lock():
    variables, recipes = makefile()
    assert variables["LOCK"] == "lock/constraints.txt"
    installs = [
        (expand(target, variables), expand(line, variables))
        for target, lines in recipes.items()
        if target != "lock"  # the one install that is free: it makes the lock
        for line in lines
        if "pip install" in line
    ]
    assert len(installs) >= 4, installs  # torch, the project, Isaac Lab 2 and 3
    for target, line in installs:
        hashed = re.search(r"--require-hashes .*-r (lock/\S+)", line)
        # the Kit venv (Python 3.12, `make test-kit`): its own hand-kept exact pins, lock/kit*.txt
        kit = re.search(r"-[cr] (lock/kit\S*\.txt)", line)
        assert f"-c {variables['LOCK']}" in line or hashed or kit, f"Makefile ({target}): {line} does not use lock/"
        if hashed:
            assert (REPO / hashed[1]).is_file() and "--no-deps" in line, line
        if kit:
            named = re.findall(r"-[cr] (lock/\S+)", line)
            for name in named:
                pins = [x for x in (REPO / name).read_text().splitlines() if x.strip() and not x.startswith("#")]
                assert pins and all(PIN.match(x.strip()) for x in pins), f"{name}: every line an exact pin"
            assert "-c " in line or "--no-deps" in line, f"Makefile ({target}): {line}: dependencies unpinned"
    # `make test`, `make demo` (and .ci/run, which runs `make test`) install through those rules
    stamp = expand("$(STAMP)", variables)
    for target in ("test", "demo"):
        prerequisites = next(
            expand(line, variables)
            for line in (REPO / "Makefile").read_text().splitlines()
            if line.startswith(f"{target}:")
        )
        assert stamp in prerequisites, f"make {target} does not set up the locked venv first"
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_the_lock_pins_every_dependency_the_makefile_installs():
    variables, _ = makefile()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = expand("$(EXTRAS)", variables).split(",")
    declared = [*project["dependencies"], *(dep for extra in extras for dep in project["optional-dependencies"][extra])]
    pins = lock_pins()
    missing = [
        dep
        for dep in map(Requirement, declared)
        if (dep.marker is None or dep.marker.evaluate()) and canonicalize_name(dep.name) not in pins
    ]
    assert not missing, f"pyproject.toml declares {missing}, which lock/constraints.txt lacks: run `make lock`"
    torch = Requirement(expand("$(TORCH)", variables))
    assert str(torch.specifier) == "==2.13.0" and pins["torch"] == "2.13.0"  # the CPU wheel on disk
    for major in ("2", "3"):
        lines = [ln for ln in (REPO / f"lock/isaaclab-{major}.txt").read_text().splitlines() if ln[:1] not in "#"]
        assert len(lines) == 1 and re.fullmatch(rf"isaaclab=={major}\.\S+ --hash=sha256:[0-9a-f]{{64}}", lines[0])


def test_this_environment_runs_the_locked_versions():
    """What `make test` tests is what the lock says (a venv made before the lock changed is made again)."""
    different = {}
    for name, pinned in lock_pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not for this platform or Python
        if Version(installed).public != Version(pinned).public:  # torch 2.13.0+cpu is torch 2.13.0
            different[name] = (installed, pinned)
    assert not different, f"installed != locked (installed, locked): {different}; `make clean test` or `make lock`"
