import subprocess
import sys

import numpy as np
import pytest

from tformer import TransformerConfig
from tformer.reference import Encoder


def test_reference_imports_and_runs_without_torch():
    """Block torch at import time; the reference must not need it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "from tformer import TransformerConfig\n"
        "from tformer.reference import Encoder\n"
        "enc = Encoder(TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=5))\n"
        "print(enc(np.zeros((1, 3), dtype=np.int64)).last_hidden_state.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(1, 3, 8)"


def test_load_state_dict_names_missing_extra_and_misshapen_keys(tiny_config):
    enc = Encoder(tiny_config)
    state = enc.state_dict()
    bad = dict(state)
    del bad["layers.0.ffn.up.bias"]
    bad["extra.weight"] = np.zeros(1)
    with pytest.raises(ValueError, match=r"missing keys \['layers.0.ffn.up.bias'\]; unexpected keys \['extra.weight'\]"):
        enc.load_state_dict(bad)
    bad = dict(state, **{"tok_emb.weight": np.zeros((3, 3))})
    with pytest.raises(ValueError, match=r"state_dict\['tok_emb.weight'\]: expected shape \(50, 32\), got \(3, 3\)"):
        enc.load_state_dict(bad)


def test_dtype_is_kept(tiny_config):
    enc = Encoder(tiny_config, np.float64)
    assert all(v.dtype == np.float64 for v in enc.state_dict().values())
    enc.load_state_dict({k: v.astype(np.float32) for k, v in enc.state_dict().items()})
    assert all(v.dtype == np.float64 for v in enc.state_dict().values())
    assert TransformerConfig is not None
