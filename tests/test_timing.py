"""Tests for annotated_s4.timing: the shared timing helpers."""

import numpy as np
import pytest
from flax import nnx

from annotated_s4 import CausalSelfAttention, H3Layer
from annotated_s4.timing import crossover, layer_scaling, time_fn, training_peak_bytes


def _rows(values, key="forward_s"):
    return [{"layer": name, "L": L, key: v}
            for L, pair in values.items() for name, v in zip(("H3", "attention"), pair)]


def test_crossover_is_first_length_from_which_h3_stays_faster():
    # H3 faster at 256 by noise, slower at 512, faster from 1024 on
    rows = _rows({256: (1.0, 2.0), 512: (3.0, 2.0), 1024: (1.0, 4.0), 2048: (2.0, 9.0)})
    assert crossover(rows, "forward_s") == 1024
    assert crossover(_rows({256: (1.0, 2.0), 512: (3.0, 2.0)}), "forward_s") is None
    assert crossover(_rows({256: (1.0, 2.0)}, "b"), "b") == 256


def test_layer_scaling_rows():
    layers = {"H3": H3Layer(8, rngs=nnx.Rngs(0), head_dim=4, state_size=4),
              "attention": CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, max_len=32)}
    rows = layer_scaling(layers, [16, 32], 8, repeats=1, backward=True, memory=True)
    assert [(r["layer"], r["L"]) for r in rows] == [
        ("H3", 16), ("attention", 16), ("H3", 32), ("attention", 32)]
    for r in rows:
        assert r["forward_s"] > 0 and r["forward_backward_s"] > 0
        assert r["forward_peak_bytes"] is None or r["forward_peak_bytes"] > 0
    rows = layer_scaling(layers, [16], 8, repeats=1, backward=False, memory=False)
    assert set(rows[0]) == {"layer", "L", "forward_s"}


def test_training_peak_bytes_grows_with_length():
    """The training step's peak memory, as layer_scaling reports it; attention's
    stored L x L scores make it grow faster than linearly in L."""
    layer = CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, max_len=512)
    peaks = [training_peak_bytes(layer, np.zeros((1, L, 8), np.float32)) for L in (128, 512)]
    if None in peaks:
        pytest.skip("this backend does not report memory")
    assert peaks[1] > 4 * peaks[0]
    row = layer_scaling({"a": layer}, [128], 8, repeats=1)[0]
    assert row["forward_backward_peak_bytes"] == peaks[0]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: 0, repeats=0)
    with pytest.raises(ValueError, match="lengths"):
        layer_scaling({"x": None}, [0], 8)
    with pytest.raises(ValueError, match="at least one layer"):
        layer_scaling({}, [16], 8)


def test_s4_timing_helpers():
    """The measuring code shared by benchmarks/bench_s4.py and chapter 5 (no timing asserts)."""
    from annotated_s4.timing import kernel_fns, kernel_scaling, linearity, loglog_slope

    Ls = [256, 1024, 4096]
    assert abs(loglog_slope(Ls, [1e-6 * L for L in Ls]) - 1.0) < 1e-9
    assert abs(loglog_slope(Ls + [8192], [1e-9 * L**2 for L in Ls] + [None]) - 2.0) < 1e-9
    assert linearity(1.1).startswith("close to linear")
    assert linearity(0.3).startswith("sublinear") and linearity(2.0).startswith("superlinear")
    with pytest.raises(ValueError, match="two lengths"):
        loglog_slope([256], [1.0])
    with pytest.raises(ValueError, match="kernels must be among"):
        kernel_scaling([64], kernels=("fft",))
    fns = kernel_fns(8, 64)  # the naive and generating-function kernels of one SSM agree
    np.testing.assert_allclose(fns["generating_function"](), fns["naive"](), atol=1e-4)
    t = kernel_scaling([32, 64], N=8, H=2, max_L={"generating_function": 32}, repeats=1)
    assert t["generating_function"][1] is None and all(s > 0 for s in t["dplr"])


def test_time_fn():
    assert time_fn(lambda: sum(range(1000)), repeats=3) > 0
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: 0, repeats=0)


def test_convolution_timings_rows():
    from annotated_s4.timing import convolution_timings

    rows = convolution_timings([32, 64], N=4, repeats=1)
    assert [r["L"] for r in rows] == [32, 64]
    assert all(r[k] > 0 for r in rows for k in ("fft_s", "direct_s", "scan_s"))
    # the work: the direct sum's is quadratic in L, the scan's L steps of one count
    assert rows[1]["direct_flops"] > 3 * rows[0]["direct_flops"]
    assert rows[1]["scan_flops"] == 2 * rows[0]["scan_flops"] > 0
    assert 0 < rows[0]["fft_flops"] < rows[1]["fft_flops"]


def test_op_count_counts_the_traced_program():
    import jax.numpy as jnp

    from annotated_s4.timing import op_count

    a = jnp.ones((8, 16))
    b = jnp.ones((16, 4))
    # a matrix product of (8, 16) by (16, 4): 8 * 4 outputs of 16 multiply-adds
    assert op_count(lambda a, b: a @ b, a, b)["flops"] == 2 * 8 * 16 * 4
    counts = op_count(jnp.exp, jnp.ones(1000))
    assert counts["transcendentals"] == 1000
    # a matrix product with no exponential has none
    assert op_count(lambda a, b: a @ b, a, b)["transcendentals"] == 0
    # the same program, counted twice, gives the same numbers
    assert op_count(jnp.exp, jnp.ones(1000)) == counts


def test_op_count_needs_no_count_from_the_default_backend(monkeypatch):
    """On a GPU the default device's backend is a PJRT plugin, whose lowered
    programs carry no cost analysis (`Lowered.cost_analysis()` is None
    there). Simulated here: every lowering that is not placed on the CPU
    device (by `jax.default_device`) reports nothing, as on a GPU machine.
    op_count still counts, and gives the numbers it gives on the CPU."""
    import jax
    import jax._src.xla_bridge as xla_bridge
    import jax.numpy as jnp

    from annotated_s4.timing import convolution_timings, op_count

    def matmul(a, b):
        return jnp.exp(a @ b)

    a, b = jnp.ones((8, 16)), jnp.ones((16, 4))
    on_the_cpu = op_count(matmul, a, b)
    rows = convolution_timings([32], N=4, repeats=1)

    def plugin(backend=None):   # True: "this backend is a PJRT plugin", as CUDA's is
        device = jax.config.jax_default_device
        return getattr(device, "platform", device) != "cpu"

    monkeypatch.setattr(xla_bridge, "using_pjrt_c_api", plugin)
    assert jax.jit(matmul).lower(a, b).cost_analysis() is None   # the GPU's answer
    assert op_count(matmul, a, b) == on_the_cpu == {"flops": 2 * 8 * 16 * 4,
                                                    "transcendentals": 8 * 4}
    again = convolution_timings([32], N=4, repeats=1)
    assert [{k: v for k, v in r.items() if k.endswith("_flops")} for r in again] == [
        {k: v for k, v in r.items() if k.endswith("_flops")} for r in rows]


def test_op_count_takes_shapes_and_arrays_on_any_device():
    """Only shapes and dtypes enter: an array committed to a device, a
    jax.ShapeDtypeStruct and a Python scalar (weakly typed) all count as the
    arrays they describe."""
    import jax
    import jax.numpy as jnp

    from annotated_s4.timing import op_count

    a = jnp.ones((8, 16))
    placed = jax.device_put(a, jax.devices()[0])
    shape = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    counts = op_count(lambda a, s: jnp.sin(a * s), a, 2.0)
    assert counts == {"flops": 8 * 16, "transcendentals": 8 * 16}
    assert op_count(lambda a, s: jnp.sin(a * s), placed, 2.0) == counts
    assert op_count(lambda a, s: jnp.sin(a * s), shape, 2.0) == counts


def test_device_info_names_the_device_and_versions():
    """What the benchmarks record beside their timings."""
    import jax

    from annotated_s4.timing import device_info

    info = device_info()
    assert info["platform"] == jax.default_backend()
    assert info["device_kind"] == jax.devices()[0].device_kind
    assert info["jax"] == jax.__version__ and info["jaxlib"]
    assert info["cpu_cores"] >= 1 and "cpu" in info


def test_result_stem_keeps_devices_and_quick_runs_apart():
    from annotated_s4.timing import result_stem

    assert result_stem("h3", platform_name="cpu") == "h3"
    assert result_stem("h3", quick=True, platform_name="cpu") == "h3_quick"
    assert result_stem("h3", platform_name="gpu") == "h3_gpu"
    assert result_stem("s4", quick=True, platform_name="gpu") == "s4_quick_gpu"


def test_op_count_is_the_same_under_emulated_tf32():
    """TF32 rounds inside a GPU's multipliers and adds no operation to the
    program; the emulation adds rounding operations, which op_count keeps out."""
    import jax.numpy as jnp

    from annotated_s4.precision import emulate_tf32
    from annotated_s4.timing import op_count

    a, b = jnp.ones((8, 16)), jnp.ones((16, 4))
    plain = op_count(lambda a, b: jnp.exp(a @ b), a, b)
    with emulate_tf32():
        assert op_count(lambda a, b: jnp.exp(a @ b), a, b) == plain


def test_ssd_timings_time_every_algorithm_and_skip_the_long_dual_form():
    from annotated_s4.ssd import SSD_ALGORITHMS
    from annotated_s4.timing import ssd_inputs, ssd_timings

    X, a, B, C = ssd_inputs(32, batch=2, H=3, P=4, N=5)
    assert X.shape == (2, 32, 3, 4) and a.shape == (2, 32, 3) and B.shape == C.shape == (2, 32, 3, 5)
    assert float(a.max()) < 0
    logged = []
    rows = ssd_timings((16, 32), chunk=8, quadratic_max_L=16, repeats=1, log=logged.append,
                       H=2, P=4, N=4)
    assert rows == logged and [r["L"] for r in rows] == [16, 32]
    assert set(rows[0]) == {"L", *SSD_ALGORITHMS}
    assert all(v > 0 for v in rows[0].values()) and rows[1]["quadratic"] is None
