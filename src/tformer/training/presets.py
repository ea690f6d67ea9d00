"""The defaults a run starts from, under a config file and the command line: per synthetic
task (PRESETS) and for a fine-tune (FINETUNE_PRESET); each kind of data run declares its own in
its module (tformer.kinds: ``Kind.preset``), sized by the reasoning below. Flat option names,
as on the command line (--d-model: "d_model").
"""

from __future__ import annotations

from typing import Any

# The options that size the model: given any of them, the size is the user's, not chosen.
SIZE_OPTIONS = {"d_model", "n_heads", "d_ff", "n_layers", "n_decoder_layers"}

# Per-task defaults, applied over TrainConfig's and under a config file and the command
# line. Tuned with short runs on 2 busy CPU cores to reach the targets: the
# algorithmic classification tasks learn better without dropout and with pre-norm (which
# also tolerates their longer training), and brackets with mean pooling, since a
# mismatch anywhere in the string must reach the head. `add` stops after 14 minutes
# whatever the machine, to stay inside its 15-minute budget.
PRESETS: dict[str, dict[str, Any]] = {
    "copy": {"steps": 1500, "early_stop": 1.0},
    "reverse": {"steps": 1500, "early_stop": 1.0},
    "sort": {"steps": 3000, "early_stop": 1.0},
    # 6k steps: 0.965 test exact match in 5.7 min; 10k: 0.985 in 9.3 min (2 quiet cores).
    "add": {"steps": 10000, "batch_size": 128, "d_model": 128, "d_ff": 512, "eval_every": 500,
            "max_minutes": 14.0},
    "listops": {"steps": 4000, "n_layers": 4, "dropout": 0.0, "norm_first": True,
                "eval_every": 500},
    # 10k steps gave 0.948 test accuracy, 20k 0.988 (validation still rising at 10k).
    "brackets": {"steps": 20000, "n_layers": 4, "dropout": 0.0, "norm_first": True,
                 "pooling": "mean", "eval_every": 1000},
}

# Batches (measured on real text, 5-minute runs, 2 cores; benchmarks/train_own_data.py):
# under a short budget the number of updates decides. English -> German: 2,048-token batches
# (~80 pairs) reached test BLEU 8.9, 1,024 (~40 pairs) 16.3. Package classification: batches of
# 4,096 tokens (~300 texts) 0.786 accuracy, of 32 texts 0.801. Fine-tuning: 32 texts (the
# BERT recipe). So batches are counted in examples (--batch-size; --max-tokens none makes the
# token budget that many examples of the data's mean length); embeddings keep 4,096 tokens,
# as in-batch negatives want large batches.
# The kinds' defaults for your own data (tformer.kinds), sized for a 2-core CPU and ~10 minutes. The
# budget is compute: 2 AVX2 cores do very roughly 50-100 GFLOP/s, 30-60 TFLOP in 10 minutes.
# A d_model-256, 3+3-layer model with an 8k vocabulary costs ~45 MFLOP per token trained
# (forward + backward), so about 200 updates of 4k tokens: far too few to learn to
# translate. d_model 128, 3+3 layers, a 4k vocabulary and 2k-token batches cost ~8 MFLOP
# per token: ~1,500 updates, several passes over a 30k-sentence corpus. Steps are an upper
# bound; --max-minutes is the budget a user normally sets. Pre-norm for the encoder-decoder:
# it trains stably at a high learning rate without a long warmup (Xiong et al. 2020).
# The encoders are BERT-shaped (post-norm, GELU; see sources.FileSource.encoder_config) so they
# export; --norm-first and --activation are honoured (a pre-norm encoder's `export --hf` is refused).
TIMED_STEPS = 10**9  # --steps of a timed data run given none: the budget ends it

# Fine-tuning a pretrained encoder: the BERT recipe (Devlin et al. 2019, §A.3): a small
# learning rate, 10% warmup then linear decay to 0, no label smoothing, batches of 32 examples
# (not of 4096 tokens: on short texts those are ~300 examples, and a timed fine-tune then got
# a tenth of the updates; benchmarks/train_own_data.py).
FINETUNE_PRESET: dict[str, Any] = {"lr": None, "schedule": "linear", "warmup": 100, "steps": 1000,
                                   "label_smoothing": 0.0, "max_tokens": None, "batch_size": 32,
                                   "eval_every": 100}
