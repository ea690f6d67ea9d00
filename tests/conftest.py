import pytest
import torch

from tformer import TransformerConfig


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="where the `device` fixture's tests run: cpu (the default, CI), cuda, cuda:N "
                          "or mps (`make test-gpu`: cuda)")


def _no_cuda() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return f"no CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__}, {build})"


def pytest_collection_modifyitems(config, items):
    """Tests using the `device` fixture are marked `device` (make test-gpu selects them); tests
    marked `gpu` are skipped, with the reason, where torch sees no CUDA GPU."""
    reason = _no_cuda()
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)
        if reason is not None and item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def device(request) -> torch.device:
    """The device the suite runs its device tests on (--device; cpu unless asked): everything
    device-aware runs on the CPU in CI, and on the GPU with `make test-gpu`."""
    from tformer.nn.devices import resolve_device

    try:
        return resolve_device(request.config.getoption("--device"), "--device")
    except ValueError as e:
        pytest.skip(str(e))


@pytest.fixture
def tiny_config() -> TransformerConfig:
    """The small config every test starts from (replace() what a test varies)."""
    return TransformerConfig(
        d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.1, max_len=64, vocab_size=50
    )


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory):
    """Measured kernel choices (tformer.nn.kernels.autotune) go to a cache of the test session's own, so a
    test run never reads or writes the user's ~/.cache/tformer (subprocesses inherit it)."""
    import os

    os.environ["TFORMER_CACHE_DIR"] = str(tmp_path_factory.mktemp("tformer-cache"))
    yield


@pytest.fixture(scope="module", autouse=True)
def _restore_threads():
    """`--threads N` (and tformer.train) set the thread count for the whole process: give it
    back after each test module."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _inference_auto_is_fp32():
    """The suite's inference expectations are fp32's (tolerances of 1e-5): `--dtype auto`, the
    default, would run bf16 on a CPU with bf16 instructions. Session-wide, so that module and
    session fixtures (a server started once per module) resolve auto under it too. Tests of auto
    itself (and of bf16, asked for by name) set what they need with their own monkeypatch."""
    import tformer.nn.precision

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tformer.nn.precision, "has_bf16", lambda: False)
        yield


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module of small-tensor tests (as fast, and polite to the machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
