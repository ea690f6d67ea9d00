"""tformer.nn.devices: --device resolved in one place (auto: CUDA when torch sees it, the local
rank's GPU under torchrun), a missing device refused in one line, batches moved whole, and the
16-bit type of each device. CUDA's presence is simulated (monkeypatched) where the machine has
none; the real thing runs under `make test-gpu`."""

import pytest
import torch

from tformer.nn import devices
from tformer.text.batches import EncoderBatch, PairBatch, Seq2SeqBatch
from tformer.training.config import TrainConfig
from tformer.training.distributed import backend_for


@pytest.fixture
def two_gpus(monkeypatch):
    """torch answering as on a machine with two CUDA GPUs (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_auto_is_the_cpu_without_cuda_and_the_first_gpu_with_it(no_gpu, monkeypatch):
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert devices.resolve_device("auto") == torch.device("cuda", 0)
    assert devices.resolve_device("cuda") == torch.device("cuda", 0)
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_under_torchrun_each_rank_takes_its_local_gpu(two_gpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # two nodes of two GPUs: local ranks 0, 1
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert devices.resolve_device("auto") == torch.device("cuda", 1)
    assert devices.resolve_device("cuda") == torch.device("cuda", 1)
    assert devices.resolve_device("cuda:0") == torch.device("cuda", 0)  # named: as given
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match=r"^device: expected cuda:0\.\.cuda:1 \(2 GPU\(s\) here\), got 'auto' \(LOCAL_RANK 2\)$"):
        devices.resolve_device("auto")


@pytest.mark.parametrize("spec, message", [
    ("cuda", r"^--device: expected a device this machine has \(cpu\), got 'cuda': torch \S+ \(.+\) sees no CUDA GPU$"),
    ("cuda:1", r"got 'cuda:1': torch \S+ \(.+\) sees no CUDA GPU$"),
    ("mps", r"^--device: expected a device this machine has \(cpu\), got 'mps': torch sees no Apple GPU here$"),
    ("gpu", r"^--device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu'$"),
    ("cuda:x", r"got 'cuda:x'$"),
])
def test_a_device_this_machine_lacks_is_one_line(no_gpu, spec, message):
    with pytest.raises(ValueError, match=message) as e:
        devices.resolve_device(spec, "--device")
    assert "\n" not in str(e.value)


def test_a_gpu_past_the_count_is_refused(two_gpus):
    with pytest.raises(ValueError, match=r"^device: expected cuda:0\.\.cuda:1 \(2 GPU\(s\) here\), got 'cuda:2'$"):
        devices.resolve_device("cuda:2")


def test_train_config_checks_the_spelling_without_torch_or_a_gpu():
    assert TrainConfig(device="cuda:3").device == "cuda:3"  # available or not: checked when training
    with pytest.raises(ValueError, match=r"^device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu'$"):
        TrainConfig(device="gpu")


def test_a_batch_moves_whole_and_one_already_there_is_not_copied():
    a = EncoderBatch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool),
                     torch.zeros(2, dtype=torch.long), None)
    pair = PairBatch(a, a, None)
    moved = pair.to(torch.device("meta"))
    assert moved.anchor.input_ids.device.type == "meta" and moved.positive.labels.device.type == "meta"
    assert moved.anchor.token_type_ids is None and moved.negative is None
    same = pair.to(torch.device("cpu"))
    assert same.anchor.input_ids is a.input_ids  # no copy
    s2s = Seq2SeqBatch(*(torch.ones(1, 2, dtype=torch.long) for _ in range(5))).to(torch.device("meta"))
    assert {t.device.type for t in (s2s.src, s2s.src_mask, s2s.tgt_in, s2s.tgt_mask, s2s.labels)} == {"meta"}


def test_the_sixteen_bit_type_is_bf16_but_on_a_gpu_without_it(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert devices.half_dtype(cpu) == torch.bfloat16 and not devices.needs_grad_scaler(cpu, True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert devices.half_name(gpu) == "bf16" and not devices.needs_grad_scaler(gpu, True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a T4, a V100
    assert devices.half_dtype(gpu) == torch.float16 and devices.half_name(gpu) == "fp16"
    assert devices.needs_grad_scaler(gpu, True) and not devices.needs_grad_scaler(gpu, False)


def test_nccl_between_gpus_gloo_on_cpu():
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    assert backend_for(torch.device("cpu")) == "gloo"


def test_a_model_s_device_is_its_first_parameter_s():
    assert devices.model_device(torch.nn.Linear(2, 2).to("meta")).type == "meta"
    assert devices.model_device(torch.nn.ReLU()) == torch.device("cpu")  # nothing to place


def test_the_device_fixture_is_the_suite_s(device, request):
    """CI runs the device tests on the CPU; `make test-gpu` on CUDA (pytest --device cuda)."""
    assert device == devices.resolve_device(request.config.getoption("--device"))


def test_the_torch_requirement_is_a_range_and_make_installs_the_cpu_wheel_first():
    """pip keeps a user's torch (a CUDA build too) when it is in the range; `make` installs the
    CPU wheel CI tests before the package, so nothing pulls a CUDA build there."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_req,) = [d for d in deps if re.match(r"torch\b", d)]
    assert torch_req == "torch>=2.4" and "==" not in torch_req
    makefile = (root / "Makefile").read_text()
    assert makefile.index("pip install --quiet torch==2.13.0") < makefile.index("pip install --quiet -e")


def test_the_models_compute_the_cpu_s_numbers_on_the_device(device, tiny_config):
    """The suite's device (the GPU under `make test-gpu`) against the CPU, same weights, fp32,
    eval mode: an encoder on a padded batch within 1e-4; greedy and beam search the same ids."""
    from tformer.nn.generate import generate
    from tformer.nn.model import Encoder, Seq2SeqTransformer

    torch.manual_seed(0)
    encoder = Encoder(tiny_config).eval()
    ids = torch.randint(1, tiny_config.vocab_size, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, 7:] = False
    with torch.no_grad():
        cpu = encoder(ids, mask).last_hidden_state
        here = encoder.to(device)(ids.to(device), mask.to(device)).last_hidden_state.cpu()
    assert (cpu - here)[mask].abs().max() <= 1e-4
    model = Seq2SeqTransformer(tiny_config).eval()
    src = torch.randint(3, tiny_config.vocab_size, (2, 6))
    for beam in (1, 3):
        options = dict(beam_size=beam, max_len=8, bos_id=1, eos_id=2, pad_id=0)
        on_cpu = generate(model.cpu(), src, **options).sequences
        here = generate(model.to(device), src.to(device), **options).sequences.cpu()
        assert torch.equal(here, on_cpu), beam


def test_the_server_embeds_on_the_device_as_the_cpu_does(device):
    from hf_bert_fixtures import st_dir

    from tformer.embeddings.sentence import SentenceEncoder
    from tformer.kinds import load_served

    served = load_served(st_dir(), device, "fp32", None)
    assert devices.model_device(served.encoder.model) == device
    texts = ["a dog runs", "the cat sat on the mat"]
    got = served.run_batch([item.payload for item in served.admit(texts, True)], True)
    expected = SentenceEncoder.from_pretrained(st_dir(), dtype="fp32", device="cpu").encode(texts)
    assert max(abs(g - e).max() for g, e in zip(got, expected, strict=True)) <= 1e-5
