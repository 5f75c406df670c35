"""pyproject.toml as pip reads it: the dependency ranges hold the pinned versions of requirements*.txt, and a wheel
built from the checkout, installed into a folder of its own, decodes with the embedded model it carries and runs its
console commands from another folder."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PIN_FILES = ("requirements.txt", "requirements-lm-eval.txt", "requirements-llamacpp.txt")
COMMANDS = {"packed-ss": "packed_ss.cli:main", "packed-ss-bench": "packed_ss.bench.cli:main",
            "packed-ss-lmeval": "packed_ss.lmeval.__main__:main", "packed-ss-train": "packed_ss.training.train:main"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """name -> pinned version of every ``name==version`` line of the requirements files."""
    found = {}
    for file in PIN_FILES:
        for line in (ROOT / file).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                found[normal(name)] = version.strip()
    return found


def requirements() -> list[Requirement]:
    """Every requirement of pyproject.toml: the build backend, the dependencies and the extras' (the project's own
    extras left out)."""
    project = PYPROJECT["project"]
    listed = (PYPROJECT["build-system"]["requires"] + project["dependencies"]
              + [r for extra in project["optional-dependencies"].values() for r in extra])
    return [Requirement(r) for r in listed if normal(Requirement(r).name) != "packed-ss"]


def test_every_dependency_range_holds_its_pinned_version():
    pinned = pins()
    found = requirements()
    assert len(found) > 15
    unpinned = [str(r) for r in found if normal(r.name) not in pinned]
    assert not unpinned, f"pin these in a requirements file too: {unpinned}"
    wrong = [f"{r} excludes {pinned[normal(r.name)]}" for r in found
             if not r.specifier.contains(pinned[normal(r.name)], prereleases=True)]
    assert not wrong, wrong
    torch = next(r for r in found if r.name == "torch")
    assert not torch.specifier.contains("2.14.0") and not torch.specifier.contains("3.0")  # never a newer build


def test_the_pin_check_can_fail():
    assert not Requirement("torch>=2.6,<2.13").specifier.contains(pins()["torch"])
    assert normal("huggingface_hub") == normal("huggingface-hub")


def test_the_commands_are_the_modules_entry_points():
    assert PYPROJECT["project"]["scripts"] == COMMANDS
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"]) - {"packed_ss.assets"}
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "packed_ss").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert listed == on_disk  # a new folder of packed_ss must be listed in pyproject.toml, or pip leaves it out


def _source_copy(into: Path) -> Path:
    """What pip reads of the checkout, copied (a build writes build/ and *.egg-info beside pyproject.toml)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    into.mkdir()
    shutil.copy(ROOT / "pyproject.toml", into)
    for folder in ("packed_ss", "assets", "docs"):
        shutil.copytree(ROOT / folder, into / folder, ignore=skip)
    return into


INSTALLED_RUN = """
import json, sys
from importlib.metadata import distribution
import packed_ss
from packed_ss import DecodeConfig, generate
from packed_ss.inputs import embedded_model, model_name
from packed_ss.models import DualModeModel

model = DualModeModel.from_pretrained(embedded_model(), device="cpu", dtype="float32")
run = generate(model, model.encode("def f(x):"), DecodeConfig(max_new_tokens=8), "packed")
scripts = {ep.name: ep.value for ep in distribution("packed-ss").entry_points if ep.group == "console_scripts"}
print(json.dumps({"file": packed_ss.__file__, "model": str(embedded_model()), "name": model_name(embedded_model()),
                  "ids": list(run.token_ids), "scripts": scripts,
                  "loaded": all(callable(ep.load()) for ep in distribution("packed-ss").entry_points),
                  "custom_generate": packed_ss.custom_generate.__module__}))
"""


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_decodes_with_its_embedded_model_and_runs_its_commands(tmp_path):
    source = _source_copy(tmp_path / "source")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "wheels"),
                    str(source)], check=True, cwd=tmp_path, timeout=120)
    [wheel] = (tmp_path / "wheels").glob("packed_ss-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "packed_ss").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules <= names and "packed_ss/custom_generate_template/generate.py" in names
    carried = {n for n in names if n.startswith("packed_ss/assets/")}
    assert carried == {f"packed_ss/assets/model/{p.name}" for p in (ROOT / "assets" / "model").iterdir()}
    assert not [n for n in names if n.split("/")[0] in ("serve", "components", "tabs", "tests", "app.py")]

    target = tmp_path / "installed"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], check=True,
                   timeout=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", INSTALLED_RUN], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(seen["file"]).is_relative_to(target) and not Path(seen["file"]).is_relative_to(ROOT)
    assert Path(seen["model"]) == target / "packed_ss" / "assets" / "model" and seen["name"] == "assets/model"
    assert seen["scripts"] == COMMANDS and seen["loaded"] and seen["custom_generate"] == "packed_ss.hf_generate"

    from packed_ss import DecodeConfig, generate  # the checkout's engine on the checkout's model: the same tokens
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(ROOT / "assets" / "model", device="cpu", dtype="float32")
    assert seen["ids"] == list(generate(model, model.encode("def f(x):"), DecodeConfig(max_new_tokens=8)).token_ids)

    command = target / "bin" / "packed-ss"
    shown = subprocess.run([str(command), "--help"], cwd=elsewhere, env=env, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0 and "generate" in shown.stdout, shown.stderr[-2000:]
    ran = subprocess.run([str(command), "generate", "--prompt", "def f(x):", "--max-new-tokens", "8", "--threads", "1",
                          "--json"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads(ran.stdout)["token_ids"] == seen["ids"]  # the command's default model: the installed copy


def test_a_missing_optional_dependency_is_one_line_naming_its_extra(monkeypatch, tmp_path):
    from helpers import tiny_llama

    from packed_ss.models import ModelLoadError
    from packed_ss.models.lora import DrafterLora

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError, as where it is missing
    with pytest.raises(ModelLoadError) as error:
        DrafterLora.load(tiny_llama().model, tmp_path, lambda name: name)
    assert "\n" not in str(error.value) and "packed-ss[lora]" in str(error.value)
    assert "lora" in PYPROJECT["project"]["optional-dependencies"]
