"""Masked-LM pre-training: BERT's own objective on your unlabeled text, from scratch, or continuing
a BERT-format model on your domain's text (domain adaptation) before fine-tuning it.

    {"text": "..."} alone, or a .txt file of one text per line     tformer predict RUN "the <mask> sat"

The model is an encoder and BERT's masked-LM head (tformer.nn.heads.MaskedLM); 15% of each text's
tokens are predicted, BERT's 80/10/10 masking (tformer.training.masking), with cross-entropy at
those positions alone. Scored by the perplexity of the masked tokens (lower is better), their
loss and accuracy, against a unigram model of the training tokens on the same positions. A
finished run is also a transformers BertForMaskedLM directory (its top: config.json,
model.safetensors, the tokenizer): `pipeline("fill-mask", model=RUN)` loads it and any encoder
kind fine-tunes from it (--from-pretrained RUN). Its one forward gives the top candidates and
the true token's log-probability at each predicted position: `tformer predict`, ``Run.predict``
(fill-mask's answer), evaluation and the server (Hugging Face's fill-mask task) all run it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.numpy import load_file, save
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.errors import BadInput, FieldError
from tformer.export import hf_masked_lm
from tformer.export.model_card import Card
from tformer.formats import hf_bert, hf_bert_mlm
from tformer.kinds.base import Kind
from tformer.kinds.run import Run, check_batch_size, texts_of
from tformer.kinds.serving import InputRefused, Item, too_long
from tformer.nn.heads import MaskedLM
from tformer.nn.model import from_pretrained
from tformer.storage.files import write_atomic
from tformer.text.batches import encoder_arrays, pad_arrays
from tformer.training.losses import at_least_fp32
from tformer.training.masking import (
    IGNORE,
    UNKNOWN,
    Filled,
    MaskedBatch,
    MaskedExample,
    MaskedStream,
    MaskedTally,
    Masker,
    TokenCounts,
    fill_answer,
    target_ids,
    text_rng,
)
from tformer.training.objective import EVAL_SAMPLE, Objective, evaluating, validation_sample
from tformer.training.records import Fields
from tformer.training.stream import remembered

MASK_TOKENS = ("<mask>", "[MASK]")  # the mask token of a tokenizer tformer trains; BERT's
FIELDS = Fields("masked_lm", ("text",), (), ("text",), specials=(MASK_TOKENS[0],))
# From scratch: classification's encoder, batches of 64 texts (an update predicts ~15% of their
# tokens, fewer targets than a classifier's labels give it: larger batches than its 32).
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "activation": "gelu", "vocab_size": 4000,
          "lr": 5e-4, "warmup": 200, "schedule": "linear", "steps": 10000, "max_tokens": None,
          "batch_size": 64, "eval_every": 250, "patience": 8, "max_length": 64, "label_smoothing": 0.0}
TOP_K = 5  # candidates per mask, as fill-mask gives them
QUERY = "\0fill"  # marks a user's text to fill (its own masks), never a field of a data file
COUNT_RECORDS = 50_000  # training texts (the first the run reads) whose tokens the unigram baseline counts
UNIGRAM_FILE = "unigram.safetensors"  # a finished run's token counts: its baseline without the data
UNIGRAM = "a unigram model of the training tokens (add-one smoothed)"


class MaskedLanguageModel(Objective):
    kind, fields, preset = FIELDS.objective, FIELDS, PRESET
    refuses = {"norm_first": "a masked-LM run is a BERT-format directory, and BERT is post-norm",
               "early_stop": "it stops at a score at least as high, and perplexity is better lower"}
    model_kind = "masked_lm"
    main_metric = "perplexity"
    best_by = "loss"  # the mean loss of the masked tokens: the log of their perplexity
    inputs = ("text",)

    def __init__(self, source, pretrained=None) -> None:
        super().__init__(source, pretrained)
        # The unigram baseline's counts: of the training texts as the stream reads (and tokenizes)
        # them, its first epoch's; a finished run's own, saved (saved_config).
        self.counts = TokenCounts(self.tokenizer.vocab_size, COUNT_RECORDS)
        self.stream = None  # the training stream, whose epoch says whether its texts still count
        self.mask_id  # noqa: B018 (a base model's tokenizer without a mask token: refused now)

    def what(self) -> str:
        return f"masked-LM pre-training (15% of the tokens predicted; mask token {self.mask_token})"

    @functools.cached_property
    def mask_token(self) -> str:
        backend = self.tokenizer.backend
        found = [t for t in MASK_TOKENS if backend.token_to_id(t) is not None]
        if not found:
            raise FieldError("from_pretrained", f"the tokenizer of {self.config.from_pretrained} has no mask "
                             f"token (expected {' or '.join(MASK_TOKENS)}); masked-LM training replaces "
                             "tokens with it")
        return found[0]

    @property
    def mask_id(self) -> int:
        return self.tokenizer.backend.token_to_id(self.mask_token)

    @functools.cached_property
    def masker(self) -> Masker:
        """BERT's masking over this tokenizer: its special tokens are never predicted."""
        added = self.tokenizer.backend.get_added_tokens_decoder()
        specials = [i for i, token in added.items() if token.special]
        return Masker(self.mask_id, [*specials, self.source.pad_id], self.tokenizer.vocab_size)

    @property
    def starts_complete(self) -> bool:
        """A base model with BERT's masked-LM head (BertForMaskedLM's cls.predictions): whole
        before its first update, so it is validated (and kept, if no step beats it) as it was."""
        return self.pretrained is not None and hf_bert_mlm.has_head(self.pretrained)

    def model_config(self) -> TransformerConfig:
        return self.source.encoder_config(pooler=False)

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        """From scratch; or a base model's encoder (its pooler left out: BertForMaskedLM has
        none) with its masked-LM head where its directory holds one, else a new head."""
        if model_config is None and self.pretrained is not None:
            encoder = from_pretrained(self.pretrained)
            model = MaskedLM(self.finetune_config(encoder.config).replace(pooler=False))
            model.encoder.load_state_dict({k: v for k, v in encoder.state_dict().items()
                                           if not k.startswith("pooler.")})
            head = hf_bert_mlm.read_head(self.pretrained, model.encoder.tok_emb.weight.detach())
            if head is not None:
                model.head.load_state_dict({k.removeprefix("head."): v for k, v in head.items()})
            return model.train()
        return MaskedLM(model_config or self.model_config())

    def saved_config(self, model_config: TransformerConfig, run_dir: Path) -> TransformerConfig:
        """The run's token counts (its unigram baseline), where it finished and saved them."""
        if (run_dir / UNIGRAM_FILE).is_file():
            saved = load_file(str(run_dir / UNIGRAM_FILE))["counts"]
            self.counts = TokenCounts(len(saved), 0, saved)  # (full: nothing more is counted)
        return model_config

    # Examples and batches -------------------------------------------------------------------
    def encode(self, examples: list) -> list[MaskedExample]:
        """A held-out (or evaluated) text masked by draws from (seed, its text), the same at
        every validation; a user's text to fill (QUERY) predicted at its own mask tokens."""
        texts = [ex["text"] for ex in examples]
        out = []
        for ex, text, e in zip(examples, texts, self.source.encode_texts(texts), strict=True):
            if QUERY in ex:
                labels = [UNKNOWN if i == self.mask_id else IGNORE for i in e.ids]
                out.append(MaskedExample(e.ids, labels, e.type_ids))
            else:
                masked = self.masker.mask(e.ids, text_rng(self.config.seed, text))
                out.append(MaskedExample(*masked, e.type_ids))
        return out

    def _unmasked(self, examples: list) -> list[MaskedExample]:
        """A pool of training texts, tokenized: the baseline counts them too (its first epoch's)."""
        encoded = self.source.encode_texts([r["text"] for r in examples])
        if not self.counts.full and self.stream is not None and self.stream.epoch == 0:
            self.counts.add([e.ids for e in encoded])
        return [MaskedExample(e.ids, None, e.type_ids) for e in encoded]

    def train_batches(self, start: int, rank: int = 0, world: int = 1) -> MaskedStream:
        """The texts in the source's length-bucketed batches, each batch masked by (seed, its
        index): `start` + ((rank - start) mod world) is this rank's first (BatchStream's order)."""
        self.stream = self.source.train_batches(remembered(self._unmasked), list, start, rank, world)
        return MaskedStream(self.stream, self.masker, self.config.seed, self.collate,
                            start + (rank - start) % world, world)

    def collate(self, encoded: list[MaskedExample]) -> MaskedBatch:
        types = None if any(e.type_ids is None for e in encoded) else [e.type_ids for e in encoded]
        b = encoder_arrays([e.ids for e in encoded], self.source.pad_id, None, types)
        labels, _ = pad_arrays([e.labels for e in encoded], IGNORE)  # (B, S)
        return MaskedBatch(b.input_ids, b.attention_mask, labels, b.token_type_ids).to_torch()

    # Loss and the one forward ---------------------------------------------------------------
    def loss(self, model: nn.Module, batch: MaskedBatch, label_smoothing: float = 0.0):
        """Cross-entropy of the chosen tokens (only they reach the vocabulary), and their accuracy."""
        chosen = batch.labels != IGNORE  # (B, S)
        logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, chosen)  # (N, V)
        target = batch.labels[chosen]  # (N,)
        if not len(target):  # texts of special tokens alone: nothing to learn from this batch
            return logits.sum() * 0.0, 0.0
        loss = F.cross_entropy(at_least_fp32(logits), target, label_smoothing=label_smoothing)
        return loss, (logits.argmax(-1) == target).float().mean().item()

    def predict_batch(self, model: nn.Module, batch: MaskedBatch, top_k: int = 1,
                      targets: Tensor | None = None) -> list[Filled]:
        """Per text, at each position chosen: the top_k candidates (among `targets` ids only,
        where given) with their probabilities, and the label's log-probability."""
        chosen = batch.labels != IGNORE  # (B, S)
        logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, chosen)  # (N, V)
        logp = at_least_fp32(logits).log_softmax(-1)  # (N, V)
        labels = batch.labels[chosen]  # (N,)
        label_lp = logp.gather(1, labels.clamp(min=0)[:, None])[:, 0].masked_fill(labels < 0, 0.0)  # (N,)
        scores = logp if targets is None else logp[:, targets.to(logp.device)]  # (N, V')
        top, top_ids = scores.topk(min(top_k, scores.size(-1)), dim=-1)  # (N, k)
        if targets is not None:
            top_ids = targets.to(top_ids.device)[top_ids]
        rows = chosen.sum(1).tolist()
        out, n = [], 0
        lengths, where = batch.attention_mask.sum(1).tolist(), chosen.cpu()
        ids, top, top_ids = batch.input_ids.cpu(), top.exp().tolist(), top_ids.tolist()
        labels, label_lp = labels.tolist(), label_lp.tolist()
        for i, (count, length) in enumerate(zip(rows, lengths, strict=True)):
            mine = slice(n, n + count)
            out.append(Filled(ids[i, :length].tolist(), where[i].nonzero()[:, 0].tolist(), labels[mine],
                              top_ids[mine], top[mine], label_lp[mine]))
            n += count
        return out

    # Scores and the baseline ----------------------------------------------------------------
    def evaluate(self, model: nn.Module, split: str, examples: list | None = None,
                 deadline: float | None = None, progress=None, paired: bool = False,
                 **options: Any) -> tuple[dict, list]:
        """Objective.evaluate, whose loss is that of the masked tokens it scored (the log of their
        perplexity), with no second forward over the first EVAL_SAMPLE for it. (No paired
        interval: a perplexity's verdict is drawn from the losses' spreads, verdict.log_gain_se.)"""
        examples = validation_sample(split, self.examples(split)) if examples is None else examples
        preds = self.predict(model, examples, deadline=deadline, progress=progress, **options)
        metrics, shown = self.score(examples[: len(preds)], preds)
        return {**metrics, "examples": len(preds)}, shown

    def _sample_loss(self, model: nn.Module, examples: list) -> float:
        with evaluating(model):
            return self.score(examples[:EVAL_SAMPLE], self.predict(model, examples[:EVAL_SAMPLE]))[0]["loss"]

    def score(self, examples: list, preds: list[Filled]) -> tuple[dict[str, float], list]:
        tally = self.tally()
        tally.add(examples, preds)
        return tally.metrics(), [self._shown(f) for f in preds]

    def tally(self) -> MaskedTally:
        return MaskedTally(self.tokenizer.vocab_size, lambda: self.token_counts.logprob(self.masker.special),
                           UNIGRAM)

    def baseline(self, examples: list) -> dict[str, Any]:
        """The unigram model's perplexity on the tokens predicted in `examples`, with its loss's
        spread (the verdict's margin: MaskedTally.baseline)."""
        tally = self.tally()
        for e in self.encode(examples):
            tally.count_targets(e.labels)
        return tally.baseline()

    def _baseline(self, examples: list) -> tuple[float, str]:
        return self.baseline(examples)["baseline"], UNIGRAM

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        return list(shown)  # (the input as masked, the predicted tokens, the true ones): score's

    def _shown(self, f: Filled) -> tuple[str, str, str]:
        """(the text as the model read it, masks shown; the top candidate at each position
        predicted; the true token there)."""
        tok, parts, start = self.tokenizer, [], 0
        for end in [j for j, i in enumerate(f.ids) if i == self.mask_id] + [len(f.ids)]:
            parts.append(tok.decode(f.ids[start:end]).strip())
            start = end + 1
        known = [(top[0], label) for top, label in zip(f.top_ids, f.labels, strict=True) if label >= 0]
        return (f" {self.mask_token} ".join(parts).strip(), " ".join(tok.token_text(t) for t, _ in known),
                " ".join(tok.token_text(label) for _, label in known))

    @property
    def token_counts(self) -> TokenCounts:
        """The training texts' token counts: those the training stream read (its first
        COUNT_RECORDS texts, in the first epoch's shuffled order), or a finished run's saved
        ones; where neither (a run not trained in this process, killed before it finished), the
        same texts read again from the data."""
        if not self.counts.texts and not self.counts.full:
            try:
                for pool in self.source.data.epoch_pools(0):
                    self.counts.add([e.ids for e in self.source.encode_texts([r["text"] for r in pool])])
                    if self.counts.full:
                        break
            except OSError as e:
                raise ValueError(f"baseline: the run's token counts ({UNIGRAM_FILE}) are not saved (it "
                                 f"did not finish) and its training data cannot be read ({e})") from None
        return self.counts

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list) -> None:
        """The token counts of the baseline, and the run's top as a BertForMaskedLM directory
        (tformer.export.hf_masked_lm.write_run_files): `pipeline("fill-mask", model=RUN)` and
        --from-pretrained RUN load it."""
        write_atomic(run_dir / UNIGRAM_FILE, save({"counts": self.token_counts.counts}))
        tok = self.tokenizer
        hf_masked_lm.write_run_files(run_dir, model, tok.backend, tok.max_length)

    def no_mask(self, text: str) -> str:
        """Why a text to fill is refused: no mask token, or none within the run's max length."""
        if self.mask_token in text:
            return (f"expected the mask token {self.mask_token} within the first {self.tokenizer.max_length} "
                    "tokens (the run's max length), got it only past them")
        return f"expected the mask token {self.mask_token} (this run's) in the text, got none: {text[:60]!r}"

    # Filling masks ----------------------------------------------------------------------------
    def fill(self, model: nn.Module, texts: list[str], top_k: int = TOP_K, targets: list[int] | None = None,
             batch_size: int = 64) -> list:
        """fill-mask's answer per text (MaskedLMRun.predict); a text without a mask token within
        the run's length is refused (BadInput, naming it)."""
        for i, (text, e) in enumerate(zip(texts, self.source.encode_texts(texts), strict=True)):
            if self.mask_id not in e.ids:
                raise BadInput(i, self.no_mask(text))
        ids = None if targets is None else torch.tensor(targets, dtype=torch.long)
        filled = self.predict(model, [{"text": t, QUERY: ""} for t in texts], batch_size=batch_size,
                              top_k=top_k, targets=ids)
        return [fill_answer(f, self.tokenizer.backend.decode) for f in filled]



class MaskedLMRun(Run):
    kind = FIELDS.objective
    verb = "predict"
    pipeline_tag = "fill-mask"
    protocols = ("hf.fill_mask", "tei.tokenize")
    pairs = False  # one text per input (a tab is part of it)

    @property
    def mask_token(self) -> str:
        return self.objective.mask_token

    @classmethod
    def pretrained_advice(cls, run: Path, kind=None) -> str:
        return (f"a masked-LM run is a BERT-format directory once it has finished (its test written): "
                f"finish it (`tformer train --resume {run}`), then give --from-pretrained {run}")

    def predict(self, texts: str | Iterable[str], top_k: int = TOP_K, targets: Iterable[str] | None = None,
                batch_size: int = 64) -> list:
        """What transformers' pipeline("fill-mask") answers: for one text (a str) with one mask
        token, its top_k candidates [{"score", "token", "token_str", "sequence"}], best first;
        with several masks, one such list per mask; for texts (a list), one answer per text.
        targets: score these tokens only (each a token of the vocabulary, else its first piece)."""
        single = isinstance(texts, str)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise FieldError("top_k", f"expected a positive int, got {top_k!r}")
        answers = self.objective.fill(self.model, texts_of(texts), top_k, self.target_ids(targets),
                                      check_batch_size(batch_size))
        return answers[0] if single else answers

    def target_ids(self, targets: Iterable[str] | None) -> list[int] | None:
        """The ids of fill-mask's targets (tformer.training.masking.target_ids)."""
        return None if targets is None else target_ids(self.tokenizer.backend, targets)

    def printed(self, text: str, answer: list) -> tuple[str, dict[str, Any]]:
        """`tformer predict`'s line for one text (each mask's candidates, best first, "token score"
        by ", ", masks by " | ") and its JSONL record ({"text", "fills": the pipeline's answer})."""
        masks = answer if answer and isinstance(answer[0], list) else [answer]
        shown = [", ".join(f"{c['token_str'].strip() or repr(c['token_str'])} {c['score']:.4f}" for c in m)
                 for m in masks]
        line = " | ".join(shown)
        return line, {"text": text, "fills": answer}

    # Serving: Hugging Face's fill-mask task ------------------------------------------------------
    def admit(self, texts: list[str], truncate: bool, limit: int | None = None) -> list[Item]:
        """Texts with a mask token, as the run reads them (cut at its max length; a longer one is
        refused unless truncating, as is one whose masks all lie past the cut)."""
        tok = self.tokenizer
        prefixes, _, full = tok.prefixes(texts)
        run_limit = self.max_input_tokens
        limit = limit or run_limit
        too_long(full, limit, truncate and limit == run_limit)
        for i, e in enumerate(tok.encode(prefixes)):
            if self.objective.mask_id not in e.ids:
                raise InputRefused(f"inputs[{i}]: {self.objective.no_mask(texts[i])}")
        return [Item(min(n, run_limit), n, text) for n, text in zip(full, prefixes, strict=True)]

    @torch.inference_mode()
    def run_batch(self, texts: list[str], key: tuple = (TOP_K, None)) -> list:
        """fill-mask's answer per text, as `tformer predict` computes it; ``key``: (top_k, the
        target ids or None), what the batch's requests share."""
        top_k, targets = key
        return self.objective.fill(self.model, texts, top_k, None if targets is None else list(targets))

    def warm_up(self) -> None:
        self.run_batch([item.payload for item in self.admit([f"warm {self.mask_token} up"], True)])

    def describe(self) -> dict[str, Any]:
        return {"mask_token": self.mask_token, "top_k": TOP_K}

    # Exports ---------------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        """BertForMaskedLM (the same files as the run's own top, with a model card)."""
        tok = self.tokenizer
        try:
            return hf_masked_lm.export_fill_mask(out, self.model, tok.backend, tok.max_length,
                                                 self.mask_token, card)
        except hf_bert.NotBert as e:
            raise ValueError(f"--hf: {self.path}: config.{e.field}: BertForMaskedLM needs {e.need}, got "
                             f"{e.got!r}") from None

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        raise ValueError(f"--onnx: {self.path} is a masked-LM run: it exports to transformers (--hf, "
                         "BertForMaskedLM, which optimum and torch.onnx export), and fine-tunes into the "
                         "kinds that export to ONNX (--from-pretrained RUN)")


KIND = Kind(MaskedLanguageModel, MaskedLMRun)
