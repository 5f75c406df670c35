"""Models built inside the tests: a tiny random Llama (float64) and a scripted dual-mode model."""

from __future__ import annotations

import torch

from packed_ss.model import CallOutput, DualModeModel


def tiny_tokenizer(vocab_size: int):
    """Word-level tokenizer over ``vocab_size`` tokens: ``<eos>``, ``<mask>``, then ``a``, ``b``, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<mask>"] + [f"w{i}" for i in range(vocab_size - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", mask_token="<mask>")


def tiny_llama(vocab_size: int = 24, seed: int = 0, hidden: int = 32, layers: int = 2,
               logit_scale: float = 1.0, eos: bool = True) -> DualModeModel:
    """A randomly initialised Llama-architecture dual-mode model in float64 (argmax ties cannot flip)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    # The mask token is never a prediction, as in a trained dual-mode model.
    model.lm_head.register_forward_hook(lambda module, args, out: out.index_fill(-1, torch.tensor([1]), -1e9))
    return DualModeModel(model, tiny_tokenizer(vocab_size), mask_token_id=1, eos_token_id=0 if eos else None)


class ScriptedModel:
    """A dual-mode model whose predictions follow a script (no transformer; the call interface only).

    The verifier continues ``target`` whenever the rows it sees hold the prompt followed by a correct
    prefix of ``target``. The drafter predicts output position k (0-based) correctly iff it sees at
    least ``thresholds[k]`` verified output tokens (paper Assumption 3.1), otherwise a wrong token.
    """

    mask_token_id = 1
    eos_token_id = None
    max_length = 10_000

    def __init__(self, prompt: list[int], target: list[int], thresholds: list[int], vocab_size: int = 16):
        self.prompt, self.target, self.thresholds = list(prompt), list(target), list(thresholds)
        self.vocab_size = vocab_size
        self.cache: list[int] = []

    @property
    def cache_length(self) -> int:
        return len(self.cache)

    def reset(self) -> None:
        self.cache = []

    def rollback(self, keep: int) -> None:
        assert 0 <= keep <= len(self.cache)
        self.cache = self.cache[:keep]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def _verified_outputs(self, seen: dict[int, int]) -> int:
        """How many leading output tokens the visible rows hold correctly (-1: prompt not intact)."""
        n = len(self.prompt)
        if any(seen.get(i) != t for i, t in enumerate(self.prompt)):
            return -1
        c = 0
        while seen.get(n + c) == self._truth(c) and c < len(self.target):
            c += 1
        return c

    def _truth(self, k: int) -> int:
        return self.target[k] if k < len(self.target) else 2

    def _wrong(self, k: int) -> int:
        return 2 + (self._truth(k) - 1) % (self.vocab_size - 2)

    def forward(self, layout, rows):
        full = layout.full_mask()
        keys = list(zip(range(layout.cached), self.cache)) + list(zip(layout.position_ids, layout.token_ids))
        n = len(self.prompt)
        logits = torch.zeros(len(rows), self.vocab_size, dtype=torch.float64)
        for out_row, r in enumerate(rows):
            seen = {pos: tok for (pos, tok), ok in zip(keys, full[r].tolist()) if ok and tok != self.mask_token_id}
            position, token = layout.position_ids[r], layout.token_ids[r]
            c = self._verified_outputs(seen)
            if token == self.mask_token_id:  # drafter: predicts its own position
                k = position - n
                known = self.thresholds[min(k, len(self.thresholds) - 1)]
                guess = self._truth(k) if c >= known else self._wrong(k)
            else:  # verifier: predicts the next position
                k = position + 1 - n
                guess = self._truth(k) if c >= k else self._wrong(k)
            logits[out_row, guess] = 10.0
        self.cache.extend(layout.token_ids)
        return CallOutput(logits, 0.0)


def serve(demo):
    """Launch a demo built by ``app.build_demo`` on 127.0.0.1 (as ``python app.py`` does), yield its URL,
    close it afterwards. For module-scoped ``server`` fixtures: ``yield from serve(demo)``."""
    import app

    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **app.launch_kwargs(demo))
    try:
        yield url
    finally:
        demo.close()
