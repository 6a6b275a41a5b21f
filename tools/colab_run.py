"""Run chapters' notebooks the way Colab does: a fresh runtime each, one "Run all".

    python tools/colab_run.py --colabtools PATH book/01_ssm_basics.ipynb [more.ipynb ...]

Needs the package index (PyPI) and git, so it is not part of `make test`; run
it with the project's virtual environment (it uses nbclient and
jupyter_client from there).

For each notebook it
  * restores a Colab-like runtime: a Python 3.13 virtual environment holding
    the versions of Colab's CPU runtime that tools/colab_freeze.txt lists (built
    once per --workdir from the package index only, then copied afresh for
    every notebook), a fresh HOME (so no pip cache) and an empty working
    directory;
  * starts a kernel that has done what Colab's does before the first cell:
    `google.colab` is in sys.modules, a package whose path is colabtools' own
    `google/colab/` (JAX imports `google.colab.output` whenever `google.colab`
    is loaded), numpy and PIL are imported (Colab's output formatters,
    `google/colab/_reprs.py`, import them), matplotlib with the inline backend,
    and `%pip` is Colab's: `pip ...` in a shell, its output shown, then
    colabtools' `_pip.print_previous_import_warning`, which is what raises
    Colab's "restart the runtime" prompt;
  * lets the install cell run as in Colab, with this checkout (`git+file://`,
    its committed HEAD) in place of the repository's GitHub URL, and with the
    reference-run download cache (`data.cache_dir()` under the fresh HOME)
    seeded with the repository's reference_runs/ files and committed
    benchmark results, which the package's SHA-256 manifests then check
    (GitHub itself cannot be reached offline);
  * executes every cell in order in that one kernel, and reports the first
    error or success, whether Colab would have asked for a restart, which
    packages the install cell changed, and the times.

colabtools is not on PyPI: --colabtools (or $COLABTOOLS) names a clone of
github.com/googlecolab/colabtools, or a bare git directory of it (its HEAD's
`google/colab/` is exported into the work directory). Exit status: 0 if every
notebook passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FREEZE = Path(__file__).with_name("colab_freeze.txt")
PYTHON = "/root/.pyenv/versions/3.13.0/bin/python3.13"

# Distributions whose modules Colab's kernel has imported before the first cell
# (numpy and PIL by colabtools' output formatters, matplotlib by the inline
# backend), and pandas, which the install cell also leaves alone. Installing
# another version of one of them in the running kernel mixes old and new code.
PREIMPORTED = ("numpy", "pillow", "matplotlib")
NEVER_PINNED = PREIMPORTED + ("pandas", "mlxtend")

# Environment variables a runtime keeps: transport (certificates, proxies) and
# the OpenBLAS settings this machine's processors need. Everything else (pip's
# find-links, extra indexes and constraints, PYTHONPATH, JAX's caches, ...) is
# left behind, and pip reads no configuration file.
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
            "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT",
            "PIP_DEFAULT_TIMEOUT", "http_proxy", "https_proxy", "no_proxy",
            "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def canonical(name):
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_freeze(text):
    """{canonical name: version} of a `pip freeze` listing's `name==version` lines.

    Comments and blank lines are skipped; any other line (a direct URL such as
    `google-colab @ file:///...`) raises ValueError naming it, so that the
    fixture stays a list of exact versions."""
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if m is None:
            raise ValueError(f"freeze line {number}: expected name==version, got {line!r}")
        out[canonical(m.group(1))] = m.group(2)
    return out


def freeze_commit(text):
    """The googlecolab/backend-info commit a freeze fixture names (`# commit: <sha>`)."""
    m = re.search(r"^# commit: ([0-9a-f]{7,40})\b", text, re.MULTILINE)
    if m is None:
        raise ValueError("the freeze fixture names no backend-info commit ('# commit: <sha>')")
    return m.group(1)


def pip_line(source):
    """The arguments of the `%pip install` line in an install cell's source."""
    lines = [line.strip() for line in source.splitlines() if line.strip().startswith("%pip ")]
    if len(lines) != 1:
        raise ValueError(f"expected one %pip line in the install cell, found {len(lines)}")
    return lines[0][len("%pip "):]


def pinned(source):
    """{canonical name: version} of the `name==version` pins on the install cell's
    %pip line, on both branches of a `{variable}` that IPython expands
    (`jax_pin = "jax[cuda12]" if ... else "jax"`); extras dropped."""
    out = {}
    for branch in ("if", "else"):
        for arg in expand(source, branch)[1:]:
            if " @ " in arg or "==" not in arg:
                continue
            name, version = arg.split("==", 1)
            out[canonical(name.split("[", 1)[0].strip())] = version.strip()
    return out


def expand(source, branch):
    """The arguments of the install cell's %pip line as pip gets them, with a
    `{variable}` set by `variable = "a" if ... else "b"` taken on `branch`
    ("if" or "else")."""
    import shlex

    line = pip_line(source)
    for var in re.findall(r"\{(\w+)\}", line):
        m = re.search(rf'^\s*{re.escape(var)} = "([^"]+)"(?: if .* else "([^"]+)")?$',
                      source, re.MULTILINE)
        if m is None:
            raise ValueError(f"the install cell does not set {var}")
        value = m.group(1) if branch == "if" or m.group(2) is None else m.group(2)
        line = line.replace("{" + var + "}", value)
    return shlex.split(line)


def substitute_repository(source, url, local):
    """The install cell's source with its `git+<url>` requirement pointing at the
    local repository `local` (a path) instead. ValueError if the cell does not
    install from `url`."""
    remote = f"git+{url.rstrip('/')}"
    if remote not in source:
        raise ValueError(f"the install cell does not install from {remote}")
    return source.replace(remote, f"git+{Path(local).resolve().as_uri()}")


def runtime_env(environ, home, venv):
    """The environment of a fresh Colab-like runtime: the variables of KEEP_ENV
    from `environ`, HOME, the virtual environment first on PATH, and pip told to
    read no configuration file (so: PyPI, no find-links, no extra index)."""
    env = {k: environ[k] for k in KEEP_ENV if k in environ}
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(Path(venv) / "bin"), env.get("PATH", "/usr/bin:/bin")])
    env["VIRTUAL_ENV"] = str(venv)
    env["PIP_CONFIG_FILE"] = os.devnull
    env["IPYTHONDIR"] = str(Path(home) / ".ipython")
    return env


# --- The runtime ----------------------------------------------------------------

def _run(cmd, env, log):
    log.write("$ " + " ".join(map(str, cmd)) + "\n")
    log.flush()
    result = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed (exit {result.returncode}); "
                           f"see {log.name}")


def build_image(workdir, python, freeze_path, environ):
    """The Colab-like virtual environment, built once per work directory and
    freeze fixture, as `workdir/image` (its venv inside, at the path it runs at).
    Returns the image directory."""
    digest = hashlib.sha256(Path(freeze_path).read_bytes()).hexdigest()[:16]
    image = workdir / "image"
    stamp = image / "freeze.sha256"
    if stamp.exists() and stamp.read_text() == digest:
        return image
    shutil.rmtree(image, ignore_errors=True)
    venv = workdir / "runtime" / "venv"
    shutil.rmtree(workdir / "runtime", ignore_errors=True)
    home = workdir / "image-home"  # the image's pip cache stays out of every runtime
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = runtime_env(environ, home, venv)
    versions = parse_freeze(Path(freeze_path).read_text())
    print(f"building the runtime image in {image} (once per work directory) ...", flush=True)
    t0 = time.monotonic()
    with open(workdir / "image.log", "w") as log:
        _run([python, "-m", "venv", venv], env, log)
        _run([venv / "bin/python", "-m", "pip", "install", f"pip=={versions['pip']}"], env, log)
        _run([venv / "bin/python", "-m", "pip", "install", "--no-deps", "-r", freeze_path],
             env, log)
    image.mkdir(parents=True)
    shutil.copytree(venv, image / "venv", symlinks=True)
    stamp.write_text(digest)
    shutil.rmtree(home)
    print(f"  built in {time.monotonic() - t0:.0f} s", flush=True)
    return image


def _startup(colab_path):
    """The IPython startup file: what Colab's kernel has done before the first cell."""
    return f'''\
# Written by tools/colab_run.py: what a fresh Colab kernel has done before the first cell.
import subprocess as _subprocess
import sys as _sys
import types as _types

try:
    import google as _google
except ImportError:
    _google = _types.ModuleType("google")
    _google.__path__ = []
    _sys.modules["google"] = _google
_colab = _types.ModuleType("google.colab")
_colab.__path__ = [{str(colab_path)!r}]
_colab.__package__ = "google.colab"
_sys.modules["google.colab"] = _google.colab = _colab

import numpy, PIL  # noqa: E401,F401  (as Colab's output formatters do:)
from google.colab import _reprs, _pip as _colab_pip  # noqa: F401

get_ipython().run_line_magic("matplotlib", "inline")


def _colab_pip_magic(line):
    """Colab's %pip: `pip LINE` in a shell, its output shown as it comes, then
    Colab's warning about installed packages that the kernel had imported."""
    proc = _subprocess.Popen("pip " + line, shell=True, stdout=_subprocess.PIPE,
                             stderr=_subprocess.STDOUT, text=True)
    output = []
    for text in proc.stdout:
        print(text, end="", flush=True)
        output.append(text)
    proc.wait()
    _colab_pip.print_previous_import_warning("".join(output))


get_ipython().register_magic_function(_colab_pip_magic, "line", "pip")
del _colab_pip_magic
'''


def colabtools_source(spec, workdir):
    """The `google/colab` directory of colabtools: `spec` is a checkout (its
    google/colab/ is used as it is) or a git directory (HEAD's google/colab/ is
    exported under `workdir`)."""
    spec = Path(spec)
    if (spec / "google" / "colab").is_dir():
        path = spec / "google" / "colab"
    else:
        target = workdir / "colabtools"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        archive = subprocess.run(["git", f"--git-dir={spec}", "archive", "HEAD", "google/colab"],
                                 check=True, capture_output=True).stdout
        with tempfile.TemporaryFile() as f:
            f.write(archive)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(target, filter="data")
        path = target / "google" / "colab"
    for needed in ("__init__.py", "_pip.py", "_reprs.py", "output/__init__.py"):
        if not (path / needed).exists():
            raise ValueError(f"--colabtools: {path} has no {needed}: not colabtools' google/colab")
    return path.resolve()


def seed_reference_runs(cache):
    """Copy the repository's reference runs that the package's manifest lists into
    the download cache `cache` (data.cache_dir()), where reference.locate looks
    before it downloads; returns how many runs were seeded."""
    manifest = json.loads((ROOT / "annotated_s4" / "reference_runs.json").read_text())
    seeded = 0
    for name, files in manifest.items():
        source = ROOT / "reference_runs" / name
        if all((source / f).exists() for f in files):
            (cache / "reference_runs" / name).mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(source / f, cache / "reference_runs" / name / f)
            seeded += 1
    return seeded


def seed_benchmark_results(cache):
    """Copy the committed benchmark results that the package's manifest lists
    into the download cache, where runs.locate_result looks before it
    downloads (and checks them against the manifest); returns how many."""
    manifest = json.loads((ROOT / "annotated_s4" / "benchmark_results.json").read_text())
    (cache / "benchmark_results").mkdir(parents=True, exist_ok=True)
    for name in manifest:
        shutil.copy2(ROOT / "benchmarks" / "results" / name, cache / "benchmark_results" / name)
    return len(manifest)


def new_runtime(workdir, image, environ, colab_path):
    """A fresh runtime: the image's venv restored at its path, a fresh HOME with
    the kernel's startup file and the seeded download cache, an empty working
    directory. Returns (env, kernel directory, working directory)."""
    runtime = workdir / "runtime"
    shutil.rmtree(runtime, ignore_errors=True)
    runtime.mkdir(parents=True)
    shutil.copytree(image / "venv", runtime / "venv", symlinks=True)
    home = runtime / "home"
    startup = home / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text(_startup(colab_path))
    seed_reference_runs(home / ".cache" / "annotated_s4")
    seed_benchmark_results(home / ".cache" / "annotated_s4")
    content = runtime / "content"
    content.mkdir()
    kernels = runtime / "kernels" / "colab"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(runtime / "venv" / "bin" / "python"), "-m", "ipykernel_launcher",
                 "-f", "{connection_file}"],
        "display_name": "Colab (emulated)", "language": "python"}))
    return runtime_env(environ, home, runtime / "venv"), kernels.parent, content


def installed(venv):
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True,
                         env={"PIP_CONFIG_FILE": os.devnull, "PATH": os.environ["PATH"]}).stdout
    return {canonical(p["name"]): p["version"] for p in json.loads(out)}


def resolve(image, environ, source, workdir):
    """Resolve the install cell's requirements with pip (a dry run, Python 3.13,
    the package index) for Colab's CPU runtime (the `else` branch) and GPU
    runtime (`jax[cuda12]`), holding Colab's versions of NEVER_PINNED fixed,
    and on the GPU its CUDA libraries too (colab_freeze.gpu.txt).
    Returns {runtime: (ok, {name: version} that pip picks, or pip's error)}."""
    versions = parse_freeze(FREEZE.read_text())
    fixed = {n: versions[n] for n in NEVER_PINNED}
    out = {}
    for runtime, branch in (("CPU", "else"), ("GPU", "if")):
        held = dict(fixed)
        if runtime == "GPU":
            gpu = parse_freeze(FREEZE.with_name("colab_freeze.gpu.txt").read_text())
            # The CUDA libraries stay; JAX's plugin comes with the jax it serves.
            held.update({n: v for n, v in gpu.items() if n.startswith("nvidia-")})
        constraints = workdir / f"held-{runtime}.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(held.items())))
        report_path = workdir / f"resolve-{runtime}.json"
        args = expand(source, branch)
        home = workdir / "resolve-home"
        home.mkdir(exist_ok=True)
        env = runtime_env(environ, home, image / "venv")
        proc = subprocess.run([str(image / "venv" / "bin" / "python"), "-m", "pip", *args,
                               "--dry-run", "--ignore-installed", "--report", str(report_path),
                               "-c", str(constraints)], env=env, capture_output=True, text=True)
        if proc.returncode:
            errors = [l for l in (proc.stdout + proc.stderr).splitlines()
                      if l.startswith(("ERROR", "    ", "The conflict")) and "━" not in l]
            out[runtime] = (False, "\n".join(errors[-12:]))
            continue
        picked = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                  for i in json.loads(report_path.read_text())["install"]}
        out[runtime] = (True, picked)
    return out


# --- Run all ---------------------------------------------------------------------

RESTART = "application/vnd.colab-display-data+json"


def restart_prompts(cells):
    """The packages of each Colab restart prompt (pip_warning) among the cells' outputs."""
    found = []
    for cell in cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {}).get(RESTART)
            if isinstance(data, str):
                data = json.loads(data)
            if data and "pip_warning" in data:
                found.append(data["pip_warning"]["packages"])
    return found


def run_notebook(path, workdir, image, environ, colab_path, url, timeout):
    """Run all of notebook `path` in a fresh runtime. Returns a result dict."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = substitute_repository(nb.cells[0].source, url, ROOT)
    env, kernel_dirs, content = new_runtime(workdir, image, environ, colab_path)
    before = installed(workdir / "runtime" / "venv")
    ksm = KernelSpecManager(kernel_dirs=[str(kernel_dirs)])
    km = KernelManager(kernel_name="colab", kernel_spec_manager=ksm)
    times, current = {}, {"index": None, "start": None}

    def start(cell, cell_index):
        current.update(index=cell_index, start=time.monotonic())

    def done(cell, cell_index, execute_reply):
        times[cell_index] = time.monotonic() - current["start"]

    client = NotebookClient(nb, km=km, timeout=timeout, kernel_name="colab",
                            resources={"metadata": {"path": str(content)}},
                            on_cell_start=start, on_cell_executed=done)
    result = {"notebook": str(path), "error": None}
    t0 = time.monotonic()
    try:
        client.execute(env=env, cwd=str(content))
    except (CellExecutionError, CellTimeoutError) as e:
        lines = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()  # no colours
        result["error"] = {"cell": current["index"], "message": lines[-1] if lines else repr(e),
                           "detail": "\n".join(lines[-25:])}
    except Exception as e:  # the kernel died, could not start, ...
        result["error"] = {"cell": current["index"], "message": f"{type(e).__name__}: {e}",
                           "detail": ""}
    finally:  # nbclient leaves a kernel manager it was given running
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    result["seconds"] = time.monotonic() - t0
    result["install_seconds"] = times.get(0)
    result["cells"] = len(nb.cells)
    install_output = "".join(o.get("text", "") for o in nb.cells[0].get("outputs", []))
    result["pip_ran"] = "Successfully installed" in install_output
    # pip's notice of conflicts among installed packages (Colab's own freeze has
    # some) is reported, not failed; any other ERROR line fails.
    lines = install_output.splitlines()
    notice = [i for i, line in enumerate(lines) if line.startswith("ERROR: pip's dependency")]
    result["conflicts"] = [line for i in notice for line in lines[i + 1:]
                           if " requires " in line or " has requirement " in line
                           or " which is incompatible" in line]
    result["pip_errors"] = [line for i, line in enumerate(lines)
                            if line.startswith("ERROR:") and i not in notice]
    result["restart_prompts"] = restart_prompts(nb.cells)
    after = installed(workdir / "runtime" / "venv")
    result["changed"] = {n: (before.get(n), v) for n, v in sorted(after.items())
                         if before.get(n) != v}
    result["preimported_changed"] = [n for n in PREIMPORTED if n in result["changed"]]
    result["passed"] = (result["error"] is None and result["pip_ran"] and not result["pip_errors"]
                        and not result["restart_prompts"] and not result["preimported_changed"])
    nbformat.write(nb, workdir / f"{Path(path).stem}.executed.ipynb")
    return result


def report(result):
    name = Path(result["notebook"]).name
    status = "passed" if result["passed"] else "FAILED"
    install = result["install_seconds"]
    install = f"{install:.0f} s" if install is not None else "-"
    print(f"{name}: {status} in one Run all, {result['seconds']:.0f} s "
          f"({result['cells']} cells; install cell {install})")
    if result["error"]:
        print(f"  first error, cell {result['error']['cell']}: {result['error']['message']}")
        if result["error"]["detail"]:
            print("    " + result["error"]["detail"].replace("\n", "\n    "))
    if not result["pip_ran"]:
        print("  the install cell did not install anything (no 'Successfully installed')")
    for line in result["pip_errors"]:
        print(f"  pip: {line}")
    for line in result["conflicts"]:
        print(f"  pip notes a conflict it leaves: {line}")
    for packages in result["restart_prompts"]:
        print(f"  Colab would ask to restart the runtime: {', '.join(packages)} were imported")
    if result["preimported_changed"]:
        print(f"  the install cell changed modules the kernel had imported: "
              f"{', '.join(result['preimported_changed'])}")
    changed = ", ".join(f"{n} {a or '-'} -> {b}" for n, (a, b) in result["changed"].items())
    print(f"  installed by the notebook: {changed or 'nothing'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("notebooks", nargs="*", type=Path, help="book/NN_name.ipynb files")
    parser.add_argument("--colabtools", default=os.environ.get("COLABTOOLS"),
                        help="a clone (or bare git directory) of googlecolab/colabtools")
    parser.add_argument("--python", default=os.environ.get("COLAB_PYTHON", PYTHON),
                        help=f"a Python 3.13 interpreter (default {PYTHON})")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "colab_run",
                        help="where the runtime image, runtimes and executed notebooks go; the "
                             "image is kept and reused while the freeze fixture is unchanged")
    parser.add_argument("--freeze", type=Path, default=FREEZE, help="the freeze fixture")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may take")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--resolve", action="store_true",
                        help="first resolve the install cell for Colab's CPU and GPU runtimes "
                             "(a pip dry run holding Colab's numpy, matplotlib, Pillow, pandas, "
                             "mlxtend and, on the GPU, CUDA libraries fixed); alone with no "
                             "notebooks")
    args = parser.parse_args(argv)
    if not args.colabtools:
        parser.error("--colabtools (or $COLABTOOLS): a clone of googlecolab/colabtools, which "
                     "is not on PyPI (git clone https://github.com/googlecolab/colabtools)")
    sys.path.insert(0, str(ROOT / "tools"))
    import notebooks

    url = notebooks.repository_url()
    freeze_text = args.freeze.read_text()
    versions = parse_freeze(freeze_text)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    colab_path = colabtools_source(args.colabtools, args.workdir)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    print(f"Colab runtime of backend-info commit {freeze_commit(freeze_text)} "
          f"({len(versions)} packages); installing annotated-s4 from {ROOT} at {head}"
          + (" (uncommitted changes are not installed)" if dirty else ""), flush=True)
    if not args.notebooks and not args.resolve:
        parser.error("name notebooks to run, or --resolve")
    image = build_image(args.workdir, args.python, args.freeze, os.environ)
    resolved_ok = True
    if args.resolve:
        source = substitute_repository(notebooks.install_cell(url).source, url, ROOT)
        for runtime, (ok, detail) in resolve(image, os.environ, source, args.workdir).items():
            resolved_ok &= ok
            if not ok:
                print(f"{runtime} runtime: the install cell does not resolve with Colab's "
                      f"versions held:\n    " + detail.replace("\n", "\n    "))
                continue
            shown = [n for n in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax",
                                 *NEVER_PINNED) if n in detail]
            print(f"{runtime} runtime: resolves, " + ", ".join(f"{n} {detail[n]}" for n in shown)
                  + f" ({len(detail)} distributions)")
    results = []
    for path in args.notebooks:
        print(f"running {path} ...", flush=True)
        result = run_notebook(path.resolve(), args.workdir, image, os.environ, colab_path, url,
                              args.timeout)
        report(result)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if resolved_ok and all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
