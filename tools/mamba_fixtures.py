"""Write the fixtures tests/test_selective.py and tests/test_mamba.py compare
against: the outputs of the official Mamba reference code on small random inputs.

    python tools/mamba_fixtures.py /path/to/state-spaces/mamba [--out tests/fixtures]

Needs PyTorch, einops and NumPy (not the book's environment: run it with a
Python that has torch), and a checkout of github.com/state-spaces/mamba at the
commit pinned below. It runs, on the CPU, three pure-PyTorch reference functions:

* ``selective_scan_ref`` (mamba_ssm/ops/selective_scan_interface.py), float32;
* ``selective_state_update_ref`` (mamba_ssm/ops/triton/selective_state_update.py), float32;
* ``ssd_minimal_discrete`` (mamba_ssm/modules/ssd_minimal.py), float64;

and the official block, the ``Mamba`` module of mamba_ssm/modules/mamba_simple.py,
in float32 with ``use_fast_path=False``: its forward pass (the selective scan
routed to ``selective_scan_ref``) and its ``step`` (the pure-PyTorch branch: no
causal_conv1d, no Triton state update), with its weights. It saves inputs and
outputs, in the reference's own layout, as compressed
.npz files (no pickles). The modules holding these functions import CUDA
extensions and Triton at the top; the script puts inert stand-ins for those
into ``sys.modules`` first and never calls them, so only the reference
functions' own PyTorch code runs. Nothing of the official code is copied
here; the tests never run this script, they only read what it wrote.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

PINNED = "e9594ce1c732d97440f0332fdc43170a2294dbfa"   # state-spaces/mamba, 2026-07-23
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


class _Inert:
    """Anything a module body may ask of Triton (decorators, tl.constexpr, ...)."""

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __getattr__(self, name):
        return _Inert()


def _unavailable(*args, **kwargs):
    raise RuntimeError("a fused CUDA/Triton kernel was called; the fixtures use only "
                       "the pure-PyTorch reference functions")


def _module(name, path=None, **attrs):
    module = types.ModuleType(name)
    if path is not None:             # a package: its submodules load from the checkout,
        module.__path__ = [str(path)]  # but its __init__ (which imports everything) does not run
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def load_references(checkout):
    """The three reference functions, imported from the checkout with stand-ins."""
    root = Path(checkout) / "mamba_ssm"
    triton = _module("triton", jit=_Inert(), heuristics=_Inert(), autotune=_Inert(),
                     Config=_Inert(), next_power_of_2=_Inert(), cdiv=_Inert())
    triton.language = _module("triton.language")
    triton.language.__getattr__ = lambda name: _Inert()
    for package in ("", "ops", "ops/triton", "modules", "utils"):
        _module(".".join(["mamba_ssm", *filter(None, package.split("/"))]), root / package)
    _module("mamba_ssm.ops.triton.layer_norm", _layer_norm_fwd=_unavailable)
    _module("mamba_ssm.ops.triton.softplus", softplus=_unavailable)
    _module("mamba_ssm.ops.triton.ssd_combined", mamba_chunk_scan_combined=_unavailable)
    scan = importlib.import_module("mamba_ssm.ops.selective_scan_interface")
    update = importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    ssd = importlib.import_module("mamba_ssm.modules.ssd_minimal")
    for module in (scan, update, ssd):
        if not module.__file__.startswith(str(root)):
            raise RuntimeError(f"{module.__name__} came from {module.__file__}, not the checkout")
    return scan.selective_scan_ref, update.selective_state_update_ref, ssd.ssd_minimal_discrete


def load_block(checkout, selective_scan_ref):
    """The official ``Mamba`` module, every fused kernel it could reach replaced:
    its scan by `selective_scan_ref`; the conv and state-update kernels by None,
    which sends ``forward`` and ``step`` down their pure-PyTorch branches. Call
    after `load_references` (which puts the stand-ins in place)."""
    simple = importlib.import_module("mamba_ssm.modules.mamba_simple")
    if not simple.__file__.startswith(str(Path(checkout) / "mamba_ssm")):
        raise RuntimeError(f"mamba_simple came from {simple.__file__}, not the checkout")
    simple.selective_scan_fn = selective_scan_ref
    simple.causal_conv1d_fn = simple.causal_conv1d_update = None
    simple.selective_state_update = None
    return simple.Mamba


def check_commit(checkout):
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    if head != PINNED:
        sys.exit(f"{checkout} is at {head}; the fixtures are pinned to {PINNED} "
                 f"(git -C {checkout} checkout {PINNED})")


def _numpy(record):
    return {k: v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)
            for k, v in record.items() if v is not None}


# (name, B's shape, C's shape, D, z, delta_bias, delta_softplus, return_last_state);
# shapes in the reference's layout: "fixed" (D, N), "shared" (batch, N, L),
# "grouped" (batch, G, N, L).
SCAN_CASES = [
    ("plain", "shared", "shared", False, False, False, False, False),
    ("full", "shared", "shared", True, True, True, True, True),
    ("grouped", "grouped", "grouped", True, True, True, True, True),
    ("fixed", "fixed", "fixed", True, False, False, False, True),
    ("mixed", "fixed", "grouped", False, True, True, True, True),
]


def scan_fixtures(selective_scan_ref, torch, batch=2, D=8, N=4, L=48, G=2):
    shapes = {"fixed": (D, N), "shared": (batch, N, L), "grouped": (batch, G, N, L)}
    out = {}
    for name, b_kind, c_kind, has_D, has_z, has_bias, softplus, last in SCAN_CASES:
        r = {"u": torch.randn(batch, D, L),
             # without the softplus the steps must be positive themselves
             "delta": (torch.randn(batch, D, L) if softplus
                       else 0.05 + 0.2 * torch.rand(batch, D, L)),
             "A": -torch.exp(0.5 * torch.randn(D, N)),          # Mamba's A = -exp(A_log)
             "B": torch.randn(*shapes[b_kind]), "C": torch.randn(*shapes[c_kind]),
             "D": torch.randn(D) if has_D else None,
             "z": torch.randn(batch, D, L) if has_z else None,
             "delta_bias": torch.randn(D) - 2.0 if has_bias else None}
        result = selective_scan_ref(**r, delta_softplus=softplus, return_last_state=last)
        r["out"], r["last_state"] = result if last else (result, None)
        r["delta_softplus"], r["return_last_state"] = softplus, last
        out.update({f"{name}__{k}": v for k, v in _numpy(r).items()})
    return out


def update_fixtures(selective_state_update_ref, torch, batch=2, H=4, P=3, N=4, G=2):
    """One step in the flat form (batch, D, N) and in Mamba-2's heads form."""
    out = {}
    for name, lead, groups in (("flat", (H * P,), ()), ("heads", (H, P), (G,))):
        r = {"state": torch.randn(batch, *lead, N), "x": torch.randn(batch, *lead),
             "dt": torch.randn(batch, *lead), "A": -torch.exp(0.5 * torch.randn(*lead, N)),
             "B": torch.randn(batch, *groups, N), "C": torch.randn(batch, *groups, N),
             "D": torch.randn(*lead), "z": torch.randn(batch, *lead),
             "dt_bias": torch.randn(*lead) - 2.0}
        state = r["state"].clone()          # the reference updates the state in place
        r["out"] = selective_state_update_ref(state, **{k: v for k, v in r.items() if k != "state"},
                                              dt_softplus=True)
        r["new_state"] = state
        out.update({f"{name}__{k}": v for k, v in _numpy(r).items()})
    return out


def ssd_fixtures(ssd_minimal_discrete, torch, batch=2, L=48, H=2, P=4, N=4, block_len=16):
    """float64, as the quadratic and the recurrent forms are compared to 1e-10."""
    F = torch.nn.functional
    out = {}
    for name, initial in (("zero_start", False), ("initial_state", True)):
        x = torch.randn(batch, L, H, P, dtype=torch.float64)
        dt = F.softplus(torch.randn(batch, L, H, dtype=torch.float64) - 2.0)
        A = -torch.exp(torch.rand(H, dtype=torch.float64))
        r = {"X": x * dt[..., None], "A": A * dt,
             "B": torch.randn(batch, L, H, N, dtype=torch.float64),
             "C": torch.randn(batch, L, H, N, dtype=torch.float64),
             "initial_states": (torch.randn(batch, 1, H, P, N, dtype=torch.float64)
                                if initial else None)}
        r["Y"], r["final_state"] = ssd_minimal_discrete(**r, block_len=block_len)
        r["block_len"] = block_len
        out.update({f"{name}__{k}": v for k, v in _numpy(r).items()})
    return out


# The block's sizes: d_model H = 8, d_state N = 4, expand 2 (E = 16), d_conv W = 4,
# dt_rank "auto" = ceil(8 / 16) = 1; a batch of 2 sequences of L = 12 steps.
BLOCK = {"d_model": 8, "d_state": 4, "d_conv": 4, "expand": 2}


def block_fixtures(Mamba, torch, batch=2, L=12):
    """The official block's weights, an input u (batch, L, d_model), its forward
    output, its step() outputs token by token from zero states (batch, L,
    d_model), and the states that leaves: conv_state (batch, E, W), ssm_state
    (batch, E, N). A_log and D are moved off their initial values (the same
    numbers in every channel) so that a channel mixed up shows."""
    block = Mamba(**BLOCK, use_fast_path=False, layer_idx=0)
    with torch.no_grad():
        block.A_log.add_(0.3 * torch.randn_like(block.A_log))
        block.D.add_(0.5 * torch.randn_like(block.D))
        r = {"u": torch.randn(batch, L, BLOCK["d_model"])}
        r["out"] = block(r["u"])
        conv_state, ssm_state = block.allocate_inference_cache(batch, L)
        r["step_out"] = torch.cat([block.step(r["u"][:, t:t + 1], conv_state, ssm_state)[0]
                                   for t in range(L)], dim=1)   # the states update in place
    r["conv_state"], r["ssm_state"] = conv_state, ssm_state
    r.update({f"weight__{name}": p.detach() for name, p in block.named_parameters()})
    r.update({k: np.int64(v) for k, v in BLOCK.items()})
    r["dt_rank"] = np.int64(block.dt_rank)
    return _numpy(r)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a git checkout of state-spaces/mamba")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    check_commit(args.checkout)
    import torch

    scan_ref, update_ref, ssd_ref = load_references(args.checkout)
    torch.manual_seed(0)
    meta = {"commit": np.array(PINNED), "torch": np.array(torch.__version__)}
    args.out.mkdir(parents=True, exist_ok=True)
    for filename, arrays in (("mamba_selective_scan.npz", scan_fixtures(scan_ref, torch)),
                             ("mamba_state_update.npz", update_fixtures(update_ref, torch)),
                             ("mamba_ssd.npz", ssd_fixtures(ssd_ref, torch))):
        path = args.out / filename
        np.savez_compressed(path, **meta, **arrays)
        print(f"{path}: {len(arrays)} arrays, {path.stat().st_size / 1024:.1f} KiB")
    torch.manual_seed(1)   # its own seed: the block's fixture does not move the others
    path = args.out / "mamba_block.npz"
    arrays = block_fixtures(load_block(args.checkout, scan_ref), torch)
    np.savez_compressed(path, **meta, **arrays)
    print(f"{path}: {len(arrays)} arrays, {path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
